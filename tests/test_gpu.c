/* test_gpu.c: the CUDA loader (src/gpu.c). Without a GPU (this machine, CI) every call fails
 * with a message naming what is missing: no CUDA in the build, or no NVIDIA driver. With one
 * (a GPU machine, KVX_HAVE_CUDA), device memory is allocated, filled, read back and compared,
 * and host memory is told apart from it. */
#include "gpu.h"
#include "layouts.h"
#include "prefill.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* Device memory moves byte-exact when a GPU is there; otherwise the failure is clear. */
static void device_memory_moves_exact_bytes_or_the_failure_names_what_is_missing(void **state)
{
    enum { SIZE = 1 << 20 };
    struct gpu *gpu = NULL;
    kvx_status_t status;
    uint8_t *host;
    uint8_t *back;
    void *device = NULL;

    (void)state;
    status = gpu_open(0, &gpu);
    if (status != KVX_OK) {
        print_message("no GPU here: %s\n", kvx_errmsg());
        assert_int_equal(status, KVX_ERR_INVALID);
#ifdef KVX_HAVE_CUDA
        assert_true(strstr(kvx_errmsg(), "NVIDIA driver") != NULL ||
                    strstr(kvx_errmsg(), "no CUDA device") != NULL);
#else
        assert_non_null(strstr(kvx_errmsg(), "-DKVX_CUDA=ON"));
#endif
        return;
    }
    host = malloc(SIZE);
    back = calloc(1, SIZE);
    assert_non_null(host);
    assert_non_null(back);
    for (size_t i = 0; i < SIZE; i++)
        host[i] = (uint8_t)(i * 131 + 7);
    assert_int_equal(gpu_alloc(gpu, SIZE, &device), KVX_OK);
    assert_int_equal(gpu_check_device_memory(gpu, device, SIZE), KVX_OK);
    assert_int_equal(gpu_check_device_memory(gpu, host, SIZE), KVX_ERR_INVALID);
    assert_int_equal(gpu_copy(gpu, device, host, SIZE), KVX_OK);
    assert_int_equal(gpu_copy(gpu, back, device, SIZE), KVX_OK);
    assert_memory_equal(host, back, SIZE);
    gpu_free(gpu, device);
    gpu_close(gpu);
    free(host);
    free(back);
}

/* A device that does not exist is named, with how many there are. */
static void a_device_that_is_not_there_is_refused(void **state)
{
    struct gpu *gpu = NULL;

    (void)state;
    assert_int_equal(gpu_open(9999, &gpu), KVX_ERR_INVALID);
    assert_null(gpu);
    print_message("device 9999: %s\n", kvx_errmsg());
}

/* Issue 14: a "vram" storage is never served from host memory in its place. Without a GPU
 * the agent is refused with the storage's name and what is missing; the same layout with the
 * storage turned into host memory (what the command line does, and says) makes an agent. */
static void a_vram_storage_without_a_gpu_is_refused_by_name(void **state)
{
    static const char vram[] =
        "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536, 'mem': 'vram', "
        "'device': 0}], 'views': [{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', "
        "'page': 4096, 'stride': 4096, 'num_blocks': 16}]}";
    kvx_layout_t *layout = NULL;
    kvx_agent_t *agent   = NULL;
    struct gpu *gpu      = NULL;
    kvx_status_t status;

    (void)state;
    if (gpu_open(0, &gpu) == KVX_OK) { /* a GPU machine: the agent test is elsewhere */
        gpu_close(gpu);
        skip();
    }
    status = agent_from_quoted(vram, NULL, &agent);
    print_message("vram storage: %s\n", kvx_errmsg());
    assert_int_equal(status, KVX_ERR_INVALID);
    assert_null(agent);
    assert_non_null(strstr(kvx_errmsg(), "storage kv (\"mem\": \"vram\", device 0)"));
    assert_int_equal(layout_from_quoted(vram, &layout), KVX_OK);
    assert_int_equal(kvx_layout_storage_mem(layout, 0), KVX_MEM_VRAM);
    assert_int_equal(kvx_layout_set_storage_mem(layout, 0, KVX_MEM_DRAM, 0), KVX_OK);
    assert_int_equal(kvx_layout_set_storage_mem(layout, 1, KVX_MEM_DRAM, 0), KVX_ERR_INVALID);
    assert_int_equal(kvx_layout_set_storage_mem(layout, 0, KVX_MEM_DRAM, -1), KVX_ERR_INVALID);
    assert_int_equal(
        kvx_agent_create(
            layout,
            &(kvx_agent_params_t){.field_mask = KVX_AGENT_PARAM_FIELD_INSECURE, .insecure = true},
            &agent),
        KVX_OK);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    kvx_layout_destroy(layout);
}

/* Writes a pattern into 4 KiB of storage 0 of `agent` at 8 KiB, reads it back through the
 * agent, and checks the bounds: a range past the end or a storage that is not there is
 * refused and changes nothing. */
static void storage_round_trip(kvx_agent_t *agent)
{
    uint8_t in[4096];
    uint8_t out[4096];
    uint8_t before[16];
    uint8_t after[16];

    for (size_t i = 0; i < sizeof(in); i++)
        in[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(kvx_agent_storage_write(agent, 0, 8192, in, sizeof(in)), KVX_OK);
    assert_int_equal(kvx_agent_storage_read(agent, 0, 8192, out, sizeof(out)), KVX_OK);
    assert_memory_equal(in, out, sizeof(in));
    assert_int_equal(kvx_agent_storage_read(agent, 0, 65536 - 16, before, 16), KVX_OK);
    assert_int_equal(kvx_agent_storage_write(agent, 0, 65536 - 8, in, 16), KVX_ERR_OUT_OF_RANGE);
    assert_non_null(strstr(kvx_errmsg(), "pass its end (65536 bytes)"));
    assert_int_equal(kvx_agent_storage_write(agent, 0, UINT64_MAX, in, 16), KVX_ERR_OUT_OF_RANGE);
    assert_int_equal(kvx_agent_storage_read(agent, 0, 65536 - 16, after, 16), KVX_OK);
    assert_memory_equal(before, after, 16);
    assert_int_equal(kvx_agent_storage_write(agent, 1, 0, in, 16), KVX_ERR_OUT_OF_RANGE);
    assert_int_equal(kvx_agent_storage_read(agent, 1, 0, out, 16), KVX_ERR_OUT_OF_RANGE);
}

/* What the command line fills and checks storages with: host memory here, and device memory
 * where there is a GPU (a "vram" storage kvx allocated, read back byte-exact). */
static void storages_are_written_and_read_through_the_agent(void **state)
{
    static const char layout[] =
        "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536, 'mem': '%s'}], "
        "'views': [{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 4096, "
        "'stride': 4096, 'num_blocks': 16}]}";
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_INSECURE, .insecure = true};
    kvx_agent_t *agent        = NULL;
    struct gpu *gpu           = NULL;
    kvx_status_t status;
    char text[512];

    (void)state;
    snprintf(text, sizeof(text), layout, "dram");
    assert_int_equal(agent_from_quoted(text, &params, &agent), KVX_OK);
    assert_int_equal(kvx_agent_storage_mem(agent, 0), KVX_MEM_DRAM);
    storage_round_trip(agent);
    assert_memory_equal((uint8_t *)kvx_agent_storage(agent, 0, NULL) + 8192 + 1, "\x0a", 1);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    if (gpu_open(0, &gpu) != KVX_OK) {
        print_message("no GPU here: the vram round trip is not run (%s)\n", kvx_errmsg());
        return;
    }
    gpu_close(gpu);
    snprintf(text, sizeof(text), layout, "vram");
    status = agent_from_quoted(text, &params, &agent);
    if (status != KVX_OK)
        print_message("an agent on GPU memory: %s\n", kvx_errmsg());
    assert_int_equal(status, KVX_OK);
    assert_int_equal(kvx_agent_storage_mem(agent, 0), KVX_MEM_VRAM);
    storage_round_trip(agent);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_memory_moves_exact_bytes_or_the_failure_names_what_is_missing),
        cmocka_unit_test(a_device_that_is_not_there_is_refused),
        cmocka_unit_test(a_vram_storage_without_a_gpu_is_refused_by_name),
        cmocka_unit_test(storages_are_written_and_read_through_the_agent),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

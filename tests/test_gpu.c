/* test_gpu.c: the CUDA loader (src/gpu.c). Without a GPU (this machine, CI) every call fails
 * with a message naming what is missing: no CUDA in the build, or no NVIDIA driver. With one
 * (a GPU machine, KVX_HAVE_CUDA), device memory is allocated, filled, read back and compared,
 * and host memory is told apart from it. */
#include "gpu.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_memory_moves_exact_bytes_or_the_failure_names_what_is_missing),
        cmocka_unit_test(a_device_that_is_not_there_is_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

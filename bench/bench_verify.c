/* bench_verify.c: what verification costs: XXH3-64 on one core over a buffer (the limit: each
 * side hashes every byte once), then kvx_xfer_verify of a completed pull over loopback, both as
 * GB/s of bytes verified, medians of repeated runs (docs/performance.md "Verification"). */
#include "bench_common.h"

#include "kvx.h"

#include <xxhash.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCKS   256
#define BLOCK_MB 1
#define RUNS     7

static const char layout_json[] =
    "{\"kvx_layout\": 1, \"storages\": [{\"name\": \"kv\", \"size\": 268435456}], \"views\": ["
    "{\"name\": \"layers.0.mla\", \"kind\": \"mla\", \"storage\": \"kv\", \"page\": 1048576,"
    " \"stride\": 1048576, \"num_blocks\": 256}]}";

static kvx_agent_t *agent_make(const char *listen)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_INSECURE, .insecure = true};
    kvx_layout_t *layout;
    kvx_agent_t *agent;

    if (listen != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_LISTEN;
        params.listen = listen;
    }
    if (kvx_layout_load_buffer(layout_json, strlen(layout_json), &layout) != KVX_OK ||
        kvx_agent_create(layout, &params, &agent) != KVX_OK) {
        fprintf(stderr, "bench_verify: %s\n", kvx_errmsg());
        exit(1);
    }
    kvx_layout_destroy(layout);
    return agent;
}

static void random_fill(uint8_t *bytes, size_t size)
{
    uint64_t x = 0x9e3779b97f4a7c15u;

    for (size_t i = 0; i + 8 <= size; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(bytes + i, &x, 8);
    }
}

static int prefill(int ready, int stop)
{
    kvx_agent_t *agent = agent_make("127.0.0.1:0");
    uint64_t size;
    char address[64]        = {0};
    struct pollfd stop_poll = {.fd = stop, .events = POLLIN};

    uint8_t *base = kvx_agent_storage(agent, 0, &size); /* sets size first */

    random_fill(base, size);
    snprintf(address, sizeof(address), "%s", kvx_agent_listen_address(agent));
    if (write(ready, address, sizeof(address)) != (ssize_t)sizeof(address))
        return 1;
    while (poll(&stop_poll, 1, 0) == 0)
        kvx_agent_progress(agent, 10);
    kvx_agent_destroy(agent);
    return 0;
}

static int double_compare(const void *a, const void *b)
{
    double x = *(const double *)a;
    double y = *(const double *)b;

    return (x > y) - (x < y);
}

int main(void)
{
    size_t size  = (size_t)BLOCKS * BLOCK_MB << 20;
    uint8_t *buf = malloc(size);
    double xxh[RUNS], verify[RUNS];
    int ready[2], stop[2];
    char address[64];
    uint64_t ids[BLOCKS];
    kvx_group_ids_t group  = {ids, BLOCKS};
    kvx_request_t request  = {&group, 1, NULL, 0, NULL};
    volatile uint64_t sink = 0;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;
    pid_t pid;

    random_fill(buf, size);
    for (int r = 0; r < RUNS; r++) {
        uint64_t start = clock_ns();

        sink += XXH3_64bits(buf, size);
        xxh[r] = (double)size / (double)(clock_ns() - start);
    }
    free(buf);
    if (pipe(ready) != 0 || pipe(stop) != 0)
        return 1;
    pid = fork();
    if (pid == 0)
        _exit(prefill(ready[1], stop[0]));
    if (read(ready[0], address, sizeof(address)) != (ssize_t)sizeof(address))
        return 1;
    agent = agent_make(NULL);
    for (uint64_t i = 0; i < BLOCKS; i++)
        ids[i] = i;
    if (kvx_agent_connect(agent, address, &peer) != KVX_OK ||
        kvx_read_post(agent, &peer, 1, 1, &request, NULL, NULL, &xfer) != KVX_OK ||
        kvx_xfer_wait(xfer) != KVX_OK) {
        fprintf(stderr, "bench_verify: %s\n", kvx_errmsg());
        return 1;
    }
    for (int r = 0; r < RUNS; r++) {
        uint64_t start = clock_ns();

        if (kvx_xfer_verify(xfer) != KVX_OK) {
            fprintf(stderr, "bench_verify: %s\n", kvx_errmsg());
            return 1;
        }
        verify[r] = (double)size / (double)(clock_ns() - start);
    }
    qsort(xxh, RUNS, sizeof(*xxh), double_compare);
    qsort(verify, RUNS, sizeof(*verify), double_compare);
    printf("XXH3-64, one core, %zu MiB buffer: %.2f GB/s (median of %d; min %.2f, max %.2f)\n",
           size >> 20, xxh[RUNS / 2], RUNS, xxh[0], xxh[RUNS - 1]);
    printf("kvx_xfer_verify, %d blocks of %d MiB over loopback: %.2f GB/s verified, %.3f s/GB"
           " (median of %d; min %.2f, max %.2f GB/s)\n",
           BLOCKS, BLOCK_MB, verify[RUNS / 2], 1 / verify[RUNS / 2], RUNS, verify[0],
           verify[RUNS - 1]);
    kvx_xfer_destroy(xfer);
    kvx_peer_destroy(peer);
    kvx_agent_progress(agent, 0);
    kvx_agent_destroy(agent);
    (void)!write(stop[1], "q", 1);
    waitpid(pid, NULL, 0);
    return (int)(sink & 0);
}

/* limits_probe.c: what this machine can do without kvx, for bench/limits.sh: memcpy between
 * two buffers of one process, and process_vm_readv (what UCX's CMA transport calls) from a
 * forked child's memory, over the same blocks `kvx bench` moves. Bench-only; no kvx calls. */
#define _GNU_SOURCE /* process_vm_readv */
#include "bench_common.h"
#include "size_list.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROBE_MAX_SIZES 16
#define PROBE_MAX_BATCH 1024 /* IOV_MAX: one process_vm_readv call takes a whole batch */

static const char usage[] =
    "usage: limits_probe [--block-sizes 4K,64K,1M,16M] [--batch N] [--iters N] [--contiguous]\n"
    "\n"
    "Per block size, moves BATCH blocks per transfer, ITERS times after 3 warm-ups, between\n"
    "buffers of 2 x BATCH blocks laid out as kvx bench lays them out (every other block, or\n"
    "blocks 0..BATCH-1 with --contiguous), and prints one JSON object per probe and size:\n"
    "  memcpy           one memcpy per block, source and destination in this process\n"
    "  pvr_batch        one process_vm_readv per transfer (BATCH iovecs) from a child\n"
    "  pvr_per_block    one process_vm_readv per block, as UCX's CMA gets are issued\n";

struct probe_args {
    uint64_t sizes[PROBE_MAX_SIZES];
    size_t num_sizes;
    uint64_t batch;
    uint64_t iters;
    bool contiguous;
};

/* Offset of block b of a transfer. */
static uint64_t block_offset(const struct probe_args *a, uint64_t size, uint64_t b)
{
    return (a->contiguous ? b : 2 * b) * size;
}

static bool sizes_parse(const char *text, struct probe_args *a)
{
    return size_list_parse(text, UINT64_C(1) << 34, a->sizes, PROBE_MAX_SIZES, &a->num_sizes);
}

static void result_print(const char *probe, const struct probe_args *a, uint64_t size,
                         uint64_t *samples, uint64_t syscalls)
{
    uint64_t total = 0;
    double gbps;

    for (uint64_t i = 0; i < a->iters; i++)
        total += samples[i];
    qsort(samples, a->iters, sizeof(uint64_t), stats_compare);
    gbps = (double)(size * a->batch * a->iters) / (double)total;
    printf("{\"probe\": \"%s\", \"block_size\": %" PRIu64 ", \"batch\": %" PRIu64
           ", \"iters\": %" PRIu64 ", \"contiguous\": %s, \"gbps\": %.4f, "
           "\"blocks_per_s\": %.1f, \"transfer_us_p50\": %.2f, \"syscalls_per_transfer\": %" PRIu64
           "}\n",
           probe, size, a->batch, a->iters, a->contiguous ? "true" : "false", gbps,
           (double)(a->batch * a->iters) / ((double)total / 1e9),
           (double)samples[a->iters / 2] / 1e3, syscalls);
    fflush(stdout);
}

static void memcpy_probe(const struct probe_args *a, uint64_t size, uint64_t *samples)
{
    uint64_t bytes = 2 * a->batch * size;
    char *src      = aligned_alloc(4096, bytes);
    char *dst      = aligned_alloc(4096, bytes);

    if (src == NULL || dst == NULL) {
        fprintf(stderr, "limits_probe: out of memory for %" PRIu64 " bytes\n", bytes);
        exit(1);
    }
    memset(src, 0x5a, bytes);
    memset(dst, 0, bytes);
    for (uint64_t i = 0; i < a->iters + 3; i++) {
        uint64_t start = clock_ns();

        for (uint64_t b = 0; b < a->batch; b++)
            memcpy(dst + block_offset(a, size, b), src + block_offset(a, size, b), size);
        if (i >= 3)
            samples[i - 3] = clock_ns() - start;
    }
    result_print("memcpy", a, size, samples, 0);
    free(src);
    free(dst);
}

/* The child holds a touched buffer until its stdin pipe closes; the parent reads it. */
static void pvr_probe(const struct probe_args *a, uint64_t size, uint64_t *samples)
{
    uint64_t bytes = 2 * a->batch * size;
    struct iovec local[PROBE_MAX_BATCH];
    struct iovec remote[PROBE_MAX_BATCH];
    int to_parent[2];
    int to_child[2];
    char *dst = aligned_alloc(4096, bytes);
    uintptr_t child_base;
    pid_t child;

    if (dst == NULL || pipe(to_parent) != 0 || pipe(to_child) != 0) {
        fprintf(stderr, "limits_probe: out of memory or pipes\n");
        exit(1);
    }
    memset(dst, 0, bytes);
    fflush(stdout);
    child = fork();
    if (child == 0) {
        char *src = aligned_alloc(4096, bytes);
        char byte;

        close(to_child[1]); /* else the read below never sees end of file */
        close(to_parent[0]);
        if (src != NULL)
            memset(src, 0x5a, bytes);
        child_base = (uintptr_t)src;
        (void)!write(to_parent[1], &child_base, sizeof(child_base));
        (void)!read(to_child[0], &byte, 1); /* returns when the parent closes its end */
        _exit(0);
    }
    if (child < 0 || read(to_parent[0], &child_base, sizeof(child_base)) != sizeof(child_base) ||
        child_base == 0) {
        fprintf(stderr, "limits_probe: the child did not start\n");
        exit(1);
    }
    for (uint64_t b = 0; b < a->batch; b++) {
        local[b]  = (struct iovec){dst + block_offset(a, size, b), size};
        remote[b] = (struct iovec){(void *)(child_base + block_offset(a, size, b)), size};
    }
    for (int per_block = 0; per_block < 2; per_block++) {
        for (uint64_t i = 0; i < a->iters + 3; i++) {
            uint64_t start = clock_ns();
            ssize_t got    = 0;

            if (per_block) {
                for (uint64_t b = 0; b < a->batch; b++)
                    got += process_vm_readv(child, &local[b], 1, &remote[b], 1, 0);
            } else {
                got = process_vm_readv(child, local, a->batch, remote, a->batch, 0);
            }
            if (got != (ssize_t)(size * a->batch)) {
                fprintf(stderr, "limits_probe: process_vm_readv: %s\n", strerror(errno));
                exit(1);
            }
            if (i >= 3)
                samples[i - 3] = clock_ns() - start;
        }
        result_print(per_block ? "pvr_per_block" : "pvr_batch", a, size, samples,
                     per_block ? a->batch : 1);
    }
    close(to_child[1]);
    waitpid(child, NULL, 0);
    close(to_child[0]);
    close(to_parent[0]);
    close(to_parent[1]);
    free(dst);
}

int main(int argc, char **argv)
{
    struct probe_args a = {.batch = 16, .iters = 100};
    uint64_t *samples;

    sizes_parse("4K,64K,1M,16M", &a);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];

        if (strcmp(arg, "--contiguous") == 0) {
            a.contiguous = true;
        } else if (i + 1 < argc && strcmp(arg, "--block-sizes") == 0) {
            if (!sizes_parse(argv[++i], &a))
                goto usage_error;
        } else if (i + 1 < argc && strcmp(arg, "--batch") == 0) {
            a.batch = strtoull(argv[++i], NULL, 10);
        } else if (i + 1 < argc && strcmp(arg, "--iters") == 0) {
            a.iters = strtoull(argv[++i], NULL, 10);
        } else {
            goto usage_error;
        }
    }
    if (a.batch == 0 || a.batch > PROBE_MAX_BATCH || a.iters == 0 || a.iters > 10000000)
        goto usage_error;
    samples = calloc(a.iters, sizeof(*samples));
    if (samples == NULL)
        return 1;
    for (size_t s = 0; s < a.num_sizes; s++) {
        memcpy_probe(&a, a.sizes[s], samples);
        pvr_probe(&a, a.sizes[s], samples);
    }
    free(samples);
    return 0;

usage_error:
    fprintf(stderr, "limits_probe: error: bad arguments (batch 1..%d)\n\n%s", PROBE_MAX_BATCH,
            usage);
    return 2;
}

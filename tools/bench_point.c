/* bench_point.c: one point of `kvx bench`: its transfers timed (warm-ups, then the timed ones,
 * sorted) and printed as a table row or a JSON object, with the table's header. What the sweep
 * (bench.c) and --workload (bench_workload.c) both call; it calls neither. */
#include "bench.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

static int u64_compare(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

/* Nearest-rank percentile of n sorted samples, in µs. */
static double percentile_us(const uint64_t *sorted, size_t n, double p)
{
    size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);

    if (n == 0)
        return 0;
    return (double)sorted[rank == 0 ? 0 : rank - 1] / 1e3;
}

/* The UCX_TLS list P's push writers use: the option's, else the agent's default. */
static const char *bench_push_transports(const struct bench_args *a)
{
    if (a->push_transports != NULL)
        return a->push_transports;
    return a->memory == CLI_MEMORY_CUDA ? "tcp,cuda_copy" : "tcp";
}

/* What the storages are, for the header. */
static const char *bench_storage_kind(const struct bench_args *a)
{
    if (a->memory == CLI_MEMORY_CUDA)
        return "GPU (kvx-allocated, cuMemAlloc)";
    return a->use_malloc ? "malloc'd (engine-style)" : "kvx-allocated (UCX)";
}

/* One transfer of `request`; samples[i] get its times unless i is SIZE_MAX (a warm-up). */
static kvx_status_t bench_transfer(struct bench_client *c, const kvx_request_t *request,
                                   struct bench_samples *s, size_t i)
{
    uint64_t start = now_ns();
    uint64_t posted;
    uint64_t planned;
    kvx_xfer_t *xfer;
    kvx_status_t status;

    c->request_id++;
    if (c->args->push) {
        status = kvx_write(c->agent, &c->peer, 1, c->request_id, request, &s->stats);
        posted = 0;
    } else {
        status = kvx_read_post(c->agent, &c->peer, 1, c->request_id, request, NULL, NULL, &xfer);
        posted = now_ns() - start;
        if (status == KVX_OK) {
            status = kvx_xfer_wait(xfer);
            kvx_xfer_stats(xfer, &s->stats);
            kvx_xfer_destroy(xfer);
        }
    }
    if (status != KVX_OK || i == SIZE_MAX)
        return status;
    s->wall[i] = now_ns() - start;
    s->post[i] = posted;
    s->xfer[i] = (uint64_t)(s->stats.seconds * 1e9);
    planned    = now_ns();
    status     = kvx_peer_plan_request(c->plan, request, c->pairs);
    s->plan[i] = now_ns() - planned;
    return status;
}

/* Warm-ups, then args->iters timed transfers of `request` into *s (sorted afterwards). */
kvx_status_t bench_point_run(struct bench_client *c, const kvx_request_t *request, size_t warmups,
                             struct bench_samples *s)
{
    kvx_status_t status = KVX_OK;

    for (size_t i = 0; status == KVX_OK && i < warmups; i++)
        status = bench_transfer(c, request, s, SIZE_MAX);
    for (size_t i = 0; status == KVX_OK && i < c->args->iters; i++)
        status = bench_transfer(c, request, s, i);
    s->count = c->args->iters;
    qsort(s->wall, s->count, sizeof(uint64_t), u64_compare);
    qsort(s->post, s->count, sizeof(uint64_t), u64_compare);
    qsort(s->xfer, s->count, sizeof(uint64_t), u64_compare);
    qsort(s->plan, s->count, sizeof(uint64_t), u64_compare);
    return status;
}

static void size_text(uint64_t bytes, char *buf, size_t size)
{
    static const char suffix[] = "BKMGT";
    int i                      = 0;

    while (bytes >= 1024 && bytes % 1024 == 0 && i < 4) {
        bytes /= 1024;
        i++;
    }
    snprintf(buf, size, "%" PRIu64 "%c", bytes, suffix[i]);
    if (i == 0)
        buf[strlen(buf) - 1] = '\0';
}

/* One point, as a table row or a JSON object. `workload` names the layout (NULL: sweep);
 * `size` is bytes per block (sweep) or tokens (workload); `blocks` blocks per group. */
void bench_point_print(const struct bench_client *c, const struct bench_samples *s,
                       const char *workload, uint64_t size, uint64_t blocks)
{
    const struct bench_args *a = c->args;
    uint64_t total_ns          = 0;
    double seconds;
    double gbps;
    double rate;
    char text[32];

    for (size_t i = 0; i < s->count; i++)
        total_ns += s->wall[i];
    seconds = (double)total_ns / 1e9;
    gbps    = seconds > 0 ? (double)s->stats.bytes * (double)s->count / seconds / 1e9 : 0;
    rate    = seconds > 0 ? (double)s->count / seconds : 0;
    if (a->json) {
        printf("{\"kvx_bench\": 1, \"mode\": \"%s\", \"storage\": \"%s\", \"transports\": \"%s\", "
               "\"idle_prefill\": %s, ",
               a->push ? "push" : "pull",
               a->memory == CLI_MEMORY_CUDA ? "cuda"
               : a->use_malloc              ? "malloc"
                                            : "kvx",
               kvx_peer_transports(c->peer), a->idle_prefill ? "true" : "false");
        if (a->push) /* what carries a push: P's writers, not D's own lanes above */
            printf("\"push_transports\": \"%s\", ", bench_push_transports(a));
        if (workload != NULL)
            printf("\"workload\": \"%s\", \"tokens\": %" PRIu64 ", \"blocks\": %" PRIu64 ", ",
                   workload, size, blocks);
        else
            printf("\"block_size\": %" PRIu64 ", \"batch\": %" PRIu64 ", \"contiguous\": %s, ",
                   size, blocks, a->contiguous ? "true" : "false");
        printf("\"iters\": %zu, \"descriptors\": %" PRIu64 ", \"posted\": %" PRIu64
               ", \"bytes\": %" PRIu64 ", \"gbps\": %.4f, \"transfers_per_s\": %.1f, "
               "\"descriptors_per_s\": %.1f, \"latency_us\": {\"p50\": %.2f, \"p99\": %.2f, "
               "\"min\": %.2f, \"max\": %.2f}, \"plan_us\": %.3f, ",
               s->count, s->stats.descriptors, s->stats.posted, s->stats.bytes, gbps, rate,
               rate * (double)s->stats.posted, percentile_us(s->wall, s->count, 50),
               percentile_us(s->wall, s->count, 99), percentile_us(s->wall, s->count, 0),
               percentile_us(s->wall, s->count, 100), percentile_us(s->plan, s->count, 50));
        if (a->push)
            printf("\"post_us\": null, ");
        else
            printf("\"post_us\": %.2f, ", percentile_us(s->post, s->count, 50));
        printf("\"xfer_us\": %.2f}\n", percentile_us(s->xfer, s->count, 50));
        fflush(stdout);
        return;
    }
    if (workload != NULL)
        printf("%-18s %6" PRIu64 " %6" PRIu64, workload, size, blocks);
    else {
        size_text(size, text, sizeof(text));
        printf("%6s %6" PRIu64, text, blocks);
    }
    printf(" %9" PRIu64 " %10.1f %7.2f %9.0f %8.3f %9.1f %9.1f %8.2f", s->stats.posted,
           (double)s->stats.bytes / 1e6, gbps, rate, rate * (double)s->stats.posted / 1e6,
           percentile_us(s->wall, s->count, 50), percentile_us(s->wall, s->count, 99),
           percentile_us(s->plan, s->count, 50));
    if (a->push)
        printf(" %9s", "-");
    else
        printf(" %9.1f", percentile_us(s->post, s->count, 50));
    printf(" %9.1f\n", percentile_us(s->xfer, s->count, 50));
    fflush(stdout);
}

/* The table's header (nothing with --json); `what` says which blocks a transfer moves. */
void bench_header_print(const struct bench_client *c, const char *what, int warmups)
{
    const struct bench_args *a = c->args;

    if (a->json)
        return;
    if (a->push)
        printf("kvx bench: push, %s storages on both sides, P's writers over UCX_TLS=%s\n",
               bench_storage_kind(a), bench_push_transports(a));
    else
        printf("kvx bench: pull, %s storages on both sides, over %s\n", bench_storage_kind(a),
               kvx_peer_transports(c->peer));
    printf("%s; %" PRIu64 " timed transfers per point after %d warm-ups; P %s\n", what, a->iters,
           warmups, a->idle_prefill ? "polls in 5 ms steps (--idle-prefill)" : "spins on progress");
    printf("%s %9s %10s %7s %9s %8s %9s %9s %8s %9s %9s\n",
           c->args->workload ? "layout             tokens blocks" : " block  batch", "desc/xfer",
           "MB/xfer", "GB/s", "xfer/s", "Mdesc/s", "p50 us", "p99 us", "plan us", "post us",
           "xfer us");
}

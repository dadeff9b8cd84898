/* demo.c: `kvx demo`, the main job on a built-in default: a prefill process and a decode
 * process on loopback, a batch of requests of mixed lengths pulled and every byte checked.
 * Orchestration and output only; the agent does the work. */
#include "builtin_layouts.h"
#include "cli.h"
#include "pattern.h"
#include "plan_print.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEMO_LAYOUT "deepseek-v4.1-demo"
#define DEMO_SEED   2026
#define DEMO_PORTS  50 /* ports tried from a pid-derived start */

/* Requests of the batch, in blocks per group (64-token blocks: 1k to 16k tokens). */
static const uint64_t demo_request_blocks[] = {16, 64, 256, 32, 128, 8, 200, 256};

static kvx_status_t demo_layout_load(const char *path, kvx_layout_t **layout_p)
{
    if (path != NULL)
        return kvx_layout_load_file(path, layout_p);
    for (size_t i = 0; i < num_builtin_layouts; i++) {
        if (strcmp(builtin_layouts[i].name, DEMO_LAYOUT) == 0)
            return kvx_layout_load_buffer(builtin_layouts[i].json, builtin_layouts[i].size,
                                          layout_p);
    }
    return KVX_ERR_INTERNAL;
}

/* The prefill process: serves until its parent sends SIGTERM. Reports its port, or 0 when
 * it could not start, on `ready`. */
static int demo_prefill(const kvx_layout_t *layout, int ready)
{
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_NAME,
                                 .name = "kvx demo prefill"};
    kvx_agent_t *agent        = NULL;
    uint32_t port             = 0;
    char listen[32];
    sigset_t stop;

    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop, NULL);
    for (uint32_t i = 0; i < DEMO_PORTS && agent == NULL; i++) {
        port = 20000 + ((uint32_t)getpid() * 7 + i) % 40000;
        snprintf(listen, sizeof(listen), "127.0.0.1:%" PRIu32, port);
        params.listen = listen;
        if (kvx_agent_create(layout, &params, &agent) != KVX_OK)
            agent = NULL;
    }
    if (agent == NULL) {
        port = 0;
        (void)!write(ready, &port, sizeof(port));
        return cli_fail(KVX_ERR_IO);
    }
    for (size_t s = 0;; s++) {
        uint64_t size;
        void *base = kvx_agent_storage(agent, s, &size);

        if (base == NULL)
            break;
        pattern_fill(base, size, DEMO_SEED, 0, s);
    }
    (void)!write(ready, &port, sizeof(port));
    for (;;) {
        struct timespec poll = {0, 0};
        siginfo_t info;

        if (sigtimedwait(&stop, &info, &poll) == SIGTERM)
            break;
        kvx_agent_progress(agent, 50);
    }
    kvx_agent_destroy(agent);
    return 0;
}

/* One request: the same `blocks` consecutive-from-random-start ids in every group. */
static void demo_request_fill(kvx_group_ids_t *groups, size_t num_groups, uint64_t *ids,
                              uint64_t blocks, uint64_t capacity, unsigned *rng)
{
    uint64_t start = capacity > blocks ? (uint64_t)rand_r(rng) % (capacity - blocks + 1) : 0;

    for (uint64_t i = 0; i < blocks; i++)
        ids[i] = start + i;
    if (blocks > 8) /* a gap in the middle, so not everything coalesces */
        ids[blocks / 2] = (start + blocks) % capacity;
    for (size_t g = 0; g < num_groups; g++)
        groups[g] = (kvx_group_ids_t){ids, blocks};
}

static bool demo_verify(const kvx_agent_t *agent)
{
    const kvx_pairs_t *pairs = kvx_agent_last_pairs(agent);

    for (size_t r = 0; r < kvx_pairs_num_reads(pairs); r++) {
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, r, NULL, &count);

        for (size_t i = 0; i < count; i++) {
            const uint8_t *local =
                (const uint8_t *)kvx_agent_storage(agent, p[i].local_storage, NULL) +
                p[i].local_offset;

            if (pattern_check(local, p[i].len, DEMO_SEED, 0, p[i].remote_storage,
                              p[i].remote_offset) < p[i].len)
                return false;
        }
    }
    return true;
}

/* Zeroes the decode side's storages (and touches every page before the transfers). */
static void demo_storages_zero(kvx_agent_t *agent)
{
    for (size_t s = 0;; s++) {
        uint64_t size;
        void *base = kvx_agent_storage(agent, s, &size);

        if (base == NULL)
            break;
        memset(base, 0, size);
    }
}

/* One batch of requests, pulled or pushed, each checked; prints a line per request and a
 * total. False (with the error printed) when a transfer fails or a byte differs. */
static bool demo_batch(kvx_agent_t *agent, kvx_peer_t *peer, bool push, kvx_group_ids_t *groups,
                       size_t num_groups, uint64_t capacity, const char *address)
{
    const size_t n_requests = sizeof(demo_request_blocks) / sizeof(demo_request_blocks[0]);
    uint64_t ids[256];
    uint64_t total_bytes       = 0;
    uint64_t total_descriptors = 0;
    uint64_t total_posted      = 0;
    double total_seconds       = 0;
    unsigned rng               = DEMO_SEED;

    printf("\n%s %zu requests %s the prefill process at %s:\n",
           push ? "push:" : "pull:", n_requests, push ? "written by" : "read from", address);
    for (size_t i = 0; i < n_requests; i++) {
        uint64_t blocks = demo_request_blocks[i] < capacity ? demo_request_blocks[i] : capacity;
        kvx_request_t request;
        kvx_read_stats_t stats;
        kvx_status_t status;

        demo_request_fill(groups, num_groups, ids, blocks, capacity, &rng);
        request = (kvx_request_t){groups, num_groups, NULL, 0};
        status  = push ? kvx_write(agent, &peer, 1, i + 1, &request, &stats)
                       : kvx_read(agent, &peer, 1, i + 1, &request, &stats);
        if (status != KVX_OK) {
            cli_fail(status);
            return false;
        }
        if (!demo_verify(agent)) {
            fprintf(stderr, "kvx: error: request %zu: transferred bytes differ from the source\n",
                    i + 1);
            return false;
        }
        printf("  request %zu: %4" PRIu64 " blocks per group, %6" PRIu64 " descriptors -> %5" PRIu64
               " after coalescing, %8.1f MB in %7.2f ms (%5.2f GB/s), verified\n",
               i + 1, blocks, stats.descriptors, stats.posted, (double)stats.bytes / 1e6,
               stats.seconds * 1e3,
               stats.seconds > 0 ? (double)stats.bytes / stats.seconds / 1e9 : 0.0);
        total_bytes += stats.bytes;
        total_descriptors += stats.descriptors;
        total_posted += stats.posted;
        total_seconds += stats.seconds;
    }
    printf("total: %" PRIu64 " descriptors -> %" PRIu64 " after coalescing, %.1f MB in %.2f ms,"
           " %.2f GB/s over %s (2 noisy cores: read the figure as an order of magnitude)\n",
           total_descriptors, total_posted, (double)total_bytes / 1e6, total_seconds * 1e3,
           total_seconds > 0 ? (double)total_bytes / total_seconds / 1e9 : 0.0,
           kvx_peer_transports(peer));
    return true;
}

/* The decode side: connect, pull the batch, check every byte. */
static int demo_decode(const kvx_layout_t *layout, uint32_t port)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_NAME,
                                 .name       = "kvx demo decode"};
    kvx_agent_t *agent        = NULL;
    kvx_peer_t *peer          = NULL;
    kvx_group_ids_t groups[8];
    char address[32];
    size_t num_groups;
    uint64_t capacity;
    kvx_status_t status;
    int ret = EXIT_BAD_INPUT;

    snprintf(address, sizeof(address), "127.0.0.1:%" PRIu32, port);
    status = kvx_agent_create(layout, &params, &agent);
    if (status == KVX_OK)
        status = kvx_agent_connect(agent, address, &peer);
    if (status != KVX_OK) {
        ret = cli_fail(status);
        goto out;
    }
    {
        const kvx_regions_t *regions = kvx_agent_regions(agent);
        kvx_region_info_t info;

        kvx_regions_get(regions, 0, &info);
        capacity   = info.num_blocks;
        num_groups = 1;
        for (size_t r = 0; r < kvx_regions_count(regions); r++) {
            kvx_regions_get(regions, r, &info);
            if (info.group >= 0 && (size_t)info.group + 1 > num_groups)
                num_groups = (size_t)info.group + 1;
            if (info.num_blocks < capacity)
                capacity = info.num_blocks;
        }
        if (num_groups > 8)
            num_groups = 8;
        plan_print_table(stdout, regions);
    }
    for (int push = 0; push < 2; push++) {
        demo_storages_zero(agent); /* so a verified batch proves its own bytes */
        if (!demo_batch(agent, peer, push == 1, groups, num_groups, capacity, address))
            goto out;
    }
    printf("verified\n");
    ret = 0;

out:
    kvx_peer_destroy(peer);
    kvx_agent_destroy(agent);
    return ret;
}

int demo_run(const char *layout_path)
{
    kvx_layout_t *layout = NULL;
    kvx_status_t status  = demo_layout_load(layout_path, &layout);
    uint32_t port        = 0;
    int ready[2];
    int child_status;
    int ret;
    pid_t pid;

    if (status != KVX_OK)
        return cli_fail(status);
    if (getenv("UCX_NET_DEVICES") == NULL)
        setenv("UCX_NET_DEVICES", "lo", 1); /* the demo stays on loopback */
    if (pipe(ready) != 0) {
        kvx_layout_destroy(layout);
        fprintf(stderr, "kvx: error: demo: cannot create a pipe\n");
        return EXIT_INTERNAL;
    }
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        close(ready[0]);
        _exit(demo_prefill(layout, ready[1]));
    }
    close(ready[1]);
    if (pid < 0 || read(ready[0], &port, sizeof(port)) != sizeof(port) || port == 0) {
        fprintf(stderr, "kvx: error: demo: the prefill process did not start\n");
        ret = EXIT_INTERNAL;
    } else {
        printf("prefill process %d serves on 127.0.0.1:%" PRIu32 "; this process decodes\n\n",
               (int)pid, port);
        ret = demo_decode(layout, port);
    }
    close(ready[0]);
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, &child_status, 0);
    }
    kvx_layout_destroy(layout);
    return ret;
}

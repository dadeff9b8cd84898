/* demo.c: `kvx demo`, the main job on a built-in default: a prefill process and a decode
 * process on loopback, a batch of requests of mixed lengths pulled and every byte checked.
 * Orchestration and output only; the agent does the work. */
#include "builtin_layouts.h"
#include "cli.h"
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
#define DEMO_MAX_TP 8 /* ranks on either side */

/* Requests of the batch, in blocks per group (64-token blocks: 1k to 16k tokens). */
static const uint64_t demo_request_blocks[] = {16, 64, 256, 32, 128, 8, 200, 256};

static kvx_status_t demo_layout_read(const char *path, kvx_layout_t **layout_p)
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

static kvx_status_t demo_layout_load(const char *path, enum cli_memory memory,
                                     kvx_layout_t **layout_p)
{
    kvx_status_t status = demo_layout_read(path, layout_p);

    if (status == KVX_OK)
        cli_layout_memory(*layout_p, memory, "demo");
    return status;
}

/* The deployment's secret, set before any process forks: --auth FILE's (or KVX_AUTH_FILE's),
 * or one the demo makes for itself. */
static uint8_t demo_key[KVX_AUTH_KEY_LEN];

/* The prefill process: serves until its parent sends SIGTERM. Reports its port, or 0 when
 * it could not start, on `ready`. */
static int demo_prefill(const kvx_layout_t *layout, int ready, uint32_t rank, uint32_t tp)
{
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_NAME |
                                     KVX_AGENT_PARAM_FIELD_TP_RANK | KVX_AGENT_PARAM_FIELD_TP_SIZE |
                                     KVX_AGENT_PARAM_FIELD_AUTH_KEY,
                                 .name     = "kvx demo prefill",
                                 .tp_rank  = rank,
                                 .tp_size  = tp,
                                 .auth_key = demo_key};
    kvx_agent_t *agent        = NULL;
    uint32_t port             = 0;
    kvx_status_t status;
    sigset_t stop;

    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop, NULL);
    params.listen = "127.0.0.1:0"; /* a free port the kernel picks */
    status        = kvx_agent_create(layout, &params, &agent);
    if (status != KVX_OK) {
        (void)!write(ready, &port, sizeof(port));
        return cli_fail(status);
    }
    status = kvx_agent_fill_pattern(agent, DEMO_SEED);
    if (status == KVX_OK)
        port = (uint32_t)strtoul(strrchr(kvx_agent_listen_address(agent), ':') + 1, NULL, 10);
    else
        cli_fail(status);
    (void)!write(ready, &port, sizeof(port));
    if (port == 0) {
        kvx_agent_destroy(agent);
        return EXIT_INTERNAL;
    }
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
    /* A gap in the middle, so not everything coalesces: the block after the run, or the first
     * one when the run ends the cache. Never when the request is the whole cache: that block
     * would be one of the request's (an id twice is refused). */
    if (blocks > 8 && blocks < capacity)
        ids[blocks / 2] = (start + blocks) % capacity;
    for (size_t g = 0; g < num_groups; g++)
        groups[g] = (kvx_group_ids_t){ids, blocks};
}

/* One batch of requests, pulled or pushed, each checked; prints a line per request and a
 * total. False (with the error printed) when a transfer fails or a byte differs. */
static bool demo_batch(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers, bool push,
                       kvx_group_ids_t *groups, size_t num_groups, uint64_t capacity)
{
    const size_t n_requests = sizeof(demo_request_blocks) / sizeof(demo_request_blocks[0]);
    uint64_t ids[256];
    uint64_t total_bytes       = 0;
    uint64_t total_descriptors = 0;
    uint64_t total_posted      = 0;
    double total_seconds       = 0;
    unsigned rng               = DEMO_SEED;

    printf("\n%s %zu requests %s %zu prefill process%s:\n", push ? "push:" : "pull:", n_requests,
           push ? "written by" : "read from", num_peers, num_peers > 1 ? "es" : "");
    for (size_t i = 0; i < n_requests; i++) {
        uint64_t blocks = demo_request_blocks[i] < capacity ? demo_request_blocks[i] : capacity;
        kvx_request_t request;
        kvx_read_stats_t stats;
        kvx_status_t status;

        status = kvx_agent_zero(agent); /* a verified request proves its own bytes only */
        if (status != KVX_OK) {
            cli_fail(status);
            return false;
        }
        demo_request_fill(groups, num_groups, ids, blocks, capacity, &rng);
        request = (kvx_request_t){groups, num_groups, NULL, 0, NULL};
        status  = push ? kvx_write(agent, peers, num_peers, i + 1, &request, &stats)
                       : kvx_read(agent, peers, num_peers, i + 1, &request, &stats);
        if (status != KVX_OK) {
            cli_fail(status);
            return false;
        }
        status = kvx_agent_check_pattern(agent, DEMO_SEED);
        if (status != KVX_OK) {
            fprintf(stderr, "kvx: error: request %zu: %s%s\n", i + 1,
                    status == KVX_ERR_MISMATCH ? "MISMATCH: " : "", kvx_errmsg());
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
           kvx_peer_transports(peers[0]));
    return true;
}

/* A decode rank: connect to every prefill rank, pull then push the batch, check every byte.
 * Rank 0 prints (the others write to /dev/null): the region table's totals, or its rows too
 * when `verbose`, then a line per request. */
static int demo_decode(const kvx_layout_t *layout, const uint32_t *ports, size_t num_ports,
                       uint32_t rank, uint32_t tp, bool verbose)
{
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_NAME | KVX_AGENT_PARAM_FIELD_TP_RANK |
                                     KVX_AGENT_PARAM_FIELD_TP_SIZE | KVX_AGENT_PARAM_FIELD_AUTH_KEY,
                                 .name     = "kvx demo decode",
                                 .tp_rank  = rank,
                                 .tp_size  = tp,
                                 .auth_key = demo_key};
    kvx_agent_t *agent        = NULL;
    kvx_peer_t *peers[DEMO_MAX_TP];
    size_t num_peers = 0;
    kvx_group_ids_t groups[8];
    size_t num_groups;
    uint64_t capacity;
    kvx_status_t status;
    int ret = EXIT_BAD_INPUT;

    status = kvx_agent_create(layout, &params, &agent);
    for (size_t i = 0; status == KVX_OK && i < num_ports; i++) {
        char address[32];

        snprintf(address, sizeof(address), "127.0.0.1:%" PRIu32, ports[i]);
        status = kvx_agent_connect(agent, address, &peers[num_peers]);
        num_peers += status == KVX_OK;
    }
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
        /* A model's table runs to dozens of rows, enough to push the figures off a screen:
         * the totals here, the rows with --verbose (issue 24). */
        if (verbose)
            plan_print_table(stdout, regions);
        else
            plan_print_totals(stdout, regions);
    }
    for (int push = 0; push < 2; push++) {
        if (!demo_batch(agent, peers, num_peers, push == 1, groups, num_groups, capacity))
            goto out;
    }
    ret = 0;

out:
    for (size_t i = 0; i < num_peers; i++)
        kvx_peer_destroy(peers[i]);
    kvx_agent_destroy(agent);
    return ret;
}

int demo_run(const char *layout_path, const char *auth_file, enum cli_memory memory, uint32_t p_tp,
             uint32_t d_tp, bool verbose)
{
    kvx_layout_t *layout = NULL;
    kvx_status_t status  = demo_layout_load(layout_path, memory, &layout);
    pid_t prefill[DEMO_MAX_TP];
    pid_t decode[DEMO_MAX_TP];
    uint32_t ports[DEMO_MAX_TP];
    size_t started = 0;
    int ret        = 0;
    int child_status;

    if (status == KVX_OK) {
        auth_file = kvx_auth_file(auth_file);
        status    = auth_file != NULL ? kvx_auth_key_load(auth_file, demo_key)
                                      : kvx_auth_key_generate(demo_key);
    }
    if (status != KVX_OK) {
        kvx_layout_destroy(layout);
        return cli_fail(status);
    }
    if (getenv("UCX_NET_DEVICES") == NULL)
        setenv("UCX_NET_DEVICES", "lo", 1); /* the demo stays on loopback */
    fflush(stdout);
    for (uint32_t r = 0; r < p_tp && ret == 0; r++) {
        int ready[2];

        if (pipe(ready) != 0) {
            ret = EXIT_INTERNAL;
            break;
        }
        prefill[r] = fork();
        if (prefill[r] == 0) {
            close(ready[0]);
            _exit(demo_prefill(layout, ready[1], r, p_tp));
        }
        close(ready[1]);
        if (prefill[r] > 0)
            started++;
        if (prefill[r] < 0 || read(ready[0], &ports[r], sizeof(ports[r])) != sizeof(ports[r]) ||
            ports[r] == 0) {
            fprintf(stderr, "kvx: error: demo: prefill rank %" PRIu32 " did not start\n", r);
            ret = EXIT_INTERNAL;
        }
        close(ready[0]);
    }
    if (ret == 0) {
        printf("%" PRIu32 " prefill process%s (TP %" PRIu32 ") serve on 127.0.0.1:%" PRIu32
               "%s; %" PRIu32 " decode process%s (TP %" PRIu32 ")%s\n\n",
               p_tp, p_tp > 1 ? "es" : "", p_tp, ports[0], p_tp > 1 ? ".." : "", d_tp,
               d_tp > 1 ? "es" : "", d_tp, d_tp > 1 ? "; rank 0 prints" : "");
        /* Decode ranks 1.. run quietly in processes of their own; this one is rank 0. */
        for (uint32_t r = 1; r < d_tp; r++) {
            fflush(stdout);
            decode[r] = fork();
            if (decode[r] == 0)
                _exit(freopen("/dev/null", "w", stdout) != NULL
                          ? demo_decode(layout, ports, p_tp, r, d_tp, false)
                          : EXIT_INTERNAL);
        }
        ret = demo_decode(layout, ports, p_tp, 0, d_tp, verbose);
        for (uint32_t r = 1; r < d_tp; r++) {
            if (decode[r] < 0 || waitpid(decode[r], &child_status, 0) != decode[r] ||
                !WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) {
                fprintf(stderr, "kvx: error: demo: decode rank %" PRIu32 " failed\n", r);
                ret = ret != 0 ? ret : EXIT_BAD_INPUT;
            }
        }
        if (ret == 0)
            printf("verified\n");
    }
    for (size_t r = 0; r < started; r++) {
        kill(prefill[r], SIGTERM);
        waitpid(prefill[r], &child_status, 0);
    }
    kvx_layout_destroy(layout);
    return ret;
}

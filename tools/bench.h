/* bench.h: `kvx bench`, transfer bandwidth and latency between a prefill and a decode process
 * (docs/performance.md "Transfers"): what bench.c (options, processes, the sweep),
 * bench_workload.c (--workload) and bench_point.c (a point's timing and output) share.
 * Measurement and output only. */
#ifndef KVX_TOOLS_BENCH_H
#define KVX_TOOLS_BENCH_H

#include "cli.h"
#include "kvx.h"

#define BENCH_MAX_POINTS  16 /* block sizes or token counts in one list */
#define BENCH_MAX_LAYOUTS 8  /* --layouts entries */

/* What the options ask for. Lists are parsed into arrays once. */
struct bench_args {
    bool push;
    bool use_malloc;
    bool json;
    bool contiguous;
    bool workload;
    bool idle_prefill;      /* P waits in kvx_agent_progress's polls, as kvx serve, not spinning */
    enum cli_memory memory; /* --memory: host (default) or GPU storages */
    uint64_t sizes[BENCH_MAX_POINTS]; /* bytes per block (sweep) or tokens (workload) */
    size_t num_sizes;
    uint64_t batch; /* blocks per transfer */
    uint64_t iters; /* 0: the default of the mode */
    uint64_t warmups; /* untimed transfers per point, when warmups_given */
    bool warmups_given;
    const char *transports;
    const char *peer;
    const char *listen;
    const char *push_transports;            /* P's push writers; default the library's (tcp) */
    const char *auth;                       /* --auth FILE; else KVX_AUTH_FILE's, else made */
    uint8_t key[KVX_AUTH_KEY_LEN];          /* both agents' secret, set before the fork */
    const char *layouts[BENCH_MAX_LAYOUTS]; /* into layout_text */
    char layout_text[512];
    size_t num_layouts;
};

/* Samples of one point, in ns, and what the last transfer reported. */
struct bench_samples {
    uint64_t *wall; /* whole call: post + wait + destroy (pull) or kvx_write (push) */
    uint64_t *post; /* the kvx_read_post call alone (pull) */
    uint64_t *xfer; /* kvx_read_stats_t.seconds */
    uint64_t *plan; /* kvx_peer_plan_request alone */
    size_t count;
    kvx_read_stats_t stats;
};

/* The decode side of a run: its agent, the peer, and a plan to time planning on. */
struct bench_client {
    const struct bench_args *args;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_peer_plan_t *plan;
    kvx_pairs_t *pairs;
    uint64_t request_id;
};
/* Runs `kvx bench` with the arguments after the subcommand; returns the exit status
 * (bench.c). */
int bench_main(int argc, char **argv);

/* One point (bench_point.c, below bench.c and bench_workload.c, calling neither). */

/* Times one point on a connected client: `warmups` untimed transfers of `request`, then
 * args->iters timed ones into *s, sorted. Stops at the first failed transfer. */
kvx_status_t bench_point_run(struct bench_client *c, const kvx_request_t *request, size_t warmups,
                             struct bench_samples *s);

/* Prints the table's header (nothing with --json); `what` says which blocks move. */
void bench_header_print(const struct bench_client *c, const char *what, int warmups);

/* Prints one point as a table row or a JSON object. `workload` names the layout (NULL: the
 * sweep); `size` is bytes per block (sweep) or tokens (workload); `blocks` per group. */
void bench_point_print(const struct bench_client *c, const struct bench_samples *s,
                       const char *workload, uint64_t size, uint64_t blocks);

#endif

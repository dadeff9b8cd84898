/* serve_fetch.c: `kvx serve` (a prefill worker that fills its cache with a known pattern and
 * serves it) and `kvx fetch` (a decode worker that pulls a request and checks every byte).
 * Argument handling and output only; the agent does the work. */
#include "block_ids.h"
#include "cli.h"
#include "pattern.h"
#include "metrics_http.h"
#include "stats_json.h"
#include "verify.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_serve[] =
    "usage: kvx serve LAYOUT --listen HOST:PORT [--tp-rank R --tp-size N] [--fill SEED]\n"
    "                 [--transports LIST] [--malloc] [--lease MS] [--metrics HOST:PORT]\n"
    "                 [--verbose]\n"
    "\n"
    "A prefill worker: allocates the layout's storages (through UCX, or with malloc when\n"
    "--malloc is given), fills every byte with a pattern of (SEED, storage, offset), and\n"
    "serves its metadata on the side channel at HOST:PORT until SIGINT or SIGTERM. Decode\n"
    "workers (kvx fetch) then read from it and notify it. Port 0 takes a free port; the\n"
    "\"serving ... on HOST:PORT\" line names the one bound.\n"
    "\n"
    "  --fill SEED         the pattern's seed; default 1\n"
    "  --transports LIST   UCX transports; default sm,cma,tcp\n"
    "  --timeout MS        transfer deadline; default 10000\n"
    "  --lease MS          how long held blocks wait for their done or a heartbeat;\n"
    "                      default 30000\n"
    "  --metrics HOST:PORT Prometheus metrics at http://HOST:PORT/metrics (port 0: a free\n"
    "                      one, printed)\n"
    "  --verbose           one line on stderr per state change, never per block\n";

static const char usage_fetch[] =
    "usage: kvx fetch LAYOUT --peer HOST:PORT[,HOST:PORT...] --blocks 'G:IDS;G:IDS'\n"
    "                 [--remote-blocks IDS] [--tp-rank R --tp-size N] [--verify [--fill SEED]]\n"
    "                 [--push] [--transports LIST] [--malloc] [--timeout MS] [--json]\n"
    "                 [--verbose]\n"
    "\n"
    "A decode worker: connects to every prefill rank given (handshake: compatibility hash,\n"
    "then the region tables), pulls the request, notifies the ranks read from, and prints\n"
    "bytes, descriptors before and after coalescing, GB/s and transports. With --verify it\n"
    "checks every transferred byte against the pattern kvx serve filled with SEED and prints\n"
    "the verdict, 'verified' or the first wrong byte (exit status 2).\n"
    "\n"
    "  --push              ask the prefill ranks to write the blocks in (push mode) instead\n"
    "                      of reading them\n"
    "  --fill SEED         the seed kvx serve used; default 1\n"
    "  --timeout MS        handshake and transfer deadline; default 10000\n"
    "  --json              one JSON object: outcome, figures and the agent's stats\n"
    "  --verbose           one line on stderr per state change, never per block\n";

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

struct agent_args {
    const char *layout;
    const char *listen;
    const char *peers;
    const char *blocks;
    const char *remote_blocks;
    const char *transports;
    uint64_t tp_rank;
    uint64_t tp_size;
    uint64_t seed;
    uint64_t timeout_ms;
    uint64_t lease_ms;
    const char *metrics;
    bool verify;
    bool push;
    bool use_malloc;
    bool verbose;
    bool json;
};

/* Parses the options serve and fetch share; -1 to go on, else the exit status. */
static int agent_args_parse(int argc, char **argv, const char *usage, struct agent_args *a)
{
    a->tp_size    = 1;
    a->seed       = 1;
    a->timeout_ms = 10000;
    a->lease_ms   = 30000;
    for (int i = 0; i < argc; i++) {
        const char *arg   = argv[i];
        const char **text = NULL;
        uint64_t *number  = NULL;

        if (cli_is_help(arg)) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(arg, "--verify") == 0) {
            a->verify = true;
            continue;
        }
        if (strcmp(arg, "--push") == 0) {
            a->push = true;
            continue;
        }
        if (strcmp(arg, "--malloc") == 0) {
            a->use_malloc = true;
            continue;
        }
        if (strcmp(arg, "--verbose") == 0) {
            a->verbose = true;
            continue;
        }
        if (strcmp(arg, "--json") == 0) {
            a->json = true;
            continue;
        }
        if (arg[0] != '-') {
            if (a->layout != NULL)
                return cli_usage_error("more than one LAYOUT given", usage);
            a->layout = arg;
            continue;
        }
        if (strcmp(arg, "--listen") == 0)
            text = &a->listen;
        else if (strcmp(arg, "--peer") == 0)
            text = &a->peers;
        else if (strcmp(arg, "--blocks") == 0)
            text = &a->blocks;
        else if (strcmp(arg, "--remote-blocks") == 0)
            text = &a->remote_blocks;
        else if (strcmp(arg, "--transports") == 0)
            text = &a->transports;
        else if (strcmp(arg, "--metrics") == 0)
            text = &a->metrics;
        else if (strcmp(arg, "--tp-rank") == 0)
            number = &a->tp_rank;
        else if (strcmp(arg, "--tp-size") == 0)
            number = &a->tp_size;
        else if (strcmp(arg, "--fill") == 0)
            number = &a->seed;
        else if (strcmp(arg, "--timeout") == 0)
            number = &a->timeout_ms;
        else if (strcmp(arg, "--lease") == 0)
            number = &a->lease_ms;
        else {
            fprintf(stderr, "kvx: error: unknown option %s\n\n%s", arg, usage);
            return EXIT_BAD_INPUT;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvx: error: %s needs a value\n\n%s", arg, usage);
            return EXIT_BAD_INPUT;
        }
        if (text != NULL)
            *text = argv[++i];
        else if (!cli_parse_number(arg, argv[++i],
                                   number == &a->seed ? UINT64_MAX
                                   : number == &a->timeout_ms || number == &a->lease_ms
                                       ? 3600000
                                       : KVX_MAX_TP,
                                   number))
            return EXIT_BAD_INPUT;
    }
    if (a->layout == NULL)
        return cli_usage_error("LAYOUT is required", usage);
    return -1;
}

/* --verbose: the agent's state changes, one line each, on stderr. */
static void log_line(void *arg, const char *line)
{
    fprintf(stderr, "%s: %s\n", (const char *)arg, line);
}

static void storages_free(void **bases, size_t count)
{
    for (size_t s = 0; bases != NULL && s < count; s++)
        free(bases[s]);
    free(bases);
}

/* Creates the agent of `a`, with malloc'd storages when asked (freed by the caller through
 * *storages_p after the agent). */
static int agent_start(const struct agent_args *a, bool listen, kvx_agent_t **agent_p,
                       void ***storages_p, size_t *num_storages_p)
{
    kvx_agent_params_t params = {
        .field_mask = KVX_AGENT_PARAM_FIELD_TP_RANK | KVX_AGENT_PARAM_FIELD_TP_SIZE |
                      KVX_AGENT_PARAM_FIELD_NAME | KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                      KVX_AGENT_PARAM_FIELD_LEASE_MS,
        .timeout_ms = (uint32_t)a->timeout_ms,
        .lease_ms   = (uint32_t)a->lease_ms,
        .name       = listen ? "kvx serve" : "kvx fetch",
        .tp_rank    = (uint32_t)a->tp_rank,
        .tp_size    = (uint32_t)a->tp_size,
        .listen     = a->listen,
        .transports = a->transports,
    };
    kvx_layout_t *layout;
    kvx_status_t status = kvx_layout_load_file(a->layout, &layout);
    size_t n;

    *storages_p     = NULL;
    *num_storages_p = 0;
    if (status != KVX_OK)
        return cli_fail(status);
    if (listen)
        params.field_mask |= KVX_AGENT_PARAM_FIELD_LISTEN;
    if (a->transports != NULL)
        params.field_mask |= KVX_AGENT_PARAM_FIELD_TRANSPORTS;
    n = kvx_layout_num_storages(layout);
    if (a->use_malloc) {
        /* Engine-owned memory, registered as it is rather than allocated by UCX. */
        void **bases = calloc(n, sizeof(*bases));

        for (size_t s = 0; bases != NULL && s < n; s++) {
            uint64_t size = kvx_layout_storage_size(layout, s);

            bases[s] =
                size <= SIZE_MAX - 4095 ? aligned_alloc(4096, (size + 4095) & ~4095ull) : NULL;
            if (bases[s] == NULL) {
                storages_free(bases, s);
                bases = NULL;
            }
        }
        if (bases == NULL) {
            kvx_layout_destroy(layout);
            fprintf(stderr, "kvx: error: out of memory allocating the storages\n");
            return EXIT_INTERNAL;
        }
        params.field_mask |= KVX_AGENT_PARAM_FIELD_STORAGE_BASES;
        params.storage_bases = bases;
        *storages_p          = bases;
        *num_storages_p      = n;
    }
    status = kvx_agent_create(layout, &params, agent_p);
    kvx_layout_destroy(layout);
    if (status == KVX_OK) {
        if (a->verbose)
            kvx_agent_set_log_callback(*agent_p, log_line, (void *)params.name);
        return -1;
    }
    storages_free(*storages_p, *num_storages_p);
    *storages_p = NULL;
    return cli_fail(status);
}

int command_serve(int argc, char **argv)
{
    struct agent_args a = {0};
    kvx_agent_t *agent;
    void **storages;
    size_t num_storages;
    uint64_t bytes = 0;
    kvx_agent_stats_t stats;
    struct metrics_http *metrics = NULL;
    int ret                      = agent_args_parse(argc, argv, usage_serve, &a);

    if (ret >= 0)
        return ret;
    if (a.listen == NULL || a.peers != NULL || a.blocks != NULL || a.verify || a.json)
        return cli_usage_error(
            "serve: needs --listen, takes no --peer, --blocks, --verify or --json", usage_serve);
    ret = agent_start(&a, true, &agent, &storages, &num_storages);
    if (ret >= 0)
        return ret;
    if (a.metrics != NULL &&
        metrics_http_start(a.metrics, agent, "kvx serve", &metrics) != KVX_OK) {
        kvx_agent_destroy(agent);
        storages_free(storages, num_storages);
        return EXIT_BAD_INPUT;
    }
    for (size_t s = 0;; s++) {
        uint64_t size;
        void *base = kvx_agent_storage(agent, s, &size);

        if (base == NULL)
            break;
        pattern_fill(base, size, a.seed, (uint32_t)a.tp_rank, s);
        bytes += size;
    }
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    printf("serving %s on %s: rank %" PRIu64 " of %" PRIu64 ", %zu regions, %" PRIu64
           " bytes filled with seed %" PRIu64 "\n",
           a.layout, kvx_agent_listen_address(agent), a.tp_rank, a.tp_size,
           kvx_regions_count(kvx_agent_regions(agent)), bytes, a.seed);
    if (metrics != NULL)
        printf("metrics on http://%.*s:%u/metrics\n", (int)strcspn(a.metrics, ":"), a.metrics,
               metrics_http_port(metrics));
    fflush(stdout);
    while (!stop_requested) {
        kvx_status_t status = kvx_agent_progress(agent, 20);

        if (status != KVX_OK) {
            cli_fail(status);
            break;
        }
        metrics_http_serve(metrics);
    }
    metrics_http_stop(metrics);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    printf("stopped: %" PRIu64 " notifications, %" PRIu64 " dropped, %" PRIu64 " leases expired\n",
           stats.notifications, stats.notifications_dropped, stats.leases_expired);
    kvx_agent_destroy(agent);
    storages_free(storages, num_storages);
    return 0;
}

/* --json: one object with the outcome, the transfer's figures and the agent's stats. */
static void fetch_json_print(const struct agent_args *a, const kvx_agent_t *agent,
                             const kvx_peer_t *peer, kvx_status_t status,
                             const kvx_read_stats_t *read, const char *verdict)
{
    kvx_agent_stats_t stats;

    kvx_agent_stats(agent, &stats, sizeof(stats));
    printf("{\"ok\": %s, \"error\": ", status == KVX_OK ? "true" : "false");
    json_string_print(stdout, status == KVX_OK ? "" : kvx_errmsg());
    printf(", \"mode\": \"%s\", \"bytes\": %" PRIu64 ", \"descriptors\": %" PRIu64
           ", \"posted\": %" PRIu64 ", \"seconds\": %.9f, \"transports\": ",
           a->push ? "push" : "pull", read->bytes, read->descriptors, read->posted, read->seconds);
    json_string_print(stdout, kvx_peer_transports(peer));
    printf(", \"verified\": ");
    json_string_print(stdout, verdict != NULL ? verdict : "not verified");
    printf(", \"stats\": ");
    stats_json_print(stdout, &stats);
    printf("}\n");
}

int command_fetch(int argc, char **argv)
{
    struct agent_args a = {0};
    kvx_agent_t *agent  = NULL;
    kvx_peer_t *peers[KVX_MAX_TP];
    size_t num_peers       = 0;
    struct block_ids ids   = {0};
    struct block_ids rids  = {0};
    kvx_read_stats_t stats = {0};
    void **storages        = NULL;
    size_t num_storages    = 0;
    char verdict[256]      = "not verified";
    char error[512];
    kvx_request_t request;
    kvx_status_t status;
    int ret = agent_args_parse(argc, argv, usage_fetch, &a);

    if (ret >= 0)
        return ret;
    if (a.peers == NULL || a.blocks == NULL || a.listen != NULL)
        return cli_usage_error("fetch: needs --peer and --blocks, takes no --listen", usage_fetch);
    if (!block_ids_parse("--blocks", a.blocks, &ids, error, sizeof(error)) ||
        (a.remote_blocks != NULL &&
         !block_ids_parse("--remote-blocks", a.remote_blocks, &rids, error, sizeof(error)))) {
        fprintf(stderr, "kvx: error: %s\n", error);
        ret = EXIT_BAD_INPUT;
        goto out;
    }
    ret = agent_start(&a, false, &agent, &storages, &num_storages);
    if (ret >= 0)
        goto out;
    storages_zero(agent); /* a clean slate: what was not transferred stays zero */
    for (const char *p = a.peers; *p != '\0' && num_peers < KVX_MAX_TP;) {
        size_t len = strcspn(p, ",");
        char address[256];

        snprintf(address, sizeof(address), "%.*s", (int)(len < 255 ? len : 255), p);
        status = kvx_agent_connect(agent, address, &peers[num_peers]);
        if (status != KVX_OK) {
            ret = cli_fail(status);
            goto out;
        }
        num_peers++;
        p += len + (p[len] == ',');
    }
    request = (kvx_request_t){ids.groups, ids.num_groups, rids.groups, rids.num_groups};
    status  = a.push ? kvx_write(agent, peers, num_peers, 1, &request, &stats)
                     : kvx_read(agent, peers, num_peers, 1, &request, &stats);
    if (status != KVX_OK) {
        if (a.json)
            fetch_json_print(&a, agent, peers[0], status, &stats, NULL);
        ret = cli_fail(status);
        goto out;
    }
    ret = 0;
    if (a.verify && !verify_last_transfer(agent, a.seed, verdict, sizeof(verdict)))
        ret = EXIT_BAD_INPUT;
    if (a.json) {
        fetch_json_print(&a, agent, peers[0], status, &stats, verdict);
        goto out;
    }
    printf("%s %" PRIu64 " bytes in %" PRIu64 " descriptors (%" PRIu64
           " after coalescing) from %zu peer%s in %.3f ms: %.2f GB/s over %s\n",
           a.push ? "pushed" : "fetched", stats.bytes, stats.descriptors, stats.posted, num_peers,
           num_peers > 1 ? "s" : "", stats.seconds * 1e3,
           stats.seconds > 0 ? (double)stats.bytes / stats.seconds / 1e9 : 0.0,
           kvx_peer_transports(peers[0]));
    printf("%s\n", verdict);

out:
    for (size_t i = 0; i < num_peers; i++)
        kvx_peer_destroy(peers[i]);
    kvx_agent_destroy(agent);
    storages_free(storages, num_storages);
    block_ids_free(&ids);
    block_ids_free(&rids);
    return ret;
}

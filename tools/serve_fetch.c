/* serve_fetch.c: `kvx serve` (a prefill worker that fills its cache with a known pattern, or
 * bytes nobody can predict, and serves it) and `kvx fetch` (a decode worker that pulls a
 * request and checks every byte: by checksums against the prefill side's memory, and
 * against the pattern when it knows the seed).
 * Argument handling and output only; the agent does the work. */
#include "block_ids.h"
#include "cli.h"
#include "metrics_http.h"
#include "progress.h"
#include "fetch_json.h"
#include "fetch_peers.h"

#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* The library's defaults in the usage text: kvx.h says them once. */
#define STRING(x)         #x
#define DEFAULT_TEXT(x)   "default " STRING(x)
#define TIMEOUT_DEFAULT   DEFAULT_TEXT(KVX_DEFAULT_TIMEOUT_MS)
#define LEASE_DEFAULT     DEFAULT_TEXT(KVX_DEFAULT_LEASE_MS)
#define HEARTBEAT_DEFAULT DEFAULT_TEXT(KVX_DEFAULT_HEARTBEAT_MS)
#define MAX_PUSH_DEFAULT  DEFAULT_TEXT(KVX_DEFAULT_MAX_PUSH_MS)

static const char usage_serve[] =
    "usage: kvx serve LAYOUT --listen HOST:PORT (--auth FILE | --insecure)\n"
    "                 [--tp-rank R --tp-size N] [--fill SEED|random]\n"
    "                 [--transports LIST] [--malloc | --memory host|cuda] [--lease MS]\n"
    "                 [--metrics HOST:PORT]\n"
    "                 [--timeout MS] [--max-push MS]\n"
    "                 [--hold 'ID=G:IDS;G:IDS' ... [--consumers N] [--token HEX]] [--verbose]\n"
    "\n"
    "A prefill worker: allocates the layout's storages (through UCX, or with malloc when\n"
    "--malloc is given), fills every byte with a pattern of (SEED, storage, offset), or with\n"
    "bytes a decode worker cannot predict (--fill random: only checksums verify them), and\n"
    "serves its metadata on the side channel at HOST:PORT until SIGINT or SIGTERM. Decode\n"
    "workers (kvx fetch) then read from it and notify it. Port 0 takes a free port; the\n"
    "\"serving ... on HOST:PORT\" line names the one bound.\n"
    "\n"
    "  --auth FILE         the deployment's secret (kvx auth-key FILE); default the file\n"
    "                      KVX_AUTH_FILE names. Only peers with it are answered\n"
    "  --insecure          no secret: plain side channel, on a loopback address only\n"
    "  --listen HOST:PORT  a host name (resolved: its first IPv4 address, else IPv6), an\n"
    "                      IPv4 address or an IPv6 one in brackets ([::1]:0); 0.0.0.0:\n"
    "                      every interface\n"
    "  --tp-rank R, --tp-size N\n"
    "                      this prefill rank of a TP group of N; default 0 of 1\n"
    "  --fill SEED|random  the pattern's seed (default 1), or random: the pattern of a seed\n"
    "                      drawn from the kernel and never shown\n"
    "  --transports LIST   UCX transports; default " KVX_DEFAULT_TRANSPORTS "\n"
    "                      (and cuda_copy,cuda_ipc with --memory cuda)\n"
    "  --malloc            storages in memory this command allocates with malloc and\n"
    "                      registers as an engine's (default: UCX allocates them)\n"
    "  --memory host|cuda  where the storages live: host memory (default; a layout's\n"
    "                      \"vram\" storages too, said on stderr) or GPU memory kvx\n"
    "                      allocates (filled through a host staging buffer: docs/gpu.md)\n"
    "  --timeout MS        handshake deadline, and how long a push writer may complete\n"
    "                      nothing before its pushes fail; " TIMEOUT_DEFAULT "\n"
    "  --max-push MS       the longest a push may write: each writes as long as its\n"
    "                      requester waits (its --timeout), at most MS;\n"
    "                      " MAX_PUSH_DEFAULT "\n"
    "  --lease MS          how long held blocks wait for their done or a heartbeat;\n"
    "                      " LEASE_DEFAULT "\n"
    "  --hold ID=BLOCKS    before serving, hold request ID's blocks (the --blocks syntax of\n"
    "                      kvx fetch) until --consumers dones for ID arrived or the lease\n"
    "                      expired; prints \"released request ID\" then. Repeatable\n"
    "  --token HEX         the token of every --hold (32 hex digits; kvx fetch presents it);\n"
    "                      default a random one, printed on each \"holding\" line\n"
    "  --consumers N       decode ranks each --hold waits for; default 1\n"
    "  --metrics HOST:PORT Prometheus metrics at http://HOST:PORT/metrics (port 0: a free\n"
    "                      one, printed)\n"
    "  --verbose           one line on stderr per state change, never per block\n";

static const char usage_fetch[] =
    "usage: kvx fetch LAYOUT --peer HOST:PORT[,HOST:PORT...] --blocks 'G:IDS;G:IDS'\n"
    "                 (--auth FILE | --insecure) [--remote-blocks IDS] [--tp-rank R --tp-size N]\n"
    "                 [--verify [--fill SEED]] [--push] [--transports LIST]\n"
    "                 [--malloc | --memory host|cuda]\n"
    "                 [--timeout MS] [--request ID [--token HEX]]\n"
    "                 [--want] [--heartbeat MS] [--wait-before-read MS] [--wait-for-peers]\n"
    "                 [--json] [--verbose]\n"
    "\n"
    "A decode worker: connects to every prefill rank given (handshake: compatibility hash,\n"
    "then the region tables), pulls the request, notifies the ranks read from, and prints\n"
    "bytes, descriptors before and after coalescing, GB/s and transports. With --verify the\n"
    "transfer is verified with checksums before it completes: each prefill rank hashes the\n"
    "bytes it was the source of (XXH3-64) and this worker what landed, per region and block;\n"
    "a difference fails the transfer, naming the region, block and views (exit status 2).\n"
    "With --fill SEED too, every byte is also checked against the pattern kvx serve filled\n"
    "with SEED, and every byte outside the request must still be zero. The last line is the\n"
    "verdict: 'verified' or the first wrong byte (without --verify: 'done (bytes not\n"
    "checked ...)'). A transfer that fails prints the error and\n"
    "\"not loaded: BLOCKS\", the block ids it did not load.\n"
    "\n"
    "  --auth FILE         the deployment's secret, as kvx serve's; default KVX_AUTH_FILE\n"
    "  --insecure          no secret: only an insecure kvx serve on loopback answers\n"
    "  --peer HOST:PORT,...  each prefill rank's side channel, rank order; nothing\n"
    "                      listening there fails at once, unless --wait-for-peers\n"
    "  --wait-for-peers    a rank not listening yet is tried again every 100 ms, up to\n"
    "                      --timeout: for a decode worker started before its prefill ranks\n"
    "  --blocks IDS        local block ids per group: '0:0-15,20;1:3' (group:ids;...)\n"
    "  --remote-blocks IDS the prefill side's block ids, the same syntax; default the\n"
    "                      same ids as --blocks\n"
    "  --tp-rank R, --tp-size N\n"
    "                      this decode rank of a TP group of N; default 0 of 1. The\n"
    "                      prefill ranks' TP size comes from their handshake\n"
    "  --transports LIST   UCX transports; default " KVX_DEFAULT_TRANSPORTS "\n"
    "                      (and cuda_copy,cuda_ipc with --memory cuda)\n"
    "  --malloc            storages in memory this command allocates with malloc and\n"
    "                      registers as an engine's (default: UCX allocates them)\n"
    "  --push              ask the prefill ranks to write the blocks in (push mode) instead\n"
    "                      of reading them\n"
    "  --fill SEED         with --verify: the seed kvx serve used, for the pattern check\n"
    "  --memory host|cuda  where the storages live, as kvx serve's; --verify reads GPU\n"
    "                      storages back into host memory to check them\n"
    "  --timeout MS        handshake and transfer deadline; " TIMEOUT_DEFAULT "\n"
    "  --request ID        the request id read (and notified done); default 1. A prefill\n"
    "                      rank that holds ID (kvx serve --hold) releases it on the done\n"
    "  --token HEX         the hold's token (kvx serve --hold printed or was given it): a\n"
    "                      done or heartbeat without it does not count\n"
    "  --want              want the request from every peer before reading: heartbeats\n"
    "                      carry its id, which keeps its lease alive on the prefill side\n"
    "  --heartbeat MS      heartbeat interval; a peer silent for three is dead;\n"
    "                      " HEARTBEAT_DEFAULT "\n"
    "  --wait-before-read MS\n"
    "                      connect (and want), then wait MS, heartbeating, before reading;\n"
    "                      prints \"waiting MS ms before reading request ID\" on stderr\n"
    "  --json              one JSON object on stdout whatever the outcome: ok, error,\n"
    "                      the blocks not loaded, figures and the agent's stats\n"
    "  --verbose           one line on stderr per state change, never per block\n";

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

#define HOLDS_MAX 64 /* --hold options of one kvx serve */

struct agent_args {
    const char *layout;
    const char *listen;
    const char *peers;
    const char *blocks;
    const char *remote_blocks;
    const char *transports;
    enum cli_memory memory;
    uint64_t tp_rank;
    uint64_t tp_size;
    uint64_t seed;
    uint64_t timeout_ms; /* the agent's default (kvx.h) unless given */
    uint64_t lease_ms;
    uint64_t heartbeat_ms;
    uint64_t max_push_ms;  /* serve */
    uint64_t given_fields; /* KVX_AGENT_PARAM_FIELD_* bits of the options given: only those
                              are set, so the agent's defaults hold for the others */
    const char *metrics;
    const char *auth;             /* --auth FILE */
    const char *token;            /* --token HEX, as given */
    kvx_token_t token_value;      /* ... parsed (when token is set) */
    const char *holds[HOLDS_MAX]; /* serve: each 'ID=G:IDS;...' */
    size_t num_holds;
    uint64_t consumers;  /* serve: per hold */
    uint64_t request_id; /* fetch: read as this id */
    uint64_t wait_before_read_ms;
    bool want;
    bool wait_for_peers; /* fetch: a rank not listening yet is tried again until --timeout */
    bool verify;
    bool seed_given;  /* --fill SEED */
    bool fill_random; /* serve: --fill random */
    bool push;
    bool use_malloc;
    bool verbose;
    bool json;
    bool insecure;
};

/* The options that take a number, with their smallest and largest values (times: up to an
 * hour), and the agent param each one sets (0: none, the command's own). */
static const struct number_option {
    const char *name;
    size_t offset; /* of the uint64_t in struct agent_args */
    uint64_t min;
    uint64_t max;
    uint64_t field; /* KVX_AGENT_PARAM_FIELD_* */
} number_options[] = {
    {"--tp-rank", offsetof(struct agent_args, tp_rank), 0, KVX_MAX_TP, 0},
    {"--tp-size", offsetof(struct agent_args, tp_size), 0, KVX_MAX_TP, 0},
    {"--timeout", offsetof(struct agent_args, timeout_ms), 0, 3600000,
     KVX_AGENT_PARAM_FIELD_TIMEOUT_MS},
    {"--lease", offsetof(struct agent_args, lease_ms), 0, 3600000, KVX_AGENT_PARAM_FIELD_LEASE_MS},
    {"--heartbeat", offsetof(struct agent_args, heartbeat_ms), 1, 3600000,
     KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS},
    {"--max-push", offsetof(struct agent_args, max_push_ms), 1, 3600000,
     KVX_AGENT_PARAM_FIELD_MAX_PUSH_MS},
    {"--consumers", offsetof(struct agent_args, consumers), 1, UINT32_MAX, 0},
    {"--request", offsetof(struct agent_args, request_id), 0, UINT64_MAX, 0},
    {"--wait-before-read", offsetof(struct agent_args, wait_before_read_ms), 0, 3600000, 0},
};

static const struct number_option *number_option_find(const char *arg)
{
    for (size_t i = 0; i < sizeof(number_options) / sizeof(number_options[0]); i++) {
        if (strcmp(arg, number_options[i].name) == 0)
            return &number_options[i];
    }
    return NULL;
}

/* Parses the value of number option `o` into its field of `a`; prints why not otherwise. */
static bool number_option_parse(const struct number_option *o, const char *text,
                                struct agent_args *a)
{
    uint64_t *field = (uint64_t *)((char *)a + o->offset);

    if (!cli_parse_number(o->name, text, o->max, field))
        return false;
    if (*field < o->min) {
        cli_errorf("%s: %s is less than %" PRIu64, o->name, text, o->min);
        return false;
    }
    a->given_fields |= o->field;
    return true;
}

/* Parses the options serve and fetch share; -1 to go on, else the exit status. */
static int agent_args_parse(int argc, char **argv, const char *usage, struct agent_args *a)
{
    a->tp_size      = 1;
    a->seed         = 1;
    a->timeout_ms   = KVX_DEFAULT_TIMEOUT_MS;
    a->lease_ms     = KVX_DEFAULT_LEASE_MS;
    a->heartbeat_ms = KVX_DEFAULT_HEARTBEAT_MS;
    a->max_push_ms  = KVX_DEFAULT_MAX_PUSH_MS;
    a->consumers    = 1;
    a->request_id   = 1;
    for (int i = 0; i < argc; i++) {
        const char *arg                    = argv[i];
        const char **text                  = NULL;
        const struct number_option *number = number_option_find(arg);

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
        if (strcmp(arg, "--want") == 0) {
            a->want = true;
            continue;
        }
        if (strcmp(arg, "--wait-for-peers") == 0) {
            a->wait_for_peers = true;
            continue;
        }
        if (strcmp(arg, "--insecure") == 0) {
            a->insecure = true;
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
        else if (strcmp(arg, "--auth") == 0)
            text = &a->auth;
        else if (strcmp(arg, "--token") == 0)
            text = &a->token;
        else if (strcmp(arg, "--fill") == 0) {
            if (i + 1 >= argc)
                return cli_usage_error("--fill needs a value", usage);
            a->fill_random = strcmp(argv[i + 1], "random") == 0;
            a->seed_given  = !a->fill_random;
            if (a->seed_given && !cli_parse_number("--fill", argv[i + 1], UINT64_MAX, &a->seed))
                return EXIT_BAD_INPUT;
            i++;
            continue;
        } else if (strcmp(arg, "--memory") == 0) {
            if (i + 1 >= argc || !cli_memory_parse(argv[i + 1], &a->memory))
                return i + 1 >= argc ? cli_usage_error("--memory needs a value", usage)
                                     : EXIT_BAD_INPUT;
            i++;
            continue;
        } else if (strcmp(arg, "--hold") == 0) {
            if (a->num_holds == HOLDS_MAX)
                return cli_usage_error("more than 64 --hold options", usage);
            text = &a->holds[a->num_holds++];
        } else if (number == NULL)
            return cli_usage_errorf(usage, "unknown option %s", arg);
        if (i + 1 >= argc)
            return cli_usage_errorf(usage, "%s needs a value", arg);
        if (text != NULL)
            *text = argv[++i];
        else if (!number_option_parse(number, argv[++i], a))
            return EXIT_BAD_INPUT;
    }
    if (a->layout == NULL)
        return cli_usage_error("LAYOUT is required", usage);
    if (a->token != NULL && !cli_token_parse("--token", a->token, &a->token_value))
        return EXIT_BAD_INPUT;
    if (a->use_malloc && a->memory == CLI_MEMORY_CUDA)
        return cli_usage_error("--malloc registers host memory of the command's own; with "
                               "--memory cuda kvx allocates the GPU memory",
                               usage);
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

/* The agent params of `a` (its secret into `key`, which must outlive the agent's creation) and
 * its layout, the storages moved where --memory says (*layout_p, destroyed by the caller).
 * Nothing is allocated for the storages yet. -1 to go on, else the exit status. */
static int agent_prepare(const struct agent_args *a, bool listen, uint8_t key[KVX_AUTH_KEY_LEN],
                         kvx_agent_params_t *params, kvx_layout_t **layout_p)
{
    kvx_status_t status;

    *params = (kvx_agent_params_t){
        .field_mask = KVX_AGENT_PARAM_FIELD_TP_RANK | KVX_AGENT_PARAM_FIELD_TP_SIZE |
                      KVX_AGENT_PARAM_FIELD_NAME | a->given_fields,
        .timeout_ms   = (uint32_t)a->timeout_ms,
        .lease_ms     = (uint32_t)a->lease_ms,
        .heartbeat_ms = (uint32_t)a->heartbeat_ms,
        .max_push_ms  = (uint32_t)a->max_push_ms,
        .name         = listen ? "kvx serve" : "kvx fetch",
        .tp_rank      = (uint32_t)a->tp_rank,
        .tp_size      = (uint32_t)a->tp_size,
        .listen       = a->listen,
        .transports   = a->transports,
    };
    if (!cli_auth(a->auth, a->insecure, key, params))
        return EXIT_BAD_INPUT;
    status = kvx_layout_load_file(a->layout, layout_p);
    if (status != KVX_OK)
        return cli_fail(status);
    cli_layout_memory(*layout_p, a->memory, listen ? "serve" : "fetch");
    if (listen)
        params->field_mask |= KVX_AGENT_PARAM_FIELD_LISTEN;
    if (a->transports != NULL)
        params->field_mask |= KVX_AGENT_PARAM_FIELD_TRANSPORTS;
    return -1;
}

/* Creates the agent of `a` from agent_prepare's params and layout: here its storages are
 * allocated (malloc'd when asked, freed by the caller through *storages_p after the agent). */
static int agent_start(const struct agent_args *a, kvx_agent_params_t *params,
                       const kvx_layout_t *layout, kvx_agent_t **agent_p, void ***storages_p,
                       size_t *num_storages_p)
{
    size_t n = kvx_layout_num_storages(layout);
    kvx_status_t status;

    *storages_p     = NULL;
    *num_storages_p = 0;
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
            cli_errorf("out of memory allocating the storages");
            return EXIT_INTERNAL;
        }
        params->field_mask |= KVX_AGENT_PARAM_FIELD_STORAGE_BASES;
        params->storage_bases = bases;
        *storages_p           = bases;
        *num_storages_p       = n;
    }
    status = kvx_agent_create(layout, params, agent_p);
    if (status == KVX_OK) {
        /* kvx serve logs what went wrong or was refused always (a refused peer leaves a
         * trace); --verbose adds every state change, on either side */
        if (a->verbose || a->listen != NULL)
            kvx_agent_set_log_callback(*agent_p, log_line, (void *)params->name);
        kvx_agent_set_log_level(*agent_p, a->verbose ? KVX_LOG_INFO : KVX_LOG_WARN);
        return -1;
    }
    storages_free(*storages_p, *num_storages_p);
    *storages_p     = NULL;
    *num_storages_p = 0;
    return cli_fail(status);
}

/* A held request was released: every consumer's done came, or its lease expired (the
 * metrics and --verbose say which). One line, flushed, so a script can wait for it. */
static void on_release(void *arg, uint64_t request_id, const kvx_group_ids_t *groups,
                       size_t num_groups)
{
    (void)arg;
    printf("released request %" PRIu64 ": ", request_id);
    block_ids_print(stdout, groups, num_groups);
    printf("\n");
    fflush(stdout);
}

/* One --hold ID=BLOCKS, parsed. */
struct serve_hold {
    uint64_t request_id;
    struct block_ids ids;
};

/* Parses --hold `text` into *hold; on error prints the message and returns false. */
static bool serve_hold_parse(const char *text, struct serve_hold *hold)
{
    size_t id_len = strcspn(text, "=");
    char id_text[32];
    char error[512];

    if (text[id_len] != '=' || id_len >= sizeof(id_text)) {
        fprintf(stderr, "kvx: error: --hold: expected ID=BLOCKS, not \"%s\"\n", text);
        return false;
    }
    snprintf(id_text, sizeof(id_text), "%.*s", (int)id_len, text);
    if (!cli_parse_number("--hold", id_text, UINT64_MAX, &hold->request_id))
        return false;
    if (!block_ids_parse("--hold", text + id_len + 1, &hold->ids, error, sizeof(error))) {
        fprintf(stderr, "kvx: error: %s\n", error);
        return false;
    }
    return true;
}

/* Holds each request for `a->consumers` dones, before serving starts so that no read can
 * come first, and says so, one line each. Ids beyond the table fail as a request's would:
 * kvx_hold takes any id. */
static kvx_status_t serve_holds_take(kvx_agent_t *agent, const struct serve_hold *holds,
                                     size_t num_holds, const struct agent_args *a)
{
    for (size_t i = 0; i < num_holds; i++) {
        const struct serve_hold *h = &holds[i];
        size_t num_ids;
        kvx_token_t token;
        char hex[2 * KVX_TOKEN_LEN + 1];
        kvx_status_t status = kvx_regions_request_ids(kvx_agent_regions(agent), h->ids.groups,
                                                      h->ids.num_groups, NULL, 0, &num_ids);

        if (status == KVX_OK && a->token == NULL)
            status = kvx_token_generate(&token);
        else
            token = a->token_value;
        if (status == KVX_OK)
            status = kvx_hold(agent, h->request_id, h->ids.groups, h->ids.num_groups,
                              (uint32_t)a->consumers, &token);
        if (status != KVX_OK)
            return status;
        cli_token_format(&token, hex);
        printf("holding request %" PRIu64 ": ", h->request_id);
        block_ids_print(stdout, h->ids.groups, h->ids.num_groups);
        printf(" for %" PRIu64 " consumer%s, lease %" PRIu64 " ms, token %s\n", a->consumers,
               a->consumers > 1 ? "s" : "", a->lease_ms, hex);
    }
    return KVX_OK;
}

/* Fills the storages: the pattern of --fill SEED, or of a seed drawn from the kernel that
 * nobody learns (--fill random), so a decode worker can verify them only by checksums.
 * -1 to go on, else the exit status (the error printed). */
static int serve_fill(kvx_agent_t *agent, const struct agent_args *a)
{
    uint64_t seed = a->seed;
    char how[64];
    kvx_status_t status;

    if (a->fill_random && getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        fprintf(stderr, "kvx: error: --fill random: no random bytes from the kernel\n");
        return EXIT_INTERNAL;
    }
    /* gigabytes take seconds: said before, and on a terminal while it runs (issue 24) */
    snprintf(how, sizeof(how), "with seed %" PRIu64, a->seed);
    status = progress_fill(agent, false, seed, "kvx serve: filling",
                           a->fill_random ? "with random bytes" : how, true);
    return status == KVX_OK ? -1 : cli_fail(status);
}

int command_serve(int argc, char **argv)
{
    struct agent_args a = {0};
    kvx_agent_t *agent  = NULL;
    void **storages     = NULL;
    size_t num_storages = 0;
    uint64_t bytes      = 0;
    kvx_agent_stats_t stats;
    struct metrics_http *metrics = NULL;
    struct serve_hold holds[HOLDS_MAX];
    size_t num_holds     = 0;
    kvx_layout_t *layout = NULL;
    kvx_agent_params_t params;
    uint8_t key[KVX_AUTH_KEY_LEN];
    kvx_status_t status;
    int ret = agent_args_parse(argc, argv, usage_serve, &a);

    if (ret >= 0)
        return ret;
    if (a.listen == NULL || a.peers != NULL || a.blocks != NULL || a.verify || a.json || a.want ||
        a.wait_before_read_ms > 0 || a.wait_for_peers)
        return cli_usage_error("serve: needs --listen, takes no --peer, --blocks, --verify, "
                               "--json, --want or --wait-before-read",
                               usage_serve);
    /* Bad holds are bad input: found before any memory is allocated or port bound. */
    for (; num_holds < a.num_holds; num_holds++) {
        if (!serve_hold_parse(a.holds[num_holds], &holds[num_holds])) {
            ret = EXIT_BAD_INPUT;
            goto out;
        }
    }
    ret = agent_prepare(&a, true, key, &params, &layout);
    if (ret < 0)
        ret = agent_start(&a, &params, layout, &agent, &storages, &num_storages);
    kvx_layout_destroy(layout);
    if (ret >= 0)
        goto out;
    /* ids beyond the table are bad input too: said before the fill, the slow part (issue 24) */
    for (size_t i = 0; i < num_holds; i++) {
        size_t num_ids;

        status = kvx_regions_request_ids(kvx_agent_regions(agent), holds[i].ids.groups,
                                         holds[i].ids.num_groups, NULL, 0, &num_ids);
        if (status != KVX_OK) {
            ret = cli_fail(status);
            goto out;
        }
    }
    if (a.metrics != NULL &&
        metrics_http_start(a.metrics, agent, "kvx serve", &metrics) != KVX_OK) {
        ret = EXIT_BAD_INPUT;
        goto out;
    }
    ret = serve_fill(agent, &a);
    if (ret >= 0)
        goto out;
    for (size_t s = 0;; s++) {
        uint64_t size;

        if (kvx_agent_storage(agent, s, &size) == NULL)
            break;
        bytes += size;
    }
    kvx_agent_set_release_callback(agent, on_release, NULL);
    status = serve_holds_take(agent, holds, num_holds, &a);
    if (status != KVX_OK) {
        ret = cli_fail(status);
        goto out;
    }
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    printf("serving %s on %s: rank %" PRIu64 " of %" PRIu64 ", %zu regions, %" PRIu64
           " bytes filled with ",
           a.layout, kvx_agent_listen_address(agent), a.tp_rank, a.tp_size,
           kvx_regions_count(kvx_agent_regions(agent)), bytes);
    if (a.fill_random)
        printf("random bytes (kvx fetch --verify checks them by checksums)\n");
    else
        printf("seed %" PRIu64 "\n", a.seed);
    if (metrics != NULL)
        printf("metrics on http://%.*s:%u/metrics\n", (int)strcspn(a.metrics, ":"), a.metrics,
               metrics_http_port(metrics));
    fflush(stdout);
    while (!stop_requested) {
        status = kvx_agent_progress(agent, 20);
        if (status != KVX_OK) {
            cli_fail(status);
            break;
        }
        metrics_http_serve(metrics);
    }
    kvx_agent_stats(agent, &stats, sizeof(stats));
    printf("stopped: %" PRIu64 " reads served (%" PRIu64 " bytes), %" PRIu64
           " notifications, %" PRIu64 " dropped, %" PRIu64 " released, %" PRIu64
           " leases expired\n",
           stats.served_transfers, stats.served_bytes, stats.notifications,
           stats.notifications_dropped, stats.released, stats.leases_expired);
    ret = 0;

out:
    metrics_http_stop(metrics);
    kvx_agent_destroy(agent);
    storages_free(storages, num_storages);
    for (size_t i = 0; i < num_holds; i++)
        block_ids_free(&holds[i].ids);
    return ret;
}

static uint64_t monotonic_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* --want and --wait-before-read: the request is wanted from every peer (a heartbeat carries
 * it at once, since the prefill side's lease has been running since it held the request),
 * then the agent heartbeats for wait_before_read_ms before the read: the window in which a
 * test can take this decode host away while it holds leases. The line saying so goes to
 * stderr, so that --json's stdout stays one object. */
static kvx_status_t fetch_want_and_wait(kvx_agent_t *agent, kvx_peer_t *const *peers,
                                        size_t num_peers, const struct agent_args *a,
                                        const kvx_token_t *token)
{
    kvx_status_t status = KVX_OK;

    if (a->want) {
        status = kvx_want(agent, peers, num_peers, a->request_id, token);
        if (status == KVX_OK)
            status = kvx_heartbeat(agent, peers, num_peers, &a->request_id, token, 1);
    }
    if (status != KVX_OK || a->wait_before_read_ms == 0)
        return status;
    fprintf(stderr, "waiting %" PRIu64 " ms before reading request %" PRIu64 "\n",
            a->wait_before_read_ms, a->request_id);
    for (uint64_t start = monotonic_ms();
         status == KVX_OK && monotonic_ms() - start < a->wait_before_read_ms;)
        status = kvx_agent_progress(agent, 20);
    return status;
}

/* Pulls the request, or has the prefill ranks push it (--push). With --verify it is verified
 * with checksums before it completes (a pull before its dones, so the prefill side still
 * holds the blocks as they were read), and *checked_p gets the counts. A transfer that
 * fails, a checksum mismatch too, is printed here: the error and the blocks not loaded,
 * which *failed_p keeps; a post that failed prints nothing. */
static kvx_status_t fetch_transfer(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                                   const struct agent_args *a, const kvx_request_t *request,
                                   kvx_read_stats_t *stats_p, kvx_verify_result_t *checked_p,
                                   struct block_ids *failed_p, bool *reported_p)
{
    kvx_xfer_t *xfer;
    kvx_status_t status = (a->push ? kvx_write_post : kvx_read_post)(
        agent, peers, num_peers, a->request_id, request, NULL, NULL, &xfer);

    if (status != KVX_OK)
        return status;
    if (a->verify)
        status = kvx_xfer_verify(xfer);
    if (status == KVX_OK)
        status = kvx_xfer_wait(xfer);
    kvx_xfer_verify_result(xfer, checked_p);
    checked_p->reported     = NULL; /* the transfer's, gone with it */
    checked_p->num_reported = 0;
    if (status == KVX_OK) {
        kvx_xfer_stats(xfer, stats_p);
    } else {
        const kvx_group_ids_t *groups;
        size_t num_groups;

        kvx_xfer_failed_blocks(xfer, &groups, &num_groups);
        cli_errorf("%s", kvx_xfer_error(xfer));
        fprintf(stderr, "kvx: not loaded: ");
        block_ids_print(stderr, groups, num_groups);
        fprintf(stderr, "\n");
        fetch_blocks_copy(groups, num_groups, failed_p);
        *reported_p = true;
    }
    kvx_xfer_destroy(xfer);
    return status;
}

static bool args_have(int argc, char **argv, const char *option)
{
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], option) == 0)
            return true;
    }
    return false;
}

int command_fetch(int argc, char **argv)
{
    struct agent_args a = {0};
    kvx_agent_t *agent  = NULL;
    kvx_peer_t *peers[KVX_MAX_TP];
    size_t num_peers            = 0;
    struct block_ids ids        = {0};
    struct block_ids rids       = {0};
    struct block_ids failed     = {0}; /* a failed transfer's blocks not loaded */
    kvx_read_stats_t stats      = {0};
    void **storages             = NULL;
    size_t num_storages         = 0;
    char verdict[1100]          = "not verified";
    kvx_verify_result_t checked = {0};
    kvx_layout_t *layout        = NULL;
    kvx_agent_params_t params;
    uint8_t key[KVX_AUTH_KEY_LEN];
    char error[512];
    kvx_request_t request;
    kvx_status_t status;
    bool reported = false; /* the failure is printed already */
    bool mismatch = false; /* moved, and the pattern check found a wrong byte */
    bool json     = args_have(argc, argv, "--json"); /* before the parse: its errors too */
    int ret       = agent_args_parse(argc, argv, usage_fetch, &a);

    if (ret == 0)
        return 0; /* --help */
    if (ret > 0)
        goto out;
    if (a.peers == NULL || a.blocks == NULL || a.listen != NULL || a.num_holds > 0 ||
        (a.given_fields & KVX_AGENT_PARAM_FIELD_MAX_PUSH_MS) != 0) {
        ret = cli_usage_error("fetch: needs --peer and --blocks, takes no --listen, --hold or "
                              "--max-push",
                              usage_fetch);
        goto out;
    }
    if (a.fill_random) {
        ret = cli_usage_error("fetch: --fill random is kvx serve's (fetch --verify checks random "
                              "bytes by checksums; --fill SEED names a pattern to check)",
                              usage_fetch);
        goto out;
    }
    if (!block_ids_parse("--blocks", a.blocks, &ids, error, sizeof(error)) ||
        (a.remote_blocks != NULL &&
         !block_ids_parse("--remote-blocks", a.remote_blocks, &rids, error, sizeof(error)))) {
        cli_errorf("%s", error);
        block_ids_free(&ids); /* not the request's: --json names no blocks then */
        ret = EXIT_BAD_INPUT;
        goto out;
    }
    /* Everything that can be checked is, before any memory (issue 24): the ids against the
     * layout, then each peer's handshake; only then the cache, the connections, the zeroes. */
    status = block_ids_check_layout(a.layout, &ids);
    if (status != KVX_OK) {
        ret = cli_fail(status);
        goto out;
    }
    ret = agent_prepare(&a, false, key, &params, &layout);
    if (ret < 0)
        ret = fetch_probe(layout, &params, a.peers, a.wait_for_peers ? a.timeout_ms : 0);
    if (ret < 0)
        ret = agent_start(&a, &params, layout, &agent, &storages, &num_storages);
    if (ret < 0)
        ret = fetch_connect(agent, a.peers, peers, &num_peers);
    if (ret >= 0)
        goto out;
    /* a clean slate: what was not moved stays zero (said on a terminal: gigabytes take a while) */
    status  = progress_fill(agent, true, 0, "kvx fetch: zeroing", "before the transfer", false);
    request = (kvx_request_t){ids.groups, ids.num_groups, rids.groups, rids.num_groups,
                              a.token != NULL ? &a.token_value : NULL};
    if (status == KVX_OK)
        status = fetch_want_and_wait(agent, peers, num_peers, &a, request.token);
    if (status == KVX_OK)
        status = fetch_transfer(agent, peers, num_peers, &a, &request, &stats, &checked, &failed,
                                &reported);
    if (status != KVX_OK) {
        ret = reported ? cli_exit_status(status) : cli_fail(status);
        goto out;
    }
    ret = 0;
    if (a.verify)
        snprintf(verdict, sizeof(verdict), "verified");
    if (a.verify && a.seed_given && (status = kvx_agent_check_pattern(agent, a.seed)) != KVX_OK) {
        snprintf(verdict, sizeof(verdict), "%s%s",
                 status == KVX_ERR_MISMATCH ? "MISMATCH: " : "not verified: ", kvx_errmsg());
        mismatch = true;
        ret      = EXIT_BAD_INPUT;
    }
    if (a.json)
        goto out;
    printf("%s %" PRIu64 " bytes in %" PRIu64 " descriptors (%" PRIu64
           " after coalescing) from %zu peer%s in %.3f ms: %.2f GB/s over %s\n",
           a.push ? "pushed" : "fetched", stats.bytes, stats.descriptors, stats.posted, num_peers,
           num_peers > 1 ? "s" : "", stats.seconds * 1e3,
           stats.seconds > 0 ? (double)stats.bytes / stats.seconds / 1e9 : 0.0,
           kvx_peer_transports(peers[0]));
    if (checked.requested)
        printf("checksums: %" PRIu64 " segments, %" PRIu64
               " bytes, equal on both sides (XXH3-64, %.3f ms of the time above)\n",
               checked.segments, checked.bytes, checked.seconds * 1e3);
    /* without --verify nothing was compared: say so as a success, not as a failed check */
    printf("%s\n", a.verify ? verdict : "done (bytes not checked: --verify compares them)");

out:
    if (json) {
        /* One object whatever happened (issue 24): blocks not loaded are the transfer's when
         * it failed, every requested one when it never ran, none when all arrived. */
        bool moved                   = ret == 0 || mismatch;
        const struct block_ids *lost = reported ? &failed : &ids;
        struct fetch_outcome outcome = {
            .ok             = ret == 0,
            .error          = mismatch ? verdict : cli_last_error(),
            .not_loaded     = lost->groups,
            .num_not_loaded = moved ? 0 : lost->num_groups,
            .push           = a.push,
            .read           = &stats,
            .checked        = &checked,
            .verdict        = verdict,
            .transports     = num_peers > 0 ? kvx_peer_transports(peers[0]) : NULL,
            .agent          = agent,
        };

        fetch_json_print(stdout, &outcome);
    }
    for (size_t i = 0; i < num_peers; i++)
        kvx_peer_destroy(peers[i]);
    kvx_agent_destroy(agent);
    storages_free(storages, num_storages);
    kvx_layout_destroy(layout);
    block_ids_free(&ids);
    block_ids_free(&rids);
    block_ids_free(&failed);
    return ret;
}

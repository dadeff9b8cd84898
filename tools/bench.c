/* bench.c: `kvx bench`, bandwidth and latency of transfers between a prefill (P) and a decode
 * (D) process: the options, the prefill process and the sweep of block sizes on a synthetic
 * layout. The KV-shaped --workload is bench_workload.c's, a point's timing and output
 * bench_point.c's.
 * Measurement only; the agent does the work, and bench/limits.sh measures the limits. */
#include "bench.h"

#include "bench_workload.h"
#include "cli.h"
#include "size_list.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BENCH_MAX_SIDE      (UINT64_C(8) << 30) /* bytes of storage per process: 2 fit in RAM */
#define BENCH_MAX_BATCH     65536               /* blocks per transfer */
#define BENCH_MAX_ITERS     1000000
#define BENCH_WARMUPS       3   /* untimed transfers per point: lazy wire-up */
#define BENCH_MAX_WARMUPS   100000
#define BENCH_SWEEP_ITERS   100 /* default timed transfers per sweep point */
#define BENCH_REQUEST_ITERS 10  /* default timed requests per workload point */

static const char usage_bench[] =
    "usage: kvx bench [--mode pull|push] [--block-sizes 4K,64K,1M,16M] [--batch N]\n"
    "                 [--iters N] [--warmup N] [--contiguous] [--transports LIST] [--json]\n"
    "                 [--malloc | --memory host|cuda]\n"
    "                 [--idle-prefill] [--peer HOST:PORT | --listen HOST:PORT] [--auth FILE]\n"
    "       kvx bench --workload [--layouts NAME,...] [--tokens 1K,8K,32K] [options above]\n"
    "\n"
    "Starts a prefill process on loopback (or uses the one at --peer, started with the same\n"
    "options and --listen), connects a decode agent to it, and after untimed warm-up\n"
    "transfers (connections are wired up lazily; UCX's shared-memory buffers are touched\n"
    "for the first time over the first hundred or so) times ITERS transfers per point.\n"
    "\n"
    "The sweep builds one storage and one view (its own group) per block size, each holding\n"
    "2 x BATCH blocks, and moves BATCH blocks per transfer: every other block by default, so\n"
    "no two are adjacent and coalescing posts one descriptor per block; --contiguous moves\n"
    "blocks 0..BATCH-1, which coalesce into one. --workload instead moves requests of\n"
    "--tokens tokens (block ids shuffled, the same ids in every group) on the built-in model\n"
    "layouts, scaled to the largest request's blocks.\n"
    "\n"
    "Per point: descriptors per transfer after coalescing, GB/s and transfers/s over the\n"
    "summed wall time, wall latency p50/p99, and medians of the plan time (the request\n"
    "planned alone on a same-shaped plan), the post time (the kvx_read_post call: plan and\n"
    "every get posted; pull only) and kvx_read_stats_t's first-post-to-last-completion time.\n"
    "Performance is measured here, never asserted; docs/performance.md has the method.\n"
    "\n"
    "  --mode pull|push     D reads (kvx_read_post + wait), or P writes (kvx_write; on one\n"
    "                       host D's read carries it unless KVX_PUSH_ON_ONE_HOST=writers);\n"
    "                       default pull\n"
    "  --block-sizes LIST   bytes per block, suffixes K, M, G (powers of 1024)\n"
    "  --batch N            blocks per transfer; default 16\n"
    "  --iters N            timed transfers per point; default 100 (workload: 10)\n"
    "  --warmup N           untimed transfers before each point's; default 3 (workload: 1)\n"
    "  --transports LIST    UCX transports of both agents; default " KVX_DEFAULT_TRANSPORTS "\n"
    "  --push-transports LIST  P's push writers' UCX transports; default tcp (docs/security.md)\n"
    "  --auth FILE          the side channel's secret; default KVX_AUTH_FILE's, else one made\n"
    "                       for this run (--peer and --listen need the same file on both)\n"
    "  --malloc             register memory from aligned_alloc, as an engine's own cache,\n"
    "                       on both sides instead of memory UCX allocates\n"
    "  --memory host|cuda   host memory (default), or GPU memory on both sides (device 0\n"
    "                       and the layout's devices; transports add cuda_copy,cuda_ipc);\n"
    "                       bench/gpu.sh runs it beside ucx_perftest -m cuda\n"
    "  --json               one JSON object per point\n"
    "  --idle-prefill       P waits for work in kvx_agent_progress's 5 ms polls, as kvx\n"
    "                       serve does, instead of spinning on kvx_agent_progress(agent, 0)\n"
    "                       the way ucx_perftest's server spins: gets that need P's progress\n"
    "                       (malloc'd storage, push) then wait for its next poll\n"
    "  --layouts LIST       workload layouts; default llama3-8b,deepseek-v3-mla,\n"
    "                       deepseek-v4-flash,deepseek-v4.1\n";

/* Whether `arg` is one of the options that take a value: an unknown one is reported as
 * unknown, not as missing its value. */
static bool option_takes_value(const char *arg)
{
    static const char *const names[] = {
        "--mode", "--block-sizes", "--tokens",          "--transports", "--peer",  "--listen",
        "--auth", "--memory",      "--push-transports", "--layouts",    "--batch", "--iters",
        "--warmup"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(arg, names[i]) == 0)
            return true;
    }
    return false;
}

/* --block-sizes or --tokens into sizes[]; false with the error printed. */
static bool size_option_parse(const char *option, const char *text, uint64_t *sizes, size_t *n_p)
{
    if (size_list_parse(text, UINT64_C(1) << 40, sizes, BENCH_MAX_POINTS, n_p))
        return true;
    fprintf(stderr, "kvx: error: %s: \"%s\" is not a list of up to %d sizes such as 4K,1M\n",
            option, text, BENCH_MAX_POINTS);
    return false;
}

/* Splits "a,b" into a->layouts[], pointers into a->layout_text (a copy: no allocation). */
static bool layout_list_parse(const char *option, const char *text, struct bench_args *a)
{
    size_t n = 0;

    if (strlen(text) >= sizeof(a->layout_text)) {
        fprintf(stderr, "kvx: error: %s: longer than %zu characters\n", option,
                sizeof(a->layout_text) - 1);
        return false;
    }
    strcpy(a->layout_text, text);
    for (char *save = NULL, *name = strtok_r(a->layout_text, ",", &save); name != NULL;
         name = strtok_r(NULL, ",", &save)) {
        if (n == BENCH_MAX_LAYOUTS) {
            fprintf(stderr, "kvx: error: %s: more than %d names\n", option, BENCH_MAX_LAYOUTS);
            return false;
        }
        a->layouts[n++] = name;
    }
    if (n == 0) {
        fprintf(stderr, "kvx: error: %s: \"%s\" names nothing\n", option, text);
        return false;
    }
    a->num_layouts = n;
    return true;
}

/* Parses the options into *a; -1 to go on, else the exit status to return. */
static int bench_args_parse(int argc, char **argv, struct bench_args *a)
{
    const char *sizes = NULL;
    const char *mode  = "pull";

    a->batch = 16;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        const char *value;

        if (cli_is_help(arg)) {
            fputs(usage_bench, stdout);
            return 0;
        }
        if (strcmp(arg, "--malloc") == 0 || strcmp(arg, "--json") == 0 ||
            strcmp(arg, "--contiguous") == 0 || strcmp(arg, "--workload") == 0 ||
            strcmp(arg, "--idle-prefill") == 0) {
            bool *flag = arg[2] == 'm'   ? &a->use_malloc
                         : arg[2] == 'j' ? &a->json
                         : arg[2] == 'c' ? &a->contiguous
                         : arg[2] == 'i' ? &a->idle_prefill
                                         : &a->workload;
            *flag      = true;
            continue;
        }
        if (arg[0] != '-' || arg[1] != '-')
            return cli_usage_error("bench: takes no positional argument", usage_bench);
        if (!option_takes_value(arg))
            return cli_usage_errorf(usage_bench, "unknown option %s", arg);
        if (i + 1 >= argc)
            return cli_usage_errorf(usage_bench, "%s needs a value", arg);
        value = argv[++i];
        if (strcmp(arg, "--mode") == 0)
            mode = value;
        else if (strcmp(arg, "--block-sizes") == 0 || strcmp(arg, "--tokens") == 0)
            sizes = value;
        else if (strcmp(arg, "--transports") == 0)
            a->transports = value;
        else if (strcmp(arg, "--peer") == 0)
            a->peer = value;
        else if (strcmp(arg, "--listen") == 0)
            a->listen = value;
        else if (strcmp(arg, "--auth") == 0)
            a->auth = value;
        else if (strcmp(arg, "--push-transports") == 0)
            a->push_transports = value;
        else if (strcmp(arg, "--memory") == 0) {
            if (!cli_memory_parse(value, &a->memory))
                return EXIT_BAD_INPUT;
        } else if (strcmp(arg, "--layouts") == 0) {
            if (!layout_list_parse(arg, value, a))
                return EXIT_BAD_INPUT;
        } else if (strcmp(arg, "--batch") == 0) {
            if (!cli_parse_number(arg, value, BENCH_MAX_BATCH, &a->batch) || a->batch == 0)
                return a->batch == 0 ? cli_usage_error("--batch: 0 blocks", usage_bench)
                                     : EXIT_BAD_INPUT;
        } else if (strcmp(arg, "--warmup") == 0) {
            if (!cli_parse_number(arg, value, BENCH_MAX_WARMUPS, &a->warmups))
                return EXIT_BAD_INPUT;
            a->warmups_given = true;
        } else if (strcmp(arg, "--iters") == 0) {
            if (!cli_parse_number(arg, value, BENCH_MAX_ITERS, &a->iters) || a->iters == 0)
                return a->iters == 0 ? cli_usage_error("--iters: 0 transfers", usage_bench)
                                     : EXIT_BAD_INPUT;
        }
    }
    if (strcmp(mode, "push") == 0)
        a->push = true;
    else if (strcmp(mode, "pull") != 0)
        return cli_usage_error("--mode: pull or push", usage_bench);
    if (a->peer != NULL && a->listen != NULL)
        return cli_usage_error("bench: --peer and --listen are the two ends; give one",
                               usage_bench);
    if (!size_option_parse(a->workload ? "--tokens" : "--block-sizes",
                           sizes != NULL ? sizes
                           : a->workload ? "1K,8K,32K"
                                         : "4K,64K,1M,16M",
                           a->sizes, &a->num_sizes))
        return EXIT_BAD_INPUT;
    if (a->num_layouts == 0)
        layout_list_parse("--layouts", "llama3-8b,deepseek-v3-mla,deepseek-v4-flash,deepseek-v4.1",
                          a);
    if (a->workload && (a->peer != NULL || a->listen != NULL) && a->num_layouts != 1)
        return cli_usage_error("bench: --workload with --peer or --listen takes one --layouts",
                               usage_bench);
    if (a->use_malloc && a->memory == CLI_MEMORY_CUDA)
        return cli_usage_error("bench: --malloc registers host memory; --memory cuda has kvx "
                               "allocate GPU memory: give one",
                               usage_bench);
    if (a->iters == 0)
        a->iters = a->workload ? BENCH_REQUEST_ITERS : BENCH_SWEEP_ITERS;
    return -1;
}

/* The sweep's layout: per block size i, storage "bench.i" holding 2 x batch blocks and view
 * "layers.i.bench" over all of it in group i, so a request names one size by its group. */

static kvx_status_t sweep_layout_create(const struct bench_args *a, kvx_layout_t **layout_p)
{
    kvx_layout_t *layout;
    kvx_status_t status = kvx_layout_create(NULL, &layout);
    uint64_t total      = 0;

    for (size_t i = 0; status == KVX_OK && i < a->num_sizes; i++) {
        char storage[48];
        char view[48];
        uint64_t size;

        snprintf(storage, sizeof(storage), "bench.%zu", i);
        snprintf(view, sizeof(view), "layers.%zu.bench", i);
        if (__builtin_mul_overflow(a->sizes[i], 2 * a->batch, &size) ||
            __builtin_add_overflow(total, size, &total) || total > BENCH_MAX_SIDE) {
            kvx_layout_destroy(layout);
            fprintf(stderr,
                    "kvx: error: --batch %" PRIu64 " of these block sizes needs more than the"
                    " %" PRIu64 " GiB of storage a bench process may take\n",
                    a->batch, BENCH_MAX_SIDE >> 30);
            return KVX_ERR_INVALID;
        }
        status =
            kvx_layout_add_storage(layout, &(kvx_storage_params_t){.name = storage, .size = size});
        if (status == KVX_OK)
            status = kvx_layout_add_view(
                layout, &(kvx_view_params_t){.field_mask = KVX_VIEW_PARAM_FIELD_GROUP,
                                             .name       = view,
                                             .kind       = KVX_VIEW_KIND_ATTN,
                                             .storage    = storage,
                                             .page       = a->sizes[i],
                                             .stride     = a->sizes[i],
                                             .num_blocks = 2 * a->batch,
                                             .group      = (int64_t)i});
    }
    if (status != KVX_OK) {
        kvx_layout_destroy(layout);
        cli_fail(status);
        return status;
    }
    cli_layout_memory(layout, a->memory, "bench");
    *layout_p = layout;
    return KVX_OK;
}

static void storages_free(void **bases, size_t count)
{
    for (size_t s = 0; bases != NULL && s < count; s++)
        free(bases[s]);
    free(bases);
}

/* Creates an agent on `layout`; with --malloc on memory of our own, page-aligned and touched,
 * as an engine's cache would be (freed through *bases_p after the agent). Every storage is
 * written once either way, so no page fault lands in a timed transfer. */
static kvx_status_t bench_agent_create(const struct bench_args *a, const kvx_layout_t *layout,
                                       const char *listen, kvx_agent_t **agent_p, void ***bases_p)
{
    size_t n                  = kvx_layout_num_storages(layout);
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_NAME | KVX_AGENT_PARAM_FIELD_AUTH_KEY,
                                 .name       = listen != NULL ? "kvx bench P" : "kvx bench D",
                                 .listen     = listen,
                                 .transports = a->transports,
                                 .auth_key   = a->key};
    void **bases              = NULL;
    kvx_status_t status;

    if (listen != NULL)
        params.field_mask |= KVX_AGENT_PARAM_FIELD_LISTEN;
    if (a->transports != NULL)
        params.field_mask |= KVX_AGENT_PARAM_FIELD_TRANSPORTS;
    if (a->push_transports != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_PUSH_TRANSPORTS;
        params.push_transports = a->push_transports;
    }
    if (a->use_malloc) {
        bases = calloc(n, sizeof(*bases));
        for (size_t s = 0; bases != NULL && s < n; s++) {
            uint64_t size = (kvx_layout_storage_size(layout, s) + 4095) & ~UINT64_C(4095);

            bases[s] = aligned_alloc(4096, size);
            if (bases[s] == NULL) {
                storages_free(bases, s);
                bases = NULL;
            }
        }
        if (bases == NULL) {
            fprintf(stderr, "kvx: error: out of memory allocating the storages\n");
            return KVX_ERR_NO_MEMORY;
        }
        params.field_mask |= KVX_AGENT_PARAM_FIELD_STORAGE_BASES;
        params.storage_bases = bases;
    }
    status = kvx_agent_create(layout, &params, agent_p);
    if (status != KVX_OK) {
        storages_free(bases, n);
        cli_fail(status);
        return status;
    }
    status = kvx_agent_zero(*agent_p);
    if (status != KVX_OK) {
        cli_fail(status);
        kvx_agent_destroy(*agent_p);
        *agent_p = NULL;
        storages_free(bases, n);
        return status;
    }
    *bases_p = bases;
    return KVX_OK;
}

/* The prefill process: serves `layout` until SIGTERM or SIGINT, or until the parent that
 * forked it is gone. Reports its port (0 when it could not start) on `ready` when >= 0. */
static int bench_serve(const struct bench_args *a, const kvx_layout_t *layout, const char *listen,
                       int ready)
{
    pid_t parent       = getppid();
    kvx_agent_t *agent = NULL;
    void **bases       = NULL;
    uint32_t port      = 0;
    sigset_t stop;

    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigprocmask(SIG_BLOCK, &stop, NULL);
    if (bench_agent_create(a, layout, listen, &agent, &bases) != KVX_OK) {
        if (ready >= 0)
            (void)!write(ready, &port, sizeof(port));
        return EXIT_BAD_INPUT;
    }
    port = (uint32_t)strtoul(strrchr(kvx_agent_listen_address(agent), ':') + 1, NULL, 10);
    if (ready >= 0) {
        (void)!write(ready, &port, sizeof(port));
    } else {
        printf("kvx bench: serving on %s until SIGINT\n", kvx_agent_listen_address(agent));
        fflush(stdout);
    }
    /* The signals and the parent are checked every 1024 turns, not every one: two system
     * calls a turn were a share of a small transfer's time in the spinning prefill. */
    for (unsigned turn = 0;; turn++) {
        struct timespec poll = {0, 0};
        siginfo_t info;

        if ((a->idle_prefill || turn % 1024 == 0) &&
            (sigtimedwait(&stop, &info, &poll) > 0 || (ready >= 0 && getppid() != parent)))
            break;
        kvx_agent_progress(agent, a->idle_prefill ? 50 : 0);
    }
    kvx_agent_destroy(agent);
    storages_free(bases, kvx_layout_num_storages(layout));
    return 0;
}

/* Forks the prefill process on a free loopback port; *port_p gets the port, 0 on failure. */
static pid_t bench_serve_fork(const struct bench_args *a, const kvx_layout_t *layout,
                              uint32_t *port_p)
{
    int ready[2];
    pid_t pid;

    *port_p = 0;
    if (pipe(ready) != 0)
        return -1;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        close(ready[0]);
        _exit(bench_serve(a, layout, "127.0.0.1:0", ready[1]));
    }
    close(ready[1]);
    if (pid < 0 || read(ready[0], port_p, sizeof(*port_p)) != sizeof(*port_p))
        *port_p = 0;
    close(ready[0]);
    return pid;
}

static void bench_serve_stop(pid_t pid)
{
    int child_status;

    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    waitpid(pid, &child_status, 0);
}

static void bench_footer_print(const struct bench_args *a)
{
    if (a->json)
        return;
    printf("GB/s, xfer/s: bytes and transfers over the summed wall time. p50/p99: wall time of"
           " one\ntransfer (%s).\nplan: the request planned alone on a same-shaped plan."
           " post: the kvx_read_post call (plan\nand every get posted). xfer: first post to last"
           " completion (kvx_read_stats_t). All medians.\nNoisy machines move single runs:"
           " take the median of several.\n",
           a->push ? "kvx_write: a request, P plans, puts, flushes, answers; on one host a read"
                   : "kvx_read_post + kvx_xfer_wait + kvx_xfer_destroy, what kvx_read does");
}

static bool samples_alloc(struct bench_samples *s, uint64_t iters)
{
    s->wall = calloc(iters, sizeof(uint64_t));
    s->post = calloc(iters, sizeof(uint64_t));
    s->xfer = calloc(iters, sizeof(uint64_t));
    s->plan = calloc(iters, sizeof(uint64_t));
    return s->wall != NULL && s->post != NULL && s->xfer != NULL && s->plan != NULL;
}

static void samples_free(struct bench_samples *s)
{
    free(s->wall);
    free(s->post);
    free(s->xfer);
    free(s->plan);
}

/* The sweep on a connected client: one point per block size. */
static kvx_status_t sweep_run(struct bench_client *c, struct bench_samples *s, uint64_t *ids)
{
    const struct bench_args *a = c->args;
    kvx_group_ids_t groups[BENCH_MAX_POINTS];
    kvx_status_t status = KVX_OK;

    for (uint64_t b = 0; b < a->batch; b++)
        ids[b] = a->contiguous ? b : 2 * b;
    for (size_t i = 0; status == KVX_OK && i < a->num_sizes; i++) {
        kvx_request_t request = {groups, a->num_sizes, NULL, 0, NULL};

        for (size_t g = 0; g < a->num_sizes; g++)
            groups[g] = (kvx_group_ids_t){ids, g == i ? a->batch : 0};
        status = bench_point_run(c, &request, a->warmups_given ? a->warmups : BENCH_WARMUPS, s);
        if (status == KVX_OK && i == 0)
            bench_header_print(c,
                               a->contiguous
                                   ? "blocks 0..batch-1 (adjacent: they coalesce)"
                                   : "every other block (none adjacent: one descriptor each)",
                               a->warmups_given ? (int)a->warmups : BENCH_WARMUPS);
        if (status == KVX_OK)
            bench_point_print(c, s, NULL, a->sizes[i], a->batch);
    }
    return status;
}

/* The decode side: connects to `address` and runs the sweep, or the workload of `name`. */
static int bench_client_run(const struct bench_args *a, const kvx_layout_t *layout,
                            const char *address, const char *name, uint64_t capacity, bool header)
{
    struct bench_client c  = {.args = a};
    struct bench_samples s = {0};
    void **bases           = NULL;
    uint64_t *ids          = calloc(capacity, sizeof(*ids));
    kvx_status_t status;
    int ret = EXIT_BAD_INPUT;

    if (ids == NULL || !samples_alloc(&s, a->iters)) {
        fprintf(stderr, "kvx: error: out of memory for the samples\n");
        ret = EXIT_INTERNAL;
        goto out;
    }
    if (bench_agent_create(a, layout, NULL, &c.agent, &bases) != KVX_OK)
        goto out;
    status = kvx_agent_connect(c.agent, address, &c.peer);
    if (status == KVX_OK)
        status = kvx_peer_plan_create(kvx_agent_regions(c.agent), kvx_agent_regions(c.agent), NULL,
                                      &c.plan);
    if (status == KVX_OK)
        status = kvx_pairs_create(&c.pairs);
    if (status == KVX_OK)
        status = name == NULL ? sweep_run(&c, &s, ids)
                              : workload_run(&c, &s, ids, name, capacity, header);
    if (status != KVX_OK) {
        ret = cli_fail(status);
        goto out;
    }
    ret = 0;

out:
    kvx_pairs_destroy(c.pairs);
    kvx_peer_plan_destroy(c.plan);
    kvx_peer_destroy(c.peer);
    kvx_agent_destroy(c.agent);
    storages_free(bases, kvx_layout_num_storages(layout));
    samples_free(&s);
    free(ids);
    return ret;
}

/* One run on one layout: serve it (--listen), use the P at --peer, or fork one. */
static int bench_layout_run(const struct bench_args *a, const kvx_layout_t *layout,
                            const char *name, uint64_t capacity, bool header)
{
    char address[64];
    uint32_t port;
    pid_t pid;
    int ret;

    if (a->listen != NULL)
        return bench_serve(a, layout, a->listen, -1);
    if (a->peer != NULL)
        return bench_client_run(a, layout, a->peer, name, capacity, header);
    pid = bench_serve_fork(a, layout, &port);
    if (pid < 0 || port == 0) {
        fprintf(stderr, "kvx: error: bench: the prefill process did not start\n");
        bench_serve_stop(pid);
        return EXIT_INTERNAL;
    }
    snprintf(address, sizeof(address), "127.0.0.1:%" PRIu32, port);
    ret = bench_client_run(a, layout, address, name, capacity, header);
    bench_serve_stop(pid);
    return ret;
}

int bench_main(int argc, char **argv)
{
    struct bench_args a = {0};
    kvx_layout_t *layout;
    int ret = bench_args_parse(argc, argv, &a);

    if (ret >= 0)
        return ret;
    a.auth = kvx_auth_file(a.auth);
    if ((a.auth != NULL ? kvx_auth_key_load(a.auth, a.key) : kvx_auth_key_generate(a.key)) !=
        KVX_OK)
        return cli_fail(KVX_ERR_INVALID);
    if (getenv("UCX_NET_DEVICES") == NULL)
        setenv("UCX_NET_DEVICES", "lo", 1); /* the bench stays on loopback */
    if (!a.workload) {
        if (sweep_layout_create(&a, &layout) != KVX_OK)
            return EXIT_BAD_INPUT;
        ret = bench_layout_run(&a, layout, NULL, 2 * a.batch, true);
        kvx_layout_destroy(layout);
        if (ret <= 0)
            bench_footer_print(&a);
        return ret;
    }
    for (size_t l = 0; l < a.num_layouts && ret <= 0; l++) {
        uint64_t capacity;

        if (workload_layout_create(&a, a.layouts[l], &layout, &capacity) != KVX_OK)
            return EXIT_BAD_INPUT;
        ret = bench_layout_run(&a, layout, a.layouts[l], capacity, l == 0);
        kvx_layout_destroy(layout);
    }
    if (ret <= 0)
        bench_footer_print(&a);
    return ret < 0 ? 0 : ret;
}
/* main.c: the kvx command line (not kvx.c: that stem is the API's, include/kvx.h). Subcommands
 * parse arguments and print; the work is the library's. Exit status: 0 success, 2 bad input or
 * usage, 1 internal failure. */
#include "bench.h"
#include "block_ids.h"
#include "builtin_layouts.h"
#include "cli.h"
#include "kvx.h"
#include "plan_print.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_main[] =
    "usage: kvx COMMAND [ARGS]\n"
    "\n"
    "kvx moves KV-cache blocks between prefill and decode workers. Commands:\n"
    "  plan LAYOUT [--json]   register a layout file and print its transfer regions\n"
    "  plan LOCAL --peer REMOTE --blocks IDS\n"
    "                         plan a request's (local, remote) descriptor pairs\n"
    "  compat LOCAL REMOTE    check two layouts the way the handshake would\n"
    "  serve LAYOUT --listen HOST:PORT --auth FILE [--metrics HOST:PORT]\n"
    "                         a prefill worker: fill the cache with a pattern and serve it;\n"
    "                         --metrics serves its counters to Prometheus at /metrics\n"
    "  fetch LAYOUT --peer HOST:PORT --blocks IDS --auth FILE [--verify] [--json]\n"
    "                         a decode worker: pull a request and check every byte\n"
    "  bench [--mode pull|push] [--block-sizes 4K,64K,1M,16M] [--workload]\n"
    "                         measure transfer bandwidth and latency between two processes\n"
    "  demo [--p-tp N] [--d-tp N] [--layout FILE]\n"
    "                         move KV blocks from a prefill to a decode process on loopback\n"
    "                         and verify every byte (--tables: the built-in region tables)\n"
    "  auth-key FILE          write a new secret for a deployment's --auth FILE\n"
    "  help [COMMAND]         explain a command\n"
    "  version, --version     print the version of kvx\n"
    "\n"
    "Exit status: 0 success, 2 bad input (one 'kvx: error:' line), 1 internal failure.\n"
    "kvx help COMMAND (or kvx COMMAND --help) explains a command and all its options.\n";

static const char usage_plan[] =
    "usage: kvx plan LAYOUT [--json]\n"
    "       kvx plan LOCAL --peer REMOTE --blocks 'G:IDS;G:IDS' [--remote-blocks 'G:IDS']\n"
    "                [--local-tp N --local-rank R --remote-tp M]\n"
    "                [--local-block-size T --remote-block-size T] [--max-pair-len BYTES]\n"
    "                [--json]\n"
    "\n"
    "Reads LAYOUT (a kvx_layout file, see docs/layout-format.md), folds its views into\n"
    "transfer regions by the rules of docs/regions.md, proves every byte of every view is\n"
    "covered, and prints the region table: index, name, storage+offset, block length,\n"
    "stride, blocks, group (-1 when shared), flags and number of member views, then totals.\n"
    "\n"
    "With --peer, LOCAL is the reading (decode) worker and REMOTE the prefill worker: kvx\n"
    "plans one request and prints, per remote rank to read from, the (local, remote, length)\n"
    "pairs after coalescing (the first few; all with --json), the ranks only notified, and\n"
    "descriptor counts before and after coalescing (docs/plan.md).\n"
    "\n"
    "  --json                 print a kvx_plan (with compat_hash) or kvx_pairs document\n"
    "  --blocks IDS           local block ids per group: '0:0-15,20;1:3' (group:ids;...)\n"
    "  --remote-blocks IDS    remote block ids; default: the same blocks\n"
    "  --local-tp N, --local-rank R, --remote-tp M\n"
    "                         tensor-parallel sizes and this worker's rank; default 1, 0, 1\n"
    "  --local-block-size T, --remote-block-size T\n"
    "                         tokens per block; default each layout's block_size\n"
    "  --max-pair-len BYTES   never coalesce a pair beyond BYTES; default no limit\n"
    "  --help                 show this text\n";

static const char usage_compat[] =
    "usage: kvx compat LOCAL REMOTE [--local-tp N --local-rank R --remote-tp M]\n"
    "                  [--local-block-size T --remote-block-size T] [--mode pull|push]\n"
    "\n"
    "A pre-flight check for a P/D pair: registers both layouts, encodes REMOTE's handshake\n"
    "metadata as its agent would, and decodes and checks it as LOCAL's agent would "
    "(docs/wire.md):\n"
    "first the compatibility hash (model identity, dtypes, backend, transfer mode), then the\n"
    "region tables (same regions, names, groups and kinds; block lengths that fit the TP and\n"
    "block-size rules). Prints \"compatible\" and the region count, or every difference.\n"
    "Exit status 0 when compatible, 2 when not.\n";

static const char usage_demo[] =
    "usage: kvx demo [--layout FILE] [--p-tp N] [--d-tp N] [--auth FILE]\n"
    "                [--memory host|cuda] [--verbose] [--tables]\n"
    "\n"
    "The main job on a built-in default: starts a prefill process and a decode process on\n"
    "loopback with the DeepSeek-V4.1-style layout (layouts/models/deepseek-v4.1-demo.json,\n"
    "compiled in), pulls a batch of requests of mixed lengths, checks every transferred byte\n"
    "against the pattern the prefill process filled, and prints the region table's totals,\n"
    "descriptors before and after coalescing, GB/s, the transports and a final 'verified'\n"
    "line.\n"
    "\n"
    "  --layout FILE   run it on another layout\n"
    "  --p-tp N        N prefill ranks (processes), 1..8; default 1\n"
    "  --d-tp N        N decode ranks (processes), 1..8; default 1\n"
    "  --auth FILE     the side channel's secret (default KVX_AUTH_FILE's, else one made\n"
    "                  for this run)\n"
    "  --memory host|cuda  the storages in host memory (default: the layout's \"vram\"\n"
    "                  storages too, said on stderr) or on the GPU (docs/gpu.md)\n"
    "  --verbose       print every row of the region table, not only its totals\n"
    "  --tables        print the region tables of the built-in model layouts instead\n";

/* The table as JSON, with the pull-mode compatibility hash as one more top-level key
 * (formats.md allows keys after the version-1 ones). */
static int print_regions(const kvx_regions_t *regions, bool json)
{
    uint8_t hash[KVX_COMPAT_HASH_LEN];
    char *text;
    size_t len;
    kvx_status_t status;

    if (!json) {
        plan_print_table(stdout, regions);
        return 0;
    }
    status = kvx_regions_to_json(regions, &text);
    if (status == KVX_OK)
        status = kvx_compat_hash(regions, KVX_MODE_PULL, hash);
    if (status != KVX_OK) {
        kvx_free(text);
        return cli_fail(status);
    }
    len = strlen(text);
    while (len > 0 && text[len - 1] != '}') /* the document's closing brace */
        len--;
    printf("%.*s,\n  \"compat_hash\": \"", (int)(len > 2 ? len - 2 : 0), text);
    for (size_t i = 0; i < KVX_COMPAT_HASH_LEN; i++)
        printf("%02x", hash[i]);
    printf("\"\n}\n");
    kvx_free(text);
    return 0;
}

struct plan_args {
    const char *path;  /* the first positional argument */
    const char *path2; /* the second, for compat */
    const char *mode;  /* --mode pull|push, for compat */
    const char *peer;
    const char *blocks;
    const char *remote_blocks;
    bool json;
    kvx_peer_plan_params_t params;
};

/* Parses the options plan and compat share; returns -1 to go on, or the exit status to
 * return. Each command then rejects what it does not take. */
static int plan_args_parse(int argc, char **argv, struct plan_args *a, const char *usage)
{
    static const struct {
        const char *name;
        uint64_t field;
        uint64_t max;
    } numbers[] = {
        {"--local-tp", KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP, KVX_MAX_TP},
        {"--local-rank", KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK, KVX_MAX_TP},
        {"--remote-tp", KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP, KVX_MAX_TP},
        {"--local-block-size", KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE, INT64_MAX},
        {"--remote-block-size", KVX_PEER_PLAN_PARAM_FIELD_REMOTE_BLOCK_SIZE, INT64_MAX},
        {"--max-pair-len", KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN, INT64_MAX},
    };

    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        bool matched    = false;
        bool known;

        if (cli_is_help(arg)) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(arg, "--json") == 0) {
            a->json = true;
            continue;
        }
        if (arg[0] != '-' || arg[1] == '\0') {
            if (a->path2 != NULL)
                return cli_usage_error("too many layouts given", usage);
            *(a->path == NULL ? &a->path : &a->path2) = arg;
            continue;
        }
        /* an unknown option is unknown, not one missing its value */
        known = strcmp(arg, "--mode") == 0 || strcmp(arg, "--peer") == 0 ||
                strcmp(arg, "--blocks") == 0 || strcmp(arg, "--remote-blocks") == 0;
        for (size_t n = 0; n < sizeof(numbers) / sizeof(numbers[0]) && !known; n++)
            known = strcmp(arg, numbers[n].name) == 0;
        if (!known)
            return cli_usage_errorf(usage, "unknown option %s", arg);
        if (i + 1 >= argc)
            return cli_usage_errorf(usage, "%s needs a value", arg);
        if (strcmp(arg, "--mode") == 0) {
            a->mode = argv[++i];
            continue;
        }
        if (strcmp(arg, "--peer") == 0) {
            a->peer = argv[++i];
            continue;
        }
        if (strcmp(arg, "--blocks") == 0) {
            a->blocks = argv[++i];
            continue;
        }
        if (strcmp(arg, "--remote-blocks") == 0) {
            a->remote_blocks = argv[++i];
            continue;
        }
        for (size_t n = 0; n < sizeof(numbers) / sizeof(numbers[0]) && !matched; n++) {
            uint64_t value;

            if (strcmp(arg, numbers[n].name) != 0)
                continue;
            if (!cli_parse_number(arg, argv[++i], numbers[n].max, &value))
                return EXIT_BAD_INPUT;
            a->params.field_mask |= numbers[n].field;
            switch (numbers[n].field) {
            case KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP:
                a->params.local_tp = (uint32_t)value;
                break;
            case KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK:
                a->params.local_rank = (uint32_t)value;
                break;
            case KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP:
                a->params.remote_tp = (uint32_t)value;
                break;
            case KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE:
                a->params.local_block_size = value;
                break;
            case KVX_PEER_PLAN_PARAM_FIELD_REMOTE_BLOCK_SIZE:
                a->params.remote_block_size = value;
                break;
            default:
                a->params.max_pair_len = value;
                break;
            }
            matched = true;
        }
    }
    return -1;
}

/* Loads and registers a layout file; prints the error and returns false on failure. */
static bool regions_load(const char *path, kvx_regions_t **regions_p, int *exit_p)
{
    kvx_layout_t *layout;
    kvx_status_t status = kvx_layout_load_file(path, &layout);

    if (status == KVX_OK) {
        status = kvx_regions_register(layout, regions_p);
        kvx_layout_destroy(layout);
    }
    if (status != KVX_OK)
        *exit_p = cli_fail(status);
    return status == KVX_OK;
}

/* kvx plan LOCAL --peer REMOTE ...: one request through a prepared peer plan. */
static int plan_request_print(const struct plan_args *a, const kvx_regions_t *local)
{
    kvx_regions_t *remote = NULL;
    kvx_peer_plan_t *plan = NULL;
    kvx_pairs_t *pairs    = NULL;
    struct block_ids ids  = {0};
    struct block_ids rids = {0};
    kvx_request_t request;
    kvx_status_t status;
    char error[512];
    int ret = EXIT_BAD_INPUT;

    if (!block_ids_parse("--blocks", a->blocks, &ids, error, sizeof(error)) ||
        (a->remote_blocks != NULL &&
         !block_ids_parse("--remote-blocks", a->remote_blocks, &rids, error, sizeof(error)))) {
        fprintf(stderr, "kvx: error: %s\n", error);
        goto out;
    }
    if (!regions_load(a->peer, &remote, &ret))
        goto out;
    request = (kvx_request_t){ids.groups, ids.num_groups, rids.groups, rids.num_groups, NULL};
    status  = kvx_peer_plan_create(local, remote, &a->params, &plan);
    if (status == KVX_OK)
        status = kvx_pairs_create(&pairs);
    if (status == KVX_OK)
        status = kvx_peer_plan_request(plan, &request, pairs);
    if (status != KVX_OK) {
        ret = cli_fail(status);
        goto out;
    }
    plan_print_pairs(stdout, local, remote, plan, pairs, a->json);
    ret = 0;

out:
    kvx_pairs_destroy(pairs);
    kvx_peer_plan_destroy(plan);
    kvx_regions_destroy(remote);
    block_ids_free(&ids);
    block_ids_free(&rids);
    return ret;
}

static int command_plan(int argc, char **argv)
{
    struct plan_args args = {0};
    kvx_regions_t *regions;
    int ret = plan_args_parse(argc, argv, &args, usage_plan);

    if (ret >= 0)
        return ret;
    if (args.path == NULL)
        return cli_usage_error("plan: LAYOUT is required", usage_plan);
    if (args.path2 != NULL || args.mode != NULL)
        return cli_usage_error("plan: takes one LAYOUT and no --mode", usage_plan);
    if (args.peer == NULL &&
        (args.blocks != NULL || args.remote_blocks != NULL || args.params.field_mask != 0))
        return cli_usage_error("plan: request options need --peer REMOTE", usage_plan);
    if (args.peer != NULL && args.blocks == NULL)
        return cli_usage_error("plan: --peer needs --blocks", usage_plan);
    if (!regions_load(args.path, &regions, &ret))
        return ret;
    ret =
        args.peer != NULL ? plan_request_print(&args, regions) : print_regions(regions, args.json);
    kvx_regions_destroy(regions);
    return ret;
}

/* Packs REMOTE's metadata as its agent would and checks it as LOCAL's would. */
static int compat_check(const struct plan_args *a, const kvx_regions_t *local,
                        const kvx_regions_t *remote, kvx_transfer_mode_t mode)
{
    const kvx_peer_plan_params_t *p = &a->params;
    uint32_t local_tp = (p->field_mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP) ? p->local_tp : 1;
    uint32_t local_rank =
        (p->field_mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK) ? p->local_rank : 0;
    uint32_t remote_tp = (p->field_mask & KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP) ? p->remote_tp : 1;
    kvx_metadata_params_t mp = {
        .field_mask = KVX_METADATA_PARAM_FIELD_TP_RANK | KVX_METADATA_PARAM_FIELD_TP_SIZE |
                      KVX_METADATA_PARAM_FIELD_MODE | KVX_METADATA_PARAM_FIELD_AGENT_NAME,
        .agent_name = a->path2,
        .tp_rank    = local_tp > 0 && local_rank < local_tp
                          ? (uint32_t)((uint64_t)local_rank * remote_tp / local_tp)
                          : 0,
        .tp_size    = remote_tp,
        .mode       = mode,
    };
    kvx_metadata_t *md = NULL;
    size_t differences = 0;
    void *bytes;
    size_t size;
    kvx_status_t status;

    status = kvx_metadata_pack(remote, &mp, &bytes, &size);
    if (status != KVX_OK)
        return cli_fail(status);
    status = kvx_metadata_unpack(bytes, size, local, mode, &md);
    kvx_free(bytes);
    if (status != KVX_OK)
        return cli_fail(status);
    status = kvx_metadata_validate(md, local, p, &differences);
    if (status == KVX_OK) {
        printf("compatible: %zu regions, %zu bytes of metadata\n", kvx_regions_count(local), size);
    } else if (differences > 0) {
        for (size_t i = 0; kvx_metadata_difference(md, i) != NULL; i++)
            printf("difference: %s\n", kvx_metadata_difference(md, i));
        fprintf(stderr, "kvx: error: %zu difference%s between %s and %s\n", differences,
                differences > 1 ? "s" : "", a->path, a->path2);
    } else {
        cli_fail(status);
    }
    kvx_metadata_destroy(md);
    return status == KVX_OK ? 0 : EXIT_BAD_INPUT;
}

static int command_compat(int argc, char **argv)
{
    struct plan_args args    = {0};
    kvx_regions_t *local     = NULL;
    kvx_regions_t *remote    = NULL;
    kvx_transfer_mode_t mode = KVX_MODE_PULL;
    int ret                  = plan_args_parse(argc, argv, &args, usage_compat);

    if (ret >= 0)
        return ret;
    if (args.path == NULL || args.path2 == NULL)
        return cli_usage_error("compat: LOCAL and REMOTE are required", usage_compat);
    if (args.peer != NULL || args.blocks != NULL || args.remote_blocks != NULL || args.json ||
        (args.params.field_mask & KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN))
        return cli_usage_error("compat: takes no --peer, --blocks, --json or --max-pair-len",
                               usage_compat);
    if (args.mode != NULL && strcmp(args.mode, "push") == 0)
        mode = KVX_MODE_PUSH;
    else if (args.mode != NULL && strcmp(args.mode, "pull") != 0)
        return cli_usage_error("compat: --mode is pull or push", usage_compat);
    if (regions_load(args.path, &local, &ret) && regions_load(args.path2, &remote, &ret))
        ret = compat_check(&args, local, remote, mode);
    kvx_regions_destroy(local);
    kvx_regions_destroy(remote);
    return ret;
}

static int print_builtin_tables(void)
{
    for (size_t i = 0; i < num_builtin_layouts; i++) {
        const struct builtin_layout *b = &builtin_layouts[i];
        kvx_layout_t *layout;
        kvx_regions_t *regions;
        kvx_status_t status;

        status = kvx_layout_load_buffer(b->json, b->size, &layout);
        if (status != KVX_OK)
            return cli_fail(status);
        status = kvx_regions_register(layout, &regions);
        kvx_layout_destroy(layout);
        if (status != KVX_OK)
            return cli_fail(status);
        printf("%s== %s (layouts/models/%s.json)\n", i > 0 ? "\n" : "", b->name, b->name);
        plan_print_table(stdout, regions);
        kvx_regions_destroy(regions);
    }
    return 0;
}

static int command_demo(int argc, char **argv)
{
    const char *layout     = NULL;
    const char *auth       = NULL;
    uint64_t p_tp          = 1;
    uint64_t d_tp          = 1;
    enum cli_memory memory = CLI_MEMORY_HOST;
    bool verbose           = false;

    for (int i = 0; i < argc; i++) {
        bool valued = strcmp(argv[i], "--layout") == 0 || strcmp(argv[i], "--auth") == 0 ||
                      strcmp(argv[i], "--memory") == 0 || strcmp(argv[i], "--p-tp") == 0 ||
                      strcmp(argv[i], "--d-tp") == 0;

        if (cli_is_help(argv[i])) {
            fputs(usage_demo, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--tables") == 0)
            return print_builtin_tables();
        if (valued && i + 1 >= argc)
            return cli_usage_errorf(usage_demo, "%s needs a value", argv[i]);
        if (strcmp(argv[i], "--verbose") == 0)
            verbose = true;
        else if (strcmp(argv[i], "--layout") == 0)
            layout = argv[++i];
        else if (strcmp(argv[i], "--auth") == 0)
            auth = argv[++i];
        else if (strcmp(argv[i], "--memory") == 0) {
            if (!cli_memory_parse(argv[++i], &memory))
                return EXIT_BAD_INPUT;
        } else if (strcmp(argv[i], "--p-tp") == 0) {
            if (!cli_parse_number("--p-tp", argv[++i], 8, &p_tp) || p_tp < 1)
                return EXIT_BAD_INPUT;
        } else if (strcmp(argv[i], "--d-tp") == 0) {
            if (!cli_parse_number("--d-tp", argv[++i], 8, &d_tp) || d_tp < 1)
                return EXIT_BAD_INPUT;
        } else
            return cli_usage_errorf(usage_demo, "unknown option %s", argv[i]);
    }
    return demo_run(layout, auth, memory, (uint32_t)p_tp, (uint32_t)d_tp, verbose);
}

/* kvx help [COMMAND]: a command's own usage (serve, fetch and bench print theirs on --help),
 * or the general one; an unknown COMMAND is a usage error like an unknown command. */
static int command_help(int argc, char **argv)
{
    char *help[] = {"--help", NULL};

    if (argc == 0 || strcmp(argv[0], "help") == 0)
        fputs(usage_main, stdout);
    else if (strcmp(argv[0], "plan") == 0)
        fputs(usage_plan, stdout);
    else if (strcmp(argv[0], "demo") == 0)
        fputs(usage_demo, stdout);
    else if (strcmp(argv[0], "compat") == 0)
        fputs(usage_compat, stdout);
    else if (strcmp(argv[0], "serve") == 0)
        return command_serve(1, help);
    else if (strcmp(argv[0], "fetch") == 0)
        return command_fetch(1, help);
    else if (strcmp(argv[0], "bench") == 0)
        return bench_main(1, help);
    else if (strcmp(argv[0], "auth-key") == 0)
        return command_auth_key(1, help);
    else if (strcmp(argv[0], "version") == 0)
        fputs("usage: kvx version (or kvx --version)\n\nPrints the version of kvx and of the UCX "
              "library it loaded.\n",
              stdout);
    else {
        return cli_usage_errorf(usage_main, "unknown command %s", argv[0]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage_error("no command given", usage_main);
    if (cli_is_help(argv[1]) || strcmp(argv[1], "help") == 0)
        return command_help(argc - 2, argv + 2);
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("kvx %s (UCX %s)\n", KVX_VERSION_STRING, kvx_ucx_version()); /* CMake's */
        return 0;
    }
    if (strcmp(argv[1], "plan") == 0)
        return command_plan(argc - 2, argv + 2);
    if (strcmp(argv[1], "demo") == 0)
        return command_demo(argc - 2, argv + 2);
    if (strcmp(argv[1], "compat") == 0)
        return command_compat(argc - 2, argv + 2);
    if (strcmp(argv[1], "serve") == 0)
        return command_serve(argc - 2, argv + 2);
    if (strcmp(argv[1], "auth-key") == 0)
        return command_auth_key(argc - 2, argv + 2);
    if (strcmp(argv[1], "fetch") == 0)
        return command_fetch(argc - 2, argv + 2);
    if (strcmp(argv[1], "bench") == 0)
        return bench_main(argc - 2, argv + 2);
    return cli_usage_errorf(usage_main, "unknown command %s", argv[1]);
}

/* kvx.c: the kvx command line. Subcommands parse arguments and print; the work is the
 * library's. Exit status: 0 success, 2 bad input or usage, 1 internal failure. */
#include "block_ids.h"
#include "builtin_layouts.h"
#include "kvx.h"
#include "plan_print.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_BAD_INPUT 2
#define EXIT_INTERNAL  1

static const char usage_main[] =
    "usage: kvx COMMAND [ARGS]\n"
    "\n"
    "kvx moves KV-cache blocks between prefill and decode workers. Commands:\n"
    "  plan LAYOUT [--json]   register a layout file and print its transfer regions\n"
    "  plan LOCAL --peer REMOTE --blocks IDS\n"
    "                         plan a request's (local, remote) descriptor pairs\n"
    "  demo                   print the region tables of the built-in model layouts\n"
    "  help [COMMAND]         explain a command\n"
    "\n"
    "Exit status: 0 success, 2 bad input (one 'kvx: error:' line), 1 internal failure.\n";

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
    "  --json                 print a kvx_plan or kvx_pairs document instead\n"
    "  --blocks IDS           local block ids per group: '0:0-15,20;1:3' (group:ids;...)\n"
    "  --remote-blocks IDS    remote block ids; default: the same blocks\n"
    "  --local-tp N, --local-rank R, --remote-tp M\n"
    "                         tensor-parallel sizes and this worker's rank; default 1, 0, 1\n"
    "  --local-block-size T, --remote-block-size T\n"
    "                         tokens per block; default each layout's block_size\n"
    "  --max-pair-len BYTES   never coalesce a pair beyond BYTES; default no limit\n"
    "  --help                 show this text\n";

static const char usage_demo[] =
    "usage: kvx demo\n"
    "\n"
    "Registers each built-in model layout (the files of layouts/models/, compiled in) and\n"
    "prints its region table with descriptor counts.\n";

/* Prints `kvx: error: MESSAGE` and returns the exit status for `status`. */
static int fail(kvx_status_t status)
{
    fprintf(stderr, "kvx: error: %s\n", kvx_errmsg());
    return status == KVX_ERR_NO_MEMORY || status == KVX_ERR_INTERNAL ? EXIT_INTERNAL
                                                                     : EXIT_BAD_INPUT;
}

static int usage_error(const char *message, const char *usage)
{
    fprintf(stderr, "kvx: error: %s\n\n%s", message, usage);
    return EXIT_BAD_INPUT;
}

static bool is_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

static int print_regions(const kvx_regions_t *regions, bool json)
{
    char *text;
    kvx_status_t status;

    if (!json) {
        plan_print_table(stdout, regions);
        return 0;
    }
    status = kvx_regions_to_json(regions, &text);
    if (status != KVX_OK)
        return fail(status);
    printf("%s\n", text);
    kvx_free(text);
    return 0;
}

struct plan_args {
    const char *path;
    const char *peer;
    const char *blocks;
    const char *remote_blocks;
    bool json;
    kvx_peer_plan_params_t params;
};

/* Parses the value of a numeric option into *value_p (at most `max`). */
static bool parse_number(const char *option, const char *text, uint64_t max, uint64_t *value_p)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v     = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 || v > max) {
        fprintf(stderr, "kvx: error: %s: \"%s\" is not a number up to %llu\n", option, text,
                (unsigned long long)max);
        return false;
    }
    *value_p = v;
    return true;
}

/* Parses plan's arguments; returns -1 to go on, or the exit status to return. */
static int plan_args_parse(int argc, char **argv, struct plan_args *a)
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

        if (is_help(arg)) {
            fputs(usage_plan, stdout);
            return 0;
        }
        if (strcmp(arg, "--json") == 0) {
            a->json = true;
            continue;
        }
        if (arg[0] != '-' || arg[1] == '\0') {
            if (a->path != NULL)
                return usage_error("plan: more than one LAYOUT given", usage_plan);
            a->path = arg;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvx: error: plan: %s needs a value\n\n%s", arg, usage_plan);
            return EXIT_BAD_INPUT;
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
            if (!parse_number(arg, argv[++i], numbers[n].max, &value))
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
        if (!matched) {
            fprintf(stderr, "kvx: error: plan: unknown option %s\n\n%s", arg, usage_plan);
            return EXIT_BAD_INPUT;
        }
    }
    if (a->path == NULL)
        return usage_error("plan: LAYOUT is required", usage_plan);
    if (a->peer == NULL &&
        (a->blocks != NULL || a->remote_blocks != NULL || a->params.field_mask != 0))
        return usage_error("plan: request options need --peer REMOTE", usage_plan);
    if (a->peer != NULL && a->blocks == NULL)
        return usage_error("plan: --peer needs --blocks", usage_plan);
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
        *exit_p = fail(status);
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
    request = (kvx_request_t){ids.groups, ids.num_groups, rids.groups, rids.num_groups};
    status  = kvx_peer_plan_create(local, remote, &a->params, &plan);
    if (status == KVX_OK)
        status = kvx_pairs_create(&pairs);
    if (status == KVX_OK)
        status = kvx_peer_plan_request(plan, &request, pairs);
    if (status != KVX_OK) {
        ret = fail(status);
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
    int ret = plan_args_parse(argc, argv, &args);

    if (ret >= 0)
        return ret;
    if (!regions_load(args.path, &regions, &ret))
        return ret;
    ret =
        args.peer != NULL ? plan_request_print(&args, regions) : print_regions(regions, args.json);
    kvx_regions_destroy(regions);
    return ret;
}

static int command_demo(int argc, char **argv)
{
    if (argc > 0) {
        if (is_help(argv[0])) {
            fputs(usage_demo, stdout);
            return 0;
        }
        return usage_error("demo: takes no arguments", usage_demo);
    }
    for (size_t i = 0; i < num_builtin_layouts; i++) {
        const struct builtin_layout *b = &builtin_layouts[i];
        kvx_layout_t *layout;
        kvx_regions_t *regions;
        kvx_status_t status;

        status = kvx_layout_load_buffer(b->json, b->size, &layout);
        if (status != KVX_OK)
            return fail(status);
        status = kvx_regions_register(layout, &regions);
        kvx_layout_destroy(layout);
        if (status != KVX_OK)
            return fail(status);
        printf("%s== %s (layouts/models/%s.json)\n", i > 0 ? "\n" : "", b->name, b->name);
        plan_print_table(stdout, regions);
        kvx_regions_destroy(regions);
    }
    return 0;
}

static int command_help(int argc, char **argv)
{
    if (argc > 0 && strcmp(argv[0], "plan") == 0)
        fputs(usage_plan, stdout);
    else if (argc > 0 && strcmp(argv[0], "demo") == 0)
        fputs(usage_demo, stdout);
    else
        fputs(usage_main, stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage_error("no command given", usage_main);
    if (is_help(argv[1]) || strcmp(argv[1], "help") == 0)
        return command_help(argc - 2, argv + 2);
    if (strcmp(argv[1], "plan") == 0)
        return command_plan(argc - 2, argv + 2);
    if (strcmp(argv[1], "demo") == 0)
        return command_demo(argc - 2, argv + 2);
    fprintf(stderr, "kvx: error: unknown command %s\n\n%s", argv[1], usage_main);
    return EXIT_BAD_INPUT;
}

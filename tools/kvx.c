/* kvx.c: the kvx command line. Subcommands parse arguments and print; the work is the
 * library's. Exit status: 0 success, 2 bad input or usage, 1 internal failure. */
#include "builtin_layouts.h"
#include "kvx.h"
#include "plan_print.h"

#include <stdio.h>
#include <string.h>

#define EXIT_BAD_INPUT 2
#define EXIT_INTERNAL  1

static const char usage_main[] =
    "usage: kvx COMMAND [ARGS]\n"
    "\n"
    "kvx moves KV-cache blocks between prefill and decode workers. Commands:\n"
    "  plan LAYOUT [--json]   register a layout file and print its transfer regions\n"
    "  demo                   print the region tables of the built-in model layouts\n"
    "  help [COMMAND]         explain a command\n"
    "\n"
    "Exit status: 0 success, 2 bad input (one 'kvx: error:' line), 1 internal failure.\n";

static const char usage_plan[] =
    "usage: kvx plan LAYOUT [--json]\n"
    "\n"
    "Reads LAYOUT (a kvx_layout file, see docs/layout-format.md), folds its views into\n"
    "transfer regions by the rules of docs/regions.md, proves every byte of every view is\n"
    "covered, and prints the region table: index, name, storage+offset, block length,\n"
    "stride, blocks, group (-1 when shared), flags and number of member views, then totals.\n"
    "\n"
    "  --json   print the table as a kvx_plan document instead (docs/layout-format.md)\n"
    "  --help   show this text\n";

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

static int command_plan(int argc, char **argv)
{
    const char *path     = NULL;
    bool json            = false;
    kvx_layout_t *layout = NULL;
    kvx_regions_t *regions;
    kvx_status_t status;
    int ret;

    for (int i = 0; i < argc; i++) {
        if (is_help(argv[i])) {
            fputs(usage_plan, stdout);
            return 0;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "kvx: error: plan: unknown option %s\n\n%s", argv[i], usage_plan);
            return EXIT_BAD_INPUT;
        } else if (path != NULL) {
            return usage_error("plan: more than one LAYOUT given", usage_plan);
        } else {
            path = argv[i];
        }
    }
    if (path == NULL)
        return usage_error("plan: LAYOUT is required", usage_plan);

    status = kvx_layout_load_file(path, &layout);
    if (status != KVX_OK)
        return fail(status);
    status = kvx_regions_register(layout, &regions);
    kvx_layout_destroy(layout);
    if (status != KVX_OK)
        return fail(status);
    ret = print_regions(regions, json);
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

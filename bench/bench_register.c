/* bench_register.c: times kvx_regions_register on a generated 1,265-view layout shaped like a
 * large production model, plus loading that layout from JSON and one 1,024-block request.
 * Uses only kvx.h; run by hand (`make bench`), never by ctest (STYLE.md 6). */
#include "bench_common.h"
#include "bench_layout.h"

#include "kvx.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BENCH_REQUEST_BLOCKS 1024 /* block ids each group names in the timed request */
#define BENCH_WARMUPS        5
#define BENCH_DEFAULT_ITERS  200
#define BENCH_MAX_ITERS      10000  /* x ~5 ms per JSON load: one run stays near a minute */
#define BENCH_GOAL_US        1000.0 /* registration goal: under 1 ms */
#define BENCH_SEED           UINT64_C(0x6b76782d62656e63) /* fixed, so every run shuffles alike */

/* Summary of one timed loop, in microseconds. */
struct bench_stats {
    double median;
    double min;
    double p90;
    double max;
};

/* What main prints: the figures, the table's shape and the machine. */
struct bench_report {
    struct bench_stats reg;     /* kvx_regions_register */
    struct bench_stats load;    /* kvx_layout_load_buffer */
    struct bench_stats request; /* kvx_regions_request_ids */
    size_t packed_rows;         /* regions with packed_row set */
    size_t shared;              /* regions of group -1 */
    long nproc;
    char cpu[256]; /* "model name" of /proc/cpuinfo */
};

/* What the timed calls read; built once before any timing. */
struct bench_ctx {
    kvx_layout_t *layout;         /* built through the API */
    const char *json;             /* the same layout as a kvx_layout file */
    size_t json_len;              /* bytes */
    const kvx_regions_t *regions; /* registered once, for the request */
    kvx_group_ids_t groups[BENCH_NUM_GROUPS];
    uint64_t *request_ids; /* output of the request, sized by a first call */
    size_t num_request_ids;
    uint64_t *samples; /* ns, one per timed run */
    int iters;
};

typedef kvx_status_t (*bench_once_fn)(struct bench_ctx *ctx, uint64_t *ns_p);

/* Runs `once` BENCH_WARMUPS times untimed, then ctx->iters times, and summarises the
 * samples: median (mean of the middle two for an even count), nearest-rank p90. */
static kvx_status_t bench_measure(struct bench_ctx *ctx, bench_once_fn once,
                                  struct bench_stats *stats_p)
{
    size_t n = (size_t)ctx->iters;
    uint64_t ns;
    kvx_status_t status;

    for (int i = 0; i < BENCH_WARMUPS; i++) {
        status = once(ctx, &ns);
        if (status != KVX_OK)
            return status;
    }
    for (size_t i = 0; i < n; i++) {
        status = once(ctx, &ctx->samples[i]);
        if (status != KVX_OK)
            return status;
    }
    qsort(ctx->samples, n, sizeof(*ctx->samples), stats_compare);
    stats_p->min    = ctx->samples[0] / 1e3;
    stats_p->max    = ctx->samples[n - 1] / 1e3;
    stats_p->median = (ctx->samples[(n - 1) / 2] + ctx->samples[n / 2]) / 2e3;
    stats_p->p90    = ctx->samples[(9 * n + 9) / 10 - 1] / 1e3;
    return KVX_OK;
}

/* One registration: order, fold, proof (regions.md steps 1-4), validation and the table's
 * allocation included, since that is what a worker pays at start-up. Destroy is not timed. */
static kvx_status_t register_once(struct bench_ctx *ctx, uint64_t *ns_p)
{
    kvx_regions_t *regions = NULL;
    uint64_t start         = clock_ns();
    kvx_status_t status    = kvx_regions_register(ctx->layout, &regions);
    uint64_t end           = clock_ns();

    kvx_regions_destroy(regions);
    *ns_p = end - start;
    return status;
}

/* One load of the layout file from memory: parse, strict checks, validation. */
static kvx_status_t load_json_once(struct bench_ctx *ctx, uint64_t *ns_p)
{
    kvx_layout_t *layout = NULL;
    uint64_t start       = clock_ns();
    kvx_status_t status  = kvx_layout_load_buffer(ctx->json, ctx->json_len, &layout);
    uint64_t end         = clock_ns();

    kvx_layout_destroy(layout);
    *ns_p = end - start;
    return status;
}

/* One request: block ids per group to descriptor ids, written to a buffer sized once. */
static kvx_status_t request_once(struct bench_ctx *ctx, uint64_t *ns_p)
{
    size_t num_ids;
    uint64_t start      = clock_ns();
    kvx_status_t status = kvx_regions_request_ids(ctx->regions, ctx->groups, BENCH_NUM_GROUPS,
                                                  ctx->request_ids, ctx->num_request_ids, &num_ids);
    uint64_t end        = clock_ns();

    *ns_p = end - start;
    return status;
}

static void json_stats_print(const char *key, const struct bench_stats *s)
{
    printf("\"%s\": {\"median\": %.1f, \"min\": %.1f, \"p90\": %.1f, \"max\": %.1f}", key,
           s->median, s->min, s->p90, s->max);
}

static void text_stats_print(const char *what, const struct bench_stats *s)
{
    printf("%-40s %10.1f %10.1f %10.1f %10.1f\n", what, s->median, s->min, s->p90, s->max);
}

static const char usage[] =
    "usage: bench_register [--iters N] [--json]\n"
    "\n"
    "Times kvx_regions_register on a generated 1,265-view, 4,096-block layout shaped like a\n"
    "large production model (docs/performance.md), then loading the same layout from JSON and\n"
    "one request of 1,024 blocks per group. Each figure: 5 untimed warm-ups, then N timed runs\n"
    "(CLOCK_MONOTONIC); median, min, p90 and max in microseconds.\n"
    "\n"
    "  --iters N   timed runs per figure, 1..10000 (default 200)\n"
    "  --json      print one JSON object instead of the table\n"
    "  --help      show this text\n";

/* Parses the command line; false (after a message) on a bad argument. */
static bool args_parse(int argc, char **argv, int *iters_p, bool *json_p, bool *help_p)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            *json_p = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            *help_p = true;
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            char *end;
            long n;

            errno = 0;
            n     = strtol(argv[++i], &end, 10);
            if (errno != 0 || end == argv[i] || *end != '\0' || n < 1 || n > BENCH_MAX_ITERS) {
                fprintf(stderr, "bench_register: error: --iters: %s is not a count in 1..%d\n",
                        argv[i], BENCH_MAX_ITERS);
                return false;
            }
            *iters_p = (int)n;
        } else {
            fprintf(stderr, "bench_register: error: unknown argument %s\n\n%s", argv[i], usage);
            return false;
        }
    }
    return true;
}

/* Fills each group's request with BENCH_REQUEST_BLOCKS distinct block ids, shuffled, as a
 * scheduler's block table would give them. */
static void request_build(struct bench_ctx *ctx, uint64_t *ids_storage)
{
    uint64_t state = BENCH_SEED ^ UINT64_C(0x7265717565737473);
    uint32_t perm[BENCH_NUM_BLOCKS];

    for (size_t g = 0; g < BENCH_NUM_GROUPS; g++) {
        uint64_t *ids = &ids_storage[g * BENCH_REQUEST_BLOCKS];

        bench_order_shuffle(perm, BENCH_NUM_BLOCKS, &state);
        for (size_t i = 0; i < BENCH_REQUEST_BLOCKS; i++)
            ids[i] = perm[i];
        ctx->groups[g] = (kvx_group_ids_t){ids, BENCH_REQUEST_BLOCKS};
    }
}

/* Prints the failed kvx call's status and message; false for `return` chains. */
static bool kvx_failed(const char *what, kvx_status_t status)
{
    fprintf(stderr, "bench_register: error: %s: %s: %s\n", what, kvx_status_str(status),
            kvx_errmsg());
    return false;
}

/* The JSON and API layouts must give the same table, or the JSON figure would time loading
 * a different layout. Compares the two kvx_plan documents byte for byte. */
static bool bench_check_json(const kvx_regions_t *regions, const struct bench_ctx *ctx)
{
    kvx_layout_t *layout     = NULL;
    kvx_regions_t *from_json = NULL;
    char *plan_api           = NULL;
    char *plan_json          = NULL;
    kvx_status_t status;
    bool same = false;

    status = kvx_layout_load_buffer(ctx->json, ctx->json_len, &layout);
    if (status != KVX_OK) {
        kvx_failed("loading the layout JSON", status);
        goto out;
    }
    status = kvx_regions_register(layout, &from_json);
    if (status == KVX_OK)
        status = kvx_regions_to_json(regions, &plan_api);
    if (status == KVX_OK)
        status = kvx_regions_to_json(from_json, &plan_json);
    if (status != KVX_OK) {
        kvx_failed("registering the JSON layout", status);
        goto out;
    }
    same = strcmp(plan_api, plan_json) == 0;
    if (!same)
        fprintf(stderr, "bench_register: error: the JSON layout registers a different table"
                        " from the API layout\n");
out:
    kvx_free(plan_json);
    kvx_free(plan_api);
    kvx_regions_destroy(from_json);
    kvx_layout_destroy(layout);
    return same;
}

/* Counts packed rows and shared regions, and checks the table has the shape the bench is
 * meant to measure: if the flags or a rule change so that packed rows vanish, the figures
 * would silently describe another layout. */
static bool bench_check_shape(const kvx_regions_t *regions, struct bench_report *report)
{
    size_t count = kvx_regions_count(regions);

    report->packed_rows = 0;
    report->shared      = 0;
    for (size_t r = 0; r < count; r++) {
        kvx_region_info_t info;
        kvx_status_t status = kvx_regions_get(regions, r, &info);

        if (status != KVX_OK)
            return kvx_failed("reading the table", status);
        report->packed_rows += info.packed_row;
        report->shared += info.group == -1;
    }
    if (count == BENCH_EXPECT_REGIONS && report->packed_rows == BENCH_EXPECT_PACKED_ROWS &&
        report->shared == BENCH_EXPECT_SHARED)
        return true;
    fprintf(stderr,
            "bench_register: error: the generated layout registered %zu regions (%zu packed_row,"
            " %zu shared); the bench expects %d (%d packed_row, %d shared)\n",
            count, report->packed_rows, report->shared, BENCH_EXPECT_REGIONS,
            BENCH_EXPECT_PACKED_ROWS, BENCH_EXPECT_SHARED);
    return false;
}

/* Builds the request and sizes its output and the samples once, outside the timed loops. */
static bool bench_prepare(struct bench_ctx *ctx, uint64_t *ids_storage)
{
    kvx_status_t status;

    request_build(ctx, ids_storage);
    status = kvx_regions_request_ids(ctx->regions, ctx->groups, BENCH_NUM_GROUPS, NULL, 0,
                                     &ctx->num_request_ids);
    if (status != KVX_OK)
        return kvx_failed("sizing the request", status);
    ctx->request_ids = calloc(ctx->num_request_ids, sizeof(*ctx->request_ids));
    ctx->samples     = calloc((size_t)ctx->iters, sizeof(*ctx->samples));
    if (ctx->request_ids == NULL || ctx->samples == NULL) {
        fprintf(stderr, "bench_register: error: out of memory for the request and samples\n");
        return false;
    }
    return true;
}

static const char *bool_str(bool value)
{
    return value ? "true" : "false";
}

static void report_json(const struct bench_ctx *ctx, const struct bench_report *report)
{
    printf("{\"bench\": \"register\",\n \"layout\": {\"views\": %zu, \"storages\": %zu,"
           " \"num_blocks\": %d, \"csa_linear\": %s, \"whole_row_regions\": %s,"
           " \"json_bytes\": %zu},\n",
           kvx_layout_num_views(ctx->layout), kvx_layout_num_storages(ctx->layout),
           BENCH_NUM_BLOCKS, bool_str(bench_layout_params.csa_linear),
           bool_str(bench_layout_params.whole_row_regions), ctx->json_len);
    printf(" \"table\": {\"regions\": %zu, \"packed_row_regions\": %zu, \"shared_regions\": %zu,"
           " \"descriptors\": %" PRIu64 "},\n",
           kvx_regions_count(ctx->regions), report->packed_rows, report->shared,
           kvx_regions_num_descriptors(ctx->regions));
    printf(" \"machine\": {\"nproc\": %ld, \"cpu\": ", report->nproc);
    json_string_print(report->cpu);
    printf(", \"note\": \"%ld noisy cores: compare medians\"},\n", report->nproc);
    printf(" \"warmups\": %d, \"iters\": %d, \"unit\": \"us\",\n", BENCH_WARMUPS, ctx->iters);
    printf(" \"request\": {\"groups\": %d, \"blocks_per_group\": %d, \"ids\": %zu},\n ",
           BENCH_NUM_GROUPS, BENCH_REQUEST_BLOCKS, ctx->num_request_ids);
    json_stats_print("register", &report->reg);
    printf(",\n ");
    json_stats_print("load_json", &report->load);
    printf(",\n ");
    json_stats_print("request_ids", &report->request);
    printf(",\n \"goal_us\": %.0f, \"goal_met\": %s}\n", BENCH_GOAL_US,
           bool_str(report->reg.median < BENCH_GOAL_US));
}

static void report_text(const struct bench_ctx *ctx, const struct bench_report *report)
{
    printf("layout: %zu views, %zu storages, %d blocks per view, csa_linear %s,"
           " whole_row_regions %s; input shuffled (fixed seed)\n",
           kvx_layout_num_views(ctx->layout), kvx_layout_num_storages(ctx->layout),
           BENCH_NUM_BLOCKS, bool_str(bench_layout_params.csa_linear),
           bool_str(bench_layout_params.whole_row_regions));
    printf("table: %zu regions (%zu packed_row, %zu shared by several groups),"
           " %" PRIu64 " descriptors\n",
           kvx_regions_count(ctx->regions), report->packed_rows, report->shared,
           kvx_regions_num_descriptors(ctx->regions));
    printf("machine: nproc %ld, %s; %ld noisy cores, so read the medians\n", report->nproc,
           report->cpu, report->nproc);
    printf("runs: %d warm-ups, then %d timed runs per figure (CLOCK_MONOTONIC)\n\n", BENCH_WARMUPS,
           ctx->iters);
    printf("%-40s %10s %10s %10s %10s\n", "us", "median", "min", "p90", "max");
    text_stats_print("kvx_regions_register", &report->reg);
    text_stats_print("kvx_layout_load_buffer", &report->load);
    text_stats_print("kvx_regions_request_ids", &report->request);
    printf("\nload_buffer: %zu bytes of JSON; request: %d groups x %d block ids -> %zu"
           " descriptor ids\n",
           ctx->json_len, BENCH_NUM_GROUPS, BENCH_REQUEST_BLOCKS, ctx->num_request_ids);
    printf("goal: < %.0f us: %s (register median %.1f us)\n", BENCH_GOAL_US,
           report->reg.median < BENCH_GOAL_US ? "met" : "missed", report->reg.median);
}

int main(int argc, char **argv)
{
    static struct bench_layout bl; /* ~190 KB: kept off the stack */
    static uint64_t block_ids[BENCH_NUM_GROUPS * BENCH_REQUEST_BLOCKS];
    struct bench_ctx ctx = {.iters = BENCH_DEFAULT_ITERS};
    struct bench_report report;
    struct bench_text json = {0};
    kvx_regions_t *regions = NULL;
    bool as_json           = false;
    bool help              = false;
    kvx_status_t status;
    int ret = 1;

    if (!args_parse(argc, argv, &ctx.iters, &as_json, &help))
        return 2;
    if (help) {
        fputs(usage, stdout);
        return 0;
    }

    bench_layout_generate(&bl, BENCH_SEED);
    status = bench_layout_build(&bl, &ctx.layout);
    if (status != KVX_OK) {
        kvx_failed("building the layout", status);
        goto out;
    }
    if (!bench_layout_json(&bl, &json)) {
        fprintf(stderr, "bench_register: error: out of memory writing the layout JSON\n");
        goto out;
    }
    ctx.json     = json.data;
    ctx.json_len = json.len;
    status       = kvx_regions_register(ctx.layout, &regions);
    if (status != KVX_OK) {
        kvx_failed("registering the layout", status);
        goto out;
    }
    ctx.regions = regions;
    if (!bench_check_json(regions, &ctx) || !bench_check_shape(regions, &report) ||
        !bench_prepare(&ctx, block_ids))
        goto out;

    status = bench_measure(&ctx, register_once, &report.reg);
    if (status == KVX_OK)
        status = bench_measure(&ctx, load_json_once, &report.load);
    if (status == KVX_OK)
        status = bench_measure(&ctx, request_once, &report.request);
    if (status != KVX_OK) {
        kvx_failed("a timed call", status);
        goto out;
    }
    report.nproc = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_model_read(report.cpu, sizeof(report.cpu));
    if (as_json)
        report_json(&ctx, &report);
    else
        report_text(&ctx, &report);
    ret = 0;

out:
    free(ctx.samples);
    free(ctx.request_ids);
    kvx_regions_destroy(regions);
    kvx_layout_destroy(ctx.layout);
    free(json.data);
    return ret;
}

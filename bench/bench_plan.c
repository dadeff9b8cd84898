/* bench_plan.c: times kvx_peer_plan_request, one request's (local, remote) descriptor pairs for
 * one peer, on the Llama-3-8B and DeepSeek-V4-Flash layout files at 1k, 16k and 128k tokens,
 * with scattered and with consecutive block ids. Uses only kvx.h; run by hand, never by ctest
 * (STYLE.md 6). bench/plan_numpy.py checks its pairs against NumPy and compares the speed. */
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

#define BENCH_WARMUPS       5
#define BENCH_DEFAULT_ITERS 200
#define BENCH_MAX_ITERS     100000 /* x ~1 ms for the largest case: one run stays near a minute */
#define BENCH_POOL_FACTOR   2      /* scattered ids are drawn from at least 2x the blocks asked */
#define BENCH_NAME_MAX      96     /* bytes of a case name, terminator included */
#define BENCH_SEED          UINT64_C(0x6b76782d706c616e) /* fixed, so every run draws alike */

#ifndef BENCH_LAYOUTS_DIR
#define BENCH_LAYOUTS_DIR "layouts/models" /* CMake passes the source tree's */
#endif

/* The layout files measured, in --layouts DIR, each planned against itself (TP 1). */
static const char *const bench_models[] = {"llama3-8b", "deepseek-v4-flash"};
#define BENCH_NUM_MODELS (sizeof(bench_models) / sizeof(bench_models[0]))

/* Request sizes in tokens; a request names tokens / block_size block ids. */
static const uint64_t bench_tokens[] = {1024, 16384, 131072};
#define BENCH_NUM_TOKENS (sizeof(bench_tokens) / sizeof(bench_tokens[0]))

/* How a request's block ids are chosen. Scattered: distinct ids drawn at random from the
 * table's capacity, in random order, as a fragmented block table gives them; almost no two
 * neighbours continue each other, so almost nothing coalesces. Consecutive: 0 .. n-1, so every
 * region's blocks coalesce into one pair where its stride equals its block length. */
enum bench_ids {
    BENCH_IDS_SCATTERED,
    BENCH_IDS_CONSECUTIVE,
    BENCH_NUM_IDS,
};

static const char *const bench_ids_names[BENCH_NUM_IDS] = {"scattered", "consecutive"};

/* Summary of one timed loop, in microseconds. */
struct bench_stats {
    double median;
    double min;
    double p90;
    double max;
};

/* One row of the report. */
struct bench_case {
    char name[BENCH_NAME_MAX]; /* model/tokens/ids, e.g. llama3-8b/128k/scattered */
    const char *model;
    uint64_t tokens;
    enum bench_ids ids;
    uint64_t block_size;  /* tokens per block */
    uint64_t blocks;      /* block ids in the request */
    uint64_t num_blocks;  /* capacity of the planned table (smallest region) */
    uint64_t scale;       /* the file's num_blocks and sizes were multiplied by this */
    size_t regions;       /* regions of the table */
    kvx_pairs_stats_t st; /* of the last timed call */
    struct bench_stats time;
};

/* Command-line options. */
struct bench_args {
    const char *layouts; /* directory of <model>.json */
    const char *only;    /* NULL: every case; else one case name */
    const char *dump;    /* NULL, or the file for the uncoalesced pairs of `only` */
    int iters;
    bool json;
    bool list;
    bool help;
};

/* Everything one model and request size needs, built before any timing. */
struct bench_table {
    kvx_regions_t *regions;
    kvx_peer_plan_t *plan; /* default params: TP 1 on both sides, pairs coalesced */
    uint64_t capacity;     /* smallest num_blocks of any region */
    uint64_t scale;
};

/* Sorts the n samples (ns) and summarises them: median (mean of the middle two for an even
 * count), nearest-rank p90. */
static void stats_summarise(uint64_t *samples, size_t n, struct bench_stats *stats_p)
{
    qsort(samples, n, sizeof(*samples), stats_compare);
    stats_p->min    = samples[0] / 1e3;
    stats_p->max    = samples[n - 1] / 1e3;
    stats_p->median = (samples[(n - 1) / 2] + samples[n / 2]) / 2e3;
    stats_p->p90    = samples[(9 * n + 9) / 10 - 1] / 1e3;
}

/* Prints the failed kvx call's status and message; false for `return` chains. */
static bool kvx_failed(const char *what, kvx_status_t status)
{
    fprintf(stderr, "bench_plan: error: %s: %s: %s\n", what, kvx_status_str(status), kvx_errmsg());
    return false;
}

/* Reads a whole layout file into a NUL-terminated buffer the caller frees; NULL after a
 * message. */
static char *file_read(const char *path, size_t *len_p)
{
    FILE *f   = fopen(path, "rb");
    char *buf = NULL;
    size_t len;

    if (f == NULL) {
        fprintf(stderr, "bench_plan: error: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    buf = malloc(KVX_MAX_LAYOUT_FILE + 1);
    if (buf == NULL) {
        fprintf(stderr, "bench_plan: error: out of memory reading %s\n", path);
        goto out;
    }
    len = fread(buf, 1, KVX_MAX_LAYOUT_FILE + 1, f);
    if (ferror(f) || len > KVX_MAX_LAYOUT_FILE) {
        fprintf(stderr, "bench_plan: error: %s: unreadable or larger than %u bytes\n", path,
                KVX_MAX_LAYOUT_FILE);
        free(buf);
        buf = NULL;
        goto out;
    }
    buf[len] = '\0';
    *len_p   = len;
out:
    fclose(f);
    return buf;
}

/* If text[i..] is `"key"`, optional blanks, a colon, optional blanks, returns the index of
 * the first byte after them; else 0. */
static size_t json_key_at(const char *text, size_t i, const char *key)
{
    size_t n = strlen(key);

    if (text[i] != '"' || strncmp(text + i + 1, key, n) != 0 || text[i + 1 + n] != '"')
        return 0;
    i += n + 2;
    while (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')
        i++;
    if (text[i] != ':')
        return 0;
    i++;
    while (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')
        i++;
    return i;
}

/* A copy of the layout file text with every "num_blocks" and every storage "size" multiplied
 * by `scale`: the block-major storages of these files are num_blocks rows (plus at most a
 * tail), so each then holds scale times the blocks. kvx validates the result when it loads
 * it, so a file this does not fit fails there, with kvx's message. NULL after a message. */
static char *layout_text_scale(const char *text, size_t len, uint64_t scale, size_t *len_p)
{
    /* Each number replaced follows a key of at least 7 bytes ("size":) and grows by at most
     * 19 digits, so the copy is under 4 x the text. */
    size_t cap = 4 * len + 64;
    char *out  = malloc(cap);
    size_t o   = 0;

    if (out == NULL) {
        fprintf(stderr, "bench_plan: error: out of memory scaling a layout\n");
        return NULL;
    }
    for (size_t i = 0; i < len;) {
        size_t value_at = json_key_at(text, i, "num_blocks");
        uint64_t value;
        char *end;

        if (value_at == 0)
            value_at = json_key_at(text, i, "size");
        if (value_at == 0 || text[value_at] < '0' || text[value_at] > '9') {
            out[o++] = text[i++];
            continue;
        }
        memcpy(out + o, text + i, value_at - i);
        o += value_at - i;
        errno = 0;
        value = strtoull(text + value_at, &end, 10);
        if (errno != 0 || __builtin_mul_overflow(value, scale, &value)) {
            fprintf(stderr,
                    "bench_plan: error: a layout number overflows when scaled by %" PRIu64 "\n",
                    scale);
            free(out);
            return NULL;
        }
        o += (size_t)snprintf(out + o, cap - o, "%" PRIu64, value);
        i = (size_t)(end - text);
    }
    out[o] = '\0';
    *len_p = o;
    return out;
}

/* The smallest num_blocks of any region: the largest block id + 1 any request may name. */
static bool table_capacity(const kvx_regions_t *regions, uint64_t *capacity_p)
{
    uint64_t capacity = UINT64_MAX;

    for (size_t r = 0; r < kvx_regions_count(regions); r++) {
        kvx_region_info_t info;
        kvx_status_t status = kvx_regions_get(regions, r, &info);

        if (status != KVX_OK)
            return kvx_failed("reading the table", status);
        if (info.num_blocks < capacity)
            capacity = info.num_blocks;
    }
    *capacity_p = capacity;
    return true;
}

/* Loads the layout text scaled by `scale` and registers it. */
static bool table_register(const char *text, size_t len, uint64_t scale, const char *path,
                           kvx_regions_t **regions_p)
{
    kvx_layout_t *layout = NULL;
    char *scaled         = NULL;
    size_t scaled_len    = len;
    kvx_status_t status;

    if (scale > 1) {
        scaled = layout_text_scale(text, len, scale, &scaled_len);
        if (scaled == NULL)
            return false;
    }
    status = kvx_layout_load_buffer(scaled != NULL ? scaled : text, scaled_len, &layout);
    free(scaled);
    if (status != KVX_OK) {
        fprintf(stderr, "bench_plan: error: loading %s scaled by %" PRIu64 ": %s: %s\n", path,
                scale, kvx_status_str(status), kvx_errmsg());
        return false;
    }
    status = kvx_regions_register(layout, regions_p);
    kvx_layout_destroy(layout);
    if (status != KVX_OK)
        return kvx_failed("registering the layout", status);
    return true;
}

static void table_free(struct bench_table *t)
{
    kvx_peer_plan_destroy(t->plan);
    kvx_regions_destroy(t->regions);
    *t = (struct bench_table){0};
}

/* Registers the model's layout with a capacity of at least BENCH_POOL_FACTOR x `blocks`
 * (scaling the file when its own num_blocks is too small: 128k tokens on Llama are 8,192
 * blocks against the file's 2,048) and plans it once against itself, outside any timing. */
static bool table_build(const char *text, size_t len, const char *path, uint64_t blocks,
                        struct bench_table *t)
{
    uint64_t want = blocks * BENCH_POOL_FACTOR;
    kvx_status_t status;

    t->scale = 1;
    if (!table_register(text, len, 1, path, &t->regions) ||
        !table_capacity(t->regions, &t->capacity))
        goto err_free_table;
    if (t->capacity < want) {
        t->scale = (want + t->capacity - 1) / t->capacity;
        kvx_regions_destroy(t->regions);
        t->regions = NULL;
        if (!table_register(text, len, t->scale, path, &t->regions) ||
            !table_capacity(t->regions, &t->capacity))
            goto err_free_table;
        if (t->capacity < want) {
            fprintf(stderr,
                    "bench_plan: error: %s scaled by %" PRIu64 " holds %" PRIu64
                    " blocks, not the %" PRIu64 " the request needs\n",
                    path, t->scale, t->capacity, want);
            goto err_free_table;
        }
    }
    status = kvx_peer_plan_create(t->regions, t->regions, NULL, &t->plan);
    if (status != KVX_OK) {
        kvx_failed("planning the peer", status);
        goto err_free_table;
    }
    return true;

err_free_table:
    table_free(t);
    return false;
}

/* Fills ids[0..n) for the case: see enum bench_ids. */
static bool ids_build(enum bench_ids kind, uint64_t capacity, uint64_t *ids, size_t n)
{
    uint64_t state = BENCH_SEED ^ capacity ^ n;
    uint32_t *perm;

    if (kind == BENCH_IDS_CONSECUTIVE) {
        for (size_t i = 0; i < n; i++)
            ids[i] = i;
        return true;
    }
    perm = calloc(capacity, sizeof(*perm));
    if (perm == NULL) {
        fprintf(stderr, "bench_plan: error: out of memory drawing block ids\n");
        return false;
    }
    bench_order_shuffle(perm, capacity, &state);
    for (size_t i = 0; i < n; i++)
        ids[i] = perm[i];
    free(perm);
    return true;
}

/* Times kvx_peer_plan_request: BENCH_WARMUPS untimed calls (the first grows `pairs` to the
 * request's size), then `iters` timed calls into the same buffer, each timed on its own. */
static bool bench_measure(const kvx_peer_plan_t *plan, const kvx_request_t *req, kvx_pairs_t *pairs,
                          uint64_t *samples, int iters, struct bench_stats *stats_p)
{
    kvx_status_t status;

    for (int i = 0; i < BENCH_WARMUPS; i++) {
        status = kvx_peer_plan_request(plan, req, pairs);
        if (status != KVX_OK)
            return kvx_failed("kvx_peer_plan_request", status);
    }
    for (int i = 0; i < iters; i++) {
        uint64_t start = clock_ns();

        status     = kvx_peer_plan_request(plan, req, pairs);
        samples[i] = clock_ns() - start;
        if (status != KVX_OK)
            return kvx_failed("kvx_peer_plan_request", status);
    }
    stats_summarise(samples, (size_t)iters, stats_p);
    return true;
}

/* The pairs must be what TP 1 against the same layout gives: one read, regions x blocks
 * descriptors, every byte of them once whatever coalesced. */
static bool pairs_check(const kvx_pairs_t *pairs, const struct bench_case *c)
{
    size_t count;
    const kvx_pair_t *p = kvx_pairs_read(pairs, 0, NULL, &count);
    uint64_t bytes      = 0;

    for (size_t i = 0; p != NULL && i < count; i++)
        bytes += p[i].len;
    if (kvx_pairs_num_reads(pairs) == 1 && c->st.descriptors == c->regions * c->blocks &&
        c->st.coalesced == count && c->st.bytes == bytes)
        return true;
    fprintf(stderr,
            "bench_plan: error: %s: %zu reads, %" PRIu64 " descriptors (expected %zu x %" PRIu64
            "), %" PRIu64 " coalesced with %zu pairs in read 0, %" PRIu64 " bytes of %" PRIu64 "\n",
            c->name, kvx_pairs_num_reads(pairs), c->st.descriptors, c->regions, c->blocks,
            c->st.coalesced, count, bytes, c->st.bytes);
    return false;
}

/* Writes the case's uncoalesced pairs for bench/plan_numpy.py: the same request planned with
 * max_pair_len 1, which merges nothing since kvx never splits a descriptor. Text, one record
 * per line, every number decimal:
 *   kvx_bench_plan_dump 1
 *   case NAME
 *   regions N            then N lines: local storage offset block_len stride num_blocks
 *   remote_regions N     the same for the remote table
 *   ids N                then N lines: a block id (group 0; remote = local)
 *   reads R              then per read: read RANK COUNT, and COUNT lines:
 *                        local_storage remote_storage local_offset remote_offset len */
static bool pairs_dump(const char *path, const struct bench_case *c, const kvx_regions_t *regions,
                       const kvx_request_t *req, kvx_pairs_t *pairs)
{
    const kvx_peer_plan_params_t params = {.field_mask   = KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN,
                                           .max_pair_len = 1};
    kvx_peer_plan_t *plan               = NULL;
    FILE *f                             = NULL;
    kvx_status_t status;
    bool ok = false;

    status = kvx_peer_plan_create(regions, regions, &params, &plan);
    if (status == KVX_OK)
        status = kvx_peer_plan_request(plan, req, pairs);
    if (status != KVX_OK) {
        kvx_failed("planning the dump", status);
        goto out;
    }
    f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "bench_plan: error: %s: %s\n", path, strerror(errno));
        goto out;
    }
    fprintf(f, "kvx_bench_plan_dump 1\ncase %s\n", c->name);
    for (int side = 0; side < 2; side++) {
        fprintf(f, "%s %zu\n", side == 0 ? "regions" : "remote_regions", c->regions);
        for (size_t r = 0; r < c->regions; r++) {
            kvx_region_info_t info;

            status = kvx_regions_get(regions, r, &info);
            if (status != KVX_OK) {
                kvx_failed("reading the table", status);
                goto out;
            }
            fprintf(f, "%zu %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", info.storage,
                    info.offset, info.block_len, info.stride, info.num_blocks);
        }
    }
    fprintf(f, "ids %zu\n", req->local[0].count);
    for (size_t i = 0; i < req->local[0].count; i++)
        fprintf(f, "%" PRIu64 "\n", req->local[0].ids[i]);
    fprintf(f, "reads %zu\n", kvx_pairs_num_reads(pairs));
    for (size_t j = 0; j < kvx_pairs_num_reads(pairs); j++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, j, &rank, &count);

        fprintf(f, "read %" PRIu32 " %zu\n", rank, count);
        for (size_t i = 0; i < count; i++)
            fprintf(f, "%" PRIu32 " %" PRIu32 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
                    p[i].local_storage, p[i].remote_storage, p[i].local_offset, p[i].remote_offset,
                    p[i].len);
    }
    ok = true;
out:
    if (f != NULL && fclose(f) != 0 && ok) {
        fprintf(stderr, "bench_plan: error: %s: %s\n", path, strerror(errno));
        ok = false;
    }
    kvx_peer_plan_destroy(plan);
    return ok;
}

static void case_name(struct bench_case *c)
{
    snprintf(c->name, sizeof(c->name), "%s/%" PRIu64 "k/%s", c->model, c->tokens / 1024,
             bench_ids_names[c->ids]);
}

static bool case_selected(const struct bench_args *a, const struct bench_case *c)
{
    return a->only == NULL || strcmp(a->only, c->name) == 0;
}

/* Runs the selected cases of one model at one request size into cases[*num_cases_p...]. */
static bool bench_model_tokens(const struct bench_args *a, const char *model, uint64_t tokens,
                               const char *text, size_t len, const char *path, kvx_pairs_t *pairs,
                               uint64_t *samples, struct bench_case *cases, size_t *num_cases_p)
{
    struct bench_table t = {0};
    uint64_t *ids        = NULL;
    bool selected        = false;
    bool ok              = false;
    uint64_t block_size;
    uint64_t blocks;

    for (int k = 0; k < BENCH_NUM_IDS; k++) {
        struct bench_case probe = {.model = model, .tokens = tokens, .ids = (enum bench_ids)k};

        case_name(&probe);
        selected |= case_selected(a, &probe);
    }
    if (!selected)
        return true;
    if (!table_register(text, len, 1, path, &t.regions))
        return false;
    block_size = kvx_regions_block_size(t.regions);
    kvx_regions_destroy(t.regions);
    t.regions = NULL;
    if (tokens % block_size != 0) {
        fprintf(stderr,
                "bench_plan: error: %s: %" PRIu64 " tokens are not whole blocks of %" PRIu64 "\n",
                path, tokens, block_size);
        return false;
    }
    blocks = tokens / block_size;
    if (!table_build(text, len, path, blocks, &t))
        return false;
    ids = calloc(blocks, sizeof(*ids));
    if (ids == NULL) {
        fprintf(stderr, "bench_plan: error: out of memory for block ids\n");
        goto out;
    }
    for (int k = 0; k < BENCH_NUM_IDS; k++) {
        struct bench_case *c        = &cases[*num_cases_p];
        const kvx_group_ids_t group = {.ids = ids, .count = blocks};
        const kvx_request_t req     = {.local = &group, .num_local_groups = 1};

        *c = (struct bench_case){.model      = model,
                                 .tokens     = tokens,
                                 .ids        = (enum bench_ids)k,
                                 .block_size = block_size,
                                 .blocks     = blocks,
                                 .num_blocks = t.capacity,
                                 .scale      = t.scale,
                                 .regions    = kvx_regions_count(t.regions)};
        case_name(c);
        if (!case_selected(a, c))
            continue;
        if (!ids_build(c->ids, t.capacity, ids, blocks) ||
            !bench_measure(t.plan, &req, pairs, samples, a->iters, &c->time))
            goto out;
        kvx_pairs_stats(pairs, &c->st);
        if (!pairs_check(pairs, c))
            goto out;
        if (a->dump != NULL && !pairs_dump(a->dump, c, t.regions, &req, pairs))
            goto out;
        (*num_cases_p)++;
    }
    ok = true;
out:
    free(ids);
    table_free(&t);
    return ok;
}

/* The median cost of reading CLOCK_MONOTONIC, which every sample includes once. */
static double clock_overhead_ns(void)
{
    uint64_t samples[1001];

    for (size_t i = 0; i < 1001; i++) {
        uint64_t start = clock_ns();

        samples[i] = clock_ns() - start;
    }
    qsort(samples, 1001, sizeof(*samples), stats_compare);
    return (double)samples[500];
}

/* Descriptors (before coalescing) per second at the median. */
static double pairs_per_s(const struct bench_case *c)
{
    return c->time.median > 0 ? c->st.descriptors / (c->time.median * 1e-6) : 0;
}

static void report_json(const struct bench_args *a, const struct bench_case *cases, size_t n)
{
    char cpu[256];
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);

    cpu_model_read(cpu, sizeof(cpu));
    printf("{\"bench\": \"plan\",\n \"machine\": {\"nproc\": %ld, \"cpu\": ", nproc);
    json_string_print(cpu);
    printf(", \"note\": \"%ld noisy cores: compare medians\"},\n", nproc);
    printf(" \"warmups\": %d, \"iters\": %d, \"unit\": \"us\", \"clock_overhead_ns\": %.0f,\n"
           " \"cases\": [",
           BENCH_WARMUPS, a->iters, clock_overhead_ns());
    for (size_t i = 0; i < n; i++) {
        const struct bench_case *c = &cases[i];

        printf("%s\n  {\"case\": \"%s\", \"model\": \"%s\", \"tokens\": %" PRIu64
               ", \"ids\": \"%s\", \"block_size\": %" PRIu64 ", \"blocks\": %" PRIu64
               ", \"num_blocks\": %" PRIu64 ", \"scale\": %" PRIu64 ", \"regions\": %zu,\n"
               "   \"plan_request\": {\"median\": %.2f, \"min\": %.2f, \"p90\": %.2f,"
               " \"max\": %.2f},\n   \"descriptors\": %" PRIu64 ", \"coalesced\": %" PRIu64
               ", \"bytes\": %" PRIu64 ", \"pairs_per_s\": %.0f}",
               i > 0 ? "," : "", c->name, c->model, c->tokens, bench_ids_names[c->ids],
               c->block_size, c->blocks, c->num_blocks, c->scale, c->regions, c->time.median,
               c->time.min, c->time.p90, c->time.max, c->st.descriptors, c->st.coalesced,
               c->st.bytes, pairs_per_s(c));
    }
    printf("]}\n");
}

static void report_text(const struct bench_args *a, const struct bench_case *cases, size_t n)
{
    char cpu[256];
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);

    cpu_model_read(cpu, sizeof(cpu));
    printf("kvx_peer_plan_request, TP 1, local = remote = the same layout file (pairs are"
           " identity)\n");
    printf("machine: nproc %ld, %s; %ld noisy cores, so read the medians\n", nproc, cpu, nproc);
    printf("runs: %d warm-ups, then %d timed runs per case (CLOCK_MONOTONIC, read in %.0f ns);"
           " plan built once per case, pairs buffer reused\n\n",
           BENCH_WARMUPS, a->iters, clock_overhead_ns());
    printf("%-34s %6s %7s %8s %9s %9s %9s %9s %9s\n", "case", "blocks", "table", "descr",
           "coalesced", "median", "min", "p90", "Mpairs/s");
    printf("%-34s %6s %7s %8s %9s %9s %9s %9s %9s\n", "", "", "blocks", "", "", "us", "us", "us",
           "");
    for (size_t i = 0; i < n; i++) {
        const struct bench_case *c = &cases[i];

        printf("%-34s %6" PRIu64 " %7" PRIu64 " %8" PRIu64 " %9" PRIu64 " %9.2f %9.2f %9.2f"
               " %9.1f\n",
               c->name, c->blocks, c->num_blocks, c->st.descriptors, c->st.coalesced,
               c->time.median, c->time.min, c->time.p90, pairs_per_s(c) / 1e6);
    }
    printf("\ndescr: pairs before coalescing (regions x blocks); coalesced: pairs posted."
           " table blocks: capacity\nof the planned layout (the file's num_blocks and storage"
           " sizes scaled up where the request needs\nmore than half of it). Scattered ids:"
           " distinct, random, in random order; consecutive: 0..n-1.\n");
}

static const char usage[] =
    "usage: bench_plan [--iters N] [--case NAME] [--dump FILE] [--layouts DIR] [--json]\n"
    "                  [--list]\n"
    "\n"
    "Times kvx_peer_plan_request (docs/performance.md \"Planning\"): the Llama-3-8B and\n"
    "DeepSeek-V4-Flash layout files, each planned against itself at TP 1, for 1k, 16k and 128k\n"
    "tokens with scattered and with consecutive block ids. The plan is built once per case;\n"
    "each case then gets 5 untimed warm-ups and N timed calls into one reused pair buffer.\n"
    "\n"
    "  --iters N      timed calls per case, 1..100000 (default 200)\n"
    "  --case NAME    run only this case (see --list)\n"
    "  --dump FILE    with --case: write its uncoalesced pairs (max_pair_len 1) to FILE,\n"
    "                 for bench/plan_numpy.py\n"
    "  --layouts DIR  where llama3-8b.json and deepseek-v4-flash.json are\n"
    "                 (default " BENCH_LAYOUTS_DIR ")\n"
    "  --json         print one JSON object instead of the table\n"
    "  --list         print the case names, one a line\n"
    "  --help         show this text\n";

/* Parses the command line; false (after a message) on a bad argument. */
static bool args_parse(int argc, char **argv, struct bench_args *a)
{
    for (int i = 1; i < argc; i++) {
        bool has_value = i + 1 < argc;

        if (strcmp(argv[i], "--json") == 0) {
            a->json = true;
        } else if (strcmp(argv[i], "--list") == 0) {
            a->list = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            a->help = true;
        } else if (strcmp(argv[i], "--case") == 0 && has_value) {
            a->only = argv[++i];
        } else if (strcmp(argv[i], "--dump") == 0 && has_value) {
            a->dump = argv[++i];
        } else if (strcmp(argv[i], "--layouts") == 0 && has_value) {
            a->layouts = argv[++i];
        } else if (strcmp(argv[i], "--iters") == 0 && has_value) {
            char *end;
            long n;

            errno = 0;
            n     = strtol(argv[++i], &end, 10);
            if (errno != 0 || end == argv[i] || *end != '\0' || n < 1 || n > BENCH_MAX_ITERS) {
                fprintf(stderr, "bench_plan: error: --iters: %s is not a count in 1..%d\n", argv[i],
                        BENCH_MAX_ITERS);
                return false;
            }
            a->iters = (int)n;
        } else {
            fprintf(stderr, "bench_plan: error: unknown argument %s\n\n%s", argv[i], usage);
            return false;
        }
    }
    if (a->dump != NULL && a->only == NULL) {
        fprintf(stderr, "bench_plan: error: --dump needs --case: it writes one case\n");
        return false;
    }
    return true;
}

int main(int argc, char **argv)
{
    enum { max_cases = BENCH_NUM_MODELS * BENCH_NUM_TOKENS * BENCH_NUM_IDS };
    struct bench_args args = {.layouts = BENCH_LAYOUTS_DIR, .iters = BENCH_DEFAULT_ITERS};
    struct bench_case cases[max_cases];
    size_t num_cases   = 0;
    kvx_pairs_t *pairs = NULL;
    uint64_t *samples  = NULL;
    kvx_status_t status;
    int ret = 1;

    if (!args_parse(argc, argv, &args))
        return 2;
    if (args.help) {
        fputs(usage, stdout);
        return 0;
    }
    if (args.list) {
        for (size_t m = 0; m < BENCH_NUM_MODELS; m++) {
            for (size_t t = 0; t < BENCH_NUM_TOKENS; t++) {
                for (int k = 0; k < BENCH_NUM_IDS; k++) {
                    struct bench_case c = {
                        .model = bench_models[m], .tokens = bench_tokens[t], .ids = k};

                    case_name(&c);
                    puts(c.name);
                }
            }
        }
        return 0;
    }

    samples = calloc((size_t)args.iters, sizeof(*samples));
    status  = kvx_pairs_create(&pairs);
    if (status != KVX_OK) {
        kvx_failed("kvx_pairs_create", status);
        goto out;
    }
    if (samples == NULL) {
        fprintf(stderr, "bench_plan: error: out of memory for the samples\n");
        goto out;
    }
    for (size_t m = 0; m < BENCH_NUM_MODELS; m++) {
        char path[4096];
        char *text;
        size_t len;
        bool ok = true;

        snprintf(path, sizeof(path), "%s/%s.json", args.layouts, bench_models[m]);
        text = file_read(path, &len);
        if (text == NULL)
            goto out;
        for (size_t t = 0; ok && t < BENCH_NUM_TOKENS; t++)
            ok = bench_model_tokens(&args, bench_models[m], bench_tokens[t], text, len, path, pairs,
                                    samples, cases, &num_cases);
        free(text);
        if (!ok)
            goto out;
    }
    if (num_cases == 0) {
        fprintf(stderr, "bench_plan: error: --case %s: no such case (see --list)\n", args.only);
        goto out;
    }
    if (args.json)
        report_json(&args, cases, num_cases);
    else
        report_text(&args, cases, num_cases);
    ret = 0;

out:
    kvx_pairs_destroy(pairs);
    free(samples);
    return ret;
}

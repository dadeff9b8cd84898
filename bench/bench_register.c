/* bench_register.c: times kvx_regions_register on a generated 1,265-view layout shaped like a
 * large production model, plus loading that layout from JSON and one 1,024-block request.
 * Uses only kvx.h; run by hand (`make bench`), never by ctest (STYLE.md 6). */
#include "kvx.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The generated layout (docs/performance.md "Registration"). Every view has BENCH_NUM_BLOCKS
 * blocks; the five families below exercise every path of regions.md steps 2 and 3. */
#define BENCH_NUM_BLOCKS 4096   /* blocks per view */
#define BENCH_SHARED_TENSORS 400 /* (1)+(3): per-layer attn storages, each aliased by group 1 */
#define BENCH_MLA_LAYERS 125    /* (1): per-layer MLA storages, one view each */
#define BENCH_SLABS 4           /* (2): packed block-major slabs */
#define BENCH_SLAB_LAYERS 76    /* (2): padded swa_mla views side by side in one slab row */
#define BENCH_SLAB_SCRATCH 5    /* (4): compressor states at offset 0 of each slab row */
#define BENCH_CSA_LAYERS 8      /* (5): dense swa_mla + shorter ring at one base: 2 regions */

#define BENCH_NUM_STORAGES \
    (BENCH_SHARED_TENSORS + BENCH_MLA_LAYERS + BENCH_SLABS + BENCH_CSA_LAYERS)
#define BENCH_NUM_VIEWS                                                                    \
    (2 * BENCH_SHARED_TENSORS + BENCH_MLA_LAYERS +                                         \
     BENCH_SLABS * (BENCH_SLAB_LAYERS + BENCH_SLAB_SCRATCH) + 2 * BENCH_CSA_LAYERS)
/* What regions.md makes of it: one region per shared tensor, per MLA layer and per slab,
 * two per csa layer. Checked after registration so the bench never measures another shape. */
#define BENCH_EXPECT_REGIONS \
    (BENCH_SHARED_TENSORS + BENCH_MLA_LAYERS + BENCH_SLABS + 2 * BENCH_CSA_LAYERS)
#define BENCH_EXPECT_PACKED_ROWS BENCH_SLABS
#define BENCH_EXPECT_SHARED (BENCH_SHARED_TENSORS + BENCH_SLABS)

_Static_assert(BENCH_NUM_VIEWS == 1265, "the bench models a 1,265-view layout");

#define BENCH_ATTN_PAGE 16384   /* bytes: 16 tokens x 2 heads x 128 dims x (K,V) x 2 B */
#define BENCH_ATTN_HEADS 2
#define BENCH_MLA_PAGE 36864    /* bytes: 32 tokens x 576 latent dims x 2 B */
#define BENCH_SLAB_PAGE 37440   /* bytes: 37,376 B of data padded to 37,440 (dense false) */
#define BENCH_SLAB_TAIL 4096    /* bytes after the last slab row, shorter than one row */
#define BENCH_SCRATCH_PAGE 32768 /* bytes of the first compressor state; later ones shrink */
#define BENCH_SCRATCH_STEP 4096
#define BENCH_CSA_PAGE 19008    /* bytes of a dense csa swa_mla page */
#define BENCH_CSA_RING_PAGE 8192 /* bytes of its compressor ring, same base, same stride */
#define BENCH_NUM_GROUPS 3      /* 0 full attention / MLA, 1 sliding window, 2 compressor */

#define BENCH_REQUEST_BLOCKS 1024 /* block ids each group names in the timed request */
#define BENCH_WARMUPS 5
#define BENCH_DEFAULT_ITERS 200
#define BENCH_MAX_ITERS 100000  /* keeps one run of the bench under a few minutes */
#define BENCH_GOAL_US 1000.0    /* registration goal: under 1 ms */
#define BENCH_SEED UINT64_C(0x6b76782d62656e63) /* fixed, so every run shuffles alike */
#define BENCH_NAME_LEN 64       /* bytes, terminator included; generated names are shorter */

struct bench_storage {
    char name[BENCH_NAME_LEN];
    uint64_t size; /* bytes */
};

struct bench_view {
    char name[BENCH_NAME_LEN];
    kvx_view_kind_t kind;
    uint32_t storage; /* index into bench_layout.storages */
    int64_t group;
    uint64_t offset;  /* bytes from the storage start to block 0 */
    uint64_t page;    /* bytes */
    uint64_t stride;  /* bytes */
    uint64_t heads;
    bool dense;
};

/* The layout as generated, and the shuffled order in which it is handed to kvx. */
struct bench_layout {
    struct bench_storage storages[BENCH_NUM_STORAGES];
    struct bench_view views[BENCH_NUM_VIEWS];
    uint32_t storage_order[BENCH_NUM_STORAGES]; /* input order: storage indices */
    uint32_t view_order[BENCH_NUM_VIEWS];       /* input order: view indices */
    size_t num_storages;
    size_t num_views;
};

/* Summary of one timed loop, in microseconds. */
struct bench_stats {
    double median;
    double min;
    double p90;
    double max;
};

/* What the timed calls read; built once before any timing. */
struct bench_ctx {
    kvx_layout_t *layout;           /* built through the API */
    const char *json;               /* the same layout as a kvx_layout file */
    size_t json_len;                /* bytes */
    const kvx_regions_t *regions;   /* registered once, for the request */
    kvx_group_ids_t groups[BENCH_NUM_GROUPS];
    uint64_t *request_ids;          /* output of the request, sized by a first call */
    size_t num_request_ids;
    uint64_t *samples;              /* ns, one per timed run */
    int iters;
};

typedef kvx_status_t (*bench_once_fn)(struct bench_ctx *ctx, uint64_t *ns_p);

/* A growing text buffer for the JSON layout. */
struct text {
    char *data;
    size_t len;
    size_t cap;
};

static uint64_t prng_next(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15)); /* splitmix64 */

    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Fisher-Yates over order[0..n); the modulo bias is irrelevant for shuffling. */
static void order_shuffle(uint32_t *order, size_t n, uint64_t *state)
{
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j   = (size_t)(prng_next(state) % (i + 1));
        uint32_t t = order[i];

        order[i] = order[j];
        order[j] = t;
    }
}

static uint64_t clock_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/* Adds a storage named by fmt and returns its index. The counts are compile-time constants,
 * so the arrays cannot overflow. */
static uint32_t bench_storage_add(struct bench_layout *bl, uint64_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static uint32_t bench_storage_add(struct bench_layout *bl, uint64_t size, const char *fmt, ...)
{
    struct bench_storage *s = &bl->storages[bl->num_storages];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(s->name, sizeof(s->name), fmt, ap);
    va_end(ap);
    s->size = size;
    return (uint32_t)bl->num_storages++;
}

/* Adds a copy of proto named by fmt. */
static void bench_view_add(struct bench_layout *bl, const struct bench_view *proto,
                           const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void bench_view_add(struct bench_layout *bl, const struct bench_view *proto,
                           const char *fmt, ...)
{
    struct bench_view *v = &bl->views[bl->num_views++];
    va_list ap;

    *v = *proto;
    va_start(ap, fmt);
    vsnprintf(v->name, sizeof(v->name), fmt, ap);
    va_end(ap);
}

/* Generates the five families (see the BENCH_* counts), then shuffles storage and view order
 * so that step 1's natural order has real work: layer numbers of every width arrive mixed.
 * Layer numbers run 0..1236 across the families so every name is distinct. */
static void bench_layout_generate(struct bench_layout *bl)
{
    uint64_t state       = BENCH_SEED;
    uint64_t slab_stride = (uint64_t)BENCH_SLAB_LAYERS * BENCH_SLAB_PAGE;
    unsigned layer       = 0;

    bl->num_storages = 0;
    bl->num_views    = 0;

    /* (1) per-layer attn storages; (3) each is also a group-1 sliding-window layer's cache:
     * an exact alias across groups (regions.md 3.1), so the region's group is -1. */
    for (unsigned t = 0; t < BENCH_SHARED_TENSORS; t++) {
        struct bench_view v = {
            .kind   = KVX_VIEW_KIND_ATTN,
            .group  = 0,
            .page   = BENCH_ATTN_PAGE,
            .stride = BENCH_ATTN_PAGE,
            .heads  = BENCH_ATTN_HEADS,
            .dense  = true,
        };

        v.storage = bench_storage_add(bl, (uint64_t)BENCH_NUM_BLOCKS * BENCH_ATTN_PAGE,
                                      "kv_cache.shared.%u", t);
        bench_view_add(bl, &v, "layers.%u.self_attn.attn", layer + t);
        v.kind  = KVX_VIEW_KIND_SWA;
        v.group = 1;
        bench_view_add(bl, &v, "layers.%u.self_attn.swa", layer + BENCH_SHARED_TENSORS + t);
    }
    layer += 2 * BENCH_SHARED_TENSORS;

    /* (1) per-layer MLA storages: dense, so not whole rows; one region each. */
    for (unsigned m = 0; m < BENCH_MLA_LAYERS; m++, layer++) {
        struct bench_view v = {
            .kind   = KVX_VIEW_KIND_MLA,
            .group  = 0,
            .page   = BENCH_MLA_PAGE,
            .stride = BENCH_MLA_PAGE,
            .heads  = 1,
            .dense  = true,
        };

        v.storage = bench_storage_add(bl, (uint64_t)BENCH_NUM_BLOCKS * BENCH_MLA_PAGE,
                                      "kv_cache.mla.%u", m);
        bench_view_add(bl, &v, "layers.%u.self_attn.mla_cache", layer);
    }

    /* (2) packed block-major slabs: padded swa_mla views at row offsets are whole rows
     * (csa_linear false) and fold into one packed_row region per slab; a tail shorter than
     * a row is tolerated. (4) compressor states at offset 0 of the row are shorter, not MLA,
     * same stride and blocks: they join the packed row (regions.md 3.2). */
    for (unsigned s = 0; s < BENCH_SLABS; s++) {
        uint32_t storage = bench_storage_add(
            bl, (uint64_t)BENCH_NUM_BLOCKS * slab_stride + BENCH_SLAB_TAIL, "kv_cache.swa_slab.%u",
            s);
        unsigned first_layer = layer;

        for (unsigned k = 0; k < BENCH_SLAB_LAYERS; k++, layer++) {
            struct bench_view v = {
                .kind    = KVX_VIEW_KIND_SWA_MLA,
                .storage = storage,
                .group   = 1,
                .offset  = (uint64_t)k * BENCH_SLAB_PAGE,
                .page    = BENCH_SLAB_PAGE,
                .stride  = slab_stride,
                .heads   = 1,
                .dense   = false,
            };

            bench_view_add(bl, &v, "layers.%u.attn.swa_cache", layer);
        }
        for (unsigned c = 0; c < BENCH_SLAB_SCRATCH; c++) {
            struct bench_view v = {
                .kind    = KVX_VIEW_KIND_SCRATCH,
                .storage = storage,
                .group   = 2,
                .offset  = 0,
                .page    = BENCH_SCRATCH_PAGE - (uint64_t)c * BENCH_SCRATCH_STEP,
                .stride  = slab_stride,
                .heads   = 1,
                .dense   = true,
            };

            bench_view_add(bl, &v, "layers.%u.attn.compressor.state_cache", first_layer + c);
        }
    }

    /* (5) csa-style layers: a dense swa_mla view is not a whole row, so the shorter ring at
     * its base stays a region of its own (regions.md example 2). */
    for (unsigned x = 0; x < BENCH_CSA_LAYERS; x++, layer++) {
        struct bench_view v = {
            .kind   = KVX_VIEW_KIND_SWA_MLA,
            .group  = 1,
            .page   = BENCH_CSA_PAGE,
            .stride = BENCH_CSA_PAGE,
            .heads  = 1,
            .dense  = true,
        };

        v.storage = bench_storage_add(bl, (uint64_t)BENCH_NUM_BLOCKS * BENCH_CSA_PAGE,
                                      "kv_cache.csa.%u", x);
        bench_view_add(bl, &v, "layers.%u.attn.csa.swa_cache", layer);
        v.kind  = KVX_VIEW_KIND_SCRATCH;
        v.group = 2;
        v.page  = BENCH_CSA_RING_PAGE;
        bench_view_add(bl, &v, "layers.%u.attn.csa.compressor.ring", layer);
    }

    order_shuffle(bl->storage_order, bl->num_storages, &state);
    order_shuffle(bl->view_order, bl->num_views, &state);
}

/* Layout-wide flags: csa_linear false so padded views in block-major storages are whole
 * rows (regions.md step 2; with it true, only whole_row_regions could make rows, and then
 * the csa rings would fold too). */
static const kvx_layout_params_t bench_layout_params = {
    .field_mask = KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE | KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR |
                  KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS,
    .block_size        = 16,
    .csa_linear        = false,
    .whole_row_regions = false,
};

/* Builds the layout through kvx_layout_create/add_storage/add_view, in shuffled order. */
static kvx_status_t bench_layout_build(const struct bench_layout *bl, kvx_layout_t **layout_p)
{
    kvx_layout_t *layout = NULL;
    kvx_status_t status  = kvx_layout_create(&bench_layout_params, &layout);

    if (status != KVX_OK)
        return status;
    for (size_t i = 0; i < bl->num_storages; i++) {
        const struct bench_storage *s = &bl->storages[bl->storage_order[i]];
        kvx_storage_params_t params   = {
              .field_mask = KVX_STORAGE_PARAM_FIELD_MEM | KVX_STORAGE_PARAM_FIELD_DEVICE,
              .name       = s->name,
              .size       = s->size,
              .mem        = KVX_MEM_VRAM,
              .device     = 0,
        };

        status = kvx_layout_add_storage(layout, &params);
        if (status != KVX_OK)
            goto err_destroy_layout;
    }
    for (size_t i = 0; i < bl->num_views; i++) {
        const struct bench_view *v = &bl->views[bl->view_order[i]];
        kvx_view_params_t params   = {
              .field_mask = KVX_VIEW_PARAM_FIELD_GROUP | KVX_VIEW_PARAM_FIELD_OFFSET |
                          KVX_VIEW_PARAM_FIELD_DENSE | KVX_VIEW_PARAM_FIELD_HEADS,
              .name       = v->name,
              .kind       = v->kind,
              .storage    = bl->storages[v->storage].name,
              .page       = v->page,
              .stride     = v->stride,
              .num_blocks = BENCH_NUM_BLOCKS,
              .group      = v->group,
              .offset     = v->offset,
              .dense      = v->dense,
              .heads      = v->heads,
        };

        status = kvx_layout_add_view(layout, &params);
        if (status != KVX_OK)
            goto err_destroy_layout;
    }
    status = kvx_layout_validate(layout);
    if (status != KVX_OK)
        goto err_destroy_layout;
    *layout_p = layout;
    return KVX_OK;

err_destroy_layout:
    kvx_layout_destroy(layout);
    return status;
}

static bool text_append(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends to t, growing it by doubling; false when out of memory (t then stays valid). */
static bool text_append(struct text *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(t->data == NULL ? NULL : t->data + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0)
        return false;
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = t->cap == 0 ? 4096 : t->cap;
        char *data;

        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        data = realloc(t->data, cap);
        if (data == NULL)
            return false;
        t->data = data;
        t->cap  = cap;
        va_start(ap, fmt);
        vsnprintf(t->data + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
    }
    t->len += (size_t)n;
    return true;
}

/* Writes the same layout, in the same shuffled order, as a kvx_layout file (formats.md).
 * Generated names need no JSON escaping. */
static bool bench_layout_json(const struct bench_layout *bl, struct text *t)
{
    bool ok = text_append(t,
                          "{\n  \"kvx_layout\": 1,\n  \"block_size\": %" PRIu64 ",\n"
                          "  \"csa_linear\": %s,\n  \"whole_row_regions\": %s,\n"
                          "  \"storages\": [\n",
                          bench_layout_params.block_size,
                          bench_layout_params.csa_linear ? "true" : "false",
                          bench_layout_params.whole_row_regions ? "true" : "false");

    for (size_t i = 0; ok && i < bl->num_storages; i++) {
        const struct bench_storage *s = &bl->storages[bl->storage_order[i]];

        ok = text_append(t,
                         "    {\"name\": \"%s\", \"size\": %" PRIu64
                         ", \"mem\": \"%s\", \"device\": 0}%s\n",
                         s->name, s->size, kvx_mem_type_str(KVX_MEM_VRAM),
                         i + 1 < bl->num_storages ? "," : "");
    }
    ok = ok && text_append(t, "  ],\n  \"views\": [\n");
    for (size_t i = 0; ok && i < bl->num_views; i++) {
        const struct bench_view *v = &bl->views[bl->view_order[i]];

        ok = text_append(t,
                         "    {\"name\": \"%s\", \"group\": %" PRId64
                         ", \"kind\": \"%s\", \"storage\": \"%s\", \"offset\": %" PRIu64
                         ", \"page\": %" PRIu64 ", \"stride\": %" PRIu64
                         ", \"num_blocks\": %d, \"dense\": %s, \"heads\": %" PRIu64 "}%s\n",
                         v->name, v->group, kvx_view_kind_str(v->kind),
                         bl->storages[v->storage].name, v->offset, v->page, v->stride,
                         BENCH_NUM_BLOCKS, v->dense ? "true" : "false", v->heads,
                         i + 1 < bl->num_views ? "," : "");
    }
    return ok && text_append(t, "  ]\n}\n");
}

static int stats_compare(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;

    return x < y ? -1 : x > y;
}

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
                                                  ctx->request_ids, ctx->num_request_ids,
                                                  &num_ids);
    uint64_t end        = clock_ns();

    *ns_p = end - start;
    return status;
}

/* The table's shape: regions, packed rows, regions shared by several groups. */
static kvx_status_t regions_shape(const kvx_regions_t *regions, size_t *packed_rows_p,
                                  size_t *shared_p)
{
    size_t packed_rows = 0;
    size_t shared      = 0;

    for (size_t r = 0; r < kvx_regions_count(regions); r++) {
        kvx_region_info_t info;
        kvx_status_t status = kvx_regions_get(regions, r, &info);

        if (status != KVX_OK)
            return status;
        packed_rows += info.packed_row;
        shared += info.group == -1;
    }
    *packed_rows_p = packed_rows;
    *shared_p      = shared;
    return KVX_OK;
}

/* The "model name" of /proc/cpuinfo, or "unknown". */
static void cpu_model_read(char *buf, size_t size)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];

    snprintf(buf, size, "unknown");
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        char *colon = strchr(line, ':');

        if (strncmp(line, "model name", 10) != 0 || colon == NULL)
            continue;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(buf, size, "%s", colon);
        break;
    }
    fclose(f);
}

/* Prints s as a JSON string: quotes, backslashes and control bytes escaped. */
static void json_string_print(const char *s)
{
    putchar('"');
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;

        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
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
    "  --iters N   timed runs per figure, 1..100000 (default 200)\n"
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
            fprintf(stderr, "bench_register: error: unknown argument %s\n\n%s", argv[i],
                    usage);
            return false;
        }
    }
    return true;
}

/* Fills each group's request with BENCH_REQUEST_BLOCKS distinct block ids, shuffled, as a
 * scheduler's block table would give them. */
static bool request_build(struct bench_ctx *ctx, uint64_t *ids_storage)
{
    uint64_t state = BENCH_SEED ^ UINT64_C(0x7265717565737473);
    uint32_t *perm = calloc(BENCH_NUM_BLOCKS, sizeof(*perm));

    if (perm == NULL)
        return false;
    for (size_t g = 0; g < BENCH_NUM_GROUPS; g++) {
        uint64_t *ids = &ids_storage[g * BENCH_REQUEST_BLOCKS];

        order_shuffle(perm, BENCH_NUM_BLOCKS, &state);
        for (size_t i = 0; i < BENCH_REQUEST_BLOCKS; i++)
            ids[i] = perm[i];
        ctx->groups[g] = (kvx_group_ids_t){ids, BENCH_REQUEST_BLOCKS};
    }
    free(perm);
    return true;
}

int main(int argc, char **argv)
{
    static struct bench_layout bl; /* ~190 KB: kept off the stack */
    static uint64_t block_ids[BENCH_NUM_GROUPS * BENCH_REQUEST_BLOCKS];
    struct bench_ctx ctx      = {.iters = BENCH_DEFAULT_ITERS};
    struct text json          = {0};
    kvx_regions_t *regions    = NULL;
    kvx_regions_t *from_json  = NULL;
    kvx_layout_t *json_layout = NULL;
    char *plan_api            = NULL;
    char *plan_json           = NULL;
    struct bench_stats reg_stats;
    struct bench_stats load_stats;
    struct bench_stats request_stats;
    size_t packed_rows;
    size_t shared;
    bool as_json = false;
    bool help    = false;
    bool goal_met;
    long nproc;
    char cpu[256];
    kvx_status_t status;
    int ret = 1;

    if (!args_parse(argc, argv, &ctx.iters, &as_json, &help))
        return 2;
    if (help) {
        fputs(usage, stdout);
        return 0;
    }

    bench_layout_generate(&bl);
    status = bench_layout_build(&bl, &ctx.layout);
    if (status != KVX_OK)
        goto err_kvx;
    if (!bench_layout_json(&bl, &json)) {
        fprintf(stderr, "bench_register: error: out of memory writing the layout JSON\n");
        goto out;
    }
    ctx.json     = json.data;
    ctx.json_len = json.len;

    /* The JSON and API layouts must give the same table, or the second figure would time a
     * different layout. */
    status = kvx_regions_register(ctx.layout, &regions);
    if (status != KVX_OK)
        goto err_kvx;
    status = kvx_layout_load_buffer(ctx.json, ctx.json_len, &json_layout);
    if (status != KVX_OK)
        goto err_kvx;
    status = kvx_regions_register(json_layout, &from_json);
    if (status != KVX_OK)
        goto err_kvx;
    status = kvx_regions_to_json(regions, &plan_api);
    if (status != KVX_OK)
        goto err_kvx;
    status = kvx_regions_to_json(from_json, &plan_json);
    if (status != KVX_OK)
        goto err_kvx;
    if (strcmp(plan_api, plan_json) != 0) {
        fprintf(stderr, "bench_register: error: the JSON layout registers a different table"
                        " from the API layout\n");
        goto out;
    }
    status = regions_shape(regions, &packed_rows, &shared);
    if (status != KVX_OK)
        goto err_kvx;
    if (kvx_regions_count(regions) != BENCH_EXPECT_REGIONS ||
        packed_rows != BENCH_EXPECT_PACKED_ROWS || shared != BENCH_EXPECT_SHARED) {
        fprintf(stderr,
                "bench_register: error: the generated layout registered %zu regions (%zu"
                " packed_row, %zu shared); the bench expects %d (%d packed_row, %d shared)\n",
                kvx_regions_count(regions), packed_rows, shared, BENCH_EXPECT_REGIONS,
                BENCH_EXPECT_PACKED_ROWS, BENCH_EXPECT_SHARED);
        goto out;
    }

    ctx.regions = regions;
    if (!request_build(&ctx, block_ids)) {
        fprintf(stderr, "bench_register: error: out of memory building the request\n");
        goto out;
    }
    status = kvx_regions_request_ids(regions, ctx.groups, BENCH_NUM_GROUPS, NULL, 0,
                                     &ctx.num_request_ids);
    if (status != KVX_OK)
        goto err_kvx;
    ctx.request_ids = calloc(ctx.num_request_ids, sizeof(*ctx.request_ids));
    ctx.samples     = calloc((size_t)ctx.iters, sizeof(*ctx.samples));
    if (ctx.request_ids == NULL || ctx.samples == NULL) {
        fprintf(stderr, "bench_register: error: out of memory for the samples\n");
        goto out;
    }

    status = bench_measure(&ctx, register_once, &reg_stats);
    if (status == KVX_OK)
        status = bench_measure(&ctx, load_json_once, &load_stats);
    if (status == KVX_OK)
        status = bench_measure(&ctx, request_once, &request_stats);
    if (status != KVX_OK)
        goto err_kvx;

    nproc = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_model_read(cpu, sizeof(cpu));
    goal_met = reg_stats.median < BENCH_GOAL_US;

    if (as_json) {
        printf("{\"bench\": \"register\", \"layout\": {\"views\": %zu, \"storages\": %zu,"
               " \"regions\": %zu, \"packed_row_regions\": %zu, \"shared_regions\": %zu,"
               " \"descriptors\": %" PRIu64 ", \"num_blocks\": %d, \"csa_linear\": %s,"
               " \"whole_row_regions\": %s, \"json_bytes\": %zu},\n",
               kvx_layout_num_views(ctx.layout), kvx_layout_num_storages(ctx.layout),
               kvx_regions_count(regions), packed_rows, shared,
               kvx_regions_num_descriptors(regions), BENCH_NUM_BLOCKS,
               bench_layout_params.csa_linear ? "true" : "false",
               bench_layout_params.whole_row_regions ? "true" : "false", ctx.json_len);
        printf(" \"machine\": {\"nproc\": %ld, \"cpu\": ", nproc);
        json_string_print(cpu);
        printf(", \"note\": \"%ld noisy shared cores: compare medians\"},\n", nproc);
        printf(" \"warmups\": %d, \"iters\": %d, \"unit\": \"us\",\n", BENCH_WARMUPS,
               ctx.iters);
        printf(" \"request\": {\"groups\": %d, \"blocks_per_group\": %d, \"ids\": %zu},\n",
               BENCH_NUM_GROUPS, BENCH_REQUEST_BLOCKS, ctx.num_request_ids);
        printf(" ");
        json_stats_print("register", &reg_stats);
        printf(",\n ");
        json_stats_print("load_json", &load_stats);
        printf(",\n ");
        json_stats_print("request_ids", &request_stats);
        printf(",\n \"goal_us\": %.0f, \"goal_met\": %s}\n", BENCH_GOAL_US,
               goal_met ? "true" : "false");
    } else {
        printf("layout: %zu views, %zu storages, %d blocks per view, csa_linear %s,"
               " whole_row_regions %s; input shuffled (fixed seed)\n",
               kvx_layout_num_views(ctx.layout), kvx_layout_num_storages(ctx.layout),
               BENCH_NUM_BLOCKS, bench_layout_params.csa_linear ? "true" : "false",
               bench_layout_params.whole_row_regions ? "true" : "false");
        printf("table: %zu regions (%zu packed_row, %zu shared by several groups),"
               " %" PRIu64 " descriptors\n",
               kvx_regions_count(regions), packed_rows, shared,
               kvx_regions_num_descriptors(regions));
        printf("machine: nproc %ld, %s; %ld noisy shared cores, so read the medians\n", nproc,
               cpu, nproc);
        printf("runs: %d warm-ups, then %d timed runs per figure (CLOCK_MONOTONIC)\n\n",
               BENCH_WARMUPS, ctx.iters);
        printf("%-40s %10s %10s %10s %10s\n", "us", "median", "min", "p90", "max");
        text_stats_print("kvx_regions_register", &reg_stats);
        text_stats_print("kvx_layout_load_buffer", &load_stats);
        text_stats_print("kvx_regions_request_ids", &request_stats);
        printf("\nload_buffer: %zu bytes of JSON; request: %d groups x %d block ids -> %zu"
               " descriptor ids\n",
               ctx.json_len, BENCH_NUM_GROUPS, BENCH_REQUEST_BLOCKS, ctx.num_request_ids);
        printf("goal: < %.0f us: %s (register median %.1f us)\n", BENCH_GOAL_US,
               goal_met ? "met" : "missed", reg_stats.median);
    }
    ret = 0;
    goto out;

err_kvx:
    fprintf(stderr, "bench_register: error: %s: %s\n", kvx_status_str(status), kvx_errmsg());
out:
    free(ctx.samples);
    free(ctx.request_ids);
    kvx_free(plan_json);
    kvx_free(plan_api);
    kvx_regions_destroy(from_json);
    kvx_layout_destroy(json_layout);
    kvx_regions_destroy(regions);
    kvx_layout_destroy(ctx.layout);
    free(json.data);
    return ret;
}

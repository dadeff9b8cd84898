/* test_properties.c: property tests of registration (regions.md steps 1-4, "Descriptors")
 * over seeded generated layouts. Checks with its own bitmaps and model, never kvx's code. */
#include "prng.h"

#include "kvx.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_SEED     0x6b76785f70726f70u /* "kvx_prop": runs are reproducible by default */
#define NUM_LAYOUTS      2000 /* per property: the file runs in 0.5 s, 2.5 s under ASan+UBSan */
#define MAX_STORAGES     3
#define MAX_VIEWS        14
#define MAX_STORAGE_SIZE 4096 /* bytes: keeps the coverage bitmaps cheap */
#define MAX_GROUPS       3    /* group ids 0..MAX_GROUPS-1 */
#define MAX_REQUEST_IDS  5    /* block ids per group in a generated request */
#define NUM_KINDS        7

/* ---------------------------------------------------------------------------------------
 * Generated layouts: plain data the test owns, turned into kvx input by the API or JSON
 * ------------------------------------------------------------------------------------- */

struct gen_storage {
    char name[16];
    uint64_t size; /* bytes */
    kvx_mem_type_t mem;
    int64_t device;
    uint64_t field_mask; /* KVX_STORAGE_PARAM_FIELD_* written */
    uint64_t row_stride; /* bytes: one row of the slab the generator packs views into */
    uint64_t rows;
    uint64_t slot_len; /* bytes: one packed slot of a row */
};

struct gen_view {
    char name[48];
    kvx_view_kind_t kind;
    size_t storage; /* index into gen_layout.storages */
    int64_t group;
    uint64_t offset; /* bytes */
    uint64_t page;   /* bytes */
    uint64_t stride; /* bytes */
    uint64_t num_blocks;
    uint64_t heads;
    bool dense;
    uint64_t field_mask; /* KVX_VIEW_PARAM_FIELD_* written; the others take their default */
};

struct gen_layout {
    uint64_t field_mask; /* KVX_LAYOUT_PARAM_FIELD_* written */
    uint64_t block_size;
    bool csa_linear;
    bool whole_row_regions;
    struct gen_storage storages[MAX_STORAGES];
    size_t num_storages;
    struct gen_view views[MAX_VIEWS];
    size_t num_views;
};

/* What the current check is about, printed when it fails so the run can be repeated. */
static struct {
    uint64_t seed;
    size_t iteration;
    const struct gen_layout *layout;
} run;

static char *layout_to_json(const struct gen_layout *layout, struct prng *p);

static void check_failed(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reports a broken property with the seed, the iteration and the layout, then fails. */
static void check_failed(const char *file, int line, const char *fmt, ...)
{
    char *json = run.layout != NULL ? layout_to_json(run.layout, NULL) : NULL;
    va_list ap;

    fprintf(stderr,
            "property broken at %s:%d: seed 0x%016" PRIx64 " iteration %zu"
            " (rerun with KVX_TEST_SEED=0x%016" PRIx64 ")\n  ",
            file, line, run.seed, run.iteration, run.seed);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  last kvx message (perhaps of an earlier call): %s\n", kvx_errmsg());
    if (json != NULL)
        fprintf(stderr, "layout:\n%s\n", json);
    free(json);
    _fail(file, line);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check_failed(__FILE__, __LINE__, __VA_ARGS__);                                         \
    } while (0)

static bool chance(struct prng *p, unsigned percent)
{
    return prng_range(p, 0, 99) < percent;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

static bool kind_is_mla(kvx_view_kind_t kind)
{
    return kind == KVX_VIEW_KIND_MLA || kind == KVX_VIEW_KIND_SWA_MLA;
}

static kvx_view_kind_t random_kind(struct prng *p, unsigned mla_percent)
{
    static const kvx_view_kind_t others[] = {KVX_VIEW_KIND_ATTN, KVX_VIEW_KIND_SWA,
                                             KVX_VIEW_KIND_SCRATCH, KVX_VIEW_KIND_MAMBA,
                                             KVX_VIEW_KIND_PLE};

    if (chance(p, mla_percent))
        return chance(p, 70) ? KVX_VIEW_KIND_MLA : KVX_VIEW_KIND_SWA_MLA;
    return others[prng_range(p, 0, 4)];
}

/* Names whose natural order (regions.md step 1) differs from strcmp order, with leading
 * zeros whose keys tie (a01, a1), digits against text (runs of one type can only differ in
 * type at a name's start), and repeats: the segments of one layer. */
static void gen_name(struct prng *p, const struct gen_layout *layout, char *name, size_t size)
{
    static const char *const fixed[] = {
        "a01",    "a1",     "a001",        "a1b", "a10", "a2",    "L2",     "L2.swa",
        "L3",     "Lx",     "x",           "x0",  "x00", "x007",  "layer",  "layer0",
        "layerA", "layers", "layers.attn", "x_",  "7",   "10.kv", "2layers"};
    const size_t num_fixed = sizeof(fixed) / sizeof(fixed[0]);
    unsigned layer         = (unsigned)prng_range(p, 0, 20);

    if (layout->num_views > 0 && chance(p, 12)) {
        const char *repeat = layout->views[prng_range(p, 0, layout->num_views - 1)].name;

        memmove(name, repeat, strlen(repeat) + 1); /* names of one size: it fits */
        return;
    }
    switch (prng_range(p, 0, 5)) {
    case 0:
        snprintf(name, size, "layers.%u.attn", layer);
        break;
    case 1:
        snprintf(name, size, "layers.%u.attn.swa_cache", layer);
        break;
    case 2:
        snprintf(name, size, "layers.%u.attn.compressor.state_cache", layer);
        break;
    case 3:
        snprintf(name, size, "model.layers.%02u.ssm", layer);
        break;
    case 4:
        snprintf(name, size, "layers.%u", layer);
        break;
    default:
        snprintf(name, size, "%s", fixed[prng_range(p, 0, num_fixed - 1)]);
        break;
    }
}

/* A storage that is usually a block-major slab of rows, sometimes with a padding tail
 * shorter than a row, sometimes with whole spare rows (not block-major for full views). */
static void gen_storage(struct prng *p, struct gen_storage *s, size_t i)
{
    static const char *const names[] = {"kv", "kv.2", "kv.10"};

    snprintf(s->name, sizeof(s->name), "%s", names[i]);
    s->row_stride = 16 * prng_range(p, 1, 16);
    s->rows       = prng_range(p, 1, min_u64(12, 3072 / s->row_stride));
    s->size       = s->rows * s->row_stride;
    if (chance(p, 40))
        s->size += prng_range(p, 1, s->row_stride - 1);
    if (chance(p, 15))
        s->size += s->row_stride * prng_range(p, 1, 2);
    s->slot_len   = s->row_stride / prng_range(p, 1, 4);
    s->field_mask = 0;
    s->mem        = chance(p, 50) ? KVX_MEM_VRAM : KVX_MEM_DRAM;
    s->device     = (int64_t)prng_range(p, 0, 3);
    if (s->mem != KVX_MEM_DRAM || chance(p, 50))
        s->field_mask |= KVX_STORAGE_PARAM_FIELD_MEM;
    if (s->device != 0 || chance(p, 50))
        s->field_mask |= KVX_STORAGE_PARAM_FIELD_DEVICE;
}

/* Blocks of (offset, page, stride) that fit in storage s; 0 if not even one. */
static uint64_t blocks_that_fit(const struct gen_storage *s, uint64_t offset, uint64_t page,
                                uint64_t stride)
{
    if (offset + page > s->size)
        return 0;
    return (s->size - offset - page) / stride + 1;
}

/* A view in one slot of its storage's rows: the packed-row case. */
static void gen_view_slot(struct prng *p, const struct gen_layout *layout, struct gen_view *v)
{
    const struct gen_storage *s;

    v->storage    = prng_range(p, 0, layout->num_storages - 1);
    s             = &layout->storages[v->storage];
    v->offset     = prng_range(p, 0, s->row_stride / s->slot_len - 1) * s->slot_len;
    v->page       = chance(p, 75) ? s->slot_len : prng_range(p, 1, s->slot_len);
    v->stride     = s->row_stride;
    v->num_blocks = chance(p, 80) ? s->rows : prng_range(p, 1, s->rows);
    v->kind       = random_kind(p, 40);
}

/* A view at the base of an earlier one (regions.md "alias"): an exact-length alias, perhaps
 * MLA with another stride or block count; a shorter or a wider view; or a non-MLA view at
 * offset 0 of a packed row. False if no such view fits. */
static bool gen_view_alias(struct prng *p, const struct gen_layout *layout, struct gen_view *v)
{
    const struct gen_view *u    = &layout->views[prng_range(p, 0, layout->num_views - 1)];
    const struct gen_storage *s = &layout->storages[u->storage];

    v->storage    = u->storage;
    v->offset     = u->offset;
    v->stride     = u->stride;
    v->num_blocks = u->num_blocks;
    switch (prng_range(p, 0, 3)) {
    case 0: /* exact length */
        v->page = u->page;
        v->kind = random_kind(p, 60);
        if (chance(p, 50))
            v->stride = prng_range(p, v->page, 2 * u->stride);
        if (chance(p, 50))
            v->num_blocks = prng_range(p, 1, 16);
        break;
    case 1: /* shorter */
        if (u->page == 1)
            return false;
        v->page = prng_range(p, 1, u->page - 1);
        v->kind = random_kind(p, 30);
        if (chance(p, 20))
            v->num_blocks = prng_range(p, 1, u->num_blocks);
        break;
    case 2: /* wider */
        v->page = prng_range(p, u->page + 1, 2 * u->page + 16);
        v->kind = random_kind(p, 40);
        if (v->page > v->stride || chance(p, 30))
            v->stride = prng_range(p, v->page, 2 * v->page);
        break;
    default: /* at offset 0 of a row, shorter than the row */
        if (s->row_stride < 2)
            return false;
        v->offset     = 0;
        v->page       = prng_range(p, 1, s->row_stride - 1);
        v->stride     = s->row_stride;
        v->num_blocks = s->rows;
        v->kind       = random_kind(p, 20);
        break;
    }
    v->num_blocks = min_u64(v->num_blocks, blocks_that_fit(s, v->offset, v->page, v->stride));
    return v->num_blocks > 0;
}

/* A view anywhere in a storage, with its own stride: no slab structure at all. */
static void gen_view_random(struct prng *p, const struct gen_layout *layout, struct gen_view *v)
{
    const struct gen_storage *s;

    v->storage    = prng_range(p, 0, layout->num_storages - 1);
    s             = &layout->storages[v->storage];
    v->offset     = prng_range(p, 0, s->size - 1);
    v->page       = prng_range(p, 1, min_u64(s->size - v->offset, 256));
    v->stride     = prng_range(p, v->page, v->page + 256);
    v->num_blocks = prng_range(p, 1, blocks_that_fit(s, v->offset, v->page, v->stride));
    v->kind       = random_kind(p, 30);
}

/* The layout of one iteration. Its stream depends only on the seed and the iteration, so a
 * failure is repeated by rerunning with the printed seed. */
static void gen_layout(struct gen_layout *layout, size_t iteration)
{
    struct prng p;
    bool packed_style;
    size_t target;
    int64_t num_groups;

    prng_init(&p, run.seed ^ ((uint64_t)iteration + 1) * 0x9e3779b97f4a7c15u);
    memset(layout, 0, sizeof(*layout));
    packed_style              = chance(&p, 25); /* one storage, one stride: packed_storage */
    layout->csa_linear        = chance(&p, 30);
    layout->whole_row_regions = chance(&p, 30);
    layout->block_size        = prng_range(&p, 1, 128);
    layout->field_mask        = 0;
    if (layout->csa_linear || chance(&p, 40))
        layout->field_mask |= KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR;
    if (layout->whole_row_regions || chance(&p, 40))
        layout->field_mask |= KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS;
    if (chance(&p, 50))
        layout->field_mask |= KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE;
    else
        layout->block_size = 16;

    layout->num_storages = packed_style || chance(&p, 50) ? 1 : prng_range(&p, 2, MAX_STORAGES);
    for (size_t i = 0; i < layout->num_storages; i++)
        gen_storage(&p, &layout->storages[i], i);

    num_groups = (int64_t)prng_range(&p, 1, MAX_GROUPS);
    target     = prng_range(&p, 1, MAX_VIEWS);
    for (size_t attempt = 0; attempt < 4 * MAX_VIEWS && layout->num_views < target; attempt++) {
        struct gen_view *v = &layout->views[layout->num_views];
        uint64_t pick      = prng_range(&p, 0, 99);
        bool ok            = true;

        memset(v, 0, sizeof(*v));
        gen_name(&p, layout, v->name, sizeof(v->name));
        if (layout->num_views > 0 && pick < 40)
            ok = gen_view_alias(&p, layout, v);
        else if (!packed_style && pick >= 85)
            gen_view_random(&p, layout, v);
        else
            gen_view_slot(&p, layout, v);
        if (!ok || (packed_style && v->stride != layout->storages[0].row_stride))
            continue;
        v->group = (int64_t)prng_range(&p, 0, (uint64_t)num_groups - 1);
        v->dense = chance(&p, 50);
        v->heads = chance(&p, 70) ? 1 : prng_range(&p, 2, 8);
        if (v->group != 0 || chance(&p, 50))
            v->field_mask |= KVX_VIEW_PARAM_FIELD_GROUP;
        if (v->offset != 0 || chance(&p, 50))
            v->field_mask |= KVX_VIEW_PARAM_FIELD_OFFSET;
        if (!v->dense || chance(&p, 50))
            v->field_mask |= KVX_VIEW_PARAM_FIELD_DENSE;
        if (v->heads != 1 || chance(&p, 50))
            v->field_mask |= KVX_VIEW_PARAM_FIELD_HEADS;
        layout->num_views++;
    }
}

/* ---------------------------------------------------------------------------------------
 * Two ways in: the API (in any storage and view order) and a layout file (formats.md)
 * ------------------------------------------------------------------------------------- */

/* Builds the layout through kvx_layout_add_*, storages and views in the orders given (NULL:
 * as generated). The generator only makes valid layouts, so every call must succeed. */
static kvx_layout_t *layout_build(const struct gen_layout *layout, const size_t *storage_order,
                                  const size_t *view_order)
{
    kvx_layout_params_t params = {.field_mask        = layout->field_mask,
                                  .block_size        = layout->block_size,
                                  .csa_linear        = layout->csa_linear,
                                  .whole_row_regions = layout->whole_row_regions};
    kvx_layout_t *built        = NULL;
    kvx_status_t status        = kvx_layout_create(&params, &built);

    CHECK(status == KVX_OK, "kvx_layout_create: %s", kvx_status_str(status));
    for (size_t i = 0; i < layout->num_storages; i++) {
        const struct gen_storage *s = &layout->storages[storage_order ? storage_order[i] : i];
        kvx_storage_params_t sp     = {.field_mask = s->field_mask,
                                       .name       = s->name,
                                       .size       = s->size,
                                       .mem        = s->mem,
                                       .device     = s->device};

        status = kvx_layout_add_storage(built, &sp);
        CHECK(status == KVX_OK, "add storage %s: %s", s->name, kvx_errmsg());
    }
    for (size_t i = 0; i < layout->num_views; i++) {
        const struct gen_view *v = &layout->views[view_order ? view_order[i] : i];
        kvx_view_params_t vp     = {.field_mask = v->field_mask,
                                    .name       = v->name,
                                    .kind       = v->kind,
                                    .storage    = layout->storages[v->storage].name,
                                    .page       = v->page,
                                    .stride     = v->stride,
                                    .num_blocks = v->num_blocks,
                                    .group      = v->group,
                                    .offset     = v->offset,
                                    .dense      = v->dense,
                                    .heads      = v->heads};

        status = kvx_layout_add_view(built, &vp);
        CHECK(status == KVX_OK, "add view %s: %s", v->name, kvx_errmsg());
    }
    return built;
}

struct text {
    char *data;
    size_t len;
    size_t cap;
};

static void text_add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void text_add(struct text *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->len + (size_t)n + 1 > t->cap) {
        t->cap  = 2 * (t->len + (size_t)n + 1);
        t->data = realloc(t->data, t->cap);
        if (t->data == NULL)
            abort(); /* the test's own memory, not kvx's */
    }
    va_start(ap, fmt);
    vsnprintf(t->data + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* Writes `count` "key": value members separated by commas, in a shuffled order when p is
 * not NULL: readers must not care about key order. */
static void text_add_members(struct text *t, struct prng *p, char members[][80], size_t count)
{
    size_t order[12];

    for (size_t i = 0; i < count; i++)
        order[i] = i;
    for (size_t i = count; p != NULL && i > 1; i--) {
        size_t j     = prng_range(p, 0, i - 1);
        size_t swap  = order[i - 1];
        order[i - 1] = order[j];
        order[j]     = swap;
    }
    for (size_t i = 0; i < count; i++)
        text_add(t, "%s%s", i > 0 ? ", " : "", members[order[i]]);
}

/* The layout as a file of formats.md, optional keys only where the generator set them.
 * With p, members come in a random order; without, in a fixed one (for failure reports). */
static char *layout_to_json(const struct gen_layout *layout, struct prng *p)
{
    struct text t = {0};
    char members[12][80];
    size_t n = 0;

    text_add(&t, "{\"kvx_layout\": 1");
    if (layout->field_mask & KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE)
        text_add(&t, ", \"block_size\": %" PRIu64, layout->block_size);
    if (layout->field_mask & KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR)
        text_add(&t, ", \"csa_linear\": %s", layout->csa_linear ? "true" : "false");
    if (layout->field_mask & KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS)
        text_add(&t, ", \"whole_row_regions\": %s", layout->whole_row_regions ? "true" : "false");
    text_add(&t, ",\n \"storages\": [");
    for (size_t i = 0; i < layout->num_storages; i++) {
        const struct gen_storage *s = &layout->storages[i];

        n = 0;
        snprintf(members[n++], 80, "\"name\": \"%s\"", s->name);
        snprintf(members[n++], 80, "\"size\": %" PRIu64, s->size);
        if (s->field_mask & KVX_STORAGE_PARAM_FIELD_MEM)
            snprintf(members[n++], 80, "\"mem\": \"%s\"", kvx_mem_type_str(s->mem));
        if (s->field_mask & KVX_STORAGE_PARAM_FIELD_DEVICE)
            snprintf(members[n++], 80, "\"device\": %" PRId64, s->device);
        text_add(&t, "%s\n  {", i > 0 ? "," : "");
        text_add_members(&t, p, members, n);
        text_add(&t, "}");
    }
    text_add(&t, "],\n \"views\": [");
    for (size_t i = 0; i < layout->num_views; i++) {
        const struct gen_view *v = &layout->views[i];

        n = 0;
        snprintf(members[n++], 80, "\"name\": \"%s\"", v->name);
        snprintf(members[n++], 80, "\"kind\": \"%s\"", kvx_view_kind_str(v->kind));
        snprintf(members[n++], 80, "\"storage\": \"%s\"", layout->storages[v->storage].name);
        snprintf(members[n++], 80, "\"page\": %" PRIu64, v->page);
        snprintf(members[n++], 80, "\"stride\": %" PRIu64, v->stride);
        snprintf(members[n++], 80, "\"num_blocks\": %" PRIu64, v->num_blocks);
        if (v->field_mask & KVX_VIEW_PARAM_FIELD_GROUP)
            snprintf(members[n++], 80, "\"group\": %" PRId64, v->group);
        if (v->field_mask & KVX_VIEW_PARAM_FIELD_OFFSET)
            snprintf(members[n++], 80, "\"offset\": %" PRIu64, v->offset);
        if (v->field_mask & KVX_VIEW_PARAM_FIELD_DENSE)
            snprintf(members[n++], 80, "\"dense\": %s", v->dense ? "true" : "false");
        if (v->field_mask & KVX_VIEW_PARAM_FIELD_HEADS)
            snprintf(members[n++], 80, "\"heads\": %" PRIu64, v->heads);
        text_add(&t, "%s\n  {", i > 0 ? "," : "");
        text_add_members(&t, p, members, n);
        text_add(&t, "}");
    }
    text_add(&t, "]}\n");
    return t.data;
}

/* ---------------------------------------------------------------------------------------
 * An independent model of regions.md steps 1-4, written from the text alone
 * ------------------------------------------------------------------------------------- */

struct model_region {
    size_t storage;
    uint64_t offset;    /* bytes: base inside the storage */
    uint64_t block_len; /* bytes */
    uint64_t stride;    /* bytes */
    uint64_t num_blocks;
    uint64_t heads;
    int64_t group;
    bool mla;
    bool packed_row;
    bool scratch;
    bool ssm;
    bool ple;
    size_t members[MAX_VIEWS]; /* view indices; step-1 order once the table is ordered */
    size_t num_members;
    size_t first_position; /* step-1 position of its first member */
};

struct model_table {
    struct model_region regions[MAX_VIEWS]; /* in table order */
    size_t num_regions;
    size_t position[MAX_VIEWS]; /* step-1 position of each view */
    bool proven;                /* step 4's coverage holds */
    size_t uncovered_view;      /* if not: the first member found uncovered... */
    size_t uncovered_region;    /* ...and its region, in table order */
};

/* How often the generated layouts reached each rule; generator_reaches_every_rule reads it. */
static struct {
    unsigned csa_linear;
    unsigned whole_row_regions;
    unsigned packed_storage;
    unsigned several_storages;
    unsigned whole_row_with_tail;
    unsigned whole_row;
    unsigned not_block_major;
    unsigned exact_alias;
    unsigned mla_alias_moves_geometry;
    unsigned shorter_joins_packed_row;
    unsigned shorter_mla_stays_apart;
    unsigned wider_stays_apart;
    unsigned shared_group;
    unsigned coverage_fails;
    unsigned duplicate_names;
    unsigned digits_beat_bytes;
    unsigned digits_before_text;
    unsigned equal_keys;
    unsigned kinds[NUM_KINDS];
} reached;

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Natural order of regions.md step 1, from the text: runs of digits compare by value and
 * before text runs, text runs bytewise, a run-by-run prefix first, ties bytewise. */
static int model_name_compare(const char *a, const char *b)
{
    size_t i = 0;
    size_t j = 0;

    while (a[i] != '\0' && b[j] != '\0') {
        bool da   = is_digit(a[i]);
        bool db   = is_digit(b[j]);
        size_t ea = i;
        size_t eb = j;

        if (da != db) {
            reached.digits_before_text++;
            return da ? -1 : 1;
        }
        while (a[ea] != '\0' && is_digit(a[ea]) == da)
            ea++;
        while (b[eb] != '\0' && is_digit(b[eb]) == db)
            eb++;
        if (da) {
            while (i < ea - 1 && a[i] == '0') /* the value: leading zeros do not count */
                i++;
            while (j < eb - 1 && b[j] == '0')
                j++;
            if (ea - i != eb - j)
                return ea - i < eb - j ? -1 : 1;
        }
        for (; i < ea && j < eb; i++, j++) {
            if (a[i] != b[j])
                return (unsigned char)a[i] < (unsigned char)b[j] ? -1 : 1;
        }
        if (i < ea || j < eb) /* one text run is a prefix of the other */
            return i < ea ? 1 : -1;
    }
    if (a[i] != '\0' || b[j] != '\0')
        return a[i] == '\0' ? -1 : 1;
    if (strcmp(a, b) != 0)
        reached.equal_keys++;
    return strcmp(a, b);
}

/* Step 2's whole_row(v). */
static bool model_is_whole_row(const struct gen_layout *layout, const struct gen_view *v,
                               bool packed_storage)
{
    const struct gen_storage *s = &layout->storages[v->storage];
    bool mla                    = kind_is_mla(v->kind);
    bool block_major =
        v->num_blocks * v->stride <= s->size && s->size - v->num_blocks * v->stride < v->stride;

    if (v->kind == KVX_VIEW_KIND_SCRATCH || v->kind == KVX_VIEW_KIND_MAMBA ||
        v->kind == KVX_VIEW_KIND_PLE)
        return false;
    if (!block_major) {
        reached.not_block_major++;
        return false;
    }
    return (!v->dense && ((packed_storage && mla) || !layout->csa_linear)) ||
           (layout->whole_row_regions && mla);
}

/* A byte map of one storage, for coverage checks that share nothing with kvx's arithmetic. */
static unsigned char byte_map[MAX_STORAGE_SIZE];

/* Marks the blocks [offset + b*stride, + block_len) of a region in byte_map, cleared first.
 * Returns false if a block reaches past the storage's `size` bytes. */
static bool byte_map_mark(uint64_t size, uint64_t offset, uint64_t block_len, uint64_t stride,
                          uint64_t num_blocks)
{
    memset(byte_map, 0, sizeof(byte_map));
    for (uint64_t b = 0; b < num_blocks; b++) {
        uint64_t start = offset + b * stride;

        if (start + block_len > size)
            return false;
        memset(byte_map + start, 1, block_len);
    }
    return true;
}

/* True when every byte of every block of v is marked in byte_map. */
static bool byte_map_covers(const struct gen_view *v)
{
    for (uint64_t b = 0; b < v->num_blocks; b++) {
        if (memchr(byte_map + v->offset + b * v->stride, 0, v->page) != NULL)
            return false;
    }
    return true;
}

/* Steps 3.1-3.3 for one view whose spec is (storage, offset, len, stride, n). */
static void model_fold(const struct gen_layout *layout, struct model_region *created,
                       size_t *num_created, size_t vi, bool whole_row)
{
    const struct gen_view *v = &layout->views[vi];
    bool mla                 = kind_is_mla(v->kind);
    uint64_t offset          = whole_row ? 0 : v->offset;
    uint64_t len             = whole_row ? v->stride : v->page;
    struct model_region *r   = NULL;

    for (size_t i = 0; i < *num_created && r == NULL; i++) { /* 3.1 */
        if (created[i].storage == v->storage && created[i].offset == offset &&
            created[i].block_len == len)
            r = &created[i];
    }
    if (r != NULL) {
        reached.exact_alias++;
        if (mla) {
            if (r->stride != v->stride || r->num_blocks != v->num_blocks)
                reached.mla_alias_moves_geometry++;
            r->stride     = v->stride;
            r->num_blocks = v->num_blocks;
        } else {
            r->heads = v->heads;
        }
        r->packed_row = r->packed_row || whole_row;
    }
    for (size_t i = 0; i < *num_created && r == NULL && !mla; i++) { /* 3.2 */
        if (created[i].storage == v->storage && created[i].offset == offset &&
            created[i].packed_row && len < created[i].block_len && created[i].stride == v->stride &&
            created[i].num_blocks == v->num_blocks) {
            r = &created[i];
            reached.shorter_joins_packed_row++;
        }
    }
    if (r == NULL) { /* 3.3 */
        for (size_t i = 0; i < *num_created; i++) {
            if (created[i].storage == v->storage && created[i].offset == offset) {
                if (len > created[i].block_len)
                    reached.wider_stays_apart++;
                else if (mla)
                    reached.shorter_mla_stays_apart++;
            }
        }
        r  = &created[(*num_created)++];
        *r = (struct model_region){.storage    = v->storage,
                                   .offset     = offset,
                                   .block_len  = len,
                                   .stride     = v->stride,
                                   .num_blocks = v->num_blocks,
                                   .heads      = v->heads,
                                   .group      = v->group,
                                   .packed_row = whole_row};
    }
    r->mla     = r->mla || mla;
    r->scratch = r->scratch || v->kind == KVX_VIEW_KIND_SCRATCH;
    r->ssm     = r->ssm || v->kind == KVX_VIEW_KIND_MAMBA;
    r->ple     = r->ple || v->kind == KVX_VIEW_KIND_PLE;
    if (r->group != v->group)
        r->group = -1;
    r->members[r->num_members++] = vi;
}

/* The whole of regions.md steps 1-4 on plain arrays, quadratic and obvious. */
static void model_register(const struct gen_layout *layout, struct model_table *t)
{
    size_t nv = layout->num_views;
    size_t order[MAX_VIEWS];
    bool whole_row[MAX_VIEWS];
    struct model_region created[MAX_VIEWS];
    size_t num_created  = 0;
    bool packed_storage = !layout->csa_linear;

    memset(t, 0, sizeof(*t));
    for (size_t i = 0; i < nv; i++) { /* step 1: a stable insertion sort */
        size_t j = i;

        while (j > 0 &&
               model_name_compare(layout->views[order[j - 1]].name, layout->views[i].name) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (size_t i = 0; i < nv; i++) {
        t->position[order[i]] = i;
        if (i > 0 && strcmp(layout->views[order[i - 1]].name, layout->views[order[i]].name) > 0)
            reached.digits_beat_bytes++;
        if (i > 0 && strcmp(layout->views[order[i - 1]].name, layout->views[order[i]].name) == 0)
            reached.duplicate_names++;
        reached.kinds[layout->views[i].kind]++;
    }

    for (size_t i = 1; i < nv; i++) { /* step 2 */
        if (layout->views[i].storage != layout->views[0].storage ||
            layout->views[i].stride != layout->views[0].stride)
            packed_storage = false;
    }
    reached.packed_storage += packed_storage;
    reached.csa_linear += layout->csa_linear;
    reached.whole_row_regions += layout->whole_row_regions;
    reached.several_storages += layout->num_storages > 1;
    for (size_t i = 0; i < nv; i++) {
        const struct gen_view *v    = &layout->views[i];
        const struct gen_storage *s = &layout->storages[v->storage];

        whole_row[i] = model_is_whole_row(layout, v, packed_storage);
        reached.whole_row += whole_row[i];
        reached.whole_row_with_tail += whole_row[i] && s->size % v->stride != 0;
    }

    for (int pass = 0; pass < 2; pass++) { /* step 3: pass A whole rows, pass B the rest */
        for (size_t i = 0; i < nv; i++) {
            if (whole_row[order[i]] == (pass == 0))
                model_fold(layout, created, &num_created, order[i], whole_row[order[i]]);
        }
    }

    for (size_t r = 0; r < num_created; r++) { /* step 4: members and regions in step-1 order */
        struct model_region *region = &created[r];

        for (size_t m = 1; m < region->num_members; m++) {
            for (size_t k = m;
                 k > 0 && t->position[region->members[k - 1]] > t->position[region->members[k]];
                 k--) {
                size_t swap            = region->members[k];
                region->members[k]     = region->members[k - 1];
                region->members[k - 1] = swap;
            }
        }
        region->first_position = t->position[region->members[0]];
        reached.shared_group += region->group == -1;
    }
    for (size_t r = 0; r < num_created; r++) {
        size_t k = t->num_regions++;

        while (k > 0 && t->regions[k - 1].first_position > created[r].first_position) {
            t->regions[k] = t->regions[k - 1];
            k--;
        }
        t->regions[k] = created[r];
    }

    t->proven = true;
    for (size_t r = 0; r < t->num_regions && t->proven; r++) {
        const struct model_region *region = &t->regions[r];

        byte_map_mark(layout->storages[region->storage].size, region->offset, region->block_len,
                      region->stride, region->num_blocks);
        for (size_t m = 0; m < region->num_members && t->proven; m++) {
            if (!byte_map_covers(&layout->views[region->members[m]])) {
                t->proven           = false;
                t->uncovered_view   = region->members[m];
                t->uncovered_region = r;
            }
        }
    }
    reached.coverage_fails += !t->proven;
}

/* ---------------------------------------------------------------------------------------
 * Comparing tables
 * ------------------------------------------------------------------------------------- */

static kvx_region_info_t region_get(const kvx_regions_t *table, size_t index)
{
    kvx_region_info_t info;
    kvx_status_t status = kvx_regions_get(table, index, &info);

    CHECK(status == KVX_OK, "kvx_regions_get(%zu): %s", index, kvx_errmsg());
    return info;
}

/* Fails unless a and b hold the same regions field by field. Storages and members compare by
 * name, so tables of reordered input compare equal; with same_indices the indices too. */
static void tables_compare(const kvx_regions_t *a, const kvx_regions_t *b, bool same_indices,
                           const char *what)
{
    CHECK(kvx_regions_count(a) == kvx_regions_count(b), "%s: %zu regions against %zu", what,
          kvx_regions_count(a), kvx_regions_count(b));
    CHECK(kvx_regions_num_descriptors(a) == kvx_regions_num_descriptors(b),
          "%s: %" PRIu64 " descriptors against %" PRIu64, what, kvx_regions_num_descriptors(a),
          kvx_regions_num_descriptors(b));
    for (size_t r = 0; r < kvx_regions_count(a); r++) {
        kvx_region_info_t x = region_get(a, r);
        kvx_region_info_t y = region_get(b, r);

        CHECK(strcmp(x.name, y.name) == 0, "%s: region %zu is %s against %s", what, r, x.name,
              y.name);
        CHECK(strcmp(x.storage_name, y.storage_name) == 0 &&
                  (!same_indices || x.storage == y.storage),
              "%s: region %zu in storage %s against %s", what, r, x.storage_name, y.storage_name);
        CHECK(x.offset == y.offset && x.block_len == y.block_len && x.stride == y.stride &&
                  x.num_blocks == y.num_blocks && x.first_descriptor == y.first_descriptor,
              "%s: region %zu geometry (%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
              ") against (%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 ")",
              what, r, x.offset, x.block_len, x.stride, x.num_blocks, y.offset, y.block_len,
              y.stride, y.num_blocks);
        CHECK(x.group == y.group && x.heads == y.heads && x.mla == y.mla &&
                  x.packed_row == y.packed_row && x.scratch == y.scratch && x.ssm == y.ssm &&
                  x.ple == y.ple,
              "%s: region %zu group, heads or flags differ", what, r);
        CHECK(x.num_members == y.num_members, "%s: region %zu has %zu members against %zu", what, r,
              x.num_members, y.num_members);
        for (size_t m = 0; m < x.num_members; m++) {
            const char *xn = kvx_regions_view_name(a, x.members[m]);
            const char *yn = kvx_regions_view_name(b, y.members[m]);

            CHECK(xn != NULL && yn != NULL && strcmp(xn, yn) == 0 &&
                      (!same_indices || x.members[m] == y.members[m]),
                  "%s: region %zu member %zu is %s against %s", what, r, m, xn, yn);
        }
    }
}

/* Fails unless kvx's table is the model's, field by field. */
static void table_matches_model(const struct gen_layout *layout, const kvx_regions_t *table,
                                const struct model_table *model)
{
    CHECK(kvx_regions_count(table) == model->num_regions, "%zu regions, the model has %zu",
          kvx_regions_count(table), model->num_regions);
    for (size_t r = 0; r < model->num_regions; r++) {
        const struct model_region *m = &model->regions[r];
        kvx_region_info_t x          = region_get(table, r);

        CHECK(strcmp(x.name, layout->views[m->members[0]].name) == 0,
              "region %zu is named %s, the model says %s", r, x.name,
              layout->views[m->members[0]].name);
        CHECK(x.storage == m->storage && x.offset == m->offset && x.block_len == m->block_len &&
                  x.stride == m->stride && x.num_blocks == m->num_blocks,
              "region %zu geometry (%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
              "), the model says (%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 ")",
              r, x.offset, x.block_len, x.stride, x.num_blocks, m->offset, m->block_len, m->stride,
              m->num_blocks);
        CHECK(x.group == m->group, "region %zu group %" PRId64 ", the model says %" PRId64, r,
              x.group, m->group);
        CHECK(x.heads == m->heads, "region %zu heads %" PRIu64 ", the model says %" PRIu64, r,
              x.heads, m->heads);
        CHECK(x.mla == m->mla && x.packed_row == m->packed_row && x.scratch == m->scratch &&
                  x.ssm == m->ssm && x.ple == m->ple,
              "region %zu flags mla %d packed_row %d scratch %d ssm %d ple %d, the model says"
              " %d %d %d %d %d",
              r, x.mla, x.packed_row, x.scratch, x.ssm, x.ple, m->mla, m->packed_row, m->scratch,
              m->ssm, m->ple);
        CHECK(x.num_members == m->num_members, "region %zu has %zu members, the model %zu", r,
              x.num_members, m->num_members);
        for (size_t i = 0; i < m->num_members; i++)
            CHECK(x.members[i] == m->members[i],
                  "region %zu member %zu is view %" PRIu32 ", the model says %zu", r, i,
                  x.members[i], m->members[i]);
    }
}

/* Registers a layout built through the API; *table_p is NULL on failure. */
static kvx_status_t layout_register(const struct gen_layout *layout, const size_t *storage_order,
                                    const size_t *view_order, kvx_regions_t **table_p)
{
    kvx_layout_t *built = layout_build(layout, storage_order, view_order);
    kvx_status_t status;

    *table_p = NULL;
    status   = kvx_regions_register(built, table_p);
    kvx_layout_destroy(built);
    if (status != KVX_OK)
        *table_p = NULL;
    return status;
}

/* Runs `check` on each generated layout, with the context a failure report needs. */
static void for_each_layout(void (*check)(const struct gen_layout *, struct prng *))
{
    static struct gen_layout layout;

    run.seed = prng_seed_from_env(DEFAULT_SEED);
    for (run.iteration = 0; run.iteration < NUM_LAYOUTS; run.iteration++) {
        struct prng p;

        gen_layout(&layout, run.iteration);
        run.layout = &layout;
        prng_init(&p, run.seed ^ ((uint64_t)run.iteration + 1) * 0xbf58476d1ce4e5b9u);
        check(&layout, &p);
    }
    run.layout = NULL;
}

/* ---------------------------------------------------------------------------------------
 * (a) regions.md step 4: a table is returned only if it carries every byte of every view
 * ------------------------------------------------------------------------------------- */

static unsigned num_accepted;
static unsigned num_rejected;

static void check_coverage(const struct gen_layout *layout, struct prng *p)
{
    unsigned membership[MAX_VIEWS] = {0};
    kvx_regions_t *table;
    kvx_status_t status = layout_register(layout, NULL, NULL, &table);

    (void)p;
    if (status != KVX_OK)
        return;
    num_accepted++;
    for (size_t r = 0; r < kvx_regions_count(table); r++) {
        kvx_region_info_t x = region_get(table, r);
        const struct gen_storage *s;

        CHECK(x.storage < layout->num_storages, "region %zu: storage %zu", r, x.storage);
        s = &layout->storages[x.storage];
        CHECK(x.num_members > 0 && x.num_blocks > 0, "region %zu is empty", r);
        CHECK(byte_map_mark(s->size, x.offset, x.block_len, x.stride, x.num_blocks),
              "region %zu (%s) reaches past storage %s of %" PRIu64 " bytes", r, x.name, s->name,
              s->size);
        for (size_t m = 0; m < x.num_members; m++) {
            uint32_t vi = x.members[m];

            CHECK(vi < layout->num_views, "region %zu member %zu: view %" PRIu32, r, m, vi);
            membership[vi]++;
            CHECK(layout->views[vi].storage == x.storage,
                  "views[%" PRIu32 "] (%s) is in another storage than region %zu", vi,
                  layout->views[vi].name, r);
            CHECK(byte_map_covers(&layout->views[vi]),
                  "views[%" PRIu32 "] (%s) has a byte outside region %zu (%s)", vi,
                  layout->views[vi].name, r, x.name);
        }
    }
    for (size_t i = 0; i < layout->num_views; i++)
        CHECK(membership[i] == 1, "views[%zu] (%s) is a member of %u regions", i,
              layout->views[i].name, membership[i]);
    kvx_regions_destroy(table);
}

/* regions.md step 4: every byte of every view lies in a block of the region it belongs to,
 * every view belongs to exactly one region, and no region reaches past its storage. */
static void accepted_tables_cover_every_view_byte(void **state)
{
    (void)state;
    num_accepted = 0;
    for_each_layout(check_coverage);
    CHECK(num_accepted > NUM_LAYOUTS / 2, "only %u of %d layouts registered", num_accepted,
          NUM_LAYOUTS);
}

static void check_rejection(const struct gen_layout *layout, struct prng *p)
{
    struct model_table model;
    kvx_regions_t *table;
    kvx_status_t status = layout_register(layout, NULL, NULL, &table);
    char expected[256];

    (void)p;
    model_register(layout, &model);
    if (status == KVX_OK) {
        CHECK(model.proven,
              "kvx accepted a table whose naive membership leaves views[%zu]"
              " (%s) uncovered",
              model.uncovered_view, layout->views[model.uncovered_view].name);
        kvx_regions_destroy(table);
        return;
    }
    num_rejected++;
    CHECK(status == KVX_ERR_INVALID, "a valid layout failed with %s", kvx_status_str(status));
    CHECK(strstr(kvx_errmsg(), "is not covered by region") != NULL,
          "a valid layout failed, but not in the coverage proof");
    CHECK(!model.proven, "kvx rejected a layout whose naive membership covers every byte");
    snprintf(expected, sizeof(expected), "views[%zu] (%s) is not covered by region %zu (%s)",
             model.uncovered_view, layout->views[model.uncovered_view].name, model.uncovered_region,
             layout->views[model.regions[model.uncovered_region].members[0]].name);
    CHECK(strstr(kvx_errmsg(), expected) != NULL, "the message does not say \"%s\"", expected);
}

/* regions.md step 4: a valid layout is rejected only by the coverage proof, only when the
 * step-3 membership really leaves a byte out, naming the first such view and its region. */
static void rejected_tables_name_a_really_uncovered_view(void **state)
{
    (void)state;
    num_rejected = 0;
    for_each_layout(check_rejection);
    CHECK(num_rejected > 0, "no generated layout failed the coverage proof");
}

static void check_model(const struct gen_layout *layout, struct prng *p)
{
    struct model_table model;
    kvx_regions_t *table;
    kvx_status_t status = layout_register(layout, NULL, NULL, &table);

    (void)p;
    model_register(layout, &model);
    CHECK((status == KVX_OK) == model.proven, "kvx says %s, the model %s", kvx_status_str(status),
          model.proven ? "covers every byte" : "fails the proof");
    if (status == KVX_OK)
        table_matches_model(layout, table, &model);
    kvx_regions_destroy(table);
}

/* regions.md steps 1-4: kvx's table is the one an independent reading of the text gives,
 * region by region: name, geometry, group, heads, flags and members. */
static void tables_match_an_independent_model_of_the_spec(void **state)
{
    (void)state;
    for_each_layout(check_model);
}

/* ---------------------------------------------------------------------------------------
 * (b) regions.md step 1: the table never depends on input order
 * ------------------------------------------------------------------------------------- */

static void order_shuffle(struct prng *p, size_t *order, size_t n)
{
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j     = prng_range(p, 0, i - 1);
        size_t swap  = order[i - 1];
        order[i - 1] = order[j];
        order[j]     = swap;
    }
}

/* Puts views of equal names back in their input order, each in a slot the shuffle gave one of
 * them: step 1 breaks ties of equal names by input order, so only their order may matter. */
static void order_keep_equal_names(const struct gen_layout *layout, size_t *order)
{
    bool placed[MAX_VIEWS] = {false};

    for (size_t i = 0; i < layout->num_views; i++) {
        size_t slots[MAX_VIEWS];
        size_t views[MAX_VIEWS];
        size_t n = 0;

        if (placed[i])
            continue;
        for (size_t k = i; k < layout->num_views; k++) {
            if (strcmp(layout->views[order[k]].name, layout->views[order[i]].name) == 0) {
                slots[n]   = k;
                views[n++] = order[k];
            }
        }
        for (size_t a = 1; a < n; a++) {
            for (size_t b = a; b > 0 && views[b - 1] > views[b]; b--) {
                size_t swap  = views[b];
                views[b]     = views[b - 1];
                views[b - 1] = swap;
            }
        }
        for (size_t k = 0; k < n; k++) {
            order[slots[k]]  = views[k];
            placed[slots[k]] = true;
        }
    }
}

/* A failure message without its view index, which names input positions. */
static void message_without_view_index(const char *message, char *out, size_t size)
{
    const char *index = strstr(message, "views[");
    const char *end   = index != NULL ? strchr(index, ']') : NULL;

    if (end == NULL)
        snprintf(out, size, "%s", message);
    else
        snprintf(out, size, "%.*s%s", (int)(index - message), message, end + 1);
}

static void check_shuffle(const struct gen_layout *layout, struct prng *p)
{
    size_t storage_order[MAX_STORAGES];
    size_t view_order[MAX_VIEWS];
    char first_message[1024];
    char message[1024];
    kvx_regions_t *table;
    kvx_regions_t *shuffled;
    kvx_status_t status = layout_register(layout, NULL, NULL, &table);
    kvx_status_t shuffled_status;

    message_without_view_index(kvx_errmsg(), first_message, sizeof(first_message));
    order_shuffle(p, storage_order, layout->num_storages);
    order_shuffle(p, view_order, layout->num_views);
    order_keep_equal_names(layout, view_order);
    shuffled_status = layout_register(layout, storage_order, view_order, &shuffled);
    CHECK(status == shuffled_status, "in file order %s, shuffled %s", kvx_status_str(status),
          kvx_status_str(shuffled_status));
    if (status == KVX_OK) {
        tables_compare(table, shuffled, false, "shuffled");
    } else {
        message_without_view_index(kvx_errmsg(), message, sizeof(message));
        CHECK(strcmp(first_message, message) == 0, "in file order \"%s\", shuffled \"%s\"",
              first_message, message);
    }
    kvx_regions_destroy(table);
    kvx_regions_destroy(shuffled);
}

/* regions.md step 1: P and D enumerate storages and views in different orders; the table
 * (and a failure) is the same as long as views of equal names keep their relative order. */
static void shuffled_input_gives_the_same_table(void **state)
{
    (void)state;
    for_each_layout(check_shuffle);
}

/* ---------------------------------------------------------------------------------------
 * (c) formats.md: a layout file and the API are two spellings of one layout
 * ------------------------------------------------------------------------------------- */

static void check_json(const struct gen_layout *layout, struct prng *p)
{
    char *json = layout_to_json(layout, p);
    char api_message[1024];
    kvx_layout_t *loaded = NULL;
    kvx_regions_t *table;
    kvx_regions_t *from_file = NULL;
    kvx_status_t status      = layout_register(layout, NULL, NULL, &table);
    kvx_status_t file_status;

    snprintf(api_message, sizeof(api_message), "%s", kvx_errmsg());
    file_status = kvx_layout_load_buffer(json, strlen(json), &loaded);
    CHECK(file_status == KVX_OK, "the layout file does not load:\n%s", json);
    CHECK(kvx_layout_num_views(loaded) == layout->num_views &&
              kvx_layout_num_storages(loaded) == layout->num_storages &&
              kvx_layout_block_size(loaded) == layout->block_size,
          "the file gives other counts or block size");
    file_status = kvx_regions_register(loaded, &from_file);
    kvx_layout_destroy(loaded);
    CHECK(status == file_status, "through the API %s, through a file %s", kvx_status_str(status),
          kvx_status_str(file_status));
    if (status == KVX_OK) {
        char *api_json  = NULL;
        char *file_json = NULL;

        tables_compare(table, from_file, true, "file against API");
        CHECK(kvx_regions_to_json(table, &api_json) == KVX_OK &&
                  kvx_regions_to_json(from_file, &file_json) == KVX_OK,
              "kvx_regions_to_json failed");
        CHECK(strcmp(api_json, file_json) == 0, "the plans differ:\n%s\nagainst\n%s", api_json,
              file_json);
        kvx_free(api_json);
        kvx_free(file_json);
    } else {
        CHECK(strcmp(api_message, kvx_errmsg()) == 0, "through the API \"%s\", through a file",
              api_message);
    }
    kvx_regions_destroy(table);
    kvx_regions_destroy(from_file);
    free(json);
}

/* formats.md: the same layout through kvx_layout_add_* and through a file (keys in any order,
 * defaults omitted or spelled out) gives the same table, the same plan JSON, the same error. */
static void json_and_api_give_the_same_table(void **state)
{
    (void)state;
    for_each_layout(check_json);
}

/* ---------------------------------------------------------------------------------------
 * (d) regions.md "Descriptors": region-major ids
 * ------------------------------------------------------------------------------------- */

static void check_descriptor(const kvx_regions_t *table, const uint64_t *bases, uint64_t id)
{
    size_t r = 0;
    kvx_region_info_t x;
    kvx_descriptor_t d;
    uint64_t block;
    uint64_t round_trip;
    uint64_t addr;
    uint64_t len;

    while (region_get(table, r).first_descriptor + region_get(table, r).num_blocks <= id)
        r++;
    x     = region_get(table, r);
    block = id - x.first_descriptor;
    CHECK(kvx_regions_descriptor(table, id, &d) == KVX_OK, "descriptor %" PRIu64 ": %s", id,
          kvx_errmsg());
    CHECK(d.storage == x.storage && d.offset == x.offset + block * x.stride && d.len == x.block_len,
          "descriptor %" PRIu64 " is (%zu, %" PRIu64 ", %" PRIu64 "), not block %" PRIu64
          " of region %zu",
          id, d.storage, d.offset, d.len, block, r);
    CHECK(kvx_regions_descriptor_id(table, r, block, &round_trip) == KVX_OK && round_trip == id,
          "block %" PRIu64 " of region %zu does not give id %" PRIu64, block, r, id);
    CHECK(kvx_regions_descriptor_addr(table, bases, id, &addr, &len) == KVX_OK &&
              addr == bases[x.storage] + d.offset && len == d.len,
          "the address of descriptor %" PRIu64 " is not its storage base plus offset", id);
}

static void check_descriptors(const struct gen_layout *layout, struct prng *p)
{
    uint64_t bases[MAX_STORAGES];
    uint64_t sum = 0;
    kvx_descriptor_t d;
    uint64_t id;
    kvx_regions_t *table;
    kvx_status_t status = layout_register(layout, NULL, NULL, &table);
    size_t count;

    if (status != KVX_OK)
        return;
    count = kvx_regions_count(table);
    for (size_t r = 0; r < count; r++) {
        kvx_region_info_t x = region_get(table, r);

        CHECK(x.first_descriptor == sum,
              "region %zu starts at descriptor %" PRIu64 ", not at %" PRIu64, r, x.first_descriptor,
              sum);
        sum += x.num_blocks;
        CHECK(kvx_regions_descriptor_id(table, r, x.num_blocks, &id) == KVX_ERR_OUT_OF_RANGE,
              "block %" PRIu64 " of region %zu has an id", x.num_blocks, r);
    }
    CHECK(kvx_regions_num_descriptors(table) == sum, "%" PRIu64 " descriptors, not %" PRIu64,
          kvx_regions_num_descriptors(table), sum);
    for (size_t s = 0; s < MAX_STORAGES; s++)
        bases[s] = prng_range(p, 1, 1u << 30) << 12;
    check_descriptor(table, bases, 0);
    check_descriptor(table, bases, sum - 1);
    for (int i = 0; i < 6; i++)
        check_descriptor(table, bases, prng_range(p, 0, sum - 1));
    CHECK(kvx_regions_descriptor(table, sum, &d) == KVX_ERR_OUT_OF_RANGE,
          "descriptor %" PRIu64 " exists in a table of %" PRIu64, sum, sum);
    CHECK(kvx_regions_descriptor_id(table, count, 0, &id) == KVX_ERR_OUT_OF_RANGE,
          "region %zu exists in a table of %zu", count, count);
    kvx_regions_destroy(table);
}

/* regions.md "Descriptors": the count is the sum of num_blocks, region r's block b is id
 * offset(r) + b with offset the prefix sum, and an id maps back to (r.base + b*stride,
 * block_len). */
static void descriptor_ids_are_region_major_prefix_sums(void **state)
{
    (void)state;
    for_each_layout(check_descriptors);
}

/* ---------------------------------------------------------------------------------------
 * (e) regions.md "Descriptors": the request rule
 * ------------------------------------------------------------------------------------- */

#define MAX_EXPECTED_IDS (MAX_VIEWS * (MAX_GROUPS + 1) * MAX_REQUEST_IDS)

static unsigned num_requests_out_of_range;
static unsigned num_requests_shared;

/* Region r takes group g's ids (regions.md "Descriptors"). */
static bool takes_group(const kvx_region_info_t *x, bool single_group, size_t g)
{
    return single_group || x->group == -1 || x->group == (int64_t)g;
}

/* The request rule computed from the table's regions alone: the ids `groups` must yield, in
 * order, and whether an id is beyond the capacity of a region that takes it. */
static bool request_expect(const kvx_region_info_t *infos, size_t count, bool single_group,
                           const kvx_group_ids_t *groups, size_t num_groups, uint64_t *expected,
                           size_t *num_expected_p)
{
    bool out_of_range = false;
    size_t n          = 0;

    for (size_t g = 0; g < num_groups; g++) {
        for (size_t r = 0; r < count; r++) {
            for (size_t i = 0; i < groups[g].count; i++)
                out_of_range |= takes_group(&infos[r], single_group, g) &&
                                groups[g].ids[i] >= infos[r].num_blocks;
        }
    }
    if (single_group) { /* every region takes all groups' ids, concatenated */
        for (size_t r = 0; r < count; r++) {
            for (size_t g = 0; g < num_groups; g++) {
                for (size_t i = 0; i < groups[g].count; i++)
                    expected[n++] = infos[r].first_descriptor + groups[g].ids[i];
            }
        }
    } else { /* group, then region, then block */
        for (size_t g = 0; g < num_groups; g++) {
            for (size_t r = 0; r < count; r++) {
                for (size_t i = 0; takes_group(&infos[r], false, g) && i < groups[g].count; i++)
                    expected[n++] = infos[r].first_descriptor + groups[g].ids[i];
            }
        }
    }
    *num_expected_p = n;
    return out_of_range;
}

static void check_request(const struct gen_layout *layout, struct prng *p)
{
    kvx_region_info_t infos[MAX_VIEWS];
    uint64_t block_ids[MAX_GROUPS + 1][MAX_REQUEST_IDS];
    kvx_group_ids_t groups[MAX_GROUPS + 1];
    uint64_t expected[MAX_EXPECTED_IDS];
    uint64_t ids[MAX_EXPECTED_IDS + 1];
    size_t num_expected = 0;
    size_t num_ids;
    size_t num_groups;
    bool single_group = true;
    bool out_of_range;
    int64_t max_group   = -1;
    uint64_t min_blocks = UINT64_MAX;
    kvx_regions_t *table;
    kvx_status_t status = layout_register(layout, NULL, NULL, &table);
    size_t count;

    if (status != KVX_OK)
        return;
    count = kvx_regions_count(table);
    for (size_t r = 0; r < count; r++) {
        infos[r]     = region_get(table, r);
        single_group = single_group && infos[r].group == infos[0].group; /* -1 counts too */
        max_group    = infos[r].group > max_group ? infos[r].group : max_group;
        min_blocks   = min_u64(min_blocks, infos[r].num_blocks);
        num_requests_shared += infos[r].group == -1;
    }

    for (int request = 0; request < 4; request++) {
        bool wild = chance(p, 30); /* ids up to the largest region and a bit beyond */

        num_groups = single_group ? prng_range(p, 0, MAX_GROUPS)
                                  : (size_t)max_group + 1 + prng_range(p, 0, 1);
        for (size_t g = 0; g < num_groups; g++) {
            bool layouts = single_group; /* a group the layout has (docs/plan.md "The request") */

            for (size_t v = 0; v < layout->num_views; v++)
                layouts |= (uint64_t)layout->views[v].group == g;
            groups[g].count = layouts ? prng_range(p, 0, MAX_REQUEST_IDS) : 0;
            groups[g].ids   = block_ids[g];
            for (size_t i = 0; i < groups[g].count; i++)
                block_ids[g][i] = wild ? prng_range(p, 0, 13) : prng_range(p, 0, min_blocks - 1);
        }

        out_of_range =
            request_expect(infos, count, single_group, groups, num_groups, expected, &num_expected);
        num_ids = SIZE_MAX;
        status  = kvx_regions_request_ids(table, groups, num_groups, NULL, 0, &num_ids);
        if (out_of_range) {
            num_requests_out_of_range++;
            CHECK(status == KVX_ERR_OUT_OF_RANGE && strstr(kvx_errmsg(), "out of range"),
                  "an id beyond a region's blocks gave %s", kvx_status_str(status));
            CHECK(num_ids == SIZE_MAX, "a failed request wrote its count");
            for (size_t i = 0; i < MAX_EXPECTED_IDS + 1; i++)
                ids[i] = UINT64_MAX;
            status = kvx_regions_request_ids(table, groups, num_groups, ids, MAX_EXPECTED_IDS + 1,
                                             &num_ids);
            CHECK(status == KVX_ERR_OUT_OF_RANGE && ids[0] == UINT64_MAX,
                  "a failed request wrote ids");
            continue;
        }
        CHECK(status == KVX_OK, "request: %s", kvx_errmsg());
        CHECK(num_ids == num_expected, "the request yields %zu ids, not %zu", num_ids,
              num_expected);
        ids[num_expected] = UINT64_MAX;
        status = kvx_regions_request_ids(table, groups, num_groups, ids, num_expected, &num_ids);
        CHECK(status == KVX_OK && num_ids == num_expected, "request with room: %s", kvx_errmsg());
        for (size_t i = 0; i < num_expected; i++)
            CHECK(ids[i] == expected[i], "id %zu is %" PRIu64 ", not %" PRIu64, i, ids[i],
                  expected[i]);
        CHECK(ids[num_expected] == UINT64_MAX, "the request wrote past its ids");
        if (num_expected > 0) {
            status =
                kvx_regions_request_ids(table, groups, num_groups, ids, num_expected - 1, &num_ids);
            CHECK(status == KVX_ERR_INVALID, "room for one id too few gave %s",
                  kvx_status_str(status));
        }
    }
    if (!single_group) { /* kvx.h: num_groups must cover the table's highest group */
        status = kvx_regions_request_ids(table, groups, (size_t)max_group, NULL, 0, &num_ids);
        CHECK(status == KVX_ERR_INVALID,
              "a request naming %" PRId64 " groups of %" PRId64 " gave %s", max_group,
              max_group + 1, kvx_status_str(status));
    }
    kvx_regions_destroy(table);
}

/* regions.md "Descriptors": with at most one distinct group id in the table every region
 * takes every group's ids, region by region; otherwise group g goes to the regions of group
 * g or -1, emitted group, region, block. An id beyond a taking region's capacity fails the
 * whole request with KVX_ERR_OUT_OF_RANGE and writes nothing. */
static void request_ids_follow_the_group_rule(void **state)
{
    (void)state;
    num_requests_out_of_range = 0;
    num_requests_shared       = 0;
    for_each_layout(check_request);
    CHECK(num_requests_out_of_range > 0 && num_requests_shared > 0,
          "requests never went out of range (%u) or never met a shared region (%u)",
          num_requests_out_of_range, num_requests_shared);
}

/* ---------------------------------------------------------------------------------------
 * The generator itself: every rule of regions.md is met, so the properties mean something
 * ------------------------------------------------------------------------------------- */

static void count_rules(const struct gen_layout *layout, struct prng *p)
{
    struct model_table model;

    (void)p;
    model_register(layout, &model);
}

static void generator_reaches_every_rule(void **state)
{
    static const char *const kind_names[NUM_KINDS] = {"attn",    "swa",   "mla", "swa_mla",
                                                      "scratch", "mamba", "ple"};

    (void)state;
    memset(&reached, 0, sizeof(reached));
    for_each_layout(count_rules);
    fprintf(stderr,
            "rules reached in %d layouts: csa_linear %u, whole_row_regions %u,"
            " packed_storage %u, several storages %u, whole rows %u (with a padding tail %u),"
            " not block-major %u, exact aliases %u (MLA moving the geometry %u), shorter in a"
            " packed row %u, shorter MLA apart %u, wider apart %u, shared groups %u, coverage"
            " failures %u, duplicate names %u, natural order unlike strcmp %u, digits before text"
            " %u, equal keys %u\n",
            NUM_LAYOUTS, reached.csa_linear, reached.whole_row_regions, reached.packed_storage,
            reached.several_storages, reached.whole_row, reached.whole_row_with_tail,
            reached.not_block_major, reached.exact_alias, reached.mla_alias_moves_geometry,
            reached.shorter_joins_packed_row, reached.shorter_mla_stays_apart,
            reached.wider_stays_apart, reached.shared_group, reached.coverage_fails,
            reached.duplicate_names, reached.digits_beat_bytes, reached.digits_before_text,
            reached.equal_keys);
    CHECK(reached.csa_linear && reached.whole_row_regions && reached.packed_storage &&
              reached.several_storages && reached.whole_row && reached.whole_row_with_tail &&
              reached.not_block_major && reached.exact_alias && reached.mla_alias_moves_geometry &&
              reached.shorter_joins_packed_row && reached.shorter_mla_stays_apart &&
              reached.wider_stays_apart && reached.shared_group && reached.coverage_fails &&
              reached.duplicate_names && reached.digits_beat_bytes && reached.digits_before_text &&
              reached.equal_keys,
          "a rule of regions.md is never reached (see the counts above)");
    for (int k = 0; k < NUM_KINDS; k++)
        CHECK(reached.kinds[k] > 0, "no view of kind %s", kind_names[k]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(generator_reaches_every_rule),
        cmocka_unit_test(accepted_tables_cover_every_view_byte),
        cmocka_unit_test(rejected_tables_name_a_really_uncovered_view),
        cmocka_unit_test(tables_match_an_independent_model_of_the_spec),
        cmocka_unit_test(shuffled_input_gives_the_same_table),
        cmocka_unit_test(json_and_api_give_the_same_table),
        cmocka_unit_test(descriptor_ids_are_region_major_prefix_sums),
        cmocka_unit_test(request_ids_follow_the_group_rule),
    };

    fprintf(stderr, "seed 0x%016" PRIx64 " (set KVX_TEST_SEED to change it)\n",
            prng_seed_from_env(DEFAULT_SEED));
    return cmocka_run_group_tests(tests, NULL, NULL);
}

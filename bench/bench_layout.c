/* bench_layout.c: generates the 1,265-view production-shaped layout of docs/performance.md and
 * writes it as API calls or a kvx_layout file. Uses only kvx.h; times nothing. */
#include "bench_layout.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define BENCH_ATTN_PAGE     16384 /* bytes: 16 tokens x 2 heads x 128 dims x (K,V) x 2 B */
#define BENCH_ATTN_HEADS    2
#define BENCH_MLA_PAGE      36864 /* bytes: 32 tokens x 576 latent dims x 2 B */
#define BENCH_SLAB_PAGE     37440 /* bytes: 37,376 B of data padded to 37,440 (dense false) */
#define BENCH_SLAB_TAIL     4096  /* bytes after the last slab row, shorter than one row */
#define BENCH_SCRATCH_PAGE  32768 /* bytes of the first compressor state; later ones shrink */
#define BENCH_SCRATCH_STEP  4096
#define BENCH_CSA_PAGE      19008 /* bytes of a dense csa swa_mla page */
#define BENCH_CSA_RING_PAGE 8192  /* bytes of its compressor ring, same base, same stride */

/* splitmix64: small, fast, and the same sequence on every machine. */
static uint64_t bench_prng_next(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));

    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* The modulo bias is irrelevant for shuffling. */
void bench_order_shuffle(uint32_t *order, size_t n, uint64_t *state)
{
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j   = (size_t)(bench_prng_next(state) % (i + 1));
        uint32_t t = order[i];

        order[i] = order[j];
        order[j] = t;
    }
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
static void bench_view_add(struct bench_layout *bl, const struct bench_view *proto, const char *fmt,
                           ...) __attribute__((format(printf, 3, 4)));

static void bench_view_add(struct bench_layout *bl, const struct bench_view *proto, const char *fmt,
                           ...)
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
void bench_layout_generate(struct bench_layout *bl, uint64_t seed)
{
    uint64_t state       = seed;
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
        uint32_t storage =
            bench_storage_add(bl, (uint64_t)BENCH_NUM_BLOCKS * slab_stride + BENCH_SLAB_TAIL,
                              "kv_cache.swa_slab.%u", s);
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

    bench_order_shuffle(bl->storage_order, bl->num_storages, &state);
    bench_order_shuffle(bl->view_order, bl->num_views, &state);
}

/* Layout-wide flags: csa_linear false so padded views in block-major storages are whole
 * rows (regions.md step 2; with it true, only whole_row_regions could make rows, and then
 * the csa rings would fold too). */
const kvx_layout_params_t bench_layout_params = {
    .field_mask = KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE | KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR |
                  KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS,
    .block_size        = 16,
    .csa_linear        = false,
    .whole_row_regions = false,
};

kvx_status_t bench_layout_build(const struct bench_layout *bl, kvx_layout_t **layout_p)
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

static bool text_append(struct bench_text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends to t, growing it by doubling; false when out of memory (t then stays valid). */
static bool text_append(struct bench_text *t, const char *fmt, ...)
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

/* Generated names need no JSON escaping. */
bool bench_layout_json(const struct bench_layout *bl, struct bench_text *t)
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

        ok = text_append(
            t, "    {\"name\": \"%s\", \"size\": %" PRIu64 ", \"mem\": \"%s\", \"device\": 0}%s\n",
            s->name, s->size, kvx_mem_type_str(KVX_MEM_VRAM), i + 1 < bl->num_storages ? "," : "");
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

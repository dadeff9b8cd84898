/* bench_layout.h: the production-shaped layout the benches register, generated in memory and
 * handed to kvx through the API or as a kvx_layout file. Bench-only: never installed. */
#ifndef KVX_BENCH_BENCH_LAYOUT_H
#define KVX_BENCH_BENCH_LAYOUT_H

#include "kvx.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The generated layout (docs/performance.md "Registration"). Every view has BENCH_NUM_BLOCKS
 * blocks; the five families below exercise every path of regions.md steps 2 and 3. */
#define BENCH_NUM_BLOCKS     4096 /* blocks per view */
#define BENCH_SHARED_TENSORS 400  /* (1)+(3): per-layer attn storages, each aliased by group 1 */
#define BENCH_MLA_LAYERS     125  /* (1): per-layer MLA storages, one view each */
#define BENCH_SLABS          4    /* (2): packed block-major slabs */
#define BENCH_SLAB_LAYERS    76   /* (2): padded swa_mla views side by side in one slab row */
#define BENCH_SLAB_SCRATCH   5    /* (4): compressor states at offset 0 of each slab row */
#define BENCH_CSA_LAYERS     8    /* (5): dense swa_mla + shorter ring at one base: 2 regions */

#define BENCH_NUM_STORAGES                                                                         \
    (BENCH_SHARED_TENSORS + BENCH_MLA_LAYERS + BENCH_SLABS + BENCH_CSA_LAYERS)
#define BENCH_NUM_VIEWS                                                                            \
    (2 * BENCH_SHARED_TENSORS + BENCH_MLA_LAYERS +                                                 \
     BENCH_SLABS * (BENCH_SLAB_LAYERS + BENCH_SLAB_SCRATCH) + 2 * BENCH_CSA_LAYERS)
/* What regions.md makes of it: one region per shared tensor, per MLA layer and per slab,
 * two per csa layer. Checked after registration so the bench never measures another shape. */
#define BENCH_EXPECT_REGIONS                                                                       \
    (BENCH_SHARED_TENSORS + BENCH_MLA_LAYERS + BENCH_SLABS + 2 * BENCH_CSA_LAYERS)
#define BENCH_EXPECT_PACKED_ROWS BENCH_SLABS
#define BENCH_EXPECT_SHARED      (BENCH_SHARED_TENSORS + BENCH_SLABS)

_Static_assert(BENCH_NUM_VIEWS == 1265, "the bench models a 1,265-view layout");

#define BENCH_NUM_GROUPS 3  /* 0 full attention / MLA, 1 sliding window, 2 compressor */
#define BENCH_NAME_LEN   64 /* bytes, terminator included; generated names are shorter */

struct bench_storage {
    char name[BENCH_NAME_LEN];
    uint64_t size; /* bytes */
};

struct bench_view {
    char name[BENCH_NAME_LEN];
    kvx_view_kind_t kind;
    uint32_t storage; /* index into bench_layout.storages */
    int64_t group;
    uint64_t offset; /* bytes from the storage start to block 0 */
    uint64_t page;   /* bytes */
    uint64_t stride; /* bytes */
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

/* A growing text buffer; data is NUL-terminated once anything was appended. */
struct bench_text {
    char *data;
    size_t len; /* bytes, terminator excluded */
    size_t cap; /* bytes allocated */
};

/* The layout-wide flags every generated layout uses (see bench_layout.c). */
extern const kvx_layout_params_t bench_layout_params;

/* Fills order[0..n) with 0..n-1 in an order drawn from *state (Fisher-Yates). */
void bench_order_shuffle(uint32_t *order, size_t n, uint64_t *state);

/* Generates the layout and a shuffled input order drawn from seed. */
void bench_layout_generate(struct bench_layout *bl, uint64_t seed);

/* Builds bl through kvx_layout_create/add_storage/add_view, in its shuffled order. On error
 * *layout_p is unchanged and kvx_errmsg() says why. */
kvx_status_t bench_layout_build(const struct bench_layout *bl, kvx_layout_t **layout_p);

/* Appends bl as a kvx_layout file (formats.md), in the same order, to t; false when out of
 * memory. The caller frees t->data. */
bool bench_layout_json(const struct bench_layout *bl, struct bench_text *t);

#endif

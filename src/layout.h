/* layout.h: the layout as registration reads it: storages and views, already validated.
 * Shared by layout.c, layout_file.c and regions.c; never exposed to users. */
#ifndef KVX_SRC_LAYOUT_H
#define KVX_SRC_LAYOUT_H

#include "kvx.h"

struct storage {
    char *name;
    uint64_t size; /* bytes */
    kvx_mem_type_t mem;
    int64_t device;
};

struct view {
    char *name;
    kvx_view_kind_t kind;
    uint32_t storage; /* index into kvx_layout.storages */
    int64_t group;    /* >= 0 */
    uint64_t offset;  /* bytes from the storage start to block 0 */
    uint64_t page;    /* bytes of one block, padding included */
    uint64_t stride;  /* bytes from block b to block b+1 */
    uint64_t num_blocks;
    uint64_t heads;
    bool dense;
};

/* Owned copies of kvx_model_t's strings, with the struct pointing at them. */
struct model {
    kvx_model_t public;
    char *strings; /* id, revision, dtype, cache_dtype, backend, NUL-separated */
};

/* Copies `in` into `out` (freed with model_free). On failure *out is untouched. */
kvx_status_t model_copy(const kvx_model_t *in, struct model *out);
void model_free(struct model *model);

struct kvx_layout {
    bool has_model;
    struct model model;
    uint64_t block_size; /* tokens per block */
    bool csa_linear;
    bool whole_row_regions;
    struct storage *storages;
    size_t num_storages;
    size_t max_storages;       /* allocated entries of storages */
    uint32_t *storage_by_name; /* open-addressing hash of storage indices + 1; 0 is empty */
    size_t storage_hash_size;  /* a power of two, at least twice max_storages */
    struct view *views;
    size_t num_views;
    size_t max_views; /* allocated entries of views */
};

/* True for the MLA family (regions.md "View fields"). */
static inline bool layout_kind_is_mla(kvx_view_kind_t kind)
{
    return kind == KVX_VIEW_KIND_MLA || kind == KVX_VIEW_KIND_SWA_MLA;
}

/* Index of the storage called `name`, or -1. */
long layout_storage_find(const kvx_layout_t *layout, const char *name);

/* Parses a kind or memory type as spelled in layout files; false if unknown. */
bool layout_view_kind_parse(const char *text, kvx_view_kind_t *kind_p);
bool layout_mem_type_parse(const char *text, kvx_mem_type_t *mem_p);

#endif

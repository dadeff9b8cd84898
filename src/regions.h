/* regions.h: the region table as the regions, descriptors and JSON files share it. A table
 * is immutable once kvx_regions_register() returns it. */
#ifndef KVX_SRC_REGIONS_H
#define KVX_SRC_REGIONS_H

#include "kvx.h"

struct region {
    uint32_t storage;      /* index into kvx_regions.storage_names */
    uint32_t first_member; /* index into kvx_regions.members */
    uint32_t num_members;
    uint64_t offset;    /* bytes: region base inside its storage */
    uint64_t block_len; /* bytes per descriptor */
    uint64_t stride;    /* bytes from block b to block b+1 */
    uint64_t num_blocks;
    uint64_t first_descriptor; /* region-major id of block 0 */
    uint64_t heads;
    int64_t group; /* -1: shared by several groups */
    bool mla;
    bool packed_row;
    bool scratch;
    bool ssm;
    bool ple;
    bool head_split; /* a member is attn, swa or mamba: split by heads under TP (not in JSON) */
};

struct kvx_regions {
    struct region *regions; /* in table order (regions.md step 4) */
    size_t num_regions;
    uint32_t *members; /* view indices, grouped by region, step-1 order inside */
    uint64_t num_descriptors;
    uint64_t block_size; /* tokens per block, from the layout */
    bool single_group;   /* at most one distinct group id in the table */
    int64_t max_group;   /* highest group id of any region, -1 if all shared */
    char **view_names;   /* by layout view index */
    size_t num_views;
    char **storage_names;    /* by layout storage index */
    uint64_t *storage_sizes; /* bytes, by layout storage index */
    size_t num_storages;
};

/* A region's name: its first member's (regions.md step 4). */
static inline const char *regions_region_name(const kvx_regions_t *t, const struct region *r)
{
    return t->view_names[t->members[r->first_member]];
}

#endif

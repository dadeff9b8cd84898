/* regions.h: the region table as the regions, descriptors and JSON files share it. A table
 * is immutable once kvx_regions_register() returns it. */
#ifndef KVX_SRC_REGIONS_H
#define KVX_SRC_REGIONS_H

#include "kvx.h"
#include "layout.h"

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
    bool has_model;
    struct model model; /* the layout's model identity, when has_model */
    bool single_group;  /* at most one distinct group id in the table */
    int64_t max_group;  /* highest group id of any region, -1 if all shared */
    int64_t *view_groups;   /* the layout's view group ids, ascending, each once; NULL in a
                               table decoded from the wire, which knows its regions' only */
    size_t num_view_groups;
    char **view_names;  /* by layout view index */
    size_t num_views;
    char **storage_names;         /* by layout storage index */
    uint64_t *storage_sizes;      /* bytes, by layout storage index */
    kvx_mem_type_t *storage_mems; /* by layout storage index */
    int64_t *storage_devices;     /* by layout storage index */
    size_t num_storages;
};

/* Numbers a filled table (regions.md step 4, "Descriptors"): first_descriptor prefix sums,
 * num_descriptors, single_group and max_group. Fails if the count overflows 63 bits. */
kvx_status_t regions_number(kvx_regions_t *t);

/* Copies the char * at `name_offset` of `count` items of `item_size` bytes into one
 * allocation (pointer array, then strings), freed with one free(); NULL on failure. */
char **regions_names_copy(const void *items, size_t count, size_t item_size, size_t name_offset);

/* The checks a request passes on both of its paths (kvx_regions_request_ids and
 * kvx_peer_plan_request), so that both refuse alike (descriptors.c). */

/* True when some region of the table is in group g (shared regions count for no group). */
bool regions_has_group(const kvx_regions_t *t, size_t g);

/* KVX_ERR_INVALID: a request of num_groups groups misses some of the table's (several group
 * ids in the table, the highest not below num_groups); the message lists the table's. */
kvx_status_t regions_groups_missing(const kvx_regions_t *t, size_t num_groups);

/* KVX_ERR_INVALID: group g has ids but no region is in it (a table of several groups). */
kvx_status_t regions_group_unknown(const kvx_regions_t *t, size_t g);

/* KVX_ERR_INVALID: group g names block `id` twice. */
kvx_status_t regions_id_repeated(size_t g, uint64_t id);

/* KVX_ERR_INVALID (regions_id_repeated) when group g names an id twice; ids out of order are
 * sorted in a copy, allocated and freed here. */
kvx_status_t regions_group_check_repeats(const kvx_group_ids_t *group, size_t g);

/* True when ids[0..n) strictly ascend, so none repeats. Reads them in blocks without a branch
 * per id, which the compiler vectorises: cheap enough for every request. */
bool regions_ids_ascend(const uint64_t *ids, size_t n);

/* A region's name: its first member's (regions.md step 4). */
static inline const char *regions_region_name(const kvx_regions_t *t, const struct region *r)
{
    return t->view_names[t->members[r->first_member]];
}

#endif

/* plan.h: a prepared per-peer plan as plan.c builds it and plan_request.c reads it. Built
 * once per peer; immutable afterwards, so requests may be planned from several threads. */
#ifndef KVX_SRC_PLAN_H
#define KVX_SRC_PLAN_H

#include "regions.h"

/* One piece of a local unit and where it is read from. */
struct slice {
    uint32_t rank;          /* remote TP rank */
    uint32_t read;          /* index of rank in kvx_peer_plan.read_ranks */
    uint64_t local_offset;  /* bytes into the local unit */
    uint64_t remote_offset; /* bytes into the remote block */
    uint64_t len;           /* bytes */
};

struct region_plan {
    const struct region *local;
    const struct region *remote;
    uint64_t unit_len;    /* bytes: local block_len / bsr, paired with one remote block */
    uint32_t first_slice; /* into kvx_peer_plan.slices */
    uint32_t num_slices;
};

/* The regions that take one group's ids (regions.md "Descriptors"). */
struct group_plan {
    int64_t group;         /* table group id; -1: the single group, or any unused id */
    uint32_t first_region; /* into kvx_peer_plan.group_regions */
    uint32_t num_regions;
    uint64_t local_capacity;  /* smallest num_blocks of those regions, local side */
    uint64_t remote_capacity; /* and remote side */
};

struct kvx_peer_plan {
    const kvx_regions_t *local;
    const kvx_regions_t *remote;
    uint32_t local_tp;
    uint32_t local_rank;
    uint32_t remote_tp;
    uint64_t bsr;                /* local block size / remote block size */
    uint64_t max_pair_len;       /* bytes; 0: no limit */
    struct region_plan *regions; /* by region index */
    struct slice *slices;
    size_t num_slices;
    uint32_t *read_ranks; /* ascending */
    size_t num_reads;
    uint32_t *notify_ranks; /* ascending */
    size_t num_notifies;
    bool single_group;
    struct group_plan *groups; /* ascending group ids, then the -1 entry */
    size_t num_groups;
    uint32_t *group_regions; /* region indices, table order within a group */
    uint64_t *pairs_per_id;  /* [group][read]: pairs one block id yields, before coalescing */
};

/* True when region r is read by head slices under TP (an attn, swa or mamba member, and
 * neither MLA nor ple), false when its blocks are read whole (docs/plan.md). */
bool plan_region_is_split(const struct region *r);

/* Whether a remote block of `remote_len` bytes can serve a local unit of `unit` bytes of
 * region `local` under the TP sizes (docs/plan.md "Per region"). When not, writes the rule
 * in words to `rule`. Shared by the planner and the handshake's table check. */
bool plan_lengths_agree(const struct region *local, uint64_t unit, uint64_t remote_len,
                        uint32_t local_tp, uint32_t remote_tp, char *rule, size_t size);

#endif

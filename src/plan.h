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

/* The regions that take one group's ids (regions.md "Descriptors"). A region that another
 * region of the group covers (plan_cover.c) takes the ids but emits nothing: its bytes are
 * the covering region's, from the same place. */
struct group_plan {
    int64_t group;         /* table group id; -1: the single group, or any unused id */
    uint32_t first_region; /* into kvx_peer_plan.group_regions: those that emit, then covered */
    uint32_t num_regions;  /* regions that emit; 0 with num_covered 0: no region takes it */
    uint32_t num_covered;  /* regions that take the group but emit nothing */
    uint64_t covered_per_id;  /* descriptors one id names in the covered regions */
    uint64_t local_capacity;  /* smallest num_blocks of every region taking it, local side */
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
    uint64_t max_capacity;   /* largest local_capacity of a group some region takes */
    bool may_overlap;        /* two emitting regions can share a local byte (plan_cover.c) */
    bool has_shared;         /* a region of group -1 emits, in a table of several groups */
};

/* True when region r is read by head slices under TP (an attn, swa or mamba member, and
 * neither MLA nor ple), false when its blocks are read whole (docs/plan.md). */
bool plan_region_is_split(const struct region *r);

/* Whether a remote block of `remote_len` bytes can serve a local unit of `unit` bytes of
 * region `local` under the TP sizes (docs/plan.md "Per region"). When not, writes the rule
 * in words to `rule`. Shared by the planner and the handshake's table check. */
bool plan_lengths_agree(const struct region *local, uint64_t unit, uint64_t remote_len,
                        uint32_t local_tp, uint32_t remote_tp, char *rule, size_t size);

/* plan_cover.c: drops from each group's list the regions another region of the group covers,
 * and sets may_overlap and has_shared from the regions left. On entry the plan's regions,
 * slices and group lists are built; lists only shrink. Allocation failure: no_memory. */
kvx_status_t plan_cover_prune(struct kvx_peer_plan *plan);

/* Two pairs that name one local byte, from different places (plan_dedup.c). */
struct plan_conflict {
    kvx_pair_t a; /* the pair (or run) sorted first */
    kvx_pair_t b;
    uint64_t byte; /* local offset of a byte both name, in b's local storage */
};

/* plan_dedup.c, on pair arrays (docs/plan.md "Each byte once"). Sorted means by local
 * storage, local offset, longer first, then source. */

/* The pairs the last planned request reads from remote `rank` (one list per read rank), and
 * their number in *count_p; NULL and 0 when it reads nothing from that rank. */
const kvx_pair_t *plan_pairs_of_rank(const kvx_pairs_t *pairs, uint32_t rank, size_t *count_p);

/* True when each pair starts at or after the end of the one before, storages ascending. */
bool plan_pairs_ordered(const kvx_pair_t *pairs, size_t n);

/* Sorts n pairs, using tmp (n entries) too; returns whichever of the two holds the result. */
kvx_pair_t *plan_pairs_sort(kvx_pair_t *pairs, kvx_pair_t *tmp, size_t n);

/* True when two of the sorted pairs share a local byte; then *conflict_p (if not NULL) names
 * two of them and the first byte they share. */
bool plan_pairs_overlap(const kvx_pair_t *sorted, size_t n, struct plan_conflict *conflict_p);

/* Writes the sorted pairs to `out` (which may be `sorted`) with each local byte once: a pair
 * inside bytes already written from the same place is dropped, one reaching past them adds
 * its new bytes, neighbours that continue each other merge while within max_len (0: no
 * limit). Returns the pairs written, or SIZE_MAX when two pairs read one byte from different
 * places, with *conflict_p naming them. */
size_t plan_pairs_sweep(const kvx_pair_t *sorted, size_t n, uint64_t max_len, kvx_pair_t *out,
                        struct plan_conflict *conflict_p);

/* One region's single slice at bsr 1, as the emission's loops read it
 * (plan_request.c emit_single, plan_stream.c). */
struct single_run {
    uint64_t local_base;  /* bytes: region offset + slice offset, local side */
    uint64_t remote_base; /* and remote side */
    uint64_t local_stride;
    uint64_t remote_stride;
    uint64_t len;          /* bytes of one descriptor */
    uint64_t room;         /* a run of `run` bytes may take one more id while run <= room */
    uint64_t local_limit;  /* local ids must stay below this */
    uint64_t remote_limit; /* and explicit remote ids below this */
    bool contiguous;       /* both strides are the length: an id continues a run exactly when
                              it counts up by one, on both sides */
    bool stream;           /* plan_stream may take the streaming phase (plan_stream_usable) */
    uint32_t local_storage;
    uint32_t remote_storage;
};

/* Whether plan_stream can emit for `sr` here: the CPU has AVX2, the strides and the ids below
 * the limits fit in 32 bits, and no test has turned it off. */
bool plan_stream_usable(const struct single_run *sr);

/* The streaming phase of emit_single four ids at a time: writes one pair per id of
 * local_ids[0..n) (remote ids: remote_ids, or the local ones when NULL) into out[], after a
 * pair whose local offset is last_lo, and stops before the first group of four with an id at
 * or over its limit, or a pair whose local offset continues the one before it. Returns the
 * ids written, a multiple of four; the caller goes on from there one id at a time. */
size_t plan_stream(const struct single_run *sr, const uint64_t *local_ids,
                   const uint64_t *remote_ids, size_t n, uint64_t last_lo, kvx_pair_t *out);

/* Tests: with `disabled`, plan_stream_usable says no, so the scalar loop does all. */
void plan_stream_disable(bool disabled);

/* The pair of slice `s` of unit `k` of local block `lb` of region `rp`, read from remote
 * block `rb`: what the emission writes and what an error message re-derives. */
static inline kvx_pair_t plan_pair_of(const struct kvx_peer_plan *plan, const struct region_plan *rp,
                                      uint64_t lb, uint64_t k, uint64_t rb, uint32_t s)
{
    const struct slice *sl = &plan->slices[rp->first_slice + s];

    return (kvx_pair_t){
        .local_storage  = rp->local->storage,
        .remote_storage = rp->remote->storage,
        .local_offset   = rp->local->offset + lb * rp->local->stride + k * rp->unit_len +
                        sl->local_offset,
        .remote_offset  = rp->remote->offset + rb * rp->remote->stride + sl->remote_offset,
        .len            = sl->len};
}

#endif

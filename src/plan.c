/* plan.c: per-peer prepared plans and per-request descriptor pairs, pull direction:
 * heterogeneous TP slices, block-size ratio and coalescing. Pure: no I/O, no transport. */
#include "plan.h"

#include "error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads and checks the plan's parameters: TP sizes and rank, block sizes (bsr). */
static kvx_status_t plan_params_read(const kvx_regions_t *local, const kvx_regions_t *remote,
                                     const kvx_peer_plan_params_t *params,
                                     struct kvx_peer_plan *plan)
{
    const uint64_t known =
        KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP | KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK |
        KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP | KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE |
        KVX_PEER_PLAN_PARAM_FIELD_REMOTE_BLOCK_SIZE | KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN;
    uint64_t mask      = params != NULL ? params->field_mask : 0;
    uint64_t local_bs  = local->block_size;
    uint64_t remote_bs = remote->block_size;

    if ((mask & ~known) != 0)
        return error_set(KVX_ERR_INVALID, "plan params: unknown field bits 0x%" PRIx64,
                         mask & ~known);
    plan->local_tp   = (mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP) ? params->local_tp : 1;
    plan->local_rank = (mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK) ? params->local_rank : 0;
    plan->remote_tp  = (mask & KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP) ? params->remote_tp : 1;
    if (mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE)
        local_bs = params->local_block_size;
    if (mask & KVX_PEER_PLAN_PARAM_FIELD_REMOTE_BLOCK_SIZE)
        remote_bs = params->remote_block_size;
    plan->max_pair_len = (mask & KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN) ? params->max_pair_len : 0;

    if (plan->local_tp < 1 || plan->local_tp > KVX_MAX_TP)
        return error_set(KVX_ERR_INVALID, "local_tp: %" PRIu32 " is not in 1..%d", plan->local_tp,
                         KVX_MAX_TP);
    if (plan->remote_tp < 1 || plan->remote_tp > KVX_MAX_TP)
        return error_set(KVX_ERR_INVALID, "remote_tp: %" PRIu32 " is not in 1..%d", plan->remote_tp,
                         KVX_MAX_TP);
    if (plan->local_rank >= plan->local_tp)
        return error_set(KVX_ERR_INVALID, "local_rank: %" PRIu32 " is not below local_tp %" PRIu32,
                         plan->local_rank, plan->local_tp);
    if (plan->local_tp % plan->remote_tp != 0 && plan->remote_tp % plan->local_tp != 0)
        return error_set(KVX_ERR_INVALID,
                         "tp: local_tp %" PRIu32 " and remote_tp %" PRIu32
                         " do not divide one another",
                         plan->local_tp, plan->remote_tp);
    if (local_bs < 1 || remote_bs < 1)
        return error_set(KVX_ERR_INVALID,
                         "block_size: local %" PRIu64 " and remote %" PRIu64 " must be at least 1",
                         local_bs, remote_bs);
    if (remote_bs > local_bs)
        return error_set(KVX_ERR_INVALID,
                         "block_size: the remote block (%" PRIu64 " tokens) is"
                         " larger than the local block (%" PRIu64 " tokens); kvx pulls only"
                         " into blocks at least as large",
                         remote_bs, local_bs);
    if (local_bs % remote_bs != 0)
        return error_set(KVX_ERR_INVALID,
                         "block_size: local %" PRIu64 " is not a multiple of"
                         " remote %" PRIu64,
                         local_bs, remote_bs);
    plan->bsr = local_bs / remote_bs;
    return KVX_OK;
}

static void plan_add_slice(struct kvx_peer_plan *plan, struct region_plan *rp, uint32_t rank,
                           uint64_t local_offset, uint64_t remote_offset, uint64_t len)
{
    struct slice *s = &plan->slices[rp->first_slice + rp->num_slices++];

    *s = (struct slice){
        .rank = rank, .local_offset = local_offset, .remote_offset = remote_offset, .len = len};
}

bool plan_region_is_split(const struct region *r)
{
    return r->head_split && !r->mla && !r->ple;
}

bool plan_lengths_agree(const struct region *local, uint64_t unit, uint64_t remote_len,
                        uint32_t local_tp, uint32_t remote_tp, char *rule, size_t size)
{
    uint64_t ratio;

    if (!plan_region_is_split(local)) {
        if (remote_len == unit)
            return true;
        snprintf(rule, size,
                 "%s regions are never split: the remote block_len must equal the"
                 " local unit of %" PRIu64 " bytes",
                 local->mla   ? "replicated MLA"
                 : local->ple ? "ple"
                              : "scratch",
                 unit);
        return false;
    }
    if (local_tp >= remote_tp) {
        ratio = local_tp / remote_tp;
        if (remote_len % unit == 0 && ratio % (remote_len / unit) == 0)
            return true;
        snprintf(rule, size,
                 "head-split: the remote block_len must be the local %" PRIu64
                 " x TP ratio %" PRIu64 " (or a divisor of the ratio, for heads replicated"
                 " across local ranks)",
                 unit, ratio);
        return false;
    }
    ratio = remote_tp / local_tp;
    if (unit % remote_len == 0 && ratio % (unit / remote_len) == 0)
        return true;
    snprintf(rule, size,
             "head-split: the local %" PRIu64 " must be the remote block_len x TP"
             " ratio %" PRIu64 " (or the ratio over a divisor, for heads replicated across"
             " remote ranks)",
             unit, ratio);
    return false;
}

/* How a local unit (a local block, or one of its bsr sub-blocks) of region `ri` is read:
 * docs/plan.md "Per region". Lengths decide the slicing, heads only describe it, so a
 * layout that leaves heads at 1 still plans right. */
static kvx_status_t plan_region_slices(struct kvx_peer_plan *plan, size_t ri)
{
    struct region_plan *rp = &plan->regions[ri];
    uint64_t unit          = rp->unit_len;
    uint64_t remote_len    = rp->remote->block_len;
    uint32_t local_rank    = plan->local_rank;
    uint64_t ratio;  /* the larger TP over the smaller */
    uint64_t slices; /* distinct head slices between one local unit and one remote block */
    char rule[256];

    if (!plan_lengths_agree(rp->local, unit, remote_len, plan->local_tp, plan->remote_tp, rule,
                            sizeof(rule)))
        return error_set(KVX_ERR_INVALID, "region %zu (%s): remote block_len %" PRIu64 ": %s", ri,
                         regions_region_name(plan->local, rp->local), remote_len, rule);
    if (!plan_region_is_split(rp->local)) {
        /* The whole unit, from the remote rank whose share this local rank is. */
        plan_add_slice(plan, rp, local_rank * plan->remote_tp / plan->local_tp, 0, 0, unit);
    } else if (plan->local_tp >= plan->remote_tp) {
        ratio  = plan->local_tp / plan->remote_tp;
        slices = remote_len / unit;
        /* ratio / slices local ranks hold the same heads and read the same slice. */
        plan_add_slice(plan, rp, local_rank / (uint32_t)ratio, 0,
                       (local_rank % ratio) / (ratio / slices) * unit, unit);
    } else {
        ratio  = plan->remote_tp / plan->local_tp;
        slices = unit / remote_len;
        /* ratio / slices remote ranks in a row hold the same heads: read the first of each. */
        for (uint64_t j = 0; j < slices; j++)
            plan_add_slice(plan, rp, (uint32_t)(local_rank * ratio + j * (ratio / slices)),
                           j * remote_len, 0, remote_len);
    }
    return KVX_OK;
}

/* How a region's blocks are read under TP, in words (docs/plan.md "Per region"). */
static const char *region_read_kind(const struct region *r)
{
    return r->mla ? "replicated MLA" : plan_region_is_split(r) ? "head-split" : "never split";
}

/* Matches region i of both tables: same name and group (the handshake checks the same). */
static kvx_status_t plan_regions_match(const kvx_regions_t *local, const kvx_regions_t *remote)
{
    if (local->num_regions != remote->num_regions)
        return error_set(KVX_ERR_INVALID, "peer: the local table has %zu regions, the remote %zu",
                         local->num_regions, remote->num_regions);
    for (size_t i = 0; i < local->num_regions; i++) {
        const struct region *l = &local->regions[i];
        const struct region *r = &remote->regions[i];

        if (strcmp(regions_region_name(local, l), regions_region_name(remote, r)) != 0)
            return error_set(KVX_ERR_INVALID, "region %zu: local name %s, remote name %s", i,
                             regions_region_name(local, l), regions_region_name(remote, r));
        if (strcmp(region_read_kind(l), region_read_kind(r)) != 0)
            return error_set(KVX_ERR_INVALID,
                             "region %zu (%s): local is %s, remote is %s: both sides must read"
                             " it the same way",
                             i, regions_region_name(local, l), region_read_kind(l),
                             region_read_kind(r));
        if (l->group != r->group)
            return error_set(KVX_ERR_INVALID,
                             "region %zu (%s): local group %" PRId64 ", remote group %" PRId64, i,
                             regions_region_name(local, l), l->group, r->group);
    }
    return KVX_OK;
}

static int compare_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a;
    int64_t y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* Per group: the regions that take it (regions.md "Descriptors") and their smallest
 * capacities on each side. With one distinct group id in the table there is one entry, for
 * every region; otherwise one per distinct group >= 0 in ascending order, then one for
 * groups the table does not use, which only shared regions take. */
static kvx_status_t plan_groups_build(struct kvx_peer_plan *plan)
{
    const kvx_regions_t *t = plan->local;
    size_t nr              = t->num_regions;
    int64_t *ids           = calloc(nr + 1, sizeof(*ids));
    size_t num_ids         = 0;
    size_t num_shared      = 0;
    size_t distinct        = 0;
    size_t used            = 0;

    if (ids == NULL)
        return error_no_memory("the plan's groups");
    plan->single_group = t->single_group;
    if (!plan->single_group) {
        for (size_t r = 0; r < nr; r++) {
            if (t->regions[r].group >= 0)
                ids[num_ids++] = t->regions[r].group;
            else
                num_shared++;
        }
        qsort(ids, num_ids, sizeof(*ids), compare_int64);
        for (size_t i = 0; i < num_ids; i++) { /* keep each id once */
            if (distinct == 0 || ids[distinct - 1] != ids[i])
                ids[distinct++] = ids[i];
        }
        num_ids = distinct;
    }
    ids[num_ids++] = -1; /* the single group, or "a group the table does not use" */

    /* Each region is listed once for its own group, shared ones once for every group. */
    plan->groups        = calloc(num_ids, sizeof(*plan->groups));
    plan->group_regions = calloc(nr + num_shared * num_ids, sizeof(*plan->group_regions));
    if (plan->groups == NULL || plan->group_regions == NULL) {
        free(ids);
        return error_no_memory("the plan's groups");
    }
    for (size_t g = 0; g < num_ids; g++) {
        struct group_plan *gp = &plan->groups[g];

        *gp = (struct group_plan){.group           = ids[g],
                                  .first_region    = (uint32_t)used,
                                  .local_capacity  = UINT64_MAX,
                                  .remote_capacity = UINT64_MAX};
        for (size_t r = 0; r < nr; r++) {
            int64_t rg = t->regions[r].group;

            if (!plan->single_group && rg != -1 && rg != gp->group)
                continue;
            plan->group_regions[used++] = (uint32_t)r;
            gp->num_regions++;
            if (plan->regions[r].local->num_blocks < gp->local_capacity)
                gp->local_capacity = plan->regions[r].local->num_blocks;
            if (plan->regions[r].remote->num_blocks < gp->remote_capacity)
                gp->remote_capacity = plan->regions[r].remote->num_blocks;
        }
    }
    plan->num_groups = num_ids;
    free(ids);
    return KVX_OK;
}

/* Pairs one id of each group yields on each read, before coalescing: sizes a request's
 * output with one multiplication per group and read. */
static kvx_status_t plan_counts_build(struct kvx_peer_plan *plan)
{
    plan->pairs_per_id = calloc(plan->num_groups * plan->num_reads, sizeof(uint64_t));
    if (plan->pairs_per_id == NULL)
        return error_no_memory("the plan's counts");
    for (size_t g = 0; g < plan->num_groups; g++) {
        const struct group_plan *gp = &plan->groups[g];

        for (uint32_t i = 0; i < gp->num_regions; i++) {
            const struct region_plan *rp =
                &plan->regions[plan->group_regions[gp->first_region + i]];

            for (uint32_t s = 0; s < rp->num_slices; s++)
                plan->pairs_per_id[g * plan->num_reads + plan->slices[rp->first_slice + s].read] +=
                    plan->bsr;
        }
    }
    return KVX_OK;
}

/* The read ranks in ascending order, each slice's index among them, and the notify-only
 * ranks: those whose share of this local rank's blocks is never read. */
static kvx_status_t plan_ranks_build(struct kvx_peer_plan *plan)
{
    uint32_t *index_of = calloc(plan->remote_tp, sizeof(*index_of));
    bool *is_read      = calloc(plan->remote_tp, sizeof(*is_read));
    uint32_t first;
    uint32_t count;

    plan->read_ranks   = calloc(plan->remote_tp, sizeof(*plan->read_ranks));
    plan->notify_ranks = calloc(plan->remote_tp, sizeof(*plan->notify_ranks));
    if (index_of == NULL || is_read == NULL || plan->read_ranks == NULL ||
        plan->notify_ranks == NULL) {
        free(index_of);
        free(is_read);
        return error_no_memory("the plan's ranks");
    }
    for (size_t s = 0; s < plan->num_slices; s++)
        is_read[plan->slices[s].rank] = true;
    for (uint32_t rank = 0; rank < plan->remote_tp; rank++) {
        if (is_read[rank]) {
            index_of[rank]                      = (uint32_t)plan->num_reads;
            plan->read_ranks[plan->num_reads++] = rank;
        }
    }
    for (size_t s = 0; s < plan->num_slices; s++)
        plan->slices[s].read = index_of[plan->slices[s].rank];

    if (plan->local_tp >= plan->remote_tp) {
        first = plan->local_rank / (plan->local_tp / plan->remote_tp);
        count = 1;
    } else {
        count = plan->remote_tp / plan->local_tp;
        first = plan->local_rank * count;
    }
    for (uint32_t rank = first; rank < first + count; rank++) {
        if (!is_read[rank])
            plan->notify_ranks[plan->num_notifies++] = rank;
    }
    free(index_of);
    free(is_read);
    return KVX_OK;
}

/* Region by region: the matching remote region, the local unit and its slices. */
static kvx_status_t plan_regions_build(struct kvx_peer_plan *plan)
{
    size_t nr = plan->local->num_regions;
    /* A region has one slice, or up to remote_tp / local_tp when remote ranks split it. */
    uint64_t max_slices = plan->remote_tp > plan->local_tp ? plan->remote_tp / plan->local_tp : 1;
    kvx_status_t status;

    plan->regions = calloc(nr, sizeof(*plan->regions));
    plan->slices  = calloc(nr * max_slices, sizeof(*plan->slices));
    if (plan->regions == NULL || plan->slices == NULL)
        return error_no_memory("the plan's regions");
    for (size_t i = 0; i < nr; i++) {
        struct region_plan *rp = &plan->regions[i];

        rp->local       = &plan->local->regions[i];
        rp->remote      = &plan->remote->regions[i];
        rp->first_slice = (uint32_t)plan->num_slices;
        if (rp->local->block_len % plan->bsr != 0)
            return error_set(KVX_ERR_INVALID,
                             "region %zu (%s): block_len %" PRIu64
                             " does not split into bsr %" PRIu64 " equal sub-blocks",
                             i, regions_region_name(plan->local, rp->local), rp->local->block_len,
                             plan->bsr);
        rp->unit_len = rp->local->block_len / plan->bsr;
        status       = plan_region_slices(plan, i);
        if (status != KVX_OK)
            return status;
        plan->num_slices += rp->num_slices;
    }
    return KVX_OK;
}

void kvx_peer_plan_destroy(kvx_peer_plan_t *plan)
{
    if (plan == NULL)
        return;
    free(plan->regions);
    free(plan->slices);
    free(plan->read_ranks);
    free(plan->notify_ranks);
    free(plan->groups);
    free(plan->group_regions);
    free(plan->pairs_per_id);
    free(plan);
}

kvx_status_t kvx_peer_plan_create(const kvx_regions_t *local, const kvx_regions_t *remote,
                                  const kvx_peer_plan_params_t *params, kvx_peer_plan_t **plan_p)
{
    kvx_peer_plan_t *plan;
    kvx_status_t status;

    if (local == NULL || remote == NULL || plan_p == NULL)
        return error_set(KVX_ERR_INVALID, "plan: both tables and a place for the result are"
                                          " required");
    plan = calloc(1, sizeof(*plan));
    if (plan == NULL)
        return error_no_memory("a plan");
    plan->local  = local;
    plan->remote = remote;
    status       = plan_params_read(local, remote, params, plan);
    if (status == KVX_OK)
        status = plan_regions_match(local, remote);
    if (status == KVX_OK)
        status = plan_regions_build(plan);
    if (status == KVX_OK)
        status = plan_ranks_build(plan);
    if (status == KVX_OK)
        status = plan_groups_build(plan);
    if (status == KVX_OK)
        status = plan_cover_prune(plan);
    if (status == KVX_OK)
        status = plan_counts_build(plan);
    if (status != KVX_OK) {
        kvx_peer_plan_destroy(plan);
        return status;
    }
    *plan_p = plan;
    return KVX_OK;
}

size_t kvx_peer_plan_num_reads(const kvx_peer_plan_t *plan)
{
    return plan->num_reads;
}

uint32_t kvx_peer_plan_read_rank(const kvx_peer_plan_t *plan, size_t read)
{
    return read < plan->num_reads ? plan->read_ranks[read] : UINT32_MAX;
}

size_t kvx_peer_plan_num_notifies(const kvx_peer_plan_t *plan)
{
    return plan->num_notifies;
}

uint32_t kvx_peer_plan_notify_rank(const kvx_peer_plan_t *plan, size_t notify)
{
    return notify < plan->num_notifies ? plan->notify_ranks[notify] : UINT32_MAX;
}

/* plan_cover.c: which regions of a group need not emit (their every pair lies inside another
 * region's pair for the same block, read from the same place), and whether any two regions
 * left can share a local byte. Plan creation only; no request ever comes here. */
#include "plan.h"

#include "error.h"

#include <stdlib.h>
#include <string.h>

/* Bounds the pairwise work of one plan: past this many region comparisons the rest of the
 * regions emit as they are (correct, only slower: the request's sweep drops what they
 * repeat, docs/plan.md "Each byte once"). 2^22 is a few ms. */
#define COVER_MAX_CHECKS (UINT64_C(1) << 22)

/* Slices x units of one region checked against another's: beyond it, no pruning. */
#define COVER_MAX_PIECES 256

/* True when for every block id and remote id the pairs of region k lie inside pairs of region
 * j from the same remote rank with the same local-to-remote offset: both sides in the same
 * storages with the same strides, and each (unit, slice) of k inside a slice of j. */
static bool region_covers(const struct kvx_peer_plan *plan, const struct region_plan *j,
                          const struct region_plan *k)
{
    const struct region *lj = j->local;
    const struct region *lk = k->local;
    const struct region *rj = j->remote;
    const struct region *rk = k->remote;

    if (lj->storage != lk->storage || rj->storage != rk->storage || lj->stride != lk->stride ||
        rj->stride != rk->stride || (uint64_t)k->num_slices * plan->bsr > COVER_MAX_PIECES)
        return false;
    for (uint64_t u = 0; u < plan->bsr; u++) {
        for (uint32_t s = 0; s < k->num_slices; s++) {
            /* Block 0 stands for every block: the strides are equal on each side. */
            kvx_pair_t pk = plan_pair_of(plan, k, 0, u, 0, s);
            bool inside   = false;

            for (uint32_t t = 0; t < j->num_slices && !inside; t++) {
                kvx_pair_t pj = plan_pair_of(plan, j, 0, u, 0, t);

                inside = plan->slices[j->first_slice + t].rank ==
                             plan->slices[k->first_slice + s].rank &&
                         pk.local_offset >= pj.local_offset &&
                         pk.local_offset + pk.len <= pj.local_offset + pj.len &&
                         pk.local_offset - pj.local_offset == pk.remote_offset - pj.remote_offset &&
                         pk.remote_offset >= pj.remote_offset;
            }
            if (!inside)
                return false;
        }
    }
    return true;
}

/* Moves to the end of group gp's list (num_covered) each region that another one of it
 * covers; of two that cover each other (the same bytes), the later one. Covering is
 * transitive, so the regions left to emit hold every byte the whole list names. `dropped`
 * and `order` have room for the list. */
static void group_prune(struct kvx_peer_plan *plan, struct group_plan *gp, bool *dropped,
                        uint32_t *order, uint64_t *checks_p)
{
    uint32_t *list = plan->group_regions + gp->first_region;
    uint32_t kept  = 0;

    for (uint32_t a = 0; a < gp->num_regions; a++) {
        const struct region_plan *k = &plan->regions[list[a]];

        dropped[a] = false;
        for (uint32_t b = 0; b < gp->num_regions && !dropped[a]; b++) {
            const struct region_plan *j = &plan->regions[list[b]];

            if (b == a || *checks_p >= COVER_MAX_CHECKS)
                continue;
            ++*checks_p;
            dropped[a] = region_covers(plan, j, k) && (b < a || !region_covers(plan, k, j));
        }
    }
    memcpy(order, list, gp->num_regions * sizeof(*order));
    for (uint32_t a = 0; a < gp->num_regions; a++) { /* the regions that emit, in order */
        if (!dropped[a])
            list[kept++] = order[a];
    }
    for (uint32_t a = 0, b = kept; a < gp->num_regions; a++) { /* then the covered ones */
        if (!dropped[a])
            continue;
        list[b++] = order[a];
        gp->num_covered++;
        gp->covered_per_id += (uint64_t)plan->regions[order[a]].num_slices * plan->bsr;
    }
    gp->num_regions = kept;
}

/* Local bytes of region r: its first to its last block's end (every block lies inside). */
static uint64_t region_end(const struct region *r)
{
    return r->offset + (r->num_blocks - 1) * r->stride + r->block_len;
}

/* Whether some block of a can share a byte with some block of b (both local). With one
 * stride, by where each lies in a period of the stride; otherwise by their spans. */
static bool regions_may_overlap(const struct region *a, const struct region *b)
{
    if (a->storage != b->storage || a->offset >= region_end(b) || b->offset >= region_end(a))
        return false;
    if (a->stride == b->stride && a->block_len + b->block_len <= a->stride) {
        uint64_t s = a->stride;
        uint64_t d = (b->offset % s + s - a->offset % s) % s; /* b's start after a's, mod s */

        return d < a->block_len || s - d < b->block_len;
    }
    return true;
}

static int compare_region_start(const void *x, const void *y)
{
    const struct region *a = *(const struct region *const *)x;
    const struct region *b = *(const struct region *const *)y;

    if (a->storage != b->storage)
        return a->storage < b->storage ? -1 : 1;
    return (a->offset > b->offset) - (a->offset < b->offset);
}

/* may_overlap: of the regions some group emits, one whose blocks overlap each other, or two
 * that can share a byte. Regions are taken in order of their start, each compared with those
 * still open (whose span reaches it), so disjoint tables cost a sort. */
static kvx_status_t plan_overlap_find(struct kvx_peer_plan *plan, const bool *emits)
{
    size_t nr                   = plan->local->num_regions;
    const struct region **order = calloc(nr, sizeof(*order));
    size_t n                    = 0;
    uint64_t checks             = 0;

    if (order == NULL)
        return error_no_memory("the plan's overlap check");
    for (size_t r = 0; r < nr; r++) {
        if (emits[r])
            order[n++] = plan->regions[r].local;
    }
    qsort(order, n, sizeof(*order), compare_region_start);
    for (size_t i = 0; i < n && !plan->may_overlap; i++) {
        const struct region *r = order[i];

        plan->may_overlap = r->num_blocks > 1 && r->block_len > r->stride;
        for (size_t p = i; p-- > 0 && !plan->may_overlap;) {
            if (order[p]->storage != r->storage)
                break;
            /* Past the bound, assume the worst: the sweep then checks every request. */
            plan->may_overlap = ++checks > COVER_MAX_CHECKS || regions_may_overlap(order[p], r);
        }
    }
    free(order);
    return KVX_OK;
}

kvx_status_t plan_cover_prune(struct kvx_peer_plan *plan)
{
    size_t nr       = plan->local->num_regions;
    bool *dropped   = calloc(nr + 1, sizeof(*dropped));
    bool *emits     = calloc(nr + 1, sizeof(*emits));
    uint32_t *order = calloc(nr + 1, sizeof(*order));
    uint64_t checks = 0;
    kvx_status_t status;

    if (dropped == NULL || emits == NULL || order == NULL) {
        free(dropped);
        free(emits);
        free(order);
        return error_no_memory("the plan's group lists");
    }
    for (size_t g = 0; g < plan->num_groups; g++) {
        struct group_plan *gp = &plan->groups[g];

        group_prune(plan, gp, dropped, order, &checks);
        for (uint32_t i = 0; i < gp->num_regions; i++) {
            uint32_t r = plan->group_regions[gp->first_region + i];

            emits[r] = true;
            plan->has_shared |= !plan->single_group && plan->regions[r].local->group == -1;
        }
        if (gp->num_regions + gp->num_covered > 0 && gp->local_capacity > plan->max_capacity)
            plan->max_capacity = gp->local_capacity;
    }
    status = plan_overlap_find(plan, emits);
    free(dropped);
    free(emits);
    free(order);
    return status;
}

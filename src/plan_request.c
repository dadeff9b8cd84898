/* plan_request.c: one request through a prepared plan: checks the request's shape, sizes the
 * output once, emits coalesced pairs per read rank, checking each block id as it reads it,
 * then makes sure each local byte is moved once (plan_dedup.c does the list work). Work and
 * memory follow the request's blocks, never the table's size. */
#include "plan.h"

#include "error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pair_list {
    kvx_pair_t *pairs;
    size_t count;
    size_t max;  /* allocated entries */
    size_t need; /* pairs the current request may write, before coalescing */
};

/* Block ids up to this capacity are checked for repeats with a stamp per block; beyond it
 * (a table of more blocks than any engine allocates) by sorting a copy. 2^20: 1 MiB. */
#define STAMPS_MAX (UINT64_C(1) << 20)

struct kvx_pairs {
    struct pair_list *reads;
    uint32_t *ranks;  /* remote rank of each read */
    size_t num_reads; /* reads of the last request; 0 after a failed one */
    size_t max_reads; /* allocated entries of reads and ranks */
    kvx_pairs_stats_t stats;
    kvx_pair_t *scratch; /* 2 x every read's pairs: sorted copies (each byte once) */
    size_t max_scratch;  /* allocated entries */
    uint8_t *stamps;     /* by local block id: the check that last saw it (repeated ids); a
                            byte keeps 4096 blocks in 4 KiB of L1 */
    uint64_t max_stamps; /* allocated entries */
    uint8_t stamp;       /* the current check's stamp; 0 is never one */
    bool *ascend;        /* by request group: its ids ascend, as its first region's pairs show */
    size_t max_ascend;   /* allocated entries */
};

kvx_status_t kvx_pairs_create(kvx_pairs_t **pairs_p)
{
    kvx_pairs_t *pairs;

    if (pairs_p == NULL)
        return error_set(KVX_ERR_INVALID, "pairs: no place for the result");
    pairs = calloc(1, sizeof(*pairs));
    if (pairs == NULL)
        return error_no_memory("a pair buffer");
    *pairs_p = pairs;
    return KVX_OK;
}

void kvx_pairs_destroy(kvx_pairs_t *pairs)
{
    if (pairs == NULL)
        return;
    for (size_t i = 0; i < pairs->max_reads; i++)
        free(pairs->reads[i].pairs);
    free(pairs->reads);
    free(pairs->ranks);
    free(pairs->scratch);
    free(pairs->stamps);
    free(pairs->ascend);
    free(pairs);
}

size_t kvx_pairs_num_reads(const kvx_pairs_t *pairs)
{
    return pairs->num_reads;
}

const kvx_pair_t *kvx_pairs_read(const kvx_pairs_t *pairs, size_t read, uint32_t *remote_rank_p,
                                 size_t *count_p)
{
    if (read >= pairs->num_reads)
        return NULL;
    if (remote_rank_p != NULL)
        *remote_rank_p = pairs->ranks[read];
    if (count_p != NULL)
        *count_p = pairs->reads[read].count;
    return pairs->reads[read].pairs;
}

const kvx_pair_t *plan_pairs_of_rank(const kvx_pairs_t *pairs, uint32_t rank, size_t *count_p)
{
    for (size_t r = 0; r < pairs->num_reads; r++) {
        if (pairs->ranks[r] == rank)
            return kvx_pairs_read(pairs, r, NULL, count_p);
    }
    *count_p = 0;
    return NULL;
}

void kvx_pairs_stats(const kvx_pairs_t *pairs, kvx_pairs_stats_t *stats_p)
{
    *stats_p = pairs->stats;
}

/* The group plan of request group g (binary search over the table's group ids). */
static size_t plan_group_index(const kvx_peer_plan_t *plan, size_t g)
{
    size_t lo = 0;
    size_t hi = plan->num_groups - 1; /* the last entry is the -1 one */

    if (plan->single_group)
        return 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if ((uint64_t)plan->groups[mid].group < g)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < plan->num_groups - 1 && (uint64_t)plan->groups[lo].group == g
               ? lo
               : plan->num_groups - 1;
}

/* The out-of-range message for `id` on one side, naming the first region of the group
 * too small for it (the caller knows one exists). */
static kvx_status_t request_id_out_of_range(const kvx_peer_plan_t *plan,
                                            const struct group_plan *gp, size_t g, bool remote,
                                            uint64_t id)
{
    uint32_t first = UINT32_MAX; /* in table order, covered regions included */

    for (uint32_t i = 0; i < gp->num_regions + gp->num_covered; i++) {
        uint32_t r                   = plan->group_regions[gp->first_region + i];
        const struct region_plan *rp = &plan->regions[r];
        const struct region *region  = remote ? rp->remote : rp->local;

        if (id >= region->num_blocks && r < first)
            first = r;
    }
    if (first != UINT32_MAX) {
        const struct region_plan *rp = &plan->regions[first];
        const struct region *region  = remote ? rp->remote : rp->local;

        return error_set(KVX_ERR_OUT_OF_RANGE,
                         "request: %s block id %" PRIu64 " of group %zu is out of range"
                         " for region %" PRIu32 " (%s) of %" PRIu64
                         " blocks; nothing is transferred",
                         remote ? "remote" : "local", id, g, first,
                         regions_region_name(plan->local, rp->local), region->num_blocks);
    }
    return error_set(KVX_ERR_INTERNAL, "request: id %" PRIu64 " out of range in no region", id);
}

/* Checks group g of the request and adds the pairs it yields to each read's `need`. With
 * `check_ids` false the ids themselves are not read: the emission checks each id against the
 * same limits as it reads it (emit_group_region), and a request it finds at fault comes back
 * here with `check_ids` true, so the message is the one this order of checks gives. */
static kvx_status_t request_group_check(const kvx_peer_plan_t *plan, const kvx_request_t *req,
                                        size_t g, bool check_ids, kvx_pairs_t *pairs)
{
    size_t gi                   = plan_group_index(plan, g);
    const struct group_plan *gp = &plan->groups[gi];
    const kvx_group_ids_t *l    = &req->local[g];
    const kvx_group_ids_t *r    = req->remote != NULL ? &req->remote[g] : NULL;
    uint64_t local_limit; /* local ids below this need no further check */
    size_t remote_count;

    if ((l->count > 0 && l->ids == NULL) || (r != NULL && r->count > 0 && r->ids == NULL))
        return error_set(KVX_ERR_INVALID, "request: group %zu has ids but no array", g);
    /* No region of its own: only the layout's groups folded whole into shared regions may
     * still name ids. */
    if (!plan->single_group && gi == plan->num_groups - 1 &&
        (l->count > 0 || (r != NULL && r->count > 0)) && !regions_has_group(plan->local, g))
        return regions_group_unknown(plan->local, g);
    if (gp->num_regions == 0)
        return KVX_OK; /* no region takes this group: its ids move nothing */
    if (__builtin_mul_overflow(l->count, (size_t)plan->bsr, &remote_count))
        return error_set(KVX_ERR_INVALID, "request: group %zu is too large", g);
    if (r != NULL && r->count != remote_count) {
        const struct region *first = plan->regions[plan->group_regions[gp->first_region]].local;

        return error_set(KVX_ERR_INVALID,
                         "request: group %zu has %zu local block ids and %zu remote ones; with"
                         " bsr %" PRIu64 " region %" PRIu32 " (%s) needs %zu remote ids",
                         g, l->count, r->count, plan->bsr, plan->group_regions[gp->first_region],
                         regions_region_name(plan->local, first), remote_count);
    }
    /* By default local block b reads remote blocks b*bsr .. b*bsr + bsr - 1, so b must stay
     * below remote_capacity / bsr as well. */
    local_limit = gp->local_capacity;
    if (r == NULL && gp->remote_capacity / plan->bsr < local_limit)
        local_limit = gp->remote_capacity / plan->bsr;
    for (size_t i = 0; check_ids && i < l->count; i++) {
        uint64_t id = l->ids[i];

        if (id < local_limit)
            continue;
        if (id >= gp->local_capacity)
            return request_id_out_of_range(plan, gp, g, false, id);
        return request_id_out_of_range(plan, gp, g, true, id * plan->bsr + plan->bsr - 1);
    }
    for (size_t i = 0; check_ids && r != NULL && i < r->count; i++) {
        if (r->ids[i] >= gp->remote_capacity)
            return request_id_out_of_range(plan, gp, g, true, r->ids[i]);
    }
    for (size_t j = 0; j < plan->num_reads; j++) {
        uint64_t per_id = plan->pairs_per_id[gi * plan->num_reads + j];
        size_t n;

        if (__builtin_mul_overflow(l->count, (size_t)per_id, &n) ||
            __builtin_add_overflow(pairs->reads[j].need, n, &pairs->reads[j].need))
            return error_set(KVX_ERR_INVALID, "request: the pair count overflows");
    }
    return KVX_OK;
}

/* Makes room for the plan's reads and for each read's `need` pairs. */
static kvx_status_t pairs_reserve(kvx_pairs_t *pairs, const kvx_peer_plan_t *plan)
{
    if (plan->num_reads > pairs->max_reads) {
        struct pair_list *reads = realloc(pairs->reads, plan->num_reads * sizeof(*reads));
        uint32_t *ranks;

        if (reads == NULL)
            return error_no_memory("pair lists");
        pairs->reads = reads;
        memset(reads + pairs->max_reads, 0, (plan->num_reads - pairs->max_reads) * sizeof(*reads));
        ranks = realloc(pairs->ranks, plan->num_reads * sizeof(*ranks));
        if (ranks == NULL)
            return error_no_memory("pair lists"); /* reads grew, max_reads still says not */
        pairs->ranks     = ranks;
        pairs->max_reads = plan->num_reads;
    }
    for (size_t j = 0; j < plan->num_reads; j++)
        pairs->reads[j].need = 0;
    return KVX_OK;
}

/* Makes room for the list's `need` pairs, emptying it. The pairs start on a cache line, so
 * that plan_stream's 32-byte stores never straddle two. */
static kvx_status_t pairs_grow(struct pair_list *list)
{
    size_t max = list->max;
    kvx_pair_t *grown;

    if (list->need <= max && list->pairs != NULL) /* never NULL: NULL means "no such read" */
        return KVX_OK;
    if (list->need > SIZE_MAX / 2 / sizeof(*grown))
        return error_no_memory("pairs");
    while (max < list->need || max == 0)
        max = max < 64 ? 64 : max * 2;
    grown = aligned_alloc(64, max * sizeof(*grown)); /* a multiple of 64: max >= 64 */
    if (grown == NULL)
        return error_no_memory("pairs");
    free(list->pairs);
    list->pairs = grown;
    list->max   = max;
    return KVX_OK;
}

/* Appends a pair, merging it into the previous one when both ranges continue it and the
 * merged length stays within max_pair_len. */
static inline void pair_append(struct pair_list *list, const kvx_pair_t *p, uint64_t max_len)
{
    if (list->count > 0) {
        kvx_pair_t *last = &list->pairs[list->count - 1];

        if (last->local_storage == p->local_storage && last->remote_storage == p->remote_storage &&
            last->local_offset + last->len == p->local_offset &&
            last->remote_offset + last->len == p->remote_offset &&
            (max_len == 0 || last->len + p->len <= max_len)) {
            last->len += p->len;
            return;
        }
    }
    list->pairs[list->count++] = *p;
}

/* Emits local block `lb` of region `rp`, paired with its bsr remote blocks (`remote_ids`,
 * or lb*bsr + k when NULL), slice by slice. */
static void emit_block(const kvx_peer_plan_t *plan, kvx_pairs_t *pairs,
                       const struct region_plan *rp, uint64_t lb, const uint64_t *remote_ids)
{
    for (uint64_t k = 0; k < plan->bsr; k++) {
        uint64_t rb = remote_ids != NULL ? remote_ids[k] : lb * plan->bsr + k;

        for (uint32_t s = 0; s < rp->num_slices; s++) {
            kvx_pair_t p = plan_pair_of(plan, rp, lb, k, rb, s);

            pairs->stats.descriptors++;
            pairs->stats.bytes += p.len;
            pair_append(&pairs->reads[plan->slices[rp->first_slice + s].read], &p,
                        plan->max_pair_len);
        }
    }
}

/* Four ids as one value of the compiler's vector extension (two SSE2 registers, one AVX2). */
typedef uint64_t ids_x4 __attribute__((vector_size(32)));

/* How many of ids[0..n) continue `next`, next + 1, ...: the length of a run of consecutive
 * ids. Blocks of 16 are compared whole in vector registers, with no exit inside; the block
 * that breaks the run is walked id by id. */
static inline size_t ids_consecutive(const uint64_t *ids, size_t n, uint64_t next)
{
    ids_x4 want = {next, next + 1, next + 2, next + 3};
    size_t k    = 0;

    for (; k + 16 <= n; k += 16) {
        ids_x4 a;
        ids_x4 b;
        ids_x4 c;
        ids_x4 d;
        ids_x4 diff;

        memcpy(&a, ids + k, sizeof(a)); /* ids need not be 32-byte aligned */
        memcpy(&b, ids + k + 4, sizeof(b));
        memcpy(&c, ids + k + 8, sizeof(c));
        memcpy(&d, ids + k + 12, sizeof(d));
        diff = (a ^ want) | (b ^ (want + 4)) | (c ^ (want + 8)) | (d ^ (want + 12));
        if ((diff[0] | diff[1] | diff[2] | diff[3]) != 0)
            break;
        want += 16;
    }
    while (k < n && ids[k] == next + k)
        k++;
    return k;
}

/* How many of the k ids after `id`, which count up from it (ids_consecutive), the run may take:
 * ids stay below their limits, the run within its room. The ids it leaves are looked at one by
 * one again, so the one over a limit fails and the one over room starts a new pair. */
static inline size_t run_take(const struct single_run *sr, size_t k, uint64_t id, uint64_t rid,
                              uint64_t run, const bool has_remote, const bool has_limit)
{
    if (k > sr->local_limit - 1 - id)
        k = sr->local_limit - 1 - id;
    if (has_remote && k > sr->remote_limit - 1 - rid)
        k = sr->remote_limit - 1 - rid;
    if (has_limit) {
        uint64_t room_ids = run > sr->room ? 0 : (sr->room - run) / sr->len + 1;

        if (k > room_ids)
            k = room_ids;
    }
    return k;
}

/* emit_single's loop over ids[i..n), continuing the pair *cur_p (not yet written) from `out`.
 * Two phases take turns. While ids continue the pair being built, it grows in registers; where
 * both strides are the length, every id that counts on from there joins it in one step. Once
 * one does not, the loop streams: it writes each id's pair at once (four at a time where
 * plan_stream can) and looks only at whether the next local offset continues the last one,
 * which a scattered request almost never does; when one does, the last pair written goes back
 * into registers and the id is looked at again by the first phase, which checks the remote
 * side and the length limit too. With `has_remote` false the remote id is the local one, whose
 * limit then covers both sides; with `has_limit` false runs have no length limit. Always
 * inlined with constant flags, so each of the four loops carries only the state it needs.
 * Returns the next free slot, or NULL at the first id over its limit. */
static inline __attribute__((always_inline)) kvx_pair_t *
emit_single_ids(const struct single_run *sr, const uint64_t *local_ids, const uint64_t *remote_ids,
                size_t i, size_t n, const kvx_pair_t *cur_p, kvx_pair_t *out, const bool has_remote,
                const bool has_limit)
{
    const uint64_t lbase        = sr->local_base;
    const uint64_t rbase        = sr->remote_base;
    const uint64_t lstride      = sr->local_stride;
    const uint64_t rstride      = sr->remote_stride;
    const uint64_t len          = sr->len;
    const uint64_t room         = sr->room;
    const uint64_t local_limit  = sr->local_limit;
    const uint64_t remote_limit = sr->remote_limit;
    const uint32_t lstorage     = sr->local_storage;
    const uint32_t rstorage     = sr->remote_storage;
    uint64_t lo                 = cur_p->local_offset;
    uint64_t ro                 = cur_p->remote_offset;
    uint64_t run                = cur_p->len;

    while (i < n) {
        uint64_t id  = local_ids[i];
        uint64_t rid = has_remote ? remote_ids[i] : id;
        uint64_t next_lo;
        uint64_t next_ro;

        if (id >= local_limit || (has_remote && rid >= remote_limit))
            return NULL;
        next_lo = lbase + id * lstride;
        next_ro = rbase + rid * rstride;
        i++;
        if (next_lo == lo + run && next_ro == ro + run && (!has_limit || run <= room)) {
            run += len;
            if (sr->contiguous) { /* every id that counts on from here joins in one step */
                size_t k = ids_consecutive(local_ids + i, n - i, id + 1);

                if (has_remote)
                    k = ids_consecutive(remote_ids + i, k, rid + 1);
                k = run_take(sr, k, id, rid, run, has_remote, has_limit);
                run += k * len;
                i += k;
            }
            continue;
        }
        *out++ = (kvx_pair_t){lstorage, rstorage, lo, ro, run};
        *out++ = (kvx_pair_t){lstorage, rstorage, next_lo, next_ro, len};
        lo     = next_lo;
        if (sr->stream && n - i >= 8) {
            size_t k = plan_stream(sr, local_ids + i, has_remote ? remote_ids + i : NULL, n - i,
                                   lo, out);

            if (k > 0) {
                out += k;
                i += k;
                lo = out[-1].local_offset;
            }
        }
        for (; i < n; i++) { /* out[-1] is the last pair, lo its local offset */
            uint64_t end = lo + len;

            id  = local_ids[i];
            rid = has_remote ? remote_ids[i] : id;
            if (id >= local_limit || (has_remote && rid >= remote_limit))
                return NULL;
            lo = lbase + id * lstride;
            if (lo == end)
                break;
            *out++ = (kvx_pair_t){lstorage, rstorage, lo, rbase + rid * rstride, len};
        }
        out--; /* the last pair written is the one being built again */
        lo  = out->local_offset;
        ro  = out->remote_offset;
        run = len;
    }
    *out++ = (kvx_pair_t){lstorage, rstorage, lo, ro, run};
    return out;
}

/* The common case, one slice and bsr 1: one pair per block id, and every id checked as it is
 * read (local ids below local_limit, remote ones below remote_limit), so each id is read once
 * per region. The pair being built stays in registers until an id fails to continue it; the
 * general path re-reads the last written pair from memory for every id. On entry the list
 * has room for n more pairs. Returns false at the first id over its limit, having written
 * pairs but not counted them; the caller then fails the whole request. Kept out of line so
 * that the general path's state does not crowd its loops out of registers. */
static __attribute__((noinline)) bool
emit_single(const kvx_peer_plan_t *plan, const struct region_plan *rp, const uint64_t *local_ids,
            const uint64_t *remote_ids, size_t n, uint64_t local_limit, uint64_t remote_limit,
            kvx_pairs_t *pairs)
{
    const struct slice *sl     = &plan->slices[rp->first_slice];
    struct pair_list *list     = &pairs->reads[sl->read];
    const uint64_t max_len     = plan->max_pair_len;
    struct single_run sr       = {
        .local_base    = rp->local->offset + sl->local_offset,
        .remote_base   = rp->remote->offset + sl->remote_offset,
        .local_stride  = rp->local->stride,
        .remote_stride = rp->remote->stride,
        .len           = sl->len,
        /* run + len <= max_pair_len without overflow; never when one descriptor exceeds it */
        .room           = max_len < sl->len ? 0 : max_len - sl->len,
        .local_limit    = local_limit,
        .remote_limit   = remote_limit,
        .contiguous     = rp->local->stride == sl->len && rp->remote->stride == sl->len,
        .local_storage  = rp->local->storage,
        .remote_storage = rp->remote->storage,
    };
    kvx_pair_t *out = list->pairs + list->count;
    kvx_pair_t cur;
    size_t i = 0;

    if (n == 0)
        return true;
    sr.stream = n >= 16 && plan_stream_usable(&sr);
    if (list->count > 0 && out[-1].local_storage == sr.local_storage &&
        out[-1].remote_storage == sr.remote_storage) {
        cur = *--out; /* the list's last pair may continue: build on it */
    } else {
        uint64_t rid = remote_ids != NULL ? remote_ids[0] : local_ids[0];

        if (local_ids[0] >= local_limit || rid >= remote_limit)
            return false;
        cur = (kvx_pair_t){sr.local_storage, sr.remote_storage,
                           sr.local_base + local_ids[0] * sr.local_stride,
                           sr.remote_base + rid * sr.remote_stride, sr.len};
        i   = 1;
    }
    if (remote_ids == NULL)
        out = max_len == 0 ? emit_single_ids(&sr, local_ids, NULL, i, n, &cur, out, false, false)
                           : emit_single_ids(&sr, local_ids, NULL, i, n, &cur, out, false, true);
    else
        out = max_len == 0
                  ? emit_single_ids(&sr, local_ids, remote_ids, i, n, &cur, out, true, false)
                  : emit_single_ids(&sr, local_ids, remote_ids, i, n, &cur, out, true, true);
    if (out == NULL)
        return false;
    list->count = (size_t)(out - list->pairs);
    pairs->stats.descriptors += n;
    pairs->stats.bytes += n * sr.len;
    return true;
}

/* Emits every block of group g (group plan gp) for region rp, checking each id against the
 * group's limits as request_group_check does. False at the first id over a limit. */
static bool emit_group_region(const kvx_peer_plan_t *plan, const kvx_request_t *req, size_t g,
                              const struct group_plan *gp, const struct region_plan *rp,
                              kvx_pairs_t *pairs)
{
    const kvx_group_ids_t *l = &req->local[g];
    const uint64_t *remote   = req->remote != NULL ? req->remote[g].ids : NULL;
    const uint64_t bsr       = plan->bsr;
    uint64_t local_limit     = gp->local_capacity;
    uint64_t remote_limit    = gp->remote_capacity;

    /* By default local block b reads remote blocks b*bsr .. b*bsr + bsr - 1. */
    if (remote == NULL && remote_limit / bsr < local_limit)
        local_limit = remote_limit / bsr;
    if (bsr == 1 && rp->num_slices == 1)
        return emit_single(plan, rp, l->ids, remote, l->count, local_limit, remote_limit, pairs);
    for (size_t i = 0; i < l->count; i++) {
        const uint64_t *remote_ids = remote != NULL ? remote + i * bsr : NULL;

        if (l->ids[i] >= local_limit)
            return false;
        for (uint64_t k = 0; remote_ids != NULL && k < bsr; k++) {
            if (remote_ids[k] >= remote_limit)
                return false;
        }
        emit_block(plan, pairs, rp, l->ids[i], remote_ids);
    }
    return true;
}

/* emit_group_region for the first region of group g, noting in ascend[g] whether its pairs
 * came out in local order with one pair per id (one slice, bsr 1): then the group's ids
 * ascend and none repeats, which request_repeats_check need not look at. Costs a pass over
 * the pairs written, not the ids: one pair for a run of consecutive ids. */
static bool emit_group_first(const kvx_peer_plan_t *plan, const kvx_request_t *req, size_t g,
                             const struct group_plan *gp, const struct region_plan *rp,
                             kvx_pairs_t *pairs)
{
    const struct pair_list *list = &pairs->reads[plan->slices[rp->first_slice].read];
    size_t start = list->count > 0 ? list->count - 1 : 0; /* the first id may extend it */

    if (!emit_group_region(plan, req, g, gp, rp, pairs))
        return false;
    pairs->ascend[g] = plan->bsr == 1 && rp->num_slices == 1 &&
                       plan_pairs_ordered(list->pairs + start, list->count - start);
    return true;
}

/* Emits the request's pairs in the order of regions.md "Descriptors". One distinct group:
 * each region takes every group's ids, region by region. Several: group, then region, then
 * block. False when an id is over its limit (see emit_group_region). */
static bool request_emit(const kvx_peer_plan_t *plan, const kvx_request_t *req, kvx_pairs_t *pairs)
{
    if (plan->single_group) {
        const struct group_plan *gp = &plan->groups[0];

        for (uint32_t i = 0; i < gp->num_regions; i++) {
            const struct region_plan *rp = &plan->regions[plan->group_regions[i]];

            for (size_t g = 0; g < req->num_local_groups; g++) {
                if (!(i == 0 ? emit_group_first : emit_group_region)(plan, req, g, gp, rp, pairs))
                    return false;
            }
        }
        return true;
    }
    for (size_t g = 0; g < req->num_local_groups; g++) {
        const struct group_plan *gp = &plan->groups[plan_group_index(plan, g)];

        for (uint32_t i = 0; i < gp->num_regions; i++) {
            if (!(i == 0 ? emit_group_first : emit_group_region)(
                    plan, req, g, gp, &plan->regions[plan->group_regions[gp->first_region + i]],
                    pairs))
                return false;
        }
    }
    return true;
}

/* The error of a request that failed after its shape was checked (an id over a limit, or a
 * pair list that could not grow): the whole check in its own order, ids included, so the
 * message names the first fault as it always has; `status` when the check finds none. Out of
 * line: only failed requests come here. */
static kvx_status_t __attribute__((noinline, cold))
request_fail(const kvx_peer_plan_t *plan, const kvx_request_t *req, kvx_pairs_t *pairs,
             kvx_status_t status)
{
    pairs->stats = (kvx_pairs_stats_t){0};
    for (size_t j = 0; j < plan->num_reads; j++)
        pairs->reads[j].need = 0;
    for (size_t g = 0; g < req->num_local_groups; g++) {
        kvx_status_t first = request_group_check(plan, req, g, true, pairs);

        if (first != KVX_OK)
            return first;
    }
    if (status != KVX_OK)
        return status;
    return error_set(KVX_ERR_INTERNAL, "request: an id failed emission but passed the check");
}

/* Room for one ascend flag per request group, all false. */
static kvx_status_t ascend_reserve(kvx_pairs_t *pairs, size_t n)
{
    if (n > pairs->max_ascend) {
        bool *ascend = realloc(pairs->ascend, n * sizeof(*ascend));

        if (ascend == NULL)
            return error_no_memory("the request's groups");
        pairs->ascend     = ascend;
        pairs->max_ascend = n;
    }
    memset(pairs->ascend, 0, n * sizeof(*pairs->ascend));
    return KVX_OK;
}

/* Grows the stamps to n entries, zeroed (no check has seen any id yet). */
static kvx_status_t stamps_reserve(kvx_pairs_t *pairs, uint64_t n)
{
    uint8_t *stamps;

    if (n <= pairs->max_stamps)
        return KVX_OK;
    stamps = calloc(n, sizeof(*stamps));
    if (stamps == NULL)
        return error_no_memory("the request's id check");
    free(pairs->stamps);
    pairs->stamps     = stamps;
    pairs->max_stamps = n;
    pairs->stamp      = 0;
    return KVX_OK;
}

/* Marks each of ids[0..n) with `stamp`; false when one already had it (an id repeats).
 * Four ids a round, state in locals: about five instructions an id, the cost of a scattered
 * request's check (docs/plan.md "Each byte once"). */
static bool stamps_mark(uint8_t *stamps, uint8_t stamp, const uint64_t *ids, size_t n)
{
    size_t i = 0;

    for (; i + 4 <= n; i += 4) {
        uint64_t a = ids[i];
        uint64_t b = ids[i + 1];
        uint64_t c = ids[i + 2];
        uint64_t d = ids[i + 3];

        if (stamps[a] == stamp)
            return false;
        stamps[a] = stamp;
        if (stamps[b] == stamp)
            return false;
        stamps[b] = stamp;
        if (stamps[c] == stamp)
            return false;
        stamps[c] = stamp;
        if (stamps[d] == stamp)
            return false;
        stamps[d] = stamp;
    }
    for (; i < n; i++) {
        if (stamps[ids[i]] == stamp)
            return false;
        stamps[ids[i]] = stamp;
    }
    return true;
}

/* Refuses a block id named twice in one group (docs/plan.md "The request"): it would move
 * the same bytes twice. Ids that ascend cost one branch-free pass; others one stamp per id,
 * by local id (the emission has checked each is below its group's capacity, at most
 * max_capacity). Runs after a successful emission, so an id out of range is reported first. */
static kvx_status_t request_repeats_check(const kvx_peer_plan_t *plan, const kvx_request_t *req,
                                          kvx_pairs_t *pairs)
{
    for (size_t g = 0; g < req->num_local_groups; g++) {
        const kvx_group_ids_t *l = &req->local[g];
        kvx_status_t status;
        uint8_t stamp;

        if (l->count < 2 || pairs->ascend[g] || regions_ids_ascend(l->ids, l->count))
            continue;
        if (plan->max_capacity > STAMPS_MAX) {
            status = regions_group_check_repeats(l, g);
            if (status != KVX_OK)
                return status;
            continue;
        }
        status = stamps_reserve(pairs, plan->max_capacity);
        if (status != KVX_OK)
            return status;
        if (pairs->stamp == UINT8_MAX) {
            memset(pairs->stamps, 0, pairs->max_stamps * sizeof(*pairs->stamps));
            pairs->stamp = 0;
        }
        stamp = ++pairs->stamp;
        if (!stamps_mark(pairs->stamps, stamp, l->ids, l->count)) {
            /* Which id: look again, one at a time, with a stamp of its own. Cold. */
            stamp = pairs->stamp = (uint8_t)(pairs->stamp == UINT8_MAX ? 1 : pairs->stamp + 1);
            if (stamp == 1)
                memset(pairs->stamps, 0, pairs->max_stamps);
            for (size_t i = 0;; i++) {
                if (pairs->stamps[l->ids[i]] == stamp)
                    return regions_id_repeated(g, l->ids[i]);
                pairs->stamps[l->ids[i]] = stamp;
            }
        }
    }
    return KVX_OK;
}

/* Where a conflicting byte came from: the request's group, block ids and region. */
struct origin {
    bool found;
    size_t group;
    uint64_t local_id;
    uint64_t remote_id;
    uint32_t region;
    uint32_t rank;
};

/* Whether pair p (of read `read`) writes local byte `byte` from the place `src` (of read
 * src_read) reads it from; across reads (`cross`) src's remote_storage holds its read. */
static bool pair_is_source(const kvx_pair_t *p, size_t read, const kvx_pair_t *src,
                           size_t src_read, uint64_t byte, bool cross)
{
    if (p->local_storage != src->local_storage || byte < p->local_offset ||
        byte - p->local_offset >= p->len)
        return false;
    if (cross)
        return read == src->remote_storage;
    return read == src_read && p->remote_storage == src->remote_storage &&
           p->remote_offset + (byte - p->local_offset) ==
               src->remote_offset + (byte - src->local_offset);
}

/* The message for two sources of one local byte, naming the group, block ids and region of
 * each, found by walking the request again pair by pair. Cold: only a refused request. */
static kvx_status_t __attribute__((noinline, cold))
request_conflict(const kvx_peer_plan_t *plan, const kvx_request_t *req, size_t read,
                 const struct plan_conflict *c, bool cross)
{
    struct origin o[2]       = {{0}, {0}};
    const kvx_pair_t *src[2] = {&c->a, &c->b};
    char rank[2][24]         = {"", ""};

    for (size_t g = 0; g < req->num_local_groups && !(o[0].found && o[1].found); g++) {
        const struct group_plan *gp = &plan->groups[plan_group_index(plan, g)];
        const kvx_group_ids_t *l    = &req->local[g];
        const uint64_t *remote      = req->remote != NULL ? req->remote[g].ids : NULL;

        for (uint32_t i = 0; i < gp->num_regions; i++) {
            uint32_t r                   = plan->group_regions[gp->first_region + i];
            const struct region_plan *rp = &plan->regions[r];

            for (size_t x = 0; x < l->count; x++) {
                for (uint64_t k = 0; k < plan->bsr; k++) {
                    uint64_t lb = l->ids[x];
                    uint64_t rb = remote != NULL ? remote[x * plan->bsr + k] : lb * plan->bsr + k;

                    for (uint32_t s = 0; s < rp->num_slices; s++) {
                        const struct slice *sl = &plan->slices[rp->first_slice + s];
                        kvx_pair_t p           = plan_pair_of(plan, rp, lb, k, rb, s);

                        for (size_t side = 0; side < 2; side++) {
                            if (!o[side].found &&
                                pair_is_source(&p, sl->read, src[side], read, c->byte, cross))
                                o[side] = (struct origin){true, g, lb, rb, r, sl->rank};
                        }
                    }
                }
            }
        }
    }
    if (!o[0].found || !o[1].found)
        return error_set(KVX_ERR_INTERNAL,
                         "request: local byte %" PRIu64 " has two sources the request does not"
                         " name",
                         c->byte);
    for (size_t side = 0; side < 2; side++) { /* ranks differ only across reads */
        if (cross)
            snprintf(rank[side], sizeof(rank[side]), " rank %" PRIu32, o[side].rank);
    }
    return error_set(
        KVX_ERR_INVALID,
        "request: local byte %" PRIu64 " of storage %s would be written twice, from different"
        " places: group %zu block %" PRIu64 " reads it from remote%s block %" PRIu64
        " (region %" PRIu32 ", %s), group %zu block %" PRIu64 " from remote%s block %" PRIu64
        " (region %" PRIu32 ", %s); nothing is transferred",
        c->byte, plan->local->storage_names[c->b.local_storage], o[0].group, o[0].local_id,
        rank[0], o[0].remote_id, o[0].region,
        regions_region_name(plan->local, &plan->local->regions[o[0].region]), o[1].group,
        o[1].local_id, rank[1], o[1].remote_id, o[1].region,
        regions_region_name(plan->local, &plan->local->regions[o[1].region]));
}

/* How a request stands towards naming one local byte twice (docs/plan.md "Each byte once"). */
enum overlap {
    OVERLAP_NONE,    /* it cannot: nothing to check */
    OVERLAP_MAYBE,   /* it can: look */
    OVERLAP_CERTAIN, /* it does: a named group has regions another one covers */
};

static enum overlap request_overlap(const kvx_peer_plan_t *plan, const kvx_request_t *req)
{
    size_t named = 0; /* groups with ids */

    for (size_t g = 0; g < req->num_local_groups; g++) {
        if (req->local[g].count == 0)
            continue;
        named++;
        if (plan->groups[plan_group_index(plan, g)].num_covered > 0)
            return OVERLAP_CERTAIN;
    }
    /* Apart from covered regions, a byte is named twice only by two regions that overlap, or
     * by one region taking two groups' ids (ids repeated within a group are refused). */
    return plan->may_overlap || (named >= 2 && (plan->single_group || plan->has_shared))
               ? OVERLAP_MAYBE
               : OVERLAP_NONE;
}

static kvx_status_t scratch_reserve(kvx_pairs_t *pairs, size_t n)
{
    kvx_pair_t *scratch;

    if (n <= pairs->max_scratch)
        return KVX_OK;
    scratch = realloc(pairs->scratch, n * sizeof(*scratch));
    if (scratch == NULL)
        return error_no_memory("the request's sorted pairs");
    pairs->scratch     = scratch;
    pairs->max_scratch = n;
    return KVX_OK;
}

/* A read list in local order, in scratch (2 x its count entries); returns where it lies. */
static kvx_pair_t *list_sorted_copy(const struct pair_list *list, kvx_pair_t *scratch)
{
    memcpy(scratch, list->pairs, list->count * sizeof(*scratch));
    return plan_pairs_sort(scratch, scratch + list->count, list->count);
}

/* Reads from different ranks never share a local byte: each would be a second source. Only
 * plans whose regions overlap need the look (every list is in local order or has no overlap
 * of its own by now). The copy's remote_storage holds the read index. */
static kvx_status_t request_reads_check(const kvx_peer_plan_t *plan, const kvx_request_t *req,
                                        kvx_pairs_t *pairs, size_t total)
{
    struct plan_conflict c;
    kvx_pair_t *sorted;
    size_t n = 0;

    for (size_t j = 0; j < plan->num_reads; j++) {
        for (size_t i = 0; i < pairs->reads[j].count; i++) {
            pairs->scratch[n]                = pairs->reads[j].pairs[i];
            pairs->scratch[n].remote_storage = (uint32_t)j;
            n++;
        }
    }
    sorted = plan_pairs_sort(pairs->scratch, pairs->scratch + total, n); /* n <= total */
    if (plan_pairs_overlap(sorted, n, &c))
        return request_conflict(plan, req, 0, &c, true);
    return KVX_OK;
}

/* Each local byte once (docs/plan.md "Each byte once"). When the request may name a byte
 * twice, looks: lists already in local order without overlap cost one pass, others a sort
 * of a copy. When some byte is named twice, every list is given in local order through the
 * sweep, which drops repeats and refuses a byte from two places; the bytes are counted
 * again. Otherwise the lists stay in request order. */
static kvx_status_t request_dedup(const kvx_peer_plan_t *plan, const kvx_request_t *req,
                                  kvx_pairs_t *pairs)
{
    enum overlap kind = request_overlap(plan, req);
    bool overlap      = kind == OVERLAP_CERTAIN;
    size_t total      = 0;
    kvx_status_t status;

    if (kind == OVERLAP_NONE)
        return KVX_OK;
    for (size_t j = 0; j < plan->num_reads; j++)
        total += pairs->reads[j].count;
    status = scratch_reserve(pairs, 2 * total);
    if (status != KVX_OK)
        return status;
    for (size_t j = 0; j < plan->num_reads && !overlap; j++) {
        const struct pair_list *list = &pairs->reads[j];

        if (!plan_pairs_ordered(list->pairs, list->count))
            overlap = plan_pairs_overlap(list_sorted_copy(list, pairs->scratch), list->count, NULL);
    }
    if (overlap) {
        pairs->stats.bytes = 0;
        for (size_t j = 0; j < plan->num_reads; j++) {
            struct pair_list *list = &pairs->reads[j];
            struct plan_conflict c;

            if (!plan_pairs_ordered(list->pairs, list->count)) {
                size_t n = plan_pairs_sweep(list_sorted_copy(list, pairs->scratch), list->count,
                                            plan->max_pair_len, list->pairs, &c);

                if (n == SIZE_MAX)
                    return request_conflict(plan, req, j, &c, false);
                list->count = n;
            }
            for (size_t i = 0; i < list->count; i++)
                pairs->stats.bytes += list->pairs[i].len;
        }
    }
    if (plan->may_overlap && plan->num_reads > 1)
        return request_reads_check(plan, req, pairs, total);
    return KVX_OK;
}

kvx_status_t kvx_peer_plan_request(const kvx_peer_plan_t *plan, const kvx_request_t *req,
                                   kvx_pairs_t *pairs)
{
    kvx_status_t status;

    if (plan == NULL || req == NULL || pairs == NULL)
        return error_set(KVX_ERR_INVALID, "request: plan, request and pairs are required");
    pairs->num_reads = 0;
    pairs->stats     = (kvx_pairs_stats_t){0};
    if (req->num_local_groups == 0 || req->local == NULL)
        return error_set(KVX_ERR_INVALID, "request: names no groups");
    if (req->remote != NULL && req->num_remote_groups != req->num_local_groups)
        return error_set(KVX_ERR_INVALID, "request: %zu local groups but %zu remote groups",
                         req->num_local_groups, req->num_remote_groups);
    if (!plan->single_group && (int64_t)req->num_local_groups <= plan->local->max_group)
        return regions_groups_missing(plan->local, req->num_local_groups);
    status = pairs_reserve(pairs, plan);
    if (status == KVX_OK)
        status = ascend_reserve(pairs, req->num_local_groups);
    if (status != KVX_OK)
        return status;
    /* The shape of every group (arrays, counts), and the room it needs; the ids are checked
     * as they are emitted. */
    for (size_t g = 0; g < req->num_local_groups; g++) {
        uint64_t covered; /* descriptors named in regions that emit nothing (plan_cover.c) */

        status = request_group_check(plan, req, g, false, pairs);
        if (status != KVX_OK)
            return request_fail(plan, req, pairs, status);
        if (__builtin_mul_overflow(req->local[g].count,
                                   plan->groups[plan_group_index(plan, g)].covered_per_id,
                                   &covered))
            return request_fail(plan, req, pairs,
                                error_set(KVX_ERR_INVALID, "request: the pair count overflows"));
        pairs->stats.descriptors += covered;
    }
    for (size_t j = 0; j < plan->num_reads; j++) {
        status = pairs_grow(&pairs->reads[j]);
        if (status != KVX_OK)
            return request_fail(plan, req, pairs, status);
        pairs->reads[j].count = 0;
        pairs->ranks[j]       = plan->read_ranks[j];
    }
    if (!request_emit(plan, req, pairs))
        return request_fail(plan, req, pairs, KVX_OK);
    status = request_repeats_check(plan, req, pairs);
    if (status == KVX_OK)
        status = request_dedup(plan, req, pairs);
    if (status != KVX_OK) {
        pairs->stats = (kvx_pairs_stats_t){0};
        return status;
    }
    pairs->num_reads = plan->num_reads;
    for (size_t j = 0; j < plan->num_reads; j++)
        pairs->stats.coalesced += pairs->reads[j].count;
    return KVX_OK;
}

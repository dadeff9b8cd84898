/* test_plan_properties.c: property tests of the peer plan (kvx.h "Plan") over seeded
 * generated layouts. The remote layout is the local one transformed by the TP and
 * block-size rules (head-split storages scaled by the ratio or a divisor of it, every
 * storage's blocks split by bsr), so every generated pair of tables must plan. Checked
 * against tests/support/plan_model.c and byte maps, never against src/plan*.c. */
#include "layouts.h"
#include "plan.h"
#include "plan_model.h"
#include "prng.h"

#include "kvx.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_SEED 0x6b76785f706c616eu /* "kvx_plan": runs are reproducible by default */
#define NUM_CASES    1500 /* per property: 0.1 s in all, under 2 s with ASan+UBSan (Debug) */
#define MAX_GROUPS   4    /* request groups: table groups 0..2 plus one the table does not use */
#define MAX_IDS      3    /* local ids per group */
#define MAX_BSR      4

static uint64_t seed;

/* ---------------------------------------------------------------------------------------
 * Generated cases, both sides registered
 * ------------------------------------------------------------------------------------- */

/* A generated case with both tables registered and what the model needs. */
struct fixture {
    struct gen_case c;
    kvx_regions_t *local;
    kvx_regions_t *remote;
    bool split[GEN_MAX_VIEWS]; /* by region */
    struct model_params mp;
    kvx_peer_plan_params_t params;
    bool single_group;
    int64_t max_group;
};

/* Generates the next case and registers both sides; false when the local layout is one
 * registration rejects (the remote must then be rejected too). */
static bool fixture_make(struct prng *p, size_t index, struct fixture *f)
{
    kvx_status_t ls;
    kvx_status_t rs;
    kvx_region_info_t first;

    memset(f, 0, sizeof(*f));
    gen_case(p, &f->c);
    ls = gen_register(&f->c, false, SIZE_MAX, 1, &f->local);
    rs = gen_register(&f->c, true, SIZE_MAX, 1, &f->remote);
    if (ls != rs)
        fail_msg("seed 0x%" PRIx64 " case %zu: local registration %d, remote %d (%s)", seed, index,
                 ls, rs, kvx_errmsg());
    if (ls != KVX_OK)
        return false;
    f->max_group    = -1;
    f->single_group = true;
    assert_int_equal(kvx_regions_get(f->local, 0, &first), KVX_OK);
    for (size_t r = 0; r < kvx_regions_count(f->local); r++) {
        kvx_region_info_t info;

        assert_int_equal(kvx_regions_get(f->local, r, &info), KVX_OK);
        f->single_group &= info.group == first.group;
        f->max_group = info.group > f->max_group ? info.group : f->max_group;
        for (size_t m = 0; m < info.num_members; m++) {
            kvx_view_kind_t kind = f->c.v[info.members[m]].kind;

            f->split[r] |= kind == KVX_VIEW_KIND_ATTN || kind == KVX_VIEW_KIND_SWA ||
                           kind == KVX_VIEW_KIND_MAMBA;
        }
        f->split[r] &= !info.mla && !info.ple;
    }
    f->mp     = (struct model_params){f->c.local_tp, f->c.local_rank, f->c.remote_tp, f->c.bsr};
    f->params = (kvx_peer_plan_params_t){
        .field_mask = KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP | KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK |
                      KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP | KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN,
        .local_tp   = f->c.local_tp,
        .local_rank = f->c.local_rank,
        .remote_tp  = f->c.remote_tp};
    if (f->c.sizes_in_params) {
        f->params.field_mask |= KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE |
                                KVX_PEER_PLAN_PARAM_FIELD_REMOTE_BLOCK_SIZE;
        f->params.local_block_size  = f->c.remote_bs * f->c.bsr;
        f->params.remote_block_size = f->c.remote_bs;
    }
    return true;
}

static void fixture_free(struct fixture *f)
{
    kvx_regions_destroy(f->local);
    kvx_regions_destroy(f->remote);
}

/* Plans with max_pair_len `max_len`; fails the test if the plan is refused. */
static kvx_peer_plan_t *fixture_plan(const struct fixture *f, size_t index, uint64_t max_len)
{
    kvx_peer_plan_params_t params = f->params;
    kvx_peer_plan_t *plan         = NULL;

    params.max_pair_len = max_len;
    if (kvx_peer_plan_create(f->local, f->remote, &params, &plan) != KVX_OK)
        fail_msg("seed 0x%" PRIx64 " case %zu: a consistent pair of tables is refused: %s", seed,
                 index, kvx_errmsg());
    return plan;
}

/* ---------------------------------------------------------------------------------------
 * Generated requests
 * ------------------------------------------------------------------------------------- */

struct gen_request {
    size_t num_groups;
    kvx_group_ids_t local[MAX_GROUPS + 1];
    kvx_group_ids_t remote[MAX_GROUPS + 1]; /* explicit remote ids (the default, expanded) */
    uint64_t local_ids[MAX_GROUPS + 1][MAX_IDS];
    uint64_t remote_ids[MAX_GROUPS + 1][MAX_IDS * MAX_BSR + 1]; /* + 1: room for a fault */
    uint64_t local_cap[MAX_GROUPS + 1];  /* smallest capacity of the regions taking g */
    uint64_t remote_cap[MAX_GROUPS + 1]; /* 0: no region takes g */
    bool explicit_remote;                /* request.remote set */
};

/* Capacities of the regions that take group g on each side (regions.md "Descriptors"). */
static void group_caps(const struct fixture *f, size_t g, uint64_t *local_cap, uint64_t *remote_cap)
{
    *local_cap  = 0;
    *remote_cap = 0;
    for (size_t r = 0; r < kvx_regions_count(f->local); r++) {
        kvx_region_info_t li;
        kvx_region_info_t ri;

        assert_int_equal(kvx_regions_get(f->local, r, &li), KVX_OK);
        assert_int_equal(kvx_regions_get(f->remote, r, &ri), KVX_OK);
        if (!f->single_group && li.group != -1 && (uint64_t)li.group != g)
            continue;
        if (*local_cap == 0 || li.num_blocks < *local_cap)
            *local_cap = li.num_blocks;
        if (*remote_cap == 0 || ri.num_blocks < *remote_cap)
            *remote_cap = ri.num_blocks;
    }
}

/* Whether a view of the layout is in group g: a request may name only such groups when the
 * table has several (docs/plan.md "The request"). */
static bool layout_has_group(const struct fixture *f, size_t g)
{
    for (size_t i = 0; i < f->c.num_views; i++) {
        if ((uint64_t)f->c.v[i].group == g)
            return true;
    }
    return false;
}

/* A request kvx must take: in each group distinct ids (a repeat is refused), and ids only in
 * groups the layout has when its table has several. Explicit remote ids are drawn freely, so
 * two groups may read one local byte from two places: the checks expect the refusal then. */
static void gen_request(struct prng *p, const struct fixture *f, struct gen_request *q)
{
    uint64_t bsr = f->c.bsr;

    memset(q, 0, sizeof(*q));
    q->num_groups =
        f->single_group ? prng_range(p, 1, 3) : (size_t)f->max_group + 1 + prng_range(p, 0, 1);
    q->explicit_remote = prng_range(p, 0, 1) == 1;
    for (size_t g = 0; g < q->num_groups; g++) {
        size_t count = prng_range(p, 0, 4) == 0 ? 0 : prng_range(p, 1, MAX_IDS);

        group_caps(f, g, &q->local_cap[g], &q->remote_cap[g]);
        if (!f->single_group && !layout_has_group(f, g))
            count = 0;
        if (q->local_cap[g] != 0 && count > q->local_cap[g])
            count = q->local_cap[g];
        q->local[g]  = (kvx_group_ids_t){q->local_ids[g], count};
        q->remote[g] = (kvx_group_ids_t){q->remote_ids[g], count * bsr};
        for (size_t i = 0; i < count; i++) {
            bool repeat;

            /* Ids no region takes are never checked: any value, kept small. Never one twice. */
            do {
                q->local_ids[g][i] =
                    prng_range(p, 0, q->local_cap[g] != 0 ? q->local_cap[g] - 1 : 99);
                repeat = false;
                for (size_t x = 0; x < i; x++)
                    repeat |= q->local_ids[g][x] == q->local_ids[g][i];
            } while (repeat);
            for (uint64_t k = 0; k < bsr; k++)
                q->remote_ids[g][i * bsr + k] =
                    q->explicit_remote
                        ? prng_range(p, 0, q->remote_cap[g] != 0 ? q->remote_cap[g] - 1 : 99)
                        : q->local_ids[g][i] * bsr + k;
        }
    }
}

static kvx_request_t request_of(const struct gen_request *q)
{
    return (kvx_request_t){q->local, q->num_groups, q->explicit_remote ? q->remote : NULL,
                           q->explicit_remote ? q->num_groups : 0, NULL};
}

/* ---------------------------------------------------------------------------------------
 * Checks
 * ------------------------------------------------------------------------------------- */

static void expect_list(size_t index, const char *what, const kvx_pair_t *got, size_t count,
                        const struct model_list *want)
{
    if (count != want->count)
        fail_msg("seed 0x%" PRIx64 " case %zu: %s: rank %" PRIu32 " has %zu pairs, the model %zu",
                 seed, index, what, want->rank, count, want->count);
    for (size_t i = 0; i < count; i++) {
        if (memcmp(&got[i], &want->pairs[i], sizeof(got[i])) != 0)
            fail_msg("seed 0x%" PRIx64 " case %zu: %s: rank %" PRIu32 " pair %zu is %" PRIu32
                     "+%" PRIu64 " <- %" PRIu32 "+%" PRIu64 " / %" PRIu64 ", the model %" PRIu32
                     "+%" PRIu64 " <- %" PRIu32 "+%" PRIu64 " / %" PRIu64,
                     seed, index, what, want->rank, i, got[i].local_storage, got[i].local_offset,
                     got[i].remote_storage, got[i].remote_offset, got[i].len,
                     want->pairs[i].local_storage, want->pairs[i].local_offset,
                     want->pairs[i].remote_storage, want->pairs[i].remote_offset,
                     want->pairs[i].len);
    }
}

/* Runs `check` on every generated case with a request planned into `pairs`. */
typedef void (*case_check_t)(const struct fixture *f, size_t index, struct prng *p,
                             kvx_pairs_t *pairs);

static size_t for_each_case(case_check_t check)
{
    struct prng p;
    kvx_pairs_t *pairs; /* one buffer for every plan: it must grow and shrink correctly */
    size_t planned = 0;

    assert_int_equal(kvx_pairs_create(&pairs), KVX_OK);
    for (size_t i = 0; i < NUM_CASES; i++) {
        struct fixture f;

        prng_init(&p, seed + i * 0x9e3779b97f4a7c15u); /* case i is the same in every test */
        if (!fixture_make(&p, i, &f))
            continue;
        check(&f, i, &p, pairs);
        fixture_free(&f);
        planned++;
    }
    kvx_pairs_destroy(pairs);
    assert_true(planned > NUM_CASES / 2); /* the generator mostly makes valid layouts */
    return planned;
}

/* ---------------------------------------------------------------------------------------
 * Properties
 * ------------------------------------------------------------------------------------- */

/* When the model says one local byte has two sources, kvx must refuse the request naming it
 * and leave no pairs: true, nothing more to check. Otherwise it must have planned it. */
static bool expect_conflict(size_t index, kvx_status_t status, bool conflict,
                            const kvx_pairs_t *pairs)
{
    if (!conflict) {
        if (status != KVX_OK)
            fail_msg("seed 0x%" PRIx64 " case %zu: request refused: %s", seed, index,
                     kvx_errmsg());
        return false;
    }
    if (status != KVX_ERR_INVALID || strstr(kvx_errmsg(), "would be written twice") == NULL)
        fail_msg("seed 0x%" PRIx64 " case %zu: a local byte from two places, yet status %d (%s)",
                 seed, index, status, kvx_errmsg());
    plan_expect_empty("a local byte from two places", pairs);
    return true;
}

/* A request that names a byte twice comes in local order: in each list every pair starts at
 * or after the previous one's end (storages ascending); a pair over max_len lies inside one
 * of the model's descriptors; with no limit, no neighbours that continue each other on both
 * sides are left apart. */
static void expect_local_order(size_t index, const kvx_pairs_t *pairs, uint64_t max_len,
                               const struct model_plan *model)
{
    for (size_t j = 0; j < kvx_pairs_num_reads(pairs); j++) {
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, j, NULL, &count);

        for (size_t i = 0; i < count; i++) {
            bool inside = false;

            if (i > 0 && (p[i].local_storage < p[i - 1].local_storage ||
                          (p[i].local_storage == p[i - 1].local_storage &&
                           p[i].local_offset < p[i - 1].local_offset + p[i - 1].len)))
                fail_msg("seed 0x%" PRIx64 " case %zu: read %zu pair %zu is not in local order",
                         seed, index, j, i);
            if (i > 0 && max_len == 0 && p[i].local_storage == p[i - 1].local_storage &&
                p[i].remote_storage == p[i - 1].remote_storage &&
                p[i].local_offset == p[i - 1].local_offset + p[i - 1].len &&
                p[i].remote_offset == p[i - 1].remote_offset + p[i - 1].len)
                fail_msg("seed 0x%" PRIx64 " case %zu: read %zu pairs %zu and %zu continue each"
                         " other but were not merged",
                         seed, index, j, i - 1, i);
            for (size_t k = 0; k < model->reads[j].count && max_len != 0 && p[i].len > max_len;
                 k++) {
                const kvx_pair_t *d = &model->reads[j].pairs[k];

                inside |= d->local_storage == p[i].local_storage &&
                          p[i].local_offset >= d->local_offset &&
                          p[i].local_offset + p[i].len <= d->local_offset + d->len;
            }
            if (max_len != 0 && p[i].len > max_len && !inside)
                fail_msg("seed 0x%" PRIx64 " case %zu: read %zu pair %zu of %" PRIu64
                         " bytes exceeds max_pair_len %" PRIu64 " and is no one descriptor",
                         seed, index, j, i, p[i].len, max_len);
        }
    }
}

/* True when the request planned; false when kvx refused it for one local byte from two
 * places (check_coalescing checks that against the model), which ends the case. */
static bool planned(size_t index, kvx_status_t status, const kvx_pairs_t *pairs)
{
    if (status == KVX_OK)
        return true;
    if (status != KVX_ERR_INVALID || strstr(kvx_errmsg(), "would be written twice") == NULL)
        fail_msg("seed 0x%" PRIx64 " case %zu: request refused: %s", seed, index, kvx_errmsg());
    plan_expect_empty("a local byte from two places", pairs);
    return false;
}

/* (1) With max_pair_len 1 nothing merges (a merged pair would exceed it, a single descriptor
 * is never split): the pairs are exactly the model's, in order. Coalesced with no limit or a
 * random one they are the model's merged greedily, and move the same bytes. A request that
 * names a local byte twice (docs/plan.md "Each byte once") moves each byte once, in local
 * order, the model's bytes without repeats; with two sources for one byte it is refused. */
static void check_coalescing(const struct fixture *f, size_t index, struct prng *p,
                             kvx_pairs_t *pairs)
{
    kvx_peer_plan_t *flat = fixture_plan(f, index, 1);
    kvx_peer_plan_t *plan;
    uint64_t max_len = 0;
    struct model_plan model;
    struct gen_request q;
    kvx_request_t req;
    kvx_pairs_stats_t stats;
    uint64_t *want_map;
    uint64_t *flat_map;
    uint64_t *map;
    size_t want_n;
    size_t flat_n;
    size_t n;
    uint64_t named = 0; /* descriptors the request names */
    uint64_t posted = 0;
    bool overlap;
    bool conflict;

    assert_true(model_ranks(&f->mp, f->split, f->local, f->remote, &model));
    gen_request(p, f, &q);
    req = request_of(&q);
    assert_int_equal(model_request(&f->mp, f->split, f->local, f->remote, q.local, q.remote,
                                   q.num_groups, &model),
                     KVX_OK);
    want_map = model_byte_map(&model, &want_n, &overlap, &conflict);
    for (size_t j = 0; j < model.num_reads; j++)
        named += model.reads[j].count;
    if (expect_conflict(index, kvx_peer_plan_request(flat, &req, pairs), conflict, pairs))
        goto out;
    assert_int_equal(kvx_pairs_num_reads(pairs), model.num_reads);
    for (size_t j = 0; j < model.num_reads; j++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *got = kvx_pairs_read(pairs, j, &rank, &count);

        assert_int_equal(rank, model.reads[j].rank);
        if (!overlap)
            expect_list(index, "uncoalesced", got, count, &model.reads[j]);
        posted += count;
    }
    if (overlap)
        expect_local_order(index, pairs, 1, &model);
    kvx_pairs_stats(pairs, &stats);
    assert_int_equal(stats.descriptors, named);
    assert_int_equal(stats.coalesced, posted);
    assert_int_equal(stats.bytes, want_n);
    flat_map = plan_byte_map(pairs, &flat_n);
    if (flat_n != want_n || memcmp(flat_map, want_map, flat_n * sizeof(*flat_map)) != 0)
        fail_msg("seed 0x%" PRIx64 " case %zu: the pairs move other bytes than the model's%s",
                 seed, index, overlap ? ", each once" : "");

    /* Half the time a limit of about one to three pairs of this request, so that it bites. */
    for (size_t j = 0; j < model.num_reads && max_len == 0; j++) {
        if (model.reads[j].count > 0 && prng_range(p, 0, 1) == 1)
            max_len = prng_range(p, 1, 3 * model.reads[j].pairs[0].len);
    }
    plan = fixture_plan(f, index, max_len);
    assert_int_equal(kvx_peer_plan_request(plan, &req, pairs), KVX_OK);
    for (size_t j = 0; j < model.num_reads && !overlap; j++) {
        struct model_list merged;
        size_t count;
        const kvx_pair_t *got = kvx_pairs_read(pairs, j, NULL, &count);

        model_coalesce(&model.reads[j], max_len, &merged);
        expect_list(index, "coalesced", got, count, &merged);
        for (size_t i = 0; max_len != 0 && i < count; i++) {
            bool single = false; /* a pair beyond the limit must be one descriptor */

            for (size_t k = 0; k < model.reads[j].count && got[i].len > max_len; k++)
                single |= memcmp(&got[i], &model.reads[j].pairs[k], sizeof(got[i])) == 0;
            assert_true(got[i].len <= max_len || single);
        }
        model_list_free(&merged);
    }
    if (overlap)
        expect_local_order(index, pairs, max_len, &model);
    kvx_pairs_stats(pairs, &stats);
    assert_int_equal(stats.descriptors, named);
    map = plan_byte_map(pairs, &n);
    if (n != flat_n || memcmp(map, flat_map, n * sizeof(*map)) != 0)
        fail_msg("seed 0x%" PRIx64 " case %zu: coalescing changed the byte map", seed, index);
    free(map);
    free(flat_map);
    kvx_peer_plan_destroy(plan);
out:
    free(want_map);
    model_plan_free(&model);
    kvx_peer_plan_destroy(flat);
}

static void coalesced_pairs_move_the_same_bytes_as_uncoalesced(void **state)
{
    (void)state;
    for_each_case(check_coalescing);
}

/* (2) Every uncoalesced pair lies inside a requested local block (its sub-block k under bsr)
 * and inside the remote block paired with it, of the same region, and the plan reads and
 * notifies the ranks the rules name. */
static void check_containment(const struct fixture *f, size_t index, struct prng *p,
                              kvx_pairs_t *pairs)
{
    kvx_peer_plan_t *plan = fixture_plan(f, index, 1);
    uint64_t bsr          = f->c.bsr;
    struct model_plan model;
    struct gen_request q;
    kvx_request_t req;
    kvx_status_t status;
    uint64_t *lids;
    uint64_t *rids;
    size_t nl;
    size_t nr;

    assert_true(model_ranks(&f->mp, f->split, f->local, f->remote, &model));
    assert_int_equal(kvx_peer_plan_num_reads(plan), model.num_reads);
    for (size_t j = 0; j < model.num_reads; j++)
        assert_int_equal(kvx_peer_plan_read_rank(plan, j), model.reads[j].rank);
    assert_int_equal(kvx_peer_plan_num_notifies(plan), model.num_notifies);
    for (size_t j = 0; j < model.num_notifies; j++)
        assert_int_equal(kvx_peer_plan_notify_rank(plan, j), model.notifies[j]);

    gen_request(p, f, &q);
    req  = request_of(&q);
    lids = model_side_ids(f->local, q.local, q.num_groups, &nl, &status);
    rids = model_side_ids(f->remote, q.remote, q.num_groups, &nr, &status);
    assert_true(lids != NULL && rids != NULL && nr == nl * bsr);
    if (!planned(index, kvx_peer_plan_request(plan, &req, pairs), pairs))
        nl = 0;
    for (size_t j = 0; nl > 0 && j < kvx_pairs_num_reads(pairs); j++) {
        size_t count;
        const kvx_pair_t *got = kvx_pairs_read(pairs, j, NULL, &count);

        for (size_t i = 0; i < count; i++) {
            const kvx_pair_t *x = &got[i];
            bool inside         = false;

            for (size_t a = 0; a < nl && !inside; a++) {
                kvx_descriptor_t ld;

                assert_int_equal(kvx_regions_descriptor(f->local, lids[a], &ld), KVX_OK);
                for (uint64_t k = 0; k < bsr && !inside; k++) {
                    uint64_t unit = ld.len / bsr;
                    uint64_t lo   = ld.offset + k * unit;
                    kvx_descriptor_t rd;

                    assert_int_equal(kvx_regions_descriptor(f->remote, rids[a * bsr + k], &rd),
                                     KVX_OK);
                    inside = x->len >= 1 && ld.storage == x->local_storage &&
                             rd.storage == x->remote_storage && x->local_offset >= lo &&
                             x->local_offset + x->len <= lo + unit &&
                             x->remote_offset >= rd.offset &&
                             x->remote_offset + x->len <= rd.offset + rd.len &&
                             model_region_of(f->local, lids[a]) ==
                                 model_region_of(f->remote, rids[a * bsr + k]);
                }
            }
            if (!inside)
                fail_msg("seed 0x%" PRIx64 " case %zu: pair %" PRIu32 "+%" PRIu64 " <- %" PRIu32
                         "+%" PRIu64 " / %" PRIu64 " lies in no requested block pair",
                         seed, index, x->local_storage, x->local_offset, x->remote_storage,
                         x->remote_offset, x->len);
        }
    }
    free(lids);
    free(rids);
    model_plan_free(&model);
    kvx_peer_plan_destroy(plan);
}

static void every_pair_lies_inside_a_requested_block_of_its_region(void **state)
{
    (void)state;
    for_each_case(check_containment);
}

/* (3) Whatever the TP and block sizes, every byte of every requested local block (by the
 * request rule) is written exactly once, however many times the request names it (docs/plan.md
 * "Each byte once"). With equal TP, bsr 1 and so identical layouts, each pair also reads the
 * very bytes it writes. */
static void check_coverage(const struct fixture *f, size_t index, struct prng *p,
                           kvx_pairs_t *pairs)
{
    kvx_peer_plan_t *plan = fixture_plan(f, index, 0);
    bool same             = f->c.local_tp == f->c.remote_tp && f->c.bsr == 1;
    uint32_t *want[GEN_MAX_STORAGES];
    uint32_t *got[GEN_MAX_STORAGES];
    uint32_t *read[GEN_MAX_STORAGES];
    struct gen_request q;
    kvx_request_t req;
    kvx_status_t status;
    uint64_t *lids;
    size_t nl;

    gen_request(p, f, &q);
    req  = request_of(&q);
    same = f->c.local_tp == f->c.remote_tp && f->c.bsr == 1 && !q.explicit_remote;
    lids = model_side_ids(f->local, q.local, q.num_groups, &nl, &status);
    assert_non_null(lids);
    for (size_t s = 0; s < f->c.num_storages; s++) {
        uint64_t size = f->c.s[s].rows * f->c.s[s].row + f->c.s[s].tail;

        want[s] = calloc(size, sizeof(uint32_t));
        got[s]  = calloc(size, sizeof(uint32_t));
        read[s] = calloc(size, sizeof(uint32_t));
        assert_true(want[s] != NULL && got[s] != NULL && read[s] != NULL);
    }
    for (size_t a = 0; a < nl; a++) {
        kvx_descriptor_t d;

        assert_int_equal(kvx_regions_descriptor(f->local, lids[a], &d), KVX_OK);
        for (uint64_t b = 0; b < d.len; b++)
            want[d.storage][d.offset + b]++;
    }
    if (!planned(index, kvx_peer_plan_request(plan, &req, pairs), pairs)) {
        for (size_t s = 0; s < f->c.num_storages; s++) /* nothing written, nothing wanted */
            memset(want[s], 0, (f->c.s[s].rows * f->c.s[s].row + f->c.s[s].tail) * 4);
    }
    for (size_t j = 0; j < kvx_pairs_num_reads(pairs); j++) {
        size_t count;
        const kvx_pair_t *x = kvx_pairs_read(pairs, j, NULL, &count);

        for (size_t i = 0; i < count; i++) {
            if (same && (x[i].local_storage != x[i].remote_storage ||
                         x[i].local_offset != x[i].remote_offset))
                fail_msg("seed 0x%" PRIx64 " case %zu: identical layouts, yet %" PRIu32 "+%" PRIu64
                         " <- %" PRIu32 "+%" PRIu64,
                         seed, index, x[i].local_storage, x[i].local_offset, x[i].remote_storage,
                         x[i].remote_offset);
            for (uint64_t b = 0; b < x[i].len; b++) {
                got[x[i].local_storage][x[i].local_offset + b]++;
                if (same)
                    read[x[i].remote_storage][x[i].remote_offset + b]++;
            }
        }
    }
    for (size_t s = 0; s < f->c.num_storages; s++) {
        uint64_t size = f->c.s[s].rows * f->c.s[s].row + f->c.s[s].tail;

        for (uint64_t b = 0; b < size; b++) {
            uint32_t once = want[s][b] > 0;

            if (got[s][b] != once || (same && read[s][b] != once))
                fail_msg("seed 0x%" PRIx64 " case %zu: storage %zu byte %" PRIu64
                         " written %" PRIu32 " times, read %" PRIu32 ", requested %" PRIu32,
                         seed, index, s, b, got[s][b], read[s][b], want[s][b]);
        }
        free(want[s]);
        free(got[s]);
        free(read[s]);
    }
    free(lids);
    kvx_peer_plan_destroy(plan);
}

static void every_requested_byte_is_paired_exactly_once(void **state)
{
    (void)state;
    for_each_case(check_coverage);
}

/* (4) A request with one injected fault fails as a whole: the status and message name it,
 * and `pairs`, which held the previous request, holds nothing. */
static void check_errors(const struct fixture *f, size_t index, struct prng *p, kvx_pairs_t *pairs)
{
    kvx_peer_plan_t *plan = fixture_plan(f, index, 0);
    size_t fault          = prng_range(p, 0, 5);
    kvx_status_t want     = KVX_ERR_INVALID;
    char part[2][64]      = {"", ""};
    struct gen_request q;
    kvx_request_t req;
    kvx_status_t status;
    char rule[64];
    size_t g;

    gen_request(p, f, &q);
    req = request_of(&q);
    if (!planned(index, kvx_peer_plan_request(plan, &req, pairs), pairs)) { /* to be cleared */
        kvx_peer_plan_destroy(plan);
        return;
    }
    do /* a group some region takes and the request may name; one exists below num_groups */
        g = prng_range(p, 0, q.num_groups - 1);
    while (q.local_cap[g] == 0 || (!f->single_group && !layout_has_group(f, g)));
    if (q.local[g].count == 0) {
        q.local[g].count  = 1;
        q.remote[g].count = f->c.bsr;
    }
    if (fault == 4 && f->single_group)
        fault = 3;
    switch (fault) {
    case 0: /* a local id beyond a taking region */
        q.local_ids[g][0] = q.local_cap[g] + prng_range(p, 0, 5);
        want              = KVX_ERR_OUT_OF_RANGE;
        snprintf(part[0], sizeof(part[0]), "local block id %" PRIu64, q.local_ids[g][0]);
        snprintf(part[1], sizeof(part[1]), "group %zu", g);
        break;
    case 1: /* a remote id beyond a taking region */
        q.explicit_remote  = true;
        q.remote_ids[g][0] = q.remote_cap[g] + prng_range(p, 0, 5);
        want               = KVX_ERR_OUT_OF_RANGE;
        snprintf(part[0], sizeof(part[0]), "remote block id %" PRIu64, q.remote_ids[g][0]);
        snprintf(part[1], sizeof(part[1]), "group %zu", g);
        break;
    case 2: /* one remote id missing or one too many */
        q.explicit_remote = true;
        if (prng_range(p, 0, 1) == 0)
            q.remote[g].count--;
        else
            q.remote_ids[g][q.remote[g].count++] = 0;
        snprintf(part[0], sizeof(part[0]), "group %zu", g);
        break;
    case 3: /* no groups */
        q.num_groups = 0;
        break;
    case 4: /* fewer groups than the table uses */
        q.num_groups = (size_t)f->max_group;
        break;
    default: /* more remote groups than local ones */
        q.explicit_remote = true;
        break;
    }
    req = request_of(&q);
    if (fault == 5)
        req.num_remote_groups++;
    status = kvx_peer_plan_request(plan, &req, pairs);
    if (status != want)
        fail_msg("seed 0x%" PRIx64 " case %zu: fault %zu gives status %d (%s), expected %d", seed,
                 index, fault, status, kvx_errmsg(), want);
    for (size_t i = 0; i < 2; i++) {
        if (strstr(kvx_errmsg(), part[i]) == NULL)
            fail_msg("seed 0x%" PRIx64 " case %zu: fault %zu: \"%s\" lacks \"%s\"", seed, index,
                     fault, kvx_errmsg(), part[i]);
    }
    snprintf(rule, sizeof(rule), "seed 0x%" PRIx64 " case %zu fault %zu", seed, index, fault);
    plan_expect_empty(rule, pairs);
    kvx_peer_plan_destroy(plan);
}

static void request_errors_leave_no_pairs(void **state)
{
    (void)state;
    for_each_case(check_errors);
}

/* (5) A remote table whose lengths break the rules in one storage (scaled 3 x too far) is
 * refused, and the message names the first region of that storage. */
static void check_mismatch(const struct fixture *f, size_t index, struct prng *p,
                           kvx_pairs_t *pairs)
{
    size_t s              = prng_range(p, 0, f->c.num_storages - 1);
    kvx_peer_plan_t *plan = NULL;
    kvx_regions_t *wrong  = NULL;
    kvx_region_info_t info;
    size_t r = 0;

    (void)pairs;
    assert_int_equal(gen_register(&f->c, true, s, 3, &wrong), KVX_OK);
    do
        assert_int_equal(kvx_regions_get(f->local, r++, &info), KVX_OK);
    while (info.storage != s);
    if (kvx_peer_plan_create(f->local, wrong, &f->params, &plan) != KVX_ERR_INVALID || plan != NULL)
        fail_msg("seed 0x%" PRIx64 " case %zu: storage %zu scaled 3 x is accepted", seed, index, s);
    if (strstr(kvx_errmsg(), info.name) == NULL)
        fail_msg("seed 0x%" PRIx64 " case %zu: \"%s\" does not name region %s", seed, index,
                 kvx_errmsg(), info.name);
    kvx_regions_destroy(wrong);
}

static void lengths_against_the_rules_are_refused_naming_the_region(void **state)
{
    (void)state;
    for_each_case(check_mismatch);
}

/* The generator reaches every rule the properties are about, often enough to matter. */
enum reach {
    REACH_RATIO_UP,      /* local_tp > remote_tp */
    REACH_RATIO_DOWN,    /* local_tp < remote_tp */
    REACH_REPLICATED,    /* heads replicated across ranks: slices < ratio */
    REACH_NOTIFY,        /* notify-only ranks */
    REACH_BSR,           /* bsr > 1 */
    REACH_WHOLE_ROW,     /* a packed-row region */
    REACH_SHARED,        /* a region of group -1 */
    REACH_SPLIT,         /* a head-split region */
    REACH_WHOLE,         /* a region read whole (MLA, ple, scratch) */
    REACH_MERGED,        /* coalescing merged pairs */
    REACH_EXPLICIT,      /* explicit remote ids */
    REACH_EMPTY_REQUEST, /* a request of groups without ids */
    REACH_CONFLICT,      /* a local byte from two places: refused */
    REACH_REPEAT,        /* a local byte named twice, from one place: moved once */
    NUM_REACH
};

static size_t reached[NUM_REACH];

/* Whether the request names some local byte twice: its bytes, counted per time named, exceed
 * what the pairs move. */
static bool repeats_bytes(const struct fixture *f, const struct gen_request *q,
                          const kvx_pairs_stats_t *stats)
{
    kvx_status_t status;
    size_t nl;
    uint64_t *lids = model_side_ids(f->local, q->local, q->num_groups, &nl, &status);
    uint64_t named = 0;

    assert_non_null(lids);
    for (size_t a = 0; a < nl; a++) {
        kvx_descriptor_t d;

        assert_int_equal(kvx_regions_descriptor(f->local, lids[a], &d), KVX_OK);
        named += d.len;
    }
    free(lids);
    return named > stats->bytes;
}

static void check_reach(const struct fixture *f, size_t index, struct prng *p, kvx_pairs_t *pairs)
{
    kvx_peer_plan_t *plan = fixture_plan(f, index, 0);
    struct gen_request q;
    kvx_request_t req;
    kvx_pairs_stats_t stats;
    bool empty = true;

    reached[REACH_RATIO_UP] += f->c.local_tp > f->c.remote_tp;
    reached[REACH_RATIO_DOWN] += f->c.local_tp < f->c.remote_tp;
    reached[REACH_NOTIFY] += kvx_peer_plan_num_notifies(plan) > 0;
    reached[REACH_BSR] += f->c.bsr > 1;
    for (size_t r = 0; r < kvx_regions_count(f->local); r++) {
        kvx_region_info_t li;
        kvx_region_info_t ri;

        assert_int_equal(kvx_regions_get(f->local, r, &li), KVX_OK);
        assert_int_equal(kvx_regions_get(f->remote, r, &ri), KVX_OK);
        reached[REACH_WHOLE_ROW] += li.packed_row;
        reached[REACH_SHARED] += li.group == -1;
        reached[REACH_SPLIT] += f->split[r];
        reached[REACH_WHOLE] += !f->split[r];
        reached[REACH_REPLICATED] +=
            f->split[r] && ri.block_len * f->c.bsr * f->c.remote_tp != li.block_len * f->c.local_tp;
    }
    gen_request(p, f, &q);
    req = request_of(&q);
    for (size_t g = 0; g < q.num_groups; g++)
        empty &= q.local[g].count == 0;
    if (!planned(index, kvx_peer_plan_request(plan, &req, pairs), pairs)) {
        reached[REACH_CONFLICT]++;
        kvx_peer_plan_destroy(plan);
        return;
    }
    kvx_pairs_stats(pairs, &stats);
    reached[REACH_MERGED] += stats.coalesced < stats.descriptors;
    reached[REACH_EXPLICIT] += q.explicit_remote;
    reached[REACH_EMPTY_REQUEST] += empty;
    if (empty)
        assert_int_equal(stats.bytes, 0);
    reached[REACH_REPEAT] += repeats_bytes(f, &q, &stats);
    kvx_peer_plan_destroy(plan);
}

static void generator_reaches_every_rule(void **state)
{
    (void)state;
    for_each_case(check_reach);
    for (size_t i = 0; i < NUM_REACH; i++) {
        if (reached[i] < 5)
            fail_msg("seed 0x%" PRIx64 ": rule %zu reached only %zu times", seed, i, reached[i]);
    }
}

/* ---------------------------------------------------------------------------------------
 * Long runs of consecutive ids
 * ------------------------------------------------------------------------------------- */

#define RUN_CASES   600 /* over 255, so the repeat check's stamps wrap */
#define RUN_MAX_IDS 160 /* ids a request names: runs long enough to be taken 16 at a time */
#define RUN_MAX_LEN 48  /* ids in one run */

/* One region of `blocks` 64 B rows. `row`: two padded MLA views packed into each row, one
 * whole-row region whose length is its stride, so that consecutive ids continue each other
 * (the planner's fast path). Otherwise one attn view of 48 B pages: they never do. */
static kvx_regions_t *run_table(bool row, uint64_t blocks)
{
    char json[1024];
    kvx_regions_t *regions = NULL;
    int n;

    if (row)
        n = snprintf(json, sizeof(json),
                     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': %" PRIu64 "}],"
                     " 'views': [{'name': 'l.0', 'kind': 'mla', 'storage': 'kv', 'page': 32,"
                     " 'stride': 64, 'num_blocks': %" PRIu64 ", 'dense': false},"
                     " {'name': 'l.1', 'kind': 'mla', 'storage': 'kv', 'offset': 32, 'page': 32,"
                     " 'stride': 64, 'num_blocks': %" PRIu64 ", 'dense': false}]}",
                     64 * blocks, blocks, blocks);
    else
        n = snprintf(json, sizeof(json),
                     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': %" PRIu64 "}],"
                     " 'views': [{'name': 'a', 'kind': 'attn', 'storage': 'kv', 'page': 48,"
                     " 'stride': 64, 'num_blocks': %" PRIu64 "}]}",
                     64 * blocks, blocks);
    assert_true(n > 0 && (size_t)n < sizeof(json));
    if (regions_from_quoted(json, &regions) != KVX_OK)
        fail_msg("layout rejected: %s\n%s", kvx_errmsg(), json);
    return regions;
}

/* Ids in runs of consecutive ones, distinct, below `cap`; with `explicit_remote` the remote
 * ids count up beside them but jump now and then where the local ones do not. About one
 * request in four has a fault: a run that counts on past a limit, local (`limit`) or remote,
 * a repeated local id, or an id one past its limit at a random place. Returns the count. */
static size_t runs_make(struct prng *p, uint64_t cap, uint64_t limit, uint64_t rcap,
                        bool explicit_remote, uint64_t *ids, uint64_t *rids)
{
    bool used[4 * RUN_MAX_IDS + RUN_MAX_LEN + 1] = {false};
    size_t want                                   = prng_range(p, 1, RUN_MAX_IDS);
    uint64_t fault                                = prng_range(p, 0, 15);
    uint64_t singles = prng_range(p, 0, 4); /* in 4: runs of one id, so ids stream between */
    size_t n         = 0;

    assert_true(cap <= 4 * RUN_MAX_IDS);
    while (n < want) {
        uint64_t id  = prng_range(p, 0, cap - 1);
        uint64_t rid = prng_range(p, 0, rcap - 1);
        size_t len   = prng_range(p, 0, 3) < singles ? 1 : prng_range(p, 1, RUN_MAX_LEN);
        uint64_t end = cap; /* ids of this run stay below it */

        if (fault == 0 || (fault == 1 && explicit_remote)) { /* this run crosses a limit */
            uint64_t back = prng_range(p, 1, 20);

            if (fault == 0)
                id = limit > back ? limit - back : 0;
            else
                rid = rcap > back ? rcap - back : 0;
            end   = cap + RUN_MAX_LEN;
            len   = RUN_MAX_LEN;
            fault = 16;
        }
        for (size_t j = 0; j < len && n < want && id < end && !used[id]; j++, id++, rid++) {
            if (end == cap && (rid >= rcap || prng_range(p, 0, 15) == 0))
                rid = prng_range(p, 0, rcap - 1);
            used[id] = true;
            ids[n]   = id;
            rids[n]  = explicit_remote ? rid : id;
            n++;
        }
    }
    if (fault == 2)
        ids[prng_range(p, 0, n - 1)] = ids[prng_range(p, 0, n - 1)]; /* maybe itself: no fault */
    else if (fault == 3)
        ids[prng_range(p, 0, n - 1)] = cap;
    else if (fault == 4 && explicit_remote)
        rids[prng_range(p, 0, n - 1)] = rcap;
    return n;
}

/* The first id of ids[0..n) that an earlier one repeats; UINT64_MAX if none. */
static uint64_t first_repeat(const uint64_t *ids, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        for (size_t x = 0; x < i; x++) {
            if (ids[x] == ids[i])
                return ids[i];
        }
    }
    return UINT64_MAX;
}

/* The planner takes a run of consecutive ids whole where the region's length is its stride
 * (docs/plan.md "Coalescing"), stopping at an id that breaks the run on either side, at an
 * id over a limit, at a repeat and at max_pair_len; between runs it streams four ids at a time
 * where the CPU can (src/plan_stream.c). Its pairs and errors must be those of the model,
 * coalesced, whatever the run lengths, with the four-at-a-time streaming and without. */
static void check_runs(bool stream)
{
    kvx_pairs_t *pairs;
    struct prng p;
    size_t row_cases = 0;

    plan_stream_disable(!stream);
    assert_int_equal(kvx_pairs_create(&pairs), KVX_OK);
    prng_init(&p, seed ^ 0x72756e73u);
    for (size_t i = 0; i < RUN_CASES; i++) {
        bool row                      = prng_range(&p, 0, 3) != 0;
        uint64_t cap                  = prng_range(&p, RUN_MAX_IDS, 4 * RUN_MAX_IDS);
        uint64_t rcap                 = prng_range(&p, 0, 3) == 0 ? prng_range(&p, 1, cap) : cap;
        bool explicit_remote          = prng_range(&p, 0, 1) == 1;
        kvx_regions_t *local          = run_table(row, cap);
        kvx_regions_t *remote         = run_table(row, rcap);
        struct model_params mp        = {1, 0, 1, 1};
        bool split[1]                 = {!row};
        kvx_peer_plan_params_t params = {0};
        kvx_peer_plan_t *plan         = NULL;
        uint64_t ids[RUN_MAX_IDS];
        uint64_t rids[RUN_MAX_IDS];
        size_t n = runs_make(&p, cap, explicit_remote || rcap > cap ? cap : rcap, rcap,
                             explicit_remote, ids, rids);
        kvx_group_ids_t lg = {ids, n};
        kvx_group_ids_t rg = {rids, n};
        kvx_request_t req  = {&lg, 1, explicit_remote ? &rg : NULL, explicit_remote ? 1 : 0, NULL};
        struct model_plan model;
        kvx_status_t want;
        kvx_status_t got;

        if (prng_range(&p, 0, 1) == 1) {
            params.field_mask   = KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN;
            params.max_pair_len = prng_range(&p, 1, 6 * 64);
        }
        assert_int_equal(kvx_peer_plan_create(local, remote, &params, &plan), KVX_OK);
        assert_true(model_ranks(&mp, split, local, remote, &model));
        want = model_request(&mp, split, local, remote, &lg, &rg, 1, &model);
        got  = kvx_peer_plan_request(plan, &req, pairs);
        if (want == KVX_OK && first_repeat(ids, n) != UINT64_MAX) {
            char msg[64];

            snprintf(msg, sizeof(msg), "names block id %" PRIu64 " twice", first_repeat(ids, n));
            if (got != KVX_ERR_INVALID || strstr(kvx_errmsg(), msg) == NULL)
                fail_msg("seed 0x%" PRIx64 " run case %zu: status %d (%s), expected '%s'", seed,
                         i, got, kvx_errmsg(), msg);
            plan_expect_empty("a repeated id in a run", pairs);
        } else if (want != KVX_OK) {
            if (got != want)
                fail_msg("seed 0x%" PRIx64 " run case %zu: status %d (%s), the model %d", seed, i,
                         got, kvx_errmsg(), want);
            plan_expect_empty("an id over a limit in a run", pairs);
        } else {
            struct model_list merged;
            kvx_pairs_stats_t stats;
            size_t count;
            const kvx_pair_t *list;

            if (got != KVX_OK)
                fail_msg("seed 0x%" PRIx64 " run case %zu: refused: %s", seed, i, kvx_errmsg());
            assert_int_equal(kvx_pairs_num_reads(pairs), 1);
            list = kvx_pairs_read(pairs, 0, NULL, &count);
            model_coalesce(&model.reads[0], params.max_pair_len, &merged);
            expect_list(i, "a request of runs", list, count, &merged);
            kvx_pairs_stats(pairs, &stats);
            assert_int_equal(stats.descriptors, n);
            assert_int_equal(stats.bytes, n * (row ? 64 : 48));
            model_list_free(&merged);
            row_cases += row;
        }
        model_plan_free(&model);
        kvx_peer_plan_destroy(plan);
        kvx_regions_destroy(local);
        kvx_regions_destroy(remote);
    }
    kvx_pairs_destroy(pairs);
    plan_stream_disable(false);
    assert_true(row_cases > RUN_CASES / 4); /* most cases plan, on the fast path */
}

static void runs_of_consecutive_ids_plan_as_the_model_does(void **state)
{
    (void)state;
    check_runs(true);
}

static void runs_plan_the_same_without_streaming_four_ids_at_a_time(void **state)
{
    (void)state;
    check_runs(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(generator_reaches_every_rule),
        cmocka_unit_test(coalesced_pairs_move_the_same_bytes_as_uncoalesced),
        cmocka_unit_test(every_pair_lies_inside_a_requested_block_of_its_region),
        cmocka_unit_test(every_requested_byte_is_paired_exactly_once),
        cmocka_unit_test(request_errors_leave_no_pairs),
        cmocka_unit_test(lengths_against_the_rules_are_refused_naming_the_region),
        cmocka_unit_test(runs_of_consecutive_ids_plan_as_the_model_does),
        cmocka_unit_test(runs_plan_the_same_without_streaming_four_ids_at_a_time),
    };

    seed = prng_seed_from_env(DEFAULT_SEED);
    fprintf(stderr, "seed 0x%016" PRIx64 " (set KVX_TEST_SEED to change it)\n", seed);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

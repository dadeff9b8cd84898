/* plan_model.h: what the plan tests (test_plan.c, test_plan_properties.c) share.
 * - A reference model of the peer plan (kvx.h "Plan", pull direction). It states the rules
 *   once more, in the simplest form: descriptor ids by kvx_regions_request_ids() on each
 *   side, matched in order (local id i with remote ids i*bsr .. i*bsr + bsr - 1); each local
 *   unit sliced by the TP rules; one list per remote rank; no coalescing (model_coalesce()
 *   does that separately). It never calls the planner.
 * - Generated layouts: a local layout and the remote one the TP and block-size rules make of
 *   it, so that every generated pair of tables must plan.
 * - Pair lists and requests written as text, for hand-computed tables. */
#ifndef KVX_TESTS_PLAN_MODEL_H
#define KVX_TESTS_PLAN_MODEL_H

#include "kvx.h"

#include "prng.h"

#include <stdbool.h>

#define MODEL_MAX_TP 16 /* remote ranks the model handles */

struct model_params {
    uint32_t local_tp;
    uint32_t local_rank;
    uint32_t remote_tp;
    uint64_t bsr; /* local block size / remote block size */
};

/* One piece of a local unit: `len` bytes at `local_offset` into the unit, read from
 * `remote_offset` into the remote block of `rank`. */
struct model_slice {
    uint32_t rank;
    uint64_t local_offset;
    uint64_t remote_offset;
    uint64_t len;
};

/* The pairs read from one remote rank, in emission order. */
struct model_list {
    uint32_t rank;
    size_t count;
    size_t max;
    kvx_pair_t *pairs;
};

struct model_plan {
    size_t num_reads; /* ascending ranks */
    struct model_list reads[MODEL_MAX_TP];
    size_t num_notifies;
    uint32_t notifies[MODEL_MAX_TP];
};

/* The slices of one local unit of `unit` bytes against a remote block of `remote_len` bytes;
 * `split`: the region is head-split (an attn, swa or mamba member, not MLA, not ple).
 * Returns their number, 0 when the lengths break the rules. */
size_t model_slices(const struct model_params *mp, bool split, uint64_t unit, uint64_t remote_len,
                    struct model_slice out[MODEL_MAX_TP]);

/* Read and notify ranks of a plan over both tables (region r split iff split[r]). Returns
 * false when some region's lengths break the rules. */
bool model_ranks(const struct model_params *mp, const bool *split, const kvx_regions_t *local,
                 const kvx_regions_t *remote, struct model_plan *out);

/* The uncoalesced pairs of a request whose remote ids are given (`remote` has num_groups
 * groups, bsr ids per local id). `out` must come from model_ranks(). Returns the status
 * kvx_regions_request_ids() gives on either side, or KVX_ERR_INVALID when the sides yield
 * counts that do not match. */
kvx_status_t model_request(const struct model_params *mp, const bool *split,
                           const kvx_regions_t *local, const kvx_regions_t *remote,
                           const kvx_group_ids_t *local_groups,
                           const kvx_group_ids_t *remote_groups, size_t num_groups,
                           struct model_plan *out);

/* All descriptor ids of a request on one side (kvx_regions_request_ids()), allocated (free
 * it); NULL with *status_p set when the request fails there. */
uint64_t *model_side_ids(const kvx_regions_t *t, const kvx_group_ids_t *groups, size_t num_groups,
                         size_t *count_p, kvx_status_t *status_p);

/* Index of the region that holds descriptor `id`; SIZE_MAX if none. */
size_t model_region_of(const kvx_regions_t *t, uint64_t id);

/* `in` merged greedily: a pair joins the previous one when both its ranges continue it (same
 * storages) and the sum stays within max_len (0: no limit). `out` is allocated. */
void model_coalesce(const struct model_list *in, uint64_t max_len, struct model_list *out);

void model_list_free(struct model_list *list);

/* docs/plan.md "Each byte once", from the rule: the bytes the request-order pairs of `m`
 * move, each (rank, local byte, remote byte) once, sorted, as plan_byte_map() gives them
 * (allocated, *count_p entries). *overlap_p: two pairs share a local byte; *conflict_p: one
 * local byte has two sources (rank, remote storage or remote byte differ). */
uint64_t *model_byte_map(const struct model_plan *m, size_t *count_p, bool *overlap_p,
                         bool *conflict_p);
void model_plan_free(struct model_plan *plan);

/* ---------------------------------------------------------------------------------------
 * Generated layouts
 * ------------------------------------------------------------------------------------- */

#define GEN_MAX_STORAGES 3
#define GEN_MAX_VIEWS    8

struct gen_storage {
    char name[8];
    bool split;    /* head-split views only (attn, swa, mamba); else mla, swa_mla, ple, scratch */
    uint64_t num;  /* remote bytes = local bytes * num / den */
    uint64_t den;  /* every local size is a multiple of it */
    uint64_t rows; /* local blocks */
    uint64_t row;  /* bytes: local row stride */
    uint64_t tail; /* bytes after the last row, < row */
    size_t num_slots;
    uint64_t slot_offset[3]; /* bytes into the row */
    uint64_t slot_len[3];
};

struct gen_view {
    char name[32];
    kvx_view_kind_t kind;
    size_t storage;
    int64_t group;
    uint64_t offset;
    uint64_t page;
    uint64_t num_blocks; /* local */
    uint64_t heads;
    bool dense;
};

struct gen_case {
    uint32_t local_tp;
    uint32_t local_rank;
    uint32_t remote_tp;
    uint64_t bsr;
    uint64_t remote_bs; /* tokens */
    bool sizes_in_params;
    bool csa_linear;
    bool whole_row_regions;
    size_t num_storages;
    size_t num_views;
    struct gen_storage s[GEN_MAX_STORAGES];
    struct gen_view v[GEN_MAX_VIEWS];
};

/* A random case: TP sizes and rank, bsr, block sizes, 1..3 storages of packed rows, each
 * either head-split (attn, swa, mamba views) or not (mla, swa_mla, ple, scratch), views in
 * their slots with shorter aliases, padding, tails, groups and heads. */
void gen_case(struct prng *p, struct gen_case *c);

/* Registers one side of `c`. The remote side scales every byte count of storage s by
 * s.num / s.den (times `wrong` for storage `wrong_storage`, SIZE_MAX for none) and
 * multiplies block counts by bsr. Returns the first failing call's status. */
kvx_status_t gen_register(const struct gen_case *c, bool remote, size_t wrong_storage,
                          uint64_t wrong, kvx_regions_t **regions_p);

/* ---------------------------------------------------------------------------------------
 * Pair lists
 * ------------------------------------------------------------------------------------- */

/* The sorted multiset of (rank, local storage and byte, remote storage and byte) that the
 * last request planned into `pairs` moves; allocated, *count_p entries. */
uint64_t *plan_byte_map(const kvx_pairs_t *pairs, size_t *count_p);

/* Fails the test, naming `rule`, unless `pairs` holds nothing: no reads, no pairs, zero
 * stats (what a failed request leaves). */
void plan_expect_empty(const char *rule, const kvx_pairs_t *pairs);

/* ---------------------------------------------------------------------------------------
 * Pairs and requests as text
 *
 * Request ids: groups separated by '|', ids by spaces; "" is one empty group, "-" none.
 * Pairs: "@R" starts the read of remote rank R; "aL<R/N" is N bytes from remote offset R
 * into local offset L, both in storage 0; "b..." the same in storage 1; "aL<cR/N" reads from
 * remote storage 2 into local storage 0. Messages: fragments separated by '|'.
 * ------------------------------------------------------------------------------------- */

#define TEXT_MAX_READS  4
#define TEXT_MAX_PAIRS  6
#define TEXT_MAX_GROUPS 3
#define TEXT_MAX_IDS    8

/* One read: the remote rank and its pairs, in order. */
struct text_read {
    uint32_t rank;
    size_t count;
    kvx_pair_t p[TEXT_MAX_PAIRS];
};

/* Request ids per group, ready to pass as kvx_group_ids_t (g[] points into ids[]). */
struct text_groups {
    size_t count;
    kvx_group_ids_t g[TEXT_MAX_GROUPS];
    uint64_t ids[TEXT_MAX_GROUPS][TEXT_MAX_IDS];
};

/* Parses request ids into `out`. */
void text_parse_groups(const char *text, struct text_groups *out);

/* Parses a pair list into reads; returns how many. Fails the test, naming `rule`, on bad
 * text. */
size_t text_parse_reads(const char *rule, const char *text, struct text_read *reads);

/* Compares every read of `pairs` with `expected`, then the stats: `descriptors` (pairs before
 * coalescing; 0: as many as listed), coalesced = the pairs listed, bytes = theirs. */
void text_expect_pairs(const char *rule, const kvx_pairs_t *pairs, const char *expected,
                       uint64_t descriptors);

/* Every '|'-separated fragment of `parts` must appear in the last failure's message. */
void text_expect_message(const char *rule, const char *parts);

/* The block-size ratio a plan uses: the params' block sizes, else the tables'. */
uint64_t text_bsr(const kvx_regions_t *local, const kvx_regions_t *remote,
                  const kvx_peer_plan_params_t *params);

/* The remote ids a request with request.remote == NULL stands for: n*bsr .. n*bsr + bsr - 1
 * for each local id n, in order. */
void text_expand_default(const struct text_groups *local, uint64_t bsr, struct text_groups *out);

#endif

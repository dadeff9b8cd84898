/* plan_model.c: what plan_model.h declares. The model is written from the rules, not from
 * src/plan*.c: slicing is stated per remote rank that holds the local rank's heads. */
#include "plan_model.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t model_slices(const struct model_params *mp, bool split, uint64_t unit, uint64_t remote_len,
                    struct model_slice out[MODEL_MAX_TP])
{
    uint64_t ratio;
    uint64_t slices;
    uint64_t per_slice; /* ranks that hold the same heads */
    uint32_t first;     /* first remote rank holding this local rank's share */
    size_t n = 0;

    if (!split) {
        /* Replicated, ple or scratch-only: the whole unit from the rank whose share this is. */
        if (remote_len != unit)
            return 0;
        out[0] = (struct model_slice){mp->local_rank * mp->remote_tp / mp->local_tp, 0, 0, unit};
        return 1;
    }
    if (mp->local_tp >= mp->remote_tp) {
        /* One remote rank holds `ratio` local ranks' heads in `slices` slices of `unit`;
         * ratio / slices consecutive local ranks hold the same slice. */
        ratio = mp->local_tp / mp->remote_tp;
        if (remote_len % unit != 0 || ratio % (remote_len / unit) != 0)
            return 0;
        slices    = remote_len / unit;
        per_slice = ratio / slices;
        out[0]    = (struct model_slice){mp->local_rank / (uint32_t)ratio, 0,
                                         (mp->local_rank % ratio) / per_slice * unit, unit};
        return 1;
    }
    /* `ratio` remote ranks hold this local rank's heads, slice q / per_slice on rank
     * first + q; the first holder of each slice is read. */
    ratio = mp->remote_tp / mp->local_tp;
    if (unit % remote_len != 0 || ratio % (unit / remote_len) != 0)
        return 0;
    slices    = unit / remote_len;
    per_slice = ratio / slices;
    first     = mp->local_rank * (uint32_t)ratio;
    for (uint64_t q = 0; q < ratio; q++) {
        if (q % per_slice == 0)
            out[n++] = (struct model_slice){first + (uint32_t)q, q / per_slice * remote_len, 0,
                                            remote_len};
    }
    return n;
}

bool model_ranks(const struct model_params *mp, const bool *split, const kvx_regions_t *local,
                 const kvx_regions_t *remote, struct model_plan *out)
{
    bool read[MODEL_MAX_TP] = {false};
    uint32_t first;
    uint32_t holders;

    memset(out, 0, sizeof(*out));
    if (mp->remote_tp > MODEL_MAX_TP || kvx_regions_count(local) != kvx_regions_count(remote))
        return false;
    for (size_t r = 0; r < kvx_regions_count(local); r++) {
        kvx_region_info_t li;
        kvx_region_info_t ri;
        struct model_slice slices[MODEL_MAX_TP];
        size_t n;

        if (kvx_regions_get(local, r, &li) != KVX_OK || kvx_regions_get(remote, r, &ri) != KVX_OK ||
            li.block_len % mp->bsr != 0)
            return false;
        n = model_slices(mp, split[r], li.block_len / mp->bsr, ri.block_len, slices);
        if (n == 0)
            return false;
        for (size_t s = 0; s < n; s++)
            read[slices[s].rank] = true;
    }
    for (uint32_t rank = 0; rank < mp->remote_tp; rank++) {
        if (read[rank])
            out->reads[out->num_reads++].rank = rank;
    }
    if (mp->local_tp >= mp->remote_tp) {
        first   = mp->local_rank / (mp->local_tp / mp->remote_tp);
        holders = 1;
    } else {
        holders = mp->remote_tp / mp->local_tp;
        first   = mp->local_rank * holders;
    }
    for (uint32_t rank = first; rank < first + holders; rank++) {
        if (!read[rank])
            out->notifies[out->num_notifies++] = rank;
    }
    return true;
}

static void list_append(struct model_list *list, const kvx_pair_t *p)
{
    if (list->count == list->max) {
        list->max   = list->max < 16 ? 16 : 2 * list->max;
        list->pairs = realloc(list->pairs, list->max * sizeof(*list->pairs));
        if (list->pairs == NULL)
            abort();
    }
    list->pairs[list->count++] = *p;
}

/* The region whose ids [first, first + num_blocks) hold `id`. */
size_t model_region_of(const kvx_regions_t *t, uint64_t id)
{
    for (size_t r = 0; r < kvx_regions_count(t); r++) {
        kvx_region_info_t info;

        if (kvx_regions_get(t, r, &info) == KVX_OK && id >= info.first_descriptor &&
            id - info.first_descriptor < info.num_blocks)
            return r;
    }
    return SIZE_MAX;
}

/* Both passes of kvx_regions_request_ids(): count, then fill. */
uint64_t *model_side_ids(const kvx_regions_t *t, const kvx_group_ids_t *groups, size_t num_groups,
                         size_t *count_p, kvx_status_t *status_p)
{
    uint64_t *ids;

    *status_p = kvx_regions_request_ids(t, groups, num_groups, NULL, 0, count_p);
    if (*status_p != KVX_OK)
        return NULL;
    ids = calloc(*count_p + 1, sizeof(*ids));
    if (ids == NULL)
        abort();
    *status_p = kvx_regions_request_ids(t, groups, num_groups, ids, *count_p, count_p);
    if (*status_p != KVX_OK) {
        free(ids);
        return NULL;
    }
    return ids;
}

kvx_status_t model_request(const struct model_params *mp, const bool *split,
                           const kvx_regions_t *local, const kvx_regions_t *remote,
                           const kvx_group_ids_t *local_groups,
                           const kvx_group_ids_t *remote_groups, size_t num_groups,
                           struct model_plan *out)
{
    size_t nl;
    size_t nr;
    kvx_status_t status;
    uint64_t *lids = model_side_ids(local, local_groups, num_groups, &nl, &status);
    uint64_t *rids =
        lids != NULL ? model_side_ids(remote, remote_groups, num_groups, &nr, &status) : NULL;

    for (size_t j = 0; j < out->num_reads; j++)
        out->reads[j].count = 0;
    if (rids != NULL && nr != nl * mp->bsr)
        status = KVX_ERR_INVALID;
    for (size_t i = 0; status == KVX_OK && i < nl; i++) {
        kvx_descriptor_t ld;
        size_t region = model_region_of(local, lids[i]);

        if (kvx_regions_descriptor(local, lids[i], &ld) != KVX_OK)
            status = KVX_ERR_INTERNAL;
        for (uint64_t k = 0; status == KVX_OK && k < mp->bsr; k++) {
            uint64_t unit = ld.len / mp->bsr;
            struct model_slice slices[MODEL_MAX_TP];
            kvx_descriptor_t rd;
            size_t n;

            if (kvx_regions_descriptor(remote, rids[i * mp->bsr + k], &rd) != KVX_OK ||
                model_region_of(remote, rids[i * mp->bsr + k]) != region) {
                status = KVX_ERR_INTERNAL; /* the sides disagree on the region order */
                break;
            }
            n = model_slices(mp, split[region], unit, rd.len, slices);
            for (size_t s = 0; s < n; s++) {
                kvx_pair_t p = {(uint32_t)ld.storage, (uint32_t)rd.storage,
                                ld.offset + k * unit + slices[s].local_offset,
                                rd.offset + slices[s].remote_offset, slices[s].len};
                size_t j     = 0;

                while (j < out->num_reads && out->reads[j].rank != slices[s].rank)
                    j++;
                if (j == out->num_reads) {
                    status = KVX_ERR_INTERNAL; /* a slice from a rank that is never read */
                    break;
                }
                list_append(&out->reads[j], &p);
            }
        }
    }
    free(lids);
    free(rids);
    return status;
}

void model_coalesce(const struct model_list *in, uint64_t max_len, struct model_list *out)
{
    *out = (struct model_list){.rank = in->rank};
    for (size_t i = 0; i < in->count; i++) {
        const kvx_pair_t *p = &in->pairs[i];
        kvx_pair_t *last    = out->count > 0 ? &out->pairs[out->count - 1] : NULL;

        if (last != NULL && last->local_storage == p->local_storage &&
            last->remote_storage == p->remote_storage &&
            last->local_offset + last->len == p->local_offset &&
            last->remote_offset + last->len == p->remote_offset &&
            (max_len == 0 || last->len + p->len <= max_len))
            last->len += p->len;
        else
            list_append(out, p);
    }
}

/* One byte a model pair moves: where it lands and where it comes from. */
struct model_byte {
    uint64_t local;  /* local storage << 24 | byte */
    uint64_t source; /* rank << 28 | remote storage << 24 | byte */
};

static int compare_model_byte(const void *a, const void *b)
{
    const struct model_byte *x = a;
    const struct model_byte *y = b;

    if (x->local != y->local)
        return x->local < y->local ? -1 : 1;
    return (x->source > y->source) - (x->source < y->source);
}

static int compare_key(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

uint64_t *model_byte_map(const struct model_plan *m, size_t *count_p, bool *overlap_p,
                         bool *conflict_p)
{
    struct model_byte *bytes;
    uint64_t *keys;
    size_t total = 0;
    size_t n     = 0;
    size_t k     = 0;

    for (size_t j = 0; j < m->num_reads; j++) {
        for (size_t i = 0; i < m->reads[j].count; i++)
            total += m->reads[j].pairs[i].len;
    }
    bytes = calloc(total + 1, sizeof(*bytes));
    keys  = calloc(total + 1, sizeof(*keys));
    assert_true(bytes != NULL && keys != NULL);
    for (size_t j = 0; j < m->num_reads; j++) {
        for (size_t i = 0; i < m->reads[j].count; i++) {
            const kvx_pair_t *p = &m->reads[j].pairs[i];

            for (uint64_t b = 0; b < p->len; b++) {
                assert_true(p->local_offset + b < (1u << 22) && p->remote_offset + b < (1u << 22));
                bytes[n++] = (struct model_byte){
                    (uint64_t)p->local_storage << 24 | (p->local_offset + b),
                    (uint64_t)m->reads[j].rank << 28 | (uint64_t)p->remote_storage << 24 |
                        (p->remote_offset + b)};
            }
        }
    }
    qsort(bytes, n, sizeof(*bytes), compare_model_byte);
    *overlap_p  = false;
    *conflict_p = false;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && bytes[i].local == bytes[i - 1].local) {
            *overlap_p = true;
            *conflict_p |= bytes[i].source != bytes[i - 1].source;
            continue;
        }
        /* plan_byte_map's key: rank << 52 | local storage << 50 | remote storage << 48 |
         * local byte << 24 | remote byte */
        keys[k++] = (bytes[i].source >> 28) << 52 | (bytes[i].local >> 24) << 50 |
                    ((bytes[i].source >> 24) & 0xf) << 48 | (bytes[i].local & 0xffffff) << 24 |
                    (bytes[i].source & 0xffffff);
    }
    qsort(keys, k, sizeof(*keys), compare_key);
    free(bytes);
    *count_p = k;
    return keys;
}

void model_list_free(struct model_list *list)
{
    free(list->pairs);
    *list = (struct model_list){0};
}

void model_plan_free(struct model_plan *plan)
{
    for (size_t j = 0; j < MODEL_MAX_TP; j++)
        model_list_free(&plan->reads[j]);
}

/* ---------------------------------------------------------------------------------------
 * Generated layouts
 * ------------------------------------------------------------------------------------- */

static uint64_t pick(struct prng *p, const uint64_t *values, size_t n)
{
    return values[prng_range(p, 0, n - 1)];
}

static void gen_storage(struct prng *p, struct gen_case *c, size_t i)
{
    struct gen_storage *s = &c->s[i];
    uint64_t ratio =
        c->local_tp > c->remote_tp ? c->local_tp / c->remote_tp : c->remote_tp / c->local_tp;
    uint64_t slices = ratio;

    snprintf(s->name, sizeof(s->name), "s%zu", i);
    s->split = prng_range(p, 0, 1) == 1;
    if (s->split && prng_range(p, 0, 1) == 1) /* heads replicated across ranks */
        slices = ratio >= 4 && prng_range(p, 0, 1) == 1 ? 2 : 1;
    s->num = 1;
    s->den = c->bsr;
    if (s->split && c->local_tp >= c->remote_tp)
        s->num = slices;
    else if (s->split)
        s->den = c->bsr * slices;
    s->rows      = prng_range(p, 2, 5);
    s->num_slots = prng_range(p, 1, 3);
    s->row       = 0;
    for (size_t k = 0; k < s->num_slots; k++) {
        s->slot_offset[k] = s->row;
        s->slot_len[k]    = s->den * prng_range(p, 1, 3);
        s->row += s->slot_len[k];
    }
    s->row += s->den * prng_range(p, 0, 1); /* padding */
    s->tail = prng_range(p, 0, 2) == 0 ? s->den * prng_range(p, 0, s->row / s->den - 1) : 0;
}

static void gen_view(struct prng *p, struct gen_case *c, size_t i, size_t storage)
{
    static const kvx_view_kind_t split_kinds[] = {KVX_VIEW_KIND_ATTN, KVX_VIEW_KIND_SWA,
                                                  KVX_VIEW_KIND_MAMBA};
    static const kvx_view_kind_t other_kinds[] = {KVX_VIEW_KIND_MLA, KVX_VIEW_KIND_SWA_MLA,
                                                  KVX_VIEW_KIND_PLE, KVX_VIEW_KIND_SCRATCH};
    const struct gen_storage *s                = &c->s[storage];
    struct gen_view *v                         = &c->v[i];
    size_t slot                                = prng_range(p, 0, s->num_slots - 1);

    v->storage    = storage;
    v->kind       = s->split ? split_kinds[prng_range(p, 0, 2)] : other_kinds[prng_range(p, 0, 3)];
    v->group      = prng_range(p, 0, 1) == 0 ? 0 : (int64_t)prng_range(p, 0, 2);
    v->offset     = s->slot_offset[slot];
    v->page       = s->slot_len[slot];
    v->num_blocks = prng_range(p, 0, 5) == 0 ? s->rows - 1 : s->rows;
    v->heads      = prng_range(p, 1, 8); /* kvx slices by lengths, never by heads */
    v->dense      = prng_range(p, 0, 1) == 1;
    if (v->page > s->den && prng_range(p, 0, 3) == 0) /* a shorter alias at the same base */
        v->page = s->den * prng_range(p, 1, v->page / s->den - 1);
    snprintf(v->name, sizeof(v->name), "layers.%u.%s.%zu", (unsigned)prng_range(p, 0, 11),
             kvx_view_kind_str(v->kind), i);
}

void gen_case(struct prng *p, struct gen_case *c)
{
    static const uint32_t tps[][2] = {{1, 1}, {2, 2}, {2, 1}, {4, 1}, {4, 2}, {8, 2}, {8, 1},
                                      {1, 2}, {1, 4}, {2, 4}, {2, 8}, {1, 8}, {4, 4}, {16, 4}};
    static const uint64_t bsrs[]   = {1, 1, 2, 4};
    static const uint64_t sizes[]  = {1, 2, 4, 8};
    size_t t                       = prng_range(p, 0, sizeof(tps) / sizeof(tps[0]) - 1);

    memset(c, 0, sizeof(*c));
    c->local_tp          = tps[t][0];
    c->remote_tp         = tps[t][1];
    c->local_rank        = (uint32_t)prng_range(p, 0, c->local_tp - 1);
    c->bsr               = pick(p, bsrs, 4);
    c->remote_bs         = pick(p, sizes, 4);
    c->sizes_in_params   = prng_range(p, 0, 1) == 1;
    c->csa_linear        = prng_range(p, 0, 3) == 0;
    c->whole_row_regions = prng_range(p, 0, 2) == 0;
    c->num_storages      = prng_range(p, 1, GEN_MAX_STORAGES);
    c->num_views         = prng_range(p, c->num_storages, GEN_MAX_VIEWS);
    for (size_t i = 0; i < c->num_storages; i++)
        gen_storage(p, c, i);
    for (size_t i = 0; i < c->num_views; i++) /* every storage gets a view */
        gen_view(p, c, i, i < c->num_storages ? i : prng_range(p, 0, c->num_storages - 1));
}

#define GEN_VIEW_FIELDS                                                                            \
    (KVX_VIEW_PARAM_FIELD_GROUP | KVX_VIEW_PARAM_FIELD_OFFSET | KVX_VIEW_PARAM_FIELD_DENSE |       \
     KVX_VIEW_PARAM_FIELD_HEADS)

/* Registers one side. The remote side scales every byte count of storage s by num/den
 * (times `wrong` for storage `wrong_storage`) and multiplies block counts by bsr. */
kvx_status_t gen_register(const struct gen_case *c, bool remote, size_t wrong_storage,
                          uint64_t wrong, kvx_regions_t **regions_p)
{
    uint64_t bs                = remote ? c->remote_bs : c->remote_bs * c->bsr;
    kvx_layout_params_t params = {.field_mask = KVX_LAYOUT_PARAM_FIELD_BLOCK_SIZE |
                                                KVX_LAYOUT_PARAM_FIELD_CSA_LINEAR |
                                                KVX_LAYOUT_PARAM_FIELD_WHOLE_ROW_REGIONS,
                                  .block_size        = c->sizes_in_params ? 16 : bs,
                                  .csa_linear        = c->csa_linear,
                                  .whole_row_regions = c->whole_row_regions};
    kvx_layout_t *layout;
    kvx_status_t status = kvx_layout_create(&params, &layout);
    uint64_t num[GEN_MAX_STORAGES];
    uint64_t den[GEN_MAX_STORAGES];
    uint64_t blocks = remote ? c->bsr : 1;

    for (size_t i = 0; status == KVX_OK && i < c->num_storages; i++) {
        const struct gen_storage *s = &c->s[i];
        kvx_storage_params_t sp     = {.name = s->name};

        num[i]  = remote ? s->num * (i == wrong_storage ? wrong : 1) : 1;
        den[i]  = remote ? s->den : 1;
        sp.size = (s->rows * s->row * blocks + s->tail) * num[i] / den[i];
        status  = kvx_layout_add_storage(layout, &sp);
    }
    for (size_t i = 0; status == KVX_OK && i < c->num_views; i++) {
        const struct gen_view *v    = &c->v[i];
        const struct gen_storage *s = &c->s[v->storage];
        uint64_t n                  = num[v->storage];
        uint64_t d                  = den[v->storage];
        kvx_view_params_t vp        = {.field_mask = GEN_VIEW_FIELDS,
                                       .name       = v->name,
                                       .kind       = v->kind,
                                       .storage    = s->name,
                                       .page       = v->page * n / d,
                                       .stride     = s->row * n / d,
                                       .num_blocks = v->num_blocks * blocks,
                                       .group      = v->group,
                                       .offset     = v->offset * n / d,
                                       .dense      = v->dense,
                                       .heads      = v->heads};

        status = kvx_layout_add_view(layout, &vp);
    }
    if (status == KVX_OK)
        status = kvx_layout_validate(layout);
    if (status == KVX_OK)
        status = kvx_regions_register(layout, regions_p);
    kvx_layout_destroy(layout);
    return status;
}

/* ---------------------------------------------------------------------------------------
 * Pair lists
 * ------------------------------------------------------------------------------------- */

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

/* The sorted multiset of (rank, local storage and byte, remote storage and byte) the pairs
 * move; allocated, *count_p entries. */
uint64_t *plan_byte_map(const kvx_pairs_t *pairs, size_t *count_p)
{
    kvx_pairs_stats_t stats;
    uint64_t *keys;
    size_t n = 0;

    kvx_pairs_stats(pairs, &stats);
    keys = calloc(stats.bytes + 1, sizeof(*keys));
    assert_non_null(keys);
    for (size_t j = 0; j < kvx_pairs_num_reads(pairs); j++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, j, &rank, &count);

        for (size_t i = 0; i < count; i++) {
            for (uint64_t b = 0; b < p[i].len; b++) {
                assert_true(n < stats.bytes && p[i].local_offset + b < (1u << 22) &&
                            p[i].remote_offset + b < (1u << 22));
                keys[n++] = (uint64_t)rank << 52 | (uint64_t)p[i].local_storage << 50 |
                            (uint64_t)p[i].remote_storage << 48 | (p[i].local_offset + b) << 24 |
                            (p[i].remote_offset + b);
            }
        }
    }
    assert_int_equal(n, stats.bytes);
    qsort(keys, n, sizeof(*keys), compare_u64);
    *count_p = n;
    return keys;
}

/* After a failed request `pairs` holds nothing: no reads, no pairs, zero stats. */
void plan_expect_empty(const char *rule, const kvx_pairs_t *pairs)
{
    kvx_pairs_stats_t stats;

    kvx_pairs_stats(pairs, &stats);
    if (kvx_pairs_num_reads(pairs) != 0 || kvx_pairs_read(pairs, 0, NULL, NULL) != NULL ||
        stats.descriptors != 0 || stats.coalesced != 0 || stats.bytes != 0)
        fail_msg("%s: a failed request left pairs behind", rule);
}

/* ---------------------------------------------------------------------------------------
 * Pairs and requests as text
 * ------------------------------------------------------------------------------------- */

/* Parses request ids. */
void text_parse_groups(const char *text, struct text_groups *out)
{
    memset(out, 0, sizeof(*out));
    if (strcmp(text, "-") == 0)
        return;
    out->count = 1;
    for (; *text != '\0'; text++) {
        size_t g = out->count - 1;
        char *end;

        if (*text == '|') {
            assert_true(out->count < TEXT_MAX_GROUPS);
            out->count++;
        } else if (*text != ' ') {
            assert_true(out->g[g].count < TEXT_MAX_IDS);
            out->ids[g][out->g[g].count++] = strtoull(text, &end, 10);
            text                           = end - 1;
        }
    }
    for (size_t g = 0; g < out->count; g++)
        out->g[g].ids = out->ids[g];
}

/* Parses a pair list into reads; returns how many. */
size_t text_parse_reads(const char *rule, const char *text, struct text_read *reads)
{
    size_t n = 0;

    while (*text != '\0') {
        char *end;
        char s;
        uint64_t lo;
        uint64_t ro;
        uint64_t len;
        int used = 0;

        if (*text == ' ') {
            text++;
        } else if (*text == '@' && n < TEXT_MAX_READS) {
            reads[n++] = (struct text_read){.rank = (uint32_t)strtoul(text + 1, &end, 10)};
            text       = end;
        } else if (n > 0 && reads[n - 1].count < TEXT_MAX_PAIRS &&
                   sscanf(text, "%c%" SCNu64 "<%n", &s, &lo, &used) == 2 && used > 0) {
            uint32_t ls = (uint32_t)(s - 'a');
            uint32_t rs = ls;

            text += used;
            if (*text >= 'a' && *text <= 'z') /* the remote storage, when it differs */
                rs = (uint32_t)(*text++ - 'a');
            if (sscanf(text, "%" SCNu64 "/%" SCNu64 "%n", &ro, &len, &used) != 2)
                fail_msg("%s: bad pair text at \"%s\"", rule, text);
            reads[n - 1].p[reads[n - 1].count++] = (kvx_pair_t){ls, rs, lo, ro, len};
            text += used;
        } else {
            fail_msg("%s: bad pair text at \"%s\"", rule, text);
        }
    }
    return n;
}

/* Compares every read of `pairs` with `expected`, then the stats: `descriptors` (pairs
 * before coalescing; 0: as many as listed), coalesced = the pairs listed, bytes = theirs. */
void text_expect_pairs(const char *rule, const kvx_pairs_t *pairs, const char *expected,
                       uint64_t descriptors)
{
    struct text_read reads[TEXT_MAX_READS];
    size_t num_reads   = text_parse_reads(rule, expected, reads);
    uint64_t coalesced = 0;
    uint64_t bytes     = 0;
    kvx_pairs_stats_t stats;

    if (kvx_pairs_num_reads(pairs) != num_reads)
        fail_msg("%s: %zu reads, expected %zu", rule, kvx_pairs_num_reads(pairs), num_reads);
    for (size_t r = 0; r < num_reads; r++) {
        uint32_t rank         = UINT32_MAX;
        size_t count          = SIZE_MAX;
        const kvx_pair_t *got = kvx_pairs_read(pairs, r, &rank, &count);

        if (rank != reads[r].rank || count != reads[r].count)
            fail_msg("%s: read %zu is rank %" PRIu32 " with %zu pairs, expected rank %" PRIu32
                     " with %zu",
                     rule, r, rank, count, reads[r].rank, reads[r].count);
        for (size_t i = 0; i < count; i++) {
            const kvx_pair_t *x = &reads[r].p[i];

            if (memcmp(&got[i], x, sizeof(*x)) != 0)
                fail_msg("%s: read %zu pair %zu is %" PRIu32 "+%" PRIu64 " <- %" PRIu32 "+%" PRIu64
                         " / %" PRIu64 ", expected %" PRIu32 "+%" PRIu64 " <- %" PRIu32 "+%" PRIu64
                         " / %" PRIu64,
                         rule, r, i, got[i].local_storage, got[i].local_offset,
                         got[i].remote_storage, got[i].remote_offset, got[i].len, x->local_storage,
                         x->local_offset, x->remote_storage, x->remote_offset, x->len);
            bytes += x->len;
        }
        coalesced += count;
    }
    assert_null(kvx_pairs_read(pairs, num_reads, NULL, NULL));
    kvx_pairs_stats(pairs, &stats);
    descriptors = descriptors != 0 ? descriptors : coalesced;
    if (stats.descriptors != descriptors || stats.coalesced != coalesced || stats.bytes != bytes)
        fail_msg("%s: stats %" PRIu64 "/%" PRIu64 "/%" PRIu64 ", expected %" PRIu64 "/%" PRIu64
                 "/%" PRIu64,
                 rule, stats.descriptors, stats.coalesced, stats.bytes, descriptors, coalesced,
                 bytes);
}

/* Every '|'-separated fragment of `parts` must appear in the last failure's message. */
void text_expect_message(const char *rule, const char *parts)
{
    char part[128];

    while (*parts != '\0') {
        size_t n = strcspn(parts, "|");

        assert_true(n < sizeof(part));
        memcpy(part, parts, n);
        part[n] = '\0';
        if (strstr(kvx_errmsg(), part) == NULL)
            fail_msg("%s: message \"%s\" lacks \"%s\"", rule, kvx_errmsg(), part);
        parts += n + (parts[n] == '|');
    }
}

/* The block-size ratio the plan uses: the params' block sizes, else the tables'. */
uint64_t text_bsr(const kvx_regions_t *local, const kvx_regions_t *remote,
                  const kvx_peer_plan_params_t *params)
{
    bool given = (params->field_mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE) != 0;

    return (given ? params->local_block_size : kvx_regions_block_size(local)) /
           (given ? params->remote_block_size : kvx_regions_block_size(remote));
}

/* The remote ids a request with request.remote == NULL stands for: n*bsr .. n*bsr + bsr-1
 * for each local id n, in order. */
void text_expand_default(const struct text_groups *local, uint64_t bsr, struct text_groups *out)
{
    memset(out, 0, sizeof(*out));
    out->count = local->count;
    for (size_t g = 0; g < local->count; g++) {
        out->g[g].ids = out->ids[g];
        for (size_t i = 0; i < local->g[g].count; i++) {
            for (uint64_t k = 0; k < bsr; k++) {
                assert_true(out->g[g].count < TEXT_MAX_IDS);
                out->ids[g][out->g[g].count++] = local->ids[g][i] * bsr + k;
            }
        }
    }
}

/* fuzz_layout.c: libFuzzer target of the layout reader (formats.md) and of registration
 * (regions.md): any bytes either fail with a message or give a table whose invariants hold. */
#include "fuzz_invariant.h"
#include "error.h"
#include "layout.h"
#include "text.h"

#include "kvx.h"

#include <cjson/cJSON.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128; /* sums of two 63-bit products never overflow it */

/* Blocks of one member checked one by one before the check turns to arithmetic: a fuzzed
 * layout may hold 2^53 blocks, and the harness must stay fast. */
#define FUZZ_EXACT_BLOCKS 4096

/* Highest group id for which the harness builds a request (one id array per group). */
#define FUZZ_MAX_REQUEST_GROUPS 64

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a          = b;
        b          = t;
    }
    return a;
}

/* True when (rel + b*vs) mod rs + page <= len for block b: that block of the member lies in
 * one block of a region whose blocks do not touch. */
static bool block_fits_row(uint64_t rel, uint64_t b, uint64_t vs, uint64_t rs, uint64_t page,
                           uint64_t len)
{
    return (uint64_t)(((u128)rel + (u128)b * vs) % rs) + (u128)page <= len;
}

/* regions.md step 4 for one member v of region r, written from the text with its own
 * arithmetic: the union of v's blocks [v.offset + b*v.stride, + page) lies inside the union
 * of r's blocks [r.offset + k*r.stride, + block_len). Exact, except for a member of more
 * than FUZZ_EXACT_BLOCKS blocks whose offsets within a row cycle with a period longer than
 * that: there the first and last FUZZ_EXACT_BLOCKS blocks are checked. */
static bool member_is_covered(const struct view *v, const kvx_region_info_t *r)
{
    uint64_t rel;
    uint64_t d;
    uint64_t g;
    uint64_t period;
    uint64_t n = v->num_blocks;

    if (v->offset < r->offset)
        return false;
    rel = v->offset - r->offset;
    if (r->block_len >= r->stride) /* the region's blocks touch: one interval */
        return (u128)rel + (u128)(n - 1) * v->stride + v->page <=
               (u128)(r->num_blocks - 1) * r->stride + r->block_len;

    /* Rows are r's blocks. Each block of v must sit inside one row's first block_len bytes,
     * and the last block's row must exist (rows only grow with b). */
    if (((u128)rel + (u128)(n - 1) * v->stride) / r->stride >= r->num_blocks)
        return false;
    if (v->page > r->block_len)
        return false;
    d = v->stride % r->stride;
    if (d == 0) /* every block at the same place in its row */
        return block_fits_row(rel, 0, v->stride, r->stride, v->page, r->block_len);
    g      = gcd_u64(d, r->stride);
    period = r->stride / g; /* the place in the row repeats after this many blocks */
    if (n >= period && period > FUZZ_EXACT_BLOCKS) /* every place rel mod g + k*g is met */
        return (rel % g) + (r->stride - g) + v->page <= r->block_len;
    if (n > period)
        n = period;
    for (uint64_t b = 0; b < n && b < FUZZ_EXACT_BLOCKS; b++) {
        if (!block_fits_row(rel, b, v->stride, r->stride, v->page, r->block_len))
            return false;
    }
    for (uint64_t b = n > FUZZ_EXACT_BLOCKS ? n - FUZZ_EXACT_BLOCKS : n; b < n; b++) {
        if (!block_fits_row(rel, b, v->stride, r->stride, v->page, r->block_len))
            return false;
    }
    return true;
}

/* A request of block 0 in every group of the layout must pass (every region has a block 0)
 * and yield, per group, one id for each region that takes it (regions.md "Descriptors"); in a
 * table of several groups, a group no view is in names nothing (docs/plan.md "The request"). */
static void check_request(const kvx_layout_t *layout, const kvx_regions_t *table,
                          const kvx_region_info_t *infos, size_t count)
{
    static const uint64_t zero = 0;
    kvx_group_ids_t groups[FUZZ_MAX_REQUEST_GROUPS];
    bool single_group = true;
    int64_t max_group = -1;
    size_t num_groups;
    size_t expected = 0;
    size_t num_ids;

    for (size_t r = 0; r < count; r++) {
        single_group = single_group && infos[r].group == infos[0].group;
        max_group    = infos[r].group > max_group ? infos[r].group : max_group;
    }
    if (max_group >= FUZZ_MAX_REQUEST_GROUPS)
        return;
    num_groups = max_group < 0 ? 1 : (size_t)max_group + 1;
    for (size_t g = 0; g < num_groups; g++) {
        bool has = single_group;

        for (size_t v = 0; v < layout->num_views && !has; v++)
            has = (uint64_t)layout->views[v].group == g;
        groups[g] = (kvx_group_ids_t){.ids = &zero, .count = has ? 1 : 0};
        for (size_t r = 0; r < count && has; r++)
            expected += single_group || infos[r].group == -1 || infos[r].group == (int64_t)g;
    }
    if (kvx_regions_request_ids(table, groups, num_groups, NULL, 0, &num_ids) != KVX_OK)
        fuzz_fail("a request of block 0 in %zu groups failed", num_groups);
    if (num_ids != expected)
        fuzz_fail("a request of block 0 in %zu groups yields %zu ids, not %zu", num_groups, num_ids,
                  expected);
}

/* Every invariant of a registered table: each view in exactly one region, regions inside
 * their storages, members covered, descriptor ids region-major, a plan that is JSON. */
static void check_table(const kvx_layout_t *layout, const kvx_regions_t *table)
{
    size_t count = kvx_regions_count(table);
    unsigned char *seen;
    kvx_region_info_t *infos;
    uint64_t sum = 0;
    kvx_descriptor_t d;
    char *json = NULL;
    cJSON *plan;

    if (count == 0 || count > layout->num_views)
        fuzz_fail("%zu regions for %zu views", count, layout->num_views);
    seen  = calloc(layout->num_views, sizeof(*seen));
    infos = calloc(count, sizeof(*infos));
    if (seen == NULL || infos == NULL)
        fuzz_fail("out of memory in the harness");
    for (size_t i = 0; i < count; i++) {
        kvx_region_info_t *r = &infos[i];
        const struct storage *s;

        if (kvx_regions_get(table, i, r) != KVX_OK)
            fuzz_fail("region %zu of %zu cannot be read", i, count);
        if (r->storage >= layout->num_storages || r->num_blocks == 0 || r->block_len == 0 ||
            r->num_members == 0 || r->first_descriptor != sum)
            fuzz_fail("region %zu: storage %zu, %" PRIu64 " blocks of %" PRIu64 " bytes, %zu"
                      " members, first descriptor %" PRIu64 " (expected %" PRIu64 ")",
                      i, r->storage, r->num_blocks, r->block_len, r->num_members,
                      r->first_descriptor, sum);
        s = &layout->storages[r->storage];
        if ((u128)r->offset + (u128)(r->num_blocks - 1) * r->stride + r->block_len > s->size)
            fuzz_fail("region %zu reaches past storage %s of %" PRIu64 " bytes", i, s->name,
                      s->size);
        if (__builtin_add_overflow(sum, r->num_blocks, &sum))
            fuzz_fail("the descriptor count overflows at region %zu", i);
        for (size_t m = 0; m < r->num_members; m++) {
            uint32_t vi = r->members[m];

            if (vi >= layout->num_views || seen[vi]++ != 0)
                fuzz_fail("region %zu member %zu: view %" PRIu32 " is out of range or in two"
                          " regions",
                          i, m, vi);
            if (layout->views[vi].storage != r->storage ||
                !member_is_covered(&layout->views[vi], r))
                fuzz_fail("views[%" PRIu32 "] (%s) is not covered by region %zu (%s)", vi,
                          layout->views[vi].name, i, r->name);
        }
    }
    for (size_t vi = 0; vi < layout->num_views; vi++) {
        if (seen[vi] != 1)
            fuzz_fail("views[%zu] (%s) is in no region", vi, layout->views[vi].name);
    }
    if (kvx_regions_num_descriptors(table) != sum)
        fuzz_fail("%" PRIu64 " descriptors, the regions hold %" PRIu64,
                  kvx_regions_num_descriptors(table), sum);
    if (kvx_regions_descriptor(table, sum - 1, &d) != KVX_OK ||
        d.offset !=
            infos[count - 1].offset + (infos[count - 1].num_blocks - 1) * infos[count - 1].stride ||
        kvx_regions_descriptor(table, sum, &d) != KVX_ERR_OUT_OF_RANGE)
        fuzz_fail("the last descriptor is not the last block of the last region");
    check_request(layout, table, infos, count);

    if (kvx_regions_to_json(table, &json) != KVX_OK)
        fuzz_fail("kvx_regions_to_json failed");
    plan = cJSON_Parse(json);
    if (plan == NULL ||
        cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(plan, "regions")) != (int)count)
        fuzz_fail("the plan is not JSON with %zu regions", count);
    cJSON_Delete(plan);
    kvx_free(json);
    free(infos);
    free(seen);
}

/* True when `text` is printable UTF-8 (text.h): what every name of a loaded layout, and
 * every message about a layout, must be, whatever bytes the input held. */
static bool is_printable(const char *text)
{
    const char *why;

    return text_find_unprintable(text, strlen(text), &why) == strlen(text);
}

static void check_names(const kvx_layout_t *layout)
{
    for (size_t i = 0; i < layout->num_storages; i++) {
        if (!is_printable(layout->storages[i].name))
            fuzz_fail("storages[%zu].name is not printable UTF-8", i);
    }
    for (size_t i = 0; i < layout->num_views; i++) {
        if (!is_printable(layout->views[i].name))
            fuzz_fail("views[%zu].name is not printable UTF-8", i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvx_layout_t *layout = NULL;
    kvx_regions_t *table = NULL;
    kvx_status_t status;

    error_set(KVX_OK, "%s", ""); /* so a failure below must write its own message */
    status = kvx_layout_load_buffer((const char *)data, size, &layout);
    if (status != KVX_OK) {
        if (layout != NULL || kvx_errmsg()[0] == '\0' ||
            (status != KVX_ERR_INVALID && status != KVX_ERR_NO_MEMORY))
            fuzz_fail("a failed load returned %s, a layout %p and message \"%s\"",
                      kvx_status_str(status), (void *)layout, kvx_errmsg());
        if (!is_printable(kvx_errmsg()))
            fuzz_fail("a failed load's message carries raw bytes");
        return 0;
    }
    if (layout == NULL || layout->num_views == 0 || layout->num_storages == 0)
        fuzz_fail("a loaded layout is empty");
    check_names(layout);

    error_set(KVX_OK, "%s", "");
    status = kvx_regions_register(layout, &table);
    if (status == KVX_OK)
        check_table(layout, table);
    else if (table != NULL || kvx_errmsg()[0] == '\0' ||
             (status != KVX_ERR_INVALID && status != KVX_ERR_NO_MEMORY))
        fuzz_fail("a failed registration returned %s, a table %p and message \"%s\"",
                  kvx_status_str(status), (void *)table, kvx_errmsg());
    kvx_regions_destroy(table);
    kvx_layout_destroy(layout);
    return 0;
}

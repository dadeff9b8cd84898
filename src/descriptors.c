/* descriptors.c: descriptor ids and addresses of a region table, and the request rule of
 * regions.md "Descriptors" (block ids per group -> descriptor ids), and the checks a request
 * passes on every path. Allocates only to look for a repeat among ids out of order. */
#include "regions.h"

#include "error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Group ids listed in a message: enough for any engine's, and a bound on the text. */
#define GROUPS_LISTED 16

kvx_status_t kvx_regions_descriptor_id(const kvx_regions_t *regions, size_t region, uint64_t block,
                                       uint64_t *id_p)
{
    const struct region *r;

    if (region >= regions->num_regions)
        return error_set(KVX_ERR_OUT_OF_RANGE, "region %zu: the table has %zu regions", region,
                         regions->num_regions);
    r = &regions->regions[region];
    if (block >= r->num_blocks)
        return error_set(KVX_ERR_OUT_OF_RANGE,
                         "block %" PRIu64 " of region %zu (%s): the"
                         " region has %" PRIu64 " blocks",
                         block, region, regions_region_name(regions, r), r->num_blocks);
    *id_p = r->first_descriptor + block;
    return KVX_OK;
}

kvx_status_t kvx_regions_descriptor(const kvx_regions_t *regions, uint64_t id,
                                    kvx_descriptor_t *descriptor_p)
{
    size_t lo = 0;
    size_t hi = regions->num_regions;
    const struct region *r;

    if (id >= regions->num_descriptors)
        return error_set(KVX_ERR_OUT_OF_RANGE,
                         "descriptor %" PRIu64 ": the table has %" PRIu64 " descriptors", id,
                         regions->num_descriptors);
    /* The last region whose first descriptor is <= id; regions are never empty. */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;

        if (regions->regions[mid].first_descriptor <= id)
            lo = mid;
        else
            hi = mid;
    }
    r             = &regions->regions[lo];
    *descriptor_p = (kvx_descriptor_t){
        .storage = r->storage,
        .offset  = r->offset + (id - r->first_descriptor) * r->stride,
        .len     = r->block_len,
    };
    return KVX_OK;
}

kvx_status_t kvx_regions_descriptor_addr(const kvx_regions_t *regions,
                                         const uint64_t *storage_bases, uint64_t id,
                                         uint64_t *addr_p, uint64_t *len_p)
{
    kvx_descriptor_t d  = {0};
    kvx_status_t status = kvx_regions_descriptor(regions, id, &d);

    if (status != KVX_OK)
        return status;
    *addr_p = storage_bases[d.storage] + d.offset;
    *len_p  = d.len;
    return KVX_OK;
}

bool regions_has_group(const kvx_regions_t *t, size_t g)
{
    bool shared = false;

    for (size_t i = 0; i < t->num_view_groups; i++) {
        if ((uint64_t)t->view_groups[i] == g)
            return true;
    }
    if (t->view_groups != NULL)
        return false;
    /* A table from the wire knows only its regions' groups: a shared region may hold any. */
    for (size_t r = 0; r < t->num_regions; r++) {
        shared |= t->regions[r].group == -1;
        if (t->regions[r].group >= 0 && (uint64_t)t->regions[r].group == g)
            return true;
    }
    return shared;
}

int64_t kvx_regions_max_group(const kvx_regions_t *regions)
{
    int64_t max = regions->max_group > 0 ? regions->max_group : 0;

    for (size_t i = 0; i < regions->num_view_groups; i++)
        max = regions->view_groups[i] > max ? regions->view_groups[i] : max;
    return max;
}

/* Writes the table's group ids, ascending, as "0, 1 and 2" (the first GROUPS_LISTED): the
 * layout's views', or, in a table from the wire, its regions'. */
static void groups_text(const kvx_regions_t *t, char *text, size_t size)
{
    int64_t last = -1;
    size_t len   = 0;

    text[0] = '\0';
    for (size_t listed = 0; listed < GROUPS_LISTED; listed++) {
        int64_t next  = INT64_MAX; /* the smallest group id above `last` */
        int64_t after = INT64_MAX; /* and the one above that */
        size_t n      = t->view_groups != NULL ? t->num_view_groups : t->num_regions;

        for (size_t i = 0; i < n; i++) {
            int64_t g = t->view_groups != NULL ? t->view_groups[i] : t->regions[i].group;

            if (g > last && g < next) {
                after = next;
                next  = g;
            } else if (g > next && g < after) {
                after = g;
            }
        }
        if (next == INT64_MAX)
            return;
        len += (size_t)snprintf(text + len, size - len, "%s%" PRId64,
                                listed == 0 ? "" : after == INT64_MAX ? " and " : ", ", next);
        if (len >= size)
            return;
        last = next;
    }
    snprintf(text + len, size - len, ", ...");
}

kvx_status_t regions_groups_missing(const kvx_regions_t *t, size_t num_groups)
{
    char groups[GROUPS_LISTED * 24];
    char named[64];

    groups_text(t, groups, sizeof(groups));
    if (num_groups == 0)
        snprintf(named, sizeof(named), "no group");
    else if (num_groups == 1)
        snprintf(named, sizeof(named), "1 group (0)");
    else
        snprintf(named, sizeof(named), "%zu groups (0-%zu)", num_groups, num_groups - 1);
    return error_set(KVX_ERR_INVALID,
                     "request: names %s, but the layout needs groups 0-%" PRId64
                     " (of its groups %s): name each, empty when none of its blocks move",
                     named, t->max_group, groups);
}

kvx_status_t regions_group_unknown(const kvx_regions_t *t, size_t g)
{
    char groups[GROUPS_LISTED * 24];

    groups_text(t, groups, sizeof(groups));
    return error_set(KVX_ERR_INVALID,
                     "request: group %zu has block ids, but the layout has no group %zu (its"
                     " groups are %s); nothing is transferred",
                     g, g, groups);
}

kvx_status_t regions_id_repeated(size_t g, uint64_t id)
{
    return error_set(KVX_ERR_INVALID,
                     "request: group %zu names block id %" PRIu64 " twice; nothing is transferred",
                     g, id);
}

bool regions_ids_ascend(const uint64_t *ids, size_t n)
{
    for (size_t i = 1; i < n; i += 64) {
        size_t end = n - i > 64 ? i + 64 : n;
        unsigned down = 0;

        for (size_t x = i; x < end; x++)
            down |= ids[x] <= ids[x - 1];
        if (down != 0)
            return false;
    }
    return true;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

kvx_status_t regions_group_check_repeats(const kvx_group_ids_t *group, size_t g)
{
    uint64_t *sorted;

    if (regions_ids_ascend(group->ids, group->count))
        return KVX_OK;
    sorted = malloc(group->count * sizeof(*sorted));
    if (sorted == NULL)
        return error_no_memory("a request's ids");
    memcpy(sorted, group->ids, group->count * sizeof(*sorted));
    qsort(sorted, group->count, sizeof(*sorted), compare_u64);
    for (size_t i = 1; i < group->count; i++) {
        if (sorted[i] == sorted[i - 1]) {
            uint64_t id = sorted[i];

            free(sorted);
            return regions_id_repeated(g, id);
        }
    }
    free(sorted);
    return KVX_OK;
}

/* One descriptor's bytes, for kvx_regions_bytes(). */
struct span {
    uint64_t storage;
    uint64_t start;
    uint64_t end;
};

static int compare_span(const void *a, const void *b)
{
    const struct span *x = a;
    const struct span *y = b;

    if (x->storage != y->storage)
        return x->storage < y->storage ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

kvx_status_t kvx_regions_bytes(const kvx_regions_t *regions, uint64_t *bytes_p)
{
    struct span *spans = calloc(regions->num_descriptors + 1, sizeof(*spans));
    uint64_t bytes     = 0;
    uint64_t reached   = 0; /* end of the bytes counted so far in this storage */
    size_t n           = 0;

    if (spans == NULL)
        return error_no_memory("the table's descriptors");
    for (size_t r = 0; r < regions->num_regions; r++) {
        const struct region *region = &regions->regions[r];

        for (uint64_t b = 0; b < region->num_blocks; b++) {
            uint64_t start = region->offset + b * region->stride;

            spans[n++] = (struct span){region->storage, start, start + region->block_len};
        }
    }
    qsort(spans, n, sizeof(*spans), compare_span);
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || spans[i].storage != spans[i - 1].storage)
            reached = 0;
        if (spans[i].end > reached) {
            bytes += spans[i].end - (spans[i].start > reached ? spans[i].start : reached);
            reached = spans[i].end;
        }
    }
    free(spans);
    *bytes_p = bytes;
    return KVX_OK;
}

/* True when region r takes the ids of group g (regions.md "Descriptors"). */
static bool region_takes_group(const kvx_regions_t *t, const struct region *r, size_t g)
{
    return t->single_group || r->group == -1 || (uint64_t)r->group == g;
}

/* Checks every id of group g against every region that takes it, and adds to *count_p the
 * ids the group yields. The first offending id is reported with the first region it
 * overflows, so the message is the same whatever order a caller checks in. */
static kvx_status_t group_check(const kvx_regions_t *t, const kvx_group_ids_t *group, size_t g,
                                size_t *count_p)
{
    uint64_t min_blocks = UINT64_MAX;
    size_t takers       = 0;
    size_t yield;

    if (group->count > 0 && group->ids == NULL)
        return error_set(KVX_ERR_INVALID, "request: group %zu has %zu ids but no array", g,
                         group->count);
    if (group->count > 0 && !t->single_group && !regions_has_group(t, g))
        return regions_group_unknown(t, g);
    for (size_t r = 0; r < t->num_regions; r++) {
        if (region_takes_group(t, &t->regions[r], g)) {
            takers++;
            if (t->regions[r].num_blocks < min_blocks)
                min_blocks = t->regions[r].num_blocks;
        }
    }
    for (size_t i = 0; i < group->count && takers > 0; i++) {
        uint64_t id = group->ids[i];

        if (id < min_blocks)
            continue;
        for (size_t r = 0;; r++) {
            const struct region *region = &t->regions[r];

            if (region_takes_group(t, region, g) && id >= region->num_blocks)
                return error_set(KVX_ERR_OUT_OF_RANGE,
                                 "request: block id %" PRIu64
                                 " of group %zu is out of range for region %zu (%s) of %" PRIu64
                                 " blocks; nothing is transferred",
                                 id, g, r, regions_region_name(t, region), region->num_blocks);
        }
    }
    if (__builtin_mul_overflow(takers, group->count, &yield) ||
        __builtin_add_overflow(*count_p, yield, count_p))
        return error_set(KVX_ERR_INVALID, "request: the descriptor count overflows");
    return KVX_OK;
}

/* Writes the ids of group g for every region that takes it: region, then block. */
static size_t group_emit(const kvx_regions_t *t, const kvx_group_ids_t *group, size_t g,
                         uint64_t *ids)
{
    size_t n = 0;

    for (size_t r = 0; r < t->num_regions; r++) {
        const struct region *region = &t->regions[r];

        if (!region_takes_group(t, region, g))
            continue;
        for (size_t i = 0; i < group->count; i++)
            ids[n++] = region->first_descriptor + group->ids[i];
    }
    return n;
}

kvx_status_t kvx_regions_request_ids(const kvx_regions_t *regions, const kvx_group_ids_t *groups,
                                     size_t num_groups, uint64_t *ids, size_t max_ids,
                                     size_t *num_ids_p)
{
    size_t count = 0;
    kvx_status_t status;

    if (regions == NULL || num_ids_p == NULL || (groups == NULL && num_groups > 0))
        return error_set(KVX_ERR_INVALID, "request: table, groups and result are required");
    if (!regions->single_group && (int64_t)num_groups <= regions->max_group)
        return regions_groups_missing(regions, num_groups);
    for (size_t g = 0; g < num_groups; g++) {
        status = group_check(regions, &groups[g], g, &count);
        if (status != KVX_OK)
            return status;
    }
    if (ids != NULL) {
        size_t n = 0;

        if (max_ids < count)
            return error_set(KVX_ERR_INVALID,
                             "request: room for %zu ids, the request yields"
                             " %zu",
                             max_ids, count);
        /* With one group in the table every region takes the concatenation of all groups:
         * region, then the blocks of group 0, 1, ... With several: group, region, block. */
        if (regions->single_group) {
            for (size_t r = 0; r < regions->num_regions; r++) {
                for (size_t g = 0; g < num_groups; g++) {
                    for (size_t i = 0; i < groups[g].count; i++)
                        ids[n++] = regions->regions[r].first_descriptor + groups[g].ids[i];
                }
            }
        } else {
            for (size_t g = 0; g < num_groups; g++)
                n += group_emit(regions, &groups[g], g, ids + n);
        }
    }
    *num_ids_p = count;
    return KVX_OK;
}

/* block_ids.c: the --blocks syntax of the command line, 'G:ids;G:ids' with ids as
 * comma-separated numbers or ranges (0-99): parsed into per-group arrays, and printed back. */
#include "block_ids.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* At most this many ids on a command line: a 1M-token request in 16-token blocks is 65,536
 * blocks per group, so this leaves room and bounds a typo like 0-99999999999. */
#define BLOCK_IDS_MAX (1u << 24)
#define GROUPS_MAX    1024

static bool parse_u64(const char **p, uint64_t *value_p)
{
    char *end;
    unsigned long long v;

    if (**p < '0' || **p > '9')
        return false;
    errno = 0;
    v     = strtoull(*p, &end, 10);
    if (errno != 0)
        return false;
    *p       = end;
    *value_p = v;
    return true;
}

static bool group_append(kvx_group_ids_t *g, uint64_t id, size_t *max_p)
{
    uint64_t *ids;

    if (g->count == *max_p) {
        size_t max = *max_p == 0 ? 16 : *max_p * 2;

        ids = realloc((void *)g->ids, max * sizeof(*ids));
        if (ids == NULL)
            return false;
        g->ids = ids;
        *max_p = max;
    }
    ((uint64_t *)g->ids)[g->count++] = id;
    return true;
}

bool block_ids_parse(const char *option, const char *text, struct block_ids *out, char *error,
                     size_t size)
{
    struct block_ids ids     = {calloc(GROUPS_MAX, sizeof(kvx_group_ids_t)), 0};
    size_t maxes[GROUPS_MAX] = {0};
    size_t total             = 0;
    const char *p            = text;

    if (ids.groups == NULL) {
        snprintf(error, size, "%s: out of memory", option);
        return false;
    }
    while (*p != '\0') {
        uint64_t group;

        if (!parse_u64(&p, &group) || *p != ':' || group >= GROUPS_MAX) {
            snprintf(error, size, "%s: expected GROUP:IDS (group below %d) at \"%s\"", option,
                     GROUPS_MAX, p);
            goto fail;
        }
        p++;
        if (group + 1 > ids.num_groups)
            ids.num_groups = group + 1;
        while (*p != '\0' && *p != ';') {
            uint64_t first;
            uint64_t last;

            if (!parse_u64(&p, &first)) {
                snprintf(error, size, "%s: expected a block id at \"%s\"", option, p);
                goto fail;
            }
            last = first;
            if (*p == '-') {
                p++;
                if (!parse_u64(&p, &last)) {
                    snprintf(error, size, "%s: expected the range's last block id at \"%s\"",
                             option, p);
                    goto fail;
                }
                if (last < first) {
                    snprintf(error, size,
                             "%s: descending range %" PRIu64 "-%" PRIu64
                             " (a range goes up: %" PRIu64 "-%" PRIu64 ")",
                             option, first, last, last, first);
                    goto fail;
                }
            }
            if (last - first >= BLOCK_IDS_MAX || (total += last - first + 1) > BLOCK_IDS_MAX) {
                snprintf(error, size, "%s: more than %u block ids", option, BLOCK_IDS_MAX);
                goto fail;
            }
            for (uint64_t id = first;; id++) {
                if (!group_append(&ids.groups[group], id, &maxes[group])) {
                    snprintf(error, size, "%s: out of memory", option);
                    goto fail;
                }
                if (id == last)
                    break;
            }
            if (*p == ',')
                p++;
            else if (*p != '\0' && *p != ';') {
                snprintf(error, size, "%s: unexpected \"%s\"", option, p);
                goto fail;
            }
        }
        if (*p == ';')
            p++;
    }
    if (ids.num_groups == 0) {
        snprintf(error, size, "%s: names no group", option);
        goto fail;
    }
    *out = ids;
    return true;

fail:
    ids.num_groups = GROUPS_MAX;
    block_ids_free(&ids);
    return false;
}

void block_ids_free(struct block_ids *ids)
{
    if (ids->groups == NULL)
        return;
    for (size_t g = 0; g < ids->num_groups; g++)
        free((void *)ids->groups[g].ids);
    free(ids->groups);
    ids->groups = NULL;
}

kvx_status_t block_ids_check_layout(const char *layout_path, const struct block_ids *ids)
{
    kvx_layout_t *layout   = NULL;
    kvx_regions_t *regions = NULL;
    size_t num_ids;
    kvx_status_t status = kvx_layout_load_file(layout_path, &layout);

    if (status == KVX_OK)
        status = kvx_regions_register(layout, &regions);
    if (status == KVX_OK)
        status = kvx_regions_request_ids(regions, ids->groups, ids->num_groups, NULL, 0, &num_ids);
    kvx_regions_destroy(regions);
    kvx_layout_destroy(layout);
    return status;
}

void block_ids_print(FILE *out, const kvx_group_ids_t *groups, size_t num_groups)
{
    const char *group_separator = "";

    for (size_t g = 0; g < num_groups; g++) {
        const uint64_t *ids = groups[g].ids;
        size_t n            = groups[g].count;

        if (n == 0)
            continue;
        fprintf(out, "%s%zu:", group_separator, g);
        group_separator = ";";
        for (size_t i = 0; i < n;) {
            size_t run = i; /* ids[i..run] count up by one */

            while (run + 1 < n && ids[run + 1] == ids[run] + 1)
                run++;
            fprintf(out, "%s%" PRIu64, i > 0 ? "," : "", ids[i]);
            if (run > i)
                fprintf(out, "-%" PRIu64, ids[run]);
            i = run + 1;
        }
    }
}

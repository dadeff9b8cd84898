/* plan_print.c: the human-readable region table of `kvx plan` and `kvx demo`. Formatting
 * only: every number comes from the library. */
#include "plan_print.h"

#include "stats_json.h"

#include <inttypes.h>
#include <string.h>

/* Comma-separated flags of a region, or "-". */
static const char *region_flags(const kvx_region_info_t *info, char *buf, size_t size)
{
    const struct {
        bool set;
        const char *word;
    } flags[]   = {{info->mla, "mla"},
                   {info->packed_row, "packed_row"},
                   {info->scratch, "scratch"},
                   {info->ssm, "ssm"},
                   {info->ple, "ple"}};
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        if (flags[i].set)
            used += (size_t)snprintf(buf + used, size - used, "%s%s", used > 0 ? "," : "",
                                     flags[i].word);
    }
    return used > 0 ? buf : "-";
}

void plan_print_totals(FILE *out, const kvx_regions_t *regions)
{
    size_t count   = kvx_regions_count(regions);
    uint64_t bytes = 0;

    /* each byte once: a region inside another's rows adds nothing (docs/plan.md) */
    if (kvx_regions_bytes(regions, &bytes) != KVX_OK)
        bytes = 0; /* out of memory: the table is printed, the total says nothing moves */
    fprintf(out,
            "total: %zu regions, %" PRIu64 " descriptors, %" PRIu64
            " bytes when every block moves (%.2f GiB)\n",
            count, kvx_regions_num_descriptors(regions), bytes,
            (double)bytes / (1024.0 * 1024.0 * 1024.0));
}

void plan_print_table(FILE *out, const kvx_regions_t *regions)
{
    size_t count    = kvx_regions_count(regions);
    int name_width  = 4;
    int where_width = 14;
    int flags_width = 5;
    kvx_region_info_t info;
    char where[320];
    char flags[64];

    for (size_t r = 0; r < count; r++) {
        kvx_regions_get(regions, r, &info);
        if ((int)strlen(info.name) > name_width)
            name_width = (int)strlen(info.name);
        snprintf(where, sizeof(where), "%s+%" PRIu64, info.storage_name, info.offset);
        if ((int)strlen(where) > where_width)
            where_width = (int)strlen(where);
        region_flags(&info, flags, sizeof(flags));
        if ((int)strlen(flags) > flags_width)
            flags_width = (int)strlen(flags);
    }
    fprintf(out, "%5s  %-*s  %-*s  %10s  %10s  %8s  %5s  %-*s  %7s\n", "index", name_width, "name",
            where_width, "storage+offset", "block_len", "stride", "blocks", "group", flags_width,
            "flags", "members");
    for (size_t r = 0; r < count; r++) {
        kvx_regions_get(regions, r, &info);
        snprintf(where, sizeof(where), "%s+%" PRIu64, info.storage_name, info.offset);
        fprintf(out,
                "%5zu  %-*s  %-*s  %10" PRIu64 "  %10" PRIu64 "  %8" PRIu64 "  %5" PRId64
                "  %-*s  %7zu\n",
                r, name_width, info.name, where_width, where, info.block_len, info.stride,
                info.num_blocks, info.group, flags_width, region_flags(&info, flags, sizeof(flags)),
                info.num_members);
    }
    plan_print_totals(out, regions);
}

/* Pairs shown per read rank in the readable output. */
#define PAIRS_SHOWN 8

static void print_pairs_json(FILE *out, const kvx_regions_t *local, const kvx_regions_t *remote,
                             const kvx_peer_plan_t *plan, const kvx_pairs_t *pairs)
{
    kvx_pairs_stats_t stats;

    kvx_pairs_stats(pairs, &stats);
    fprintf(out, "{\n  \"kvx_pairs\": 1,\n  \"reads\": [");
    for (size_t r = 0; r < kvx_pairs_num_reads(pairs); r++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, r, &rank, &count);

        fprintf(out, "%s\n    {\"remote_rank\": %" PRIu32 ", \"pairs\": [", r > 0 ? "," : "", rank);
        for (size_t i = 0; i < count; i++) {
            fprintf(out, "%s\n      [", i > 0 ? "," : "");
            json_string_print(out, kvx_regions_storage_name(local, p[i].local_storage));
            fprintf(out, ", %" PRIu64 ", ", p[i].local_offset);
            json_string_print(out, kvx_regions_storage_name(remote, p[i].remote_storage));
            fprintf(out, ", %" PRIu64 ", %" PRIu64 "]", p[i].remote_offset, p[i].len);
        }
        fprintf(out, "%s]}", count > 0 ? "\n    " : "");
    }
    fprintf(out,
            "%s],\n  \"descriptors\": %" PRIu64 ",\n  \"coalesced\": %" PRIu64
            ",\n  \"bytes\": %" PRIu64 ",\n  \"notify_ranks\": [",
            kvx_pairs_num_reads(pairs) > 0 ? "\n  " : "", stats.descriptors, stats.coalesced,
            stats.bytes);
    for (size_t i = 0; i < kvx_peer_plan_num_notifies(plan); i++)
        fprintf(out, "%s%" PRIu32, i > 0 ? ", " : "", kvx_peer_plan_notify_rank(plan, i));
    fprintf(out, "]\n}\n");
}

void plan_print_pairs(FILE *out, const kvx_regions_t *local, const kvx_regions_t *remote,
                      const kvx_peer_plan_t *plan, const kvx_pairs_t *pairs, bool json)
{
    kvx_pairs_stats_t stats;

    if (json) {
        print_pairs_json(out, local, remote, plan, pairs);
        return;
    }
    kvx_pairs_stats(pairs, &stats);
    for (size_t r = 0; r < kvx_pairs_num_reads(pairs); r++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, r, &rank, &count);

        fprintf(out, "read from remote rank %" PRIu32 ": %zu pairs%s\n", rank, count,
                count > PAIRS_SHOWN ? " (first 8 shown)" : "");
        for (size_t i = 0; i < count && i < PAIRS_SHOWN; i++)
            fprintf(out, "  local %s+%" PRIu64 "  <-  remote %s+%" PRIu64 "  %" PRIu64 " bytes\n",
                    kvx_regions_storage_name(local, p[i].local_storage), p[i].local_offset,
                    kvx_regions_storage_name(remote, p[i].remote_storage), p[i].remote_offset,
                    p[i].len);
    }
    for (size_t i = 0; i < kvx_peer_plan_num_notifies(plan); i++)
        fprintf(out, "notify only: remote rank %" PRIu32 "\n", kvx_peer_plan_notify_rank(plan, i));
    fprintf(out,
            "total: %" PRIu64 " descriptors, %" PRIu64 " after coalescing, %" PRIu64 " bytes\n",
            stats.descriptors, stats.coalesced, stats.bytes);
}

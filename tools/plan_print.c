/* plan_print.c: the human-readable region table of `kvx plan` and `kvx demo`. Formatting
 * only: every number comes from the library. */
#include "plan_print.h"

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

void plan_print_table(FILE *out, const kvx_regions_t *regions)
{
    size_t count    = kvx_regions_count(regions);
    uint64_t bytes  = 0;
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
        bytes += info.block_len * info.num_blocks;
    }
    fprintf(out,
            "total: %zu regions, %" PRIu64 " descriptors, %" PRIu64
            " bytes when every block moves (%.2f GiB)\n",
            count, kvx_regions_num_descriptors(regions), bytes,
            (double)bytes / (1024.0 * 1024.0 * 1024.0));
}

/* unmap_slices.c: see unmap_slices.h. */
#define _DEFAULT_SOURCE /* madvise */
#include "unmap_slices.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

void unmap_slices_start(struct unmap_slices *u, const struct prefault_range *ranges, size_t num)
{
    *u = (struct unmap_slices){.ranges = ranges, .num_ranges = num};
}

/* Whether the mapping named by one /proc/self/maps line is a shared memory segment's: shared
 * ('s'), and SysV's ("/SYSV...") or POSIX's (under /dev/shm). */
static bool segment_mapping(const char *perms, const char *path)
{
    return strlen(perms) == 4 && perms[3] == 's' &&
           (strncmp(path, "/SYSV", 5) == 0 || strncmp(path, "/dev/shm/", 9) == 0);
}

/* The end of the part of [start, end) that lies in one shared memory segment's mapping, from
 * `start` on; `start` when none does (or the map cannot be read). */
static uintptr_t segment_end(uintptr_t start, uintptr_t end)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    uintptr_t until = start;

    if (maps == NULL)
        return start;
    while (fgets(line, sizeof(line), maps) != NULL) {
        uintptr_t low;
        uintptr_t high;
        char perms[8]  = "";
        char path[256] = "";

        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %*s %*s %*s %255s", &low, &high, perms,
                   path) < 3 ||
            start < low || start >= high)
            continue;
        if (segment_mapping(perms, path))
            until = high < end ? high : end;
        break;
    }
    fclose(maps);
    return until;
}

bool unmap_slices_run(struct unmap_slices *u, size_t *budget)
{
    while (u->next<u->num_ranges && * budget> 0) {
        const struct prefault_range *r = &u->ranges[u->next];
        size_t n;

        if (u->at == 0) {
            u->at    = r->start;
            u->until = segment_end(r->start, r->start + r->size);
        }
        n = u->until - u->at < *budget ? u->until - u->at : *budget;
        if (n > 0)
            (void)madvise((void *)u->at, n, MADV_DONTNEED); /* only ever saves time */
        u->at += n;
        *budget -= n;
        if (u->at == u->until) {
            u->next++;
            u->at = 0;
        }
    }
    return u->next < u->num_ranges;
}

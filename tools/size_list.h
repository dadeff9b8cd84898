/* size_list.h: "4K,64K,1M" as sizes, for kvx bench and bench/limits_probe (which must read the
 * same lists: bench/limits.sh hands both the same one). */
#ifndef KVX_TOOLS_SIZE_LIST_H
#define KVX_TOOLS_SIZE_LIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parses a comma-separated list of positive numbers, each with an optional suffix K, M or G
 * (powers of 1024, either case), into sizes[]; false when an entry is malformed, 0 or over
 * `max_value`, or there are more than `max_count`. */
bool size_list_parse(const char *text, uint64_t max_value, uint64_t *sizes, size_t max_count,
                     size_t *count_p);

#endif

/* plan_print.h: the human-readable region table of `kvx plan` and `kvx demo`. Formatting
 * only: every number comes from the library. */
#ifndef KVX_TOOLS_PLAN_PRINT_H
#define KVX_TOOLS_PLAN_PRINT_H

#include "kvx.h"

#include <stdio.h>

/* Prints one line per region and the totals line. */
void plan_print_table(FILE *out, const kvx_regions_t *regions);

/* Prints the totals line alone: regions, descriptors and bytes when every block moves. */
void plan_print_totals(FILE *out, const kvx_regions_t *regions);

/* Prints a planned request: per read rank its pairs (all with `json`, else the first few),
 * the notify-only ranks, and descriptor counts before and after coalescing, and bytes. */
void plan_print_pairs(FILE *out, const kvx_regions_t *local, const kvx_regions_t *remote,
                      const kvx_peer_plan_t *plan, const kvx_pairs_t *pairs, bool json);

#endif

/* plan_print.h: the human-readable region table of `kvx plan` and `kvx demo`. Formatting
 * only: every number comes from the library. */
#ifndef KVX_TOOLS_PLAN_PRINT_H
#define KVX_TOOLS_PLAN_PRINT_H

#include "kvx.h"

#include <stdio.h>

/* Prints one line per region and a totals line. */
void plan_print_table(FILE *out, const kvx_regions_t *regions);

#endif

/* stats.h: what agents count, and the histograms they count it in. */
#ifndef KVX_SRC_STATS_H
#define KVX_SRC_STATS_H

#include "kvx.h"

/* Adds one observation: its bucket is the smallest power of two >= value. */
void histogram_add(kvx_histogram_t *histogram, double value);

#endif

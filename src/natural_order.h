/* natural_order.h: the name order of regions.md step 1, shared by region registration and
 * its tests. Pure string comparison; knows nothing of views. */
#ifndef KVX_SRC_NATURAL_ORDER_H
#define KVX_SRC_NATURAL_ORDER_H

/* Negative, zero or positive as `a` sorts before, equal to or after `b` (regions.md step 1).
 * Zero only for identical strings. */
int natural_order_compare(const char *a, const char *b);

#endif

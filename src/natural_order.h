/* natural_order.h: the name order of regions.md step 1, shared by region registration and
 * its tests. Pure string comparison; knows nothing of views. */
#ifndef KVX_SRC_NATURAL_ORDER_H
#define KVX_SRC_NATURAL_ORDER_H

#include <stddef.h>

/* Negative, zero or positive as `a` sorts before, equal to or after `b` (regions.md step 1).
 * Zero only for identical strings. */
int natural_order_compare(const char *a, const char *b);

/* Most bytes natural_order_key() writes for a name of `len` bytes: a run costs at most two
 * bytes beyond its own, and the terminator one. */
#define NATURAL_ORDER_KEY_MAX(len) (3 * (size_t)(len) + 1)

/* Writes a key for `name` (at most 255 bytes) such that memcmp of two keys, then the shorter
 * key first, orders names as natural_order_compare does up to its bytewise fallback. Sorting
 * by keys compares each name's runs once instead of at every comparison. Returns the key's
 * length in bytes. */
size_t natural_order_key(const char *name, unsigned char *key);

#endif

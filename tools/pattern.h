/* pattern.h: the deterministic bytes `kvx serve` fills its storages with and `kvx fetch`
 * checks transferred bytes against: a function of (seed, storage index, byte offset). */
#ifndef KVX_TOOLS_PATTERN_H
#define KVX_TOOLS_PATTERN_H

#include <stddef.h>
#include <stdint.h>

/* Fills `size` bytes at `base`, storage `storage`'s bytes from offset 0. */
void pattern_fill(void *base, uint64_t size, uint64_t seed, size_t storage);

/* The index of the first of `len` bytes at `actual` that differs from the pattern of
 * `storage` from `offset` on, or `len` when all match. */
uint64_t pattern_check(const void *actual, uint64_t len, uint64_t seed, size_t storage,
                       uint64_t offset);

#endif

/* pattern.h: the deterministic bytes `kvx serve` fills its storages with and `kvx fetch`
 * checks transferred bytes against: a function of (seed, TP rank, storage index, byte offset),
 * so a byte read from the wrong rank is caught too. */
#ifndef KVX_TOOLS_PATTERN_H
#define KVX_TOOLS_PATTERN_H

#include <stddef.h>
#include <stdint.h>

/* Fills `size` bytes at `base`: rank `rank`'s storage `storage` from byte `offset` on. */
void pattern_fill(void *base, uint64_t size, uint64_t seed, uint32_t rank, size_t storage,
                  uint64_t offset);

/* The pattern's byte at `offset` of rank `rank`'s storage `storage`: what a check expected. */
uint8_t pattern_byte(uint64_t seed, uint32_t rank, size_t storage, uint64_t offset);

/* The index of the first of `len` bytes at `actual` that differs from the pattern of
 * `storage` from `offset` on, or `len` when all match. */
uint64_t pattern_check(const void *actual, uint64_t len, uint64_t seed, uint32_t rank,
                       size_t storage, uint64_t offset);

#endif

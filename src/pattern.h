/* pattern.h: the known bytes a deployment's test fills a prefill side's storages with and
 * checks a transfer against (kvx serve --fill, kvx fetch --verify --fill, kvx demo): byte o of
 * TP rank r's storage s is a function of (seed, r, s, o), so a byte from the wrong rank,
 * storage or offset is caught, and any range can be checked without the rest. Where the
 * prefill side's memory is not kvx's to fill, checksums verify instead (verify.h). GPU storages
 * are written and read through host staging (gpu.h). */
#ifndef KVX_SRC_PATTERN_H
#define KVX_SRC_PATTERN_H

#include "core.h"

/* Fills every storage of `core` with rank core->tp_rank's pattern of `seed`, or zeroes every
 * storage when `zero` (touching every page, so a check that the bytes outside a request are
 * still zero means something). */
kvx_status_t pattern_fill_storages(struct core *core, uint64_t seed, bool zero);

/* The same for `len` bytes of storage `s` from `offset` on, which the caller has checked lie
 * inside it: a fill in steps, so that a command can say how far it got. */
kvx_status_t pattern_fill_range(struct core *core, size_t s, uint64_t offset, uint64_t len,
                                uint64_t seed, bool zero);

/* Checks a transfer's `pairs` (remote storage indices the peers'): every byte moved against
 * the pattern of (seed, remote rank, remote storage, offset), then that every byte of our
 * storages outside the pairs is still zero. KVX_OK, or KVX_ERR_MISMATCH naming the first
 * wrong byte: where on both sides, the byte expected and the byte found. */
kvx_status_t pattern_check_pairs(const struct core *core, const kvx_pairs_t *pairs, uint64_t seed);

#endif

/* checksum.h: the checksums of verification (docs/agent.md, "Verification"): XXH3-64 over byte
 * ranges, and the side-channel request that asks a prefill agent for the checksums of ranges of
 * its own memory, with its answer. Pure: no I/O; decoding treats every byte as hostile and is
 * fuzzed by fuzz/fuzz_checksum.c. */
#ifndef KVX_SRC_CHECKSUM_H
#define KVX_SRC_CHECKSUM_H

#include "kvx.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHECKSUM_MAGIC 0x4b565843u /* "KVXC" */
/* Ranges in one request: the answer, 8 bytes each, fits a kept socket's SIDECHAN_MAX_REPLY. */
#define CHECKSUM_MAX_RANGES 256
/* Bytes one request may ask to hash, all ranges together: about 11 ms of XXH3 on one core here
 * (docs/performance.md). The prefill agent hashes it a slice a turn (checksum_serve.h). */
#define CHECKSUM_MAX_BYTES        (64u << 20)
#define CHECKSUM_RANGE_SIZE       20 /* storage: 4, offset: 8, length: 8 */
#define CHECKSUM_HEADER_SIZE      8  /* magic: 4, count: 4 */
#define CHECKSUM_MAX_REQUEST_SIZE (CHECKSUM_HEADER_SIZE + CHECKSUM_RANGE_SIZE * CHECKSUM_MAX_RANGES)
#define CHECKSUM_ANSWER           "kvx-sums" /* then count: 4 bytes, then count checksums of 8 */
#define CHECKSUM_ANSWER_LEN       8
#define CHECKSUM_MAX_ANSWER_SIZE  (CHECKSUM_ANSWER_LEN + 4 + 8 * CHECKSUM_MAX_RANGES)

/* A byte range of one side's storage. */
struct checksum_range {
    uint32_t storage;
    uint64_t offset;
    uint64_t len;
};

/* XXH3-64 (seed 0) of a range, taken a piece at a time (a range hashed over several turns of
 * the loop, or staged out of GPU memory: checksum_serve.h): reset, update with the range's
 * bytes in order, digest. */
struct checksum_stream;
struct checksum_stream *checksum_stream_create(void); /* NULL: no memory */
void checksum_stream_reset(struct checksum_stream *stream);
void checksum_stream_update(struct checksum_stream *stream, const void *data, size_t len);
uint64_t checksum_stream_digest(const struct checksum_stream *stream);
void checksum_stream_destroy(struct checksum_stream *stream); /* NULL-safe */

/* Encodes a request for `count` ranges (1..CHECKSUM_MAX_RANGES, at most CHECKSUM_MAX_BYTES in
 * all) into `buf` of CHECKSUM_MAX_REQUEST_SIZE bytes; returns the bytes written. */
size_t checksum_request_encode(const struct checksum_range *ranges, size_t count, uint8_t *buf);

/* Decodes untrusted bytes: exactly a header and `count` ranges, count 1..CHECKSUM_MAX_RANGES,
 * every length >= 1, offset + length without overflow, all lengths together at most
 * CHECKSUM_MAX_BYTES. `ranges` holds CHECKSUM_MAX_RANGES. On failure the message says why. */
kvx_status_t checksum_request_decode(const void *buf, size_t size, struct checksum_range *ranges,
                                     size_t *count_p);

/* Encodes the answer of `count` checksums into `buf` of CHECKSUM_MAX_ANSWER_SIZE bytes;
 * returns the bytes written. */
size_t checksum_answer_encode(const uint64_t *sums, size_t count, uint8_t *buf);

/* Decodes an answer that must hold exactly `count` checksums; false for anything else. */
bool checksum_answer_decode(const void *buf, size_t size, size_t count, uint64_t *sums);

#endif

/* checksum_serve.h: checksums of this agent's own memory for verification: the prefill side's
 * answer to VERB_CHECKSUM, and the decode side's checksums of what landed. Every range is
 * checked to lie inside one of our storages before a byte of it is read. */
#ifndef KVX_SRC_CHECKSUM_SERVE_H
#define KVX_SRC_CHECKSUM_SERVE_H

#include "checksum.h"
#include "core.h"
#include "sidechan.h"

/* KVX_OK when `range` lies inside storage range->storage of this agent; otherwise
 * KVX_ERR_OUT_OF_RANGE naming the range and the storage. `side` names whose memory it is, in
 * the message. */
kvx_status_t checksum_range_check(const struct core *core, const struct checksum_range *range,
                                  const char *side);

/* The checksums of `count` checked ranges of our memory into `sums`, counted in the stats
 * (verify_bytes_hashed, verify_ns). Ranges of GPU storages are copied to host memory a piece
 * at a time first (docs/gpu.md); a failed copy is the error. */
kvx_status_t checksum_local(struct core *core, const struct checksum_range *ranges, size_t count,
                            uint64_t *sums);

/* VERB_CHECKSUM from a peer the gate admitted: the checksums of the ranges it names, or an
 * error answer (counted in verify_refused) when the request is malformed or any range lies
 * outside our storages; then nothing is hashed. */
void checksum_serve(struct core *core, struct sidechan_server *side,
                    const struct sidechan_request *request);

#endif

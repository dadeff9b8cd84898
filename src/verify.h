/* verify.h: one verification of a transfer on the decode side: its pairs split back into
 * (region, block) segments, checksum requests to the prefill ranks that hold the source
 * (at most VERIFY_WINDOW in flight, each within checksum.h's bounds), and the comparison of
 * their answers with checksums of our own memory. The owner (xfer.c) gives it the deadline
 * and is told once when it ends. */
#ifndef KVX_SRC_VERIFY_H
#define KVX_SRC_VERIFY_H

#include "core.h"

#define VERIFY_WINDOW 8 /* checksum requests of one verification awaiting their answer */

struct verify;

/* Called once when the verification ended (every answer compared, or a refusal or malformed
 * answer), from the side-channel phase; it may only record and queue. Not called for
 * verify_fail or verify_reset. */
typedef void (*verify_done_cb_t)(void *arg);

kvx_status_t verify_create(struct core *core, verify_done_cb_t done, void *arg,
                           struct verify **verify_p);
void verify_destroy(struct verify *v); /* NULL-safe; forgets what is pending */

/* Empties `v` for a new verification; requests still pending are forgotten. */
void verify_reset(struct verify *v);

/* Adds the pairs read from (or written by) `peer`, which must be up: each pair is split at
 * the local table's block boundaries into segments, each within CHECKSUM_MAX_BYTES, whose
 * local ranges must lie in our storages. */
kvx_status_t verify_add(struct verify *v, kvx_peer_t *peer, const kvx_pair_t *pairs, size_t count);

/* Sends the first requests. A verification without segments ends at once (no callback):
 * verify_ended tells. On failure nothing is pending. */
kvx_status_t verify_start(struct verify *v);

/* Ends it with `status` and a message (a deadline, a peer down, a cancel): pending requests
 * are forgotten and counted as failed. Nothing is called. Once; later calls do nothing. */
__attribute__((format(printf, 3, 4))) void verify_fail(struct verify *v, kvx_status_t status,
                                                       const char *format, ...);

bool verify_ended(const struct verify *v);
bool verify_started(const struct verify *v);
kvx_status_t verify_status(const struct verify *v); /* KVX_INPROGRESS until it ended */
const char *verify_error(const struct verify *v);   /* the message of a status not KVX_OK */
bool verify_uses(const struct verify *v, const kvx_peer_t *peer);
size_t verify_unanswered(const struct verify *v); /* segments not compared yet */
size_t verify_num_segments(const struct verify *v);
void verify_result(const struct verify *v, kvx_verify_result_t *result_p);

#endif

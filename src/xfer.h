/* xfer.h: transfers on the decode side: pulls (gets from the prefill ranks, then `done`
 * notifications after the data) and pushes (asking each prefill rank to write, then its
 * answer), each with a deadline timer and a completion queued for the loop's last phase. Also
 * the phase that fails what down peers had in flight and closes their connections. */
#ifndef KVX_SRC_XFER_H
#define KVX_SRC_XFER_H

#include "core.h"

struct xfer_set;

kvx_status_t xfer_set_create(struct core *core, struct xfer_set **set_p);

/* Frees the pool; the set must have no transfer left (core->num_xfers == 0). */
void xfer_set_destroy(struct xfer_set *set);

/* Posts a pull or a push of one request (kvx_read_post, kvx_write_post). */
kvx_status_t xfer_pull_post(struct xfer_set *set, kvx_peer_t *const *peers, size_t num_peers,
                            uint64_t request_id, const kvx_request_t *request,
                            kvx_xfer_cb_t callback, void *arg, kvx_xfer_t **xfer_p);
kvx_status_t xfer_push_post(struct xfer_set *set, const void *metadata, size_t metadata_size,
                            kvx_peer_t *const *peers, size_t num_peers, uint64_t request_id,
                            const kvx_request_t *request, kvx_xfer_cb_t callback, void *arg,
                            kvx_xfer_t **xfer_p);

/* Moves on the transfers whose operations completed in the last UCX progress (notifies after
 * the gets, completes after the notifications); returns how many moved. */
size_t xfers_advance(struct xfer_set *set);

/* The failed-peers phase: every peer on core->down fails the transfers in flight with it, and
 * its connection closes, so no get can write after its failure is reported. Returns how many
 * peers it took. Callable from any kvx call that is not inside UCX progress. */
size_t xfers_fail_down_peers(struct xfer_set *set);

/* Fails every transfer in flight with `peer` as cancelled, takes it down and closes it (the
 * peer is being destroyed or reconnected). */
void xfers_cancel_peer(struct xfer_set *set, kvx_peer_t *peer);

/* kvx_xfer_verify: on a transfer in flight, asks that it verify before completing
 * (*wait_p false); on a completed one, starts verifying it now (*wait_p true: the caller runs
 * the loop until xfer_verify_ended, then calls xfer_verify_finish for the status). */
kvx_status_t xfer_verify_post(kvx_xfer_t *xfer, bool *wait_p);
bool xfer_verify_ended(const kvx_xfer_t *xfer);
kvx_status_t xfer_verify_finish(kvx_xfer_t *xfer);

/* True once the transfer's callback ran (its completion left the queue). */
bool xfer_settled(const kvx_xfer_t *xfer);
struct core *xfer_core(const kvx_xfer_t *xfer);

/* The pairs of the last pull planned, against the first peer's table. */
const kvx_pairs_t *xfer_set_last_pairs(const struct xfer_set *set);

#endif

/* peer.h: a prefill agent as the decode side sees it: a connection (conn.h), a kept side-channel
 * socket for heartbeats and requests matched to their replies by id, liveness, and the request
 * ids still wanted from it. Going down only marks the peer and queues it on core->down; the
 * transfers it had in flight are failed by xfer.c, which then closes its connection. */
#ifndef KVX_SRC_PEER_H
#define KVX_SRC_PEER_H

#include "conn.h"
#include "core.h"

/* Called once with the reply to a request sent with peer_request_send, from the side-channel
 * phase; it may only record the reply (queue its transfer). */
typedef void (*peer_reply_cb_t)(void *arg, const char *reply, size_t size);

/* Handshakes with the agent at `address` (metadata, checks, connection, the first heartbeat
 * answer), each step bounded by the agent's timeout, and adds the peer to core->peers. */
kvx_status_t peer_connect(struct core *core, const char *address, kvx_peer_t **peer_p);

/* Handshakes again and, on success, replaces the peer's connection and socket in place (its
 * handle, address and wanted ids stay). The peer must be down with its transfers failed. On
 * failure the peer is unchanged: still down, still destroyable. */
kvx_status_t peer_reconnect(kvx_peer_t *peer);

/* Frees a peer that is down with its transfers failed. */
void peer_free(kvx_peer_t *peer);

/* Why a peer goes down, as counted: dead (silence, a restart, a failed transfer), idle (the
 * TTL), or closed by its caller (destroyed, reconnected). */
enum peer_down_kind { PEER_DEAD, PEER_IDLE, PEER_CLOSED };

/* Marks the peer down (once): `status` is what its transfers fail with (KVX_ERR_PEER_DOWN,
 * KVX_ERR_PEER_TIMEOUT or KVX_ERR_CANCELED), `reason` why. Closes its socket, logs, and queues
 * it on core->down. Never calls user code. */
void peer_down(kvx_peer_t *peer, kvx_status_t status, const char *reason, enum peer_down_kind kind);

/* Takes the next peer off core->down (NULL when none) and closes its connection, which the
 * caller does after failing what was in flight with it. */
kvx_peer_t *peer_down_next(struct core *core);
void peer_close_conn(kvx_peer_t *peer);

bool peer_is_down(const kvx_peer_t *peer);
bool peer_is_queued(const kvx_peer_t *peer); /* on core->down: its transfers still to fail */
struct core *peer_core(const kvx_peer_t *peer);
kvx_status_t peer_down_status(const kvx_peer_t *peer);
const char *peer_address(const kvx_peer_t *peer);
struct conn *peer_conn(kvx_peer_t *peer); /* NULL once down */
uint32_t peer_rank(const kvx_peer_t *peer);
void peer_touch(kvx_peer_t *peer); /* a transfer used it now: not idle */

/* A request on the kept socket; `on_reply` gets its reply. *id_p identifies it for
 * peer_request_forget (a transfer that ended first). */
kvx_status_t peer_request_send(kvx_peer_t *peer, const char *verb, const void *body, size_t size,
                               peer_reply_cb_t on_reply, void *arg, uint64_t *id_p);
void peer_request_forget(kvx_peer_t *peer, uint64_t id);

/* A push request (push_request_encode's bytes, with our writer's handle) as peer_request_send
 * sends one, but on the data plane: a message on our connection to the peer's main worker,
 * whose answer comes back as a message too (peers_push_answer) or, refused after its writer
 * was found, on the kept socket; either reaches `on_reply` from the side-channel phase. A
 * request too large for one message goes on the kept socket (VERB_PUSH). */
kvx_status_t peer_push_send(kvx_peer_t *peer, const void *body, size_t size,
                            peer_reply_cb_t on_reply, void *arg, uint64_t *id_p);

/* A push answer that arrived on one of our workers (from anyone): kept for the pending push
 * it names, of the peer whose writer handle it carries; anything else is counted in
 * notifications_dropped and changes nothing. Only records: called inside UCX progress. */
void peers_push_answer(struct core *core, const void *data, size_t size);

/* The answer to a done sent as a message (CORE_AM_DONE_ANSWER), as peers_push_answer keeps a
 * push's, for the peer whose done handle it carries. */
void peers_done_answer(struct core *core, const void *data, size_t size);

/* The `done` of `request_id` with its hold token (NULL: none) and the bytes read from the
 * peer for it (sent where the peer's metadata states it reads them: docs/wire.md), as a
 * request: `on_reply` gets the peer's answer (notify.h, done_answer_parse, or
 * DONE_ANSWER_RESEND: send it again with `side_channel`); *id_p identifies it for
 * peer_request_forget. A message on the data plane where the peer takes them and gave this
 * connection a done handle (done_handles.h; the first done asks for one), unless
 * `side_channel`; else on the kept socket. */
kvx_status_t peer_send_done(kvx_peer_t *peer, uint64_t request_id, const kvx_token_t *token,
                            uint64_t bytes, bool side_channel, peer_reply_cb_t on_reply, void *arg,
                            uint64_t *id_p);

/* The done peer_send_done would send as a message, framed into out[capacity] (*size_p bytes)
 * for the caller to send with its read (transport_op_attach), and pending as if sent: *id_p
 * names it for peer_request_forget, which the caller calls if it did not go. False, nothing
 * pending, where the peer takes no done messages or gave no handle yet. */
bool peer_done_frame(kvx_peer_t *peer, uint64_t request_id, const kvx_token_t *token,
                     uint64_t bytes, peer_reply_cb_t on_reply, void *arg, uint64_t *id_p,
                     uint8_t *out, size_t capacity, size_t *size_p);

/* A transfer's leg waiting for our push writer's registration with a peer. */
struct peer_push_wait {
    struct peer_push_wait *next;
    bool waiting; /* on its peer's list */
    /* From the side-channel phase: the handle (status KVX_OK) or why there is none. */
    void (*ready)(struct peer_push_wait *wait, kvx_status_t status, const uint8_t *handle);
};

/* The handle of our push writer on the peer. Registered: *handle_p at once (KVX_OK). Not yet:
 * registers `metadata` (ours, push mode) on the kept socket, or joins the registration under
 * way, and returns KVX_INPROGRESS; the loop then carries it (the peer's writer sends a nonce
 * to our main worker, peers_forward_proof returns it, the peer answers with the handle) and
 * calls wait->ready once, never inside this call. The waiter's own deadline bounds it: it
 * leaves with peer_push_wait_cancel. Later calls return the same handle until
 * peer_push_forget or a reconnect. */
struct push_proof;
kvx_status_t peer_push_handle(kvx_peer_t *peer, const void *metadata, size_t size,
                              struct peer_push_wait *wait, const uint8_t **handle_p);
/* `wait` gives up (its transfer ended); the last to leave drops the registration under way. */
void peer_push_wait_cancel(kvx_peer_t *peer, struct peer_push_wait *wait);
void peer_push_forget(kvx_peer_t *peer);

/* A writer's proof arrived on our main worker (from anyone): returned only to the peer of its
 * instance that we are registering with. */
void peers_forward_proof(struct core *core, const struct push_proof *proof);

/* A transfer of `request_id` completed: it is no longer wanted from `peer`. */
void peer_unwant(kvx_peer_t *peer, uint64_t request_id);

/* The loop's phases for every peer: progress their transport connections (returns events);
 * hand over the answers that came as messages and, with `sockets`, take their side-channel
 * replies (returns both); and before sleeping, arm and check them (true when one has work
 * already). */
unsigned peers_progress(struct core *core);
size_t peers_serve(struct core *core, bool sockets);
bool peers_busy(struct core *core);
/* Whether a done or push we sent as a message awaits its answer (microseconds away: the loop
 * spins for it as for a UCX operation of ours). */
bool peers_awaiting_answers(const struct core *core);

/* The kept sockets of the peers that are up and their monitors (a closed connection wakes a
 * wait too), at most `max` of them (a wait's zmq_poll items); returns how many. */
size_t peers_sockets(struct core *core, void **sockets, size_t max);

/* The peer among `peers` that is remote TP rank `rank`, or NULL. */
kvx_peer_t *peer_of_rank(kvx_peer_t *const *peers, size_t num_peers, uint32_t rank);

#endif

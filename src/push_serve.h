/* push_serve.h: the prefill half of push mode. A decode agent first registers (its push
 * metadata, over its side-channel connection) and proves that the worker it names is its own:
 * the prefill sends a random nonce to that worker on the push transport, and only the
 * registrant's connection returning it gets a writer handle. A push request names the handle;
 * it becomes a job that puts this rank's share into the registrant's blocks, flushes and
 * answers, each step posted and completed through the loop, so serving goes on meanwhile.
 * The push transport is one that carries the proof and the data on the same lane to the
 * process at the other end (TCP, or one RDMA transport), never shared memory or CMA, whose
 * keys and process ids a forged metadata could point anywhere on this host. */
#ifndef KVX_SRC_PUSH_SERVE_H
#define KVX_SRC_PUSH_SERVE_H

#include "core.h"
#include "push_limits.h"
#include "sidechan.h"

struct push_server;

/* `tls` is the push transport's UCX_TLS list; each peer may have `max_per_peer` pushes in
 * flight, fewer while others push (push_limits.h); a job writes for as long as its requester
 * asked, at most `max_push_ms`, and fails sooner when its writer completes nothing for the
 * agent's timeout_ms. */
kvx_status_t push_server_create(struct core *core, struct sidechan_server *side, const char *tls,
                                uint32_t max_per_peer, uint32_t max_push_ms,
                                struct push_server **server_p);

/* Fails every job (without answering) and closes every writer. NULL-safe. */
void push_server_destroy(struct push_server *server);

/* The side-channel handlers (sidechan_verb.serve) of VERB_PUSH_REGISTER (answered once the
 * proof came back, or with an error at the deadline), VERB_PUSH_PROOF (no answer of its own)
 * and VERB_PUSH: a request that breaks a limit or names no writer of its connection is
 * answered with an error before anything is put. */
void push_register(void *server, const struct sidechan_request *request);
void push_prove(void *server, const struct sidechan_request *request);
void push_serve(void *server, const struct sidechan_request *request);

/* The main worker's handler (transport_msg_handler_t) of CORE_AM_PUSH_REQUEST, a push
 * request on the data plane (push_request.h), from anyone: one whose handle names no proven
 * writer is refused at once to its sender, counted in pushes_refused, and nothing is written;
 * one that does is started from the next push_progress as if it had come on its registrant's
 * side channel (limits, holds, deadline), and answered "pushed" by its writer, after the
 * data, or refused on the side channel. Only records: it runs inside UCX progress. */
void push_serve_message(void *server, const void *data, size_t size,
                        const struct transport_msg_from *from);

/* The loop's phases for the writers: progress their connections and move on the jobs whose
 * step completed (returns events); before sleeping, arm them (true when one has work). */
unsigned push_progress(struct push_server *server);
bool push_busy(struct push_server *server);

size_t push_jobs(const struct push_server *server);

#endif

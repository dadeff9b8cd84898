/* done_serve.h: the prefill side's answer to a decode rank's `done` (VERB_DONE): counted
 * against the hold table and answered "kvx-counted", refused with its reason, or, for a
 * request with a token that is not held yet, parked until kvx_hold makes it or the agent's
 * timeout passes. The done's sender learns whether its bytes were held for it. */
#ifndef KVX_SRC_DONE_SERVE_H
#define KVX_SRC_DONE_SERVE_H

#include "core.h"
#include "sidechan.h"

/* The VERB_DONE handler; answers now, or from the hold (early_release) or the deadline. */
void done_serve(struct core *core, struct sidechan_server *side,
                const struct sidechan_request *request);

/* VERB_DONE_HANDLE: the connection's handle for dones on the data plane (done_handles.h),
 * answered REPLY_DONE_HANDLE, the handle and its key in 32 hex digits each. */
void done_serve_handle(struct core *core, struct sidechan_server *side,
                       const struct sidechan_request *request);

/* A done that came as a message (CORE_AM_DONE) on the main worker, or attached to the one
 * served read message of its leg (`with_read`: transport_set_read_hook): judged as one from
 * the handle's connection and answered to its sender at once (CORE_AM_DONE_ANSWER), or
 * answered DONE_ANSWER_RESEND when it must wait for its hold, its handle is unknown, or the
 * read's bytes had not left our memory yet (not `sent`: the hold must outlive them). */
struct transport_msg_from;
void done_serve_message(struct core *core, const void *data, size_t size, bool with_read,
                        bool sent, const struct transport_msg_from *from);

/* Frees every parked done without answering (the agent is going). */
void dones_drop(struct core *core);

#endif

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

/* Frees every parked done without answering (the agent is going). */
void dones_drop(struct core *core);

#endif

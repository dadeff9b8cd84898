/* push_serve.h: the prefill half of push mode: a push request from a decode agent becomes a job
 * that puts this rank's share into the decode agent's blocks, flushes, notifies and answers,
 * each step posted and completed through the loop, so serving goes on meanwhile. */
#ifndef KVX_SRC_PUSH_SERVE_H
#define KVX_SRC_PUSH_SERVE_H

#include "core.h"
#include "sidechan.h"

#define PUSH_MAX_JOBS    256 /* pushes in flight at once; more are refused */
#define PUSH_MAX_WRITERS 16  /* decode agents kept connected for their next push */

struct push_server;

kvx_status_t push_server_create(struct core *core, struct sidechan_server *side,
                                struct push_server **server_p);

/* Fails every job (without answering) and closes every writer. NULL-safe. */
void push_server_destroy(struct push_server *server);

/* The side-channel handler of VERB_PUSH (sidechan_verb.serve): a request that breaks a limit
 * is answered with an error before anything is put. */
void push_serve(void *server, const struct sidechan_request *request);

/* The loop's phases for the writers: progress their connections and move on the jobs whose
 * step completed (returns events); before sleeping, arm them (true when one has work). */
unsigned push_progress(struct push_server *server);
bool push_busy(struct push_server *server);

size_t push_jobs(const struct push_server *server);

#endif

/* push_limits.h: what one peer's pushes may take of a prefill agent: how many jobs it may
 * have in flight beside the other peers' (fair shares, with a slot kept for every writer),
 * and how long one job may write. Pure: counts in, a verdict out. */
#ifndef KVX_SRC_PUSH_LIMITS_H
#define KVX_SRC_PUSH_LIMITS_H

#include "kvx.h"

#define PUSH_MAX_JOBS    256 /* pushes in flight at once; more are refused */
#define PUSH_MAX_WRITERS 64  /* decode agents registered at once (least recently used go) */
/* The jobs shared among writers. The other PUSH_MAX_WRITERS are kept one per writer, for its
 * first job in flight: a proven writer with nothing in flight can always start a push,
 * however many the others hold (issue 22 finding 3). */
#define PUSH_SHARED_JOBS (PUSH_MAX_JOBS - PUSH_MAX_WRITERS)

/* What is in flight when a writer's push request arrives. */
struct push_load {
    size_t jobs;           /* in all */
    size_t busy;           /* writers with at least one job in flight (the requester, if it has) */
    size_t writer_jobs;    /* the requester's */
    uint32_t max_per_peer; /* the agent's max_pushes */
};

/* Whether the requester may start one more job: its first always (its kept slot); a further
 * one while it holds fewer than max_per_peer and fewer than its fair share of the shared
 * jobs, PUSH_SHARED_JOBS / busy, and some shared job is free. Otherwise KVX_ERR_BUSY with a
 * message that names the limit. A job admitted never makes jobs exceed PUSH_MAX_JOBS: at
 * most PUSH_MAX_WRITERS first jobs and PUSH_SHARED_JOBS others. */
kvx_status_t push_limits_admit(const struct push_load *load);

/* The milliseconds a job may write: what its requester waits (`asked_ms`; 0, an older
 * requester that sends none: this agent's `timeout_ms`), at most `max_push_ms`. */
uint32_t push_limits_deadline(uint32_t asked_ms, uint32_t timeout_ms, uint32_t max_push_ms);

#endif

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

/* Checksums of our own memory being taken, on either side: the prefill side's answers to
 * VERB_CHECKSUM (each request is checked when it arrives) and the decode side's checksums of
 * what landed (verify.h). Each is hashed a slice at a time, in arrival order, by
 * checksum_jobs_run, so one turn of the loop hashes a bounded number of bytes however many
 * requests came (issue 23: 64 requests of 64 MiB once held one turn for 0.7 s). */
struct checksum_jobs;

/* The end of a job added with checksum_jobs_add: KVX_OK and the `count` checksums, or the
 * error of a GPU range that could not be copied to the host (sums NULL). Runs from
 * checksum_jobs_run; it may add and cancel jobs. */
typedef void (*checksum_done_t)(void *arg, kvx_status_t status, const uint64_t *sums);

/* Requests queued at most: 64 peers with VERIFY_WINDOW (8) requests out each, twice over.
 * One more is refused (counted in verify_refused); its verification fails, nothing else. */
#define CHECKSUM_MAX_JOBS 1024

kvx_status_t checksum_jobs_create(struct checksum_jobs **jobs_p);
/* Requests not answered yet are dropped: their requesters' deadlines end them. NULL-safe. */
void checksum_jobs_destroy(struct checksum_jobs *jobs);

/* VERB_CHECKSUM from a peer the gate admitted: queues the request, or answers an error now
 * (counted in verify_refused) when it is malformed, any range lies outside our storages, or
 * CHECKSUM_MAX_JOBS are queued; then nothing is hashed. */
void checksum_serve(struct core *core, struct checksum_jobs *jobs, struct sidechan_server *side,
                    const struct sidechan_request *request);

/* Hashes at most `budget` bytes of the queued requests, oldest first, and answers each once
 * its last range is hashed (a range of a GPU storage that cannot be copied to the host is
 * answered with the error). Returns the ranges worked on; 0 when nothing was queued. */
size_t checksum_jobs_run(struct core *core, struct checksum_jobs *jobs,
                         struct sidechan_server *side, uint64_t budget);

/* Queues the checksums of `count` ranges, each checked already to lie in our storages
 * (checksum_range_check), for `done`; fails only for want of memory. Not bounded by
 * CHECKSUM_MAX_JOBS: the caller's own window bounds it. */
kvx_status_t checksum_jobs_add(struct checksum_jobs *jobs, const struct checksum_range *ranges,
                               size_t count, checksum_done_t done, void *arg);

/* Drops the jobs added for `arg` that did not end: their `done` never runs. */
void checksum_jobs_cancel(struct checksum_jobs *jobs, void *arg);

bool checksum_jobs_pending(const struct checksum_jobs *jobs);

#endif

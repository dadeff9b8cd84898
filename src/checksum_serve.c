/* checksum_serve.c: hashing our own storages for verification, on either side: the answer a
 * prefill agent gives to VERB_CHECKSUM, and the decode side's checksums of what it received.
 * Reads memory only inside our own storages; knows nothing of transfers. */
#include "checksum_serve.h"

#include "error.h"
#include "gpu.h"
#include "regions.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

kvx_status_t checksum_range_check(const struct core *core, const struct checksum_range *range,
                                  const char *side)
{
    const kvx_regions_t *t = core->regions;
    uint64_t end;

    if (range->storage >= core->num_storages)
        return error_set(KVX_ERR_OUT_OF_RANGE,
                         "%s range of %" PRIu64 " bytes at %" PRIu64 " names storage %" PRIu32
                         ", which is not registered (%zu storages)",
                         side, range->len, range->offset, range->storage, core->num_storages);
    if (__builtin_add_overflow(range->offset, range->len, &end) ||
        end > t->storage_sizes[range->storage])
        return error_set(KVX_ERR_OUT_OF_RANGE,
                         "%s range of %" PRIu64 " bytes at %" PRIu64
                         " lies outside storage %s of %" PRIu64 " bytes",
                         side, range->len, range->offset, t->storage_names[range->storage],
                         t->storage_sizes[range->storage]);
    return KVX_OK;
}

/* Bytes of GPU memory staged at a time: a host buffer of this size per hashing call. */
#define CHECKSUM_STAGE_BYTES (4u << 20)

/* One request: its ranges, checked, and the checksums of those hashed so far. */
struct checksum_job {
    struct checksum_job *next;
    struct sidechan_origin origin; /* where the answer goes, when `done` is NULL */
    checksum_done_t done;          /* or who is told */
    void *arg;
    struct checksum_range ranges[CHECKSUM_MAX_RANGES];
    uint64_t sums[CHECKSUM_MAX_RANGES];
    size_t count;
    size_t next_range; /* the range being hashed */
    uint64_t hashed;   /* bytes of it hashed, into the stream */
};

struct checksum_jobs {
    struct checksum_job *head; /* queued, oldest first */
    struct checksum_job *tail;
    struct checksum_job *spare;     /* answered, kept for reuse */
    size_t num_jobs;                /* queued */
    struct checksum_stream *stream; /* the range being hashed: one at a time, in order */
    uint8_t *stage;                 /* CHECKSUM_STAGE_BYTES for GPU ranges; NULL until needed */
};

kvx_status_t checksum_jobs_create(struct checksum_jobs **jobs_p)
{
    struct checksum_jobs *jobs = calloc(1, sizeof(*jobs));

    if (jobs == NULL || (jobs->stream = checksum_stream_create()) == NULL) {
        free(jobs);
        return error_no_memory("the checksum requests");
    }
    *jobs_p = jobs;
    return KVX_OK;
}

static void jobs_free_list(struct checksum_job *job)
{
    while (job != NULL) {
        struct checksum_job *next = job->next;

        free(job);
        job = next;
    }
}

void checksum_jobs_destroy(struct checksum_jobs *jobs)
{
    if (jobs == NULL)
        return;
    jobs_free_list(jobs->head);
    jobs_free_list(jobs->spare);
    checksum_stream_destroy(jobs->stream);
    free(jobs->stage);
    free(jobs);
}

bool checksum_jobs_pending(const struct checksum_jobs *jobs)
{
    return jobs != NULL && jobs->head != NULL;
}

static void refuse(struct core *core, struct sidechan_server *side,
                   const struct sidechan_origin *origin)
{
    char reply[600];

    core->stats.verify_refused++;
    snprintf(reply, sizeof(reply), "%s%s", REPLY_ERROR, kvx_errmsg());
    sidechan_reply(side, origin, reply, strlen(reply));
}

/* Queues `job` last, not hashed yet. */
static void jobs_append(struct checksum_jobs *jobs, struct checksum_job *job)
{
    job->next_range = 0;
    job->hashed     = 0;
    if (jobs->tail != NULL)
        jobs->tail->next = job;
    else
        jobs->head = job;
    jobs->tail = job;
    jobs->num_jobs++;
}

void checksum_serve(struct core *core, struct checksum_jobs *jobs, struct sidechan_server *side,
                    const struct sidechan_request *request)
{
    struct checksum_job *job = jobs->spare;

    if (job == NULL && jobs->num_jobs < CHECKSUM_MAX_JOBS && (job = malloc(sizeof(*job))) == NULL)
        error_no_memory("a checksum request");
    else if (job == NULL)
        error_set(KVX_ERR_BUSY, "checksum request: %d requests are queued already: ask again",
                  CHECKSUM_MAX_JOBS);
    if (job == NULL) {
        refuse(core, side, &request->origin);
        return;
    }
    if (job == jobs->spare)
        jobs->spare = job->next;
    job->next = NULL;
    if (checksum_request_decode(request->body, request->body_size, job->ranges, &job->count) !=
        KVX_OK)
        goto err_refuse;
    for (size_t i = 0; i < job->count; i++) {
        if (checksum_range_check(core, &job->ranges[i], "prefill") != KVX_OK) {
            error_set(KVX_ERR_OUT_OF_RANGE, "checksum request: ranges[%zu]: %s", i, kvx_errmsg());
            goto err_refuse;
        }
    }
    job->origin     = request->origin;
    job->done       = NULL;
    jobs_append(jobs, job);
    return;

err_refuse:
    refuse(core, side, &request->origin);
    job->next   = jobs->spare;
    jobs->spare = job;
}

kvx_status_t checksum_jobs_add(struct checksum_jobs *jobs, const struct checksum_range *ranges,
                               size_t count, checksum_done_t done, void *arg)
{
    struct checksum_job *job = jobs->spare;

    if (job == NULL && (job = malloc(sizeof(*job))) == NULL)
        return error_no_memory("a checksum job");
    if (job == jobs->spare)
        jobs->spare = job->next;
    job->next = NULL;
    memcpy(job->ranges, ranges, count * sizeof(*ranges));
    job->count      = count;
    job->done       = done;
    job->arg        = arg;
    jobs_append(jobs, job);
    return KVX_OK;
}

void checksum_jobs_cancel(struct checksum_jobs *jobs, void *arg)
{
    struct checksum_job **link = &jobs->head;
    struct checksum_job *last  = NULL;

    /* Only the head can be partly hashed; the next head starts its stream afresh. */
    while (*link != NULL) {
        struct checksum_job *job = *link;

        if (job->done == NULL || job->arg != arg) {
            last = job;
            link = &job->next;
            continue;
        }
        *link = job->next;
        jobs->num_jobs--;
        job->next   = jobs->spare;
        jobs->spare = job;
    }
    jobs->tail = last;
}

/* Takes the oldest job off the queue and keeps it for reuse. */
static void jobs_pop(struct checksum_jobs *jobs)
{
    struct checksum_job *job = jobs->head;

    jobs->head = job->next;
    if (jobs->head == NULL)
        jobs->tail = NULL;
    jobs->num_jobs--;
    job->next   = jobs->spare;
    jobs->spare = job;
}

/* Hashes the next at most `budget` bytes of the oldest job's current range into the stream;
 * returns the bytes hashed, or fails with a GPU copy's error. */
static kvx_status_t job_slice(struct core *core, struct checksum_jobs *jobs, uint64_t budget,
                              uint64_t *bytes_p)
{
    const struct checksum_range *r = &jobs->head->ranges[jobs->head->next_range];
    const uint8_t *at = (const uint8_t *)core->bases[r->storage] + r->offset + jobs->head->hashed;
    struct gpu *gpu   = core->gpus != NULL ? core->gpus[r->storage] : NULL;
    uint64_t n        = r->len - jobs->head->hashed < budget ? r->len - jobs->head->hashed : budget;
    kvx_status_t status;

    if (jobs->head->hashed == 0)
        checksum_stream_reset(jobs->stream);
    if (gpu == NULL) {
        checksum_stream_update(jobs->stream, at, (size_t)n);
        *bytes_p = n;
        return KVX_OK;
    }
    if (jobs->stage == NULL && (jobs->stage = malloc(CHECKSUM_STAGE_BYTES)) == NULL)
        return error_no_memory("staging GPU memory to hash");
    n      = n < CHECKSUM_STAGE_BYTES ? n : CHECKSUM_STAGE_BYTES;
    status = gpu_copy(gpu, jobs->stage, at, (size_t)n);
    if (status == KVX_OK)
        checksum_stream_update(jobs->stream, jobs->stage, (size_t)n);
    *bytes_p = n;
    return status;
}

size_t checksum_jobs_run(struct core *core, struct checksum_jobs *jobs,
                         struct sidechan_server *side, uint64_t budget)
{
    uint64_t start;
    size_t worked = 0;

    if (jobs == NULL || jobs->head == NULL)
        return 0; /* before the clock: this runs every turn of the loop */
    start = now_ns();
    while (jobs->head != NULL && budget > 0) {
        struct checksum_job *job = jobs->head;
        uint64_t n               = 0;
        uint8_t answer[CHECKSUM_MAX_ANSWER_SIZE];
        checksum_done_t done = job->done;
        void *arg            = job->arg;
        kvx_status_t status  = job_slice(core, jobs, budget, &n);

        worked++;
        if (status != KVX_OK) {
            if (done == NULL)
                refuse(core, side, &job->origin);
            jobs_pop(jobs); /* before `done`, which may add jobs (and reuse this one) */
            if (done != NULL)
                done(arg, status, NULL);
            continue;
        }
        budget -= n;
        job->hashed += n;
        core->stats.verify_bytes_hashed += n;
        if (job->hashed < job->ranges[job->next_range].len)
            continue;
        job->sums[job->next_range++] = checksum_stream_digest(jobs->stream);
        job->hashed                  = 0;
        if (job->next_range < job->count)
            continue;
        if (done != NULL) {
            uint64_t sums[CHECKSUM_MAX_RANGES];

            memcpy(sums, job->sums, job->count * sizeof(*sums));
            jobs_pop(jobs); /* before `done`, which may add jobs (and reuse this one) */
            done(arg, KVX_OK, sums);
            continue;
        }
        core->stats.verify_served++;
        sidechan_reply(side, &job->origin, answer,
                       checksum_answer_encode(job->sums, job->count, answer));
        jobs_pop(jobs);
    }
    core->stats.verify_ns += now_ns() - start;
    return worked;
}

/* push_serve.c: push jobs on the prefill side. A job is a small state machine (put, flush,
 * notify, answer) whose steps complete in UCX progress and are moved on from the loop; its
 * deadline is a timer. The decode agents written to are kept as writers (their checked
 * metadata and connection), found by the exact metadata bytes a push carries. */
#include "push_serve.h"

#include "clock.h"
#include "conn.h"
#include "error.h"
#include "notify.h"
#include "push_request.h"
#include "regions.h"
#include "wire.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PUSH_PROGRESS_ROUNDS 64

struct push_writer {
    void *metadata; /* the bytes that name it; NULL: a free slot */
    size_t metadata_size;
    struct conn *conn;
    uint64_t used; /* server->uses when last used */
    size_t jobs;   /* in flight: a writer with jobs is never evicted */
};

enum push_step { PUSH_PUT, PUSH_FLUSH, PUSH_NOTIFY };

struct push_job {
    struct push_server *server;
    struct push_writer *writer;
    struct sidechan_origin origin;
    uint64_t request_id;
    enum push_step step;
    struct transport_op *op;
    struct loop_timer deadline;
    bool ready;                  /* its step completed: in server->ready */
    struct push_job *ready_next; /* in server->ready */
    struct push_job *prev;       /* in server->jobs */
    struct push_job *next;
};

struct push_server {
    struct core *core;
    struct sidechan_server *side;
    struct push_writer writers[PUSH_MAX_WRITERS];
    uint64_t uses;
    kvx_pairs_t *pairs;
    struct push_job *jobs;
    size_t num_jobs;
    struct push_job *ready;
};

static void job_deadline(struct loop_timer *timer);

kvx_status_t push_server_create(struct core *core, struct sidechan_server *side,
                                struct push_server **server_p)
{
    struct push_server *s = calloc(1, sizeof(*s));
    kvx_status_t status;

    if (s == NULL)
        return error_no_memory("the push server");
    s->core = core;
    s->side = side;
    status  = kvx_pairs_create(&s->pairs);
    if (status != KVX_OK) {
        free(s);
        return status;
    }
    *server_p = s;
    return KVX_OK;
}

static void reply_text(struct push_server *s, const struct sidechan_origin *origin,
                       const char *text)
{
    sidechan_reply(s->side, origin, text, strlen(text));
}

/* "kvx-error MESSAGE" with kvx_errmsg()'s message. */
static void reply_error(struct push_server *s, const struct sidechan_origin *origin)
{
    char text[700];

    snprintf(text, sizeof(text), "%s%s", REPLY_ERROR, kvx_errmsg());
    reply_text(s, origin, text);
    s->core->stats.pushes_refused++;
}

static void job_free(struct push_job *job)
{
    struct push_server *s = job->server;

    loop_timer_stop(&s->core->loop, &job->deadline);
    transport_op_release(job->op);
    if (job->ready) { /* rare: failed with its step done; take it out of the ready list */
        struct push_job **link = &s->ready;

        while (*link != job)
            link = &(*link)->ready_next;
        *link = job->ready_next;
    }
    if (job->prev != NULL)
        job->prev->next = job->next;
    else
        s->jobs = job->next;
    if (job->next != NULL)
        job->next->prev = job->prev;
    job->writer->jobs--;
    s->num_jobs--;
    free(job);
}

static void writer_close(struct push_server *s, struct push_writer *w)
{
    if (w->conn != NULL) {
        loop_unwatch_fd(&s->core->loop, transport_conn_event_fd(w->conn->transport));
        conn_close(w->conn);
    }
    free(w->metadata);
    *w = (struct push_writer){0};
}

/* Fails `job` with kvx_errmsg()'s message, and every other job of its writer, whose
 * connection closes (a dead or broken writer is connected afresh next time). */
static void job_fail(struct push_job *job)
{
    struct push_server *s = job->server;
    struct push_writer *w = job->writer;

    reply_error(s, &job->origin);
    job_free(job);
    for (struct push_job *other = s->jobs, *next; other != NULL; other = next) {
        next = other->next;
        if (other->writer == w) {
            error_set(KVX_ERR_PEER_DOWN, "push %" PRIu64 ": its writer failed", other->request_id);
            reply_error(s, &other->origin);
            job_free(other);
        }
    }
    writer_close(s, w);
}

void push_server_destroy(struct push_server *server)
{
    if (server == NULL)
        return;
    while (server->jobs != NULL)
        job_free(server->jobs);
    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++)
        writer_close(server, &server->writers[i]);
    kvx_pairs_destroy(server->pairs);
    free(server);
}

size_t push_jobs(const struct push_server *server)
{
    return server->num_jobs;
}

/* Refuses a request with more ids in a group than the group's regions hold blocks in
 * `table` (its `side` in messages): such a request can only repeat blocks, and its size is
 * then bounded by the tables, not by what a peer chose to send. */
static kvx_status_t groups_fit(const kvx_regions_t *table, const char *side,
                               const kvx_group_ids_t *groups, size_t num_groups)
{
    for (size_t g = 0; g < num_groups; g++) {
        uint64_t capacity = UINT64_MAX;

        for (size_t r = 0; r < table->num_regions; r++) {
            const struct region *region = &table->regions[r];

            if ((region->group == (int64_t)g || region->group < 0) && region->num_blocks < capacity)
                capacity = region->num_blocks;
        }
        if (capacity != UINT64_MAX && groups[g].count > capacity)
            return error_set(KVX_ERR_OUT_OF_RANGE,
                             "push request: group %zu has %zu %s ids, more than the %" PRIu64
                             " blocks its regions hold",
                             g, groups[g].count, side, capacity);
    }
    return KVX_OK;
}

/* The writer for `req`'s metadata: kept, or connected now in the least recently used slot
 * that has no job in flight. */
static kvx_status_t writer_find(struct push_server *s, const struct push_request *req,
                                struct push_writer **writer_p)
{
    struct core *core          = s->core;
    struct push_writer *oldest = NULL;
    kvx_status_t status;

    s->uses++;
    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        struct push_writer *w = &s->writers[i];

        if (w->conn != NULL && w->metadata_size == req->metadata_size &&
            memcmp(w->metadata, req->metadata, req->metadata_size) == 0) {
            w->used   = s->uses;
            *writer_p = w;
            return KVX_OK;
        }
        if (w->jobs == 0 && (oldest == NULL || w->used < oldest->used))
            oldest = w;
    }
    if (oldest == NULL)
        return error_set(KVX_ERR_BUSY, "push: all %d writers have pushes in flight",
                         PUSH_MAX_WRITERS);
    writer_close(s, oldest);
    oldest->metadata = malloc(req->metadata_size);
    if (oldest->metadata == NULL)
        return error_no_memory("a push writer");
    status = conn_open(core->transport, core->regions, core->tp_size, core->tp_rank, KVX_MODE_PUSH,
                       req->metadata, req->metadata_size, &oldest->conn);
    if (status == KVX_OK)
        status = loop_watch_fd(&core->loop, transport_conn_event_fd(oldest->conn->transport));
    if (status != KVX_OK) {
        writer_close(s, oldest);
        return status;
    }
    memcpy(oldest->metadata, req->metadata, req->metadata_size);
    oldest->metadata_size = req->metadata_size;
    oldest->used          = s->uses;
    *writer_p             = oldest;
    return KVX_OK;
}

/* A step completed (from inside UCX progress): queue the job to be moved on. */
static void job_step_done(void *arg, struct transport_op *op)
{
    struct push_job *job = arg;

    (void)op;
    if (job->ready)
        return;
    job->ready         = true;
    job->ready_next    = job->server->ready;
    job->server->ready = job;
}

static kvx_status_t job_op_new(struct push_job *job)
{
    transport_op_release(job->op);
    job->op = NULL;
    return transport_op_create(job->writer->conn->transport, job_step_done, job, &job->op);
}

/* Posts this rank's share of `req` as puts, from the decode side's plan: its "local" side is
 * our destination. */
static kvx_status_t job_put(struct push_job *job, const struct push_request *req)
{
    struct push_server *s            = job->server;
    struct conn *conn                = job->writer->conn;
    kvx_request_t request            = {req->groups, req->num_groups,
                             req->has_remote ? req->groups + req->num_groups : NULL,
                             req->has_remote ? req->num_groups : 0};
    struct transport_targets targets = {s->core->bases, conn->remote_bases, true};
    kvx_status_t status              = kvx_peer_plan_request(conn->plan, &request, s->pairs);

    if (status == KVX_OK)
        status = job_op_new(job);
    for (size_t r = 0; status == KVX_OK && r < kvx_pairs_num_reads(s->pairs); r++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(s->pairs, r, &rank, &count);

        if (rank == s->core->tp_rank) /* other prefill ranks write their own shares */
            status = transport_rma_post(job->op, true, p, count, &targets);
    }
    return status;
}

static void job_advance(struct push_job *job);

/* Moves on the jobs whose step completed. */
static unsigned jobs_advance(struct push_server *server)
{
    unsigned moved = 0;

    while (server->ready != NULL) {
        struct push_job *job = server->ready;

        server->ready = job->ready_next;
        job->ready    = false;
        job_advance(job); /* may queue it again, at once */
        moved++;
    }
    return moved;
}

/* A small push completes in a few progress rounds of its writer: take them now, a bounded
 * number, rather than a loop turn per step (put, flush, notify, answer). */
#define PUSH_EAGER_ROUNDS 64
static void push_eager(struct push_server *server, struct push_writer *w)
{
    for (int round = 0; round < PUSH_EAGER_ROUNDS && w->conn != NULL && w->jobs > 0; round++) {
        transport_conn_progress(w->conn->transport); /* a failed job closes w: checked above */
        jobs_advance(server);
    }
}

void push_serve(void *server, const struct sidechan_request *request)
{
    struct push_server *s = server;
    struct core *core     = s->core;
    struct push_request req;
    struct push_writer *writer;
    struct push_job *job;
    kvx_status_t status;

    if (s->num_jobs == PUSH_MAX_JOBS) {
        error_set(KVX_ERR_BUSY, "push: %d pushes in flight already", PUSH_MAX_JOBS);
        reply_error(s, &request->origin);
        return;
    }
    status = push_request_decode(request->body, request->body_size, &req);
    if (status != KVX_OK) {
        reply_error(s, &request->origin);
        return;
    }
    job = calloc(1, sizeof(*job));
    if (job == NULL)
        status = error_no_memory("a push");
    if (status == KVX_OK)
        status =
            groups_fit(core->regions, "source",
                       req.has_remote ? req.groups + req.num_groups : req.groups, req.num_groups);
    if (status == KVX_OK)
        status = writer_find(s, &req, &job->writer);
    if (status == KVX_OK)
        status = groups_fit(kvx_metadata_regions(job->writer->conn->metadata), "destination",
                            req.groups, req.num_groups);
    if (status != KVX_OK) {
        push_request_free(&req);
        free(job);
        reply_error(s, &request->origin);
        return;
    }
    job->server     = s;
    job->origin     = request->origin;
    job->request_id = req.request_id;
    job->step       = PUSH_PUT;
    loop_timer_init(&job->deadline, job_deadline);
    job->next = s->jobs;
    if (s->jobs != NULL)
        s->jobs->prev = job;
    s->jobs = job;
    s->num_jobs++;
    job->writer->jobs++;
    status = job_put(job, &req);
    push_request_free(&req);
    if (status == KVX_OK)
        status = loop_timer_start(&core->loop, &job->deadline, clock_ms() + core->timeout_ms);
    if (status != KVX_OK) {
        job_fail(job);
        return;
    }
    writer = job->writer;
    transport_op_arm(job->op);
    push_eager(s, writer);
}

/* The next step of a job whose step completed: flush after the puts, notify after the
 * flush (the data is at the target then), answer after the notification. */
static void job_advance(struct push_job *job)
{
    struct push_server *s = job->server;
    struct notify note    = notify_done(job->request_id, s->core->tp_rank);
    kvx_status_t status   = transport_op_status(job->op, job->step == PUSH_PUT     ? "put"
                                                         : job->step == PUSH_FLUSH ? "flush"
                                                                                   : "notify");

    if (status == KVX_OK && job->step == PUSH_NOTIFY) {
        reply_text(s, &job->origin, REPLY_PUSHED);
        job_free(job);
        return;
    }
    if (status == KVX_OK)
        status = job_op_new(job);
    if (status == KVX_OK && job->step == PUSH_PUT)
        status = transport_flush_post(job->op);
    else if (status == KVX_OK)
        status = transport_am_post(job->op, CORE_AM_NOTIFY, &note, sizeof(note));
    if (status != KVX_OK) {
        char what[600];

        snprintf(what, sizeof(what), "%s", kvx_errmsg());
        error_set(status, "push %" PRIu64 ": %s", job->request_id, what);
        job_fail(job);
        return;
    }
    job->step = job->step == PUSH_PUT ? PUSH_FLUSH : PUSH_NOTIFY;
    transport_op_arm(job->op);
}

static void job_deadline(struct loop_timer *timer)
{
    struct push_job *job = (struct push_job *)((char *)timer - offsetof(struct push_job, deadline));

    error_set(KVX_ERR_PEER_TIMEOUT,
              "push %" PRIu64 ": not written within %" PRIu32 " ms; the writer is closed",
              job->request_id, job->server->core->timeout_ms);
    loop_log(&job->server->core->loop, "%s", kvx_errmsg());
    job_fail(job);
}

unsigned push_progress(struct push_server *server)
{
    unsigned events = 0;

    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        struct conn *conn = server->writers[i].conn;

        for (int round = 0; conn != NULL && round < PUSH_PROGRESS_ROUNDS &&
                            transport_conn_progress(conn->transport) > 0;
             round++)
            events++;
    }
    return events + jobs_advance(server);
}

bool push_busy(struct push_server *server)
{
    bool busy = server->ready != NULL;

    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        struct conn *conn = server->writers[i].conn;

        if (conn != NULL && !transport_conn_arm(conn->transport))
            busy = true;
    }
    return busy;
}

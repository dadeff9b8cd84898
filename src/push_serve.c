/* push_serve.c: push writers and jobs on the prefill side. A decode agent registers its push
 * metadata once per side-channel connection; the writer connects to the worker it names on
 * the push transport and sends it a random nonce, and only when that connection returns the
 * nonce (so the worker is the registrant's own) does it get a handle for its pushes. A job is a
 * small state machine (put, flush, answer) whose steps complete in UCX progress and are moved
 * on from the loop. Two timers end one that cannot finish: its deadline (what its requester
 * waits, at most max_push_ms) and its writer's stall check (no operation of the writer's jobs
 * completed for the agent's timeout_ms), which frees the slots of a requester that stopped
 * progressing long before a generous deadline would. */
#include "push_serve.h"

#include "clock.h"
#include "conn.h"
#include "error.h"
#include "hold.h"
#include "msg_mac.h"
#include "notify.h"
#include "plan.h"
#include "push_request.h"
#include "regions.h"
#include "wire.h"

#include <openssl/rand.h>

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PUSH_PROGRESS_ROUNDS 64

_Static_assert(PUSH_AM_BYTES_SIZE <= TRANSPORT_MSG_MAX, "a bytes answer is one message");

/* A decode agent written to: registered once by one side-channel connection, whose worker
 * proved itself (it returned the nonce sent to the worker its metadata named), then used by
 * that connection's pushes, which name it by its handle. */
struct push_writer {
    struct push_server *server;
    bool used;
    bool proven;
    uint8_t handle[PUSH_HANDLE_LEN]; /* the registrant's capability for its pushes */
    struct msg_mac *mac;             /* its key: the tags of its requests on the data plane */
    uint8_t nonce[PUSH_NONCE_LEN];   /* sent to the named worker; must come back */
    struct sidechan_origin owner;    /* the registrant's connection and its request */
    struct loop_timer proof_deadline;
    struct transport_op *proof_op;
    struct conn *conn;
    uint64_t used_at;        /* server->uses when last used */
    size_t jobs;             /* in flight: a writer with jobs is never evicted */
    struct loop_timer stall; /* armed while it has jobs: writer_stall_check */
    uint64_t progress_ms;    /* clock_ms() when one of its operations last completed */
    bool moved;              /* a job of it started or took a step since the last check */
};

enum push_step { PUSH_PUT, PUSH_FLUSH };

struct push_job {
    struct early_entry early; /* while it waits for its hold (a token, not held yet) */
    struct push_server *server;
    struct push_writer *writer;
    struct sidechan_origin origin;
    uint64_t request_id;
    struct push_request req; /* its ids, kept while it waits for its hold */
    bool is_done;            /* it carries a token: it counts as the registrant rank's done */
    bool by_message;         /* it came on the data plane: its answer "pushed" goes there too */
    enum push_step step;
    struct transport_op *op;
    size_t op_done;       /* operations of op completed at the writer's last stall check */
    uint64_t arrived_ms;  /* clock_ms() when the request came */
    uint32_t deadline_ms; /* how long it may write: push_limits_deadline */
    struct loop_timer deadline;
    bool ready;                  /* its step completed: in server->ready */
    struct push_job *ready_next; /* in server->ready */
    struct push_job *prev;       /* in server->jobs */
    struct push_job *next;
};

struct push_server {
    struct core *core;
    struct sidechan_server *side;
    struct transport *transport; /* the writers': push_transports, one rail */
    uint32_t max_per_peer;
    uint32_t max_push_ms;
    size_t busy;            /* writers with jobs in flight */
    size_t connected;       /* writers with a connection: none, and a turn looks at none */
    void *own_addresses[2]; /* this agent's workers: never a writer's target */
    size_t own_sizes[2];
    struct push_writer writers[PUSH_MAX_WRITERS];
    uint64_t uses;
    kvx_pairs_t *pairs;                 /* the job being started's plan */
    uint8_t answer[PUSH_AM_BYTES_SIZE]; /* a bytes answer being framed */
    struct push_job *jobs;
    size_t num_jobs;
    struct push_job *ready;
    struct push_queued *queued; /* requests that came on the data plane, oldest first */
    struct push_queued **queued_end;
    size_t num_queued;
};

/* A push request that came as a message on the main worker, with a handle that names a
 * writer: started after UCX progress returned (push_progress), never inside it. */
struct push_queued {
    struct push_queued *next;
    uint64_t id; /* the requester's, for the answer */
    struct push_request req;
};

static void job_deadline(struct loop_timer *timer);
static void job_held(struct early_entry *entry);
static void proof_deadline(struct loop_timer *timer);
static void writer_stall_check(struct loop_timer *timer);

kvx_status_t push_server_create(struct core *core, struct sidechan_server *side, const char *tls,
                                uint32_t max_per_peer, uint32_t max_push_ms,
                                struct push_server **server_p)
{
    struct push_server *s = calloc(1, sizeof(*s));
    kvx_status_t status;

    if (s == NULL)
        return error_no_memory("the push server");
    s->core         = core;
    s->side         = side;
    s->queued_end   = &s->queued;
    s->max_per_peer = max_per_peer;
    s->max_push_ms  = max_push_ms;
    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        s->writers[i].server = s;
        loop_timer_init(&s->writers[i].proof_deadline, proof_deadline);
        loop_timer_init(&s->writers[i].stall, writer_stall_check);
    }
    status = kvx_pairs_create(&s->pairs);
    if (status == KVX_OK)
        status = transport_create(tls, true, &s->transport);
    if (status == KVX_OK) /* a writer finds the link its decode peer opened to us */
        transport_links_share(s->transport, core->transport);
    if (status == KVX_OK)
        status = transport_worker_address(core->transport, &s->own_addresses[0], &s->own_sizes[0]);
    if (status == KVX_OK)
        status = transport_worker_address(s->transport, &s->own_addresses[1], &s->own_sizes[1]);
    if (status != KVX_OK) {
        push_server_destroy(s);
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

/* "kvx-error [CODE] MESSAGE" (notify.h) with kvx_errmsg()'s message; ERROR_CODE_NONE: none. */
static void reply_error_code(struct push_server *s, const struct sidechan_origin *origin,
                             enum error_code code)
{
    char text[700];

    if (error_answer_format(text, sizeof(text), code, kvx_errmsg()) == 0)
        snprintf(text, sizeof(text), "%s%s", REPLY_ERROR, kvx_errmsg()); /* cut short */
    reply_text(s, origin, text);
    s->core->stats.pushes_refused++;
}

/* "kvx-error MESSAGE" with kvx_errmsg()'s message. */
static void reply_error(struct push_server *s, const struct sidechan_origin *origin)
{
    reply_error_code(s, origin, ERROR_CODE_NONE);
}

static void job_free(struct push_job *job)
{
    struct push_server *s = job->server;

    early_unpark(&s->core->early, &job->early);
    push_request_free(&job->req);
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
    if (--job->writer->jobs == 0) {
        s->busy--;
        loop_timer_stop(&s->core->loop, &job->writer->stall);
    }
    s->num_jobs--;
    free(job);
}

static void writer_close(struct push_server *s, struct push_writer *w)
{
    loop_timer_stop(&s->core->loop, &w->proof_deadline);
    loop_timer_stop(&s->core->loop, &w->stall);
    transport_op_release(w->proof_op);
    msg_mac_destroy(w->mac);
    if (w->conn != NULL) {
        loop_unwatch_fd(&s->core->loop, transport_conn_event_fd(w->conn->transport));
        conn_close(w->conn);
        s->connected--;
    }
    *w = (struct push_writer){.server = s, .proof_deadline = w->proof_deadline, .stall = w->stall};
}

/* Fails every job of `w`, each answered "push ID: " and `why` with `status`, then closes
 * its connection (a dead or broken writer must be registered afresh). */
static void writer_fail(struct push_server *s, struct push_writer *w, kvx_status_t status,
                        const char *why)
{
    for (struct push_job *job = s->jobs, *next; job != NULL; job = next) {
        next = job->next;
        if (job->writer == w) {
            error_set(status, "push %" PRIu64 ": %s", job->request_id, why);
            reply_error(s, &job->origin);
            job_free(job);
        }
    }
    writer_close(s, w);
}

/* Fails `job` with kvx_errmsg()'s message, and every other job of its writer. */
static void job_fail(struct push_job *job)
{
    struct push_server *s = job->server;
    struct push_writer *w = job->writer;

    reply_error_code(s, &job->origin, ERROR_CODE_WRITER_FAILED); /* its bytes may trail it */
    job_free(job);
    writer_fail(s, w, KVX_ERR_PEER_DOWN, "its writer failed");
}

void push_server_destroy(struct push_server *server)
{
    if (server == NULL)
        return;
    while (server->queued != NULL) {
        struct push_queued *q = server->queued;

        server->queued = q->next;
        push_request_free(&q->req);
        free(q);
    }
    while (server->jobs != NULL)
        job_free(server->jobs);
    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++)
        writer_close(server, &server->writers[i]);
    transport_destroy(server->transport);
    kvx_pairs_destroy(server->pairs);
    free(server->own_addresses[0]);
    free(server->own_addresses[1]);
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

static bool same_connection(const struct sidechan_origin *a, const struct sidechan_origin *b)
{
    return a->identity_size == b->identity_size &&
           memcmp(a->identity, b->identity, a->identity_size) == 0;
}

/* The least recently used slot without a job in flight, emptied. */
static struct push_writer *writer_slot(struct push_server *s)
{
    struct push_writer *oldest = NULL;

    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        struct push_writer *w = &s->writers[i];

        if (!w->used)
            return w;
        if (w->jobs == 0 && (oldest == NULL || w->used_at < oldest->used_at))
            oldest = w;
    }
    if (oldest != NULL)
        writer_close(s, oldest);
    return oldest;
}

/* The metadata's worker must not be one of ours: a push would write this process. */
static kvx_status_t target_not_ours(struct push_server *s, const struct conn *conn)
{
    kvx_metadata_info_t info;

    kvx_metadata_get_info(conn->metadata, &info);
    for (size_t i = 0; i < 2; i++) {
        if (info.transport_address.size == s->own_sizes[i] &&
            memcmp(info.transport_address.data, s->own_addresses[i], s->own_sizes[i]) == 0)
            return error_set(KVX_ERR_INVALID,
                             "push registration: the metadata names this agent's own worker");
    }
    return KVX_OK;
}

static kvx_status_t random_bytes(uint8_t *bytes, size_t size)
{
    return RAND_bytes(bytes, (int)size) == 1
               ? KVX_OK
               : error_set(KVX_ERR_INTERNAL, "push: the system's random source failed");
}

void push_register(void *server, const struct sidechan_request *request)
{
    struct push_server *s = server;
    struct core *core     = s->core;
    struct push_writer *w = NULL;
    struct push_proof proof;
    kvx_status_t status = KVX_OK;

    /* one registration per connection: a new one replaces the old (a restarted decode agent) */
    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        struct push_writer *old = &s->writers[i];

        if (old->used && same_connection(&old->owner, &request->origin)) {
            if (old->jobs > 0)
                status = error_set(KVX_ERR_BUSY, "push registration: pushes are in flight");
            else
                writer_close(s, old);
        }
    }
    if (status == KVX_OK && (w = writer_slot(s)) == NULL)
        status = error_set(KVX_ERR_BUSY, "push registration: all %d writers have pushes in flight",
                           PUSH_MAX_WRITERS);
    if (status == KVX_OK) {
        w->used    = true;
        w->owner   = request->origin;
        w->used_at = ++s->uses;
        status = conn_open(s->transport, NULL, core->regions, core->tp_size, core->tp_rank, KVX_MODE_PUSH,
                           request->body, request->body_size, &w->conn);
        s->connected += w->conn != NULL;
    }
    if (status == KVX_OK)
        status = target_not_ours(s, w->conn);
    if (status == KVX_OK)
        status = loop_watch_fd(&core->loop, transport_conn_event_fd(w->conn->transport), false);
    if (status == KVX_OK)
        status = random_bytes(w->handle, sizeof(w->handle));
    if (status == KVX_OK)
        status = random_bytes(w->nonce, sizeof(w->nonce));
    if (status == KVX_OK) {
        proof  = push_proof_make(core->instance, w->nonce);
        status = transport_op_create(w->conn->transport, NULL, NULL, &w->proof_op);
    }
    if (status == KVX_OK)
        status = transport_am_post(w->proof_op, CORE_AM_PUSH_PROOF, &proof, sizeof(proof));
    if (status == KVX_OK)
        status = loop_timer_start(&core->loop, &w->proof_deadline, clock_ms() + core->timeout_ms);
    if (status != KVX_OK) {
        reply_error(s, &request->origin); /* kvx_errmsg() names the step that failed */
        if (w != NULL)
            writer_close(s, w);
        return;
    }
    transport_op_arm(w->proof_op);
}

void push_prove(void *server, const struct sidechan_request *request)
{
    struct push_server *s = server;

    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        struct push_writer *w = &s->writers[i];

        if (!w->used || w->proven || !same_connection(&w->owner, &request->origin))
            continue;
        if (request->body_size != PUSH_NONCE_LEN ||
            !auth_equal(request->body, w->nonce, PUSH_NONCE_LEN)) {
            error_set(KVX_ERR_INVALID, "push registration: a wrong proof");
            reply_error(s, &w->owner);
            writer_close(s, w);
            return;
        }
        {
            char text[sizeof(REPLY_REGISTERED) + 2 * (PUSH_HANDLE_LEN + MSG_MAC_KEY_LEN) + 2];
            size_t n = (size_t)snprintf(text, sizeof(text), "%s ", REPLY_REGISTERED);
            uint8_t key[MSG_MAC_KEY_LEN];

            if (msg_mac_new_key(key, &w->mac) != KVX_OK) {
                reply_error(s, &w->owner);
                writer_close(s, w);
                return;
            }
            for (size_t b = 0; b < PUSH_HANDLE_LEN; b++)
                n += (size_t)snprintf(text + n, sizeof(text) - n, "%02x", w->handle[b]);
            n += (size_t)snprintf(text + n, sizeof(text) - n, " ");
            for (size_t b = 0; b < MSG_MAC_KEY_LEN; b++)
                n += (size_t)snprintf(text + n, sizeof(text) - n, "%02x", key[b]);
            w->proven = true;
            loop_timer_stop(&s->core->loop, &w->proof_deadline);
            reply_text(s, &w->owner, text);
        }
        return;
    }
    s->core->stats.pushes_refused++; /* a proof nobody asked this connection for */
}

static void proof_deadline(struct loop_timer *timer)
{
    struct push_writer *w =
        (struct push_writer *)((char *)timer - offsetof(struct push_writer, proof_deadline));

    error_set(KVX_ERR_PEER_REFUSED,
              "push registration: the worker the metadata names did not return the proof within"
              " %" PRIu32 " ms: it is not the registrant's (or the registrant is not kvx)",
              w->server->core->timeout_ms);
    loop_log(&w->server->core->loop, "%s", kvx_errmsg());
    reply_error(w->server, &w->owner);
    writer_close(w->server, w);
}

/* The writer of `handle`, registered and proven by the connection `origin`. */
static kvx_status_t writer_find(struct push_server *s, const struct sidechan_origin *origin,
                                const uint8_t handle[PUSH_HANDLE_LEN],
                                struct push_writer **writer_p)
{
    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        struct push_writer *w = &s->writers[i];

        if (w->used && w->proven && same_connection(&w->owner, origin) &&
            auth_equal(w->handle, handle, PUSH_HANDLE_LEN)) {
            w->used_at = ++s->uses;
            *writer_p  = w;
            return KVX_OK;
        }
    }
    return error_set(KVX_ERR_INVALID,
                     "push: this connection has no registered writer of that handle (evicted "
                     "or never registered): register again");
}

/* The proven writer of `handle`, whichever connection registered it: a request on the data
 * plane has no side-channel connection, and the handle (128 random bits that only the
 * registrant's authenticated connection was told) is its authority. Compared with every
 * writer in constant time. NULL when none. */
static struct push_writer *writer_of_handle(struct push_server *s,
                                            const uint8_t handle[PUSH_HANDLE_LEN])
{
    struct push_writer *found = NULL;

    for (size_t i = 0; i < PUSH_MAX_WRITERS; i++) {
        struct push_writer *w = &s->writers[i];
        bool equal            = auth_equal(w->handle, handle, PUSH_HANDLE_LEN);

        if (w->used && w->proven && equal)
            found = w;
    }
    return found;
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

/* A new op for the job's next step: a step taken is progress for the stall check. */
static kvx_status_t job_op_new(struct push_job *job)
{
    transport_op_release(job->op);
    job->op            = NULL;
    job->op_done       = 0;
    job->writer->moved = true;
    return transport_op_create(job->writer->conn->transport, job_step_done, job, &job->op);
}

/* A refusal that is no fault of the writer (kvx_errmsg() says why): answered, and only the
 * job goes. */
static void job_refuse(struct push_job *job)
{
    reply_error(job->server, &job->origin);
    job_free(job);
}

/* The registrant's TP rank, as its checked push metadata says: the rank a push counts for. */
static uint32_t job_rank(const struct push_job *job)
{
    return job->writer->conn->tp_rank;
}

/* Plans the job's request into s->pairs from the decode side's plan: its "local" side is our
 * destination, its "remote" side our source. */
static kvx_status_t job_plan(struct push_job *job)
{
    const struct push_request *req = &job->req;
    kvx_request_t request          = {req->groups, req->num_groups,
                             req->has_remote ? req->groups + req->num_groups : NULL,
                             req->has_remote ? req->num_groups : 0, NULL};

    return kvx_peer_plan_request(job->writer->conn->plan, &request, job->server->pairs);
}

/* Posts this rank's share of the planned request (s->pairs) as puts; the decode side's other
 * prefill ranks write their own. */
static kvx_status_t job_put(struct push_job *job)
{
    struct push_server *s            = job->server;
    struct conn *conn                = job->writer->conn;
    struct transport_targets targets = {s->core->bases, s->core->regions->storage_mems,
                                        conn->remote_bases, true};
    size_t count;
    const kvx_pair_t *p = plan_pairs_of_rank(s->pairs, s->core->tp_rank, &count);
    kvx_status_t status = job_op_new(job);

    if (status == KVX_OK && count > 0)
        status = transport_rma_post(job->op, true, p, count, &targets);
    return status;
}

/* This rank's share of the planned request (s->pairs), `count` pairs at `p`, in bytes when
 * it may go in the answer: at most `max` bytes, all of host memory; else SIZE_MAX. */
static size_t job_share_bytes(const struct push_server *s, const kvx_pair_t *p, size_t count,
                              size_t max)
{
    size_t total = 0;

    for (size_t i = 0; i < count; i++) {
        if (s->core->gpus[p[i].remote_storage] != NULL || p[i].len > max - total)
            return SIZE_MAX;
        total += p[i].len;
    }
    return total;
}

/* A small share goes in the answer itself: one message, no puts, no flush (issue 23: a push
 * was a request, puts, their answers and an answer, two round trips and more, where a pull is
 * one). Only for a request that came as a message and asked for it (bytes_max), whose share
 * is host memory: the bytes are copied out of the blocks here, then the push counts as the
 * rank's done (job_hold_ready judged it in this same call), then the answer goes. True when
 * the job was answered so, and freed. */
static bool job_answer_with_bytes(struct push_job *job)
{
    struct push_server *s        = job->server;
    struct push_am_answer answer = {.id = job->origin.id};
    size_t max = job->req.bytes_max < PUSH_BYTES_MAX ? job->req.bytes_max : PUSH_BYTES_MAX;
    size_t count;
    const kvx_pair_t *p = plan_pairs_of_rank(s->pairs, s->core->tp_rank, &count);
    size_t total;
    uint8_t *at;
    size_t size;

    if (!job->by_message || max == 0 || (total = job_share_bytes(s, p, count, max)) == SIZE_MAX)
        return false;
    memcpy(answer.handle, job->writer->handle, PUSH_HANDLE_LEN);
    at = push_am_bytes_begin(&answer, total, s->answer);
    for (size_t i = 0; i < count; i++) {
        memcpy(at, (const uint8_t *)s->core->bases[p[i].remote_storage] + p[i].remote_offset,
               p[i].len);
        at += p[i].len;
    }
    if (job->is_done) {
        enum hold_done done = hold_table_done(s->core->holds, job->request_id, job_rank(job),
                                              sidechan_origin_key(&job->origin), &job->req.token);

        if (done != HOLD_DONE_COUNTED && done != HOLD_DONE_RELEASED) { /* judged just now */
            error_set(KVX_ERR_PEER_REFUSED, "push %" PRIu64 ": %s", job->request_id,
                      hold_done_reason(done));
            job_refuse(job);
            return true;
        }
    }
    size = push_am_bytes_end(REPLY_PUSHED, strlen(REPLY_PUSHED), total, s->answer);
    if (transport_msg_send(job->writer->conn->transport, CORE_AM_PUSH_ANSWER, s->answer, size) !=
        KVX_OK) {
        error_set(KVX_ERR_PEER_DOWN, "push %" PRIu64 ": its answer could not be sent: %s",
                  job->request_id, kvx_errmsg());
        job_fail(job);
        return true;
    }
    s->core->stats.pushes_with_bytes++;
    job_free(job);
    return true;
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
 * number, rather than a loop turn per step (put, flush, answer). */
#define PUSH_EAGER_ROUNDS 64
static void push_eager(struct push_server *server, struct push_writer *w)
{
    for (int round = 0; round < PUSH_EAGER_ROUNDS && w->conn != NULL && w->jobs > 0; round++) {
        transport_conn_progress(w->conn->transport); /* a failed job closes w: checked above */
        jobs_advance(server);
    }
}

/* The stall check of a writer runs this often: it fails between one and 1 + 1/4 timeouts
 * after the writer's last completed operation. */
#define PUSH_STALL_CHECKS 4

static uint64_t stall_interval_ms(const struct push_server *s)
{
    return s->core->timeout_ms / PUSH_STALL_CHECKS > 0 ? s->core->timeout_ms / PUSH_STALL_CHECKS
                                                       : 1;
}

/* A writer made progress when one of its writing jobs completed an operation (a put, a
 * flush) or took a step since the last check, or its connection's worker had something to do
 * (push_progress: the bytes of a write leave as the link takes them, while UCX 1.13 moved
 * eight 1 MiB pieces of one push at once, each completing only near the end, 8 s through
 * 8 Mbit/s); one that made none for the agent's timeout_ms is stalled: its requester stopped progressing its worker (or its link carries nothing),
 * and all its jobs fail now, freeing their slots, instead of at their deadlines, which the
 * requester chose. Jobs waiting for their hold write nothing and are not judged here. Per
 * writer, not per job: one writer's jobs share a connection, so a job whose puts queue
 * behind another's completes nothing while the writer streams. */
static void writer_stall_check(struct loop_timer *timer)
{
    struct push_writer *w =
        (struct push_writer *)((char *)timer - offsetof(struct push_writer, stall));
    struct push_server *s = w->server;
    uint64_t now          = clock_ms();
    bool moved            = w->moved;
    bool writing          = false;
    char why[200];

    w->moved = false;
    for (struct push_job *job = s->jobs; job != NULL; job = job->next) {
        size_t done;

        if (job->writer != w || job->op == NULL)
            continue;
        writing = true;
        done    = transport_op_posted(job->op) - transport_op_pending(job->op);
        if (done != job->op_done) {
            job->op_done = done;
            moved        = true;
        }
    }
    if (moved || !writing)
        w->progress_ms = now;
    else if (now - w->progress_ms >= s->core->timeout_ms) {
        snprintf(why, sizeof(why),
                 "its writer completed nothing for %" PRIu64 " ms (timeout %" PRIu32
                 " ms): the requester does not progress; the writer is closed",
                 now - w->progress_ms, s->core->timeout_ms);
        loop_log(&s->core->loop, "push: a writer with %zu jobs stalled: %s", w->jobs, why);
        writer_fail(s, w, KVX_ERR_PEER_TIMEOUT, why);
        return;
    }
    if (loop_timer_start(&s->core->loop, &w->stall, now + stall_interval_ms(s)) != KVX_OK)
        writer_fail(s, w, KVX_ERR_NO_MEMORY, "no memory for its writer's stall check");
}

/* Arms the stall check of a writer whose first job starts writing. */
static kvx_status_t writer_watch(struct push_server *s, struct push_writer *w)
{
    w->moved = true;
    if (w->stall.index != LOOP_TIMER_IDLE)
        return KVX_OK;
    w->progress_ms = clock_ms();
    return loop_timer_start(&s->core->loop, &w->stall, w->progress_ms + stall_interval_ms(s));
}

/* Answers a small job with its bytes, or posts its puts and takes a few progress rounds of
 * its writer; a failure fails the job and closes its writer. */
static void job_start(struct push_job *job)
{
    kvx_status_t status = job_plan(job);

    if (status == KVX_OK && job_answer_with_bytes(job))
        return;
    if (status == KVX_OK)
        status = writer_watch(job->server, job->writer);
    if (status == KVX_OK)
        status = job_put(job);
    if (status != KVX_OK) {
        job_fail(job);
        return;
    }
    transport_op_arm(job->op);
    push_eager(job->server, job->writer);
}

/* How long a parked job waits for its hold: as a parked done does, the agent's timeout_ms,
 * and never past its own deadline (a requester's long deadline is for writing, not for
 * keeping a slot for a hold that may never come). */
static uint32_t job_park_ms(const struct push_job *job)
{
    uint32_t timeout_ms = job->server->core->timeout_ms;

    return job->deadline_ms < timeout_ms ? job->deadline_ms : timeout_ms;
}

/* Arms the job's deadline timer: at its park bound while it waits for its hold, else at its
 * deadline; both from when it arrived. */
static kvx_status_t job_deadline_arm(struct push_job *job)
{
    uint32_t ms = job->early.parked ? job_park_ms(job) : job->deadline_ms;

    return loop_timer_start(&job->server->core->loop, &job->deadline, job->arrived_ms + ms);
}

/* Whether a job may write now. A push with a token is its rank's done: the hold must be
 * alive, with that token, and the rank must not have reported yet; a request not held yet
 * parks the job until its hold (job_held) or its park bound. False when the job was refused
 * (and freed) or parked. */
static bool job_hold_ready(struct push_job *job)
{
    struct hold_table *holds = job->server->core->holds;
    enum hold_done done;

    if (!job->is_done)
        return true;
    if (hold_table_state(holds, job->request_id) == HOLD_NONE) {
        if (early_park(&job->server->core->early, &job->early)) {
            if (job_deadline_arm(job) != KVX_OK)
                job_fail(job);
            return false;
        }
        error_set(KVX_ERR_BUSY, "push %" PRIu64 ": too many early dones: %d wait for their hold",
                  job->request_id, EARLY_MAX);
        job_refuse(job);
        return false;
    }
    done = hold_table_check(holds, job->request_id, job_rank(job),
                            sidechan_origin_key(&job->origin), &job->req.token);
    if (done == HOLD_DONE_COUNTED || done == HOLD_DONE_RELEASED)
        return true;
    error_set(KVX_ERR_PEER_REFUSED, "push %" PRIu64 ": %s", job->request_id,
              hold_done_reason(done));
    job_refuse(job);
    return false;
}

/* Its hold was made (kvx_hold): checked as if the push had just arrived, then written. */
static void job_held(struct early_entry *entry)
{
    struct push_job *job = (struct push_job *)entry;

    if (!job_hold_ready(job))
        return;
    if (job_deadline_arm(job) != KVX_OK) /* unparked: its writing deadline now */
        job_fail(job);
    else
        job_start(job);
}

/* Answers a job that came on the data plane with `text` through its writer, which reaches
 * the requester's main worker after the writes (each of them answered already); false when it
 * could not be sent (the side channel answers then). */
static bool answer_by_message(struct push_job *job, const char *text)
{
    struct push_am_answer answer = {.id = job->origin.id, .text = text, .text_size = strlen(text)};
    uint8_t message[PUSH_AM_MAX];
    size_t size;

    memcpy(answer.handle, job->writer->handle, PUSH_HANDLE_LEN);
    size = push_am_answer_frame(&answer, message);
    return transport_msg_send(job->writer->conn->transport, CORE_AM_PUSH_ANSWER, message, size) ==
           KVX_OK;
}

/* The writes are at the target: a push that is a done counts now, and the answer says
 * whether it counted. The hold may have ended while we wrote (its lease): then the blocks
 * may have changed under the puts, and the push is refused. */
static void job_answer(struct push_job *job)
{
    struct push_server *s = job->server;
    enum hold_done done;

    if (job->is_done) {
        done = hold_table_done(s->core->holds, job->request_id, job_rank(job),
                               sidechan_origin_key(&job->origin), &job->req.token);
        if (done != HOLD_DONE_COUNTED && done != HOLD_DONE_RELEASED) {
            error_set(KVX_ERR_PEER_REFUSED, "push %" PRIu64 ": written, but %s", job->request_id,
                      hold_done_reason(done));
            job_refuse(job);
            return;
        }
    }
    if (!job->by_message || !answer_by_message(job, REPLY_PUSHED))
        reply_text(s, &job->origin, REPLY_PUSHED);
    job_free(job);
}

/* Starts a job for `req` (which it takes) through `writer`, answered to `origin` (the
 * writer's registrant): refused, with the reason, past a limit or for ids the tables cannot
 * hold, before anything is put. */
static void job_begin(struct push_server *s, struct push_writer *writer,
                      const struct sidechan_origin *origin, bool by_message,
                      struct push_request req)
{
    struct core *core = s->core;
    struct push_job *job;
    kvx_status_t status;

    if (s->num_jobs == PUSH_MAX_JOBS) {
        status = error_set(KVX_ERR_BUSY, "push: %d pushes in flight already", PUSH_MAX_JOBS);
    } else {
        struct push_load load = {s->num_jobs, s->busy, writer->jobs, s->max_per_peer};

        status = push_limits_admit(&load);
    }
    if (status == KVX_OK)
        status =
            groups_fit(core->regions, "source",
                       req.has_remote ? req.groups + req.num_groups : req.groups, req.num_groups);
    if (status == KVX_OK)
        status = groups_fit(kvx_metadata_regions(writer->conn->metadata), "destination", req.groups,
                            req.num_groups);
    job = status == KVX_OK ? calloc(1, sizeof(*job)) : NULL;
    if (status == KVX_OK && job == NULL)
        status = error_no_memory("a push");
    if (status != KVX_OK) {
        push_request_free(&req);
        reply_error(s, origin);
        return;
    }
    job->server      = s;
    job->writer      = writer;
    job->origin      = *origin;
    job->by_message  = by_message;
    job->request_id  = req.request_id;
    job->arrived_ms  = clock_ms();
    job->deadline_ms = push_limits_deadline(req.deadline_ms, core->timeout_ms, s->max_push_ms);
    job->req         = req; /* the job's now */
    job->is_done     = req.has_token && hold_token_given(&req.token);
    job->step        = PUSH_PUT;
    job->early       = (struct early_entry){.request_id = req.request_id, .held = job_held};
    loop_timer_init(&job->deadline, job_deadline);
    job->next = s->jobs;
    if (s->jobs != NULL)
        s->jobs->prev = job;
    s->jobs = job;
    s->num_jobs++;
    if (writer->jobs++ == 0)
        s->busy++;
    status = job_deadline_arm(job);
    if (status != KVX_OK) {
        job_fail(job);
        return;
    }
    if (job_hold_ready(job))
        job_start(job);
}

void push_serve(void *server, const struct sidechan_request *request)
{
    struct push_server *s = server;
    struct push_request req;
    struct push_writer *writer = NULL;
    kvx_status_t status;

    if (s->num_jobs == PUSH_MAX_JOBS) { /* before decoding anything */
        error_set(KVX_ERR_BUSY, "push: %d pushes in flight already", PUSH_MAX_JOBS);
        reply_error(s, &request->origin);
        return;
    }
    status = push_request_decode(request->body, request->body_size, &req);
    if (status != KVX_OK) {
        reply_error(s, &request->origin);
        return;
    }
    status = writer_find(s, &request->origin, req.handle, &writer);
    if (status != KVX_OK) { /* the code tells the requester to register again */
        push_request_free(&req);
        reply_error_code(s, &request->origin, ERROR_CODE_UNREGISTERED);
        return;
    }
    job_begin(s, writer, &request->origin, false, req);
}

/* Refuses a request that came on the data plane, at once and to its sender (the handler's
 * `from`: no writer or side-channel connection may be its own), with kvx_errmsg()'s message
 * and the handle it carried, so that its requester finds it. Counted in pushes_refused. */
static void message_refuse(struct push_server *s, const struct transport_msg_from *from,
                           uint64_t id, const uint8_t handle[PUSH_HANDLE_LEN], enum error_code code)
{
    char text[700];
    struct push_am_answer answer = {.id = id, .text = text};
    uint8_t message[PUSH_AM_MAX];

    answer.text_size = error_answer_format(text, sizeof(text), code, kvx_errmsg());
    if (answer.text_size == 0)
        answer.text_size = (size_t)snprintf(text, sizeof(text), "%s%.500s", REPLY_ERROR,
                                            kvx_errmsg()); /* cut short */
    memcpy(answer.handle, handle, PUSH_HANDLE_LEN);
    transport_msg_reply(from, CORE_AM_PUSH_ANSWER, message, push_am_answer_frame(&answer, message));
    s->core->stats.pushes_refused++;
    s->core->stats.push_messages_refused++;
}

void push_serve_message(void *server, const void *data, size_t size,
                        const struct transport_msg_from *from)
{
    struct push_server *s = server;
    struct push_queued *q = NULL;
    struct push_writer *w;
    struct push_request req;
    const void *body;
    const uint8_t *request;
    size_t body_size;
    uint64_t id;

    /* [tag][request]: the tag of the request's bytes under its writer's key */
    if (!push_am_request_parse(data, size, &id, &body, &body_size) || body_size <= MSG_MAC_LEN ||
        push_request_decode((request = (const uint8_t *)body + MSG_MAC_LEN),
                            body_size - MSG_MAC_LEN, &req) != KVX_OK) {
        s->core->stats.push_messages_refused++; /* no handle to answer with: its deadline does */
        return;
    }
    w = writer_of_handle(s, req.handle);
    /* Changed or made by a third party who saw the handle on the data plane: a request without
     * a token writes any of our blocks into any of the registrant's. Dropped unanswered. */
    if (w != NULL && !msg_mac_verify(w->mac, request, body_size - MSG_MAC_LEN, body)) {
        s->core->stats.push_messages_refused++;
        push_request_free(&req);
        return;
    }
    if (w == NULL) {
        error_set(KVX_ERR_INVALID, "push: no registered writer has that handle (evicted or never "
                                   "registered): register again");
        message_refuse(s, from, id, req.handle, ERROR_CODE_UNREGISTERED);
    } else if (s->num_queued >= PUSH_MAX_JOBS || (q = malloc(sizeof(*q))) == NULL) {
        error_set(KVX_ERR_BUSY, "push: %d requests wait to start already", PUSH_MAX_JOBS);
        message_refuse(s, from, id, req.handle, ERROR_CODE_NONE);
    }
    if (q == NULL) {
        push_request_free(&req);
        return;
    }
    *q             = (struct push_queued){.id = id, .req = req};
    *s->queued_end = q;
    s->queued_end  = &q->next;
    s->num_queued++;
}

/* Starts the jobs of the requests queued by push_serve_message, in the order they came. A
 * writer evicted in between (rare: eviction happens on the side channel, in a later phase)
 * leaves its request counted and unanswered. */
static unsigned queued_start(struct push_server *s)
{
    unsigned started = 0;

    while (s->queued != NULL) {
        struct push_queued *q = s->queued;
        struct push_writer *w = writer_of_handle(s, q->req.handle);

        s->queued = q->next;
        s->num_queued--;
        if (w == NULL) {
            s->core->stats.push_messages_refused++;
            push_request_free(&q->req);
        } else {
            struct sidechan_origin origin = w->owner;

            origin.id  = q->id; /* refusals go on the side channel, as the request's answer */
            w->used_at = ++s->uses;
            s->core->stats.pushes_by_message++;
            job_begin(s, w, &origin, true, q->req);
        }
        free(q);
        started++;
    }
    s->queued_end = &s->queued;
    return started;
}

/* The next step of a job whose step completed: flush after the puts; after the flush the data
 * is at the target, and the answer says so. */
static void job_advance(struct push_job *job)
{
    kvx_status_t status = transport_op_status(job->op, job->step == PUSH_PUT ? "put" : "flush");

    if (status == KVX_OK && job->step == PUSH_FLUSH) {
        job_answer(job);
        return;
    }
    if (status == KVX_OK)
        status = job_op_new(job);
    if (status == KVX_OK)
        status = transport_flush_post(job->op);
    if (status != KVX_OK) {
        char what[600];

        snprintf(what, sizeof(what), "%s", kvx_errmsg());
        error_set(status, "push %" PRIu64 ": %s", job->request_id, what);
        job_fail(job);
        return;
    }
    job->step = PUSH_FLUSH;
    transport_op_arm(job->op);
}

static void job_deadline(struct loop_timer *timer)
{
    struct push_job *job = (struct push_job *)((char *)timer - offsetof(struct push_job, deadline));

    if (job->early.parked) { /* never held: nothing was written, its writer is fine */
        /* counted unknown, as a done would be */
        hold_table_done(job->server->core->holds, job->request_id, job_rank(job),
                        sidechan_origin_key(&job->origin), &job->req.token);
        error_set(KVX_ERR_PEER_REFUSED,
                  "push %" PRIu64 ": no such request: not held within %" PRIu32 " ms",
                  job->request_id, job_park_ms(job));
        job_refuse(job);
        return;
    }

    error_set(KVX_ERR_PEER_TIMEOUT,
              "push %" PRIu64 ": not written within %" PRIu32
              " ms (%s, at most max_push_ms %" PRIu32 "); the writer is closed",
              job->request_id, job->deadline_ms,
              job->req.deadline_ms != 0 ? "its requester's deadline"
                                        : "this agent's timeout: the requester sent no deadline",
              job->server->max_push_ms);
    loop_log(&job->server->core->loop, "%s", kvx_errmsg());
    job_fail(job);
}

unsigned push_progress(struct push_server *server)
{
    unsigned events = queued_start(server);

    for (size_t i = 0; server->connected > 0 && i < PUSH_MAX_WRITERS; i++) {
        struct push_writer *w = &server->writers[i];

        for (int round = 0; w->conn != NULL && round < PUSH_PROGRESS_ROUNDS &&
                            transport_conn_progress(w->conn->transport) > 0;
             round++) {
            events++;
            w->moved = w->moved || w->jobs > 0; /* its link moves: writer_stall_check */
        }
    }
    return events + jobs_advance(server);
}

bool push_busy(struct push_server *server)
{
    bool busy = server->ready != NULL || server->queued != NULL;

    for (size_t i = 0; server->connected > 0 && i < PUSH_MAX_WRITERS; i++) {
        struct conn *conn = server->writers[i].conn;

        if (conn != NULL && !transport_conn_arm(conn->transport))
            busy = true;
    }
    return busy;
}

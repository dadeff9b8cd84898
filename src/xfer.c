/* xfer.c: transfers of the decode side. A pull posts every get at once; when its operations
 * complete (counted in UCX progress) the loop moves it on: `done` notifications after the
 * data, then completion. A push asks each prefill rank that holds part of the request to
 * write it through the writer registered with it, and completes on their answers. Deadlines are
 * timers; finishing only queues the completion, whose run (the loop's last phase) calls the user's
 * callback. */
#include "xfer.h"

#include "clock.h"
#include "conn.h"
#include "error.h"
#include "invariant.h"
#include "notify.h"
#include "peer.h"
#include "plan.h"
#include "push_request.h"
#include "regions.h"
#include "stats.h"
#include "verify.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XFER_POOL_MAX 64 /* finished transfer objects kept, with their buffers, for reuse */

/* One peer of a transfer: read from (or, in a push, asked to write), or only notified. */
struct xfer_leg {
    struct kvx_xfer *xfer;
    kvx_peer_t *peer;
    struct transport_op *op;    /* pull: its gets */
    uint64_t reply_id;          /* the push or done awaiting its answer; 0: none */
    uint64_t bytes;             /* pull: read from this peer (its done says so) */
    struct peer_push_wait wait; /* push: waiting for our writer's registration with the peer */
    bool bytes_asked;           /* push: its rank may answer with the bytes (push_bytes_place) */
    bool answered;              /* push: its rank answered (its job, if any, ended there) */
    /* pull: its done went with its read (one message, transport_op_attach), and the answer
     * that came before the data is kept here until the data is (pull_notify) */
    bool attached;
    bool answer_kept;
    bool resent_on_side; /* its done was resent on the side channel, where no "resend" comes */
    size_t answer_size;
    char answer[DONE_REASON_SIZE + 32];
};

struct kvx_xfer {
    struct xfer_set *set;
    bool push;
    bool as_write; /* a push carried as a read, on one host (xfer_push_post) */
    uint64_t request_id;
    struct xfer_leg *legs; /* the num_reads read from, then those only notified */
    size_t num_legs;
    size_t num_reads;
    size_t legs_capacity;
    size_t ops_left;   /* operations or answers (to the dones, to a push) it waits for */
    bool answering;    /* a pull whose dones were sent: ops_left counts their answers */
    kvx_token_t token; /* the prefill side's hold token, sent with the dones */
    bool has_token;
    struct loop_timer deadline;
    struct loop_event completion;
    kvx_group_ids_t *groups; /* the local ids, then (when has_remote) the remote ones */
    size_t num_groups;
    size_t num_remote_groups;
    bool has_remote;
    size_t groups_capacity;
    uint64_t *ids; /* the groups' ids, one after another */
    size_t ids_capacity;
    struct verify *verify;          /* kept with the object for reuse; NULL until first needed */
    bool verify_wanted;             /* verify before completing (kvx_xfer_verify, verify_one_in) */
    bool verify_requested;          /* this transfer was verified, or is being verified */
    struct kvx_xfer *checking_next; /* in set->checking while verified after completing */
    kvx_read_stats_t stats;
    double start; /* seconds, clock_seconds() */
    kvx_status_t status;
    char error[512];
    kvx_xfer_cb_t callback;
    void *arg;
    bool in_callback;
    bool settled;   /* its completion ran */
    bool destroyed; /* the caller let go: freed once settled */
    bool ready;     /* an operation step completed: in set->ready */
    struct kvx_xfer *ready_next;
    struct kvx_xfer *prev; /* in set->in_flight, or the pool */
    struct kvx_xfer *next;
};

struct xfer_set {
    struct core *core;
    kvx_pairs_t *pairs; /* the request planned against the first peer's table */
    kvx_pairs_t *alt;   /* ... against another rank's table, when it differs */
    kvx_xfer_t *in_flight;
    kvx_xfer_t *ready;
    kvx_xfer_t *pool;
    size_t pooled;
    kvx_pairs_t *verify_pairs; /* a verification's request planned again: the last pairs of
                                  kvx_agent_last_pairs stay the last read's */
    kvx_pairs_t *verify_alt;
    kvx_pairs_t *answer_pairs; /* a push answered with its bytes: where they go */
    kvx_xfer_t *checking;      /* completed transfers being verified (kvx_xfer_verify) */
    uint64_t posted;           /* transfers posted: verify_one_in samples by this count */
};

static void xfer_deadline_fire(struct loop_timer *timer);
static void xfer_completion_run(struct loop_event *event);
__attribute__((format(printf, 3, 4))) static void xfer_end(kvx_xfer_t *x, kvx_status_t status,
                                                           const char *format, ...);

kvx_status_t xfer_set_create(struct core *core, struct xfer_set **set_p)
{
    struct xfer_set *set = calloc(1, sizeof(*set));
    kvx_status_t status;

    if (set == NULL)
        return error_no_memory("the transfers");
    set->core = core;
    status    = kvx_pairs_create(&set->pairs);
    if (status == KVX_OK)
        status = kvx_pairs_create(&set->alt);
    if (status == KVX_OK)
        status = kvx_pairs_create(&set->verify_pairs);
    if (status == KVX_OK)
        status = kvx_pairs_create(&set->verify_alt);
    if (status == KVX_OK)
        status = kvx_pairs_create(&set->answer_pairs);
    if (status != KVX_OK) {
        xfer_set_destroy(set);
        return status;
    }
    *set_p = set;
    return KVX_OK;
}

static void xfer_release(kvx_xfer_t *x)
{
    free(x->legs);
    free(x->groups);
    free(x->ids);
    verify_destroy(x->verify);
    free(x);
}

void xfer_set_destroy(struct xfer_set *set)
{
    if (set == NULL)
        return;
    while (set->pool != NULL) {
        kvx_xfer_t *x = set->pool;

        set->pool = x->next;
        xfer_release(x);
    }
    kvx_pairs_destroy(set->pairs);
    kvx_pairs_destroy(set->alt);
    kvx_pairs_destroy(set->verify_pairs);
    kvx_pairs_destroy(set->verify_alt);
    kvx_pairs_destroy(set->answer_pairs);
    free(set);
}

const kvx_pairs_t *xfer_set_last_pairs(const struct xfer_set *set)
{
    return set->pairs;
}

/* Grows `*buf` to hold `count` items of `size` bytes; its capacity is kept for reuse. */
static bool buffer_reserve(void **buf, size_t *capacity, size_t count, size_t size)
{
    void *grown;

    if (count <= *capacity)
        return true;
    grown = realloc(*buf, count * size);
    if (grown == NULL)
        return false;
    *buf      = grown;
    *capacity = count;
    return true;
}

/* A transfer object with its buffers, the pool's last one or a new one, for a pull or a
 * push of `request_id`. */
static kvx_xfer_t *xfer_get(struct xfer_set *set, bool push, uint64_t request_id,
                            kvx_xfer_cb_t callback, void *arg)
{
    kvx_xfer_t *x = set->pool;

    if (x != NULL) {
        set->pool = x->next;
        set->pooled--;
    } else if ((x = calloc(1, sizeof(*x))) == NULL) {
        return NULL;
    }
    *x = (kvx_xfer_t){.set             = set,
                      .legs            = x->legs,
                      .legs_capacity   = x->legs_capacity,
                      .groups          = x->groups,
                      .groups_capacity = x->groups_capacity,
                      .ids             = x->ids,
                      .ids_capacity    = x->ids_capacity,
                      .verify          = x->verify,
                      .push            = push,
                      .request_id      = request_id,
                      .callback        = callback,
                      .arg             = arg,
                      .status          = KVX_INPROGRESS};
    loop_timer_init(&x->deadline, xfer_deadline_fire);
    x->completion.run = xfer_completion_run;
    set->core->num_xfers++;
    return x;
}

/* What the caller asked for, in messages: a push carried as a read is still its write. */
static const char *xfer_verb(const kvx_xfer_t *x)
{
    return x->push || x->as_write ? "write" : "read";
}

/* Back to the pool, or freed. */
static void xfer_recycle(kvx_xfer_t *x)
{
    struct xfer_set *set = x->set;

    set->core->num_xfers--;
    if (set->pooled == XFER_POOL_MAX) {
        xfer_release(x);
        return;
    }
    x->next   = set->pool;
    set->pool = x;
    set->pooled++;
}

static void in_flight_link(kvx_xfer_t *x)
{
    struct xfer_set *set = x->set;

    x->prev = NULL;
    x->next = set->in_flight;
    if (set->in_flight != NULL)
        set->in_flight->prev = x;
    set->in_flight = x;
}

static void in_flight_unlink(kvx_xfer_t *x)
{
    struct xfer_set *set = x->set;

    if (x->prev != NULL)
        x->prev->next = x->next;
    else if (set->in_flight == x)
        set->in_flight = x->next;
    if (x->next != NULL)
        x->next->prev = x->prev;
    x->prev = x->next = NULL;
}

static void ready_unlink(kvx_xfer_t *x)
{
    kvx_xfer_t **link = &x->set->ready;

    if (!x->ready)
        return;
    while (*link != x)
        link = &(*link)->ready_next;
    *link    = x->ready_next;
    x->ready = false;
}

static void ready_queue(kvx_xfer_t *x)
{
    if (x->ready)
        return;
    x->ready      = true;
    x->ready_next = x->set->ready;
    x->set->ready = x;
}

/* An operation of the current step completed (from inside UCX progress): count it, and
 * queue the transfer to be moved on after the last. */
static void xfer_op_finished(void *arg, struct transport_op *op)
{
    kvx_xfer_t *x = arg;

    (void)op;
    /* a released op calls no one: only a transfer in flight counts its operations */
    KVX_ASSERT(x->status == KVX_INPROGRESS && x->ops_left > 0);
    if (--x->ops_left == 0)
        ready_queue(x);
}

static void count_transfer(struct core *core, const kvx_read_stats_t *stats, kvx_status_t status)
{
    kvx_agent_stats_t *s = &core->stats;

    if (status != KVX_OK) {
        s->transfers_failed++;
        return;
    }
    s->transfers++;
    s->bytes += stats->bytes;
    histogram_add(&s->transfer_us, stats->seconds * 1e6);
    histogram_add(&s->transfer_bytes, (double)stats->bytes);
    histogram_add(&s->transfer_descriptors, (double)stats->posted);
}

/* A failed push's ranks that did not answer may still write into the blocks its caller owns
 * again once told (a stopped prefill that continues reads the request then, and writes for
 * its own job's deadline; a rank still writing beside one that refused): they are taken
 * down, and their connections close in the failed-peers phase, before the completion runs.
 * Their writers write to those connections' workers (conn_push_metadata), never progressed
 * again, so nothing of theirs lands after that (issue 35 finding 3). A rank that answered
 * wrote all it will (a refusal comes before any put), unless its answer says its job failed
 * after it may have written ("[writer-failed]": bytes may trail the answer). */
static void push_writers_close(kvx_xfer_t *x)
{
    char reason[300];

    snprintf(reason, sizeof(reason), "closed: write %" PRIu64 " failed", x->request_id);
    for (size_t i = 0; i < x->num_reads; i++) {
        if (!x->legs[i].answered)
            peer_down(x->legs[i].peer, KVX_ERR_PEER_DOWN, reason, PEER_DEAD);
    }
}

/* Ends `x` with `status` (its message in x->error for a failure): its operations and
 * awaited answers are let go, and its completion is queued. Once. */
static void xfer_finish(kvx_xfer_t *x, kvx_status_t status)
{
    struct core *core = x->set->core;

    KVX_ASSERT(x->status == KVX_INPROGRESS && status != KVX_INPROGRESS); /* once */
    x->status = status;
    in_flight_unlink(x);
    ready_unlink(x);
    loop_timer_stop(&core->loop, &x->deadline);
    if (x->verify != NULL && verify_started(x->verify) && !verify_ended(x->verify))
        verify_fail(x->verify, status, "%s", x->error);
    for (size_t i = 0; i < x->num_legs; i++) {
        struct xfer_leg *leg = &x->legs[i];

        transport_op_release(leg->op);
        leg->op = NULL;
        if (leg->reply_id != 0)
            peer_request_forget(leg->peer, leg->reply_id);
        leg->reply_id = 0;
        if (leg->wait.waiting)
            peer_push_wait_cancel(leg->peer, &leg->wait);
        peer_touch(leg->peer);
        if (status == KVX_OK)
            peer_unwant(leg->peer, x->request_id); /* here: no more heartbeats for it */
    }
    if (status != KVX_OK && x->push)
        push_writers_close(x);
    if (status == KVX_OK)
        x->stats.seconds = clock_seconds() - x->start;
    count_transfer(core, &x->stats, status);
    if (status != KVX_OK)
        loop_log(&core->loop, "%s", x->error);
    loop_queue(&core->loop, &x->completion);
}

/* Fails `x` with `status` and a message. A pull's read peers are taken down: their gets may
 * still be pending, and closing their connections (the failed-peers phase, before the
 * completion runs) is what ends them. */
__attribute__((format(printf, 3, 4))) static void xfer_fail(kvx_xfer_t *x, kvx_status_t status,
                                                            const char *format, ...)
{
    va_list args;
    char reason[300];

    va_start(args, format);
    vsnprintf(x->error, sizeof(x->error), format, args);
    va_end(args);
    snprintf(reason, sizeof(reason), "closed: %s %" PRIu64 " failed", xfer_verb(x), x->request_id);
    for (size_t i = 0; !x->push && i < x->num_reads; i++)
        peer_down(x->legs[i].peer, KVX_ERR_PEER_DOWN, reason, PEER_DEAD);
    xfer_finish(x, status);
}

static bool xfer_uses(const kvx_xfer_t *x, const kvx_peer_t *peer)
{
    for (size_t i = 0; i < x->num_legs; i++) {
        if (x->legs[i].peer == peer)
            return true;
    }
    return false;
}

size_t xfers_fail_down_peers(struct xfer_set *set)
{
    size_t taken = 0;
    kvx_peer_t *peer;

    KVX_ASSERT(!transport_progressing(set->core->transport)); /* it closes connections */
    while ((peer = peer_down_next(set->core)) != NULL) {
        for (kvx_xfer_t *x = set->checking; x != NULL; x = x->checking_next) {
            if (verify_uses(x->verify, peer))
                verify_fail(x->verify, peer_down_status(peer), "verify %s %" PRIu64 ": peer %s %s",
                            xfer_verb(x), x->request_id, peer_address(peer),
                            kvx_peer_down_reason(peer));
        }
        for (kvx_xfer_t *x = set->in_flight, *next; x != NULL; x = next) {
            next = x->next; /* failing x unlinks only x */
            if (xfer_uses(x, peer))
                xfer_fail(x, peer_down_status(peer), "%s %" PRIu64 ": peer %s %s", xfer_verb(x),
                          x->request_id, peer_address(peer), kvx_peer_down_reason(peer));
        }
        peer_close_conn(peer);
        taken++;
    }
    return taken;
}

void xfers_cancel_peer(struct xfer_set *set, kvx_peer_t *peer)
{
    for (kvx_xfer_t *x = set->in_flight, *next; x != NULL; x = next) {
        next = x->next;
        if (xfer_uses(x, peer))
            xfer_fail(x, KVX_ERR_CANCELED, "%s %" PRIu64 ": cancelled: peer %s closed",
                      xfer_verb(x), x->request_id, peer_address(peer));
    }
    peer_down(peer, KVX_ERR_CANCELED, "closed by its caller", PEER_CLOSED);
    xfers_fail_down_peers(set);
    loop_wake(&set->core->loop); /* the cancelled transfers' callbacks are due */
}

static void xfer_deadline_fire(struct loop_timer *timer)
{
    kvx_xfer_t *x  = (kvx_xfer_t *)((char *)timer - offsetof(kvx_xfer_t, deadline));
    uint32_t ms    = x->set->core->timeout_ms;
    size_t pending = 0;
    size_t posted  = 0;

    if (x->verify != NULL && verify_started(x->verify) && !verify_ended(x->verify)) {
        if (x->status != KVX_INPROGRESS) /* a completed transfer's (kvx_xfer_verify) */
            verify_fail(x->verify, KVX_ERR_PEER_TIMEOUT,
                        "verify %s %" PRIu64 ": %zu of %zu segments not answered within %" PRIu32
                        " ms",
                        xfer_verb(x), x->request_id, verify_unanswered(x->verify),
                        verify_num_segments(x->verify), ms);
        else
            xfer_fail(x, KVX_ERR_PEER_TIMEOUT,
                      "%s %" PRIu64 ": verify: %zu of %zu segments not answered within %" PRIu32
                      " ms",
                      xfer_verb(x), x->request_id, verify_unanswered(x->verify),
                      verify_num_segments(x->verify), ms);
        return;
    }

    for (size_t i = 0; i < x->num_legs; i++) {
        pending += x->legs[i].op != NULL ? transport_op_pending(x->legs[i].op) : 0;
        posted += x->legs[i].op != NULL ? transport_op_posted(x->legs[i].op) : 0;
    }
    if (x->push)
        xfer_fail(x, KVX_ERR_PEER_TIMEOUT,
                  "write %" PRIu64 ": %zu of %zu prefill ranks did not answer within %" PRIu32
                  " ms",
                  x->request_id, x->ops_left, x->num_reads, x->set->core->timeout_ms);
    else if (x->answering) /* every get completed: nothing of the peers' to stop */
        xfer_end(x, KVX_ERR_PEER_TIMEOUT,
                 "%s %" PRIu64 ": %zu of %zu prefill ranks did not answer its done within %" PRIu32
                 " ms: the hold is not known to have been alive for it",
                 xfer_verb(x), x->request_id, x->ops_left, x->num_legs, ms);
    else
        xfer_fail(x, KVX_ERR_PEER_TIMEOUT,
                  "%s %" PRIu64 ": %zu of %zu operations still pending at the %" PRIu32
                  " ms deadline; the peers read from are closed",
                  xfer_verb(x), x->request_id, pending, posted, x->set->core->timeout_ms);
}

/* Copies the request's local ids, to report them if the transfer fails, and its remote ids,
 * so that a verification can plan the request again. */
static kvx_status_t xfer_groups_copy(kvx_xfer_t *x, const kvx_request_t *request)
{
    size_t num_remote = request->remote != NULL ? request->num_remote_groups : 0;
    size_t total      = 0;

    for (size_t g = 0; g < request->num_local_groups; g++)
        total += request->local[g].count;
    for (size_t g = 0; g < num_remote; g++)
        total += request->remote[g].count;
    if (!buffer_reserve((void **)&x->groups, &x->groups_capacity,
                        request->num_local_groups + num_remote + 1, sizeof(*x->groups)) ||
        !buffer_reserve((void **)&x->ids, &x->ids_capacity, total + 1, sizeof(*x->ids)))
        return error_no_memory("a transfer");
    x->num_groups        = request->num_local_groups;
    x->num_remote_groups = num_remote;
    x->has_remote        = request->remote != NULL;
    total                = 0;
    for (size_t g = 0; g < x->num_groups + num_remote; g++) {
        const kvx_group_ids_t *in =
            g < x->num_groups ? &request->local[g] : &request->remote[g - x->num_groups];

        if (in->count > 0)
            memcpy(x->ids + total, in->ids, in->count * sizeof(*x->ids));
        x->groups[g] = (kvx_group_ids_t){x->ids + total, in->count};
        total += in->count;
    }
    return KVX_OK;
}

/* The first peer's connection, whose plan says which ranks a request reads from; every
 * peer must be up and have the first one's TP size. */
static kvx_status_t peers_check(kvx_peer_t *const *peers, size_t num_peers, struct conn **first_p)
{
    for (size_t i = 0; i < num_peers; i++) {
        struct conn *conn = peer_conn(peers[i]);

        if (conn == NULL)
            return error_set(peer_down_status(peers[i]), "peer %s is down (%s); reconnect it",
                             peer_address(peers[i]), kvx_peer_down_reason(peers[i]));
        if (i > 0 && conn->tp_size != (*first_p)->tp_size)
            return error_set(
                KVX_ERR_INVALID, "peer %s has TP size %" PRIu32 " where peer %s has %" PRIu32,
                peer_address(peers[i]), conn->tp_size, peer_address(peers[0]), (*first_p)->tp_size);
        if (i == 0)
            *first_p = conn;
    }
    return KVX_OK;
}

/* The legs of a planned request: the peer of each read rank, then the notify-only ranks'
 * peers among those given. */
static kvx_status_t xfer_legs_find(kvx_xfer_t *x, kvx_peer_t *const *peers, size_t num_peers,
                                   const kvx_peer_plan_t *plan)
{
    const kvx_pairs_t *pairs = x->set->pairs;
    size_t reads             = kvx_pairs_num_reads(pairs);
    size_t notifies          = x->push ? 0 : kvx_peer_plan_num_notifies(plan);

    if (!buffer_reserve((void **)&x->legs, &x->legs_capacity, reads + notifies + 1,
                        sizeof(*x->legs)))
        return error_no_memory("a transfer");
    for (size_t r = 0; r < reads; r++) {
        uint32_t rank;
        kvx_peer_t *peer;

        kvx_pairs_read(pairs, r, &rank, NULL);
        peer = peer_of_rank(peers, num_peers, rank);
        if (peer == NULL)
            return error_set(KVX_ERR_INVALID,
                             "%s: the request needs remote rank %" PRIu32
                             ", which is not among the %zu peers",
                             xfer_verb(x), rank, num_peers);
        x->legs[x->num_legs++] = (struct xfer_leg){.xfer = x, .peer = peer};
    }
    x->num_reads = x->num_legs;
    for (size_t i = 0; i < notifies; i++) {
        kvx_peer_t *peer = peer_of_rank(peers, num_peers, kvx_peer_plan_notify_rank(plan, i));

        if (peer != NULL)
            x->legs[x->num_legs++] = (struct xfer_leg){.xfer = x, .peer = peer};
    }
    return KVX_OK;
}

/* Plans `request` against the first peer's table, then finds the legs and copies the ids. */
static kvx_status_t xfer_prepare(kvx_xfer_t *x, kvx_peer_t *const *peers, size_t num_peers,
                                 const kvx_request_t *request, struct conn **first_p)
{
    kvx_pairs_stats_t stats;
    kvx_status_t status = peers_check(peers, num_peers, first_p);

    if (status == KVX_OK)
        status = kvx_peer_plan_request((*first_p)->plan, request, x->set->pairs);
    if (status == KVX_OK)
        status = xfer_legs_find(x, peers, num_peers, (*first_p)->plan);
    if (status == KVX_OK)
        status = xfer_groups_copy(x, request);
    x->has_token = request->token != NULL;
    if (x->has_token)
        x->token = *request->token;
    kvx_pairs_stats(x->set->pairs, &stats);
    x->stats = (kvx_read_stats_t){stats.descriptors, stats.coalesced, stats.bytes, 0};
    return status;
}

/* The pairs of read `r` of `x`: the first plan's when the rank's table is the first one's
 * (equal digests), else the request planned again against that rank's own table. */
static kvx_status_t read_pairs(kvx_xfer_t *x, const kvx_request_t *request,
                               const struct conn *first, size_t r, kvx_pairs_t *planned,
                               kvx_pairs_t *alt, const kvx_pair_t **pairs_p, size_t *count_p)
{
    struct conn *conn = peer_conn(x->legs[r].peer);
    kvx_status_t status;

    if (memcmp(conn->table_digest, first->table_digest, CONN_DIGEST_LEN) == 0) {
        *pairs_p = kvx_pairs_read(planned, r, NULL, count_p);
        return KVX_OK;
    }
    status = kvx_peer_plan_request(conn->plan, request, alt);
    if (status != KVX_OK)
        return status;
    *pairs_p = plan_pairs_of_rank(alt, conn->tp_rank, count_p);
    return *pairs_p != NULL
               ? KVX_OK
               : error_set(KVX_ERR_INTERNAL, "read: rank %" PRIu32 "'s own plan does not read it",
                           conn->tp_rank);
}

/* verify_one_in: the 1st, the N+1st, ... transfer posted is verified. */
static bool xfer_sampled(struct xfer_set *set)
{
    uint32_t n = set->core->verify_one_in;

    return n > 0 && set->posted++ % n == 0;
}

static void done_reply(void *arg, const char *reply, size_t size);

/* Gives leg's done to its read, to go in the same message when the read is one served read
 * message (transport_op_attach): the prefill judges it once the read's bytes left its memory,
 * and a small pull takes one round trip instead of two. Pending as any done; the post says
 * whether it went. */
static void done_attach(kvx_xfer_t *x, struct xfer_leg *leg)
{
    uint8_t done[TRANSPORT_ATTACH_MAX];
    size_t size;

    if (peer_done_frame(leg->peer, x->request_id, x->has_token ? &x->token : NULL, leg->bytes,
                        done_reply, leg, &leg->reply_id, done, sizeof(done), &size))
        transport_op_attach(leg->op, done, size);
}

/* Posts a read of `request`; `as_write`: it carries a push (xfer_push_post). */
static kvx_status_t pull_post(struct xfer_set *set, bool as_write, kvx_peer_t *const *peers,
                              size_t num_peers, uint64_t request_id, const kvx_request_t *request,
                              kvx_xfer_cb_t callback, void *arg, kvx_xfer_t **xfer_p)
{
    struct core *core  = set->core;
    double entered     = clock_seconds();
    struct conn *first = NULL;
    kvx_xfer_t *x      = xfer_get(set, false, request_id, callback, arg);
    kvx_status_t status;

    if (x == NULL)
        return error_no_memory("a transfer");
    x->as_write = as_write;
    status      = xfer_prepare(x, peers, num_peers, request, &first);
    if (status == KVX_OK)
        status = loop_timer_start(&core->loop, &x->deadline, clock_ms() + core->timeout_ms);
    x->start         = clock_seconds();
    x->verify_wanted = status == KVX_OK && xfer_sampled(set); /* its done follows the check */
    for (size_t r = 0; status == KVX_OK && r < x->num_reads; r++) {
        struct xfer_leg *leg             = &x->legs[r];
        struct conn *conn                = peer_conn(leg->peer);
        struct transport_targets targets = {core->bases, core->regions->storage_mems,
                                            conn->remote_bases, false};
        const kvx_pair_t *pairs          = NULL;
        size_t count                     = 0;

        status = read_pairs(x, request, first, r, set->pairs, set->alt, &pairs, &count);
        for (size_t i = 0; status == KVX_OK && i < count; i++)
            leg->bytes += pairs[i].len;
        if (status == KVX_OK)
            status = transport_op_create(conn->transport, xfer_op_finished, x, &leg->op);
        if (status == KVX_OK && !x->verify_wanted)
            done_attach(x, leg);
        if (status == KVX_OK)
            status = transport_rma_post(leg->op, false, pairs, count, &targets);
        if (leg->reply_id != 0 && (status != KVX_OK || !transport_op_attached(leg->op))) {
            peer_request_forget(leg->peer, leg->reply_id); /* it did not go */
            leg->reply_id = 0;
        }
        leg->attached = leg->reply_id != 0;
    }
    if (status != KVX_OK) {
        /* Some gets may be in flight: the peers read from close before x goes, and the
         * callback never fires. */
        char what[400];
        bool posted = false;

        snprintf(what, sizeof(what), "%s", kvx_errmsg());
        for (size_t r = 0; r < x->num_reads; r++)
            posted = posted || x->legs[r].op != NULL;
        for (size_t r = 0; r < x->num_reads; r++) {
            transport_op_release(x->legs[r].op);
            x->legs[r].op = NULL;
            if (posted)
                peer_down(x->legs[r].peer, KVX_ERR_PEER_DOWN, "closed: a read failed to post",
                          PEER_DEAD);
        }
        loop_timer_stop(&core->loop, &x->deadline);
        xfers_fail_down_peers(set);
        xfer_recycle(x);
        return error_set(status, "%s", what);
    }
    in_flight_link(x);
    x->ops_left = x->num_reads + 1; /* + 1: nothing moves on before every op is armed */
    for (size_t r = 0; r < x->num_reads; r++)
        transport_op_arm(x->legs[r].op);
    xfer_op_finished(x, NULL);
    for (size_t i = 0; i < x->num_legs; i++)
        peer_touch(x->legs[i].peer);
    histogram_add(&core->stats.post_us, (clock_seconds() - entered) * 1e6);
    if (as_write)
        core->stats.pushes_as_reads++;
    loop_wake(&core->loop);
    *xfer_p = x;
    return KVX_OK;
}

kvx_status_t xfer_pull_post(struct xfer_set *set, kvx_peer_t *const *peers, size_t num_peers,
                            uint64_t request_id, const kvx_request_t *request,
                            kvx_xfer_cb_t callback, void *arg, kvx_xfer_t **xfer_p)
{
    return pull_post(set, false, peers, num_peers, request_id, request, callback, arg, xfer_p);
}

/* Ends `x` with `status` and a message without taking its peers down: their transport did
 * not fail (a mismatch, a refused or impossible verification). */
__attribute__((format(printf, 3, 4))) static void xfer_end(kvx_xfer_t *x, kvx_status_t status,
                                                           const char *format, ...)
{
    va_list args;

    va_start(args, format);
    vsnprintf(x->error, sizeof(x->error), format, args);
    va_end(args);
    xfer_finish(x, status);
}

static void pull_notify(kvx_xfer_t *x);

/* After a verification that ended while `x` was in flight: complete it (a pull sends its
 * dones first) or fail it with the verification's status. */
static void xfer_after_verify(kvx_xfer_t *x)
{
    kvx_status_t status = verify_status(x->verify);

    if (status != KVX_OK)
        xfer_end(x, status, "%s %" PRIu64 ": %s", xfer_verb(x), x->request_id,
                 verify_error(x->verify));
    else if (x->push)
        xfer_finish(x, KVX_OK);
    else
        pull_notify(x);
}

/* The verification's end (verify.h): moves an in-flight transfer on; for a completed one
 * (kvx_xfer_verify) only its deadline stops. */
static void xfer_verified(void *arg)
{
    kvx_xfer_t *x = arg;

    if (x->status == KVX_INPROGRESS)
        xfer_after_verify(x);
    else
        loop_timer_stop(&x->set->core->loop, &x->deadline);
}

/* Plans the transfer's request again (into the set's verification buffers), splits each read
 * rank's pairs into segments and sends the first checksum requests, with the deadline
 * restarted for the verification. On failure nothing is pending. */
static kvx_status_t xfer_verify_begin(kvx_xfer_t *x)
{
    struct xfer_set *set  = x->set;
    struct core *core     = set->core;
    kvx_request_t request = {x->groups, x->num_groups,
                             x->has_remote ? x->groups + x->num_groups : NULL, x->num_remote_groups,
                             NULL};
    struct conn *first    = NULL;
    kvx_status_t status   = KVX_OK;

    if (x->verify == NULL && (status = verify_create(core, xfer_verified, x, &x->verify)) != KVX_OK)
        return status;
    verify_reset(x->verify);
    x->verify_requested = true;
    for (size_t r = 0; status == KVX_OK && r < x->num_reads; r++) {
        struct conn *conn       = peer_conn(x->legs[r].peer);
        const kvx_pair_t *pairs = NULL;
        size_t count            = 0;

        if (conn == NULL) {
            status =
                error_set(peer_down_status(x->legs[r].peer), "verify: peer %s is down (%s)",
                          peer_address(x->legs[r].peer), kvx_peer_down_reason(x->legs[r].peer));
            break;
        }
        if (r == 0) {
            first  = conn;
            status = kvx_peer_plan_request(first->plan, &request, set->verify_pairs);
        }
        if (status == KVX_OK)
            status = read_pairs(x, &request, first, r, set->verify_pairs, set->verify_alt, &pairs,
                                &count);
        if (status == KVX_OK)
            status = verify_add(x->verify, x->legs[r].peer, pairs, count);
    }
    if (status == KVX_OK)
        status = loop_timer_start(&core->loop, &x->deadline, clock_ms() + core->timeout_ms);
    if (status == KVX_OK)
        status = verify_start(x->verify);
    if (status != KVX_OK || verify_ended(x->verify))
        loop_timer_stop(&core->loop, &x->deadline);
    if (status != KVX_OK && !verify_ended(x->verify))
        verify_fail(x->verify, status, "%s", kvx_errmsg());
    return status;
}

/* Every operation or answer of `x` is in: verify first when asked, else complete. */
static void xfer_settle(kvx_xfer_t *x)
{
    if (x->verify_wanted) {
        x->verify_wanted    = false;
        kvx_status_t status = xfer_verify_begin(x);

        if (status != KVX_OK) {
            xfer_end(x, status, "%s %" PRIu64 ": %s", xfer_verb(x), x->request_id, kvx_errmsg());
            return;
        }
        if (!verify_ended(x->verify))
            return; /* xfer_verified moves it on */
        xfer_after_verify(x);
        return;
    }
    if (x->push)
        xfer_finish(x, KVX_OK);
    else
        pull_notify(x);
}

/* Every get completed: the data is here (verified, if asked). A pull one of whose peers went
 * down meanwhile, in this same phase (an earlier ready pull failed on it), is left to this
 * turn's failed-peers phase, which fails it with the peer's status: the peer's connection is
 * gone, and nothing may be asked of it (issue 22 finding 6). */
static void pull_complete(kvx_xfer_t *x)
{
    kvx_status_t status = KVX_OK;

    for (size_t i = 0; i < x->num_legs; i++) {
        if (peer_is_down(x->legs[i].peer)) {
            KVX_ASSERT(peer_is_queued(x->legs[i].peer)); /* or x would not be in flight */
            return;
        }
    }
    for (size_t r = 0; r < x->num_reads && status == KVX_OK; r++) {
        status = transport_op_status(x->legs[r].op, "get");
        conn_transports(peer_conn(x->legs[r].peer)); /* wired up by now: say what UCX chose */
    }
    if (status != KVX_OK) {
        xfer_fail(x, KVX_ERR_PEER_DOWN, "%s %" PRIu64 ": %s", xfer_verb(x), x->request_id,
                  kvx_errmsg());
        return;
    }
    xfer_settle(x);
}

/* Sends leg's done (on the side channel only: `side_channel`); false when it could not be
 * sent, which ended the transfer. */
static bool done_send(kvx_xfer_t *x, struct xfer_leg *leg, bool side_channel)
{
    kvx_status_t status = peer_send_done(leg->peer, x->request_id, x->has_token ? &x->token : NULL,
                                         leg->bytes, side_channel, done_reply, leg, &leg->reply_id);
    char what[300];

    if (status == KVX_OK)
        return true;
    snprintf(what, sizeof(what), "%s", kvx_errmsg());
    x->set->core->stats.notifications_failed++;
    xfer_end(x, status, "%s %" PRIu64 ": remote rank %" PRIu32 ": its done: %s", xfer_verb(x),
             x->request_id, peer_rank(leg->peer), what);
    return false;
}

/* A prefill rank's answer to our done: counted (the hold was alive for us, or there was
 * none and we gave no token), or refused, which fails the read: the bytes we have may be
 * another request's (the blocks were released and perhaps reused), or not ours to take. */
static void done_answer_apply(kvx_xfer_t *x, struct xfer_leg *leg, const char *reply, size_t size);

static void done_reply(void *arg, const char *reply, size_t size)
{
    struct xfer_leg *leg = arg;
    kvx_xfer_t *x        = leg->xfer;

    KVX_ASSERT(x->status == KVX_INPROGRESS && leg->reply_id != 0); /* a finished one forgot it */
    leg->reply_id = 0;
    leg->answered = true;
    if (!x->answering) { /* a done that went with its read, answered before the data is here */
        leg->answer_kept = true;
        leg->answer_size = size < sizeof(leg->answer) ? size : sizeof(leg->answer);
        memcpy(leg->answer, reply, leg->answer_size);
        return;
    }
    done_answer_apply(x, leg, reply, size);
}

/* What the answer to leg's done says, once the data is here. */
static void done_answer_apply(kvx_xfer_t *x, struct xfer_leg *leg, const char *reply, size_t size)
{
    char reason[DONE_REASON_SIZE];
    bool counted = false;

    bool resend = size == strlen(DONE_ANSWER_RESEND) && memcmp(reply, DONE_ANSWER_RESEND, size) == 0;

    if (resend && !leg->resent_on_side) {
        /* One that went with its read comes again as a message now that the data is here;
         * one that came as a message waits for its hold on the side channel, or a handle.
         * A prefill answers a done on its side channel there: a third "resend" is a lie. */
        x->set->core->stats.dones_resent++;
        leg->resent_on_side = !leg->attached;
        done_send(x, leg, !leg->attached);
        leg->attached = false;
        return;
    }
    if (resend || !done_answer_parse(reply, size, &counted, reason)) {
        xfer_end(x, KVX_ERR_IO,
                 "%s %" PRIu64 ": remote rank %" PRIu32
                 ": a malformed answer to its done (%zu bytes)",
                 xfer_verb(x), x->request_id, peer_rank(leg->peer), size);
        return;
    }
    if (!counted) {
        x->set->core->stats.dones_refused++;
        xfer_end(x, KVX_ERR_PEER_REFUSED, "%s %" PRIu64 ": remote rank %" PRIu32 ": %s",
                 xfer_verb(x), x->request_id, peer_rank(leg->peer), reason);
        return;
    }
    if (--x->ops_left == 0)
        xfer_finish(x, KVX_OK);
}

/* A pull whose data is here (and verified, if asked): each rank read from or only notified
 * gets its `done` as a request on the side channel, and the transfer completes once every
 * one answered that it counted, within the transfer's deadline. A done that cannot be
 * queued (a peer gone, or PEER_SEND_HWM waiting for one that reads its side channel slower
 * than we finish reads) fails the read: without the answer nothing says the bytes were
 * held for us. notifications_failed counts it. */
static void pull_notify(kvx_xfer_t *x)
{
    x->answering = true;
    x->ops_left  = x->num_legs;
    for (size_t i = 0; i < x->num_legs && x->status == KVX_INPROGRESS; i++) {
        struct xfer_leg *leg = &x->legs[i];

        if (leg->reply_id != 0) /* went with its read: its answer is still to come */
            continue;
        if (leg->answer_kept) {
            leg->answer_kept = false;
            done_answer_apply(x, leg, leg->answer, leg->answer_size);
        } else if (!done_send(x, leg, false)) {
            return;
        }
    }
    if (x->status == KVX_INPROGRESS && x->ops_left == 0)
        xfer_finish(x, KVX_OK);
}

size_t xfers_advance(struct xfer_set *set)
{
    size_t moved = 0;

    while (set->ready != NULL) {
        kvx_xfer_t *x = set->ready;

        set->ready = x->ready_next;
        x->ready   = false;
        moved++;
        pull_complete(x);
    }
    return moved;
}

/* The request of `x` as it was posted. */
static kvx_request_t xfer_request(const kvx_xfer_t *x)
{
    return (kvx_request_t){x->groups, x->num_groups,
                           x->has_remote ? x->groups + x->num_groups : NULL, x->num_remote_groups,
                           x->has_token ? &x->token : NULL};
}

/* Copies the bytes a prefill rank answered our push with into our blocks, where our own plan
 * against that rank's table puts its share, in the plan's order: the rank chooses no address,
 * and must send exactly its share. */
static kvx_status_t push_bytes_place(kvx_xfer_t *x, struct xfer_leg *leg, const uint8_t *bytes,
                                     size_t size)
{
    void *const *bases    = x->set->core->bases;
    kvx_request_t request = xfer_request(x);
    const kvx_pair_t *p   = NULL;
    size_t count          = 0;
    uint64_t share        = 0;
    kvx_status_t status =
        kvx_peer_plan_request(peer_conn(leg->peer)->plan, &request, x->set->answer_pairs);

    if (status == KVX_OK)
        p = plan_pairs_of_rank(x->set->answer_pairs, peer_rank(leg->peer), &count);
    for (size_t i = 0; i < count; i++)
        share += p[i].len;
    if (status == KVX_OK && share != size)
        return error_set(KVX_ERR_PEER_REFUSED,
                         "its answer carried %zu bytes where its share is %" PRIu64, size, share);
    for (size_t i = 0; i < count; i++) {
        memcpy((uint8_t *)bases[p[i].local_storage] + p[i].local_offset, bytes, p[i].len);
        bytes += p[i].len;
    }
    return status;
}

/* A prefill rank's answer to our push request: its text, and after a NUL the bytes of a push
 * answered with them (peer.c). */
static void push_reply(void *arg, const char *reply, size_t size)
{
    struct xfer_leg *leg = arg;
    kvx_xfer_t *x        = leg->xfer;
    size_t text          = strnlen(reply, size);

    KVX_ASSERT(x->status == KVX_INPROGRESS && leg->reply_id != 0); /* a finished one forgot it */
    leg->reply_id = 0;
    leg->answered = true;
    if (text < size && text == strlen(REPLY_PUSHED) && memcmp(reply, REPLY_PUSHED, text) == 0) {
        kvx_status_t status =
            leg->bytes_asked
                ? push_bytes_place(x, leg, (const uint8_t *)reply + text + 1, size - text - 1)
                : error_set(KVX_ERR_PEER_REFUSED, "it answered with bytes we did not ask for");

        if (status != KVX_OK) {
            char what[300];

            snprintf(what, sizeof(what), "%s", kvx_errmsg());
            xfer_end(x, status, "write %" PRIu64 " by remote rank %" PRIu32 ": %s", x->request_id,
                     peer_rank(leg->peer), what);
            return;
        }
        size = text;
    }
    if (size != strlen(REPLY_PUSHED) || memcmp(reply, REPLY_PUSHED, size) != 0) {
        enum error_code code = ERROR_CODE_NONE;
        size_t message_at    = 0;
        const char *why =
            error_answer_parse(reply, size, &code, &message_at) ? reply + message_at : reply;

        if (code == ERROR_CODE_UNREGISTERED)
            peer_push_forget(leg->peer); /* evicted there: the next push registers afresh */
        if (code == ERROR_CODE_WRITER_FAILED)
            leg->answered = false; /* its writer's last bytes may come after this answer */
        xfer_fail(x, KVX_ERR_PEER_REFUSED, "write %" PRIu64 " by remote rank %" PRIu32 ": %.400s",
                  x->request_id, peer_rank(leg->peer), why);
        return;
    }
    if (--x->ops_left == 0)
        xfer_settle(x);
}

/* How many bytes a prefill rank may answer our push with instead of putting them: a share up
 * to PUSH_BYTES_MAX when every storage of ours is host memory (we copy them in ourselves),
 * unless KVX_PUSH_BYTES=puts keeps every push on puts. */
static uint32_t push_bytes_max(const struct core *core)
{
    for (size_t s = 0; s < core->num_storages; s++) {
        if (core->gpus[s] != NULL)
            return 0;
    }
    return core->push_bytes_as_puts ? 0 : PUSH_BYTES_MAX;
}

/* Asks the leg's prefill rank to write the transfer's blocks through our writer `handle`. */
static kvx_status_t push_leg_send(struct xfer_leg *leg, const uint8_t *handle)
{
    kvx_xfer_t *x         = leg->xfer;
    kvx_request_t request = xfer_request(x);
    uint32_t bytes_max    = push_bytes_max(x->set->core);
    void *body            = NULL;
    size_t size           = 0;
    kvx_status_t status   = push_request_encode(x->request_id, handle, x->set->core->timeout_ms,
                                                bytes_max, &request, &body, &size);

    leg->bytes_asked = bytes_max > 0;

    /* the prefill writes as long as we wait */
    if (status == KVX_OK)
        status = peer_push_send(leg->peer, body, size, push_reply, leg, &leg->reply_id);
    free(body);
    return status;
}

/* The leg's first push to its peer registered our writer there (from the side-channel phase):
 * its request goes now, or the transfer fails with why it cannot. */
static void push_leg_registered(struct peer_push_wait *wait, kvx_status_t status,
                                const uint8_t *handle)
{
    struct xfer_leg *leg = (struct xfer_leg *)((char *)wait - offsetof(struct xfer_leg, wait));
    kvx_xfer_t *x        = leg->xfer;
    char what[700];

    KVX_ASSERT(x->status == KVX_INPROGRESS); /* an ended one left the peer's waiters */
    if (status == KVX_OK && (status = push_leg_send(leg, handle)) == KVX_OK)
        return;
    snprintf(what, sizeof(what), "%s", kvx_errmsg());
    xfer_fail(x, status, "write %" PRIu64 " by remote rank %" PRIu32 ": %s", x->request_id,
              peer_rank(leg->peer), what);
}

/* Whether a push goes as a read: every prefill rank asked is a process of this host (and
 * KVX_PUSH_ON_ONE_HOST=writers does not keep pushes to writers). A prefill grants reads to
 * every authenticated peer; its push writers take only TCP, since a shared-memory or CMA lane
 * writes where the registrant's keys point (docs/security.md). So on one host our read moves
 * the same bytes over shared memory, and its done counts for our rank as the push would. */
static bool push_as_read(const struct xfer_set *set, kvx_peer_t *const *peers, size_t num_peers)
{
    if (set->core->push_writers_on_one_host)
        return false;
    for (size_t i = 0; i < num_peers; i++) {
        struct conn *conn = peer_conn(peers[i]);

        if (conn == NULL || !conn_one_host(conn))
            return false; /* a push to the writers says why it cannot go */
    }
    return true;
}

kvx_status_t xfer_push_post(struct xfer_set *set, const void *metadata, size_t metadata_size,
                            kvx_peer_t *const *peers, size_t num_peers, uint64_t request_id,
                            const kvx_request_t *request, kvx_xfer_cb_t callback, void *arg,
                            kvx_xfer_t **xfer_p)
{
    struct core *core  = set->core;
    struct conn *first = NULL;
    kvx_xfer_t *x;
    kvx_status_t status;

    if (push_as_read(set, peers, num_peers))
        return pull_post(set, true, peers, num_peers, request_id, request, callback, arg, xfer_p);
    x = xfer_get(set, true, request_id, callback, arg);
    if (x == NULL)
        return error_no_memory("a transfer");
    /* Our own plan says which prefill ranks hold our blocks, and checks the request first. */
    status = xfer_prepare(x, peers, num_peers, request, &first);
    for (size_t r = 0; r < x->num_legs; r++)
        x->legs[r].wait = (struct peer_push_wait){.ready = push_leg_registered};
    if (status == KVX_OK)
        status = loop_timer_start(&core->loop, &x->deadline, clock_ms() + core->timeout_ms);
    x->start = clock_seconds();
    /* Each rank writes through the writer we registered with it. The first push to a rank
     * registers, a state the loop carries under this transfer's deadline (push_leg_registered):
     * nothing here waits for the peer. */
    for (size_t r = 0; status == KVX_OK && r < x->num_reads; r++) {
        struct xfer_leg *leg = &x->legs[r];
        const uint8_t *handle;

        status = peer_push_handle(leg->peer, metadata, metadata_size, &leg->wait, &handle);
        if (status == KVX_OK)
            status = push_leg_send(leg, handle);
        else if (status == KVX_INPROGRESS)
            status = KVX_OK;
    }
    if (status != KVX_OK) {
        /* Ranks asked already may write anyway: they answer to nothing now. */
        for (size_t r = 0; r < x->num_reads; r++) {
            if (x->legs[r].reply_id != 0)
                peer_request_forget(x->legs[r].peer, x->legs[r].reply_id);
            if (x->legs[r].wait.waiting)
                peer_push_wait_cancel(x->legs[r].peer, &x->legs[r].wait);
        }
        loop_timer_stop(&core->loop, &x->deadline);
        xfer_recycle(x);
        return status;
    }
    in_flight_link(x);
    x->verify_wanted = xfer_sampled(set);
    x->ops_left      = x->num_reads;
    if (x->ops_left == 0)
        xfer_finish(x, KVX_OK);
    for (size_t i = 0; i < x->num_legs; i++)
        peer_touch(x->legs[i].peer);
    loop_wake(&core->loop);
    *xfer_p = x;
    return KVX_OK;
}

static void xfer_completion_run(struct loop_event *event)
{
    kvx_xfer_t *x = (kvx_xfer_t *)((char *)event - offsetof(kvx_xfer_t, completion));

    /* A failed pull closed its connections; until they settled, a local copy of theirs may
     * still land in our blocks, so it is not reported before: its caller may reuse them. */
    if (!x->push && x->status != KVX_OK && transport_settling(x->set->core->transport) > 0) {
        loop_queue(&x->set->core->loop, &x->completion);
        return;
    }
    x->settled = true;
    if (x->callback != NULL) {
        x->in_callback = true;
        x->callback(x->arg, x, x->status);
        x->in_callback = false;
    }
    if (x->destroyed)
        xfer_recycle(x);
}

bool xfer_settled(const kvx_xfer_t *xfer)
{
    return xfer->settled;
}

struct core *xfer_core(const kvx_xfer_t *xfer)
{
    return xfer->set->core;
}

kvx_status_t kvx_xfer_status(const kvx_xfer_t *xfer)
{
    return xfer->status;
}

const char *kvx_xfer_error(const kvx_xfer_t *xfer)
{
    return xfer->error;
}

void kvx_xfer_failed_blocks(const kvx_xfer_t *xfer, const kvx_group_ids_t **groups_p,
                            size_t *num_groups_p)
{
    bool failed   = xfer->status != KVX_OK && xfer->status != KVX_INPROGRESS;
    *groups_p     = failed ? xfer->groups : NULL;
    *num_groups_p = failed ? xfer->num_groups : 0;
}

void kvx_xfer_stats(const kvx_xfer_t *xfer, kvx_read_stats_t *stats_p)
{
    *stats_p = xfer->stats;
}

void kvx_xfer_destroy(kvx_xfer_t *xfer)
{
    if (xfer == NULL)
        return;
    if (xfer->status == KVX_INPROGRESS) {
        xfer_fail(xfer, KVX_ERR_CANCELED, "%s %" PRIu64 ": cancelled; the peers %s are closed",
                  xfer_verb(xfer), xfer->request_id, xfer->push ? "asked" : "read from");
        xfers_fail_down_peers(xfer->set); /* no get can write into our memory after this */
        loop_wake(&xfer->set->core->loop);
    }
    if (!xfer->settled || xfer->in_callback)
        xfer->destroyed = true; /* its callback still runs, from progress; then it goes */
    else
        xfer_recycle(xfer);
}

kvx_status_t xfer_verify_post(kvx_xfer_t *xfer, bool *wait_p)
{
    struct xfer_set *set = xfer->set;
    kvx_status_t status;

    *wait_p = false;
    if (xfer->status == KVX_INPROGRESS) {
        xfer->verify_wanted = true; /* xfer_settle starts it */
        return KVX_OK;
    }
    if (xfer->status != KVX_OK)
        return error_set(KVX_ERR_INVALID, "verify: %s %" PRIu64 " did not complete: %s",
                         xfer_verb(xfer), xfer->request_id, xfer->error);
    if (xfer->verify != NULL && verify_started(xfer->verify) && !verify_ended(xfer->verify))
        return error_set(KVX_ERR_INVALID, "verify: %s %" PRIu64 " is being verified already",
                         xfer_verb(xfer), xfer->request_id);
    status = xfer_verify_begin(xfer);
    if (status != KVX_OK)
        return status;
    xfer->checking_next = set->checking;
    set->checking       = xfer;
    *wait_p             = true;
    return KVX_OK;
}

bool xfer_verify_ended(const kvx_xfer_t *xfer)
{
    return verify_ended(xfer->verify);
}

kvx_status_t xfer_verify_finish(kvx_xfer_t *xfer)
{
    kvx_xfer_t **link = &xfer->set->checking;
    kvx_status_t status;

    while (*link != NULL && *link != xfer)
        link = &(*link)->checking_next;
    if (*link == xfer)
        *link = xfer->checking_next;
    loop_timer_stop(&xfer->set->core->loop, &xfer->deadline);
    status = verify_status(xfer->verify);
    if (status != KVX_OK)
        return error_set(status, "%s", verify_error(xfer->verify));
    return KVX_OK;
}

void kvx_xfer_verify_result(const kvx_xfer_t *xfer, kvx_verify_result_t *result_p)
{
    if (xfer->verify == NULL || !xfer->verify_requested) {
        *result_p =
            (kvx_verify_result_t){.requested = xfer->verify_wanted, .status = KVX_INPROGRESS};
        return;
    }
    verify_result(xfer->verify, result_p);
}

/* agent_xfer.c: posted pulls: post every get at once, then let the agent's progress complete
 * them, notify after the data, fail them whole at their deadline, and call back once. The
 * blocking kvx_read is a post and a wait. */
#include "agent.h"

#include "clock.h"
#include "error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XFER_POOL_MAX 64 /* finished transfer objects an agent keeps for its next posts */

struct kvx_xfer {
    kvx_agent_t *agent;
    uint64_t request_id;
    struct transport_op *op; /* every get of the transfer; outlives x if a peer died */
    double start;            /* seconds, CLOCK_MONOTONIC */
    double deadline;
    kvx_peer_t **peers; /* read from (first num_reads), then only notified */
    size_t num_reads;
    size_t num_peers;
    size_t peers_capacity;
    kvx_group_ids_t *groups; /* the local ids, reported when the transfer fails */
    size_t num_groups;
    size_t groups_capacity;
    uint64_t *ids; /* the groups' ids, one after another */
    size_t ids_capacity;
    kvx_read_stats_t stats;
    kvx_status_t status;
    char error[512];
    kvx_xfer_cb_t callback;
    void *arg;
    struct kvx_xfer *prev; /* in the agent's list while in flight */
    struct kvx_xfer *next;
};

kvx_peer_t *agent_peer_of_rank(kvx_peer_t *const *peers, size_t num_peers, uint32_t rank)
{
    for (size_t i = 0; i < num_peers; i++) {
        if (peers[i]->tp_rank == rank)
            return peers[i];
    }
    return NULL;
}

static void xfer_unlink(kvx_xfer_t *x)
{
    kvx_agent_t *agent = x->agent;

    if (x->prev != NULL)
        x->prev->next = x->next;
    else if (agent->xfers == x)
        agent->xfers = x->next;
    if (x->next != NULL)
        x->next->prev = x->prev;
    x->prev = x->next = NULL;
    agent->xfers_unlinked++;
}

void agent_count_transfer(kvx_agent_t *agent, const kvx_read_stats_t *stats, kvx_status_t status)
{
    kvx_agent_stats_t *s = &agent->stats;

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

/* Ends a transfer with `status`, counts it and fires its callback, once. A failure's message
 * is kvx_errmsg() unless xfer_fail kept one already. */
static void xfer_finish(kvx_xfer_t *x, kvx_status_t status)
{
    x->status = status;
    if (status != KVX_OK && x->error[0] == '\0')
        snprintf(x->error, sizeof(x->error), "%s", kvx_errmsg());
    xfer_unlink(x);
    for (size_t i = 0; i < x->num_peers; i++)
        x->peers[i]->last_used_ms = clock_ms();
    agent_count_transfer(x->agent, &x->stats, status);
    if (status != KVX_OK)
        agent_log(x->agent, "%s", x->error);
    if (x->callback != NULL)
        x->callback(x->arg, x, status);
}

/* Fails `x` with the message of kvx_errmsg(), and takes down the peers it read from: closing
 * their endpoints makes UCX cancel their pending gets now, so nothing refers to `x`
 * afterwards (and transfers sharing those peers fail too). Unlinked first, so that taking
 * the peers down does not come back to it. */
static void xfer_fail(kvx_xfer_t *x, kvx_status_t status)
{
    char reason[300];

    snprintf(x->error, sizeof(x->error), "%s", kvx_errmsg());
    snprintf(reason, sizeof(reason), "closed: read %" PRIu64 " failed", x->request_id);
    xfer_unlink(x);
    for (size_t i = 0; i < x->num_reads; i++)
        agent_peer_down(x->peers[i], reason, true);
    xfer_finish(x, status);
}

void agent_xfers_fail_peer(kvx_agent_t *agent, const kvx_peer_t *peer, const char *reason)
{
    kvx_xfer_t *x = agent->xfers;

    while (x != NULL) {
        bool uses = false;

        for (size_t i = 0; i < x->num_peers && !uses; i++)
            uses = x->peers[i] == peer;
        if (!uses) {
            x = x->next;
            continue;
        }
        error_set(KVX_ERR_IO, "read %" PRIu64 ": peer %s %s", x->request_id, peer->address, reason);
        xfer_fail(x, KVX_ERR_IO);
        x = agent->xfers; /* failing may have finished others: start over */
    }
}

/* Every get completed: notify each rank read from and each rank only notified, now that
 * the data is here, and complete. */
static void xfer_complete(kvx_xfer_t *x)
{
    struct notify note  = notify_done(x->request_id, x->agent->tp_rank);
    kvx_status_t status = transport_op_status(x->op, "get");

    x->stats.seconds = clock_seconds() - x->start;
    for (size_t i = 0; i < x->num_reads && status == KVX_OK; i++) {
        kvx_peer_t *peer = x->peers[i];

        if (peer->transports[0] == '\0') /* wired up by now: say what UCX chose */
            transport_ep_describe(peer->ep, peer->transports, sizeof(peer->transports));
    }
    for (size_t i = 0; i < x->num_peers && status == KVX_OK; i++)
        status = transport_am_send(x->agent->transport, x->peers[i]->ep, AGENT_AM_NOTIFY, &note,
                                   sizeof(note), (int)x->agent->timeout_ms);
    if (status != KVX_OK) {
        char what[400];

        x->agent->stats.notifications_failed++;
        snprintf(what, sizeof(what), "%s", kvx_errmsg());
        error_set(status, "read %" PRIu64 ": %s", x->request_id, what);
        xfer_fail(x, status);
        return;
    }
    for (size_t i = 0; i < x->num_peers; i++)
        agent_peer_unwant(x->peers[i], x->request_id); /* here: no more heartbeats for it */
    xfer_finish(x, status);
}

void agent_xfers_progress(kvx_agent_t *agent)
{
    kvx_xfer_t *x = agent->xfers;

    while (x != NULL) {
        kvx_xfer_t *next  = x->next;
        uint64_t unlinked = agent->xfers_unlinked;

        if (!transport_op_pending(x->op)) {
            xfer_complete(x);
        } else if (x->op->first_error != 0) {
            /* A get failed (the peer died, say), so the transfer cannot succeed, and with no
             * error mode on the endpoint its other gets may never complete: fail it now, not
             * at the deadline. */
            char what[300];

            snprintf(what, sizeof(what), "%s",
                     transport_op_status(x->op, "get") != KVX_OK ? kvx_errmsg() : "");
            error_set(KVX_ERR_IO, "read %" PRIu64 ": %s (%zu of %zu gets still pending)",
                      x->request_id, what, x->op->posted - x->op->completed, x->op->posted);
            xfer_fail(x, KVX_ERR_IO);
        } else if (clock_seconds() > x->deadline) {
            error_set(KVX_ERR_IO,
                      "read %" PRIu64 ": %zu of %zu gets still pending at the %" PRIu32
                      " ms deadline; the peers read from are closed",
                      x->request_id, x->op->posted - x->op->completed, x->op->posted,
                      agent->timeout_ms);
            xfer_fail(x, KVX_ERR_IO);
        } else {
            x = next;
            continue;
        }
        /* Failing one fails the others sharing its peers (and a callback may destroy
         * transfers): go on from `next` only if x was the one to leave the list. */
        x = agent->xfers_unlinked == unlinked + 1 ? next : agent->xfers;
    }
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

/* Copies the request's local ids, to report them if the transfer fails. */
static kvx_status_t xfer_groups_copy(kvx_xfer_t *x, const kvx_request_t *request)
{
    size_t total = 0;

    for (size_t g = 0; g < request->num_local_groups; g++)
        total += request->local[g].count;
    if (!buffer_reserve((void **)&x->groups, &x->groups_capacity, request->num_local_groups + 1,
                        sizeof(*x->groups)) ||
        !buffer_reserve((void **)&x->ids, &x->ids_capacity, total + 1, sizeof(*x->ids)))
        return error_no_memory("a transfer");
    x->num_groups = request->num_local_groups;
    total         = 0;
    for (size_t g = 0; g < x->num_groups; g++) {
        size_t n = request->local[g].count;

        if (n > 0)
            memcpy(x->ids + total, request->local[g].ids, n * sizeof(*x->ids));
        x->groups[g] = (kvx_group_ids_t){x->ids + total, n};
        total += n;
    }
    return KVX_OK;
}
/* A transfer object with its buffers: the agent's last finished one, or a new one. Per
 * request, posting then allocates nothing once the pool has objects of the sizes needed. */
static kvx_xfer_t *xfer_get(kvx_agent_t *agent)
{
    kvx_xfer_t *x = agent->xfer_pool;

    if (x != NULL) {
        agent->xfer_pool = x->next;
        agent->xfer_pooled--;
    } else if ((x = calloc(1, sizeof(*x))) == NULL) {
        return NULL;
    }
    if (x->op == NULL)
        x->op = calloc(1, sizeof(*x->op));
    else
        *x->op = (struct transport_op){0};
    *x = (kvx_xfer_t){.agent           = agent,
                      .op              = x->op,
                      .peers           = x->peers,
                      .peers_capacity  = x->peers_capacity,
                      .groups          = x->groups,
                      .groups_capacity = x->groups_capacity,
                      .ids             = x->ids,
                      .ids_capacity    = x->ids_capacity,
                      .status          = KVX_INPROGRESS};
    return x;
}

static void xfer_release(kvx_xfer_t *x)
{
    free(x->op);
    free(x->groups);
    free(x->ids);
    free(x->peers);
    free(x);
}

/* Back to the agent's pool, or freed. Operations a dead peer left pending keep their
 * completion counter, which the transport frees with the worker. */
static void xfer_free(kvx_xfer_t *x)
{
    kvx_agent_t *agent = x->agent;

    if (x->op != NULL && transport_op_pending(x->op)) {
        transport_op_release(agent->transport, x->op);
        x->op = NULL;
    }
    if (agent->xfer_pooled == XFER_POOL_MAX) {
        xfer_release(x);
        return;
    }
    x->next          = agent->xfer_pool;
    agent->xfer_pool = x;
    agent->xfer_pooled++;
}

void agent_xfers_free_pool(kvx_agent_t *agent)
{
    while (agent->xfer_pool != NULL) {
        kvx_xfer_t *x = agent->xfer_pool;

        agent->xfer_pool = x->next;
        xfer_release(x);
    }
    agent->xfer_pooled = 0;
}
/* The peers of a planned request: each read rank's, then the notify-only ranks' we know. */
static kvx_status_t xfer_peers_find(kvx_xfer_t *x, kvx_peer_t *const *peers, size_t num_peers)
{
    const kvx_pairs_t *pairs    = x->agent->pairs;
    const kvx_peer_plan_t *plan = peers[0]->plan;
    size_t reads                = kvx_pairs_num_reads(pairs);
    size_t notifies             = kvx_peer_plan_num_notifies(plan);

    if (!buffer_reserve((void **)&x->peers, &x->peers_capacity, reads + notifies + 1,
                        sizeof(*x->peers)))
        return error_no_memory("a transfer");
    for (size_t r = 0; r < reads; r++) {
        uint32_t rank;
        kvx_peer_t *peer;

        kvx_pairs_read(pairs, r, &rank, NULL);
        peer = agent_peer_of_rank(peers, num_peers, rank);
        if (peer == NULL)
            return error_set(KVX_ERR_INVALID,
                             "read: the request needs remote rank %" PRIu32
                             ", which is not among the %zu peers",
                             rank, num_peers);
        if (peer->ep == NULL)
            return error_set(KVX_ERR_IO,
                             "read: peer %s (rank %" PRIu32 ") is down (%s); connect again",
                             peer->address, rank, peer->down);
        x->peers[x->num_peers++] = peer;
    }
    x->num_reads = x->num_peers;
    for (size_t i = 0; i < notifies; i++) {
        kvx_peer_t *peer = agent_peer_of_rank(peers, num_peers, kvx_peer_plan_notify_rank(plan, i));

        if (peer != NULL && peer->ep != NULL)
            x->peers[x->num_peers++] = peer;
    }
    return KVX_OK;
}

kvx_status_t kvx_read_post(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                           uint64_t request_id, const kvx_request_t *request,
                           kvx_xfer_cb_t callback, void *arg, kvx_xfer_t **xfer_p)
{
    double entered = clock_seconds();
    kvx_pairs_stats_t stats;
    kvx_xfer_t *x;
    kvx_status_t status;

    if (agent == NULL || peers == NULL || num_peers == 0 || request == NULL || xfer_p == NULL)
        return error_set(KVX_ERR_INVALID, "read: agent, peers, request and result are required");
    status = kvx_peer_plan_request(peers[0]->plan, request, agent->pairs);
    if (status != KVX_OK)
        return status;
    x = xfer_get(agent);
    if (x == NULL)
        return error_no_memory("a transfer");
    x->request_id = request_id;
    x->callback   = callback;
    x->arg        = arg;
    status = x->op != NULL ? xfer_peers_find(x, peers, num_peers) : error_no_memory("a transfer");
    if (status == KVX_OK)
        status = xfer_groups_copy(x, request);
    if (status != KVX_OK) {
        xfer_free(x);
        return status;
    }
    kvx_pairs_stats(agent->pairs, &stats);
    x->stats    = (kvx_read_stats_t){stats.descriptors, stats.coalesced, stats.bytes, 0};
    x->start    = clock_seconds();
    x->deadline = x->start + agent->timeout_ms / 1e3;
    for (size_t r = 0; r < x->num_reads; r++) {
        size_t count;
        const kvx_pair_t *pairs          = kvx_pairs_read(agent->pairs, r, NULL, &count);
        kvx_peer_t *peer                 = x->peers[r];
        struct transport_targets targets = {agent->bases, peer->remote_bases, peer->rkeys, false};

        status = transport_rma_post(peer->ep, false, pairs, count, &targets, x->op);
        if (status != KVX_OK) {
            /* Some gets may be in flight: closing the peers cancels them before x goes. */
            char reason[300];

            snprintf(reason, sizeof(reason), "closed: posting read %" PRIu64 " failed: %s",
                     request_id, kvx_errmsg());
            for (size_t i = 0; i < x->num_reads; i++)
                agent_peer_down(x->peers[i], reason, true);
            error_set(status, "%s", reason + strlen("closed: "));
            xfer_free(x);
            return status;
        }
    }
    x->next = agent->xfers;
    if (agent->xfers != NULL)
        agent->xfers->prev = x;
    agent->xfers = x;
    *xfer_p      = x;
    for (size_t i = 0; i < x->num_peers; i++)
        x->peers[i]->last_used_ms = clock_ms();
    histogram_add(&agent->stats.post_us, (clock_seconds() - entered) * 1e6);
    return KVX_OK;
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

kvx_status_t kvx_xfer_wait(kvx_xfer_t *xfer)
{
    while (xfer->status == KVX_INPROGRESS) {
        while (transport_progress(xfer->agent->transport) > 0)
            ;
        agent_xfers_progress(xfer->agent);
        agent_peers_progress(xfer->agent);
    }
    if (xfer->status != KVX_OK)
        error_set(xfer->status, "%s", xfer->error);
    return xfer->status;
}

void kvx_xfer_destroy(kvx_xfer_t *xfer)
{
    if (xfer == NULL)
        return;
    if (xfer->status == KVX_INPROGRESS) {
        error_set(KVX_ERR_CANCELED, "read %" PRIu64 ": cancelled; the peers read from are closed",
                  xfer->request_id);
        xfer_fail(xfer, KVX_ERR_CANCELED);
    }
    xfer_free(xfer);
}

kvx_status_t kvx_read(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                      uint64_t request_id, const kvx_request_t *request, kvx_read_stats_t *stats_p)
{
    kvx_xfer_t *xfer;
    kvx_status_t status =
        kvx_read_post(agent, peers, num_peers, request_id, request, NULL, NULL, &xfer);

    if (status != KVX_OK)
        return status;
    status = kvx_xfer_wait(xfer);
    if (status == KVX_OK && stats_p != NULL)
        kvx_xfer_stats(xfer, stats_p);
    kvx_xfer_destroy(xfer);
    return status;
}

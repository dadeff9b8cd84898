/* agent_live.c: is a prefill peer alive? The decode side heartbeats each peer on the side
 * channel with the request ids it still wants (which keeps their leases alive over there),
 * and the answers say the peer lives and which instance it is. A peer is down after three
 * silent intervals, a transport error, a restart (another instance answers at its address),
 * or when it sat idle past the TTL; whatever was in flight with it fails at once. */
#include "agent.h"

#include "clock.h"
#include "error.h"

#include <zmq.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIVE_MISSED_INTERVALS 3 /* silent heartbeat intervals before a peer is dead */

/* Sends one heartbeat with `ids` without blocking: a stalled peer's queue fills up instead
 * (the high-water mark), and silence then declares it dead. */
static bool heartbeat_send(kvx_peer_t *peer, const uint64_t *ids, size_t count)
{
    kvx_agent_t *agent = peer->agent;
    bool sent          = zmq_send(peer->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) == 0 &&
                zmq_send(peer->dealer, AGENT_HEARTBEAT_REQUEST, strlen(AGENT_HEARTBEAT_REQUEST),
                         ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                zmq_send(peer->dealer, ids, count * sizeof(*ids), ZMQ_DONTWAIT) >= 0;

    if (sent) {
        agent->stats.heartbeats_sent++;
        peer->last_heartbeat_ms = clock_ms();
        if (peer->waiting_since_ms == 0)
            peer->waiting_since_ms = peer->last_heartbeat_ms;
        else
            agent->stats.heartbeats_missed++; /* the previous one is still unanswered */
    }
    return sent;
}

/* Takes `text` as a heartbeat answer if it is one ("kvx-alive INSTANCE ENGINE_ID"): the peer
 * answered, or, from another instance, restarted (the peer goes down). False when it is
 * something else. */
static bool answer_take(kvx_peer_t *peer, const void *text, size_t size)
{
    char engine[ALIVE_ENGINE_ID_SIZE];
    uint64_t instance;

    if (!alive_answer_parse(text, size, &instance, engine))
        return false;
    if (peer->instance == 0) {
        peer->instance = instance;
    } else if (instance != peer->instance) {
        char reason[200];

        snprintf(reason, sizeof(reason),
                 "restarted: instance %016" PRIx64 " answers where %016" PRIx64
                 " was (engine id \"%.64s\")",
                 instance, peer->instance, engine);
        agent_peer_down(peer, reason, true);
        return true;
    }
    peer->waiting_since_ms = 0;
    return true;
}

/* Receives one message from the peer's socket if one is waiting: the empty delimiter, then
 * the message (DEALER keeps the frames of one message together). */
static bool message_receive(kvx_peer_t *peer, zmq_msg_t *msg)
{
    zmq_msg_t delimiter;
    bool received;

    zmq_msg_init(&delimiter);
    received = zmq_msg_recv(&delimiter, peer->dealer, ZMQ_DONTWAIT) >= 0 &&
               zmq_msg_recv(msg, peer->dealer, ZMQ_DONTWAIT) >= 0;
    zmq_msg_close(&delimiter);
    return received;
}

/* Reads one message if one is waiting and takes it as a heartbeat answer; anything else (an
 * error text, garbage) is ignored. False when none was waiting or the peer went down. */
static bool answer_receive(kvx_peer_t *peer)
{
    zmq_msg_t msg;
    bool received;

    zmq_msg_init(&msg);
    received = message_receive(peer, &msg);
    if (received)
        answer_take(peer, zmq_msg_data(&msg), zmq_msg_size(&msg));
    zmq_msg_close(&msg);
    return received && peer->dealer != NULL;
}

kvx_status_t agent_peer_live_start(kvx_peer_t *peer)
{
    kvx_agent_t *agent = peer->agent;
    int high_water     = 8;    /* heartbeats queued for a stalled peer; more only repeat */
    int64_t max_answer = 4096; /* answers and push replies are short: a longer one is hostile */
    int linger         = 0;
    char endpoint[300];
    kvx_status_t status = agent_endpoint(peer->address, "peer", endpoint, sizeof(endpoint));

    if (status != KVX_OK)
        return status;
    peer->dealer = zmq_socket(agent->zmq, ZMQ_DEALER);
    if (peer->dealer == NULL ||
        zmq_setsockopt(peer->dealer, ZMQ_SNDHWM, &high_water, sizeof(high_water)) != 0 ||
        zmq_setsockopt(peer->dealer, ZMQ_MAXMSGSIZE, &max_answer, sizeof(max_answer)) != 0 ||
        zmq_setsockopt(peer->dealer, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_connect(peer->dealer, endpoint) != 0)
        return error_set(KVX_ERR_IO, "heartbeats: %s", zmq_strerror(zmq_errno()));
    heartbeat_send(peer, NULL, 0);
    /* The first answer names the instance; anything else it may send first is ignored. */
    for (uint64_t start = clock_ms(); peer->instance == 0;) {
        zmq_pollitem_t item = {.socket = peer->dealer, .events = ZMQ_POLLIN};

        if (clock_ms() - start > agent->timeout_ms)
            return error_set(KVX_ERR_IO, "no heartbeat answer within %" PRIu32 " ms",
                             agent->timeout_ms);
        if (zmq_poll(&item, 1, 10) > 0)
            answer_receive(peer);
    }
    peer->last_used_ms = clock_ms();
    peer->next         = agent->peers;
    if (agent->peers != NULL)
        agent->peers->prev = peer;
    agent->peers = peer;
    return KVX_OK;
}

void agent_peer_live_stop(kvx_peer_t *peer)
{
    kvx_agent_t *agent = peer->agent;

    if (peer->dealer != NULL)
        zmq_close(peer->dealer);
    peer->dealer = NULL;
    if (peer->prev != NULL)
        peer->prev->next = peer->next;
    else if (agent->peers == peer)
        agent->peers = peer->next;
    if (peer->next != NULL)
        peer->next->prev = peer->prev;
    peer->prev = peer->next = NULL;
}

void agent_peer_down(kvx_peer_t *peer, const char *reason, bool dead)
{
    kvx_agent_t *agent = peer->agent;

    if (peer->down[0] != '\0')
        return;
    snprintf(peer->down, sizeof(peer->down), "%s", reason);
    if (dead)
        agent->stats.peers_dead++;
    else
        agent->stats.peers_idle++;
    agent_log(agent, "peer %s (rank %" PRIu32 ") down: %s", peer->address, peer->tp_rank, reason);
    agent_xfers_fail_peer(agent, peer, reason);
    if (peer->ep != NULL) {
        transport_ep_destroy(agent->transport, peer->ep);
        peer->ep = NULL;
    }
    if (peer->dealer != NULL)
        zmq_close(peer->dealer);
    peer->dealer = NULL;
}

void agent_peers_progress(kvx_agent_t *agent)
{
    uint64_t now = clock_ms();

    if (now == agent->peers_checked_ms)
        return; /* once a millisecond is plenty, and keeps wait loops spinning on UCX */
    agent->peers_checked_ms = now;

    for (kvx_peer_t *peer = agent->peers; peer != NULL; peer = peer->next) {
        char reason[160];

        if (peer->dealer == NULL)
            continue; /* down */
        while (peer->dealer != NULL && answer_receive(peer))
            ;
        if (peer->dealer == NULL)
            continue; /* restarted */
        /* Silence counts from the oldest unanswered heartbeat, not the last answer: a caller
         * that did not progress for a while sent nothing, and missed nothing. */
        if (peer->waiting_since_ms != 0 &&
            now - peer->waiting_since_ms > (uint64_t)LIVE_MISSED_INTERVALS * agent->heartbeat_ms) {
            snprintf(reason, sizeof(reason),
                     "dead: no heartbeat answer for %" PRIu64 " ms (%d intervals of %" PRIu32
                     " ms)",
                     now - peer->waiting_since_ms, LIVE_MISSED_INTERVALS, agent->heartbeat_ms);
            agent_peer_down(peer, reason, true);
            continue;
        }
        /* Transfers mark their peers used when they post and finish; deadlines are far
         * shorter than the TTL, so none is in flight with a peer idle this long. */
        if (peer->num_wanted > 0)
            peer->last_used_ms = now;
        else if (now - peer->last_used_ms > agent->peer_ttl_ms) {
            snprintf(reason, sizeof(reason), "dropped: idle for %" PRIu64 " ms",
                     now - peer->last_used_ms);
            agent_peer_down(peer, reason, false);
            continue;
        }
        if (now - peer->last_heartbeat_ms >= agent->heartbeat_ms)
            heartbeat_send(peer, peer->wanted, peer->num_wanted);
    }
}

/* Adds `request_id` to the peer's wanted ids, once. */
static kvx_status_t peer_want(kvx_peer_t *peer, uint64_t request_id)
{
    for (size_t i = 0; i < peer->num_wanted; i++) {
        if (peer->wanted[i] == request_id)
            return KVX_OK;
    }
    if (peer->num_wanted == HEARTBEAT_MAX_IDS)
        return error_set(KVX_ERR_INVALID, "want: peer %s already has %d wanted requests",
                         peer->address, HEARTBEAT_MAX_IDS);
    if (peer->num_wanted == peer->wanted_capacity) {
        size_t capacity = peer->wanted_capacity > 0 ? 2 * peer->wanted_capacity : 16;
        uint64_t *grown = realloc(peer->wanted, capacity * sizeof(*grown));

        if (grown == NULL)
            return error_no_memory("wanted requests");
        peer->wanted          = grown;
        peer->wanted_capacity = capacity;
    }
    peer->wanted[peer->num_wanted++] = request_id;
    return KVX_OK;
}

void agent_peer_unwant(kvx_peer_t *peer, uint64_t request_id)
{
    for (size_t i = 0; i < peer->num_wanted; i++) {
        if (peer->wanted[i] == request_id) {
            peer->wanted[i] = peer->wanted[--peer->num_wanted]; /* order does not matter */
            return;
        }
    }
}

kvx_status_t kvx_want(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                      uint64_t request_id)
{
    kvx_status_t status = KVX_OK;

    if (agent == NULL || (peers == NULL && num_peers > 0))
        return error_set(KVX_ERR_INVALID, "want: agent and peers are required");
    for (size_t i = 0; i < num_peers && status == KVX_OK; i++)
        status = peer_want(peers[i], request_id);
    if (status != KVX_OK)
        kvx_unwant(agent, peers, num_peers, request_id); /* all or nothing */
    return status;
}

void kvx_unwant(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers, uint64_t request_id)
{
    (void)agent;
    for (size_t i = 0; peers != NULL && i < num_peers; i++)
        agent_peer_unwant(peers[i], request_id);
}

const char *kvx_peer_down_reason(const kvx_peer_t *peer)
{
    return peer->down[0] != '\0' ? peer->down : NULL;
}

kvx_status_t kvx_heartbeat(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                           const uint64_t *request_ids, size_t count)
{
    if (agent == NULL || (peers == NULL && num_peers > 0) || (request_ids == NULL && count > 0))
        return error_set(KVX_ERR_INVALID, "heartbeat: agent, peers and ids are required");
    if (count > HEARTBEAT_MAX_IDS)
        return error_set(KVX_ERR_INVALID, "heartbeat: %zu ids is more than %d", count,
                         HEARTBEAT_MAX_IDS);
    for (size_t i = 0; i < num_peers; i++) {
        if (peers[i]->dealer == NULL)
            return error_set(KVX_ERR_IO, "heartbeat: peer %s is down (%s); reconnect it",
                             peers[i]->address, peers[i]->down);
        if (!heartbeat_send(peers[i], request_ids, count))
            return error_set(KVX_ERR_IO, "heartbeat: peer %s: %s", peers[i]->address,
                             zmq_strerror(zmq_errno()));
    }
    return KVX_OK;
}

kvx_status_t agent_peer_request(kvx_peer_t *peer, const void *const *frames, const size_t *sizes,
                                size_t num_frames, void **reply_p, size_t *reply_size_p)
{
    kvx_agent_t *agent = peer->agent;
    uint64_t start     = clock_ms();
    bool sent          = true;
    char reason[160];

    if (peer->dealer == NULL)
        return error_set(KVX_ERR_IO, "peer %s (rank %" PRIu32 ") is down (%s); connect again",
                         peer->address, peer->tp_rank, peer->down);
    /* Never blocks: a stalled peer's queue is full, and its silence will declare it dead. */
    sent = zmq_send(peer->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) == 0;
    for (size_t i = 0; sent && i < num_frames; i++)
        sent = zmq_send(peer->dealer, frames[i], sizes[i],
                        ZMQ_DONTWAIT | (i + 1 < num_frames ? ZMQ_SNDMORE : 0)) >= 0;
    if (!sent)
        return error_set(KVX_ERR_IO, "peer %s: %s", peer->address, zmq_strerror(zmq_errno()));
    /* Wait while progressing our worker: a writer connecting back to us (push mode) needs our
     * side of UCX's wire-up. */
    while (clock_ms() - start < agent->timeout_ms && peer->dealer != NULL) {
        zmq_pollitem_t item = {.socket = peer->dealer, .events = ZMQ_POLLIN};
        zmq_msg_t msg;

        while (transport_progress(agent->transport) > 0)
            ;
        if (zmq_poll(&item, 1, 1) <= 0)
            continue;
        zmq_msg_init(&msg);
        if (message_receive(peer, &msg) &&
            !answer_take(peer, zmq_msg_data(&msg), zmq_msg_size(&msg))) {
            kvx_status_t status =
                agent_reply_copy(zmq_msg_data(&msg), zmq_msg_size(&msg), reply_p, reply_size_p);

            zmq_msg_close(&msg);
            return status;
        }
        zmq_msg_close(&msg);
    }
    if (peer->dealer == NULL)
        return error_set(KVX_ERR_IO, "peer %s went down waiting for an answer: %s", peer->address,
                         peer->down);
    /* A late reply would be taken for the next request's: the peer is down instead. */
    snprintf(reason, sizeof(reason), "dead: no answer to a request within %" PRIu32 " ms",
             agent->timeout_ms);
    agent_peer_down(peer, reason, true);
    return error_set(KVX_ERR_IO, "peer %s: %s", peer->address, reason);
}

/* peer.c: the decode side's prefill peers: the handshake, the kept side-channel socket with its
 * requests matched by id, heartbeats carrying the wanted request ids, and going down (three
 * silent intervals, a restart at the same address, the idle TTL, or a transfer's failure).
 * Fails no transfer itself: a peer that goes down is queued for xfer.c. */
#include "peer.h"

#include "clock.h"
#include "done_handles.h"
#include "error.h"
#include "hostport.h"
#include "invariant.h"
#include "notify.h"
#include "push_request.h"
#include "sidechan.h"
#include "wire.h"

#include <ctype.h>
#include <inttypes.h>
#include <stddef.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(WIRE_DONE_VERSION == NOTIFY_VERSION_READ, "the done version stated is the one read");

#define PEER_MISSED_INTERVALS 3    /* silent heartbeat intervals before a peer is dead */
#define PEER_SEND_HWM         1024 /* requests queued for a stalled peer; more fail at once */
#define PEER_MAX_PENDING      1024 /* requests awaiting their reply on one peer */
#define PEER_REPLIES_PER_TURN 64   /* replies taken from one peer in one turn */
#define PEER_PROGRESS_ROUNDS  64   /* UCX progress rounds of one connection in one turn */
#define HEARTBEAT_ID_FLAG     ((uint64_t)1 << 63) /* request ids of heartbeats */

struct pending {
    uint64_t id;
    peer_reply_cb_t on_reply;
    void *arg;
    bool by_message; /* sent as a message: its answer may come on the data plane */
    char *answer;    /* that answer, kept for the side-channel phase (peers_serve) */
    size_t answer_size;
};

/* What one handshake sets up; swapped in whole by a reconnect. */
struct peer_link {
    struct conn *conn;
    struct sidechan_client *client;
    uint64_t instance;
    bool push_registered; /* push_handle names our writer on the peer */
    uint8_t push_handle[PUSH_HANDLE_LEN];
    struct msg_mac *push_mac; /* its key: our push requests' tags on the data plane */
    bool done_handle_asked;  /* VERB_DONE_HANDLE sent on this link */
    bool done_handle_set;    /* done_handle is the peer's for our dones (done_handles.h) */
    bool done_handle_worked; /* a done sent with it was answered, not sent back: the peer knew it */
    uint8_t done_handle[DONE_HANDLE_LEN];
    struct msg_mac *done_mac; /* the handle's key: our dones' tags (msg_mac.h) */
    bool done_handle_replaced; /* done_handle_before is the one a second ask replaced */
    uint8_t done_handle_before[DONE_HANDLE_LEN]; /* answers to dones sent with it still come */
};

struct kvx_peer {
    struct core *core;
    char *address;
    struct peer_link link;
    struct loop_timer heartbeat;
    uint64_t waiting_since_ms; /* the oldest heartbeat not answered yet; 0: none */
    uint64_t last_used_ms;
    uint64_t next_id;
    struct pending *pending;
    size_t num_pending;
    size_t num_answered;            /* pending requests whose answer came on the data plane */
    size_t messages_awaited;        /* pending requests sent as messages whose answer has not come:
                                       the loop spins for them (peers_awaiting_answers) */
    struct heartbeat_entry *wanted; /* requests heartbeats carry, with their tokens */
    size_t num_wanted;
    size_t wanted_capacity;
    char down[256]; /* why it is down; "" while usable */
    kvx_status_t down_status;
    struct kvx_peer *prev; /* in core->peers while up */
    struct kvx_peer *next;
    struct kvx_peer *down_next;          /* in core->down */
    bool queued;                         /* in core->down: its transfers are still to fail */
    struct peer_push_wait *push_waiters; /* legs waiting for the push registration */
    uint64_t push_register_id;           /* the registration's request; 0: none under way */
};

static void heartbeat_fire(struct loop_timer *timer);

kvx_peer_t *peer_of_rank(kvx_peer_t *const *peers, size_t num_peers, uint32_t rank)
{
    for (size_t i = 0; i < num_peers; i++) {
        if (peers[i]->link.conn != NULL && peers[i]->link.conn->tp_rank == rank)
            return peers[i];
    }
    return NULL;
}

bool peer_is_down(const kvx_peer_t *peer)
{
    return peer->down[0] != '\0';
}

bool peer_is_queued(const kvx_peer_t *peer)
{
    return peer->queued;
}

struct core *peer_core(const kvx_peer_t *peer)
{
    return peer->core;
}

kvx_status_t peer_down_status(const kvx_peer_t *peer)
{
    return peer->down_status;
}

const char *peer_address(const kvx_peer_t *peer)
{
    return peer->address;
}

struct conn *peer_conn(kvx_peer_t *peer)
{
    return peer_is_down(peer) ? NULL : peer->link.conn;
}

uint32_t peer_rank(const kvx_peer_t *peer)
{
    return peer->link.conn != NULL ? peer->link.conn->tp_rank : 0;
}

void peer_touch(kvx_peer_t *peer)
{
    peer->last_used_ms = clock_ms();
}

/* Drops every pending request with the answers kept for them (a link replaced or freed). */
static void pending_clear(kvx_peer_t *peer)
{
    for (size_t i = 0; i < peer->num_pending; i++)
        free(peer->pending[i].answer);
    free(peer->pending);
    peer->pending          = NULL;
    peer->num_pending      = 0;
    peer->num_answered     = 0;
    peer->push_register_id = 0; /* its waiters' transfers fail or time out; a push registers anew */
}

static void link_close(struct core *core, struct peer_link *link)
{
    if (link->client != NULL) {
        loop_unwatch_fd(&core->loop, sidechan_client_fd(link->client));
        sidechan_client_destroy(link->client);
        link->client = NULL;
    }
    link->push_registered = false;
    msg_mac_destroy(link->push_mac);
    link->push_mac        = NULL;
    link->done_handle_set = false;
    msg_mac_destroy(link->done_mac);
    link->done_mac = NULL;
    if (link->conn != NULL) {
        loop_unwatch_fd(&core->loop, transport_conn_event_fd(link->conn->transport));
        conn_close(link->conn);
        link->conn = NULL;
    }
}

/* Sends one heartbeat with the wanted ids without blocking: a stalled peer's queue fills up
 * instead, and silence then declares it dead. */
static void heartbeat_send(kvx_peer_t *peer)
{
    struct core *core = peer->core;
    uint64_t id       = HEARTBEAT_ID_FLAG | ++peer->next_id;

    if (sidechan_client_send(peer->link.client, VERB_HEARTBEAT, id, peer->wanted,
                             peer->num_wanted * sizeof(*peer->wanted)) != KVX_OK)
        return;
    core->stats.heartbeats_sent++;
    if (peer->waiting_since_ms == 0)
        peer->waiting_since_ms = clock_ms();
    else
        core->stats.heartbeats_missed++; /* the previous one is still unanswered */
}

/* A heartbeat's answer ("kvx-alive INSTANCE ENGINE_ID"): the peer lives, or, when another
 * instance answers, it restarted and goes down. Anything else is ignored. */
static void answer_take(kvx_peer_t *peer, struct peer_link *link, const char *text, size_t size)
{
    char engine[ALIVE_ENGINE_ID_SIZE];
    char reason[200];
    uint64_t instance;

    if (!alive_answer_parse(text, size, &instance, engine))
        return;
    if (link->instance == 0)
        link->instance = instance;
    if (instance == link->instance) {
        peer->waiting_since_ms = 0;
        return;
    }
    snprintf(reason, sizeof(reason),
             "restarted: instance %016" PRIx64 " answers where %016" PRIx64
             " was (engine id \"%.64s\")",
             instance, link->instance, engine);
    peer_down(peer, KVX_ERR_PEER_DOWN, reason, PEER_DEAD);
}

/* Waits until `conn`'s data link (kvx's TCP links: transport_conn_ready) is up, or `deadline`. */
static kvx_status_t link_data_ready(struct transport_conn *conn, uint64_t deadline,
                                    uint32_t timeout_ms)
{
    bool ready          = false;
    kvx_status_t status = transport_conn_ready(conn, &ready);

    while (status == KVX_OK && !ready) {
        struct pollfd item = {.fd = transport_conn_event_fd(conn), .events = POLLIN};
        uint64_t now       = clock_ms();

        if (now >= deadline)
            return error_set(KVX_ERR_PEER_TIMEOUT, "its data link was not up within %" PRIu32
                                                   " ms", timeout_ms);
        transport_conn_progress(conn);
        if ((status = transport_conn_ready(conn, &ready)) != KVX_OK || ready)
            break;
        poll(&item, 1, deadline - now < 10 ? (int)(deadline - now) : 10);
    }
    return status;
}

/* The handshake into `link`: metadata, checks and plan, the transport connection, the kept
 * socket, and the first heartbeat answer (which names the instance), within the timeout. */
static kvx_status_t link_open(kvx_peer_t *peer, struct peer_link *link)
{
    struct core *core   = peer->core;
    uint64_t deadline   = clock_ms() + core->timeout_ms;
    void *bytes         = NULL;
    size_t size         = 0;
    kvx_status_t status = sidechan_fetch(core->zmq, peer->address, &core->keys, VERB_METADATA,
                                         KVX_MAX_METADATA_SIZE, core->timeout_ms, &bytes, &size);

    struct hostport hp;

    if (status == KVX_OK)
        status = hostport_resolve(peer->address, "peer", &hp);
    if (status == KVX_OK)
        status = conn_open(core->transport, hp.host, core->regions, core->tp_size, core->tp_rank,
                           KVX_MODE_PULL, bytes, size, &link->conn);
    free(bytes);
    if (status == KVX_OK)
        status = sidechan_client_create(core->zmq, peer->address, &core->keys, PEER_SEND_HWM,
                                        &link->client);
    if (status == KVX_OK)
        status = sidechan_client_send(link->client, VERB_HEARTBEAT, HEARTBEAT_ID_FLAG, peer->wanted,
                                      peer->num_wanted * sizeof(*peer->wanted));
    while (status == KVX_OK && link->instance == 0) {
        uint64_t now = clock_ms();
        uint64_t id;
        char *reply;

        if (now >= deadline) {
            status = error_set(KVX_ERR_PEER_TIMEOUT, "no heartbeat answer within %" PRIu32 " ms",
                               core->timeout_ms);
            break;
        }
        if (!sidechan_client_wait(link->client, (int)(deadline - now)) ||
            !sidechan_client_recv(link->client, &id, &reply, &size))
            continue;
        if (id == HEARTBEAT_ID_FLAG)
            answer_take(peer, link, reply, size);
        free(reply);
    }
    if (status == KVX_OK)
        status = link_data_ready(link->conn->transport, deadline, core->timeout_ms);
    if (status == KVX_OK)
        status = loop_watch_fd(&core->loop, sidechan_client_fd(link->client), true);
    if (status == KVX_OK)
        status = loop_watch_fd(&core->loop, transport_conn_event_fd(link->conn->transport), false);
    if (status != KVX_OK) {
        char what[768];

        snprintf(what, sizeof(what), "%s", kvx_errmsg());
        link_close(core, link);
        /* the steps' messages never name the peer (sidechan.h): this one does, once */
        return error_set(status, "peer %s: %s", peer->address, what);
    }
    return KVX_OK;
}

/* Up: in core->peers, heartbeated. */
static kvx_status_t peer_up(kvx_peer_t *peer)
{
    struct core *core = peer->core;

    peer->down[0]          = '\0';
    peer->waiting_since_ms = 0;
    peer->last_used_ms     = clock_ms();
    peer->next             = core->peers;
    peer->prev             = NULL;
    if (core->peers != NULL)
        core->peers->prev = peer;
    core->peers = peer;
    loop_info(&core->loop, "peer %s (rank %" PRIu32 ", instance %016" PRIx64 ") connected",
              peer->address, peer->link.conn->tp_rank, peer->link.instance);
    return loop_timer_start(&core->loop, &peer->heartbeat, clock_ms() + core->heartbeat_ms);
}

kvx_status_t peer_connect(struct core *core, const char *address, kvx_peer_t **peer_p)
{
    kvx_peer_t *peer = calloc(1, sizeof(*peer));
    kvx_status_t status;

    if (peer == NULL || (peer->address = strdup(address)) == NULL) {
        free(peer);
        return error_no_memory("a peer");
    }
    peer->core = core;
    loop_timer_init(&peer->heartbeat, heartbeat_fire);
    status = link_open(peer, &peer->link);
    if (status == KVX_OK && (status = peer_up(peer)) != KVX_OK) {
        peer_down(peer, KVX_ERR_PEER_DOWN, "could not start heartbeats", PEER_CLOSED);
        peer_down_next(core);
    }
    if (status != KVX_OK) {
        peer_free(peer);
        return status;
    }
    core->num_peers++;
    *peer_p = peer;
    return KVX_OK;
}

kvx_status_t peer_reconnect(kvx_peer_t *peer)
{
    struct peer_link link = {0};
    uint64_t old          = peer->link.instance;
    kvx_status_t status;

    /* issue 22 finding 6: one still queued would come back up while on core->down */
    KVX_ASSERT(peer_is_down(peer) && !peer->queued);
    status = link_open(peer, &link);
    if (status != KVX_OK)
        return status;
    link_close(peer->core, &peer->link);
    peer->link = link;
    pending_clear(peer);
    status = peer_up(peer);
    if (old != 0 && link.instance != old)
        loop_log(&peer->core->loop,
                 "peer %s restarted: instance %016" PRIx64 " replaces %016" PRIx64, peer->address,
                 link.instance, old);
    return status;
}

void peer_free(kvx_peer_t *peer)
{
    if (peer == NULL)
        return;
    KVX_ASSERT(!peer->queued);              /* the failed-peers phase would find it freed */
    KVX_ASSERT(peer->push_waiters == NULL); /* its transfers were cancelled first */
    loop_timer_stop(&peer->core->loop, &peer->heartbeat);
    link_close(peer->core, &peer->link);
    pending_clear(peer);
    free(peer->wanted);
    free(peer->address);
    free(peer);
}

void peer_down(kvx_peer_t *peer, kvx_status_t status, const char *reason, enum peer_down_kind kind)
{
    struct core *core = peer->core;

    if (peer_is_down(peer))
        return;
    snprintf(peer->down, sizeof(peer->down), "%s", reason);
    peer->down_status = status;
    if (kind == PEER_DEAD)
        core->stats.peers_dead++;
    else if (kind == PEER_IDLE)
        core->stats.peers_idle++;
    loop_log(&core->loop, "peer %s (rank %" PRIu32 ") down: %s", peer->address, peer_rank(peer),
             reason);
    loop_timer_stop(&core->loop, &peer->heartbeat);
    if (peer->link.client != NULL) {
        loop_unwatch_fd(&core->loop, sidechan_client_fd(peer->link.client));
        sidechan_client_destroy(peer->link.client);
        peer->link.client = NULL;
    }
    if (peer->prev != NULL)
        peer->prev->next = peer->next;
    else if (core->peers == peer)
        core->peers = peer->next;
    if (peer->next != NULL)
        peer->next->prev = peer->prev;
    peer->prev = peer->next = NULL;
    peer->down_next         = core->down;
    peer->queued            = true;
    core->down              = peer;
}

kvx_peer_t *peer_down_next(struct core *core)
{
    kvx_peer_t *peer = core->down;

    if (peer != NULL) {
        core->down      = peer->down_next;
        peer->down_next = NULL;
        peer->queued    = false;
    }
    return peer;
}

void peer_close_conn(kvx_peer_t *peer)
{
    struct conn *conn = peer->link.conn;

    if (conn == NULL)
        return;
    loop_unwatch_fd(&peer->core->loop, transport_conn_event_fd(conn->transport));
    conn_close(conn);
    peer->link.conn = NULL;
}

/* Every heartbeat_ms: dead after three silent intervals, dropped after the idle TTL, or sent
 * another heartbeat. Silence counts from the oldest unanswered heartbeat, not the last
 * answer: a caller that did not progress for a while sent nothing, and missed nothing. */
static void heartbeat_fire(struct loop_timer *timer)
{
    kvx_peer_t *peer  = (kvx_peer_t *)((char *)timer - offsetof(kvx_peer_t, heartbeat));
    struct core *core = peer->core;
    uint64_t now      = clock_ms();
    char reason[160];

    if (peer->waiting_since_ms != 0 &&
        now - peer->waiting_since_ms > (uint64_t)PEER_MISSED_INTERVALS * core->heartbeat_ms) {
        snprintf(reason, sizeof(reason),
                 "dead: no heartbeat answer for %" PRIu64 " ms (%d intervals of %" PRIu32 " ms)",
                 now - peer->waiting_since_ms, PEER_MISSED_INTERVALS, core->heartbeat_ms);
        peer_down(peer, KVX_ERR_PEER_TIMEOUT, reason, PEER_DEAD);
        return;
    }
    if (peer->num_wanted > 0 || peer->num_pending > 0)
        peer->last_used_ms = now;
    else if (now - peer->last_used_ms > core->peer_ttl_ms) {
        snprintf(reason, sizeof(reason), "dropped: idle for %" PRIu64 " ms",
                 now - peer->last_used_ms);
        peer_down(peer, KVX_ERR_PEER_DOWN, reason, PEER_IDLE);
        return;
    }
    heartbeat_send(peer);
    loop_timer_start(&core->loop, timer, now + core->heartbeat_ms); /* fits: it was in */
}

/* Room for one more pending request, or why there is none. */
static kvx_status_t pending_room(kvx_peer_t *peer)
{
    if (peer->pending == NULL &&
        (peer->pending = calloc(PEER_MAX_PENDING, sizeof(*peer->pending))) == NULL)
        return error_no_memory("pending requests");
    if (peer->num_pending == PEER_MAX_PENDING)
        return error_set(KVX_ERR_INVALID, "peer %s: %d requests await their reply already",
                         peer->address, PEER_MAX_PENDING);
    return KVX_OK;
}

/* Request `id` sent (pending_room made room): its answer goes to `on_reply`. */
static void pending_add(kvx_peer_t *peer, uint64_t id, peer_reply_cb_t on_reply, void *arg,
                        bool by_message, uint64_t *id_p)
{
    peer->pending[peer->num_pending++] = (struct pending){id, on_reply, arg, by_message, NULL, 0};
    peer->messages_awaited += by_message;
    peer->last_used_ms = clock_ms();
    *id_p              = id;
}

kvx_status_t peer_request_send(kvx_peer_t *peer, const char *verb, const void *body, size_t size,
                               peer_reply_cb_t on_reply, void *arg, uint64_t *id_p)
{
    uint64_t id = ++peer->next_id;
    kvx_status_t status;

    if (peer_is_down(peer))
        return error_set(peer->down_status, "peer %s is down (%s); reconnect it", peer->address,
                         peer->down);
    status = pending_room(peer);
    if (status == KVX_OK &&
        (status = sidechan_client_send(peer->link.client, verb, id, body, size)) != KVX_OK)
        status = error_set(status, "peer %s: %s", peer->address, kvx_errmsg());
    if (status != KVX_OK)
        return status;
    pending_add(peer, id, on_reply, arg, false, id_p);
    return KVX_OK;
}

/* Sends `body` framed as a data-plane request (push_request.h) as message `am_id` on our
 * connection to the peer's main worker, pending as a side-channel request is, and the loop
 * spins for its answer, microseconds away; false when it does not fit one message (nothing
 * sent). */
static bool message_send(kvx_peer_t *peer, unsigned am_id, const void *body, size_t size,
                         peer_reply_cb_t on_reply, void *arg, uint64_t *id_p,
                         kvx_status_t *status_p)
{
    uint8_t message[PUSH_AM_MAX];
    uint64_t id   = peer->next_id + 1;
    size_t framed = push_am_request_frame(id, body, size, message);
    kvx_status_t status;

    if (framed == 0)
        return false;
    status = pending_room(peer);
    if (status == KVX_OK &&
        (status = transport_msg_send(peer->link.conn->transport, am_id, message, framed)) != KVX_OK)
        status = error_set(status, "peer %s: %s", peer->address, kvx_errmsg());
    *status_p = status;
    if (status == KVX_OK) {
        peer->next_id = id;
        pending_add(peer, id, on_reply, arg, true, id_p);
    }
    return true;
}

/* A push request as the data plane carries it: [tag][request], the tag under our writer's key
 * (msg_mac.h), into `out`; false without a key, or when it does not fit. */
static bool push_tagged(kvx_peer_t *peer, const void *body, size_t size, uint8_t out[PUSH_AM_MAX])
{
    if (peer->link.push_mac == NULL || size > PUSH_AM_MAX - MSG_MAC_LEN ||
        msg_mac_tag(peer->link.push_mac, body, size, out) != KVX_OK)
        return false;
    memcpy(out + MSG_MAC_LEN, body, size);
    return true;
}

kvx_status_t peer_push_send(kvx_peer_t *peer, const void *body, size_t size,
                            peer_reply_cb_t on_reply, void *arg, uint64_t *id_p)
{
    uint8_t tagged[PUSH_AM_MAX];
    kvx_status_t status;

    /* the side channel for a prefill agent that does not take messages (an older kvx), and
     * for a request too large for one */
    if (peer->core->push_side_channel || peer_is_down(peer) || peer->link.conn == NULL ||
        !peer->link.conn->metadata->push_messages || !push_tagged(peer, body, size, tagged) ||
        !message_send(peer, CORE_AM_PUSH_REQUEST, tagged, MSG_MAC_LEN + size, on_reply, arg, id_p,
                      &status))
        return peer_request_send(peer, VERB_PUSH, body, size, on_reply, arg, id_p);
    return status;
}

/* Removes pending request `id`; false when there was none. The caller frees taken->answer. */
static bool pending_take(kvx_peer_t *peer, uint64_t id, struct pending *taken)
{
    for (size_t i = 0; i < peer->num_pending; i++) {
        if (peer->pending[i].id == id) {
            *taken           = peer->pending[i];
            peer->pending[i] = peer->pending[--peer->num_pending]; /* order does not matter */
            peer->num_answered -= taken->answer != NULL;
            peer->messages_awaited -= taken->by_message && taken->answer == NULL;
            return true;
        }
    }
    return false;
}

void peer_request_forget(kvx_peer_t *peer, uint64_t id)
{
    struct pending taken;

    if (pending_take(peer, id, &taken))
        free(taken.answer);
}

/* Hands the answers that came on the data plane to their requests, one at a time: a reply
 * callback may forget other pending requests of this peer. */
static size_t answers_deliver(kvx_peer_t *peer)
{
    size_t taken = 0;

    while (peer->num_answered > 0) {
        struct pending pending;
        size_t i = 0;

        while (peer->pending[i].answer == NULL)
            i++;
        if (!pending_take(peer, peer->pending[i].id, &pending))
            break; /* cannot happen: it was found above */
        pending.on_reply(pending.arg, pending.answer, pending.answer_size);
        free(pending.answer);
        taken++;
    }
    return taken;
}

/* Keeps an answer that came as a message for the pending request it names, of the peer whose
 * push handle (or done handle, `done`) it carries: only that prefill knows the handle, so
 * anything else changes nothing. */
static void answer_keep(struct core *core, const void *data, size_t size, bool done)
{
    struct push_am_answer answer;

    if (!push_am_answer_parse(data, size, &answer)) {
        core->stats.notifications_dropped++;
        return;
    }
    for (kvx_peer_t *peer = core->peers; peer != NULL; peer = peer->next) {
        struct peer_link *link = &peer->link;

        bool current =
            link->done_handle_set && auth_equal(link->done_handle, answer.handle, DONE_HANDLE_LEN);

        if (done ? !current &&
                       (!link->done_handle_replaced ||
                        !auth_equal(link->done_handle_before, answer.handle, DONE_HANDLE_LEN))
                 : !link->push_registered ||
                       !auth_equal(link->push_handle, answer.handle, PUSH_HANDLE_LEN))
            continue;
        for (size_t i = 0; i < peer->num_pending; i++) {
            struct pending *p = &peer->pending[i];

            if (p->id != answer.id || !p->by_message || p->answer != NULL ||
                (done && answer.bytes != NULL))
                continue;
            if (done && current &&
                (answer.text_size != strlen(DONE_ANSWER_RESEND) ||
                 memcmp(answer.text, DONE_ANSWER_RESEND, answer.text_size) != 0))
                link->done_handle_worked = true;
            /* the text, a NUL, then a bytes answer's bytes: the push's to place (xfer.c) */
            if ((p->answer = malloc(answer.text_size + 1 + answer.bytes_size)) == NULL)
                return; /* its deadline answers for it */
            memcpy(p->answer, answer.text, answer.text_size);
            p->answer[answer.text_size] = '\0';
            if (answer.bytes != NULL)
                memcpy(p->answer + answer.text_size + 1, answer.bytes, answer.bytes_size);
            p->answer_size = answer.text_size + (answer.bytes != NULL ? 1 + answer.bytes_size : 0);
            peer->num_answered++;
            peer->messages_awaited--;
            return;
        }
    }
    core->stats.notifications_dropped++;
}

void peers_push_answer(struct core *core, const void *data, size_t size)
{
    answer_keep(core, data, size, false);
}

void peers_done_answer(struct core *core, const void *data, size_t size)
{
    answer_keep(core, data, size, true);
}

/* Hands over the answers that came as messages and, with `socket`, takes the replies waiting
 * on the peer's socket. */
static size_t peer_serve(kvx_peer_t *peer, bool socket)
{
    size_t taken = answers_deliver(peer);

    while (socket && taken < PEER_REPLIES_PER_TURN && peer->link.client != NULL) {
        struct pending pending;
        uint64_t id;
        char *reply;
        size_t size;

        if (!sidechan_client_recv(peer->link.client, &id, &reply, &size))
            break;
        taken++;
        if (reply != NULL && (id & HEARTBEAT_ID_FLAG))
            answer_take(peer, &peer->link, reply, size);
        else if (reply != NULL && pending_take(peer, id, &pending))
            pending.on_reply(pending.arg, reply, size);
        free(reply); /* a reply to nothing we asked, or malformed: ignored */
    }
    if (socket && peer->link.client != NULL && sidechan_client_closed(peer->link.client)) {
        peer_down(peer, KVX_ERR_PEER_DOWN,
                  "closed: its side-channel connection closed (the process exited or was "
                  "killed, or it dropped us)",
                  PEER_DEAD);
        taken++;
    }
    return taken;
}

size_t peers_serve(struct core *core, bool sockets)
{
    size_t taken = 0;

    for (kvx_peer_t *peer = core->peers, *next; peer != NULL; peer = next) {
        next = peer->next; /* a restart takes the peer out of the list */
        taken += peer_serve(peer, sockets);
    }
    return taken;
}

unsigned peers_progress(struct core *core)
{
    unsigned events = 0;

    for (kvx_peer_t *peer = core->peers; peer != NULL; peer = peer->next) {
        /* issue 22 finding 6: a peer in the list is up, with its connection */
        KVX_ASSERT(!peer_is_down(peer) && !peer->queued && peer->link.conn != NULL);
        for (int round = 0; round < PEER_PROGRESS_ROUNDS &&
                            transport_conn_progress(peer->link.conn->transport) > 0;
             round++)
            events++;
    }
    return events;
}

bool peers_awaiting_answers(const struct core *core)
{
    for (const kvx_peer_t *peer = core->peers; peer != NULL; peer = peer->next) {
        if (peer->messages_awaited > 0)
            return true;
    }
    return false;
}

bool peers_busy(struct core *core)
{
    bool busy = false;

    for (kvx_peer_t *peer = core->peers; peer != NULL; peer = peer->next) {
        /* every one is armed, even once one is found busy: arming is what makes it wake us */
        if (!transport_conn_arm(peer->link.conn->transport))
            busy = true;
        if (sidechan_client_readable(peer->link.client))
            busy = true;
    }
    return busy;
}

size_t peers_sockets(struct core *core, void **sockets, size_t max)
{
    size_t n = 0;

    for (kvx_peer_t *peer = core->peers; peer != NULL && n + 1 < max; peer = peer->next) {
        sockets[n++] = sidechan_client_socket(peer->link.client);
        sockets[n++] = sidechan_client_monitor(peer->link.client);
    }
    return n;
}

/* Adds `request_id` to the peer's wanted ids, once (a new token replaces the old). */
static kvx_status_t peer_want(kvx_peer_t *peer, uint64_t request_id, const kvx_token_t *token)
{
    struct heartbeat_entry entry = {.request_id = request_id};

    if (token != NULL)
        entry.token = *token;
    for (size_t i = 0; i < peer->num_wanted; i++) {
        if (peer->wanted[i].request_id == request_id) {
            peer->wanted[i] = entry;
            return KVX_OK;
        }
    }
    if (peer->num_wanted == HEARTBEAT_MAX_IDS)
        return error_set(KVX_ERR_INVALID, "want: peer %s already has %d wanted requests",
                         peer->address, HEARTBEAT_MAX_IDS);
    if (peer->num_wanted == peer->wanted_capacity) {
        size_t capacity               = peer->wanted_capacity > 0 ? 2 * peer->wanted_capacity : 16;
        struct heartbeat_entry *grown = realloc(peer->wanted, capacity * sizeof(*grown));

        if (grown == NULL)
            return error_no_memory("wanted requests");
        peer->wanted          = grown;
        peer->wanted_capacity = capacity;
    }
    peer->wanted[peer->num_wanted++] = entry;
    return KVX_OK;
}

void peer_unwant(kvx_peer_t *peer, uint64_t request_id)
{
    for (size_t i = 0; i < peer->num_wanted; i++) {
        if (peer->wanted[i].request_id == request_id) {
            peer->wanted[i] = peer->wanted[--peer->num_wanted]; /* order does not matter */
            return;
        }
    }
}

kvx_status_t kvx_want(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                      uint64_t request_id, const kvx_token_t *token)
{
    kvx_status_t status = KVX_OK;

    if (agent == NULL || (peers == NULL && num_peers > 0))
        return error_set(KVX_ERR_INVALID, "want: agent and peers are required");
    for (size_t i = 0; i < num_peers && status == KVX_OK; i++)
        status = peer_want(peers[i], request_id, token);
    if (status != KVX_OK)
        kvx_unwant(agent, peers, num_peers, request_id); /* all or nothing */
    return status;
}

void kvx_unwant(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers, uint64_t request_id)
{
    (void)agent;
    for (size_t i = 0; peers != NULL && i < num_peers; i++)
        peer_unwant(peers[i], request_id);
}

kvx_status_t kvx_heartbeat(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                           const uint64_t *request_ids, const kvx_token_t *tokens, size_t count)
{
    struct heartbeat_entry *entries;
    kvx_status_t status = KVX_OK;

    if (agent == NULL || (peers == NULL && num_peers > 0) || (request_ids == NULL && count > 0))
        return error_set(KVX_ERR_INVALID, "heartbeat: agent, peers and ids are required");
    if (count > HEARTBEAT_MAX_IDS)
        return error_set(KVX_ERR_INVALID, "heartbeat: %zu ids is more than %d", count,
                         HEARTBEAT_MAX_IDS);
    entries = calloc(count > 0 ? count : 1, sizeof(*entries));
    if (entries == NULL)
        return error_no_memory("a heartbeat");
    for (size_t i = 0; i < count; i++) {
        entries[i].request_id = request_ids[i];
        if (tokens != NULL)
            entries[i].token = tokens[i];
    }
    for (size_t i = 0; i < num_peers && status == KVX_OK; i++) {
        kvx_peer_t *peer = peers[i];

        if (peer_is_down(peer)) {
            status = error_set(peer->down_status, "heartbeat: peer %s is down (%s); reconnect it",
                               peer->address, peer->down);
            break;
        }
        status = sidechan_client_send(peer->link.client, VERB_HEARTBEAT,
                                      HEARTBEAT_ID_FLAG | ++peer->next_id, entries,
                                      count * sizeof(*entries));
        if (status != KVX_OK)
            status = error_set(status, "heartbeat: peer %s: %s", peer->address, kvx_errmsg());
        else
            peer->core->stats.heartbeats_sent++;
    }
    free(entries);
    return status;
}

_Static_assert(PUSH_HANDLE_LEN == 16 && DONE_HANDLE_LEN == 16, "handles are parsed alike");

/* A done message's body: the done handle, the done's tag, then a version-3 done (notify.h). */
#define DONE_MESSAGE_BODY (DONE_MESSAGE_HEAD + sizeof(struct notify_read))

/* `size` bytes in hex at `hex` into `out`; false unless every digit is one. */
static bool hex_parse(const char *hex, uint8_t *out, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        unsigned byte;

        if (!isxdigit((unsigned char)hex[2 * i]) || !isxdigit((unsigned char)hex[2 * i + 1]) ||
            sscanf(hex + 2 * i, "%2x", &byte) != 1)
            return false;
        out[i] = (uint8_t)byte;
    }
    return true;
}

/* "PREFIX HEX" (REPLY_REGISTERED): the 16-byte handle; "PREFIX HEX HEX" (REPLY_DONE_HANDLE,
 * `key` not NULL): the handle and its 32-byte key; false for anything else. */
static bool handle_parse(const char *answer, const char *prefix, uint8_t handle[16],
                         uint8_t key[MSG_MAC_KEY_LEN])
{
    size_t n      = strlen(prefix);
    size_t length = 2 * 16 + (key != NULL ? 1 + 2 * MSG_MAC_KEY_LEN : 0);

    if (strncmp(answer, prefix, n) != 0 || answer[n] != ' ' || strlen(answer + n + 1) != length)
        return false;
    answer += n + 1;
    return hex_parse(answer, handle, 16) &&
           (key == NULL || (answer[2 * 16] == ' ' && hex_parse(answer + 2 * 16 + 1, key,
                                                                 MSG_MAC_KEY_LEN)));
}

/* A done message's body (the link's done handle, then a version-3 done) into `body`, where
 * the peer takes dones as messages and gave this link a handle; false where it does not. */
static bool done_message_body(kvx_peer_t *peer, uint64_t request_id, const kvx_token_t *token,
                              uint64_t bytes, uint8_t body[DONE_MESSAGE_BODY])
{
    struct notify_read note = notify_done_read(request_id, peer->core->tp_rank, token, bytes);
    const struct conn *conn = peer_conn(peer);

    if (conn == NULL || peer->core->done_side_channel || !conn->metadata->done_messages ||
        conn->metadata->done_version < NOTIFY_VERSION_READ || !peer->link.done_handle_set)
        return false;
    memcpy(body, peer->link.done_handle, DONE_HANDLE_LEN);
    memcpy(body + DONE_MESSAGE_HEAD, &note, sizeof(note));
    return msg_mac_tag(peer->link.done_mac, body + DONE_MESSAGE_HEAD, sizeof(note),
                       body + DONE_HANDLE_LEN) == KVX_OK;
}

bool peer_done_frame(kvx_peer_t *peer, uint64_t request_id, const kvx_token_t *token,
                     uint64_t bytes, peer_reply_cb_t on_reply, void *arg, uint64_t *id_p,
                     uint8_t *out, size_t capacity, size_t *size_p)
{
    uint8_t body[DONE_MESSAGE_BODY];
    uint8_t message[PUSH_AM_MAX];
    uint64_t id = peer->next_id + 1;
    size_t framed;

    if (peer_is_down(peer) || !done_message_body(peer, request_id, token, bytes, body) ||
        pending_room(peer) != KVX_OK)
        return false;
    framed = push_am_request_frame(id, body, sizeof(body), message);
    if (framed == 0 || framed > capacity)
        return false;
    memcpy(out, message, framed);
    peer->next_id = id;
    pending_add(peer, id, on_reply, arg, true, id_p);
    *size_p = framed;
    return true;
}

/* The answer to VERB_DONE_HANDLE: our dones to the peer go as messages from now on. One that
 * replaces a handle (asked again) keeps the one before for the answers still on their way. */
static void done_handle_reply(void *arg, const char *reply, size_t size)
{
    struct peer_link *link = &((kvx_peer_t *)arg)->link;
    uint8_t handle[DONE_HANDLE_LEN];
    uint8_t key[MSG_MAC_KEY_LEN];
    struct msg_mac *mac = NULL;
    bool parsed         = handle_parse(reply, REPLY_DONE_HANDLE, handle, key) &&
                  msg_mac_create(key, &mac) == KVX_OK;

    (void)size;
    if (link->done_handle_set) {
        memcpy(link->done_handle_before, link->done_handle, DONE_HANDLE_LEN);
        link->done_handle_replaced = true;
    }
    msg_mac_destroy(link->done_mac);
    link->done_mac = mac;
    if (parsed)
        memcpy(link->done_handle, handle, DONE_HANDLE_LEN);
    link->done_handle_set    = parsed;
    link->done_handle_worked = false;
}

kvx_status_t peer_send_done(kvx_peer_t *peer, uint64_t request_id, const kvx_token_t *token,
                            uint64_t bytes, bool side_channel, peer_reply_cb_t on_reply, void *arg,
                            uint64_t *id_p)
{
    struct notify_read note = notify_done_read(request_id, peer->core->tp_rank, token, bytes);
    const struct conn *conn = peer_conn(peer);
    struct peer_link *link  = &peer->link;
    uint8_t body[DONE_MESSAGE_BODY];
    kvx_status_t status;
    uint64_t id;

    if (peer_is_down(peer) || conn == NULL)
        return error_set(peer->down_status, "peer %s is down (%s)", peer->address, peer->down);
    if (conn->metadata->done_version < NOTIFY_VERSION_READ) { /* an older kvx: version 2 only */
        note.done = notify_done(request_id, peer->core->tp_rank, token);
        return peer_request_send(peer, VERB_DONE, &note.done, sizeof(note.done), on_reply, arg,
                                 id_p);
    }
    /* On the data plane once the peer gave this link a handle; the first done asks for it. */
    if (!side_channel && !peer->core->done_side_channel && conn->metadata->done_messages) {
        if (done_message_body(peer, request_id, token, bytes, body)) {
            if (message_send(peer, CORE_AM_DONE, body, sizeof(body), on_reply, arg, id_p, &status))
                return status;
        } else if (!link->done_handle_asked &&
                   peer_request_send(peer, VERB_DONE_HANDLE, NULL, 0, done_handle_reply, peer,
                                     &id) == KVX_OK) {
            link->done_handle_asked = true; /* asked once a link: without it, the side channel */
        }
    }
    /* Sent back after our handle had worked: the prefill may have freed its slot (issue 36
     * finding 6: the connection it was issued to closed, or a table full of open ones handed
     * it on), and would send back every done of ours for good. Ask again, once per handle that
     * worked, so that a prefill that sends every done back cannot make us ask in a loop. */
    if (side_channel && link->done_handle_worked &&
        peer_request_send(peer, VERB_DONE_HANDLE, NULL, 0, done_handle_reply, peer, &id) == KVX_OK)
        link->done_handle_worked = false;
    return peer_request_send(peer, VERB_DONE, &note, sizeof(note), on_reply, arg, id_p);
}

void peers_forward_proof(struct core *core, const struct push_proof *proof)
{
    /* only a peer we are registering with gets it back, on its own authenticated socket */
    for (kvx_peer_t *peer = core->peers; peer != NULL; peer = peer->next) {
        if (peer->push_register_id != 0 && peer->link.instance == proof->instance)
            sidechan_client_send(peer->link.client, VERB_PUSH_PROOF, 0, proof->nonce,
                                 sizeof(proof->nonce));
    }
}

/* The registration's answer (from the side-channel phase): the handle, or why not, to every
 * leg waiting for it. */
static void push_answer_take(void *arg, const char *reply, size_t size)
{
    kvx_peer_t *peer            = arg;
    struct peer_push_wait *wait = peer->push_waiters;
    kvx_status_t status         = KVX_OK;
    uint8_t key[MSG_MAC_KEY_LEN];

    (void)size;
    peer->push_register_id = 0;
    peer->push_waiters     = NULL;
    msg_mac_destroy(peer->link.push_mac);
    peer->link.push_mac = NULL;
    if (handle_parse(reply, REPLY_REGISTERED, peer->link.push_handle, key) &&
        msg_mac_create(key, &peer->link.push_mac) == KVX_OK) {
        peer->link.push_registered = true;
    } else {
        bool refused = strncmp(reply, REPLY_ERROR, strlen(REPLY_ERROR)) == 0;

        status = error_set(refused ? KVX_ERR_PEER_REFUSED : KVX_ERR_IO,
                           "peer %s: push registration: %.600s", peer->address,
                           reply + (refused ? strlen(REPLY_ERROR) : 0));
    }
    while (wait != NULL) {
        struct peer_push_wait *next = wait->next;

        if (wait->waiting) { /* not cancelled while an earlier one's ready ran */
            wait->waiting = false;
            wait->ready(wait, status, status == KVX_OK ? peer->link.push_handle : NULL);
        }
        wait = next;
    }
}

kvx_status_t peer_push_handle(kvx_peer_t *peer, const void *metadata, size_t size,
                              struct peer_push_wait *wait, const uint8_t **handle_p)
{
    struct peer_link *link = &peer->link;

    if (link->push_registered) {
        *handle_p = link->push_handle;
        return KVX_OK;
    }
    if (peer->push_register_id == 0) {
        /* ours naming the worker of our connection to this peer: its writer writes there */
        kvx_status_t status = link->conn != NULL
                                  ? conn_push_metadata(link->conn, metadata, size, &metadata, &size)
                                  : error_set(KVX_ERR_PEER_DOWN, "peer %s: not connected",
                                              peer->address);

        if (status == KVX_OK)
            status = peer_request_send(peer, VERB_PUSH_REGISTER, metadata, size,
                                       push_answer_take, peer, &peer->push_register_id);
        if (status != KVX_OK)
            return status;
    }
    wait->next         = peer->push_waiters;
    wait->waiting      = true;
    peer->push_waiters = wait;
    return KVX_INPROGRESS;
}

void peer_push_wait_cancel(kvx_peer_t *peer, struct peer_push_wait *wait)
{
    for (struct peer_push_wait **at = &peer->push_waiters; *at != NULL; at = &(*at)->next) {
        if (*at == wait) {
            *at = wait->next;
            break;
        }
    }
    wait->waiting = false; /* also when push_answer_take holds the list: it skips this one */
    /* nobody waits for it now: a later push registers afresh */
    if (peer->push_waiters == NULL && peer->push_register_id != 0) {
        peer_request_forget(peer, peer->push_register_id);
        peer->push_register_id = 0;
    }
}

void peer_push_forget(kvx_peer_t *peer)
{
    peer->link.push_registered = false;
}

const char *kvx_peer_down_reason(const kvx_peer_t *peer)
{
    return peer_is_down(peer) ? peer->down : NULL;
}

const char *kvx_peer_transports(const kvx_peer_t *peer)
{
    const struct conn *conn = peer->link.conn;

    return conn != NULL && conn->transports[0] != '\0' ? conn->transports : peer->core->transports;
}

/* gate.c: the ZAP handler and the accounting of the listening socket's connections, served
 * from the agent's loop; the monitor's thread (gate_monitor.c) names each accepted one.
 *
 * What the events say, and what they do not (ZeroMQ 4.3, one I/O thread, the default):
 * "accepted" and "disconnected" carry the descriptor; "handshake succeeded" and "handshake
 * failed" carry none. A failure during the handshake emits its "failed" event and then, in
 * the same call of the I/O thread, its "disconnected": that ties a failure to its descriptor.
 * A connection refused by ZAP ("failed: auth") and an authenticated one both close with a
 * bare "disconnected". So the counts of open, admitted and in-handshake connections are exact
 * from the events; which descriptor is admitted is not, and is kept per source address: ZAP
 * names the address it allows, and the gate marks one connection of that address admitted. */
#include "gate.h"

#include "clock.h"
#include "error.h"
#include "gate_monitor.h"
#include "zsocket.h"

#include <zmq.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define GATE_ZAP_ENDPOINT "inproc://zeromq.zap.01" /* RFC 27's fixed name */
#define GATE_MAX_LOGGED   256 /* addresses a refusal was logged for */
#define GATE_UNNAMED_MS   60000 /* refusals of peers gone before they were named: one line a minute */
#define GATE_MAX_FRAMES                                                                            \
    8 /* a ZAP request: version, id, domain, address, identity,                                    \
         mechanism and at most one credential */
/* Events read a serve, then ZAP requests: every "accepted" before a connection's ZAP request
 * is read first, unless more than this many wait. */
#define GATE_EVENTS_PER_SERVE 256
#define GATE_ZAP_PER_SERVE    64

struct gate_connection {
    int fd;
    uint64_t cookie;      /* SO_COOKIE when accepted (gate_monitor.h); 0: it was gone */
    uint64_t accepted_ms; /* clock_ms */
    uint64_t heard_ms;    /* clock_ms of its last request (gate_heard), else accepted_ms */
    bool admitted;        /* counted as authenticated (marked when ZAP allowed its address) */
    bool closing;         /* shut by the gate in its handshake: its failure is counted already */
    bool evicted;         /* authenticated, shut by the gate for a newcomer (connection_evict) */
    char address[GATE_ADDRESS_SIZE]; /* "": not known */
};

struct gate {
    void *zmq;
    void *zap;
    struct gate_monitor *monitor;
    struct auth_keys keys;
    struct gate_limits limits;
    struct loop *loop;
    struct gate_counters counters;
    uint64_t open;         /* accepted and not disconnected */
    uint64_t auth_closing; /* refused by ZAP, their "disconnected" not seen yet */
    bool failure_pending;  /* a handshake failed: the next "disconnected" is its */
    /* ZAP allowances whose "handshake succeeded" has not come: their times, oldest first (a
     * ring of max_peers), so that a burst of handshakes cannot all pass max_peers at once */
    uint64_t *allowed_ms;
    size_t allowed_first;
    size_t num_allowed;
    struct gate_connection *tracked; /* max_peers + max_handshakes + GATE_TRACK_SLACK */
    size_t num_tracked;
    size_t max_tracked;
    char logged[GATE_MAX_LOGGED][GATE_ADDRESS_SIZE];
    size_t num_logged;
    uint64_t unnamed;         /* refusals of peers whose address was gone, not logged yet */
    uint64_t unnamed_log_ms;  /* when the last line about them was */
};

/* Connections past both bounds that are still tracked while their close comes through. */
#define GATE_TRACK_SLACK 64

static void *socket_open(void *zmq, int type)
{
    int linger   = 0;
    void *socket = zmq_socket(zmq, type);

    if (socket != NULL && zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger)) != 0) {
        zmq_close(socket);
        return NULL;
    }
    return socket;
}

kvx_status_t gate_create(void *zmq, const struct auth_keys *keys, const struct gate_limits *limits,
                         struct loop *loop, struct gate **gate_p)
{
    struct gate *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return error_no_memory("the side channel's gate");
    g->zmq         = zmq;
    g->keys        = *keys;
    g->limits      = *limits;
    g->loop        = loop;
    g->max_tracked = (size_t)limits->max_peers + limits->max_handshakes + GATE_TRACK_SLACK;
    g->tracked     = calloc(g->max_tracked, sizeof(*g->tracked));
    g->allowed_ms  = calloc(limits->max_peers, sizeof(*g->allowed_ms));
    if (g->tracked == NULL || g->allowed_ms == NULL) {
        gate_destroy(g);
        return error_no_memory("the side channel's gate");
    }
    g->zap = socket_open(zmq, ZMQ_REP);
    if (g->zap == NULL || zmq_bind(g->zap, GATE_ZAP_ENDPOINT) != 0) {
        kvx_status_t status =
            error_set(KVX_ERR_INTERNAL, "gate: the ZAP handler: %s", zmq_strerror(zmq_errno()));

        gate_destroy(g);
        return status;
    }
    *gate_p = g;
    return KVX_OK;
}

void gate_destroy(struct gate *gate)
{
    if (gate == NULL)
        return;
    gate_monitor_stop(gate->monitor);
    if (gate->zap != NULL)
        zmq_close(gate->zap);
    free(gate->tracked);
    free(gate->allowed_ms);
    free(gate);
}

kvx_status_t gate_watch(struct gate *gate, void *router)
{
    return gate_monitor_start(gate->zmq, router, &gate->monitor);
}

/* Counts a refusal, and logs it the first time `address` is refused. A peer whose address
 * was gone before the monitor's thread read it is counted, and such refusals are summed in
 * one line a minute at most, so that they neither fill the log nor take a logged slot. */
static void refused(struct gate *g, uint64_t *counter, const char *address, const char *why)
{
    uint64_t now = clock_ms();

    (*counter)++;
    if (address[0] == '\0') {
        g->unnamed++;
        if (g->unnamed_log_ms != 0 && now - g->unnamed_log_ms < GATE_UNNAMED_MS)
            return;
        loop_log(g->loop,
                 "side channel: refused %" PRIu64 " peer(s) that closed before the gate read "
                 "their address: %s (at most one such line a minute)",
                 g->unnamed, why);
        g->unnamed        = 0;
        g->unnamed_log_ms = now;
        return;
    }
    for (size_t i = 0; i < g->num_logged; i++) {
        if (strcmp(g->logged[i], address) == 0)
            return;
    }
    if (g->num_logged == GATE_MAX_LOGGED)
        return; /* counted only: the log is not the attacker's to fill */
    /* the slot is taken only by a line written: one dropped in a burst is written next time */
    if (loop_log(g->loop, "side channel: refused %s: %s (further refusals of it are counted only)",
                 address, why))
        snprintf(g->logged[g->num_logged++], GATE_ADDRESS_SIZE, "%s", address);
}

/* In its handshake, as far as the gate can tell. The admitted mark goes to one connection of
 * the allowed address, not always the one ZAP allowed: one whose mark went to a neighbour of
 * its address stays unmarked for its whole life. ZeroMQ ends every real handshake at
 * handshake_ms, so one unmarked for twice that is authenticated: neither cap counts or closes
 * it (closing the oldest would otherwise shut a live peer's connection). */
static bool is_handshaking(const struct gate *g, const struct gate_connection *c, uint64_t now)
{
    return !c->admitted && !c->closing &&
           now - c->accepted_ms <= 2 * (uint64_t)g->limits.handshake_ms;
}

/* The oldest connection of `address` (any, when NULL) still in its handshake; NULL if none. */
static struct gate_connection *oldest_handshake(struct gate *g, const char *address)
{
    struct gate_connection *oldest = NULL;
    uint64_t now                   = clock_ms();

    for (size_t i = 0; i < g->num_tracked; i++) {
        struct gate_connection *c = &g->tracked[i];

        if (is_handshaking(g, c, now) && (address == NULL || strcmp(c->address, address) == 0) &&
            (oldest == NULL || c->accepted_ms < oldest->accepted_ms))
            oldest = c;
    }
    return oldest;
}

static size_t handshakes_of(const struct gate *g, const char *address)
{
    uint64_t now = clock_ms();
    size_t n     = 0;

    for (size_t i = 0; i < g->num_tracked; i++)
        n += is_handshaking(g, &g->tracked[i], now) &&
             (address == NULL || strcmp(g->tracked[i].address, address) == 0);
    return n;
}

/* Ends `c`'s handshake: ZeroMQ reads the end of the stream, reports the failure and closes
 * it. Only if its descriptor still holds the socket that was accepted (the cookie): one that
 * closed meanwhile may be a newer connection's descriptor already. */
static void handshake_close(struct gate *g, struct gate_connection *c, const char *why)
{
    if (c->cookie != 0 && gate_monitor_cookie(c->fd) == c->cookie)
        shutdown(c->fd, SHUT_RDWR);
    c->closing = true;
    refused(g, &g->counters.handshakes_refused, c->address, why);
}

/* A connection accepted: tracked, then held to the per-source cap and to max_handshakes. Past
 * either, the oldest handshake closes (of the source's, for its cap, so that a source only
 * crowds out itself): silent sockets are the oldest, and an honest handshake takes
 * milliseconds, so a flood must open a bound's worth of connections in that time to close one.
 * Closing the newest instead would let a source's silent sockets lock every later peer at
 * that address (a host, or a NAT) out. */
static void connection_accepted(struct gate *g, const struct gate_event *e)
{
    char why[96];
    struct gate_connection *c;

    g->open++;
    if (g->num_tracked == g->max_tracked) { /* past both bounds and the slack: closed */
        struct gate_connection untracked = {.fd = (int)e->value, .cookie = e->cookie};

        snprintf(untracked.address, sizeof(untracked.address), "%s", e->address);
        handshake_close(g, &untracked, "too many connections in their handshake");
        return;
    }
    c  = &g->tracked[g->num_tracked++];
    *c = (struct gate_connection){.fd = (int)e->value, .cookie = e->cookie,
                                  .accepted_ms = clock_ms(), .heard_ms = clock_ms()};
    snprintf(c->address, sizeof(c->address), "%s", e->address);
    if (c->address[0] != '\0' && handshakes_of(g, c->address) > g->limits.per_source) {
        snprintf(why, sizeof(why), "its handshake was its address's oldest of more than %" PRIu32,
                 g->limits.per_source);
        handshake_close(g, oldest_handshake(g, c->address), why);
    } else if (handshakes_of(g, NULL) > g->limits.max_handshakes) {
        snprintf(why, sizeof(why), "its handshake was the oldest of more than %" PRIu32,
                 g->limits.max_handshakes);
        handshake_close(g, oldest_handshake(g, NULL), why);
    }
}

/* Moves one admitted mark of `address` to `to_admitted`'s value: when a marked connection
 * turns out to be still in its handshake (it failed), the authenticated one of that address
 * is another; when an unmarked one closes authenticated, a marked one of it is not. */
static void mark_move(struct gate *g, const char *address, bool to_admitted)
{
    for (size_t i = 0; address[0] != '\0' && i < g->num_tracked; i++) {
        struct gate_connection *c = &g->tracked[i];

        if (!c->closing && c->admitted != to_admitted && strcmp(c->address, address) == 0) {
            c->admitted = to_admitted;
            return;
        }
    }
}

static void connection_closed(struct gate *g, int fd)
{
    struct gate_connection c = {.fd = fd, .address = ""};
    bool found               = false;
    bool failed              = g->failure_pending;

    for (size_t i = 0; i < g->num_tracked; i++) {
        if (g->tracked[i].fd == fd) {
            c              = g->tracked[i];
            g->tracked[i]  = g->tracked[--g->num_tracked];
            found          = true;
            break;
        }
    }
    g->failure_pending = false;
    if (g->open > 0)
        g->open--;
    if (failed) { /* it was in its handshake */
        if (c.admitted)
            mark_move(g, c.address, true);
        if (!c.closing)
            refused(g, &g->counters.auth_refused, c.address,
                    g->keys.curve ? "its handshake failed or did not finish in time (no auth "
                                    "key, another one, or not kvx)"
                                  : "its handshake failed or did not finish in time");
        return;
    }
    if (found && !c.admitted && g->auth_closing > 0) { /* one ZAP refused */
        g->auth_closing--;
        return;
    }
    if (!found && g->auth_closing > 0) {
        g->auth_closing--;
        return;
    }
    if (g->counters.connections > 0)
        g->counters.connections--;
    if (found && !c.admitted)
        mark_move(g, c.address, false);
}

static void handshake_succeeded(struct gate *g)
{
    g->counters.connections++;
    if (g->num_allowed > 0) {
        g->allowed_first = (g->allowed_first + 1) % g->limits.max_peers;
        g->num_allowed--;
    }
}

static void event_serve(struct gate *g, const struct gate_event *e)
{
    switch (e->event) {
    case ZMQ_EVENT_ACCEPTED:
        connection_accepted(g, e);
        break;
    case ZMQ_EVENT_DISCONNECTED:
        connection_closed(g, (int)e->value);
        break;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        handshake_succeeded(g);
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        g->auth_closing++;
        break;
    default: /* failed: no detail, or protocol */
        g->failure_pending = true;
        break;
    }
    g->counters.handshakes =
        g->open > g->counters.connections ? g->open - g->counters.connections : 0;
}

static bool frame_is(zmq_msg_t *frame, const char *text)
{
    return zmq_msg_size(frame) == strlen(text) &&
           memcmp(zmq_msg_data(frame), text, zmq_msg_size(frame)) == 0;
}

/* Allowances older than two handshake intervals have succeeded (and were counted) or died. */
static size_t allowances_pending(struct gate *g)
{
    uint64_t now = clock_ms();

    while (g->num_allowed > 0 &&
           now - g->allowed_ms[g->allowed_first] > 2 * (uint64_t)g->limits.handshake_ms) {
        g->allowed_first = (g->allowed_first + 1) % g->limits.max_peers;
        g->num_allowed--;
    }
    return g->num_allowed;
}

/* Authenticated as far as the gate can tell, and not being shut. */
static bool is_peer(const struct gate *g, const struct gate_connection *c, uint64_t now)
{
    return !c->closing && !c->evicted && !is_handshaking(g, c, now);
}

/* Authenticated connections of `address` open now. */
static size_t peers_of(const struct gate *g, const char *address, uint64_t now)
{
    size_t n = 0;

    for (size_t i = 0; i < g->num_tracked; i++)
        n += is_peer(g, &g->tracked[i], now) && strcmp(g->tracked[i].address, address) == 0;
    return n;
}

/* Evicted connections whose close has not come through yet: still in counters.connections. */
static uint64_t evictions_pending(const struct gate *g)
{
    uint64_t n = 0;

    for (size_t i = 0; i < g->num_tracked; i++)
        n += g->tracked[i].evicted;
    return n;
}

/* A full listener makes room for a newcomer from `address` by closing the connection heard
 * from least recently of the address that holds the most, if that address holds at least two
 * more than the newcomer's: no source can keep others out by holding every slot (issue 36
 * finding 7: an insider's 64 idle connections refused every new peer), and two sources never
 * take a slot back and forth. A source's own connections still fill its share: a newcomer
 * from the busiest address is refused. Whoever holds the slot taken loses that connection (its
 * transfers fail; an honest decode agent reconnects on its next request). True when one was
 * closed. */
static bool connection_evict(struct gate *g, const char *address)
{
    uint64_t now                         = clock_ms();
    size_t newcomer                      = peers_of(g, address, now);
    size_t most                          = 0;
    const struct gate_connection *source = NULL;
    struct gate_connection *victim       = NULL;

    for (size_t i = 0; i < g->num_tracked; i++) { /* the address that holds the most */
        size_t n;

        if (!is_peer(g, &g->tracked[i], now) || g->tracked[i].address[0] == '\0')
            continue;
        n = peers_of(g, g->tracked[i].address, now);
        if (n > most) {
            most   = n;
            source = &g->tracked[i];
        }
    }
    if (source == NULL || most < newcomer + 2)
        return false;
    for (size_t i = 0; i < g->num_tracked; i++) { /* its connection heard from least recently */
        struct gate_connection *c = &g->tracked[i];

        if (is_peer(g, c, now) && strcmp(c->address, source->address) == 0 &&
            (victim == NULL || c->heard_ms < victim->heard_ms))
            victim = c;
    }
    if (victim->cookie != 0 && gate_monitor_cookie(victim->fd) == victim->cookie)
        shutdown(victim->fd, SHUT_RDWR);
    victim->evicted = true;
    g->counters.peers_evicted++;
    loop_log(g->loop,
             "side channel: closed the connection of %s heard from least recently (%" PRIu64
             " ms ago; %zu open from there) to admit one from %s: max_peers (%" PRIu32
             ") were open",
             victim->address, now - victim->heard_ms, most, address, g->limits.max_peers);
    return true;
}

void gate_heard(struct gate *gate, int fd)
{
    for (size_t i = 0; fd >= 0 && i < gate->num_tracked; i++) {
        if (gate->tracked[i].fd == fd) {
            gate->tracked[i].heard_ms = clock_ms();
            return;
        }
    }
}

/* Whether a ZAP request from `address` may pass, and why not. */
static const char *zap_check(struct gate *g, const char *address, zmq_msg_t *frames, int count,
                             uint64_t **counter_p)
{
    uint64_t evicted;
    uint64_t open;

    *counter_p = &g->counters.auth_refused;
    if (g->keys.curve) {
        if (count != 7 || !frame_is(&frames[5], "CURVE"))
            return "it offered no CURVE key";
        if (zmq_msg_size(&frames[6]) != sizeof(g->keys.client_public_raw) ||
            !auth_equal(zmq_msg_data(&frames[6]), g->keys.client_public_raw,
                        sizeof(g->keys.client_public_raw)))
            return "its CURVE key is not the auth key's";
    } else if (count != 6 || !frame_is(&frames[5], "NULL")) {
        return "this insecure side channel speaks only ZeroMQ's NULL mechanism";
    }
    *counter_p = &g->counters.peers_refused;
    evicted = evictions_pending(g);
    open    = g->counters.connections > evicted ? g->counters.connections - evicted : 0;
    if (open + allowances_pending(g) >= g->limits.max_peers && !connection_evict(g, address))
        return "max_peers authenticated connections are open, and no address holds two more "
               "of them than this one";
    return NULL;
}

/* Records an allowance of `address`: counted until its handshake succeeds, and one of the
 * address's connections in their handshake marked admitted. */
static void allowed(struct gate *g, const char *address)
{
    struct gate_connection *c = oldest_handshake(g, address);

    g->allowed_ms[(g->allowed_first + g->num_allowed) % g->limits.max_peers] = clock_ms();
    g->num_allowed++; /* < max_peers: zap_check refused otherwise */
    if (c != NULL)
        c->admitted = true;
    loop_info(g->loop, "side channel: admitted a connection from %s",
              address[0] != '\0' ? address : "an address gone already");
}

/* Answers one ZAP request: [version][request id][domain][address][identity][mechanism]
 * [credentials...] gets [version][request id][status code][status text][user id][metadata]. */
static bool zap_serve(struct gate *g)
{
    zmq_msg_t frames[GATE_MAX_FRAMES];
    int count = zsocket_receive(g->zap, frames, GATE_MAX_FRAMES);
    uint64_t *counter;
    const char *why;
    char address[GATE_ADDRESS_SIZE];

    if (count == 0)
        return false;
    if (count < 6 || !frame_is(&frames[0], "1.0")) { /* not from libzmq: cannot happen */
        zsocket_frames_close(frames, count, GATE_MAX_FRAMES);
        return true;
    }
    snprintf(address, sizeof(address), "%.*s", (int)zmq_msg_size(&frames[3]),
             (const char *)zmq_msg_data(&frames[3]));
    why = zap_check(g, address, frames, count, &counter);
    if (why != NULL)
        refused(g, counter, address, why);
    else
        allowed(g, address);
    zmq_send(g->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(g->zap, zmq_msg_data(&frames[1]), zmq_msg_size(&frames[1]), ZMQ_SNDMORE);
    zmq_send(g->zap, why == NULL ? "200" : "400", 3, ZMQ_SNDMORE);
    zmq_send(g->zap, why == NULL ? "OK" : "refused", why == NULL ? 2 : 7, ZMQ_SNDMORE);
    zmq_send(g->zap, "kvx", 3, ZMQ_SNDMORE);
    zmq_send(g->zap, "", 0, 0);
    zsocket_frames_close(frames, count, GATE_MAX_FRAMES);
    return true;
}

size_t gate_serve(struct gate *gate)
{
    size_t handled = 0;
    struct gate_event e;

    /* events first: a connection's "accepted" was sent before its ZAP request */
    while (gate->monitor != NULL && handled < GATE_EVENTS_PER_SERVE &&
           gate_monitor_next(gate->monitor, &e)) {
        event_serve(gate, &e);
        handled++;
    }
    for (size_t n = 0; n < GATE_ZAP_PER_SERVE && zap_serve(gate); n++)
        handled++;
    return handled;
}

size_t gate_sockets(struct gate *gate, void *sockets[2])
{
    size_t n = 0;

    sockets[n++] = gate->zap;
    if (gate->monitor != NULL)
        sockets[n++] = gate_monitor_socket(gate->monitor);
    return n;
}

bool gate_readable(struct gate *gate)
{
    return zsocket_readable(gate->zap) ||
           (gate->monitor != NULL && zsocket_readable(gate_monitor_socket(gate->monitor)));
}

const struct gate_counters *gate_counters(const struct gate *gate)
{
    return &gate->counters;
}

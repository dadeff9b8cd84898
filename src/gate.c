/* gate.c: the ZAP handler and the listening socket's monitor, served from the agent's loop.
 * ZeroMQ's I/O thread (one, the default) emits a connection's "handshake failed" event and
 * then, in the same call, its "disconnected" event, which carries the descriptor: that is how
 * a failure is tied to the address the descriptor was accepted from. */
#include "gate.h"

#include "error.h"
#include "zsocket.h"

#include <zmq.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define GATE_ZAP_ENDPOINT     "inproc://zeromq.zap.01" /* RFC 27's fixed name */
#define GATE_MONITOR_ENDPOINT "inproc://kvx-gate-monitor"
#define GATE_MAX_TRACKED      4096 /* connections whose address is known; more are counted */
#define GATE_MAX_LOGGED       256  /* addresses a refusal was logged for */
#define GATE_ADDRESS_SIZE     64
#define GATE_MAX_FRAMES                                                                            \
    8 /* a ZAP request: version, id, domain, address, identity,                                    \
         mechanism and at most one credential */
#define GATE_PER_SERVE 64

struct gate_connection {
    int fd;
    char address[GATE_ADDRESS_SIZE];
};

struct gate {
    void *zmq;
    void *zap;
    void *monitor;
    struct auth_keys keys;
    uint32_t max_connections;
    struct loop *loop;
    struct gate_counters counters;
    bool failure_pending; /* a handshake failed: the next "disconnected" names it */
    struct gate_connection tracked[GATE_MAX_TRACKED];
    size_t num_tracked;
    char logged[GATE_MAX_LOGGED][GATE_ADDRESS_SIZE];
    size_t num_logged;
};

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

kvx_status_t gate_create(void *zmq, const struct auth_keys *keys, uint32_t max_connections,
                         struct loop *loop, struct gate **gate_p)
{
    struct gate *g = calloc(1, sizeof(*g));

    if (g == NULL)
        return error_no_memory("the side channel's gate");
    g->zmq             = zmq;
    g->keys            = *keys;
    g->max_connections = max_connections;
    g->loop            = loop;
    g->zap             = socket_open(zmq, ZMQ_REP);
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
    if (gate->monitor != NULL)
        zmq_close(gate->monitor);
    if (gate->zap != NULL)
        zmq_close(gate->zap);
    free(gate);
}

kvx_status_t gate_watch(struct gate *gate, void *router)
{
    int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;

    if (zmq_socket_monitor(router, GATE_MONITOR_ENDPOINT, events) != 0 ||
        (gate->monitor = socket_open(gate->zmq, ZMQ_PAIR)) == NULL ||
        zmq_connect(gate->monitor, GATE_MONITOR_ENDPOINT) != 0)
        return error_set(KVX_ERR_INTERNAL, "gate: monitor: %s", zmq_strerror(zmq_errno()));
    return KVX_OK;
}

/* The remote IP address of an accepted descriptor, "?" when the kernel does not say: it is
 * read when the gate serves the event, so a peer that closed already is refused as "?". */
static void address_of(int fd, char address[GATE_ADDRESS_SIZE])
{
    struct sockaddr_storage peer;
    socklen_t length = sizeof(peer);

    snprintf(address, GATE_ADDRESS_SIZE, "?");
    if (getpeername(fd, (struct sockaddr *)&peer, &length) != 0)
        return;
    if (peer.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&peer)->sin_addr, address, GATE_ADDRESS_SIZE);
    else if (peer.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&peer)->sin6_addr, address, GATE_ADDRESS_SIZE);
}

/* Counts a refusal, and logs it the first time `address` is refused. */
static void refused(struct gate *g, uint64_t *counter, const char *address, const char *why)
{
    (*counter)++;
    for (size_t i = 0; i < g->num_logged; i++) {
        if (strcmp(g->logged[i], address) == 0)
            return;
    }
    if (g->num_logged == GATE_MAX_LOGGED)
        return; /* counted only: the log is not the attacker's to fill */
    snprintf(g->logged[g->num_logged++], GATE_ADDRESS_SIZE, "%s", address);
    loop_log(g->loop, "side channel: refused %s: %s (further refusals of it are counted only)",
             address, why);
}

static void connection_closed(struct gate *g, int fd)
{
    char address[GATE_ADDRESS_SIZE] = "an address not tracked";

    for (size_t i = 0; i < g->num_tracked; i++) {
        if (g->tracked[i].fd == fd) {
            memcpy(address, g->tracked[i].address, sizeof(address));
            g->tracked[i] = g->tracked[--g->num_tracked];
            break;
        }
    }
    if (g->counters.connections > 0)
        g->counters.connections--;
    if (g->failure_pending)
        refused(g, &g->counters.auth_refused, address,
                g->keys.curve ? "its handshake failed (no auth key, or another one)"
                              : "its handshake failed");
    g->failure_pending = false;
}

/* One monitor event: [event: 2 bytes, value: 4 bytes][endpoint]. */
static bool monitor_read(struct gate *g)
{
    uint8_t head[6];
    uint16_t event;
    uint32_t value;
    int size = zmq_recv(g->monitor, head, sizeof(head), ZMQ_DONTWAIT);
    int more;
    size_t length = sizeof(more);

    if (size < 0)
        return false;
    /* drop the endpoint frame (and anything unexpected) */
    while (zmq_getsockopt(g->monitor, ZMQ_RCVMORE, &more, &length) == 0 && more) {
        char skip[8];

        zmq_recv(g->monitor, skip, sizeof(skip), ZMQ_DONTWAIT);
    }
    if (size != (int)sizeof(head))
        return true;
    memcpy(&event, head, sizeof(event));
    memcpy(&value, head + 2, sizeof(value));
    if (event == ZMQ_EVENT_ACCEPTED) {
        g->counters.connections++;
        if (g->num_tracked < GATE_MAX_TRACKED) {
            g->tracked[g->num_tracked].fd = (int)value;
            address_of((int)value, g->tracked[g->num_tracked++].address);
        }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
        connection_closed(g, (int)value);
    } else {
        g->failure_pending = true;
    }
    return true;
}

static bool frame_is(zmq_msg_t *frame, const char *text)
{
    return zmq_msg_size(frame) == strlen(text) &&
           memcmp(zmq_msg_data(frame), text, zmq_msg_size(frame)) == 0;
}

/* Whether a ZAP request may pass, and why not. */
static const char *zap_check(struct gate *g, zmq_msg_t *frames, int count, uint64_t **counter_p)
{
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
    if (g->counters.connections > g->max_connections)
        return "too many connections are open";
    return NULL;
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
    why = zap_check(g, frames, count, &counter);
    if (why != NULL)
        refused(g, counter, address, why);
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

    /* events first: a connection's "accepted" was sent before its ZAP request */
    while (gate->monitor != NULL && handled < GATE_PER_SERVE && monitor_read(gate))
        handled++;
    while (handled < 2 * GATE_PER_SERVE && zap_serve(gate))
        handled++;
    return handled;
}

size_t gate_sockets(struct gate *gate, void *sockets[2])
{
    size_t n = 0;

    sockets[n++] = gate->zap;
    if (gate->monitor != NULL)
        sockets[n++] = gate->monitor;
    return n;
}

bool gate_readable(struct gate *gate)
{
    return zsocket_readable(gate->zap) ||
           (gate->monitor != NULL && zsocket_readable(gate->monitor));
}

const struct gate_counters *gate_counters(const struct gate *gate)
{
    return &gate->counters;
}

/* sidechan.c: ZeroMQ ROUTER and DEALER sockets framed as sidechan.h says: every receive is
 * non-blocking and checked frame by frame, every send is ZMQ_DONTWAIT, and the one blocking
 * call (sidechan_fetch) polls its socket with a deadline. */
#include "sidechan.h"

#include "clock.h"
#include "error.h"
#include "gate.h"
#include "hostport.h"
#include "zsocket.h"

#include <zmq.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIDECHAN_MAX_FRAMES 5 /* identity, delimiter, verb, id, body */

struct sidechan_server {
    void *router;
    struct gate *gate; /* told which connection each request came by */
};

struct sidechan_client {
    void *dealer;
    void *monitor;      /* its connection's events: an authenticated one that closes */
    bool authenticated; /* a handshake succeeded */
};

/* Sets ZMQ_IPV6 on a socket whose endpoint is an IPv6 address: ZeroMQ refuses one without. */
static int socket_family_set(void *socket, const struct hostport *hp)
{
    int ipv6 = hp->ipv6;

    return ipv6 ? zmq_setsockopt(socket, ZMQ_IPV6, &ipv6, sizeof(ipv6)) : 0;
}

static void id_encode(uint64_t id, uint8_t bytes[8])
{
    for (int i = 0; i < 8; i++)
        bytes[i] = (uint8_t)(id >> (8 * i));
}

static uint64_t id_decode(const uint8_t bytes[8])
{
    uint64_t id = 0;

    for (int i = 7; i >= 0; i--)
        id = id << 8 | bytes[i];
    return id;
}

kvx_status_t sidechan_server_create(void *zmq, const char *listen,
                                    const struct sidechan_limits *limits,
                                    const struct auth_keys *keys, struct gate *gate, char *bound,
                                    size_t bound_size, struct sidechan_server **server_p)
{
    int linger          = 0;
    int high_water      = limits->recv_hwm;
    int64_t max_message = limits->max_message;
    int handshake_ms    = limits->handshake_ms;
    struct hostport hp;
    char *endpoint       = hp.endpoint;
    size_t endpoint_size = sizeof(hp.endpoint);
    kvx_status_t status  = hostport_resolve(listen, "listen", &hp);
    size_t length;
    struct sidechan_server *s;

    if (status != KVX_OK)
        return status;
    length = strlen(endpoint);
    if (length > 2 && strcmp(endpoint + length - 2, ":0") == 0)
        strcpy(endpoint + length - 1, "*"); /* ZeroMQ's spelling of "any free port" */
    s = calloc(1, sizeof(*s));
    if (s == NULL)
        return error_no_memory("a side channel");
    s->gate   = gate;
    s->router = zmq_socket(zmq, ZMQ_ROUTER);
    if (s->router == NULL ||
        zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &max_message, sizeof(max_message)) != 0 ||
        zmq_setsockopt(s->router, ZMQ_RCVHWM, &high_water, sizeof(high_water)) != 0 ||
        zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_setsockopt(s->router, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof(handshake_ms)) != 0 ||
        zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, "kvx", 3) != 0 ||
        socket_family_set(s->router, &hp) != 0 || auth_server_socket(s->router, keys) != KVX_OK ||
        gate_watch(gate, s->router) != KVX_OK || zmq_bind(s->router, endpoint) != 0 ||
        zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, endpoint, &endpoint_size) != 0) {
        status = error_set(KVX_ERR_IO, "listen %s: %s", listen, zmq_strerror(zmq_errno()));
        sidechan_server_destroy(s);
        return status;
    }
    snprintf(bound, bound_size, "%s", endpoint + strlen("tcp://"));
    *server_p = s;
    return KVX_OK;
}

void sidechan_server_destroy(struct sidechan_server *server)
{
    if (server == NULL)
        return;
    if (server->router != NULL)
        zmq_close(server->router);
    free(server);
}

int sidechan_server_fd(struct sidechan_server *server)
{
    return zsocket_fd(server->router);
}

void *sidechan_server_socket(struct sidechan_server *server)
{
    return server->router;
}

bool sidechan_server_readable(struct sidechan_server *server)
{
    return zsocket_readable(server->router);
}

void sidechan_reply(struct sidechan_server *server, const struct sidechan_origin *origin,
                    const void *data, size_t size)
{
    uint8_t id[8];

    id_encode(origin->id, id);
    if (zmq_send(server->router, origin->identity, origin->identity_size,
                 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return;
    zmq_send(server->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(server->router, id, sizeof(id), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(server->router, data, size, ZMQ_DONTWAIT);
}

uint64_t sidechan_origin_key(const struct sidechan_origin *origin)
{
    uint64_t key = 0xcbf29ce484222325u; /* FNV-1a */

    if (origin->identity_size < 8) { /* the size + 1 in the top byte: 1..8, so never 0 */
        key = (uint64_t)(origin->identity_size + 1) << 56;
        for (size_t i = 0; i < origin->identity_size; i++)
            key |= (uint64_t)origin->identity[i] << (8 * i);
        return key;
    }
    for (size_t i = 0; i < origin->identity_size; i++)
        key = (key ^ origin->identity[i]) * 0x100000001b3u;
    return key | (uint64_t)1 << 63; /* apart from the short ones, whose top byte is 1..8 */
}

static const struct sidechan_verb *verb_find(const struct sidechan_verb *verbs, size_t n,
                                             zmq_msg_t *frame)
{
    for (size_t i = 0; i < n; i++) {
        if (zmq_msg_size(frame) == strlen(verbs[i].name) &&
            memcmp(zmq_msg_data(frame), verbs[i].name, zmq_msg_size(frame)) == 0)
            return &verbs[i];
    }
    return NULL;
}

size_t sidechan_server_serve(struct sidechan_server *server, const struct sidechan_verb *verbs,
                             size_t num_verbs, void *arg, size_t max, uint64_t *malformed_p)
{
    size_t received = 0;

    while (received < max) {
        zmq_msg_t frames[SIDECHAN_MAX_FRAMES];
        int count = zsocket_receive(server->router, frames, SIDECHAN_MAX_FRAMES);
        struct sidechan_request request;
        const struct sidechan_verb *verb;

        if (count == 0)
            break;
        received++;
        /* identity, delimiter, verb, id, then the body if the verb has one */
        if (count < 4 || count > SIDECHAN_MAX_FRAMES || zmq_msg_size(&frames[1]) != 0 ||
            zmq_msg_size(&frames[0]) > SIDECHAN_MAX_IDENTITY || zmq_msg_size(&frames[3]) != 8) {
            (*malformed_p)++;
            zsocket_frames_close(frames, count, SIDECHAN_MAX_FRAMES);
            continue;
        }
        request.origin.identity_size = zmq_msg_size(&frames[0]);
        memcpy(request.origin.identity, zmq_msg_data(&frames[0]), request.origin.identity_size);
        request.origin.id = id_decode(zmq_msg_data(&frames[3]));
        request.fd        = zmq_msg_get(&frames[2], ZMQ_SRCFD);
        gate_heard(server->gate, request.fd);
        verb              = verb_find(verbs, num_verbs, &frames[2]);
        if (verb == NULL) {
            static const char unknown[] = "kvx-error unknown request";

            sidechan_reply(server, &request.origin, unknown, sizeof(unknown) - 1);
            (*malformed_p)++;
        } else if (count != (verb->body ? 5 : 4)) {
            static const char shape[] = "kvx-error wrong number of frames";

            sidechan_reply(server, &request.origin, shape, sizeof(shape) - 1);
            (*malformed_p)++;
        } else {
            request.body      = verb->body ? zmq_msg_data(&frames[4]) : NULL;
            request.body_size = verb->body ? zmq_msg_size(&frames[4]) : 0;
            verb->serve(arg, &request);
        }
        zsocket_frames_close(frames, count, SIDECHAN_MAX_FRAMES);
    }
    return received;
}

/* A monitor of `socket`'s connection and handshakes, so that a fetch nobody answers, or one
 * the peer refuses, fails at once with the reason instead of at its deadline (ZeroMQ would
 * only retry). */
static void *handshake_monitor(void *zmq, void *socket, int events)
{
    static unsigned long serial; /* agents may live on several threads: the name is atomic */
    char endpoint[64];
    int linger = 0;
    void *pair;

    snprintf(endpoint, sizeof(endpoint), "inproc://kvx-fetch-%lu",
             __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
    if (zmq_socket_monitor(socket, endpoint, events) != 0)
        return NULL;
    pair = zmq_socket(zmq, ZMQ_PAIR);
    if (pair != NULL && (zmq_setsockopt(pair, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
                         zmq_connect(pair, endpoint) != 0)) {
        zmq_close(pair);
        pair = NULL;
    }
    return pair;
}

/* A DEALER connected to `address`; with `monitor_p`, its monitor too, attached before the
 * connect: a monitor attached after it can miss the "connected" event on a loaded host, and
 * the peer's closing of that connection then reads as "connection refused". */
static kvx_status_t dealer_open(void *zmq, const char *address, const struct auth_keys *keys,
                                int send_hwm, int64_t max_reply, int events, void **monitor_p,
                                void **socket_p)
{
    int linger = 0;
    struct hostport hp;
    kvx_status_t status = hostport_resolve(address, "address", &hp);
    void *socket;
    void *monitor = NULL;

    if (status != KVX_OK)
        return status;
    socket = zmq_socket(zmq, ZMQ_DEALER);
    if (socket == NULL || zmq_setsockopt(socket, ZMQ_SNDHWM, &send_hwm, sizeof(send_hwm)) != 0 ||
        zmq_setsockopt(socket, ZMQ_MAXMSGSIZE, &max_reply, sizeof(max_reply)) != 0 ||
        zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        socket_family_set(socket, &hp) != 0 || auth_client_socket(socket, keys) != KVX_OK ||
        (monitor_p != NULL && (monitor = handshake_monitor(zmq, socket, events)) == NULL) ||
        zmq_connect(socket, hp.endpoint) != 0) {
        status = error_set(KVX_ERR_IO, "side channel: %s", zmq_strerror(zmq_errno()));
        if (monitor != NULL) {
            zmq_socket_monitor(socket, NULL, 0);
            zmq_close(monitor);
        }
        if (socket != NULL)
            zmq_close(socket);
        return status;
    }
    if (monitor_p != NULL)
        *monitor_p = monitor;
    *socket_p = socket;
    return KVX_OK;
}

kvx_status_t sidechan_client_create(void *zmq, const char *address, const struct auth_keys *keys,
                                    int send_hwm, struct sidechan_client **client_p)
{
    struct sidechan_client *c = calloc(1, sizeof(*c));
    kvx_status_t status;

    if (c == NULL)
        return error_no_memory("a side-channel socket");
    status = dealer_open(zmq, address, keys, send_hwm, SIDECHAN_MAX_REPLY,
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED, &c->monitor,
                         &c->dealer);
    if (status != KVX_OK) {
        free(c);
        return status;
    }
    *client_p = c;
    return KVX_OK;
}

void sidechan_client_destroy(struct sidechan_client *client)
{
    if (client == NULL)
        return;
    zmq_socket_monitor(client->dealer, NULL, 0);
    zmq_close(client->monitor);
    zmq_close(client->dealer);
    free(client);
}

int sidechan_client_fd(struct sidechan_client *client)
{
    return zsocket_fd(client->dealer);
}

void *sidechan_client_socket(struct sidechan_client *client)
{
    return client->dealer;
}

bool sidechan_client_readable(struct sidechan_client *client)
{
    return zsocket_readable(client->dealer) || zsocket_readable(client->monitor);
}

void *sidechan_client_monitor(struct sidechan_client *client)
{
    return client->monitor;
}

bool sidechan_client_closed(struct sidechan_client *client)
{
    uint8_t head[6];
    uint16_t event;
    char skip[8];
    int more      = 0;
    size_t length = sizeof(more);

    while (zmq_recv(client->monitor, head, sizeof(head), ZMQ_DONTWAIT) == (int)sizeof(head)) {
        while (zmq_getsockopt(client->monitor, ZMQ_RCVMORE, &more, &length) == 0 && more)
            zmq_recv(client->monitor, skip, sizeof(skip), ZMQ_DONTWAIT);
        memcpy(&event, head, sizeof(event));
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            client->authenticated = true;
        else if (event == ZMQ_EVENT_DISCONNECTED && client->authenticated)
            return true;
    }
    return false;
}

bool sidechan_client_wait(struct sidechan_client *client, int timeout_ms)
{
    zmq_pollitem_t item = {.socket = client->dealer, .events = ZMQ_POLLIN};

    return zmq_poll(&item, 1, timeout_ms) > 0;
}

static kvx_status_t request_send(void *socket, const char *verb, uint64_t id, const void *body,
                                 size_t size, bool has_body)
{
    uint8_t bytes[8];
    bool sent;

    id_encode(id, bytes);
    sent =
        zmq_send(socket, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) == 0 &&
        zmq_send(socket, verb, strlen(verb), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
        zmq_send(socket, bytes, sizeof(bytes), ZMQ_DONTWAIT | (has_body ? ZMQ_SNDMORE : 0)) >= 0 &&
        (!has_body || zmq_send(socket, body, size, ZMQ_DONTWAIT) >= 0);
    return sent ? KVX_OK
                : error_set(KVX_ERR_PEER_DOWN, "side channel: %s", zmq_strerror(zmq_errno()));
}

kvx_status_t sidechan_client_send(struct sidechan_client *client, const char *verb, uint64_t id,
                                  const void *body, size_t size)
{
    return request_send(client->dealer, verb, id, body, size, true);
}

/* Takes one reply from `socket`: [delimiter][id][body]. */
static bool reply_receive(void *socket, uint64_t *id_p, char **body_p, size_t *size_p)
{
    zmq_msg_t frames[SIDECHAN_MAX_FRAMES];
    int count = zsocket_receive(socket, frames, SIDECHAN_MAX_FRAMES);
    char *copy;

    if (count == 0)
        return false;
    *id_p   = 0;
    *body_p = NULL;
    *size_p = 0;
    if (count == 3 && zmq_msg_size(&frames[0]) == 0 && zmq_msg_size(&frames[1]) == 8 &&
        (copy = malloc(zmq_msg_size(&frames[2]) + 1)) != NULL) {
        memcpy(copy, zmq_msg_data(&frames[2]), zmq_msg_size(&frames[2]));
        copy[zmq_msg_size(&frames[2])] = '\0';
        *id_p                          = id_decode(zmq_msg_data(&frames[1]));
        *body_p                        = copy;
        *size_p                        = zmq_msg_size(&frames[2]);
    }
    zsocket_frames_close(frames, count, SIDECHAN_MAX_FRAMES);
    return true;
}

bool sidechan_client_recv(struct sidechan_client *client, uint64_t *id_p, char **body_p,
                          size_t *size_p)
{
    return reply_receive(client->dealer, id_p, body_p, size_p);
}

/* Connections a fetch's peer may close before answering, each retried by ZeroMQ, before
 * the fetch calls that a refusal: a peer that refuses our mechanism may close before its
 * greeting says why (no handshake event then), and retries take ZeroMQ's reconnect interval
 * (100 ms); an honest peer closes a handshake only after its own bound (seconds). */
#define FETCH_CLOSES_REFUSED 3

/* The failure the next monitor event reports, as an error; KVX_OK when it reports none (or
 * none waits). A TCP connection made sets *connected_p. A connect retried before any was
 * made means the first one failed: refused (nothing listens at that port) or unreachable,
 * which ZeroMQ would retry forever; once connected, a retry follows a connection the peer
 * closed, which the handshake's events explain, or FETCH_CLOSES_REFUSED of them in a row, or
 * the deadline ends. The message does not name the peer: the caller's does (link_open wraps
 * every step's). */
static kvx_status_t monitor_failure(void *monitor, bool curve, bool *connected_p,
                                    unsigned *closed_p)
{
    uint8_t head[6];
    uint16_t event;
    char skip[8];
    int more      = 0;
    size_t length = sizeof(more);
    int size      = zmq_recv(monitor, head, sizeof(head), ZMQ_DONTWAIT);

    while (zmq_getsockopt(monitor, ZMQ_RCVMORE, &more, &length) == 0 && more)
        zmq_recv(monitor, skip, sizeof(skip), ZMQ_DONTWAIT);
    if (size != (int)sizeof(head))
        return KVX_OK;
    memcpy(&event, head, sizeof(event));
    if (event == ZMQ_EVENT_CONNECTED)
        *connected_p = true;
    if (event == ZMQ_EVENT_CONNECTED ||
        (event == ZMQ_EVENT_CONNECT_RETRIED && *connected_p && ++*closed_p < FETCH_CLOSES_REFUSED))
        return KVX_OK;
    if (event == ZMQ_EVENT_CONNECT_RETRIED && !*connected_p)
        return error_set(KVX_ERR_PEER_DOWN,
                         "side channel: connection refused: is kvx serve (or the prefill "
                         "agent) running there?");
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        return error_set(KVX_ERR_PEER_REFUSED,
                         "side channel refused us (a different auth key, or it has too many "
                         "connections)");
    return error_set(KVX_ERR_PEER_REFUSED,
                     curve ? "side channel: the authenticated handshake failed: the peer holds a "
                             "different auth key, runs insecure, is not kvx, or closed it (too "
                             "many handshakes in progress from this address)"
                           : "side channel: the handshake failed: the peer requires an auth key "
                             "(--auth), is not kvx, or closed it (too many handshakes in progress "
                             "from this address)");
}

kvx_status_t sidechan_fetch(void *zmq, const char *address, const struct auth_keys *keys,
                            const char *verb, int64_t max_reply, uint32_t timeout_ms,
                            void **reply_p, size_t *size_p)
{
    uint64_t deadline = clock_ms() + timeout_ms;
    bool connected    = false; /* a TCP connection was made (the monitor said so) */
    unsigned closed   = 0;     /* connections the peer closed since */
    void *socket;
    void *monitor;
    kvx_status_t status =
        dealer_open(zmq, address, keys, 1, max_reply,
                    ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED |
                        ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                        ZMQ_EVENT_HANDSHAKE_FAILED_AUTH,
                    &monitor, &socket);

    if (status != KVX_OK)
        return status;
    status = request_send(socket, verb, 1, NULL, 0, false);
    while (status == KVX_OK) {
        zmq_pollitem_t items[2] = {{.socket = socket, .events = ZMQ_POLLIN},
                                   {.socket = monitor, .events = ZMQ_POLLIN}};
        uint64_t now            = clock_ms();
        uint64_t id;
        char *body;
        size_t size;

        if (now >= deadline) {
            status = connected ? error_set(KVX_ERR_PEER_TIMEOUT, "no answer within %" PRIu32 " ms",
                                           timeout_ms)
                               : error_set(KVX_ERR_PEER_TIMEOUT,
                                           "no connection within %" PRIu32
                                           " ms: is the address reachable from here?",
                                           timeout_ms);
            break;
        }
        if (zmq_poll(items, 2, (long)(deadline - now)) <= 0)
            continue;
        if ((items[1].revents & ZMQ_POLLIN) &&
            (status = monitor_failure(monitor, keys->curve, &connected, &closed)) != KVX_OK)
            break;
        if (!reply_receive(socket, &id, &body, &size))
            continue;
        if (id != 1) { /* a stray or malformed message: not the answer */
            free(body);
            continue;
        }
        *reply_p = body;
        *size_p  = size;
        break;
    }
    zmq_socket_monitor(socket, NULL, 0);
    zmq_close(monitor);
    zmq_close(socket);
    return status;
}

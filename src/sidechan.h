/* sidechan.h: the ZeroMQ side channel: a listening server that dispatches requests by verb from
 * one table and answers each by its request id (at once or later), and a client socket kept per
 * peer whose replies carry the id of the request they answer. Knows nothing of agents.
 *
 * On the wire a request is [verb][id: 8 bytes, little-endian][body], a reply [id][body], each
 * after the empty delimiter frame of ZeroMQ's DEALER/ROUTER envelope. */
#ifndef KVX_SRC_SIDECHAN_H
#define KVX_SRC_SIDECHAN_H

#include "auth.h"

#define SIDECHAN_MAX_IDENTITY 255  /* bytes of a ROUTER identity (ZeroMQ's own limit) */
#define SIDECHAN_MAX_REPLY    4096 /* bytes of a reply on a kept socket: short texts */

struct sidechan_server;
struct sidechan_client;
struct gate;

/* What one connection may make a listener hold: at most recv_hwm messages of at most
 * max_message bytes each queue for it, and its handshake must end within handshake_ms. */
struct sidechan_limits {
    int64_t max_message;
    int recv_hwm;
    int handshake_ms;
};

/* Where a reply goes: the requester's connection and its request id. Copied by value, so a
 * reply can be sent long after the request was received. */
struct sidechan_origin {
    uint8_t identity[SIDECHAN_MAX_IDENTITY];
    size_t identity_size;
    uint64_t id;
};

/* A number for the connection a request came over: the same for every request of one
 * connection, and never 0 (a hold binds each consumer rank to one: hold.h). ZeroMQ's own
 * routing ids (5 bytes, a counter, unique while the listener lives) map one to one; a longer
 * one that a peer chose is hashed, so two such connections may share a number, which only
 * ever refuses more dones, never counts more. */
uint64_t sidechan_origin_key(const struct sidechan_origin *origin);

/* One received request, valid during its handler. */
struct sidechan_request {
    struct sidechan_origin origin;
    const void *body;
    size_t body_size;
    int fd; /* the descriptor of the TCP connection it came by (ZeroMQ's ZMQ_SRCFD), -1 when
               not known: ZeroMQ says nothing when a connection closes, its descriptor and
               that socket's cookie (gate_monitor_cookie) tell it later (done_handles.h) */
};

/* A verb and its handler; `body` says whether its requests carry a body frame. */
struct sidechan_verb {
    const char *name;
    bool body;
    void (*serve)(void *arg, const struct sidechan_request *request);
};

/* Binds a ROUTER at "HOST:PORT" (port 0: a free one) within `limits`, a CURVE server with
 * `keys` (unless they are insecure) whose connections `gate` watches and admits (its ZAP
 * handler must exist already); `bound` receives "HOST:PORT" with the real port. */
kvx_status_t sidechan_server_create(void *zmq, const char *listen,
                                    const struct sidechan_limits *limits,
                                    const struct auth_keys *keys, struct gate *gate, char *bound,
                                    size_t bound_size, struct sidechan_server **server_p);
void sidechan_server_destroy(struct sidechan_server *server);
int sidechan_server_fd(struct sidechan_server *server);
void *sidechan_server_socket(struct sidechan_server *server); /* for zmq_poll */
bool sidechan_server_readable(struct sidechan_server *server);

/* Receives and dispatches at most `max` waiting requests; each is handed to its verb's
 * handler, or counted in *malformed_p (a wrong shape: dropped) or answered
 * "kvx-error unknown request" and counted (an unknown verb). Returns how many were received. */
size_t sidechan_server_serve(struct sidechan_server *server, const struct sidechan_verb *verbs,
                             size_t num_verbs, void *arg, size_t max, uint64_t *malformed_p);

/* Sends a reply; never blocks (a requester that does not read loses it). */
void sidechan_reply(struct sidechan_server *server, const struct sidechan_origin *origin,
                    const void *data, size_t size);

/* A DEALER connected to "HOST:PORT" (as a CURVE client with `keys` unless they are insecure)
 * for requests and their replies, at most SIDECHAN_MAX_REPLY bytes each; at most `send_hwm`
 * messages queue for a stalled peer. */
kvx_status_t sidechan_client_create(void *zmq, const char *address, const struct auth_keys *keys,
                                    int send_hwm, struct sidechan_client **client_p);
void sidechan_client_destroy(struct sidechan_client *client);
int sidechan_client_fd(struct sidechan_client *client);
void *sidechan_client_socket(struct sidechan_client *client); /* for zmq_poll */
bool sidechan_client_readable(struct sidechan_client *client); /* the socket or its monitor */
void *sidechan_client_monitor(struct sidechan_client *client);  /* for zmq_poll */

/* Whether the connection closed after its handshake succeeded: the peer's process exited or
 * was killed (the kernel closes its sockets at once), or it dropped us. ZeroMQ would only
 * reconnect in silence; the caller learns it here, from the socket's monitor, without waiting
 * for heartbeats to go unanswered (issue 36 finding 13). */
bool sidechan_client_closed(struct sidechan_client *client);

/* Sleeps on the socket until a reply waits or `timeout_ms` passed (the handshake only). */
bool sidechan_client_wait(struct sidechan_client *client, int timeout_ms);

/* Queues one request without blocking; KVX_ERR_PEER_DOWN when the queue is full. */
kvx_status_t sidechan_client_send(struct sidechan_client *client, const char *verb, uint64_t id,
                                  const void *body, size_t size);

/* Takes one waiting reply, if any: its id and a malloc'd NUL-terminated copy of its body
 * (freed by the caller). A message of the wrong shape is consumed and reported as id 0. */
bool sidechan_client_recv(struct sidechan_client *client, uint64_t *id_p, char **body_p,
                          size_t *size_p);

/* One request on a socket of its own and its reply of at most `max_reply` bytes, waiting at
 * most `timeout_ms` on the socket (the handshake's metadata, before any socket is kept). A
 * peer that refuses our handshake fails it at once with KVX_ERR_PEER_REFUSED. Its messages,
 * like those of the client calls, do not name `address`: the caller's do. */
kvx_status_t sidechan_fetch(void *zmq, const char *address, const struct auth_keys *keys,
                            const char *verb, int64_t max_reply, uint32_t timeout_ms,
                            void **reply_p, size_t *size_p);

#endif

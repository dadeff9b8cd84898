/* gate.h: who may talk to a listening side channel. ZeroMQ asks its ZAP handler (RFC 27) about
 * every connection before it is answered; the gate is that handler, and it also reads the
 * listening socket's monitor events (gate_monitor.h), so that it knows the connections open,
 * which of them are still in their handshake, and the handshakes that failed before ZAP was
 * asked (a peer without the secret fails CURVE's first step). Admitted peers and handshakes in
 * progress are bounded apart: a handshake is not a peer, so connections that never finish
 * theirs (silent sockets, bad greetings) cannot lock authenticated peers out. It allows a
 * peer that proved the client key of the shared secret (or, insecure, anyone on loopback),
 * while fewer than `max_peers` are admitted; every refusal is counted and logged once per
 * address. */
#ifndef KVX_SRC_GATE_H
#define KVX_SRC_GATE_H

#include "auth.h"
#include "loop.h"

struct gate;

struct gate_limits {
    uint32_t max_peers;      /* authenticated connections open at once */
    uint32_t max_handshakes; /* connections open and not authenticated yet, at once */
    uint32_t per_source;     /* of those, from one IP address */
    uint32_t handshake_ms;   /* ZeroMQ closes a handshake not finished by then (ZMQ_HANDSHAKE_IVL) */
};

struct gate_counters {
    uint64_t auth_refused;       /* handshakes refused: no secret, a wrong one, garbage, or
                                    not finished within handshake_ms */
    uint64_t peers_refused;      /* authenticated connections refused past max_peers */
    uint64_t peers_evicted;      /* authenticated connections closed for a newcomer from an
                                    address that held fewer (gate.c connection_evict) */
    uint64_t connections;        /* authenticated connections open now (gauge) */
    uint64_t handshakes;         /* connections open and not authenticated yet (gauge) */
    uint64_t handshakes_refused; /* closed in their handshake: the oldest past max_handshakes,
                                    or its source's oldest past per_source */
};

/* Binds the ZAP handler in `zmq` (before any socket of it listens) and keeps the keys to check
 * peers against; log lines go to `loop`. */
kvx_status_t gate_create(void *zmq, const struct auth_keys *keys, const struct gate_limits *limits,
                         struct loop *loop, struct gate **gate_p);
void gate_destroy(struct gate *gate);

/* Watches the listening socket's connections: call before it binds. */
kvx_status_t gate_watch(struct gate *gate, void *router);

/* Reads monitor events, then answers ZAP requests; returns how many messages it handled. */
size_t gate_serve(struct gate *gate);

/* A request came on the connection of descriptor `fd` (sidechan_request.fd; -1: not known):
 * a full listener closes the connection heard from least recently of the busiest address. */
void gate_heard(struct gate *gate, int fd);

/* For zmq_poll and the loop's descriptor set: its two sockets. */
size_t gate_sockets(struct gate *gate, void *sockets[2]);
bool gate_readable(struct gate *gate);

const struct gate_counters *gate_counters(const struct gate *gate);

#endif

/* hostport.h: "HOST:PORT" text, as --listen and --peer take it, to the numeric ZeroMQ endpoint
 * the side channel binds or connects: a host name resolved, an IPv6 literal in brackets. Below
 * the side channel and auth; opens no socket. */
#ifndef KVX_SRC_HOSTPORT_H
#define KVX_SRC_HOSTPORT_H

#include "kvx.h"

#define HOSTPORT_ENDPOINT_SIZE 300 /* "tcp://" + a numeric host (IPv6 in brackets) + ":PORT" */

struct hostport {
    char endpoint[HOSTPORT_ENDPOINT_SIZE]; /* "tcp://127.0.0.1:5555", "tcp://[::1]:0" */
    char host[HOSTPORT_ENDPOINT_SIZE];     /* its host alone: "127.0.0.1", "::1", "*" */
    bool ipv6;                             /* the socket needs ZMQ_IPV6 */
    bool loopback;                         /* 127.0.0.0/8 or ::1 (a name: what it resolved to) */
};

/* Parses `address` ("HOST:PORT", port 0..65535 in decimal) and resolves HOST: an IPv4
 * address, an IPv6 one in brackets ("[::1]:0"), "*" (every interface, as ZeroMQ spells it) or
 * a name, which takes its first IPv4 address, else its first IPv6 one (so "localhost" is
 * 127.0.0.1 where both exist, on either side). ZeroMQ itself would take a name in a bind for
 * an interface ("No such device"). `what` names the address in errors (KVX_ERR_INVALID); the
 * resolver's deadline is the system's (numeric hosts and /etc/hosts never wait). */
kvx_status_t hostport_resolve(const char *address, const char *what, struct hostport *hp);

#endif

/* hostport.c: "HOST:PORT" text to a numeric ZeroMQ endpoint (hostport.h): the port checked,
 * the host resolved with getaddrinfo. Knows nothing of ZeroMQ sockets or of agents. */
#include "hostport.h"

#include "error.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define HOSTPORT_MAX_HOST 255 /* bytes of a host name (RFC 1035's limit for a whole name) */

/* Whether a resolved address is a loopback one: 127.0.0.0/8, ::1, or 127/8 mapped in IPv6. */
static bool sockaddr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;

        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* The first IPv4 address of `host`, else its first IPv6 one, as numeric text. */
static kvx_status_t host_resolve(const char *host, bool bracketed, const char *what,
                                 const char *address, char *numeric, size_t size,
                                 struct hostport *hp)
{
    struct addrinfo hints         = {.ai_family   = bracketed ? AF_INET6 : AF_UNSPEC,
                                     .ai_socktype = SOCK_STREAM,
                                     .ai_flags    = bracketed ? AI_NUMERICHOST : 0};
    struct addrinfo *list         = NULL;
    const struct addrinfo *chosen = NULL;
    int ret                       = getaddrinfo(host, NULL, &hints, &list);

    if (ret != 0)
        return error_set(KVX_ERR_INVALID, "%s: \"%.64s\": %s \"%.64s\": %s", what, address,
                         bracketed ? "not an IPv6 address:" : "cannot resolve host", host,
                         gai_strerror(ret));
    for (const struct addrinfo *ai = list; ai != NULL && chosen == NULL; ai = ai->ai_next)
        chosen = ai->ai_family == AF_INET ? ai : NULL;
    for (const struct addrinfo *ai = list; ai != NULL && chosen == NULL; ai = ai->ai_next)
        chosen = ai->ai_family == AF_INET6 ? ai : NULL;
    if (chosen == NULL || getnameinfo(chosen->ai_addr, chosen->ai_addrlen, numeric, (socklen_t)size,
                                      NULL, 0, NI_NUMERICHOST) != 0) {
        freeaddrinfo(list);
        return error_set(KVX_ERR_INVALID,
                         "%s: \"%.64s\": host \"%.64s\" has no IPv4 or IPv6 "
                         "address",
                         what, address, host);
    }
    hp->ipv6     = chosen->ai_family == AF_INET6;
    hp->loopback = sockaddr_is_loopback(chosen->ai_addr);
    freeaddrinfo(list);
    return KVX_OK;
}

kvx_status_t hostport_resolve(const char *address, const char *what, struct hostport *hp)
{
    const char *colon = strrchr(address, ':');
    size_t digits     = colon != NULL ? strspn(colon + 1, "0123456789") : 0;
    size_t host_len   = colon != NULL ? (size_t)(colon - address) : 0;
    bool bracketed    = host_len >= 2 && address[0] == '[' && address[host_len - 1] == ']';
    char host[HOSTPORT_MAX_HOST + 1];
    char numeric[INET6_ADDRSTRLEN + 16]; /* a scope id (%eth0) may follow */
    struct hostport out = {0};
    kvx_status_t status;

    if (colon == NULL || host_len == 0 || (bracketed && host_len == 2))
        return error_set(KVX_ERR_INVALID, "%s: \"%.64s\" is not HOST:PORT", what, address);
    if (digits == 0 || colon[1 + digits] != '\0' || digits > 5 || atoi(colon + 1) > 65535 ||
        (digits > 1 && colon[1] == '0'))
        return error_set(KVX_ERR_INVALID, "%s: \"%.64s\": the port must be 0..65535", what,
                         address);
    if (!bracketed && memchr(address, ':', host_len) != NULL)
        return error_set(KVX_ERR_INVALID,
                         "%s: \"%.64s\": an IPv6 address goes in brackets: [ADDRESS]:PORT", what,
                         address);
    if (host_len - (bracketed ? 2 : 0) > HOSTPORT_MAX_HOST)
        return error_set(KVX_ERR_INVALID, "%s: the host of \"%.64s...\" is longer than %d bytes",
                         what, address, HOSTPORT_MAX_HOST);
    snprintf(host, sizeof(host), "%.*s", (int)(host_len - (bracketed ? 2 : 0)),
             address + (bracketed ? 1 : 0));
    if (strcmp(host, "*") == 0) {
        snprintf(out.endpoint, sizeof(out.endpoint), "tcp://*:%s", colon + 1);
        snprintf(out.host, sizeof(out.host), "*");
        *hp = out;
        return KVX_OK;
    }
    status = host_resolve(host, bracketed, what, address, numeric, sizeof(numeric), &out);
    if (status != KVX_OK)
        return status;
    snprintf(out.endpoint, sizeof(out.endpoint), out.ipv6 ? "tcp://[%s]:%s" : "tcp://%s:%s",
             numeric, colon + 1);
    snprintf(out.host, sizeof(out.host), "%s", numeric);
    *hp = out;
    return KVX_OK;
}

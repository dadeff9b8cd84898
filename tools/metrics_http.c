/* metrics_http.c: the Prometheus endpoint of kvx serve, on libmicrohttpd driven from the
 * serve loop (MHD_run), so the agent is only ever touched by its own thread. */
#include "metrics_http.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct metrics_http {
    struct MHD_Daemon *daemon;
    const kvx_agent_t *agent;
    const char *name;
    uint16_t port;
};

static enum MHD_Result respond(struct MHD_Connection *connection, unsigned code, char *text,
                               enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *response = MHD_create_response_from_buffer(strlen(text), text, mode);
    enum MHD_Result result;

    if (response == NULL)
        return MHD_NO;
    MHD_add_response_header(response, "Content-Type", "text/plain; version=0.0.4");
    result = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return result;
}

static enum MHD_Result on_request(void *arg, struct MHD_Connection *connection, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **request_state)
{
    struct metrics_http *m = arg;
    kvx_agent_stats_t stats;
    char *text;

    (void)version;
    (void)upload_data;
    (void)request_state;
    if (*upload_data_size != 0)
        return MHD_NO; /* scrapes carry no body */
    if (strcmp(method, "GET") != 0)
        return respond(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n",
                       MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics") != 0)
        return respond(connection, MHD_HTTP_NOT_FOUND, "kvx serves /metrics\n",
                       MHD_RESPMEM_PERSISTENT);
    kvx_agent_stats(m->agent, &stats, sizeof(stats));
    if (kvx_agent_stats_prometheus(&stats, m->name, &text) != KVX_OK)
        return respond(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n",
                       MHD_RESPMEM_PERSISTENT);
    return respond(connection, MHD_HTTP_OK, text, MHD_RESPMEM_MUST_FREE);
}

/* "A.B.C.D:PORT" into a socket address. */
static bool address_parse(const char *address, struct sockaddr_in *sin)
{
    const char *colon = strrchr(address, ':');
    char host[64];
    char *end;
    unsigned long port;

    if (colon == NULL || (size_t)(colon - address) >= sizeof(host))
        return false;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - address), address);
    port = strtoul(colon + 1, &end, 10);
    *sin = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    return colon[1] != '\0' && *end == '\0' && port <= 65535 &&
           inet_pton(AF_INET, host, &sin->sin_addr) == 1;
}

kvx_status_t metrics_http_start(const char *address, const kvx_agent_t *agent, const char *name,
                                struct metrics_http **metrics_p)
{
    struct metrics_http *m = calloc(1, sizeof(*m));
    const union MHD_DaemonInfo *info;
    struct sockaddr_in sin;

    if (m == NULL)
        return KVX_ERR_NO_MEMORY;
    if (!address_parse(address, &sin)) {
        free(m);
        fprintf(stderr, "kvx: error: --metrics: \"%s\" is not IPV4:PORT\n", address);
        return KVX_ERR_INVALID;
    }
    *m = (struct metrics_http){.agent = agent, .name = name};
    m->daemon =
        MHD_start_daemon(MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, m, MHD_OPTION_SOCK_ADDR,
                         (struct sockaddr *)&sin, MHD_OPTION_CONNECTION_LIMIT, 16u,
                         MHD_OPTION_CONNECTION_TIMEOUT, 5u, MHD_OPTION_END);
    info = m->daemon != NULL ? MHD_get_daemon_info(m->daemon, MHD_DAEMON_INFO_BIND_PORT) : NULL;
    if (info == NULL) {
        metrics_http_stop(m);
        fprintf(stderr, "kvx: error: --metrics: cannot listen on %s\n", address);
        return KVX_ERR_IO;
    }
    m->port    = info->port;
    *metrics_p = m;
    return KVX_OK;
}

uint16_t metrics_http_port(const struct metrics_http *metrics)
{
    return metrics->port;
}

void metrics_http_serve(struct metrics_http *metrics)
{
    if (metrics != NULL)
        MHD_run(metrics->daemon);
}

void metrics_http_stop(struct metrics_http *metrics)
{
    if (metrics == NULL)
        return;
    if (metrics->daemon != NULL)
        MHD_stop_daemon(metrics->daemon);
    free(metrics);
}

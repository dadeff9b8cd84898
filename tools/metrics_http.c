/* metrics_http.c: the Prometheus endpoint of kvx serve, on libmicrohttpd driven from the
 * serve loop (MHD_run), so the agent is only ever touched by its own thread. */
#include "metrics_http.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Idle connections (accepted, no complete request yet) are bounded twice, so that sockets
 * opened and left silent never starve a scrape: at most METRICS_IDLE_MAX at once, a new
 * connection closing the oldest idle one, and none idle past METRICS_REQUEST_MS. MHD's own
 * limit leaves room for the connections being closed and those being answered. */
#define METRICS_IDLE_MAX    16
#define METRICS_CONNECTIONS (2 * METRICS_IDLE_MAX)
#define METRICS_REQUEST_MS  2000 /* from accept to a complete request; scrapers send at once */

/* MHD's error log writes a line for every connection a peer aborts (a client that sends one
 * byte and closes: "Connection was closed by remote side with incomplete request."), so
 * anyone who can reach the port could fill the log. A token bucket lets METRICS_LOG_BURST
 * lines through at once and then one every METRICS_LOG_EVERY_MS; the lines it holds back
 * are counted and said in one line when the bucket lets a line through again. */
#define METRICS_LOG_BURST    5
#define METRICS_LOG_EVERY_MS 10000

struct metrics_log {
    uint64_t budget_ms;   /* lines allowed now, each worth METRICS_LOG_EVERY_MS */
    uint64_t refilled_ms; /* when budget_ms was last brought up to date */
    uint64_t suppressed;  /* lines held back since the last said */
};

/* One connection MHD holds, from its start to its close or our shutdown of it. */
struct metrics_connection {
    struct MHD_Connection *connection; /* NULL: a free slot */
    int fd;
    uint64_t opened_ms; /* CLOCK_MONOTONIC */
    bool requested;     /* a complete request came: it is answered and closed, never evicted */
};

struct metrics_http {
    struct MHD_Daemon *daemon;
    const kvx_agent_t *agent;
    const char *name;
    uint16_t port;
    struct metrics_connection connections[METRICS_CONNECTIONS];
    uint64_t started; /* connections accepted, ever */
    struct metrics_log log;
};

static uint64_t monotonic_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Whether a line may be written now, refilling the bucket first. */
static bool log_allowed(struct metrics_log *log)
{
    const uint64_t capacity = (uint64_t)METRICS_LOG_BURST * METRICS_LOG_EVERY_MS;
    uint64_t now            = monotonic_ms();

    log->budget_ms += now - log->refilled_ms;
    if (log->budget_ms > capacity)
        log->budget_ms = capacity;
    log->refilled_ms = now;
    if (log->budget_ms < METRICS_LOG_EVERY_MS)
        return false;
    log->budget_ms -= METRICS_LOG_EVERY_MS;
    return true;
}

/* Says how many lines were held back, once a line may be written again. */
static void log_flush(struct metrics_log *log)
{
    if (log->suppressed == 0 || !log_allowed(log))
        return;
    fprintf(stderr,
            "kvx: metrics: %" PRIu64 " more lines of libmicrohttpd not written (at most %d at "
            "once, then one every %d s)\n",
            log->suppressed, METRICS_LOG_BURST, METRICS_LOG_EVERY_MS / 1000);
    log->suppressed = 0;
}

/* MHD_OPTION_EXTERNAL_LOGGER: MHD's error lines, rate-limited; its format ends the line. */
static void on_log(void *arg, const char *format, va_list ap)
{
    struct metrics_http *m = arg;

    log_flush(&m->log);
    if (m->log.suppressed > 0 || !log_allowed(&m->log)) {
        m->log.suppressed++;
        return;
    }
    fputs("kvx: metrics: ", stderr);
    vfprintf(stderr, format, ap);
}

static struct metrics_connection *connection_find(struct metrics_http *m,
                                                  const struct MHD_Connection *connection)
{
    for (size_t i = 0; i < METRICS_CONNECTIONS; i++) {
        if (m->connections[i].connection == connection)
            return &m->connections[i];
    }
    return NULL;
}

/* Ends an idle connection: MHD reads the end of the stream on its next run and closes it.
 * Its slot is free at once, and its fd, MHD's until then, is never touched again. */
static void connection_end(struct metrics_connection *c)
{
    shutdown(c->fd, SHUT_RDWR);
    c->connection = NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: tracks each connection, and makes room for a new one by
 * ending the oldest idle one when METRICS_IDLE_MAX are idle. A slot is always free: MHD
 * holds at most METRICS_CONNECTIONS, this new one among them. */
static void on_connection(void *arg, struct MHD_Connection *connection, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct metrics_http *m            = arg;
    struct metrics_connection *slot   = NULL;
    struct metrics_connection *oldest = NULL;
    const union MHD_ConnectionInfo *info;
    size_t idle = 0;

    (void)socket_context;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        slot = connection_find(m, connection);
        if (slot != NULL)
            slot->connection = NULL;
        return;
    }
    for (size_t i = 0; i < METRICS_CONNECTIONS; i++) {
        struct metrics_connection *c = &m->connections[i];

        if (c->connection == NULL) {
            slot = slot != NULL ? slot : c;
            continue;
        }
        if (c->requested)
            continue;
        idle++;
        if (oldest == NULL || c->opened_ms < oldest->opened_ms)
            oldest = c;
    }
    if (idle >= METRICS_IDLE_MAX) {
        connection_end(oldest);
        slot = slot != NULL ? slot : oldest;
    }
    m->started++;
    info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (slot != NULL && info != NULL)
        *slot = (struct metrics_connection){connection, info->connect_fd, monotonic_ms(), false};
}

static enum MHD_Result respond(struct MHD_Connection *connection, unsigned code, char *text,
                               enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *response = MHD_create_response_from_buffer(strlen(text), text, mode);
    enum MHD_Result result;

    if (response == NULL)
        return MHD_NO;
    MHD_add_response_header(response, "Content-Type", "text/plain; version=0.0.4");
    MHD_add_response_header(response, "Connection", "close"); /* no idle keep-alive */
    result = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return result;
}

static enum MHD_Result on_request(void *arg, struct MHD_Connection *connection, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **request_state)
{
    struct metrics_http *m       = arg;
    struct metrics_connection *c = connection_find(m, connection);
    kvx_agent_stats_t stats;
    char *text;

    (void)version;
    (void)upload_data;
    (void)request_state;
    if (c != NULL)
        c->requested = true; /* MHD calls this once the request's headers are complete */
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
    *m = (struct metrics_http){
        .agent = agent,
        .name  = name,
        .log   = {.budget_ms   = (uint64_t)METRICS_LOG_BURST * METRICS_LOG_EVERY_MS,
                  .refilled_ms = monotonic_ms()}};
    m->daemon = MHD_start_daemon(
        MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, on_log, m,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)METRICS_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, 5u,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, m, MHD_OPTION_END);
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

/* Answers what is waiting, then ends the connections idle past METRICS_REQUEST_MS (after
 * the run, so a request that came in time is read first); MHD closes them on its next run.
 * MHD accepts one connection a run, so it runs again while it accepts, up to
 * METRICS_IDLE_MAX times: a scrape behind a burst of connections waits one turn of the
 * serve loop, not one a connection. */
void metrics_http_serve(struct metrics_http *metrics)
{
    uint64_t started;
    uint64_t now;

    if (metrics == NULL)
        return;
    for (int runs = 0; runs < METRICS_IDLE_MAX; runs++) {
        started = metrics->started;
        MHD_run(metrics->daemon);
        if (metrics->started == started)
            break;
    }
    log_flush(&metrics->log);
    now = monotonic_ms();
    for (size_t i = 0; i < METRICS_CONNECTIONS; i++) {
        struct metrics_connection *c = &metrics->connections[i];

        if (c->connection != NULL && !c->requested && now - c->opened_ms > METRICS_REQUEST_MS)
            connection_end(c);
    }
}

void metrics_http_stop(struct metrics_http *metrics)
{
    if (metrics == NULL)
        return;
    if (metrics->daemon != NULL)
        MHD_stop_daemon(metrics->daemon);
    metrics->log.budget_ms = METRICS_LOG_EVERY_MS; /* the count of lines held back, at last */
    metrics->log.refilled_ms = monotonic_ms();
    log_flush(&metrics->log);
    free(metrics);
}

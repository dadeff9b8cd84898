/* metrics_http.h: `kvx serve --metrics HOST:PORT`: the agent's stats over HTTP for
 * Prometheus, served from the thread that runs the agent (no locks: scrapes wait for the
 * next turn of the serve loop). */
#ifndef KVX_TOOLS_METRICS_HTTP_H
#define KVX_TOOLS_METRICS_HTTP_H

#include "kvx.h"

struct metrics_http;

/* Listens on `address` ("IPv4:PORT"; port 0 takes a free one) and answers GET /metrics with
 * `agent`'s stats labelled `name`. The message of an error names the address. */
kvx_status_t metrics_http_start(const char *address, const kvx_agent_t *agent, const char *name,
                                struct metrics_http **metrics_p);

/* The port it listens on. */
uint16_t metrics_http_port(const struct metrics_http *metrics);

/* Answers the scrapes that are waiting, without blocking. */
void metrics_http_serve(struct metrics_http *metrics);

void metrics_http_stop(struct metrics_http *metrics);

#endif

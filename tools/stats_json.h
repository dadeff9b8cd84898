/* stats_json.h: kvx fetch --json: the transfer's figures and the agent's stats as one JSON
 * object on one line, for scripts. */
#ifndef KVX_TOOLS_STATS_JSON_H
#define KVX_TOOLS_STATS_JSON_H

#include "kvx.h"

#include <stdio.h>

/* `text` as a JSON string, quoted and escaped. */
void json_string_print(FILE *out, const char *text);

/* The agent's counters and histograms (count, sum, p50, p99 by bucket bound) as a JSON
 * object. */
void stats_json_print(FILE *out, const kvx_agent_stats_t *stats);

#endif

/* stats_json.h: JSON the commands print for scripts: strings (kvx plan --json, kvx fetch
 * --json) and the agent's stats as one object on one line (kvx fetch --json). */
#ifndef KVX_TOOLS_STATS_JSON_H
#define KVX_TOOLS_STATS_JSON_H

#include "kvx.h"

#include <stdio.h>

/* `text` as a JSON string, quoted and escaped by the library's kvx_json_quote: for every
 * command's --json output (null when out of memory). */
void json_string_print(FILE *out, const char *text);

/* The agent's counters and histograms (count, sum, p50, p99 by bucket bound) as a JSON
 * object. */
void stats_json_print(FILE *out, const kvx_agent_stats_t *stats);

#endif

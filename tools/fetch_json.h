/* fetch_json.h: kvx fetch --json: one JSON object on one line, whatever the outcome, for
 * scripts: whether it worked, why not, the blocks not loaded, the figures and the agent's
 * stats. */
#ifndef KVX_TOOLS_FETCH_JSON_H
#define KVX_TOOLS_FETCH_JSON_H

#include "kvx.h"

#include <stdio.h>

/* What a fetch came to. Fields a fetch did not get as far as are NULL (printed as null). */
struct fetch_outcome {
    bool ok;
    const char *error;                 /* NULL when ok; else the `kvx: error:` line's message */
    const kvx_group_ids_t *not_loaded; /* by group; NULL: not known (--blocks was the error) */
    size_t num_not_loaded;
    bool push;
    const kvx_read_stats_t *read;       /* the transfer's figures; NULL: none moved */
    const kvx_verify_result_t *checked; /* NULL or not requested: no checksums */
    const char *verdict;                /* "verified", a mismatch, or "not verified" */
    const char *transports;             /* the first peer's; NULL before a peer connected */
    const kvx_agent_t *agent;           /* for its stats; NULL before it existed */
};

/* Prints `o` as {"ok", "error", "not_loaded": {"GROUP": [ids...]}, "mode", "bytes",
 * "descriptors", "posted", "seconds", "transports", "verified", "checksums", "stats"} and a
 * newline. */
void fetch_json_print(FILE *out, const struct fetch_outcome *o);

#endif

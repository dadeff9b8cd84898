/* fetch_json.c: kvx fetch --json (fetch_json.h). Issue 24: it printed nothing when the fetch
 * failed before its transfer, so a script had no object to read exactly when it needed one.
 * Formatting only: every figure comes from the library or the command. */
#include "fetch_json.h"

#include "stats_json.h"

#include <inttypes.h>

static void not_loaded_print(FILE *out, const kvx_group_ids_t *groups, size_t num_groups)
{
    const char *separator = "";

    fprintf(out, "{");
    for (size_t g = 0; g < num_groups; g++) {
        if (groups[g].count == 0)
            continue;
        fprintf(out, "%s\"%zu\": [", separator, g);
        for (size_t i = 0; i < groups[g].count; i++)
            fprintf(out, "%s%" PRIu64, i > 0 ? ", " : "", groups[g].ids[i]);
        fprintf(out, "]");
        separator = ", ";
    }
    fprintf(out, "}");
}

void fetch_json_print(FILE *out, const struct fetch_outcome *o)
{
    static const kvx_read_stats_t nothing_moved;
    const kvx_read_stats_t *read       = o->read != NULL ? o->read : &nothing_moved;
    const kvx_verify_result_t *checked = o->checked;
    kvx_agent_stats_t stats;

    fprintf(out, "{\"ok\": %s, \"error\": ", o->ok ? "true" : "false");
    json_string_print(out, o->ok || o->error == NULL ? "" : o->error);
    fprintf(out, ", \"not_loaded\": ");
    if (o->not_loaded != NULL)
        not_loaded_print(out, o->not_loaded, o->num_not_loaded);
    else
        fprintf(out, "null");
    fprintf(out,
            ", \"mode\": \"%s\", \"bytes\": %" PRIu64 ", \"descriptors\": %" PRIu64
            ", \"posted\": %" PRIu64 ", \"seconds\": %.9f, \"transports\": ",
            o->push ? "push" : "pull", read->bytes, read->descriptors, read->posted, read->seconds);
    if (o->transports != NULL)
        json_string_print(out, o->transports);
    else
        fprintf(out, "null");
    fprintf(out, ", \"verified\": ");
    json_string_print(out, o->verdict != NULL ? o->verdict : "not verified");
    if (checked != NULL && checked->requested)
        fprintf(out,
                ", \"checksums\": {\"ok\": %s, \"segments\": %" PRIu64 ", \"bytes\": %" PRIu64
                ", \"mismatches\": %" PRIu64 ", \"seconds\": %.9f}",
                checked->status == KVX_OK ? "true" : "false", checked->segments, checked->bytes,
                checked->mismatches, checked->seconds);
    else
        fprintf(out, ", \"checksums\": null");
    fprintf(out, ", \"stats\": ");
    if (o->agent != NULL) {
        kvx_agent_stats(o->agent, &stats, sizeof(stats));
        stats_json_print(out, &stats);
    } else {
        fprintf(out, "null");
    }
    fprintf(out, "}\n");
    fflush(out);
}

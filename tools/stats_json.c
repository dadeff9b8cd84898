/* stats_json.c: JSON of an agent's stats. Histograms are summarised (count, sum and the
 * bucket bounds of p50 and p99) rather than dumped: a script wants the figures, Prometheus
 * gets the buckets. */
#include "stats_json.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void json_string_print(FILE *out, const char *text)
{
    char small[256]; /* most strings: an error message, a name */
    size_t len = kvx_json_quote(small, sizeof(small), text);
    char *big  = len < sizeof(small) ? NULL : malloc(len + 1);

    if (len < sizeof(small))
        fputs(small, out);
    else if (big != NULL && kvx_json_quote(big, len + 1, text) == len)
        fputs(big, out);
    else
        fputs("null", out); /* out of memory: still a JSON value */
    free(big);
}

/* The upper bound of the bucket holding quantile `q`: the figure is at most this. */
static double histogram_quantile(const kvx_histogram_t *h, double q)
{
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    uint64_t seen = 0;

    for (int i = 0; i < KVX_HISTOGRAM_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank && seen > 0)
            return ldexp(1, i);
    }
    return 0;
}

static void histogram_print(FILE *out, const char *name, const kvx_histogram_t *h)
{
    fprintf(out,
            "\"%s\": {\"count\": %" PRIu64
            ", \"sum\": %.17g, \"p50_le\": %.17g, \"p99_le\": %.17g}",
            name, h->count, h->sum, histogram_quantile(h, 0.5), histogram_quantile(h, 0.99));
}

/* Every field of the library's list, under its name in kvx_agent_stats_t. */
void stats_json_print(FILE *out, const kvx_agent_stats_t *s)
{
    size_t count;
    const kvx_stat_field_t *fields = kvx_agent_stats_fields(&count);

    fputc('{', out);
    for (size_t i = 0; i < count; i++) {
        const char *at = (const char *)s + fields[i].offset;
        uint64_t value;

        fputs(i > 0 ? ", " : "", out);
        if (fields[i].kind == KVX_STAT_KIND_HISTOGRAM) {
            histogram_print(out, fields[i].name, (const kvx_histogram_t *)at);
            continue;
        }
        memcpy(&value, at, sizeof(value));
        fprintf(out, "\"%s\": %" PRIu64, fields[i].name, value);
    }
    fputc('}', out);
}

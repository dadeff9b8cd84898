/* stats.c: power-of-two histograms, and an agent's counters in Prometheus's text format so a
 * scrape needs no translation; which counters there are is stats_fields.c's list. */
#include "stats.h"

#include "error.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void histogram_add(kvx_histogram_t *histogram, double value)
{
    int bucket = 0;

    if (value > 1) {
        frexp(value, &bucket); /* value = m * 2^bucket with m in [0.5, 1) */
        if (ldexp(1, bucket - 1) == value)
            bucket--; /* an exact power of two belongs to its own bucket */
    }
    if (bucket >= KVX_HISTOGRAM_BUCKETS)
        bucket = KVX_HISTOGRAM_BUCKETS - 1;
    histogram->count++;
    histogram->sum += value;
    histogram->buckets[bucket]++;
}

/* A growing text buffer; `failed` sticks once an allocation failed. */
struct text {
    char *data;
    size_t length;
    size_t capacity;
    bool failed;
};

__attribute__((format(printf, 2, 3))) static void text_printf(struct text *t, const char *format,
                                                              ...)
{
    va_list args;
    int n;

    for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
        va_start(args, format);
        n = vsnprintf(t->data + t->length, t->capacity - t->length, format, args);
        va_end(args);
        if (n < 0) {
            t->failed = true;
        } else if ((size_t)n < t->capacity - t->length) {
            t->length += (size_t)n;
            return;
        } else {
            size_t capacity = 2 * t->capacity + (size_t)n + 1;
            char *data      = realloc(t->data, capacity);

            t->failed   = data == NULL;
            t->data     = data != NULL ? data : t->data;
            t->capacity = data != NULL ? capacity : t->capacity;
        }
    }
}

/* A counter or gauge: the field's value, exact, or scaled to the metric's unit (nanoseconds
 * shown as seconds). */
static void scalar(struct text *t, const char *labels, const kvx_stat_field_t *f, uint64_t value)
{
    text_printf(t, "# HELP kvx_%s %s\n# TYPE kvx_%s %s\n", f->metric, f->help, f->metric,
                f->kind == KVX_STAT_KIND_GAUGE ? "gauge" : "counter");
    if (f->scale == 1)
        text_printf(t, "kvx_%s{%s} %" PRIu64 "\n", f->metric, labels, value);
    else
        text_printf(t, "kvx_%s{%s} %.9f\n", f->metric, labels, (double)value * f->scale);
}

/* A histogram whose observations are in units of f->scale of the exposed unit (1e-6 for
 * microseconds exposed as seconds); buckets are cumulative, as Prometheus wants. */
static void histogram(struct text *t, const char *labels, const kvx_stat_field_t *f,
                      const kvx_histogram_t *h)
{
    const char *name    = f->metric;
    uint64_t cumulative = 0;

    text_printf(t, "# HELP kvx_%s %s\n# TYPE kvx_%s histogram\n", name, f->help, name);
    for (int i = 0; i < KVX_HISTOGRAM_BUCKETS - 1; i++) {
        cumulative += h->buckets[i];
        text_printf(t, "kvx_%s_bucket{%s,le=\"%.9g\"} %" PRIu64 "\n", name, labels,
                    ldexp(1, i) * f->scale, cumulative);
    }
    text_printf(t, "kvx_%s_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", name, labels, h->count);
    text_printf(t, "kvx_%s_sum{%s} %.17g\nkvx_%s_count{%s} %" PRIu64 "\n", name, labels,
                h->sum * f->scale, name, labels, h->count);
}

/* agent="NAME" with the name escaped as label values must be. */
static void label_agent(struct text *t, const char *name)
{
    text_printf(t, "agent=\"");
    for (const char *c = name; *c != '\0'; c++) {
        if (*c == '\\' || *c == '"')
            text_printf(t, "\\%c", *c);
        else if (*c == '\n')
            text_printf(t, "\\n");
        else
            text_printf(t, "%c", *c);
    }
    text_printf(t, "\"");
}

kvx_status_t kvx_agent_stats_prometheus(const kvx_agent_stats_t *s, const char *agent_name,
                                        char **text_p)
{
    struct text labels = {0};
    struct text t      = {0};
    const kvx_stat_field_t *fields;
    size_t count;
    const char *l;

    if (s == NULL || text_p == NULL)
        return error_set(KVX_ERR_INVALID, "stats: stats and result are required");
    label_agent(&labels, agent_name != NULL ? agent_name : "kvx");
    l      = labels.data != NULL ? labels.data : "";
    fields = kvx_agent_stats_fields(&count);
    for (size_t i = 0; i < count; i++) {
        const kvx_stat_field_t *f = &fields[i];
        const char *at            = (const char *)s + f->offset;
        uint64_t value;

        if (f->kind == KVX_STAT_KIND_HISTOGRAM) {
            histogram(&t, l, f, (const kvx_histogram_t *)at);
            continue;
        }
        memcpy(&value, at, sizeof(value));
        scalar(&t, l, f, value);
    }
    free(labels.data);
    if (t.failed || labels.failed || t.data == NULL) {
        free(t.data);
        return error_no_memory("the metrics text");
    }
    *text_p = t.data;
    return KVX_OK;
}

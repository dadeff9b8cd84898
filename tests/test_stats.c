/* test_stats.c: histograms count each observation in the smallest power-of-two bucket that
 * holds it, the list of stats fields covers kvx_agent_stats_t field by field, and the
 * Prometheus text has every one of them with HELP and TYPE, cumulative buckets ending in
 * +Inf, seconds for microseconds, and the agent label escaped. */
#include "stats.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static void observations_land_in_power_of_two_buckets(void **state)
{
    static const struct {
        double value;
        int bucket;
    } cases[]         = {{0, 0},
                         {0.5, 0},
                         {1, 0},
                         {1.5, 1},
                         {2, 1},
                         {3, 2},
                         {4, 2},
                         {5, 3},
                         {1024, 10},
                         {1025, 11},
                         {1e300, KVX_HISTOGRAM_BUCKETS - 1}};
    kvx_histogram_t h = {0};

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvx_histogram_t one = {0};

        histogram_add(&one, cases[i].value);
        assert_int_equal(one.buckets[cases[i].bucket], 1);
        assert_int_equal(one.count, 1);
        histogram_add(&h, cases[i].value);
    }
    assert_int_equal(h.count, sizeof(cases) / sizeof(cases[0]));
    assert_true(h.sum > 1e299);
}

/* The line of `text` that starts with `prefix`, as a number after its last space. */
static double metric(const char *text, const char *prefix)
{
    const char *line = strstr(text, prefix);

    assert_non_null(line);
    return strtod(strchr(line, ' ') + 1, NULL);
}

/* A transfer-time bucket line of the agent named p"0\ (escaped), up to its bound. */
#define BUCKET "kvx_transfer_duration_seconds_bucket{agent=\"p\\\"0\\\\\",le="

static void prometheus_text_is_complete_and_cumulative(void **state)
{
    kvx_agent_stats_t stats = {.transfers       = 3,
                               .leases_expired  = 2,
                               .held            = 5,
                               .auth_refused    = 7,
                               .tokens_refused  = 11,
                               .peers_connected = 13};
    char *text;

    (void)state;
    histogram_add(&stats.transfer_us, 3);    /* bucket le 4 us */
    histogram_add(&stats.transfer_us, 1000); /* bucket le 1024 us */
    assert_int_equal(kvx_agent_stats_prometheus(&stats, "p\"0\\", &text), KVX_OK);
    assert_non_null(strstr(text, "# TYPE kvx_transfers_total counter\n"));
    assert_non_null(strstr(text, "# TYPE kvx_held_requests gauge\n"));
    assert_non_null(strstr(text, "# TYPE kvx_transfer_duration_seconds histogram\n"));
    assert_int_equal(metric(text, "kvx_transfers_total{agent=\"p\\\"0\\\\\"}"), 3);
    assert_int_equal(metric(text, "kvx_leases_expired_total{"), 2);
    assert_int_equal(metric(text, "kvx_held_requests{"), 5);
    assert_int_equal(metric(text, "kvx_auth_refused_total{"), 7);
    assert_int_equal(metric(text, "kvx_peers_refused_total{"), 0);
    assert_int_equal(metric(text, "kvx_tokens_refused_total{"), 11);
    assert_int_equal(metric(text, "kvx_peers_connected{"), 13);
    /* Cumulative: nothing at 2 us, one at 4 us, still one at 512 us, both at 1024 us. */
    assert_int_equal(metric(text, BUCKET "\"2e-06\"}"), 0);
    assert_int_equal(metric(text, BUCKET "\"4e-06\"}"), 1);
    assert_int_equal(metric(text, BUCKET "\"0.000512\"}"), 1);
    assert_int_equal(metric(text, BUCKET "\"0.001024\"}"), 2);
    assert_int_equal(metric(text, BUCKET "\"+Inf\"}"), 2);
    assert_int_equal(metric(text, "kvx_transfer_duration_seconds_count{"), 2);
    assert_true(metric(text, "kvx_transfer_duration_seconds_sum{") > 0.001002);
    assert_true(metric(text, "kvx_transfer_duration_seconds_sum{") < 0.001004);
    free(text);
}

/* The bytes a field of `kind` takes in kvx_agent_stats_t. */
static size_t field_size(kvx_stat_kind_t kind)
{
    return kind == KVX_STAT_KIND_HISTOGRAM ? sizeof(kvx_histogram_t) : sizeof(uint64_t);
}

/* Issue 24: one list of the stats. Its entries follow each other through the struct with no
 * gap and end at its end, so a field added to kvx_agent_stats_t without its line in
 * src/stats_fields.c fails here; no two share a name or a metric. */
static void stats_fields_tile_the_struct(void **state)
{
    size_t count;
    const kvx_stat_field_t *fields = kvx_agent_stats_fields(&count);
    size_t end                     = 0;

    (void)state;
    assert_true(count > 0);
    for (size_t i = 0; i < count; i++) {
        const kvx_stat_field_t *f = &fields[i];

        if (f->offset != end)
            fail_msg("stats field %s at offset %zu, expected %zu: a field of kvx_agent_stats_t "
                     "before it is missing from src/stats_fields.c",
                     f->name, f->offset, end);
        end += field_size(f->kind);
        assert_true(f->kind <= KVX_STAT_KIND_HISTOGRAM);
        assert_true(f->help[0] != '\0' && f->scale > 0);
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(fields[j].name, f->name);
            assert_string_not_equal(fields[j].metric, f->metric);
        }
    }
    if (end != sizeof(kvx_agent_stats_t))
        fail_msg("the stats fields end at %zu of kvx_agent_stats_t's %zu bytes: its last fields "
                 "are missing from src/stats_fields.c",
                 end, sizeof(kvx_agent_stats_t));
}

/* Every field is in the Prometheus text with its HELP, its TYPE and its own value: each field
 * gets a different one, so a line that printed another field's would show. */
static void prometheus_text_has_every_field(void **state)
{
    size_t count;
    const kvx_stat_field_t *fields = kvx_agent_stats_fields(&count);
    kvx_agent_stats_t stats        = {0};
    char *text;

    (void)state;
    for (size_t i = 0; i < count; i++) {
        char *at       = (char *)&stats + fields[i].offset;
        uint64_t value = 1000 + i;

        if (fields[i].kind == KVX_STAT_KIND_HISTOGRAM) {
            for (uint64_t n = 0; n < value; n++)
                histogram_add((kvx_histogram_t *)at, 1);
        } else {
            memcpy(at, &value, sizeof(value));
        }
    }
    assert_int_equal(kvx_agent_stats_prometheus(&stats, "a", &text), KVX_OK);
    for (size_t i = 0; i < count; i++) {
        const kvx_stat_field_t *f        = &fields[i];
        static const char *const types[] = {"counter", "gauge", "histogram"};
        char line[256];

        snprintf(line, sizeof(line), "# HELP kvx_%s %s\n# TYPE kvx_%s %s\n", f->metric, f->help,
                 f->metric, types[f->kind]);
        if (strstr(text, line) == NULL)
            fail_msg("no HELP and TYPE lines for %s: expected \"%s\"", f->name, line);
        snprintf(line, sizeof(line), "\nkvx_%s%s{agent=\"a\"} ", f->metric,
                 f->kind == KVX_STAT_KIND_HISTOGRAM ? "_count" : "");
        if (strstr(text, line) == NULL)
            fail_msg("no value line for %s: expected \"%s\"", f->name, line + 1);
        assert_true(fabs(metric(text, line) -
                         (double)(1000 + i) * (f->kind == KVX_STAT_KIND_HISTOGRAM ? 1 : f->scale)) <
                    1e-6);
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(observations_land_in_power_of_two_buckets),
        cmocka_unit_test(prometheus_text_is_complete_and_cumulative),
        cmocka_unit_test(stats_fields_tile_the_struct),
        cmocka_unit_test(prometheus_text_has_every_field),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

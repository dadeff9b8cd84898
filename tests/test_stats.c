/* test_stats.c: histograms count each observation in the smallest power-of-two bucket that
 * holds it, and the Prometheus text has every metric with HELP and TYPE, cumulative buckets
 * ending in +Inf, seconds for microseconds, and the agent label escaped. */
#include "stats.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(observations_land_in_power_of_two_buckets),
        cmocka_unit_test(prometheus_text_is_complete_and_cumulative),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

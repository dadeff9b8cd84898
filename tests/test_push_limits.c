/* test_push_limits.c: the admission rule and the deadline of push jobs (push_limits.h), row
 * by row, and the property the rule exists for (issue 22 finding 3): however the writers
 * before it filled the jobs, a writer with none in flight is admitted, and the jobs never
 * exceed PUSH_MAX_JOBS. */
#include "error.h"
#include "prng.h"
#include "push_limits.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <inttypes.h>
#include <cmocka.h>

static const struct admit_case {
    const char *rule;
    struct push_load load;
    kvx_status_t expected;
    const char *msg_part; /* in kvx_errmsg() when refused */
} admit_cases[] = {
    {"a_first_job_is_admitted_when_the_others_fill_the_shared_jobs",
     {PUSH_SHARED_JOBS + 4, 4, 0, 64},
     KVX_OK,
     NULL},
    {"a_first_job_is_admitted_with_every_other_writer_busy",
     {PUSH_MAX_JOBS - 1, PUSH_MAX_WRITERS - 1, 0, 64},
     KVX_OK,
     NULL},
    {"one_writer_alone_takes_up_to_max_pushes", {63, 1, 63, 64}, KVX_OK, NULL},
    {"max_pushes_bounds_a_writer_alone", {64, 1, 64, 64}, KVX_ERR_BUSY, "(max_pushes 64)"},
    {"max_pushes_above_the_shared_jobs_stops_at_them",
     {PUSH_SHARED_JOBS + 1, 1, PUSH_SHARED_JOBS + 1, 1000},
     KVX_ERR_BUSY,
     "all 192 shared pushes"},
    {"a_writer_past_its_fair_share_is_refused",
     {1 + 96 + 1, 2, 1 + 96, 1000},
     KVX_ERR_BUSY,
     "its fair share while 2 peers push"},
    {"a_writer_within_its_fair_share_is_admitted", {1 + 95 + 1, 2, 1 + 95, 1000}, KVX_OK, NULL},
    {"four_stallers_share_the_shared_jobs",
     {4 + 48 * 4, 4, 49, 64},
     KVX_ERR_BUSY,
     "all 192 shared pushes"},
    {"counts_that_do_not_add_up_are_a_bug", {3, 4, 1, 64}, KVX_ERR_INTERNAL, "do not add up"},
    {"a_writer_with_jobs_but_none_busy_is_a_bug", {0, 0, 1, 64}, KVX_ERR_INTERNAL, "do not add up"},
};

static void admission_follows_its_rows(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(admit_cases) / sizeof(admit_cases[0]); i++) {
        const struct admit_case *c = &admit_cases[i];
        kvx_status_t status        = push_limits_admit(&c->load);

        if (status != c->expected)
            fail_msg("%s: status %d, expected %d (%s)", c->rule, status, c->expected, kvx_errmsg());
        if (c->msg_part != NULL && strstr(kvx_errmsg(), c->msg_part) == NULL)
            fail_msg("%s: \"%s\" does not say \"%s\"", c->rule, kvx_errmsg(), c->msg_part);
    }
}

static const struct deadline_case {
    const char *rule;
    uint32_t asked_ms;
    uint32_t timeout_ms;
    uint32_t max_push_ms;
    uint32_t expected_ms;
} deadline_cases[] = {
    {"the_requesters_deadline_beyond_the_timeout", 120000, 10000, 300000, 120000},
    {"the_requesters_shorter_deadline", 2000, 10000, 300000, 2000},
    {"capped_at_max_push_ms", 120000, 10000, 60000, 60000},
    {"a_huge_deadline_is_capped", UINT32_MAX, 10000, 300000, 300000},
    {"none_asked_is_the_timeout", 0, 10000, 300000, 10000},
    {"none_asked_is_the_timeout_capped_too", 0, 10000, 5000, 5000},
};

static void the_deadline_is_the_requesters_up_to_max_push_ms(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(deadline_cases) / sizeof(deadline_cases[0]); i++) {
        const struct deadline_case *c = &deadline_cases[i];
        uint32_t ms = push_limits_deadline(c->asked_ms, c->timeout_ms, c->max_push_ms);

        if (ms != c->expected_ms)
            fail_msg("%s: %" PRIu32 " ms, expected %" PRIu32, c->rule, ms, c->expected_ms);
    }
}

/* Writers arrive and take jobs in a random order, each as many as it is admitted, and jobs
 * end at random; whatever happened, a writer with none is admitted and the total stays
 * within PUSH_MAX_JOBS. */
static void a_writer_with_no_job_is_always_admitted(void **state)
{
    uint64_t seed = prng_seed_from_env(22);
    size_t jobs[PUSH_MAX_WRITERS];
    struct prng rng;

    (void)state;
    prng_init(&rng, seed);
    for (int round = 0; round < 200; round++) {
        uint32_t max_per_peer = (uint32_t)prng_range(&rng, 1, 300);
        struct push_load load = {0, 0, 0, max_per_peer};

        memset(jobs, 0, sizeof(jobs));
        for (int step = 0; step < 4000; step++) {
            size_t w = prng_range(&rng, 0, PUSH_MAX_WRITERS - 1);

            load.writer_jobs = jobs[w];
            if (prng_range(&rng, 0, 3) == 0 && jobs[w] > 0) { /* one of its jobs ends */
                jobs[w]--;
                load.jobs--;
                load.busy -= jobs[w] == 0;
                continue;
            }
            if (push_limits_admit(&load) != KVX_OK) {
                if (jobs[w] == 0)
                    fail_msg("seed %" PRIu64 ": a writer with no job was refused: %s", seed,
                             kvx_errmsg());
                continue;
            }
            load.busy += jobs[w] == 0;
            jobs[w]++;
            load.jobs++;
            if (load.jobs > PUSH_MAX_JOBS)
                fail_msg("seed %" PRIu64 ": %zu jobs", seed, load.jobs);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(admission_follows_its_rows),
        cmocka_unit_test(the_deadline_is_the_requesters_up_to_max_push_ms),
        cmocka_unit_test(a_writer_with_no_job_is_always_admitted),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_hold.c: the prefill side's hold table (hold.c) on a clock the test drives: releases
 * after the last consumer rank, each rank counted once however often it repeats its done,
 * only ranks the hold can have, each bound to one connection (issue 22), leases that expire
 * unless extended, and a lease heap that stays bounded. */
#include "hold.h"
#include "prng.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define MODEL_IDS   512
#define MODEL_RANKS 4

struct release_log {
    uint64_t ids[4096];
    bool expired[4096];
    size_t count;
    uint64_t blocks; /* sum of the first block id of each release, to check the copy */
};

/* The table's release hook: records the release and frees it, as the agent does after the
 * user's callback. */
/* The capability every hold of these tests is taken with. */
static const kvx_token_t token = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};

static void on_release(void *arg, struct hold_release *r)
{
    struct release_log *log = arg;

    if (log->count < 4096) {
        log->expired[log->count] = r->expired;
        log->ids[log->count++]   = r->request_id;
    }
    if (r->num_groups > 0 && r->groups[0].count > 0)
        log->blocks += r->groups[0].ids[0];
    hold_release_free(r);
}

/* Random holds and dones from random ranks over random connections against a model of
 * which ranks reported and over which connection: a hold is released once, after its last
 * distinct rank; repeated, unknown and refused dones (a rank the hold cannot have, a rank
 * bound to another connection, a connection bound to another rank) are counted and change
 * nothing. */
static void holds_release_after_every_consumer_rank_once(void **state)
{
    uint64_t seed                 = prng_seed_from_env(77);
    struct release_log log        = {0};
    struct hold_table table       = {.release = on_release, .arg = &log};
    uint32_t consumers[MODEL_IDS] = {0};           /* 0: not held */
    static uint64_t bound[MODEL_IDS][MODEL_RANKS]; /* the connection rank r reported over */
    bool ended[MODEL_IDS] = {0};                   /* released since: the ring remembers it */
    uint64_t released = 0, unknown = 0, repeated = 0, refused = 0;
    size_t held = 0;
    struct prng prng;

    (void)state;
    memset(bound, 0, sizeof(bound));
    prng_init(&prng, seed);
    for (int step = 0; step < 20000; step++) {
        uint64_t id = prng_range(&prng, 0, MODEL_IDS - 1);

        if (prng_range(&prng, 0, 2) == 0) {
            uint32_t n        = (uint32_t)prng_range(&prng, 1, MODEL_RANKS);
            uint64_t block    = id * 10;
            kvx_group_ids_t g = {&block, 1};
            kvx_status_t st   = hold_table_add(&table, id, &token, &g, 1, n, 0);

            if ((st == KVX_OK) != (consumers[id] == 0))
                fail_msg("seed %llu step %d: hold %llu gave %d", (unsigned long long)seed, step,
                         (unsigned long long)id, st);
            if (st == KVX_OK) {
                consumers[id] = n;
                memset(bound[id], 0, sizeof(bound[id]));
                held++;
            }
        } else {
            uint32_t rank       = (uint32_t)prng_range(&prng, 0, MODEL_RANKS - 1);
            uint64_t conn       = prng_range(&prng, 1, 2 * MODEL_RANKS);
            enum hold_done done = hold_table_done(&table, id, rank, conn, &token);
            enum hold_done want;
            uint32_t reported = 0;
            bool switched     = false;

            for (uint32_t r = 0; r < MODEL_RANKS; r++) {
                reported += bound[id][r] != 0;
                switched = switched || (r != rank && bound[id][r] == conn);
            }
            if (consumers[id] == 0) {
                want = ended[id] ? HOLD_DONE_ENDED : HOLD_DONE_UNKNOWN;
                unknown++;
            } else if (rank >= consumers[id]) { /* TP 1: a hold's ranks are 0..consumers - 1 */
                want = HOLD_DONE_OUTSIDE;
                refused++;
            } else if (bound[id][rank] != 0) {
                want = bound[id][rank] == conn ? HOLD_DONE_REPEATED : HOLD_DONE_TAKEN;
                repeated += want == HOLD_DONE_REPEATED;
                refused += want == HOLD_DONE_TAKEN;
            } else if (switched) {
                want = HOLD_DONE_SWITCHED;
                refused++;
            } else {
                bound[id][rank] = conn;
                want            = HOLD_DONE_COUNTED;
                if (reported + 1 == consumers[id]) {
                    want          = HOLD_DONE_RELEASED;
                    consumers[id] = 0;
                    ended[id]     = true;
                    released++;
                    held--;
                    assert_int_equal(log.ids[log.count - 1], id);
                }
            }
            if (done != want)
                fail_msg("seed %llu step %d: done %llu from rank %u over %llu gave %d, model %d",
                         (unsigned long long)seed, step, (unsigned long long)id, rank,
                         (unsigned long long)conn, done, want);
        }
        if (table.count != held || table.released != released || table.unknown != unknown ||
            table.repeated != repeated || table.ranks_refused != refused)
            fail_msg("seed %llu step %d: table and model disagree", (unsigned long long)seed, step);
    }
    assert_int_equal(log.count, released);
    hold_table_free(&table);
}

/* Issue 10 finding 3: a consumer rank that repeats or retries its done can never release
 * blocks another rank has not read yet. */
static void repeated_done_never_releases_another_ranks_blocks(void **state)
{
    struct release_log log  = {0};
    struct hold_table table = {.release = on_release, .arg = &log};

    (void)state;
    assert_int_equal(hold_table_add(&table, 7, &token, NULL, 0, 2, 0), KVX_OK);
    assert_int_equal(hold_table_done(&table, 7, 0, 1, &token), HOLD_DONE_COUNTED);
    for (int i = 0; i < 5; i++)
        assert_int_equal(hold_table_done(&table, 7, 0, 1, &token), HOLD_DONE_REPEATED);
    assert_int_equal(log.count, 0);
    assert_int_equal(table.count, 1);
    assert_int_equal(hold_table_done(&table, 7, 1, 2, &token), HOLD_DONE_RELEASED);
    assert_int_equal(log.count, 1);
    assert_int_equal(hold_table_done(&table, 7, 1, 2, &token), HOLD_DONE_ENDED);
    assert_int_equal(table.repeated, 5);
    hold_table_free(&table);
}

/* Issue 22 finding 5: with consumers 2, one connection that reported rank 0 and then rank 63
 * released the hold although rank 1 never read. A rank the hold cannot have is refused,
 * counted, and changes nothing, from that connection or another; rank 1 still releases. */
static void a_rank_the_hold_cannot_have_never_counts(void **state)
{
    struct release_log log  = {0};
    struct hold_table table = {.release = on_release, .arg = &log};

    (void)state;
    assert_int_equal(hold_table_add(&table, 7, &token, NULL, 0, 2, 0), KVX_OK);
    assert_int_equal(hold_table_done(&table, 7, 0, 1, &token), HOLD_DONE_COUNTED);
    assert_int_equal(hold_table_done(&table, 7, 63, 1, &token), HOLD_DONE_OUTSIDE);
    assert_int_equal(hold_table_done(&table, 7, 63, 2, &token), HOLD_DONE_OUTSIDE);
    assert_int_equal(hold_table_done(&table, 7, KVX_MAX_TP - 1, 3, &token), HOLD_DONE_OUTSIDE);
    assert_int_equal(hold_table_check(&table, 7, 2, 3, &token), HOLD_DONE_OUTSIDE);
    assert_int_equal(table.ranks_refused, 3); /* a check counts nothing */
    assert_int_equal(table.count, 1);
    assert_int_equal(log.count, 0);
    assert_int_equal(hold_table_done(&table, 7, 1, 2, &token), HOLD_DONE_RELEASED);
    assert_int_equal(log.count, 1);
    assert_int_equal(table.ranks_refused, 3);
    assert_non_null(strstr(hold_done_reason(HOLD_DONE_OUTSIDE), "not a consumer rank"));
    hold_table_free(&table);
}

/* Issue 22 finding 5: a rank counts for the connection that first reported it, and one
 * connection reports one rank of a hold (a decode agent is one rank: every done it sends
 * goes over its one kept socket). The same connection repeating is answered as a repeat. */
static void a_rank_is_bound_to_its_first_connection(void **state)
{
    struct release_log log  = {0};
    struct hold_table table = {.release = on_release, .arg = &log};

    (void)state;
    assert_int_equal(hold_table_add(&table, 7, &token, NULL, 0, 3, 0), KVX_OK);
    assert_int_equal(hold_table_done(&table, 7, 0, 10, &token), HOLD_DONE_COUNTED);
    assert_int_equal(hold_table_done(&table, 7, 0, 11, &token), HOLD_DONE_TAKEN);
    assert_int_equal(hold_table_done(&table, 7, 1, 10, &token), HOLD_DONE_SWITCHED);
    assert_int_equal(hold_table_done(&table, 7, 0, 10, &token), HOLD_DONE_REPEATED);
    assert_int_equal(hold_table_check(&table, 7, 1, 11, &token), HOLD_DONE_COUNTED);
    assert_int_equal(hold_table_done(&table, 7, 1, 11, &token), HOLD_DONE_COUNTED);
    assert_int_equal(hold_table_done(&table, 7, 2, 11, &token), HOLD_DONE_SWITCHED);
    assert_int_equal(table.ranks_refused, 3);
    assert_int_equal(table.repeated, 1);
    assert_int_equal(log.count, 0);
    assert_int_equal(hold_table_check(&table, 7, 2, 12, &token), HOLD_DONE_RELEASED);
    assert_int_equal(hold_table_done(&table, 7, 2, 12, &token), HOLD_DONE_RELEASED);
    assert_int_equal(log.count, 1);
    hold_table_free(&table);
}

/* Which decode ranks a hold's consumers can be, on prefill rank k of N (docs/plan.md "Per
 * region"): with consumers c > 1 (decode TP c * N) the ranks k * c .. k * c + c - 1; with one
 * consumer (decode TP M <= N) the rank k / (N / M), at most k. */
static const struct consumer_rank_case {
    const char *rule;
    uint32_t tp_rank;   /* the prefill rank */
    uint32_t tp_size;   /* its TP size */
    uint32_t consumers; /* of the hold */
    uint32_t rank;      /* the done's */
    bool possible;
} consumer_rank_cases[] = {
    {"P TP 1, D TP 2: rank 0", 0, 1, 2, 0, true},
    {"P TP 1, D TP 2: rank 1", 0, 1, 2, 1, true},
    {"P TP 1, D TP 2: rank 63 is no rank of D", 0, 1, 2, 63, false},
    {"P TP 1, one consumer: rank 0 only", 0, 1, 1, 0, true},
    {"P TP 1, one consumer: not rank 1", 0, 1, 1, 1, false},
    {"P rank 1 of 2, D TP 4: rank 2", 1, 2, 2, 2, true},
    {"P rank 1 of 2, D TP 4: rank 3", 1, 2, 2, 3, true},
    {"P rank 1 of 2, D TP 4: not rank 1 (reads P rank 0)", 1, 2, 2, 1, false},
    {"P rank 1 of 2, D TP 4: not rank 4", 1, 2, 2, 4, false},
    {"P rank 3 of 4, D TP 2: rank 1", 3, 4, 1, 1, true},
    {"P rank 3 of 4, D TP 1: rank 0", 3, 4, 1, 0, true},
    {"P rank 3 of 4, D TP 4: rank 3", 3, 4, 1, 3, true},
    {"P rank 3 of 4, one consumer: not rank 4", 3, 4, 1, 4, false},
    {"P rank 0 of 4, one consumer: rank 0 only", 0, 4, 1, 1, false},
};

static void consumer_ranks_follow_the_tp_sizes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(consumer_rank_cases) / sizeof(consumer_rank_cases[0]); i++) {
        const struct consumer_rank_case *c = &consumer_rank_cases[i];
        struct release_log log             = {0};
        struct hold_table table            = {
                       .release = on_release, .arg = &log, .tp_rank = c->tp_rank, .tp_size = c->tp_size};
        enum hold_done done;

        assert_int_equal(hold_table_add(&table, 1, &token, NULL, 0, c->consumers, 0), KVX_OK);
        done = hold_table_done(&table, 1, c->rank, 1, &token);
        if ((done != HOLD_DONE_OUTSIDE) != c->possible)
            fail_msg("%s: done gave %d", c->rule, done);
        hold_table_free(&table);
    }
}

static void hold_refuses_bad_requests(void **state)
{
    struct release_log log  = {0};
    struct hold_table table = {.release = on_release, .arg = &log};

    (void)state;
    assert_int_equal(hold_table_add(&table, 1, &token, NULL, 0, 0, 0), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "0 consumers"));
    assert_int_equal(hold_table_add(&table, 1, &token, NULL, 0, KVX_MAX_TP + 1, 0),
                     KVX_ERR_INVALID);
    assert_int_equal(hold_table_add(&table, 1, &token, NULL, 0, 1, 0), KVX_OK);
    assert_int_equal(hold_table_add(&table, 1, &token, NULL, 0, 1, 0), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "already held"));
    assert_int_equal(hold_table_add(&table, 2, &token, NULL, 3, 1, 0), KVX_ERR_INVALID);
    hold_table_free(&table);
}

/* Leases on a clock the test drives: a hold expires at its lease, once; a heartbeat moves
 * it to max(old, now + 2/3 lease); stale heap entries of released or extended holds are
 * skipped; a done before the lease wins. */
static void leases_expire_unless_extended(void **state)
{
    struct release_log log  = {0};
    struct hold_table table = {.lease_ms = 900, .release = on_release, .arg = &log};

    (void)state;
    assert_int_equal(hold_table_add(&table, 1, &token, NULL, 0, 1, 0), KVX_OK);
    assert_int_equal(hold_table_add(&table, 2, &token, NULL, 0, 1, 0), KVX_OK);
    assert_int_equal(hold_table_add(&table, 3, &token, NULL, 0, 2, 100), KVX_OK);
    assert_int_equal(hold_table_next_expiry(&table), 900);
    hold_table_extend(&table, 1, &token, 100);  /* 100 + 600 < 900: unchanged */
    hold_table_extend(&table, 1, &token, 500);  /* 500 + 600 = 1100 */
    hold_table_extend(&table, 99, &token, 500); /* not held: ignored */
    hold_table_done(&table, 3, 0, 1, &token);
    hold_table_done(&table, 3, 1, 2, &token); /* released by its consumers, not by its lease */
    assert_false(log.expired[log.count - 1]);
    assert_int_equal(hold_table_expire(&table, 899), 0);
    assert_int_equal(hold_table_expire(&table, 900), 1); /* request 2 */
    assert_int_equal(log.ids[log.count - 1], 2);
    assert_true(log.expired[log.count - 1]);
    assert_int_equal(hold_table_expire(&table, 1099), 0); /* 1's stale 900 entry skipped */
    assert_int_equal(hold_table_expire(&table, 1100), 1);
    assert_int_equal(log.ids[log.count - 1], 1);
    assert_int_equal(table.expired, 2);
    assert_int_equal(table.released, 1);
    assert_int_equal(table.count, 0);
    assert_int_equal(hold_table_expire(&table, 5000), 0);
    assert_int_equal(hold_table_next_expiry(&table), UINT64_MAX);

    /* Many heartbeats keep the heap bounded by the live holds. */
    assert_int_equal(hold_table_add(&table, 7, &token, NULL, 0, 1, 6000), KVX_OK);
    for (uint64_t t = 6000; t < 106000; t += 10)
        hold_table_extend(&table, 7, &token, t);
    assert_true(table.heap_count <= 2 * table.count + 64);
    assert_int_equal(hold_table_expire(&table, 106000), 0);
    assert_int_equal(hold_table_expire(&table, 106590), 1);
    hold_table_free(&table);
}

/* Held blocks are copies: the caller's array may change after kvx_hold. */
static void held_ids_are_copied(void **state)
{
    struct release_log log  = {0};
    struct hold_table table = {.release = on_release, .arg = &log};
    uint64_t block          = 5;
    kvx_group_ids_t g       = {&block, 1};

    (void)state;
    assert_int_equal(hold_table_add(&table, 1, &token, &g, 1, 1, 0), KVX_OK);
    block = 99;
    hold_table_done(&table, 1, 0, 1, &token);
    assert_int_equal(log.blocks, 5);
    hold_table_free(&table);
}

/* Issue 11: a done or heartbeat without the hold's token (a forged one, another request's,
 * or none) changes nothing and is counted; the real one still releases. */
static void a_wrong_token_changes_no_hold(void **state)
{
    struct release_log log  = {0};
    struct hold_table table = {.release = on_release, .arg = &log, .lease_ms = 900};
    kvx_token_t forged      = token;
    const kvx_token_t none  = {{0}};

    (void)state;
    forged.bytes[15] ^= 1; /* one bit off */
    assert_int_equal(hold_table_add(&table, 7, &token, NULL, 0, 1, 0), KVX_OK);
    assert_int_equal(hold_table_done(&table, 7, 0, 1, &forged), HOLD_DONE_FORGED);
    assert_int_equal(hold_table_done(&table, 7, 0, 1, &none), HOLD_DONE_FORGED);
    hold_table_extend(&table, 7, &forged, 800); /* would have moved the lease to 1400 */
    assert_int_equal(table.forged, 3);
    assert_int_equal(log.count, 0);
    assert_int_equal(hold_table_expire(&table, 900), 1); /* its first lease stood */
    assert_int_equal(hold_table_add(&table, 8, &token, NULL, 0, 1, 1000), KVX_OK);
    assert_int_equal(hold_table_done(&table, 8, 0, 1, &token), HOLD_DONE_RELEASED);
    assert_int_equal(table.forged, 3);
    hold_table_free(&table);
}

/* Issue 21: the ring of ended holds says how each of the last HOLD_ENDED_MAX ended (released
 * or expired), newest first for a request held twice, and forgets the oldest; a check judges
 * like a done and changes nothing but the forged count. */
static void ended_holds_are_remembered_in_a_bounded_ring(void **state)
{
    struct release_log log  = {0};
    struct hold_table table = {.lease_ms = 100, .release = on_release, .arg = &log};
    kvx_token_t forged      = token;
    const kvx_token_t none  = {{0}};

    (void)state;
    forged.bytes[0] ^= 1;
    assert_false(hold_token_given(&none));
    assert_true(hold_token_given(&token));
    assert_int_equal(hold_table_add(&table, 1, &token, NULL, 0, 1, 0), KVX_OK);
    assert_int_equal(hold_table_state(&table, 1), HOLD_HELD);
    assert_int_equal(hold_table_check(&table, 1, 0, 1, &token), HOLD_DONE_RELEASED);
    assert_int_equal(hold_table_check(&table, 1, 0, 1, &forged), HOLD_DONE_FORGED);
    assert_int_equal(table.forged, 1);
    assert_int_equal(table.count, 1); /* a check changes no hold */
    assert_int_equal(hold_table_expire(&table, 100), 1);
    assert_int_equal(hold_table_state(&table, 1), HOLD_ENDED_EXPIRED);
    assert_int_equal(hold_table_done(&table, 1, 0, 1, &token), HOLD_DONE_EXPIRED);
    assert_int_equal(hold_table_check(&table, 1, 0, 1, &token), HOLD_DONE_EXPIRED);
    /* held again and released by its consumer: the newer end wins */
    assert_int_equal(hold_table_add(&table, 1, &token, NULL, 0, 1, 200), KVX_OK);
    assert_int_equal(hold_table_done(&table, 1, 0, 1, &token), HOLD_DONE_RELEASED);
    assert_int_equal(hold_table_state(&table, 1), HOLD_ENDED_RELEASED);
    assert_int_equal(hold_table_done(&table, 1, 0, 1, &token), HOLD_DONE_ENDED);
    assert_int_equal(log.count, 2);
    /* HOLD_ENDED_MAX more ends push both of request 1's out */
    for (uint64_t id = 1000; id < 1000 + HOLD_ENDED_MAX; id++) {
        assert_int_equal(hold_table_add(&table, id, &token, NULL, 0, 1, 300), KVX_OK);
        assert_int_equal(hold_table_done(&table, id, 0, 1, &token), HOLD_DONE_RELEASED);
    }
    assert_int_equal(hold_table_state(&table, 1), HOLD_NONE);
    assert_int_equal(hold_table_done(&table, 1, 0, 1, &token), HOLD_DONE_UNKNOWN);
    assert_int_equal(hold_table_state(&table, 1000), HOLD_ENDED_RELEASED);
    assert_int_equal(table.unknown, 3);
    assert_string_equal(hold_done_reason(HOLD_DONE_ENDED),
                        "hold released already: the blocks may have been reused");
    assert_string_equal(hold_done_reason(HOLD_DONE_COUNTED), "");
    hold_table_free(&table);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(holds_release_after_every_consumer_rank_once),
        cmocka_unit_test(repeated_done_never_releases_another_ranks_blocks),
        cmocka_unit_test(a_rank_the_hold_cannot_have_never_counts),
        cmocka_unit_test(a_rank_is_bound_to_its_first_connection),
        cmocka_unit_test(consumer_ranks_follow_the_tp_sizes),
        cmocka_unit_test(hold_refuses_bad_requests),
        cmocka_unit_test(leases_expire_unless_extended),
        cmocka_unit_test(held_ids_are_copied),
        cmocka_unit_test(a_wrong_token_changes_no_hold),
        cmocka_unit_test(ended_holds_are_remembered_in_a_bounded_ring),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

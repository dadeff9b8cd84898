/* test_agent.c: the prefill side's holds, alone (a model check over random holds and dones)
 * and between two real processes: a request held for two consumers is released after the
 * second `done` arrives over UCX, once, and a repeated `done` is counted and ignored. */
#include "agent_hold.h"
#include "prefill.h"
#include "xfer_log.h"
#include "prng.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define MODEL_IDS 512

struct release_log {
    uint64_t ids[4096];
    size_t count;
    uint64_t blocks; /* sum of the first block id of each release, to check the copy */
};

static void on_release(void *arg, uint64_t request_id, const kvx_group_ids_t *groups,
                       size_t num_groups)
{
    struct release_log *log = arg;

    if (log->count < 4096)
        log->ids[log->count++] = request_id;
    if (num_groups > 0 && groups[0].count > 0)
        log->blocks += groups[0].ids[0];
}

/* Random holds and dones against a plain array model: released once after the last
 * consumer, unknown dones counted, the table's count always the model's. */
static void holds_release_after_the_last_consumer(void **state)
{
    uint64_t seed             = prng_seed_from_env(77);
    struct hold_table table   = {0};
    struct release_log log    = {0};
    uint32_t model[MODEL_IDS] = {0}; /* consumers left; 0: not held */
    uint64_t released         = 0;
    uint64_t unknown          = 0;
    size_t held               = 0;
    struct prng prng;

    (void)state;
    prng_init(&prng, seed);
    table.callback = on_release;
    table.arg      = &log;
    for (int step = 0; step < 20000; step++) {
        uint64_t id = prng_range(&prng, 0, MODEL_IDS - 1);

        if (prng_range(&prng, 0, 2) == 0) {
            uint32_t consumers = (uint32_t)prng_range(&prng, 1, 3);
            uint64_t block     = id * 10;
            kvx_group_ids_t g  = {&block, 1};
            kvx_status_t st    = hold_table_add(&table, id, &g, 1, consumers, 0);

            if ((st == KVX_OK) != (model[id] == 0))
                fail_msg("seed %llu step %d: hold %llu gave %d", (unsigned long long)seed, step,
                         (unsigned long long)id, st);
            if (st == KVX_OK) {
                model[id] = consumers;
                held++;
            }
        } else {
            hold_table_done(&table, id);
            if (model[id] == 0) {
                unknown++;
            } else if (--model[id] == 0) {
                released++;
                held--;
                assert_int_equal(log.ids[log.count - 1], id);
            }
        }
        if (table.count != held || table.released != released || table.unknown != unknown)
            fail_msg("seed %llu step %d: table %zu/%llu/%llu, model %zu/%llu/%llu",
                     (unsigned long long)seed, step, table.count,
                     (unsigned long long)table.released, (unsigned long long)table.unknown, held,
                     (unsigned long long)released, (unsigned long long)unknown);
    }
    assert_int_equal(log.count, released);
    hold_table_free(&table);
}

static void hold_refuses_bad_requests(void **state)
{
    struct hold_table table = {0};

    (void)state;
    assert_int_equal(hold_table_add(&table, 1, NULL, 0, 0, 0), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "zero consumers"));
    assert_int_equal(hold_table_add(&table, 1, NULL, 0, 1, 0), KVX_OK);
    assert_int_equal(hold_table_add(&table, 1, NULL, 0, 1, 0), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "already held"));
    assert_int_equal(hold_table_add(&table, 2, NULL, 3, 1, 0), KVX_ERR_INVALID);
    hold_table_free(&table);
}

/* Leases on a clock the test drives: a hold expires at its lease, once; a heartbeat moves
 * it to max(old, now + 2/3 lease); stale heap entries of released or extended holds are
 * skipped; a done before the lease wins. */
static void leases_expire_unless_extended(void **state)
{
    struct hold_table table = {.lease_ms = 900};
    struct release_log log  = {0};

    (void)state;
    table.callback = on_release;
    table.arg      = &log;
    assert_int_equal(hold_table_add(&table, 1, NULL, 0, 1, 0), KVX_OK);
    assert_int_equal(hold_table_add(&table, 2, NULL, 0, 1, 0), KVX_OK);
    assert_int_equal(hold_table_add(&table, 3, NULL, 0, 2, 100), KVX_OK);
    hold_table_extend(&table, 1, 100);  /* 100 + 600 < 900: unchanged */
    hold_table_extend(&table, 1, 500);  /* 500 + 600 = 1100 */
    hold_table_extend(&table, 99, 500); /* not held: ignored */
    hold_table_done(&table, 3);
    hold_table_done(&table, 3); /* released by its consumers, not by its lease */
    assert_int_equal(hold_table_expire(&table, 899), 0);
    assert_int_equal(hold_table_expire(&table, 900), 1); /* request 2 */
    assert_int_equal(log.ids[log.count - 1], 2);
    assert_int_equal(hold_table_expire(&table, 1099), 0); /* 1's stale 900 entry skipped */
    assert_int_equal(hold_table_expire(&table, 1100), 1);
    assert_int_equal(log.ids[log.count - 1], 1);
    assert_int_equal(table.expired, 2);
    assert_int_equal(table.released, 1);
    assert_int_equal(table.count, 0);
    assert_int_equal(hold_table_expire(&table, 5000), 0);

    /* Many heartbeats keep the heap bounded by the live holds. */
    assert_int_equal(hold_table_add(&table, 7, NULL, 0, 1, 6000), KVX_OK);
    for (uint64_t t = 6000; t < 106000; t += 10)
        hold_table_extend(&table, 7, t);
    assert_true(table.heap_count <= 2 * table.count + 64);
    assert_int_equal(hold_table_expire(&table, 106000), 0);
    assert_int_equal(hold_table_expire(&table, 106590), 1);
    hold_table_free(&table);
}

static const char layout_json[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536}], 'views': ["
    "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 4096, 'stride': 4096,"
    " 'num_blocks': 16}]}";

/* An agent on the test layout. */
static kvx_status_t agent_start(const kvx_agent_params_t *params, kvx_agent_t **agent_p)
{
    return agent_from_quoted(layout_json, params, agent_p);
}

static const kvx_agent_params_t listen_params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN,
                                                 .listen     = "127.0.0.1:0"};

/* The prefill process: holds request 7 for two consumers, serves until it was released and
 * one repeated done arrived, and exits 0 when the counts say so. */
static int run_prefill(int ready, int go)
{
    struct release_log log = {0};
    uint64_t block         = 5;
    kvx_group_ids_t group  = {&block, 1};
    kvx_agent_t *agent;
    kvx_agent_stats_t stats;

    (void)go;
    alarm(30);
    if (agent_start(&listen_params, &agent) != KVX_OK)
        return 10;
    kvx_agent_set_release_callback(agent, on_release, &log);
    if (kvx_hold(agent, 7, &group, 1, 2) != KVX_OK)
        return 11;
    report_serving(ready, agent);
    do {
        kvx_agent_progress(agent, 10);
        kvx_agent_stats(agent, &stats);
    } while (stats.released + stats.done_unknown < 2);
    kvx_agent_destroy(agent);
    return stats.held == 0 && stats.released == 1 && stats.done_unknown == 1 && log.count == 1 &&
                   log.ids[0] == 7 && log.blocks == 5
               ? 0
               : 12;
}

static void held_request_is_released_after_every_consumer(void **state)
{
    char listen[ADDRESS_SIZE];
    int status;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    uint64_t ids[]        = {5};
    kvx_group_ids_t group = {ids, 1};
    kvx_request_t request = {&group, 1, NULL, 0};
    pid_t pid             = start_prefill(run_prefill, -1, listen, NULL);

    (void)state;
    assert_int_equal(agent_start(NULL, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, listen, &peer), KVX_OK);
    /* Two consumers' dones, then a repeated one. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvx_read(agent, &peer, 1, 7, &request, NULL), KVX_OK);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    kvx_peer_destroy(peer);
    kvx_agent_destroy(agent);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* A prefill process that serves until killed; reports readiness on `ready`. Its storage is
 * its own memory (as an engine's), read through CMA: shared-memory segments UCX allocates
 * would outlive the process and stay readable. */
static int run_server(int ready, int go)
{
    void *storage             = aligned_alloc(4096, 65536);
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                                               KVX_AGENT_PARAM_FIELD_STORAGE_BASES,
                                 .listen        = "127.0.0.1:0",
                                 .storage_bases = &storage};
    kvx_agent_t *agent;

    (void)go;
    alarm(30);
    if (agent_start(&params, &agent) != KVX_OK)
        return 10;
    report_serving(ready, agent);
    for (;;)
        kvx_agent_progress(agent, 10);
}

/* A posted read completes through progress with one callback; after the prefill process is
 * killed, the next read fails as a whole, reporting its block ids, and never hangs. */
static void posted_reads_complete_once_and_fail_whole(void **state)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .timeout_ms = 2000};
    uint64_t ids[]            = {3, 4, 9};
    kvx_group_ids_t group     = {ids, 3};
    kvx_request_t request     = {&group, 1, NULL, 0};
    struct callback_log log   = {0};
    const kvx_group_ids_t *failed;
    size_t num_failed;
    char listen[ADDRESS_SIZE];
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;
    kvx_status_t status;
    pid_t pid = start_prefill(run_server, -1, listen, NULL);

    (void)state;
    assert_int_equal(agent_start(&params, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, listen, &peer), KVX_OK);

    assert_int_equal(kvx_read_post(agent, &peer, 1, 1, &request, on_xfer, &log, &xfer), KVX_OK);
    assert_int_equal(log.calls, 0); /* never inside the post */
    assert_int_equal(kvx_xfer_wait(xfer), KVX_OK);
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.status, KVX_OK);
    kvx_xfer_failed_blocks(xfer, &failed, &num_failed);
    assert_int_equal(num_failed, 0);
    kvx_xfer_destroy(xfer);
    assert_int_equal(log.calls, 1);

    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    log    = (struct callback_log){0};
    status = kvx_read_post(agent, &peer, 1, 2, &request, on_xfer, &log, &xfer);
    if (status == KVX_OK) {
        status = kvx_xfer_wait(xfer);
        assert_int_equal(log.calls, 1);
        assert_int_equal(log.status, status);
        kvx_xfer_failed_blocks(xfer, &failed, &num_failed);
        assert_int_equal(num_failed, 1);
        assert_int_equal(failed[0].count, 3);
        assert_memory_equal(failed[0].ids, ids, sizeof(ids));
        kvx_xfer_destroy(xfer);
    }
    assert_int_not_equal(status, KVX_OK); /* a dead peer fails: at post or at completion */
    assert_int_equal(kvx_read(agent, &peer, 1, 3, &request, NULL), KVX_ERR_IO);
    assert_non_null(strstr(kvx_errmsg(), "connect again"));
    kvx_peer_destroy(peer);
    kvx_agent_destroy(agent);
}

/* A prefill process with 300 ms leases: once the decode side says it connected, it holds
 * requests 1 and 2. Request 2 expires on its own; request 1 lives while heartbeats come and
 * expires after they stop. Exits 0 when the release times say so. */
static int run_lease_server(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_LEASE_MS,
                                 .listen   = "127.0.0.1:0",
                                 .lease_ms = 300};
    struct release_log log    = {0};
    kvx_agent_t *agent;
    kvx_agent_stats_t stats;
    struct timespec start;
    struct timespec now;
    double released_at[3] = {0};
    char c;

    alarm(30);
    if (agent_start(&params, &agent) != KVX_OK)
        return 10;
    kvx_agent_set_release_callback(agent, on_release, &log);
    report_serving(ready, agent);
    while (read(go, &c, 1) != 1) /* serve the connect meanwhile: go is non-blocking */
        kvx_agent_progress(agent, 5);
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (kvx_hold(agent, 1, NULL, 0, 1) != KVX_OK || kvx_hold(agent, 2, NULL, 0, 1) != KVX_OK)
        return 11;
    (void)!write(ready, "h", 1);
    do {
        size_t before = log.count;

        kvx_agent_progress(agent, 5);
        clock_gettime(CLOCK_MONOTONIC, &now);
        for (size_t i = before; i < log.count; i++)
            released_at[log.ids[i] % 3] =
                (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) * 1e-9;
        kvx_agent_stats(agent, &stats);
    } while (stats.held > 0);
    kvx_agent_destroy(agent);
    /* 2: at its lease. 1: heartbeats for 1 s kept it, then at most a lease after. */
    return stats.leases_expired == 2 && released_at[2] > 0.25 && released_at[2] < 0.9 &&
                   released_at[1] > 1.0 && released_at[1] < 2.5
               ? 0
               : 12;
}

static void heartbeats_extend_leases_and_silence_expires_them(void **state)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .timeout_ms = 2000};
    char listen[ADDRESS_SIZE];
    int ready;
    int go[2];
    int status;
    char c;
    pid_t pid;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    const uint64_t wanted[] = {1};

    (void)state;
    assert_int_equal(pipe(go), 0);
    assert_int_equal(fcntl(go[0], F_SETFL, O_NONBLOCK), 0);
    pid = start_prefill(run_lease_server, go[0], listen, &ready);
    assert_int_equal(agent_start(&params, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, listen, &peer), KVX_OK);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(read(ready, &c, 1), 1); /* held */
    close(ready);
    for (int i = 0; i < 10; i++) { /* every 100 ms for 1 s: well within 2/3 of 300 ms */
        assert_int_equal(kvx_heartbeat(agent, &peer, 1, wanted, 1), KVX_OK);
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    kvx_peer_destroy(peer);
    kvx_agent_destroy(agent);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(holds_release_after_the_last_consumer),
        cmocka_unit_test(hold_refuses_bad_requests),
        cmocka_unit_test(leases_expire_unless_extended),
        cmocka_unit_test(held_request_is_released_after_every_consumer),
        cmocka_unit_test(posted_reads_complete_once_and_fail_whole),
        cmocka_unit_test(heartbeats_extend_leases_and_silence_expires_them),
    };

    setenv("UCX_NET_DEVICES", "lo", 1); /* never another interface */
    alarm(300);                         /* a hang fails the run instead of stalling CI */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_agent.c: the agent between real processes on loopback, every read compared byte for
 * byte: a hold released only once every consumer rank reported (repeats count once); ranks
 * whose tables differ each planned on their own table; callbacks only from progress; destroy
 * orders (a busy agent changes nothing; a failed reconnect leaves a destroyable peer); leases
 * kept by heartbeats and expired by silence on a clock the test advances. */
#include "clock.h"
#include "prefill.h"
#include "xfer_log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define BLOCKS 16
#define PAGE   4096

static const char mla_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536}], 'views': ["
    "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 4096, 'stride': 4096,"
    " 'num_blocks': 16}]}";

/* The prefill side's bytes: word i of rank r's storage. */
static uint64_t pattern_word(uint32_t rank, uint64_t index)
{
    return ((uint64_t)rank << 56 | (index + 1)) * 0x9e3779b97f4a7c15u;
}

static void pattern_fill(kvx_agent_t *agent, uint32_t rank)
{
    uint64_t size;
    uint64_t *words = kvx_agent_storage(agent, 0, &size);

    for (uint64_t i = 0; i < size / 8; i++)
        words[i] = pattern_word(rank, i);
}

/* Bytes at `offset` of our storage equal rank `rank`'s pattern at `remote_offset`. */
static bool bytes_match(const kvx_agent_t *agent, uint64_t offset, uint32_t rank,
                        uint64_t remote_offset, uint64_t len)
{
    const uint64_t *words =
        (const uint64_t *)((const char *)kvx_agent_storage(agent, 0, NULL) + offset);

    for (uint64_t i = 0; i < len / 8; i++) {
        if (words[i] != pattern_word(rank, remote_offset / 8 + i))
            return false;
    }
    return true;
}

static kvx_request_t request_of(kvx_group_ids_t *group, const uint64_t *ids, size_t count)
{
    *group = (kvx_group_ids_t){ids, count};
    return (kvx_request_t){group, 1, NULL, 0, NULL};
}

static const kvx_agent_params_t listen_params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN,
                                                 .listen     = "127.0.0.1:0"};

struct release_log {
    uint64_t ids[64];
    size_t count;
    uint64_t blocks; /* sum of the first block id of each release, to check the copy */
};

static void on_release(void *arg, uint64_t request_id, const kvx_group_ids_t *groups,
                       size_t num_groups)
{
    struct release_log *log = arg;

    if (log->count < 64)
        log->ids[log->count++] = request_id;
    if (num_groups > 0 && groups[0].count > 0)
        log->blocks += groups[0].ids[0];
}

/* Progresses `agent` until its stats satisfy `reached`, or 10 s passed. */
static void progress_until(kvx_agent_t *agent, bool (*reached)(const kvx_agent_stats_t *),
                           kvx_agent_stats_t *stats)
{
    uint64_t start = clock_ms();

    do {
        kvx_agent_progress(agent, 10);
        kvx_agent_stats(agent, stats, sizeof(*stats));
    } while (!reached(stats) && clock_ms() - start < 10000);
}

static bool three_dones(const kvx_agent_stats_t *s)
{
    return s->done_repeated >= 2 || s->released > 0;
}

static bool released_once(const kvx_agent_stats_t *s)
{
    return s->released >= 1;
}

/* The prefill process of the consumer test: holds request 7 for two consumer ranks, says
 * when rank 0's three dones were counted, serves until the release, and exits 0 when the
 * counts say what they must. */
static int run_two_consumer_prefill(int ready, int go)
{
    struct release_log log = {0};
    uint64_t block         = 5;
    kvx_group_ids_t group  = {&block, 1};
    kvx_agent_t *agent;
    kvx_agent_stats_t stats;
    kvx_token_t token;
    int failed;

    (void)go;
    alarm(30);
    if (agent_from_quoted(mla_layout, &listen_params, &agent) != KVX_OK)
        return 10;
    pattern_fill(agent, 0);
    kvx_agent_set_release_callback(agent, on_release, &log);
    if (hold_new(agent, 7, &group, 1, 2, &token) != KVX_OK)
        return 11;
    report_serving(ready, agent);
    report_token(ready, &token);
    progress_until(agent, three_dones, &stats);
    failed = stats.released != 0 || stats.done_repeated != 2;
    (void)!write(ready, failed ? "x" : "3", 1);
    progress_until(agent, released_once, &stats);
    kvx_agent_destroy(agent);
    return !failed && stats.held == 0 && stats.released == 1 && stats.done_repeated == 2 &&
                   log.count == 1 && log.ids[0] == 7 && log.blocks == 5
               ? 0
               : 12;
}

/* Issue 10 finding 3: decode ranks 0 and 1 (TP 2) both read request 7; rank 0 reads it three
 * times (a retry, a repeat), and the prefill side still holds the blocks until rank 1's done.
 * Issue 21: the repeated dones are refused, so rank 0's second and third reads fail. */
static void repeated_done_never_releases_another_ranks_blocks(void **state)
{
    char listen[ADDRESS_SIZE];
    int ready;
    int status;
    char said;
    kvx_agent_t *agents[2];
    kvx_peer_t *peers[2];
    uint64_t ids[] = {5};
    kvx_group_ids_t group;
    kvx_request_t request = request_of(&group, ids, 1);
    pid_t pid             = start_prefill(run_two_consumer_prefill, -1, listen, &ready);
    kvx_token_t token     = read_token(ready);

    (void)state;
    request.token = &token;
    for (uint32_t r = 0; r < 2; r++) {
        kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TP_RANK |
                                                   KVX_AGENT_PARAM_FIELD_TP_SIZE,
                                     .tp_rank = r,
                                     .tp_size = 2};

        assert_int_equal(agent_from_quoted(mla_layout, &params, &agents[r]), KVX_OK);
        assert_int_equal(kvx_agent_connect(agents[r], listen, &peers[r]), KVX_OK);
    }
    for (int i = 0; i < 3; i++) {
        /* issue 21: the repeats are answered, refused, and fail their reads */
        assert_int_equal(kvx_read(agents[0], &peers[0], 1, 7, &request, NULL),
                         i == 0 ? KVX_OK : KVX_ERR_PEER_REFUSED);
        if (i > 0)
            assert_non_null(strstr(kvx_errmsg(), "read 7: remote rank 0: repeated done"));
        assert_true(bytes_match(agents[0], 5 * PAGE, 0, 5 * PAGE, PAGE));
    }
    assert_int_equal(read(ready, &said, 1), 1);
    assert_int_equal(said, '3'); /* three dones from rank 0, nothing released */
    assert_int_equal(kvx_read(agents[1], &peers[1], 1, 7, &request, NULL), KVX_OK);
    assert_true(bytes_match(agents[1], 5 * PAGE, 0, 5 * PAGE, PAGE));
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(ready);
    for (int r = 0; r < 2; r++) {
        kvx_peer_destroy(peers[r]);
        assert_int_equal(kvx_agent_destroy(agents[r]), KVX_OK);
    }
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Prefill rank `go` (passed as the rank) of two, on a head-split layout whose view sits at
 * another offset on each rank: rank 1's tables differ from rank 0's. Serves until killed. */
static int run_rank_prefill(int ready, int rank)
{
    char layout[512];
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                                               KVX_AGENT_PARAM_FIELD_TP_RANK |
                                               KVX_AGENT_PARAM_FIELD_TP_SIZE,
                                 .listen  = "127.0.0.1:0",
                                 .tp_rank = (uint32_t)rank,
                                 .tp_size = 2};
    kvx_agent_t *agent;

    alarm(60);
    snprintf(layout, sizeof(layout),
             "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 40960}], 'views': ["
             "{'name': 'layers.0.attn', 'kind': 'attn', 'storage': 'kv', 'offset': %d,"
             " 'page': 2048, 'stride': 2048, 'num_blocks': 16}]}",
             rank == 0 ? 0 : 8192);
    if (agent_from_quoted(layout, &params, &agent) != KVX_OK)
        return 10;
    pattern_fill(agent, (uint32_t)rank);
    report_serving(ready, agent);
    for (;;)
        kvx_agent_progress(agent, 100);
}

/* Issue 10 finding 4: a TP 1 decode rank reads each block's two halves from prefill ranks 0
 * and 1, whose views sit at offsets 0 and 8192: rank 1's half comes from rank 1's own table
 * (planning both with rank 0's table would read rank 1's storage at rank 0's offsets). */
static void ranks_whose_tables_differ_are_read_by_their_own_plans(void **state)
{
    static const char decode_layout[] =
        "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536}], 'views': ["
        "{'name': 'layers.0.attn', 'kind': 'attn', 'storage': 'kv', 'page': 4096,"
        " 'stride': 4096, 'num_blocks': 16}]}";
    char listen[2][ADDRESS_SIZE];
    pid_t pids[2];
    kvx_agent_t *agent;
    kvx_peer_t *peers[2];
    uint64_t ids[] = {0, 3, 15};
    kvx_group_ids_t group;
    kvx_request_t request = request_of(&group, ids, 3);

    (void)state;
    for (int r = 0; r < 2; r++)
        pids[r] = start_prefill(run_rank_prefill, r, listen[r], NULL);
    assert_int_equal(agent_from_quoted(decode_layout, NULL, &agent), KVX_OK);
    for (int r = 0; r < 2; r++)
        assert_int_equal(kvx_agent_connect(agent, listen[1 - r], &peers[r]), KVX_OK);
    assert_int_equal(kvx_read(agent, peers, 2, 1, &request, NULL), KVX_OK);
    for (size_t k = 0; k < 3; k++) {
        uint64_t b = ids[k];

        if (!bytes_match(agent, b * PAGE, 0, b * 2048, 2048))
            fail_msg("block %llu: rank 0's half is wrong", (unsigned long long)b);
        if (!bytes_match(agent, b * PAGE + 2048, 1, 8192 + b * 2048, 2048))
            fail_msg("block %llu: rank 1's half is not from rank 1's own table",
                     (unsigned long long)b);
    }
    for (int r = 0; r < 2; r++) {
        kvx_peer_destroy(peers[r]);
        kill(pids[r], SIGKILL);
        waitpid(pids[r], NULL, 0);
    }
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
}

/* A prefill process that serves until killed, from its own memory (read through CMA: a
 * kvx-allocated shared-memory segment would outlive the process and stay readable). */
static int run_server(int ready, int go)
{
    void *storage             = aligned_alloc(4096, 65536);
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                                               KVX_AGENT_PARAM_FIELD_STORAGE_BASES,
                                 .listen        = "127.0.0.1:0",
                                 .storage_bases = &storage};
    kvx_agent_t *agent;

    (void)go;
    alarm(60);
    if (agent_from_quoted(mla_layout, &params, &agent) != KVX_OK)
        return 10;
    pattern_fill(agent, 0);
    report_serving(ready, agent);
    for (;;)
        kvx_agent_progress(agent, 100);
}

/* Callbacks must run only inside the calls that run the loop: the test says when it is in
 * one, and the callback checks. */
static bool in_loop;

struct checked_log {
    int calls;
    kvx_status_t status;
    bool outside; /* a call came from outside the loop */
};

static void on_checked_xfer(void *arg, kvx_xfer_t *xfer, kvx_status_t status)
{
    struct checked_log *log = arg;

    (void)xfer;
    log->calls++;
    log->status = status;
    log->outside |= !in_loop;
}

static void progress_checked(kvx_agent_t *agent, int ms)
{
    in_loop = true;
    kvx_agent_progress(agent, ms);
    in_loop = false;
}

/* Issue 10 finding 6: a callback never runs inside a post, a transfer's destroy or a peer's
 * destroy, only from progress; a cancelled transfer's callback still runs, once, with
 * KVX_ERR_CANCELED. And finding 7: an agent with peers or transfers is busy and unchanged. */
static void callbacks_run_only_from_progress_and_destroy_waits_for_them(void **state)
{
    uint64_t ids[] = {1, 2, 3};
    kvx_group_ids_t group;
    kvx_request_t request  = request_of(&group, ids, 3);
    struct checked_log log = {0};
    char listen[ADDRESS_SIZE];
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;
    pid_t pid = start_prefill(run_server, -1, listen, NULL);

    (void)state;
    assert_int_equal(agent_from_quoted(mla_layout, NULL, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, listen, &peer), KVX_OK);

    /* completes: the callback comes from the wait, once */
    assert_int_equal(kvx_read_post(agent, &peer, 1, 1, &request, on_checked_xfer, &log, &xfer),
                     KVX_OK);
    assert_int_equal(log.calls, 0);
    assert_int_equal(kvx_agent_destroy(agent), KVX_ERR_BUSY); /* a peer and a transfer */
    assert_non_null(strstr(kvx_errmsg(), "1 peers and 1 transfers"));
    in_loop = true;
    assert_int_equal(kvx_xfer_wait(xfer), KVX_OK);
    in_loop = false;
    assert_int_equal(log.calls, 1);
    for (size_t k = 0; k < 3; k++)
        assert_true(bytes_match(agent, ids[k] * PAGE, 0, ids[k] * PAGE, PAGE));
    kvx_xfer_destroy(xfer);

    /* cancelled by its own destroy: the callback comes from the next progress */
    log = (struct checked_log){0};
    assert_int_equal(kvx_read_post(agent, &peer, 1, 2, &request, on_checked_xfer, &log, &xfer),
                     KVX_OK);
    kvx_xfer_destroy(xfer);
    assert_int_equal(log.calls, 0);
    assert_int_equal(kvx_agent_destroy(agent), KVX_ERR_BUSY); /* its callback is still due */
    progress_checked(agent, 0);
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.status, KVX_ERR_CANCELED);
    assert_non_null(kvx_peer_down_reason(peer)); /* it was read from: closed */
    assert_int_equal(kvx_peer_reconnect(peer), KVX_OK);

    /* cancelled by its peer's destroy */
    log = (struct checked_log){0};
    assert_int_equal(kvx_read_post(agent, &peer, 1, 3, &request, on_checked_xfer, &log, &xfer),
                     KVX_OK);
    kvx_peer_destroy(peer);
    assert_int_equal(log.calls, 0);
    progress_checked(agent, 0);
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.status, KVX_ERR_CANCELED);
    assert_int_equal(kvx_xfer_status(xfer), KVX_ERR_CANCELED);
    assert_int_equal(kvx_agent_destroy(agent), KVX_ERR_BUSY); /* the caller still holds it */
    kvx_xfer_destroy(xfer);
    assert_false(log.outside);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* A read after the prefill process was killed fails whole with its block ids; a reconnect
 * to the dead address fails and leaves the peer down, valid and destroyable. */
static void dead_prefill_fails_reads_and_a_failed_reconnect_keeps_the_peer(void **state)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .timeout_ms = 2000};
    uint64_t ids[]            = {3, 4, 9};
    kvx_group_ids_t group;
    kvx_request_t request   = request_of(&group, ids, 3);
    struct callback_log log = {0};
    const kvx_group_ids_t *failed;
    size_t num_failed;
    char listen[ADDRESS_SIZE];
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;
    kvx_status_t status;
    pid_t pid = start_prefill(run_server, -1, listen, NULL);

    (void)state;
    assert_int_equal(agent_from_quoted(mla_layout, &params, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, listen, &peer), KVX_OK);
    assert_int_equal(kvx_read(agent, &peer, 1, 1, &request, NULL), KVX_OK);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
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
    assert_true(status == KVX_ERR_PEER_DOWN || status == KVX_ERR_PEER_TIMEOUT);
    assert_int_equal(kvx_read(agent, &peer, 1, 3, &request, NULL), KVX_ERR_PEER_DOWN);
    assert_non_null(strstr(kvx_errmsg(), "reconnect it"));
    assert_int_not_equal(kvx_peer_reconnect(peer), KVX_OK);
    assert_non_null(kvx_peer_down_reason(peer));
    assert_int_equal(kvx_read(agent, &peer, 1, 4, &request, NULL), KVX_ERR_PEER_DOWN);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
}

/* Ten minutes: the test moves the clock by minutes, so the seconds that starting processes
 * take on a loaded machine never decide an expiry. */
#define LEASE_MS 600000

/* Reads one command byte from `go` while serving: 'a' advances this process's clock by the
 * next 4 bytes' milliseconds, 'h' serves until that many notifications (heartbeats) came in
 * all; each is answered with the stats on `ready`. */
static int run_lease_prefill(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_LEASE_MS,
                                 .listen   = "127.0.0.1:0",
                                 .lease_ms = LEASE_MS};
    struct release_log log    = {0};
    kvx_agent_t *agent;
    kvx_agent_stats_t stats;
    kvx_token_t tokens[2];
    char command;

    alarm(60);
    if (agent_from_quoted(mla_layout, &params, &agent) != KVX_OK)
        return 10;
    kvx_agent_set_release_callback(agent, on_release, &log);
    if (hold_new(agent, 1, NULL, 0, 1, &tokens[0]) != KVX_OK ||
        hold_new(agent, 2, NULL, 0, 1, &tokens[1]) != KVX_OK)
        return 11;
    report_serving(ready, agent);
    report_token(ready, &tokens[0]);
    for (;;) {
        struct pollfd item = {.fd = go, .events = POLLIN};
        uint32_t amount;

        kvx_agent_progress(agent, 10);
        if (poll(&item, 1, 0) <= 0)
            continue;
        if (read(go, &command, 1) != 1 || command == 'q')
            break;
        if (read(go, &amount, sizeof(amount)) != sizeof(amount))
            return 13;
        kvx_agent_stats(agent, &stats, sizeof(stats));
        if (command == 'h') {
            uint64_t start = clock_ms();

            while (stats.notifications < amount && clock_ms() - start < 10000) {
                kvx_agent_progress(agent, 10);
                kvx_agent_stats(agent, &stats, sizeof(stats));
            }
        } else {
            clock_advance_ms(amount);
            for (int i = 0; i < 3; i++) /* the lease timer fires, the releases run */
                kvx_agent_progress(agent, 0);
        }
        kvx_agent_stats(agent, &stats, sizeof(stats));
        if (write(ready, &stats, sizeof(stats)) != sizeof(stats))
            return 14;
    }
    kvx_agent_destroy(agent);
    return 0;
}

static kvx_agent_stats_t lease_command(int go, int ready, char command, uint32_t amount)
{
    kvx_agent_stats_t stats;

    assert_int_equal(write(go, &command, 1), 1);
    assert_int_equal(write(go, &amount, sizeof(amount)), sizeof(amount));
    assert_int_equal(read(ready, &stats, sizeof(stats)), sizeof(stats));
    return stats;
}

/* Leases on the prefill side's clock, which the test moves: request 2 expires at its lease;
 * request 1, heartbeated at 400 s, lives until 400 s + 2/3 of the lease, then expires. No
 * wall-clock window decides anything. */
static void heartbeats_extend_leases_and_silence_expires_them(void **state)
{
    const uint64_t wanted[] = {1};
    char listen[ADDRESS_SIZE];
    int ready;
    int go[2];
    int status;
    pid_t pid;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t s;
    kvx_token_t token;

    (void)state;
    assert_int_equal(pipe(go), 0);
    pid   = start_prefill(run_lease_prefill, go[0], listen, &ready);
    token = read_token(ready);
    close(go[0]);
    assert_int_equal(agent_from_quoted(mla_layout, NULL, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, listen, &peer), KVX_OK);
    s = lease_command(go[1], ready, 'a', 400000); /* t = 400 s: both still held */
    assert_int_equal(s.held, 2);
    assert_int_equal(kvx_heartbeat(agent, &peer, 1, wanted, &token, 1), KVX_OK);
    s = lease_command(go[1], ready, 'h', 2); /* connect's, then this: 1's lease is now
                                                max(600 s, 400 s + 400 s) */
    assert_int_equal(s.held, 2);
    s = lease_command(go[1], ready, 'a', 300000); /* t = 700 s */
    assert_int_equal(s.held, 1);
    assert_int_equal(s.leases_expired, 1);
    s = lease_command(go[1], ready, 'a', 90000); /* t = 790 s */
    assert_int_equal(s.held, 1);
    s = lease_command(go[1], ready, 'a', 20000); /* t = 810 s */
    assert_int_equal(s.held, 0);
    assert_int_equal(s.leases_expired, 2);
    assert_int_equal(write(go[1], "q", 1), 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(go[1]);
    close(ready);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* The agent's descriptor: readable when progress has work, so an event loop can sleep on it. */
static void agent_fd_is_readable_when_progress_has_work(void **state)
{
    uint64_t ids[] = {1};
    kvx_group_ids_t group;
    kvx_request_t request   = request_of(&group, ids, 1);
    struct callback_log log = {0};
    char listen[ADDRESS_SIZE];
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;
    pid_t pid = start_prefill(run_server, -1, listen, NULL);
    uint64_t start;

    (void)state;
    assert_int_equal(agent_from_quoted(mla_layout, NULL, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, listen, &peer), KVX_OK);
    assert_true(kvx_agent_fd(agent) >= 0);
    assert_int_equal(kvx_read_post(agent, &peer, 1, 1, &request, on_xfer, &log, &xfer), KVX_OK);
    start = clock_ms();
    while (log.calls == 0 && clock_ms() - start < 10000) {
        struct pollfd item = {.fd = kvx_agent_fd(agent), .events = POLLIN};

        if (poll(&item, 1, 1000) > 0)
            kvx_agent_progress(agent, 0);
    }
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.status, KVX_OK);
    kvx_xfer_destroy(xfer);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(repeated_done_never_releases_another_ranks_blocks),
        cmocka_unit_test(ranks_whose_tables_differ_are_read_by_their_own_plans),
        cmocka_unit_test(callbacks_run_only_from_progress_and_destroy_waits_for_them),
        cmocka_unit_test(dead_prefill_fails_reads_and_a_failed_reconnect_keeps_the_peer),
        cmocka_unit_test(heartbeats_extend_leases_and_silence_expires_them),
        cmocka_unit_test(agent_fd_is_readable_when_progress_has_work),
    };

    setenv("UCX_NET_DEVICES", "lo", 1); /* never another interface */
    alarm(300);                         /* a hang fails the run instead of stalling CI */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

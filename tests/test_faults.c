/* test_faults.c: the faults of issue 6 between real processes on loopback: a prefill process
 * killed in the middle of a pull, a decode process killed while its blocks are held, a
 * prefill process stopped past the deadline and past the heartbeats, stray and malformed
 * notifications, and a soak of many requests with aborts after which nothing is held and the
 * counts add up. Every read is checked byte for byte against the prefill side's pattern. */
#include "auth.h"
#include "clock.h"
#include "conn.h"
#include "core.h"
#include "notify.h"
#include "peer.h"
#include "prefill.h"
#include "push_request.h"
#include "sidechan.h"
#include "xfer.h"
#include "xfer_log.h"
#include "prng.h"

#include <zmq.h>

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

#define PAGE         4096   /* bytes per block of the layouts of small tests */
#define SMALL_BLOCKS 1024   /* 4 MiB: the layout of the tests that need no large pull */
#define BIG_PAGE     512    /* bytes: small blocks make a pull of many gets */
#define BIG_BLOCKS   524288 /* 256 MiB: a pull over TCP that takes long enough to be cut */
/* Seconds a failure may come past its deadline: closing a dead peer's endpoint may wait 1 s,
 * and a loaded machine (ASan, ctest -j2) adds its own delay. */
#define SLACK_S 2.0

/* An agent on a layout of `blocks` pages of `page` bytes, one MLA view over one storage;
 * `storage`, when not NULL, is its memory (an engine's, which dies with its process), else
 * kvx allocates it. */
static kvx_status_t agent_on_blocks(uint64_t page, uint64_t blocks, void *storage,
                                    kvx_agent_params_t params, kvx_agent_t **agent_p)
{
    char layout[512];

    snprintf(layout, sizeof(layout),
             "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': %llu}], 'views': ["
             "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': %d, 'stride': %d,"
             " 'num_blocks': %llu}]}",
             (unsigned long long)(blocks * page), (int)page, (int)page, (unsigned long long)blocks);
    if (storage != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_STORAGE_BASES;
        params.storage_bases = &storage;
    }
    return agent_from_quoted(layout, &params, agent_p);
}

/* The prefill side's bytes: word i of the storage is pattern_word(i), so a byte read from
 * the wrong place, or not read at all, shows. */
static uint64_t pattern_word(uint64_t index)
{
    return (index + 1) * 0x9e3779b97f4a7c15u;
}

static uint64_t *pattern_storage(uint64_t bytes)
{
    uint64_t *words = aligned_alloc(4096, bytes);

    for (uint64_t i = 0; words != NULL && i < bytes / sizeof(*words); i++)
        words[i] = pattern_word(i);
    return words;
}

/* Bytes per block of the agent's one view. */
static uint64_t block_len(const kvx_agent_t *agent)
{
    kvx_region_info_t info;

    assert_int_equal(kvx_regions_get(kvx_agent_regions(agent), 0, &info), KVX_OK);
    return info.block_len;
}

/* True when block `id` of the decode agent's storage holds the pattern. */
static bool block_matches(const kvx_agent_t *agent, uint64_t id)
{
    const uint64_t *words = kvx_agent_storage(agent, 0, NULL);
    uint64_t page         = block_len(agent);

    for (uint64_t i = id * page / 8; i < (id + 1) * page / 8; i++) {
        if (words[i] != pattern_word(i))
            return false;
    }
    return true;
}

/* Checks that blocks `ids` of the decode agent's storage hold the pattern. */
static void blocks_verify(const kvx_agent_t *agent, const uint64_t *ids, size_t count)
{
    for (size_t k = 0; k < count; k++) {
        if (!block_matches(agent, ids[k]))
            fail_msg("block %llu does not hold the prefill side's bytes",
                     (unsigned long long)ids[k]);
    }
}

/* Zeroes blocks `ids` of the decode agent's storage, so a read that loads nothing shows. */
static void blocks_clear(const kvx_agent_t *agent, const uint64_t *ids, size_t count)
{
    char *base    = kvx_agent_storage(agent, 0, NULL);
    uint64_t page = block_len(agent);

    for (size_t k = 0; k < count; k++)
        memset(base + ids[k] * page, 0, page);
}

/* Reads `count` blocks (the same ids on both sides) as request `request_id` and checks every
 * byte. */
/* The tokens of the requests the current prefill process holds (struct prefill_config
 * .hold), as it reported them: a read of one of those presents its token with the done. */
static struct held_token {
    uint64_t request_id;
    kvx_token_t token;
} held_tokens[2];

static const kvx_token_t *token_of(uint64_t request_id)
{
    for (size_t i = 0; i < 2; i++) {
        if (held_tokens[i].request_id == request_id && request_id != 0)
            return &held_tokens[i].token;
    }
    return NULL;
}

static void read_verified(kvx_agent_t *agent, kvx_peer_t *peer, uint64_t request_id,
                          const uint64_t *ids, size_t count)
{
    kvx_group_ids_t group = {ids, count};
    kvx_request_t request = {&group, 1, NULL, 0, token_of(request_id)};
    kvx_status_t status;

    blocks_clear(agent, ids, count);
    status = kvx_read(agent, &peer, 1, request_id, &request, NULL);
    if (status != KVX_OK)
        fail_msg("read %llu: %s", (unsigned long long)request_id, kvx_errmsg());
    blocks_verify(agent, ids, count);
}

/* What a test leaves behind when an assertion jumps out of it: the teardown ends these
 * processes and destroys this agent, because the next test forks, and a child forked from a
 * process that has an agent (a UCX context) cannot use UCX. */
static struct leftovers {
    pid_t pids[4];
    kvx_agent_t *agent; /* the decode agent, or the prefill agent when the parent is P */
    kvx_peer_t *peer;   /* the decode agent's peer */
} left;

static pid_t child_track(pid_t pid)
{
    for (size_t i = 0; i < 4; i++) {
        if (left.pids[i] == 0) {
            left.pids[i] = pid;
            return pid;
        }
    }
    fail_msg("more than 4 child processes at once");
    return pid;
}

/* Ends child `pid` with SIGKILL and reaps it. */
static void child_kill(pid_t pid)
{
    for (size_t i = 0; i < 4; i++)
        left.pids[i] = left.pids[i] == pid ? 0 : left.pids[i];
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
}

/* Reaps child `pid`, which ends on its own, and returns its wait status. */
static int child_wait(pid_t pid)
{
    int status;

    for (size_t i = 0; i < 4; i++)
        left.pids[i] = left.pids[i] == pid ? 0 : left.pids[i];
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

/* This process's agent (the decode side, or P when the parent is P), tracked for the
 * teardown. */
static kvx_agent_t *agent_create_tracked(uint64_t page, uint64_t blocks, kvx_agent_params_t params)
{
    kvx_agent_t *agent = NULL;

    if (agent_on_blocks(page, blocks, NULL, params, &agent) != KVX_OK)
        fail_msg("agent: %s", kvx_errmsg());
    left.agent = agent;
    return agent;
}

/* Connects to `address`; the peer is tracked for the teardown. */
static kvx_peer_t *connect_tracked(kvx_agent_t *agent, const char *address)
{
    kvx_peer_t *peer = NULL;

    if (kvx_agent_connect(agent, address, &peer) != KVX_OK)
        fail_msg("connect %s: %s", address, kvx_errmsg());
    left.peer = peer;
    return peer;
}

static void peer_destroy(kvx_peer_t *peer)
{
    kvx_peer_destroy(peer);
    left.peer = left.peer == peer ? NULL : left.peer;
}

/* Destroys the agent, which must have nothing left: every peer and transfer destroyed. */
static void agent_destroy(kvx_agent_t *agent)
{
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    left.agent = NULL;
}

static int leftovers_clean(void **state)
{
    (void)state;
    kvx_peer_destroy(left.peer);
    for (int i = 0; i < 3 && left.agent != NULL; i++)
        kvx_agent_progress(left.agent, 0); /* cancelled transfers run their callbacks */
    if (kvx_agent_destroy(left.agent) != KVX_OK) {
        /* a transfer the failed test still held: the next fork would inherit UCX */
        fprintf(stderr, "teardown: %s; stopping here\n", kvx_errmsg());
        for (size_t i = 0; i < 4; i++)
            if (left.pids[i] != 0)
                kill(left.pids[i], SIGKILL);
        _exit(1);
    }
    for (size_t i = 0; i < 4; i++) {
        if (left.pids[i] != 0) {
            kill(left.pids[i], SIGKILL);
            waitpid(left.pids[i], NULL, 0);
        }
    }
    left = (struct leftovers){0};
    return 0;
}

/* What the next forked prefill process serves; the child inherits it through fork. */
static struct prefill_config {
    uint64_t page;          /* bytes per block of its layout */
    uint64_t blocks;        /* of its layout, filled with the pattern */
    const char *transports; /* NULL: kvx's default */
    uint64_t hold[2];       /* requests held from the start; 0: none */
    uint32_t consumers;     /* of each hold; 0: one */
    bool spare;             /* waits for a byte on `go` before it creates its agent */
    bool kvx_storage;       /* kvx allocates its storage (mapped by a same-host peer) */
    const char *listen;     /* NULL: a free port */
} config;

/* A prefill process: serves `config` from its own memory until killed, and answers each byte
 * on `go` (non-blocking) with its kvx_agent_stats on `ready`. */
static int run_prefill(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN,
                                 .listen     = "127.0.0.1:0"};
    struct pollfd started     = {.fd = go, .events = POLLIN};
    uint64_t *storage;
    kvx_agent_t *agent;
    char c;

    alarm(60);
    if (config.spare && (poll(&started, 1, -1) != 1 || read(go, &c, 1) != 1))
        return 9;
    storage = config.kvx_storage ? NULL : pattern_storage(config.page * config.blocks);
    if (config.listen != NULL)
        params.listen = config.listen;
    if (config.transports != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_TRANSPORTS;
        params.transports = config.transports;
    }
    if ((storage == NULL && !config.kvx_storage) ||
        agent_on_blocks(config.page, config.blocks, storage, params, &agent) != KVX_OK)
        return 10;
    if (config.kvx_storage) {
        uint64_t *words = kvx_agent_storage(agent, 0, NULL);

        for (uint64_t i = 0; i < config.page * config.blocks / sizeof(*words); i++)
            words[i] = pattern_word(i);
    }
    kvx_token_t tokens[2] = {{{0}}};

    for (size_t i = 0; i < 2; i++) {
        kvx_group_ids_t group = {&config.hold[i], 1};

        if (config.hold[i] != 0 &&
            hold_new(agent, config.hold[i], &group, 1, config.consumers > 0 ? config.consumers : 1,
                     &tokens[i]) != KVX_OK)
            return 11;
    }
    report_serving(ready, agent);
    report_token(ready, &tokens[0]);
    report_token(ready, &tokens[1]);
    for (;;) {
        kvx_agent_progress(agent, 10);
        if (read(go, &c, 1) == 1) {
            kvx_agent_stats_t stats;

            kvx_agent_stats(agent, &stats, sizeof(stats));
            (void)!write(ready, &stats, sizeof(stats));
        }
    }
}

/* The parent's handle on a prefill process. */
struct prefill {
    pid_t pid;
    int ready; /* its answers */
    int go;    /* our questions */
    char address[ADDRESS_SIZE];
};

static void prefill_serving(struct prefill *p);

/* Forks a prefill process serving `config`; unless it is a spare, waits until it serves. */
static void prefill_start(struct prefill *p)
{
    int go[2];

    assert_null(left.agent); /* see struct leftovers */
    assert_int_equal(pipe(go), 0);
    assert_int_equal(fcntl(go[0], F_SETFL, O_NONBLOCK), 0);
    p->pid = child_track(prefill_fork(run_prefill, go[0], &p->ready));
    close(go[0]);
    p->go = go[1];
    if (!config.spare)
        prefill_serving(p);
}

/* Waits until the prefill process serves, and learns its holds' tokens. */
static void prefill_serving(struct prefill *p)
{
    prefill_wait_serving(p->ready, p->address);
    for (size_t i = 0; i < 2; i++)
        held_tokens[i] = (struct held_token){config.hold[i], read_token(p->ready)};
}

/* A spare prefill process, forked earlier, creates its agent now and serves. */
static void prefill_start_spare(struct prefill *p)
{
    assert_int_equal(write(p->go, "g", 1), 1);
    prefill_serving(p);
}

static void prefill_kill(struct prefill *p)
{
    child_kill(p->pid);
    close(p->ready);
    close(p->go);
}

/* Stops (SIGSTOP) or continues the prefill process, once the kernel says it did. */
static void prefill_stop(const struct prefill *p)
{
    int status;

    assert_int_equal(kill(p->pid, SIGSTOP), 0);
    assert_int_equal(waitpid(p->pid, &status, WUNTRACED), p->pid);
    assert_true(WIFSTOPPED(status));
}

static void prefill_continue(const struct prefill *p)
{
    assert_int_equal(kill(p->pid, SIGCONT), 0);
}

static kvx_agent_stats_t prefill_stats(const struct prefill *p)
{
    kvx_agent_stats_t stats;

    assert_int_equal(write(p->go, "s", 1), 1);
    assert_int_equal(read(p->ready, &stats, sizeof(stats)), sizeof(stats));
    return stats;
}

/* The prefill process's stats once they reached these counts, or after 5 s: its progress
 * gets to our messages in its own time. */
static kvx_agent_stats_t prefill_stats_reach(const struct prefill *p, uint64_t dropped,
                                             uint64_t unknown, uint64_t released)
{
    uint64_t start          = clock_ms();
    kvx_agent_stats_t stats = prefill_stats(p);

    while ((stats.notifications_dropped < dropped || stats.done_unknown < unknown ||
            stats.released < released) &&
           clock_ms() - start < 5000) {
        nanosleep(&(struct timespec){0, 2000000}, NULL);
        stats = prefill_stats(p);
    }
    return stats;
}

/* Checks that the failed transfer `xfer` reports exactly `ids` as not loaded. */
static void failed_blocks_are(const kvx_xfer_t *xfer, const uint64_t *ids, size_t count)
{
    const kvx_group_ids_t *failed;
    size_t num_failed;

    kvx_xfer_failed_blocks(xfer, &failed, &num_failed);
    assert_int_equal(num_failed, 1);
    assert_int_equal(failed[0].count, count);
    assert_memory_equal(failed[0].ids, ids, count * sizeof(*ids));
}

/* Destroys an agent whose worker still holds the requests of gets cut by a dead peer: UCX
 * warns once per request at the worker's end, hundreds of thousands of lines after a large
 * pull, so they go to a file and only their count to the log. */
static void agent_destroy_counting_warnings(kvx_agent_t *agent)
{
    FILE *log       = tmpfile();
    int saved_out   = dup(STDOUT_FILENO);
    int saved_err   = dup(STDERR_FILENO);
    size_t warnings = 0;
    char line[512];

    assert_non_null(log);
    fflush(stdout);
    fflush(stderr);
    dup2(fileno(log), STDOUT_FILENO);
    dup2(fileno(log), STDERR_FILENO);
    agent_destroy(agent);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, STDOUT_FILENO);
    dup2(saved_err, STDERR_FILENO);
    close(saved_out);
    close(saved_err);
    rewind(log);
    while (fgets(line, sizeof(line), log) != NULL)
        warnings += strstr(line, "WARN") != NULL;
    fclose(log);
    print_message("destroying the agent: UCX warned %zu times (requests of the cut gets)\n",
                  warnings);
}

/* Progresses `agent` until it counted `count` notifications (heartbeats and dones), or 10 s. */
static void notifications_wait(kvx_agent_t *agent, uint64_t count)
{
    kvx_agent_stats_t stats;
    uint64_t start = clock_ms();

    do {
        kvx_agent_progress(agent, 5);
        kvx_agent_stats(agent, &stats, sizeof(stats));
    } while (stats.notifications < count && clock_ms() - start < 10000);
    assert_true(stats.notifications >= count);
}

/* Progresses `agent` for `ms` milliseconds. */
static void progress_for(kvx_agent_t *agent, uint64_t ms)
{
    for (uint64_t start = clock_ms(); clock_ms() - start < ms;)
        kvx_agent_progress(agent, 5);
}

/* Issue 6: kill -9 of P in the middle of a large pull (stopped first, so the pull is surely in
 * flight) fails the request with all its block ids as the connection closes, and the decode agent then
 * reads from a new P. TCP only and many small gets (no two adjacent, so none coalesce), so that the
 * pull lasts long enough to be cut; P's storage is its own memory, which dies with it. */
static void prefill_killed_mid_pull_fails_the_read_then_a_new_prefill_serves(void **state)
{
    /* Issue 36 finding 13: the deadline and the heartbeats are far off (a minute, 16 s): the
     * kernel closes a killed process's sockets at once, and the read fails on that. It
     * waited for the deadline before. */
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TRANSPORTS |
                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .transports = "tcp",
                                 .timeout_ms = 60000};
    size_t count              = BIG_BLOCKS / 2;
    uint64_t *ids             = calloc(count, sizeof(*ids));
    kvx_group_ids_t group     = {ids, count};
    kvx_request_t request     = {&group, 1, NULL, 0, NULL};
    struct callback_log log   = {0};
    size_t loaded             = 0;
    struct prefill p;
    struct prefill spare;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;
    kvx_agent_stats_t stats;
    kvx_status_t status;
    double start;
    double elapsed;

    (void)state;
    assert_non_null(ids);
    for (size_t i = 0; i < count; i++)
        ids[i] = 2 * i;
    config = (struct prefill_config){.page = BIG_PAGE, .blocks = BIG_BLOCKS, .transports = "tcp"};
    prefill_start(&p);
    config.spare = true;
    prefill_start(&spare); /* the new P of the end, forked while we have no agent */
    agent = agent_create_tracked(BIG_PAGE, BIG_BLOCKS, params);
    peer  = connect_tracked(agent, p.address);
    read_verified(agent, peer, 1, (const uint64_t[]){1, 3}, 2); /* wired up: data flows */

    /* Stopped first, so the pull is surely in flight when the process dies: TCP gets need
     * the target's progress. */
    prefill_stop(&p);
    assert_int_equal(kvx_read_post(agent, &peer, 1, 2, &request, on_xfer, &log, &xfer), KVX_OK);
    progress_for(agent, 200);
    assert_int_equal(kvx_xfer_status(xfer), KVX_INPROGRESS);
    start = clock_seconds();
    prefill_kill(&p);
    status  = kvx_xfer_wait(xfer);
    elapsed = clock_seconds() - start;
    for (size_t i = 0; i < count; i++)
        loaded += block_matches(agent, ids[i]);
    print_message("killed mid pull: %zu of %zu blocks had arrived; failed after %.3f s: %s\n",
                  loaded, count, elapsed, kvx_xfer_error(xfer));
    assert_int_equal(status, KVX_ERR_PEER_DOWN);
    /* whichever saw the kill first: the side channel, or the pull's own data link */
    assert_true(strstr(kvx_xfer_error(xfer), "side-channel connection closed") != NULL ||
                strstr(kvx_xfer_error(xfer), "data link") != NULL);
    assert_true(loaded < count);
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.status, status);
    failed_blocks_are(xfer, ids, count);
    assert_non_null(kvx_peer_down_reason(peer));
    kvx_xfer_destroy(xfer);
    assert_int_equal(log.calls, 1);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.transfers, 1);
    assert_int_equal(stats.transfers_failed, 1);
    peer_destroy(peer);

    prefill_start_spare(&spare);
    peer = connect_tracked(agent, spare.address);
    read_verified(agent, peer, 3, ids, 4096);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.transfers, 2);
    assert_int_equal(stats.transfers_failed, 1);
    peer_destroy(peer);
    agent_destroy_counting_warnings(agent);
    prefill_kill(&spare);
    free(ids);
}

struct release_log {
    int calls;
    uint64_t request_id;
    uint64_t block; /* the first block id of the last release */
};

static void on_release(void *arg, uint64_t request_id, const kvx_group_ids_t *groups,
                       size_t num_groups)
{
    struct release_log *log = arg;

    log->calls++;
    log->request_id = request_id;
    log->block      = num_groups > 0 && groups[0].count > 0 ? groups[0].ids[0] : UINT64_MAX;
}

/* A decode process: learns the prefill address on `in`, connects with heartbeats every
 * 100 ms, wants request 5, says so on `out`, and progresses until killed. */
static int run_wanting_decode(int in, int out)
{
    kvx_agent_params_t params = {.field_mask   = KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS,
                                 .heartbeat_ms = 100};
    char address[ADDRESS_SIZE];
    kvx_token_t token;
    kvx_agent_t *agent;
    kvx_peer_t *peer;

    alarm(30);
    if (read(in, address, sizeof(address)) != sizeof(address) ||
        read(in, &token, sizeof(token)) != sizeof(token))
        return 10;
    address[ADDRESS_SIZE - 1] = '\0';
    if (agent_on_blocks(PAGE, SMALL_BLOCKS, NULL, params, &agent) != KVX_OK ||
        kvx_agent_connect(agent, address, &peer) != KVX_OK ||
        kvx_want(agent, &peer, 1, 5, &token) != KVX_OK)
        return 11;
    (void)!write(out, "w", 1);
    for (;;)
        kvx_agent_progress(agent, 10);
}

/* Starts a prefill process serving `c` on SMALL_BLOCKS of PAGE (this side's layout) and
 * connects an agent with `params` to it; returns the peer. */
static kvx_peer_t *prefill_connect(struct prefill_config c, struct prefill *p,
                                   kvx_agent_params_t params, kvx_agent_t **agent_p)
{
    kvx_peer_t *peer;

    config        = c;
    config.page   = PAGE;
    config.blocks = SMALL_BLOCKS;
    prefill_start(p);
    *agent_p = agent_create_tracked(PAGE, SMALL_BLOCKS, params);
    peer     = connect_tracked(*agent_p, p->address);
    return peer;
}

/* Progresses `agent` until `peer` is down or 5 s passed; returns the milliseconds taken. */
static uint64_t progress_until_down(kvx_agent_t *agent, const kvx_peer_t *peer)
{
    uint64_t start = clock_ms();

    while (kvx_peer_down_reason(peer) == NULL && clock_ms() - start < 5000)
        kvx_agent_progress(agent, 5);
    return clock_ms() - start;
}

/* Issue 6: kill -9 of D after P holds blocks: while D heartbeats, the hold outlives its lease;
 * once D is killed, P releases it at the lease's expiry, once. Here the parent is P, and its
 * clock is moved forward instead of waiting. The decode process is forked before P's agent exists,
 * so it inherits no UCX or ZeroMQ state. */
static void killed_decode_leaves_its_hold_to_expire(void **state)
{
    const uint32_t lease_ms    = 600000; /* ten minutes, moved by the test's clock */
    kvx_agent_params_t params  = {.field_mask =
                                      KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_LEASE_MS,
                                  .listen   = "127.0.0.1:0",
                                  .lease_ms = lease_ms};
    uint64_t block             = 42;
    kvx_group_ids_t group      = {&block, 1};
    struct release_log log     = {0};
    char address[ADDRESS_SIZE] = {0};
    struct pollfd wanted;
    int to_decode[2];
    int from_decode[2];
    kvx_agent_t *agent;
    kvx_agent_stats_t stats;
    pid_t pid;
    char c;
    kvx_token_t token;

    (void)state;
    assert_int_equal(pipe(to_decode), 0);
    assert_int_equal(pipe(from_decode), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(to_decode[1]);
        close(from_decode[0]);
        _exit(run_wanting_decode(to_decode[0], from_decode[1]));
    }
    child_track(pid);
    close(to_decode[0]);
    close(from_decode[1]); /* a decode process that dies early gives EOF */

    agent = agent_create_tracked(PAGE, SMALL_BLOCKS, params);
    kvx_agent_set_release_callback(agent, on_release, &log);
    snprintf(address, sizeof(address), "%s", kvx_agent_listen_address(agent));
    /* Held before it is wanted, with its token carried to the decode process as an engine's
     * transfer parameters would; only the test's clock moves the lease. */
    assert_int_equal(hold_new(agent, 5, &group, 1, 1, &token), KVX_OK);
    assert_int_equal(write(to_decode[1], address, sizeof(address)), sizeof(address));
    assert_int_equal(write(to_decode[1], &token, sizeof(token)), sizeof(token));
    wanted = (struct pollfd){.fd = from_decode[0], .events = POLLIN};
    while (poll(&wanted, 1, 0) == 0) /* serve its connect meanwhile */
        kvx_agent_progress(agent, 5);
    assert_int_equal(read(from_decode[0], &c, 1), 1);

    /* Three half-leases pass on this process's clock, each after a heartbeat that carried
     * request 5: each extends it to now + 2/3 lease, so it outlives its first lease. */
    for (int i = 0; i < 3; i++) {
        notifications_wait(agent, i + 2); /* connect's heartbeat, then one per round */
        clock_advance_ms(lease_ms / 2);
        kvx_agent_progress(agent, 0);
    }
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.held, 1);
    assert_int_equal(stats.leases_expired, 0);
    assert_int_equal(log.calls, 0);

    child_kill(pid);
    progress_for(agent, 50);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.held, 1); /* not at the kill: its last extension runs */
    clock_advance_ms(lease_ms);
    for (int i = 0; i < 3; i++)
        kvx_agent_progress(agent, 0);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.held, 0);
    assert_int_equal(stats.leases_expired, 1);
    assert_int_equal(stats.released, 0);
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.request_id, 5);
    assert_int_equal(log.block, 42);
    progress_for(agent, 50);
    assert_int_equal(log.calls, 1);
    agent_destroy(agent);
    close(to_decode[1]);
    close(from_decode[0]);
}

/* Issue 6 and issue 10 finding 1: SIGSTOP of P past the deadline. UCX's TCP gets need the
 * target's progress, so a stopped P stalls them, and UCX cannot cancel them: the read still
 * fails at its deadline (moved to by the clock) with its block ids, and nothing waits. After
 * SIGCONT, late completions change nothing (one callback, one failure counted), and the peer,
 * reconnected, reads again. */
static void stopped_prefill_fails_the_read_at_its_deadline(void **state)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TRANSPORTS |
                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .transports = "tcp",
                                 .timeout_ms = 1000};
    uint64_t first[]          = {1, 5, 9};
    uint64_t ids[64];
    kvx_group_ids_t group   = {ids, 64};
    kvx_request_t request   = {&group, 1, NULL, 0, NULL};
    struct callback_log log = {0};
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;
    kvx_agent_stats_t stats;
    double start;
    double elapsed;

    (void)state;
    for (size_t i = 0; i < 64; i++)
        ids[i] = 100 + 3 * i;
    peer = prefill_connect((struct prefill_config){.transports = "tcp"}, &p, params, &agent);
    read_verified(agent, peer, 1, first, 3); /* wired up and working */

    prefill_stop(&p);
    blocks_clear(agent, ids, 64);
    assert_int_equal(kvx_read_post(agent, &peer, 1, 2, &request, on_xfer, &log, &xfer), KVX_OK);
    progress_for(agent, 200);
    assert_int_equal(kvx_xfer_status(xfer), KVX_INPROGRESS); /* the gets really stalled */
    /* The deadline passes on this process's clock, not the wall's. */
    clock_advance_ms(params.timeout_ms);
    start = clock_seconds();
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_TIMEOUT);
    elapsed = clock_seconds() - start;
    print_message("stopped prefill: failed %.3f s after its deadline: %s\n", elapsed,
                  kvx_xfer_error(xfer));
    assert_true(elapsed < SLACK_S); /* at the deadline: nothing waits for the stalled gets */
    assert_non_null(strstr(kvx_xfer_error(xfer), "deadline"));
    assert_int_equal(log.calls, 1);
    failed_blocks_are(xfer, ids, 64);
    assert_non_null(kvx_peer_down_reason(peer));

    prefill_continue(&p);
    progress_for(agent, 300); /* whatever P now answers arrives, and is ignored */
    assert_int_equal(log.calls, 1);
    assert_int_equal(kvx_xfer_status(xfer), KVX_ERR_PEER_TIMEOUT);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.transfers, 1);
    assert_int_equal(stats.transfers_failed, 1);
    kvx_xfer_destroy(xfer);
    assert_int_equal(log.calls, 1);

    assert_int_equal(kvx_peer_reconnect(peer), KVX_OK);
    assert_null(kvx_peer_down_reason(peer));
    read_verified(agent, peer, 3, ids, 64);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.transfers, 2);
    assert_int_equal(stats.transfers_failed, 1);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* Issue 6: a stopped P answers no heartbeat, so D's progress declares it dead after three
 * silent intervals, with that reason; once P continues, a reconnect makes it usable. */
static void stopped_prefill_is_dead_after_three_silent_heartbeats(void **state)
{
    const uint32_t heartbeat_ms = 600000; /* never by the wall clock: the test moves it */
    kvx_agent_params_t params   = {.field_mask = KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS |
                                                 KVX_AGENT_PARAM_FIELD_PEER_TTL_MS,
                                   .heartbeat_ms = heartbeat_ms,
                                   .peer_ttl_ms  = 100 * heartbeat_ms};
    uint64_t ids[]              = {2, 3, 700};
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t stats;
    int intervals = 0;

    (void)state;
    peer = prefill_connect((struct prefill_config){0}, &p, params, &agent);
    read_verified(agent, peer, 1, ids, 3);
    for (int i = 0; i < 3; i++) { /* heartbeats answered: alive */
        clock_advance_ms(heartbeat_ms);
        progress_for(agent, 50);
    }
    assert_null(kvx_peer_down_reason(peer));

    prefill_stop(&p);
    while (kvx_peer_down_reason(peer) == NULL && intervals < 10) {
        clock_advance_ms(heartbeat_ms);
        progress_for(agent, 20);
        intervals++;
    }
    assert_non_null(kvx_peer_down_reason(peer));
    print_message("stopped prefill: down after %d intervals: %s\n", intervals,
                  kvx_peer_down_reason(peer));
    assert_non_null(strstr(kvx_peer_down_reason(peer), "no heartbeat answer"));
    /* the first silent interval sends the heartbeat that goes unanswered; three more pass */
    assert_int_equal(intervals, 4);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.peers_dead, 1);
    assert_true(stats.heartbeats_missed >= 2);

    prefill_continue(&p);
    assert_int_equal(kvx_peer_reconnect(peer), KVX_OK);
    assert_null(kvx_peer_down_reason(peer));
    read_verified(agent, peer, 2, ids, 3);
    for (int i = 0; i < 3; i++) {
        clock_advance_ms(heartbeat_ms);
        progress_for(agent, 50);
    }
    assert_null(kvx_peer_down_reason(peer));
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* Whether `reason` says a restarted prefill was noticed: the old process's connection closing
 * tells first (issue 36 finding 13); the instance in the heartbeat answer tells where no close
 * was seen (a host that vanished and came back at its address). */
static bool restart_noticed(const char *reason)
{
    return strstr(reason, "restarted: instance ") != NULL ||
           strstr(reason, "side-channel connection closed") != NULL;
}

/* A prefill process restarted at the same address (a crash and a supervisor's restart) is
 * noticed as its connection closes, or at its first heartbeat answer, whatever its engine id:
 * another instance answers.
 * The peer goes down saying so, and kvx_peer_reconnect picks the new process up. */
static void restarted_prefill_at_the_same_address_is_noticed(void **state)
{
    const uint32_t heartbeat_ms = 500; /* silence would take 1.5 s: the restart comes first */
    kvx_agent_params_t params   = {.field_mask   = KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS,
                                   .heartbeat_ms = heartbeat_ms};
    uint64_t ids[]              = {5, 6, 9};
    struct prefill first;
    struct prefill second;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t stats;
    uint64_t elapsed;

    (void)state;
    config = (struct prefill_config){.page = PAGE, .blocks = SMALL_BLOCKS};
    prefill_start(&first);
    /* The successor is forked now, before this process has an agent, and binds later. */
    config = (struct prefill_config){
        .page = PAGE, .blocks = SMALL_BLOCKS, .spare = true, .listen = first.address};
    prefill_start(&second);
    agent = agent_create_tracked(PAGE, SMALL_BLOCKS, params);
    peer  = connect_tracked(agent, first.address);
    read_verified(agent, peer, 1, ids, 3);

    prefill_kill(&first);
    prefill_start_spare(&second);
    assert_string_equal(second.address, first.address);
    elapsed = progress_until_down(agent, peer);
    assert_non_null(kvx_peer_down_reason(peer));
    print_message("restarted prefill: down after %llu ms: %s\n", (unsigned long long)elapsed,
                  kvx_peer_down_reason(peer));
    assert_true(restart_noticed(kvx_peer_down_reason(peer)));
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.peers_dead, 1);

    assert_int_equal(kvx_peer_reconnect(peer), KVX_OK);
    read_verified(agent, peer, 2, ids, 3);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&second);
}

/* Issue 22 finding 6, reconnect after a restart found by a first push: the push registration
 * once waited inside kvx_write_post, read the new instance's heartbeat answer there and left the
 * peer down outside the loop, and kvx_peer_reconnect before any progress crashed the next turn.
 * Since issue 23 the registration is a state the loop carries: the post returns at once, the
 * loop finds the restart and fails the push with it, and a reconnect serves again. */
static void a_peer_down_outside_the_loop_and_reconnected_at_once_serves(void **state)
{
    uint64_t ids[]        = {5, 6, 9};
    kvx_group_ids_t group = {ids, 3};
    kvx_request_t request = {&group, 1, NULL, 0, NULL};
    kvx_xfer_t *xfer      = NULL;
    struct prefill first;
    struct prefill second;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t stats;

    (void)state;
    config = (struct prefill_config){.page = PAGE, .blocks = SMALL_BLOCKS};
    prefill_start(&first);
    config = (struct prefill_config){
        .page = PAGE, .blocks = SMALL_BLOCKS, .spare = true, .listen = first.address};
    prefill_start(&second);
    agent = agent_create_tracked(PAGE, SMALL_BLOCKS, (kvx_agent_params_t){0});
    peer  = connect_tracked(agent, first.address);
    read_verified(agent, peer, 1, ids, 3);

    prefill_kill(&first);
    prefill_start_spare(&second);
    /* queued before the registration, so the new instance answers it first */
    assert_int_equal(kvx_heartbeat(agent, &peer, 1, NULL, NULL, 0), KVX_OK);
    assert_int_equal(kvx_write_post(agent, &peer, 1, 2, &request, NULL, NULL, &xfer), KVX_OK);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_DOWN);
    assert_true(restart_noticed(kvx_xfer_error(xfer)));
    kvx_xfer_destroy(xfer);
    assert_non_null(kvx_peer_down_reason(peer));

    assert_int_equal(kvx_peer_reconnect(peer), KVX_OK);
    assert_null(kvx_peer_down_reason(peer));
    read_verified(agent, peer, 3, ids, 3);
    progress_for(agent, 20);
    assert_null(kvx_peer_down_reason(peer));
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.peers_dead, 1);
    assert_int_equal(stats.transfers, 2);
    assert_int_equal(stats.transfers_failed, 1);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&second);
}

/* Issue 23: the first push to a prefill registers our writer in the loop, never inside
 * kvx_write_post (it waited there up to the timeout): with the prefill stopped the post returns
 * at once; continued, the registration and the push complete and the bytes verify. */
static void first_push_posts_while_the_prefill_is_stopped(void **state)
{
    uint64_t ids[]        = {5, 6, 9};
    kvx_group_ids_t group = {ids, 3};
    kvx_request_t request = {&group, 1, NULL, 0, NULL};
    kvx_xfer_t *xfer      = NULL;
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;

    (void)state;
    config = (struct prefill_config){.page = PAGE, .blocks = SMALL_BLOCKS};
    prefill_start(&p);
    agent = agent_create_tracked(PAGE, SMALL_BLOCKS, (kvx_agent_params_t){0});
    peer  = connect_tracked(agent, p.address);
    prefill_stop(&p);
    assert_int_equal(kvx_write_post(agent, &peer, 1, 2, &request, NULL, NULL, &xfer), KVX_OK);
    assert_int_equal(kvx_xfer_status(xfer), KVX_INPROGRESS);
    prefill_continue(&p);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_OK);
    for (size_t k = 0; k < 3; k++)
        assert_true(block_matches(agent, ids[k]));
    kvx_xfer_destroy(xfer);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* Issue 35 finding 3: a push that fails fails only once none of its writes can land. P is
 * stopped with D's push request unread; D's deadline passes (on D's clock) and the push fails,
 * whereupon its caller owns the blocks again (vLLM frees or recomputes them). Continued, P
 * reads the request and writes, for as long as its own job's deadline allows: none of it may
 * reach those blocks. They stay as the caller left them, and the peer, reconnected, takes a
 * push again. */
static void stopped_prefill_writes_nothing_after_its_push_failed(void **state)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TRANSPORTS |
                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .transports = "tcp",
                                 .timeout_ms = 1000};
    uint64_t first[]          = {1, 5, 9};
    kvx_group_ids_t first_group = {first, 3};
    kvx_request_t first_request = {&first_group, 1, NULL, 0, NULL};
    uint64_t ids[64];
    kvx_group_ids_t group   = {ids, 64};
    kvx_request_t request   = {&group, 1, NULL, 0, NULL};
    struct callback_log log = {0};
    const char *base;
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;

    (void)state;
    for (size_t i = 0; i < 64; i++)
        ids[i] = 100 + 3 * i;
    peer = prefill_connect((struct prefill_config){.transports = "tcp"}, &p, params, &agent);
    assert_int_equal(kvx_write(agent, &peer, 1, 1, &first_request, NULL), KVX_OK); /* registered */
    blocks_verify(agent, first, 3);

    prefill_stop(&p);
    blocks_clear(agent, ids, 64);
    assert_int_equal(kvx_write_post(agent, &peer, 1, 2, &request, on_xfer, &log, &xfer), KVX_OK);
    progress_for(agent, 200);
    assert_int_equal(kvx_xfer_status(xfer), KVX_INPROGRESS);
    clock_advance_ms(params.timeout_ms);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_TIMEOUT);
    assert_int_equal(log.calls, 1);
    failed_blocks_are(xfer, ids, 64);

    prefill_continue(&p);
    progress_for(agent, 1500); /* P reads the request now, and would write for 1 s */
    base = kvx_agent_storage(agent, 0, NULL);
    for (size_t k = 0; k < 64; k++) {
        for (uint64_t b = 0; b < block_len(agent); b++) {
            if (base[ids[k] * block_len(agent) + b] != 0)
                fail_msg("block %llu was written after its push failed",
                         (unsigned long long)ids[k]);
        }
    }
    assert_int_equal(log.calls, 1);
    kvx_xfer_destroy(xfer);

    if (kvx_peer_down_reason(peer) != NULL)
        assert_int_equal(kvx_peer_reconnect(peer), KVX_OK);
    assert_int_equal(kvx_write(agent, &peer, 1, 3, &request, NULL), KVX_OK);
    blocks_verify(agent, ids, 64);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* Issue 22 finding 6, two ready pulls and one failing: pulls whose gets all completed wait in
 * the ready list for the same phase; when the first one fails (a failed get), its peer goes
 * down there, and the next one, reading the same peer, asked the down peer's connection (NULL)
 * what UCX chose. A get cannot be made to fail on demand, so the test takes the peer down as
 * that failure does (peer_down, between the gets' completion and the phase that moves the
 * pulls on): each pull then fails once with the peer's status, from the failed-peers phase,
 * and a reconnected peer serves again. */
static void ready_pulls_of_a_peer_gone_down_in_the_same_phase_fail_with_it(void **state)
{
    uint64_t ids_a[]            = {1, 2};
    uint64_t ids_b[]            = {3, 4};
    kvx_group_ids_t a           = {ids_a, 2};
    kvx_group_ids_t b           = {ids_b, 2};
    kvx_request_t ra            = {&a, 1, NULL, 0, NULL};
    kvx_request_t rb            = {&b, 1, NULL, 0, NULL};
    struct callback_log seen[2] = {{0}};
    kvx_xfer_t *xfers[2]        = {NULL, NULL};
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    struct core *core;
    uint64_t start;

    (void)state;
    peer = prefill_connect((struct prefill_config){0}, &p, (kvx_agent_params_t){0}, &agent);
    assert_int_equal(kvx_read_post(agent, &peer, 1, 1, &ra, on_xfer, &seen[0], &xfers[0]), KVX_OK);
    assert_int_equal(kvx_read_post(agent, &peer, 1, 2, &rb, on_xfer, &seen[1], &xfers[1]), KVX_OK);
    core = xfer_core(xfers[0]);
    /* the gets complete in UCX progress only: both pulls are then ready, not moved on */
    for (start = clock_ms(); transport_ops_pending(core->transport) > 0;)
        if (peers_progress(core) == 0 && clock_ms() - start > 10000)
            fail_msg("the gets did not complete within 10 s");
    peer_down(peer, KVX_ERR_PEER_DOWN, "closed: read 0 failed", PEER_DEAD);

    for (int i = 0; i < 3; i++)
        kvx_agent_progress(agent, 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(seen[i].calls, 1);
        assert_int_equal(seen[i].status, KVX_ERR_PEER_DOWN);
        assert_non_null(strstr(kvx_xfer_error(xfers[i]), "closed: read 0 failed"));
        kvx_xfer_destroy(xfers[i]);
    }
    assert_int_equal(kvx_peer_reconnect(peer), KVX_OK);
    read_verified(agent, peer, 3, ids_a, 2);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* A peer with nothing wanted and nothing moving is dropped after its TTL (not counted dead);
 * a wanted request keeps it, and kvx_peer_reconnect brings it back. */
static void idle_peer_is_dropped_after_its_ttl(void **state)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS |
                                               KVX_AGENT_PARAM_FIELD_PEER_TTL_MS,
                                 .heartbeat_ms = 60000,
                                 .peer_ttl_ms  = 300000}; /* both on the test's clock */
    uint64_t ids[]            = {1, 4};
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t stats;

    (void)state;
    peer = prefill_connect((struct prefill_config){0}, &p, params, &agent);
    read_verified(agent, peer, 1, ids, 2);
    assert_int_equal(kvx_want(agent, &peer, 1, 77, NULL), KVX_OK);
    for (int i = 0; i < 10; i++) { /* twice the TTL, but request 77 is wanted */
        clock_advance_ms(60000);
        progress_for(agent, 20);
    }
    assert_null(kvx_peer_down_reason(peer));
    kvx_unwant(agent, &peer, 1, 77);
    for (int i = 0; i < 10 && kvx_peer_down_reason(peer) == NULL; i++) {
        clock_advance_ms(60000);
        progress_for(agent, 20);
    }
    assert_non_null(kvx_peer_down_reason(peer));
    assert_non_null(strstr(kvx_peer_down_reason(peer), "dropped: idle for "));
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.peers_idle, 1);
    assert_int_equal(stats.peers_dead, 0);
    assert_int_equal(kvx_read(agent, &peer, 1, 2,
                              &(kvx_request_t){&(kvx_group_ids_t){ids, 2}, 1, NULL, 0, NULL}, NULL),
                     KVX_ERR_PEER_DOWN); /* down until reconnected */
    assert_int_equal(kvx_peer_reconnect(peer), KVX_OK);
    read_verified(agent, peer, 3, ids, 2);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* The tests' side-channel keys, as every test agent derives them. */
static struct auth_keys test_keys(void)
{
    struct auth_keys keys;

    assert_int_equal(auth_keys_derive(test_auth_key, &keys), KVX_OK);
    return keys;
}

/* Sends `size` bytes of `note` to the peer's side channel as a done, the way a decode agent's
 * done travels, without a read, and returns P's answer to it in `answer` (issue 21: every
 * done is answered); a heartbeat's answer after it on the same connection says it was
 * served (one connection is served in order). */
static void notify_send(kvx_agent_t *agent, kvx_peer_t *peer, const void *note, size_t size,
                        char answer[DONE_REASON_SIZE + 32])
{
    struct auth_keys keys = test_keys();
    void *zmq             = zmq_ctx_new();
    struct sidechan_client *client;
    uint64_t id = 0;
    char *reply = NULL;
    size_t reply_size;

    (void)agent;
    answer[0] = '\0';
    assert_int_equal(sidechan_client_create(zmq, peer_address(peer), &keys, 8, &client), KVX_OK);
    assert_int_equal(sidechan_client_send(client, VERB_DONE, 2, note, size), KVX_OK);
    assert_int_equal(sidechan_client_send(client, VERB_HEARTBEAT, 1, NULL, 0), KVX_OK);
    while (id != 1) {
        assert_true(sidechan_client_wait(client, 5000));
        assert_true(sidechan_client_recv(client, &id, &reply, &reply_size));
        if (id == 2)
            snprintf(answer, DONE_REASON_SIZE + 32, "%s", reply);
        free(reply);
    }
    sidechan_client_destroy(client);
    zmq_ctx_term(zmq);
}

/* A done of `request_id` from rank 0 with its held token (none if not held); P's answer in
 * `answer`. */
static void done_send(kvx_agent_t *agent, kvx_peer_t *peer, uint64_t request_id,
                      char answer[DONE_REASON_SIZE + 32])
{
    struct notify note = notify_done(request_id, 0, token_of(request_id));

    notify_send(agent, peer, &note, sizeof(note), answer);
}

/* Issue 6: a done for a request P never held, and a done repeated after the release, are
 * counted as unknown and change nothing; P keeps serving and the real done releases.
 * Issue 21: each is answered: a done without a token for a request never held has nothing
 * to count ("nothing held"), and one after the release is refused by name. */
static void unknown_and_repeated_dones_are_counted_and_ignored(void **state)
{
    uint64_t block7 = 7;
    uint64_t block8 = 8;
    char answer[DONE_REASON_SIZE + 32];
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t stats;

    (void)state;
    peer = prefill_connect((struct prefill_config){.hold = {7, 8}}, &p, (kvx_agent_params_t){0},
                           &agent);

    done_send(agent, peer, 99, answer); /* never held, no token */
    assert_string_equal(answer, "kvx-counted nothing held");
    read_verified(agent, peer, 8, &block8, 1);
    done_send(agent, peer, 8, answer); /* repeated */
    assert_string_equal(answer, "kvx-error hold released already: the blocks may have been reused");
    stats = prefill_stats_reach(&p, 0, 2, 1);
    assert_int_equal(stats.done_unknown, 2);
    assert_int_equal(stats.released, 1);
    assert_int_equal(stats.held, 1);
    assert_int_equal(stats.notifications_dropped, 0);

    read_verified(agent, peer, 7, &block7, 1);
    stats = prefill_stats_reach(&p, 0, 2, 2);
    assert_int_equal(stats.released, 2);
    assert_int_equal(stats.held, 0);
    assert_int_equal(stats.done_unknown, 2);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* Sends the dones of `request_id` (with its held token) from `ranks` over one new connection,
 * in order, and returns P's answers in `answers` (one connection is served in order). */
static void dones_send_one_connection(kvx_peer_t *peer, uint64_t request_id, const uint32_t *ranks,
                                      size_t count, char answers[][DONE_REASON_SIZE + 32])
{
    struct auth_keys keys = test_keys();
    void *zmq             = zmq_ctx_new();
    struct sidechan_client *client;
    uint64_t id = 0;
    char *reply = NULL;
    size_t reply_size;

    assert_int_equal(sidechan_client_create(zmq, peer_address(peer), &keys, 8, &client), KVX_OK);
    for (size_t i = 0; i < count; i++) {
        struct notify note = notify_done(request_id, ranks[i], token_of(request_id));

        answers[i][0] = '\0';
        assert_int_equal(sidechan_client_send(client, VERB_DONE, 2 + i, &note, sizeof(note)),
                         KVX_OK);
    }
    assert_int_equal(sidechan_client_send(client, VERB_HEARTBEAT, 1, NULL, 0), KVX_OK);
    while (id != 1) {
        assert_true(sidechan_client_wait(client, 5000));
        assert_true(sidechan_client_recv(client, &id, &reply, &reply_size));
        if (id >= 2 && id < 2 + count)
            snprintf(answers[id - 2], DONE_REASON_SIZE + 32, "%s", reply);
        free(reply);
    }
    sidechan_client_destroy(client);
    zmq_ctx_term(zmq);
}

/* Issue 22 finding 5: with `--hold 7=... --consumers 2`, one connection holding the token sent
 * done for rank 0, then for rank 63, and the hold was released though rank 1 never read. Now
 * rank 63 (no rank of a decode side of TP 2) is refused, and so is a second rank from the
 * connection that reported rank 0, and rank 0 from another connection; nothing is released
 * until decode rank 1 itself reads and reports. */
static void a_done_for_a_rank_the_hold_cannot_have_releases_nothing(void **state)
{
    const uint32_t ranks[] = {0, 63, 1, 0};
    kvx_agent_params_t d1  = {.field_mask =
                                  KVX_AGENT_PARAM_FIELD_TP_RANK | KVX_AGENT_PARAM_FIELD_TP_SIZE,
                              .tp_rank = 1,
                              .tp_size = 2};
    uint64_t block7        = 7;
    char answers[4][DONE_REASON_SIZE + 32];
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t stats;

    (void)state;
    peer = prefill_connect((struct prefill_config){.hold = {7}, .consumers = 2}, &p, d1, &agent);
    dones_send_one_connection(peer, 7, ranks, 3, answers);
    assert_string_equal(answers[0], "kvx-counted counted");
    assert_string_equal(answers[1], "kvx-error rank 63: not a consumer rank of this hold: it "
                                    "cannot have read this rank's share");
    assert_string_equal(answers[2], "kvx-error rank 1: this connection reported the request "
                                    "for another rank already");
    dones_send_one_connection(peer, 7, ranks + 3, 1, answers);
    assert_string_equal(answers[0], "kvx-error rank 0: this rank reported the request already, "
                                    "over another connection");
    stats = prefill_stats(&p);
    assert_int_equal(stats.released, 0);
    assert_int_equal(stats.held, 1);
    assert_int_equal(stats.dones_rank_refused, 3);

    read_verified(agent, peer, 7, &block7, 1); /* decode rank 1's own done releases it */
    stats = prefill_stats_reach(&p, 0, 0, 1);
    assert_int_equal(stats.released, 1);
    assert_int_equal(stats.held, 0);
    assert_int_equal(stats.dones_rank_refused, 3);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* Issue 22: a push that names a writer its connection does not have (evicted, never
 * registered) is answered with the code that makes a decode agent register again
 * ("[unregistered]", notify.h), not with words it would have to search for. */
static void a_push_with_a_writer_it_does_not_have_is_answered_with_a_code(void **state)
{
    const uint8_t handle[PUSH_HANDLE_LEN] = {7};
    uint64_t block                        = 3;
    kvx_group_ids_t group                 = {&block, 1};
    kvx_request_t request                 = {&group, 1, NULL, 0, NULL};
    struct auth_keys keys                 = test_keys();
    enum error_code code                  = ERROR_CODE_NONE;
    size_t at                             = 0;
    void *zmq                             = zmq_ctx_new();
    struct sidechan_client *client;
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    void *body;
    size_t size;
    uint64_t id;
    char *reply;

    (void)state;
    peer = prefill_connect((struct prefill_config){0}, &p, (kvx_agent_params_t){0}, &agent);
    assert_int_equal(push_request_encode(1, handle, 0, 0, &request, &body, &size), KVX_OK);
    assert_int_equal(sidechan_client_create(zmq, peer_address(peer), &keys, 8, &client), KVX_OK);
    assert_int_equal(sidechan_client_send(client, VERB_PUSH, 5, body, size), KVX_OK);
    assert_true(sidechan_client_wait(client, 5000));
    assert_true(sidechan_client_recv(client, &id, &reply, &size));
    assert_int_equal(id, 5);
    assert_true(error_answer_parse(reply, size, &code, &at));
    assert_int_equal(code, ERROR_CODE_UNREGISTERED);
    assert_non_null(strstr(reply + at, "no registered writer of that handle"));
    free(reply);
    free(body);
    sidechan_client_destroy(client);
    zmq_ctx_term(zmq);
    assert_int_equal(prefill_stats(&p).pushes_refused, 1);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

/* After `dropped` malformed messages, P still serves: a verified read of held request 7 and
 * its real done release it, with every malformed message counted and none taken for a done.
 * Ends the test's processes and agent. */
static void serving_goes_on(struct prefill *p, kvx_agent_t *agent, kvx_peer_t *peer,
                            uint64_t dropped)
{
    uint64_t block = 7;
    kvx_agent_stats_t stats;

    read_verified(agent, peer, 7, &block, 1);
    stats = prefill_stats_reach(p, dropped, 0, 1);
    assert_int_equal(stats.released, 1);
    assert_int_equal(stats.held, 0);
    assert_int_equal(stats.done_unknown, 0);
    assert_int_equal(stats.notifications_dropped, dropped);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(p);
}

/* Malformed notifications, each about held request 7: were one taken for a done, it would
 * release 7 and the real done at the end would count as unknown. */
static const struct bad_notify_case {
    const char *rule; /* shown in the report */
    size_t size;      /* bytes sent */
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
} bad_notify_cases[] = {
    {"empty", 0, NOTIFY_MAGIC, NOTIFY_VERSION, NOTIFY_DONE},
    {"short", sizeof(struct notify) - 1, NOTIFY_MAGIC, NOTIFY_VERSION, NOTIFY_DONE},
    {"bad_magic", sizeof(struct notify), NOTIFY_MAGIC ^ 1, NOTIFY_VERSION, NOTIFY_DONE},
    {"bad_version", sizeof(struct notify), NOTIFY_MAGIC, NOTIFY_VERSION + 1, NOTIFY_DONE},
    {"wrong_kind", sizeof(struct notify), NOTIFY_MAGIC, NOTIFY_VERSION, NOTIFY_DONE + 1},
    {"extra_bytes", sizeof(struct notify) + 1, NOTIFY_MAGIC, NOTIFY_VERSION, NOTIFY_DONE},
};

/* Issue 6: malformed notifications are counted as dropped, answered as malformed (issue
 * 21) and change nothing; P keeps serving and the real done releases. */
static void malformed_notifications_are_dropped_and_serving_goes_on(void **state)
{
    const size_t num_cases = sizeof(bad_notify_cases) / sizeof(bad_notify_cases[0]);
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t stats;

    (void)state;
    peer =
        prefill_connect((struct prefill_config){.hold = {7}}, &p, (kvx_agent_params_t){0}, &agent);

    for (size_t i = 0; i < num_cases; i++) {
        const struct bad_notify_case *c       = &bad_notify_cases[i];
        struct notify note                    = notify_done(7, 0, token_of(7));
        unsigned char bytes[sizeof(note) + 8] = {0};

        note.magic   = c->magic;
        note.version = c->version;
        note.kind    = c->kind;
        char answer[DONE_REASON_SIZE + 32];

        memcpy(bytes, &note, sizeof(note));
        notify_send(agent, peer, bytes, c->size, answer);
        if (strncmp(answer, "kvx-error malformed done", 24) != 0)
            fail_msg("%s: answered \"%s\"", c->rule, answer);
        stats = prefill_stats_reach(&p, i + 1, 0, 0);
        if (stats.notifications_dropped != i + 1 || stats.held != 1 || stats.done_unknown != 0)
            fail_msg("%s: dropped %llu, held %llu, unknown %llu", c->rule,
                     (unsigned long long)stats.notifications_dropped,
                     (unsigned long long)stats.held, (unsigned long long)stats.done_unknown);
    }
    serving_goes_on(&p, agent, peer, num_cases);
}

/* Malformed side-channel messages from a DEALER socket (whose first frame a ROUTER sees after
 * the sender's identity): [delimiter][verb][id: 8 bytes][body] is the only shape served. */
#define HB      VERB_HEARTBEAT
#define HB_SIZE (sizeof(VERB_HEARTBEAT) - 1)
#define ID      "IDIDIDID"
static const struct bad_side_case {
    const char *rule;
    const char *frames[6];
    size_t sizes[6];
    size_t num_frames;
    const char *reply; /* how P's answer starts; NULL: no answer */
} bad_side_cases[] = {
    {"only_a_delimiter", {""}, {0}, 1, NULL},
    {"heartbeat_without_an_id", {"", HB}, {0, HB_SIZE}, 2, NULL},
    {"heartbeat_without_ids", {"", HB, ID}, {0, HB_SIZE, 8}, 3, "kvx-error wrong number"},
    {"ids_of_seven_bytes",
     {"", HB, ID, "1234567"},
     {0, HB_SIZE, 8, 7},
     4,
     "kvx-error heartbeat of 7 bytes"},
    {"unknown_request", {"", "kvx-lunch 1", ID}, {0, 11, 8}, 3, "kvx-error unknown"},
    {"id_of_three_bytes", {"", HB, "abc", "12345678"}, {0, HB_SIZE, 3, 8}, 4, NULL},
    {"no_delimiter", {HB, ID, "12345678"}, {HB_SIZE, 8, 8}, 3, NULL},
    {"extra_frames", {"", HB, ID, "12345678", "x"}, {0, HB_SIZE, 8, 8, 1}, 5, NULL},
};

/* Sends `num_frames` frames on `socket` as one message. */
static void frames_send(void *socket, const char *const *frames, const size_t *sizes,
                        size_t num_frames)
{
    for (size_t f = 0; f < num_frames; f++)
        assert_int_equal(
            zmq_send(socket, frames[f], sizes[f], f + 1 < num_frames ? ZMQ_SNDMORE : 0),
            (int)sizes[f]);
}

/* The text of the answer waiting on a DEALER `socket` (after its empty delimiter and the
 * request id), or "" if none came within `timeout_ms`. */
static void answer_receive(void *socket, int timeout_ms, char *text, size_t size)
{
    zmq_pollitem_t item = {.socket = socket, .events = ZMQ_POLLIN};
    int n;

    text[0] = '\0';
    if (zmq_poll(&item, 1, timeout_ms) <= 0)
        return;
    assert_int_equal(zmq_recv(socket, text, size - 1, 0), 0); /* the delimiter */
    assert_int_equal(zmq_recv(socket, text, size - 1, 0), 8); /* the request's id */
    n = zmq_recv(socket, text, size - 1, 0);
    assert_true(n >= 0);
    text[n < (int)size - 1 ? n : (int)size - 1] = '\0';
}

/* Issue 6: malformed heartbeats and unknown requests on the side channel are counted as
 * dropped (answered with an error where an answer can be routed); P keeps serving. */
static void malformed_heartbeats_are_dropped_and_serving_goes_on(void **state)
{
    const size_t num_cases = sizeof(bad_side_cases) / sizeof(bad_side_cases[0]);
    uint64_t block         = 7;
    int linger             = 0;
    char endpoint[ADDRESS_SIZE + 8];
    char answer[300];
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_agent_stats_t stats;
    struct auth_keys keys        = test_keys();
    struct heartbeat_entry entry = {0};
    void *context;
    void *dealer;

    (void)state;
    peer =
        prefill_connect((struct prefill_config){.hold = {7}}, &p, (kvx_agent_params_t){0}, &agent);
    context = zmq_ctx_new();
    dealer  = zmq_socket(context, ZMQ_DEALER);
    snprintf(endpoint, sizeof(endpoint), "tcp://%s", p.address);
    assert_int_equal(zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof(linger)), 0);
    assert_int_equal(auth_client_socket(dealer, &keys), KVX_OK);
    assert_int_equal(zmq_connect(dealer, endpoint), 0);

    /* A well-formed heartbeat first: the socket works, so silence below means none. */
    entry.request_id = block;
    frames_send(dealer, (const char *[]){"", HB, ID, (const char *)&entry},
                (const size_t[]){0, HB_SIZE, 8, sizeof(entry)}, 4);
    answer_receive(dealer, 5000, answer, sizeof(answer));
    assert_non_null(strstr(answer, ALIVE_ANSWER));

    for (size_t i = 0; i < num_cases; i++) {
        const struct bad_side_case *c = &bad_side_cases[i];

        frames_send(dealer, c->frames, c->sizes, c->num_frames);
        stats = prefill_stats_reach(&p, i + 1, 0, 0);
        if (stats.notifications_dropped != i + 1 || stats.held != 1)
            fail_msg("%s: dropped %llu, held %llu", c->rule,
                     (unsigned long long)stats.notifications_dropped,
                     (unsigned long long)stats.held);
        answer_receive(dealer, c->reply != NULL ? 5000 : 50, answer, sizeof(answer));
        if (strncmp(answer, c->reply != NULL ? c->reply : "", strlen(c->reply ? c->reply : "")) !=
                0 ||
            (c->reply == NULL && answer[0] != '\0'))
            fail_msg("%s: answered \"%s\"", c->rule, answer);
    }
    zmq_close(dealer);
    zmq_ctx_term(context);

    serving_goes_on(&p, agent, peer, num_cases);
}

/* A decode process of the push tests: learns the prefill address on `in`, connects over TCP,
 * then runs commands from `in`, answering each on `out`: 'r' a verified read of blocks
 * 0..63, 'w' a verified push of blocks 64..127, 'p' a push of every block posted and never
 * progressed (a decode process that stalls), 'q' the end. */
static int run_pushing_decode(int in, int out)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TRANSPORTS,
                                 .transports = "tcp"};
    uint64_t read_ids[64];
    uint64_t push_ids[64];
    uint64_t *all = calloc(SMALL_BLOCKS, sizeof(*all));
    char address[ADDRESS_SIZE];
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *stalled;
    char command;

    alarm(60);
    for (uint64_t i = 0; i < 64; i++) {
        read_ids[i] = i;
        push_ids[i] = 64 + i;
    }
    for (uint64_t i = 0; all != NULL && i < SMALL_BLOCKS; i++)
        all[i] = i;
    if (all == NULL || read(in, address, sizeof(address)) != sizeof(address))
        return 10;
    address[ADDRESS_SIZE - 1] = '\0';
    if (agent_on_blocks(PAGE, SMALL_BLOCKS, NULL, params, &agent) != KVX_OK ||
        kvx_agent_connect(agent, address, &peer) != KVX_OK)
        return 11;
    while (read(in, &command, 1) == 1 && command != 'q') {
        kvx_group_ids_t group = {command == 'r' ? read_ids : push_ids, 64};
        kvx_request_t request = {&group, 1, NULL, 0, NULL};
        bool ok               = true;

        blocks_clear(agent, group.ids, 64);
        if (command == 'r')
            ok = kvx_read(agent, &peer, 1, 1, &request, NULL) == KVX_OK;
        else if (command == 'w')
            ok = kvx_write(agent, &peer, 1, 2, &request, NULL) == KVX_OK;
        else if (command == 'p') {
            group = (kvx_group_ids_t){all, SMALL_BLOCKS};
            ok    = kvx_write_post(agent, &peer, 1, 3, &request, NULL, NULL, &stalled) == KVX_OK;
            (void)!write(out, ok ? "1" : "0", 1);
            for (;;)
                pause(); /* stalls, and is stopped and killed */
        }
        for (size_t k = 0; ok && k < 64; k++)
            ok = block_matches(agent, group.ids[k]);
        (void)!write(out, ok ? "1" : "0", 1);
    }
    return 0;
}

/* A decode process of the push tests, forked before the parent (P) has an agent. */
struct decode {
    pid_t pid;
    int in;  /* our commands */
    int out; /* its answers */
};

static void decode_fork(struct decode *d)
{
    int to[2];
    int from[2];

    assert_int_equal(pipe(to), 0);
    assert_int_equal(pipe(from), 0);
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        close(to[1]);
        close(from[0]);
        _exit(run_pushing_decode(to[0], from[1]));
    }
    child_track(d->pid);
    close(to[0]);
    close(from[1]);
    d->in  = to[1];
    d->out = from[0];
}

/* Sends `command` to a decode process and serves `agent` until it answers; true for '1'. */
static bool decode_command(struct decode *d, kvx_agent_t *agent, char command)
{
    struct pollfd answer = {.fd = d->out, .events = POLLIN};
    uint64_t start       = clock_ms();
    char c               = '0';

    assert_int_equal(write(d->in, &command, 1), 1);
    while (poll(&answer, 1, 0) == 0 && clock_ms() - start < 20000)
        kvx_agent_progress(agent, 5);
    assert_int_equal(read(d->out, &c, 1), 1);
    return c == '1';
}

/* Issue 10 finding 2: a push the prefill side serves never blocks it. Decode process 1 asks
 * for a push of every block and then neither progresses nor runs (stopped): P's puts over TCP
 * cannot complete. Meanwhile decode process 2 is served a verified pull and a verified push;
 * at its deadline (the clock moved) the stuck push fails alone, and P serves on. Here the
 * parent is P. */
static void stuck_push_never_blocks_other_decode_processes(void **state)
{
    uint64_t *storage          = pattern_storage(PAGE * SMALL_BLOCKS);
    kvx_agent_params_t params  = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                                                KVX_AGENT_PARAM_FIELD_TRANSPORTS,
                                  .listen     = "127.0.0.1:0",
                                  .transports = "tcp"};
    char address[ADDRESS_SIZE] = {0};
    struct decode stuck;
    struct decode other;
    kvx_agent_t *agent;
    kvx_agent_stats_t stats;
    int status;

    (void)state;
    assert_non_null(storage);
    /* A request on the data plane leaves with its requester's progress, which the stuck one
     * never makes after posting: its request goes on the side channel, whose I/O thread
     * sends it (docs/agent.md, "Write"). */
    setenv("KVX_PUSH_REQUESTS", "side-channel", 1);
    decode_fork(&stuck);
    unsetenv("KVX_PUSH_REQUESTS");
    decode_fork(&other);
    assert_int_equal(agent_on_blocks(PAGE, SMALL_BLOCKS, storage, params, &agent), KVX_OK);
    left.agent = agent;
    snprintf(address, sizeof(address), "%s", kvx_agent_listen_address(agent));
    assert_int_equal(write(stuck.in, address, sizeof(address)), sizeof(address));
    assert_int_equal(write(other.in, address, sizeof(address)), sizeof(address));

    /* A first push registers the stuck one's writer, in its loop (issue 23); the stalled push
     * after it needs no progress of its own to be asked for. */
    assert_true(decode_command(&stuck, agent, 'w'));
    assert_true(decode_command(&stuck, agent, 'p'));
    do {
        kvx_agent_progress(agent, 5);
        kvx_agent_stats(agent, &stats, sizeof(stats));
    } while (stats.pushes_serving == 0);
    assert_int_equal(kill(stuck.pid, SIGSTOP), 0);
    assert_int_equal(waitpid(stuck.pid, &status, WUNTRACED), stuck.pid);

    assert_true(decode_command(&other, agent, 'r'));
    assert_true(decode_command(&other, agent, 'w'));
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.pushes_serving, 1); /* the stuck one, still in flight */

    clock_advance_ms(10000); /* past the agent's timeout: the stuck push's deadline */
    progress_for(agent, 50);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.pushes_serving, 0);
    assert_true(decode_command(&other, agent, 'r'));
    assert_true(decode_command(&other, agent, 'w'));

    assert_int_equal(write(other.in, "q", 1), 1);
    assert_int_equal(WEXITSTATUS(child_wait(other.pid)), 0);
    child_kill(stuck.pid);
    agent_destroy(agent);
    free(storage);
    close(stuck.in);
    close(stuck.out);
    close(other.in);
    close(other.out);
}

/* Issue 10: a push request with more ids in a group than its regions hold blocks (repeats of
 * valid ids) is refused before any put: the decode blocks stay zero. Since issue 23 the
 * decode side refuses it itself, naming the repeated id (docs/plan.md "The request"), so it
 * never reaches the prefill side's bound (which fuzz_push still drives with raw requests). */
static void push_beyond_capacity_is_refused_before_any_put(void **state)
{
    size_t count          = SMALL_BLOCKS + 1;
    uint64_t *ids         = calloc(count, sizeof(*ids));
    kvx_group_ids_t group = {ids, count};
    kvx_request_t request = {&group, 1, NULL, 0, NULL};
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    uint64_t first = 0;

    (void)state;
    assert_non_null(ids);
    for (size_t i = 0; i < count; i++)
        ids[i] = i % 256; /* 256 blocks, repeated: every id within capacity */
    peer = prefill_connect((struct prefill_config){0}, &p, (kvx_agent_params_t){0}, &agent);
    blocks_clear(agent, ids, 256);
    assert_int_equal(kvx_write(agent, &peer, 1, 1, &request, NULL), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "group 0 names block id 0 twice"));
    assert_int_equal(prefill_stats(&p).pushes_refused, 0);
    for (uint64_t b = 0; b < 256; b++)
        assert_false(block_matches(agent, b)); /* nothing was put */
    group = (kvx_group_ids_t){&first, 1};
    assert_int_equal(kvx_write(agent, &peer, 1, 2, &request, NULL), KVX_OK); /* serves on */
    assert_true(block_matches(agent, 0));
    free(ids);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

#define SOAK_MAX_BLOCKS 32  /* blocks of the largest soak request */
#define SOAK_BATCH      200 /* requests P holds at once ahead of D's reads */
/* Leases short enough that aborted requests expire within the run, yet five heartbeats long:
 * on a loaded CI machine (ASan, ctest -j2) these spinning processes starve for 100s of ms,
 * and a lease of two heartbeats then expired under 1% of the reads. */
#define SOAK_LEASE_MS     1000
#define SOAK_HEARTBEAT_MS 200

/* The soak run, set before the fork so both processes derive the same requests. */
static struct soak_config {
    uint64_t seed;
    size_t requests;
} soak;

/* A soak request: 1 to SOAK_MAX_BLOCKS blocks, adjacent or every other one, somewhere in the
 * storage; about one in ten is aborted. Drawn in order from one generator on both sides. */
struct soak_request {
    uint64_t id;
    uint64_t ids[SOAK_MAX_BLOCKS];
    size_t count;
    bool abort;
    kvx_token_t token; /* the decode side's copy of the hold's */
};

static void soak_request_next(struct prng *prng, uint64_t id, struct soak_request *r)
{
    uint64_t step = prng_range(prng, 1, 2);
    uint64_t first;

    r->id    = id;
    r->count = prng_range(prng, 1, SOAK_MAX_BLOCKS);
    first    = prng_range(prng, 0, SMALL_BLOCKS - 1 - (r->count - 1) * step);
    for (size_t i = 0; i < r->count; i++)
        r->ids[i] = first + i * step;
    r->abort = prng_range(prng, 0, 9) == 0;
}

/* The soak's prefill process: on each 'b' on `go` it holds the next SOAK_BATCH requests for
 * one consumer and answers 'h'; on 'e' it serves until nothing is held, then writes its
 * stats on `ready` and exits. */
static int run_soak_prefill(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_LEASE_MS,
                                 .listen   = "127.0.0.1:0",
                                 .lease_ms = SOAK_LEASE_MS};
    uint64_t *storage         = pattern_storage(PAGE * SMALL_BLOCKS);
    size_t held               = 0;
    kvx_token_t tokens[SOAK_BATCH];
    size_t count = 0;
    struct soak_request r;
    kvx_agent_stats_t stats;
    kvx_agent_t *agent;
    struct prng prng;
    char c = 0;

    alarm(600);
    prng_init(&prng, soak.seed);
    if (storage == NULL || agent_on_blocks(PAGE, SMALL_BLOCKS, storage, params, &agent) != KVX_OK)
        return 10;
    report_serving(ready, agent);
    while (c != 'e') {
        /* A small get of engine memory is emulated over active messages, which this side
         * must answer: progress sleeps on UCX's wakeup descriptor, so waiting costs none. */
        kvx_agent_progress(agent, 5);
        if (read(go, &c, 1) != 1 || c != 'b')
            continue;
        count = 0;
        for (size_t i = 0; i < SOAK_BATCH && held < soak.requests; i++, held++) {
            kvx_group_ids_t group;

            soak_request_next(&prng, held + 1, &r);
            group = (kvx_group_ids_t){r.ids, r.count};
            if (hold_new(agent, r.id, &group, 1, 1, &tokens[i]) != KVX_OK)
                return 11;
            count = i + 1;
        }
        (void)!write(ready, "h", 1);
        for (size_t i = 0; i < count; i++)
            report_token(ready, &tokens[i]);
    }
    do {
        kvx_agent_progress(agent, 5);
        kvx_agent_stats(agent, &stats, sizeof(stats));
    } while (stats.held > 0);
    (void)!write(ready, &stats, sizeof(stats));
    kvx_agent_destroy(agent);
    free(storage);
    return 0;
}

/* Issue 6: a soak of requests of random sizes with random aborts. D wants each batch (its
 * heartbeats keep the leases), then reads each request, whose done releases it, or aborts
 * it (kvx_unwant, no read), whose lease then expires. After it nothing is held, every hold
 * was released or expired, no done was unknown, and every read succeeded with its bytes.
 * KVX_SOAK_REQUESTS overrides the 10,000 requests, KVX_TEST_SEED the seed. */
static void soak_releases_or_expires_every_hold(void **state)
{
    const char *requests       = getenv("KVX_SOAK_REQUESTS");
    kvx_agent_params_t params  = {.field_mask   = KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS,
                                  .heartbeat_ms = SOAK_HEARTBEAT_MS};
    struct soak_request *batch = calloc(SOAK_BATCH, sizeof(*batch));
    uint64_t reads             = 0;
    uint64_t aborts            = 0;
    double start               = clock_seconds();
    char address[ADDRESS_SIZE];
    kvx_agent_stats_t d_stats;
    kvx_agent_stats_t p_stats;
    struct prng prng;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    int go[2];
    int ready;
    int exit_status;
    pid_t pid;
    char c;

    (void)state;
    assert_non_null(batch);
    soak.seed     = prng_seed_from_env(2024);
    soak.requests = requests != NULL && *requests != '\0' ? strtoull(requests, NULL, 0) : 10000;
    prng_init(&prng, soak.seed);
    assert_int_equal(pipe(go), 0);
    assert_int_equal(fcntl(go[0], F_SETFL, O_NONBLOCK), 0);
    pid = child_track(start_prefill(run_soak_prefill, go[0], address, &ready));
    close(go[0]);
    agent = agent_create_tracked(PAGE, SMALL_BLOCKS, params);
    peer  = connect_tracked(agent, address);

    for (size_t done = 0; done < soak.requests;) {
        size_t n = soak.requests - done < SOAK_BATCH ? soak.requests - done : SOAK_BATCH;

        assert_int_equal(write(go[1], "b", 1), 1);
        assert_int_equal(read(ready, &c, 1), 1); /* held */
        for (size_t i = 0; i < n; i++) {
            soak_request_next(&prng, done + i + 1, &batch[i]);
            batch[i].token = read_token(ready);
            assert_int_equal(kvx_want(agent, &peer, 1, batch[i].id, &batch[i].token), KVX_OK);
        }
        for (size_t i = 0; i < n; i++) {
            struct soak_request *r = &batch[i];
            kvx_group_ids_t group  = {r->ids, r->count};
            kvx_request_t request  = {&group, 1, NULL, 0, &r->token};

            if (r->abort) {
                kvx_unwant(agent, &peer, 1, r->id);
                aborts++;
                continue;
            }
            blocks_clear(agent, r->ids, r->count);
            if (kvx_read(agent, &peer, 1, r->id, &request, NULL) != KVX_OK)
                fail_msg("seed %llu request %llu: %s", (unsigned long long)soak.seed,
                         (unsigned long long)r->id, kvx_errmsg());
            blocks_verify(agent, r->ids, r->count);
            reads++;
        }
        done += n;
    }
    assert_int_equal(write(go[1], "e", 1), 1);
    assert_int_equal(read(ready, &p_stats, sizeof(p_stats)), sizeof(p_stats));
    exit_status = child_wait(pid);
    close(ready);
    close(go[1]);
    kvx_agent_stats(agent, &d_stats, sizeof(d_stats));
    peer_destroy(peer);
    agent_destroy(agent);
    free(batch);
    print_message("soak: %zu requests (%llu read, %llu aborted) in %.1f s, seed %llu\n",
                  soak.requests, (unsigned long long)reads, (unsigned long long)aborts,
                  clock_seconds() - start, (unsigned long long)soak.seed);

    assert_true(WIFEXITED(exit_status));
    assert_int_equal(WEXITSTATUS(exit_status), 0);
    assert_int_equal(p_stats.held, 0);
    assert_int_equal(p_stats.released + p_stats.leases_expired, soak.requests);
    assert_int_equal(p_stats.released, reads);
    assert_int_equal(p_stats.leases_expired, aborts);
    assert_int_equal(p_stats.done_unknown, 0);
    assert_int_equal(p_stats.notifications_dropped, 0);
    assert_int_equal(d_stats.transfers, reads);
    assert_int_equal(d_stats.transfers_failed, 0);
    assert_int_equal(d_stats.notifications_failed, 0);
    assert_int_equal(d_stats.peers_dead, 0);
}

/* Issue 21 (which undoes issue 13's rule that a read whose done could not be queued still
 * succeeds): a read completes only once its done is answered, so one whose prefill process
 * is stopped fails at its deadline (moved to by the clock) with every block id, naming the
 * missing answer; the peer is not taken down (its gets had completed), and once P continues
 * it serves the next read and the late answer changes nothing. P's storage is kvx-allocated,
 * mapped here and copied, so the gets need nothing of it. */
static void a_read_whose_done_is_not_answered_fails_at_its_deadline(void **state)
{
    /* Keyed transports: the bytes come from a stopped prefill (CMA or its mapped storage),
     * which over TCP it would have to serve itself. */
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS |
                                               KVX_AGENT_PARAM_FIELD_TRANSPORTS,
                                 .heartbeat_ms = 600000, /* P stays alive to us meanwhile */
                                 .transports   = "sm,cma"};
    uint64_t ids[]            = {2, 7};
    kvx_group_ids_t group     = {ids, 2};
    kvx_request_t request     = {&group, 1, NULL, 0, NULL};
    struct callback_log log   = {0};
    kvx_agent_stats_t stats;
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_xfer_t *xfer;

    (void)state;
    peer = prefill_connect((struct prefill_config){.kvx_storage = true, .transports = "sm,cma"},
                           &p, params, &agent);
    read_verified(agent, peer, 1, ids, 2);
    prefill_stop(&p);
    blocks_clear(agent, ids, 2);
    assert_int_equal(kvx_read_post(agent, &peer, 1, 2, &request, on_xfer, &log, &xfer), KVX_OK);
    progress_for(agent, 100);
    assert_int_equal(kvx_xfer_status(xfer), KVX_INPROGRESS); /* the bytes came, the answer not */
    blocks_verify(agent, ids, 2);
    clock_advance_ms(10000); /* the agent's default timeout */
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_TIMEOUT);
    assert_non_null(strstr(kvx_xfer_error(xfer), "did not answer its done"));
    assert_int_equal(log.calls, 1);
    failed_blocks_are(xfer, ids, 2);
    assert_null(kvx_peer_down_reason(peer));
    kvx_xfer_destroy(xfer);
    prefill_continue(&p);
    read_verified(agent, peer, 3, ids, 2);
    kvx_agent_stats(agent, &stats, sizeof(stats));
    assert_int_equal(stats.transfers, 2);
    assert_int_equal(stats.transfers_failed, 1);
    assert_int_equal(stats.notifications_failed, 0);
    peer_destroy(peer);
    agent_destroy(agent);
    prefill_kill(&p);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(prefill_killed_mid_pull_fails_the_read_then_a_new_prefill_serves,
                                  leftovers_clean),
        cmocka_unit_test_teardown(killed_decode_leaves_its_hold_to_expire, leftovers_clean),
        cmocka_unit_test_teardown(stopped_prefill_fails_the_read_at_its_deadline, leftovers_clean),
        cmocka_unit_test_teardown(stopped_prefill_is_dead_after_three_silent_heartbeats,
                                  leftovers_clean),
        cmocka_unit_test_teardown(restarted_prefill_at_the_same_address_is_noticed,
                                  leftovers_clean),
        cmocka_unit_test_teardown(a_peer_down_outside_the_loop_and_reconnected_at_once_serves,
                                  leftovers_clean),
        cmocka_unit_test_teardown(first_push_posts_while_the_prefill_is_stopped, leftovers_clean),
        cmocka_unit_test_teardown(stopped_prefill_writes_nothing_after_its_push_failed,
                                  leftovers_clean),
        cmocka_unit_test_teardown(ready_pulls_of_a_peer_gone_down_in_the_same_phase_fail_with_it,
                                  leftovers_clean),
        cmocka_unit_test_teardown(idle_peer_is_dropped_after_its_ttl, leftovers_clean),
        cmocka_unit_test_teardown(unknown_and_repeated_dones_are_counted_and_ignored,
                                  leftovers_clean),
        cmocka_unit_test_teardown(a_done_for_a_rank_the_hold_cannot_have_releases_nothing,
                                  leftovers_clean),
        cmocka_unit_test_teardown(a_push_with_a_writer_it_does_not_have_is_answered_with_a_code,
                                  leftovers_clean),
        cmocka_unit_test_teardown(malformed_notifications_are_dropped_and_serving_goes_on,
                                  leftovers_clean),
        cmocka_unit_test_teardown(malformed_heartbeats_are_dropped_and_serving_goes_on,
                                  leftovers_clean),
        cmocka_unit_test_teardown(stuck_push_never_blocks_other_decode_processes, leftovers_clean),
        cmocka_unit_test_teardown(push_beyond_capacity_is_refused_before_any_put, leftovers_clean),
        cmocka_unit_test_teardown(soak_releases_or_expires_every_hold, leftovers_clean),
        cmocka_unit_test_teardown(a_read_whose_done_is_not_answered_fails_at_its_deadline,
                                  leftovers_clean),
    };

    if (argc > 1)
        cmocka_set_test_filter(argv[1]); /* one test by name, when debugging */
    setenv("UCX_NET_DEVICES", "lo", 1);  /* never another interface */
    /* the writers' pushes, as across hosts: on one host a push would go as a read */
    setenv("KVX_PUSH_ON_ONE_HOST", "writers", 1);
    alarm(800);                          /* a hang fails the run instead of stalling CI */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

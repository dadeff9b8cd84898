/* test_served_share.c: issue 36 finding 2, between real processes on loopback: an insider (a
 * process with the deployment's secret, so with the prefill's metadata, as any decode rank)
 * floods the reads the prefill serves itself (engine memory on one host, and tcp) with
 * one-byte rendezvous reads whose answers it never takes, and stops. It holds its share of the
 * prefill's answer records and no more: an honest decode process's pull still succeeds within
 * its deadline, every byte compared; and once the insider is killed and the prefill's clock
 * passes the answers' bound, the records it held count no more. The prefill takes commands,
 * among them moving its clock, so no wall-clock window decides anything. */
#include "clock.h"
#include "core.h"
#include "peer.h"
#include "prefill.h"
#include "transport_private.h" /* white-box: the insider's requests, the prefill's records */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#define PAGE   4096
#define BLOCKS 16
/* The insider's reads: past the bound of all answers in flight before this fix (65536, which
 * they filled), far past one requester's share now (AM_SHARE: 1024). */
#define FLOOD 66000
/* transport_am.c's AM_SHARE and AM_ANSWER_MS. */
#define SHARE     1024
#define ANSWER_MS 60000
/* The honest decode rank's deadline: a pull refused for want of records fails at it. */
#define HONEST_TIMEOUT_MS 5000
/* Ten minutes on the prefill: only the test's clock moves a lease or a deadline there. */
#define PREFILL_MS 600000

static const char layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536}], 'views': ["
    "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 4096, 'stride': 4096,"
    " 'num_blocks': 16}]}";

/* Both sides' UCX_TLS (NULL: kvx's default, sm,cma,tcp), set before the processes fork. */
static const char *transports;

static uint64_t pattern_word(uint64_t index)
{
    return (index + 1) * 0x9e3779b97f4a7c15u;
}

/* What the prefill process reports on 's'. */
struct report {
    kvx_agent_stats_t stats;
    size_t serving;     /* answer records counted against shares and the bound of all */
    size_t written_off; /* records past their bound that UCX still holds */
    size_t links;       /* kvx links accepted and not reaped */
};

/* Reads one command of `go`: 's' reports, 'a' and 8 bytes move the clock forward that many
 * milliseconds, anything else (or EOF) ends the process. */
static bool prefill_command(kvx_agent_t *agent, int go, int ready)
{
    const struct core *core = (const struct core *)agent; /* struct kvx_agent opens with it */
    struct report r         = {0};
    uint64_t ms;
    char c;

    if (read(go, &c, 1) != 1 || (c != 's' && c != 'a'))
        return false;
    if (c == 'a') {
        if (read(go, &ms, sizeof(ms)) != sizeof(ms))
            return false;
        clock_advance_ms(ms);
    }
    kvx_agent_stats(agent, &r.stats, sizeof(r.stats));
    r.serving     = core->transport->serving;
    r.written_off = core->transport->written_off;
    r.links       = core->transport->num_links_accepted;
    return write(ready, &r, sizeof(r)) == sizeof(r);
}

/* The prefill: its storage is the caller's (as an engine's cache is: on one host kvx serves
 * reads of it as messages), holding the pattern; requests 7 and 8 hold block 5, with tokens it
 * reports after its address. */
static int run_prefill(int ready, int go)
{
    static void *bases[1];
    kvx_agent_params_t params = {
        .field_mask = KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_STORAGE_BASES |
                      KVX_AGENT_PARAM_FIELD_LEASE_MS | KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
        .listen        = "127.0.0.1:0",
        .storage_bases = bases,
        .lease_ms      = PREFILL_MS,
        .timeout_ms    = PREFILL_MS};
    uint64_t block        = 5;
    kvx_group_ids_t group = {&block, 1};
    kvx_agent_t *agent;
    kvx_token_t tokens[2];
    uint64_t *words;

    alarm(120);
    if (transports != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_TRANSPORTS;
        params.transports = transports;
    }
    if ((bases[0] = aligned_alloc(PAGE, BLOCKS * PAGE)) == NULL ||
        agent_from_quoted(layout, &params, &agent) != KVX_OK)
        return 10;
    if (((struct core *)agent)->agent != agent)
        return 11; /* the white-box cast above is wrong */
    words = bases[0];
    for (uint64_t i = 0; i < BLOCKS * PAGE / 8; i++)
        words[i] = pattern_word(i);
    if (hold_new(agent, 7, &group, 1, 1, &tokens[0]) != KVX_OK ||
        hold_new(agent, 8, &group, 1, 1, &tokens[1]) != KVX_OK)
        return 12;
    report_serving(ready, agent);
    report_token(ready, &tokens[0]);
    report_token(ready, &tokens[1]);
    for (;;) {
        struct pollfd item = {.fd = go, .events = POLLIN};

        kvx_agent_progress(agent, 5);
        if (poll(&item, 1, 0) > 0 && !prefill_command(agent, go, ready))
            break;
    }
    kvx_agent_destroy(agent);
    return 0;
}

/* ---- the insider ---- */

static char prefill_address[ADDRESS_SIZE]; /* where the insider connects: set before its fork */

/* The insider: a decode agent with the deployment's secret connects to the prefill, as any
 * decode rank does, then posts FLOOD one-byte reads of the prefill's storage on that
 * connection with kvx's own protocol, each asking for a rendezvous answer (as a read into
 * device memory does), past the connection's window (an insider's build keeps none), and
 * reports on `ready`. From then on it progresses its connection's worker so that its requests
 * leave, and never takes an answer (kvx's receives start only in transport_conn_progress),
 * until it is stopped and killed. */
static int run_insider(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .timeout_ms = PREFILL_MS};
    static uint8_t sink[PAGE];
    struct transport_conn *conn;
    struct transport_op *op;
    kvx_agent_t *agent;
    kvx_peer_t *peer;

    (void)go;
    alarm(120);
    if (transports != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_TRANSPORTS;
        params.transports = transports;
    }
    if (agent_from_quoted(layout, &params, &agent) != KVX_OK ||
        kvx_agent_connect(agent, prefill_address, &peer) != KVX_OK)
        return 10;
    conn = peer_conn(peer)->transport;
    if (transport_op_create(conn, NULL, NULL, &op) != KVX_OK)
        return 11;
    for (uint64_t i = 0; i < FLOOD; i++) {
        conn->in_flight = 0; /* no window */
        if (am_read_post(op, 0, (i * 131) % (BLOCKS * PAGE), sink, 1, true) != KVX_OK)
            return 12;
        if (i % 64 == 0)
            ucp_worker_progress(conn->worker);
    }
    (void)!write(ready, "posted", 7);
    for (;;)
        ucp_worker_progress(conn->worker);
}

/* The insider over tcp, where reads go over its kvx link (issue 36 finding 1): FLOOD one-byte
 * reads, as many as its link takes, each a request of its own, then it stops reading the
 * answers (it is stopped, then killed): what it can hold up is its own link only. */
static int run_insider_link(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                                               KVX_AGENT_PARAM_FIELD_TRANSPORTS,
                                 .timeout_ms = PREFILL_MS,
                                 .transports = "tcp"};
    static uint8_t sink[PAGE];
    void *local_bases[1]            = {sink};
    kvx_mem_type_t local_mems[1]    = {KVX_MEM_DRAM};
    uint64_t remote_bases[1]        = {0};
    struct transport_targets target = {local_bases, local_mems, remote_bases, false};
    struct transport_conn *conn;
    struct transport_op *op;
    kvx_agent_t *agent;
    kvx_peer_t *peer;

    (void)go;
    alarm(120);
    if (agent_from_quoted(layout, &params, &agent) != KVX_OK ||
        kvx_agent_connect(agent, prefill_address, &peer) != KVX_OK)
        return 10;
    conn = peer_conn(peer)->transport;
    if (!conn->linked || transport_op_create(conn, NULL, NULL, &op) != KVX_OK)
        return 11;
    for (uint64_t i = 0; i < FLOOD; i++) {
        kvx_pair_t pair = {0, 0, 0, (i * 131) % (BLOCKS * PAGE), 1};

        if (transport_rma_post(op, false, &pair, 1, &target) != KVX_OK)
            return 12;
        if (i % 64 == 0)
            transport_conn_progress(conn);
    }
    (void)!write(ready, "posted", 7);
    for (;;)
        transport_conn_progress(conn);
}

/* ---- the honest decode rank, this process ---- */

/* The processes of a test and this process's agent: the teardown ends what a failed test left,
 * so that the next one forks from a process without UCX. */
static struct scene {
    pid_t prefill;
    int prefill_ready;
    int prefill_go;
    kvx_token_t tokens[2]; /* of requests 7 and 8 */
    pid_t insider;
    int insider_ready;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
} scene;

static struct report prefill_ask(char c, uint64_t ms)
{
    struct report r;

    assert_int_equal(write(scene.prefill_go, &c, 1), 1);
    if (c == 'a')
        assert_int_equal(write(scene.prefill_go, &ms, sizeof(ms)), sizeof(ms));
    assert_int_equal(read(scene.prefill_ready, &r, sizeof(r)), sizeof(r));
    return r;
}

/* Block 5 of request `request_id`, read and compared word by word; returns the read's
 * status. */
static kvx_status_t read_block5(uint64_t request_id, const kvx_token_t *token)
{
    uint64_t block        = 5;
    kvx_group_ids_t group = {&block, 1};
    kvx_request_t request = {&group, 1, NULL, 0, token};
    uint64_t *words       = kvx_agent_storage(scene.agent, 0, NULL);
    kvx_status_t status;

    memset(words + 5 * PAGE / 8, 0, PAGE);
    status = kvx_read(scene.agent, &scene.peer, 1, request_id, &request, NULL);
    for (uint64_t i = 5 * PAGE / 8; status == KVX_OK && i < 6 * PAGE / 8; i++) {
        if (words[i] != pattern_word(i))
            fail_msg("word %" PRIu64 " of block 5 differs", i);
    }
    return status;
}

/* Issue 36 finding 2: one insider's answers it never took disabled served reads for every
 * peer, for as long as the prefill lived. */
static void an_insider_that_never_takes_its_answers_holds_only_its_share(bool linked)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .timeout_ms = HONEST_TIMEOUT_MS};
    struct report r;
    uint64_t start;
    char posted[7];
    int go[2];
    int status;

    assert_int_equal(pipe(go), 0);
    scene.prefill = start_prefill(run_prefill, go[0], prefill_address, &scene.prefill_ready);
    close(go[0]);
    scene.prefill_go = go[1];
    scene.tokens[0]  = read_token(scene.prefill_ready);
    scene.tokens[1]  = read_token(scene.prefill_ready);
    /* both children before this process's agent: UCX does not survive a fork */
    scene.insider = prefill_fork(linked ? run_insider_link : run_insider, -1,
                                 &scene.insider_ready);
    assert_int_equal(read(scene.insider_ready, posted, sizeof(posted)), sizeof(posted));
    /* every read of the flood reached the prefill: answered (and held) or refused */
    for (start = clock_ms(); !linked;) {
        r = prefill_ask('s', 0);
        if (r.serving + r.stats.data_refused >= FLOOD)
            break;
        if (clock_ms() - start > 60000)
            fail_msg("the flood did not reach the prefill in 60 s: %zu held, %" PRIu64 " refused",
                     r.serving, r.stats.data_refused);
    }
    assert_int_equal(kill(scene.insider, SIGSTOP), 0);

    /* an honest decode rank is served meanwhile, within its deadline, every byte right */
    if (transports != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_TRANSPORTS;
        params.transports = transports;
    }
    assert_int_equal(agent_from_quoted(layout, &params, &scene.agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(scene.agent, prefill_address, &scene.peer), KVX_OK);
    start = clock_ms();
    assert_int_equal(read_block5(7, &scene.tokens[0]), KVX_OK);
    assert_true(clock_ms() - start < HONEST_TIMEOUT_MS);
    r = prefill_ask('s', 0);
    if (linked) {
        /* its answers wait in its own link, bounded (tcplink.h TCPLINK_QUEUE_MAX), and no other
         * link's; its link goes with it */
        assert_int_equal(r.links, 2);
        print_message("over a link: %" PRIu64 " reads served, the insider stopped\n",
                      r.stats.data_reads_served);
        assert_int_equal(kill(scene.insider, SIGKILL), 0);
        assert_int_equal(waitpid(scene.insider, &status, 0), scene.insider);
        scene.insider = 0;
        for (start = clock_ms(); (r = prefill_ask('s', 0)).links > 1;) {
            if (clock_ms() - start > 10000)
                fail_msg("the dead insider's link was not reaped in 10 s");
        }
        assert_int_equal(read_block5(8, &scene.tokens[1]), KVX_OK);
        return;
    }
    /* the insider holds its share and no more; the rest of its flood was refused */
    assert_int_equal(r.serving, SHARE);
    assert_true(r.stats.data_refused >= FLOOD - SHARE);
    assert_int_equal(r.written_off, 0);

    /* the insider dies: once the prefill's clock passes the bound, its records count no more
     * (written off, or ended if UCX ended them), and the prefill's loop sleeps again */
    assert_int_equal(kill(scene.insider, SIGKILL), 0);
    assert_int_equal(waitpid(scene.insider, &status, 0), scene.insider);
    scene.insider = 0;
    r             = prefill_ask('a', ANSWER_MS + 1000);
    for (start = clock_ms(); r.serving > 0;) {
        if (clock_ms() - start > 10000)
            fail_msg("%zu records still counted 10 s after the bound", r.serving);
        r = prefill_ask('s', 0);
    }
    assert_true(r.written_off <= SHARE);
    /* and the honest rank reads the next request */
    assert_int_equal(read_block5(8, &scene.tokens[1]), KVX_OK);
}

static void an_insider_over_shared_memory_holds_only_its_share(void **state)
{
    (void)state;
    transports = NULL; /* sm,cma,tcp: on one host the reads go as messages over shared memory */
    an_insider_that_never_takes_its_answers_holds_only_its_share(false);
}

static void an_insider_over_tcp_holds_only_its_share(void **state)
{
    (void)state;
    transports = "tcp";
    an_insider_that_never_takes_its_answers_holds_only_its_share(true);
}

/* Ends the test's agent and processes, whether it passed or not; a prefill that passed exits
 * on its own, with status 0. */
static int scene_end(void **state)
{
    int status = 0;
    int result = 0;

    (void)state;
    kvx_peer_destroy(scene.peer);
    if (scene.agent != NULL && kvx_agent_destroy(scene.agent) != KVX_OK)
        result = -1;
    if (scene.insider > 0) {
        kill(scene.insider, SIGKILL);
        waitpid(scene.insider, &status, 0);
    }
    if (scene.insider_ready > 0)
        close(scene.insider_ready);
    if (scene.prefill > 0) {
        (void)!write(scene.prefill_go, "q", 1);
        close(scene.prefill_go);
        close(scene.prefill_ready);
        if (waitpid(scene.prefill, &status, 0) != scene.prefill || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            result = -1;
    }
    scene = (struct scene){0};
    return result;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(an_insider_over_shared_memory_holds_only_its_share, scene_end),
        cmocka_unit_test_teardown(an_insider_over_tcp_holds_only_its_share, scene_end),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_push_serve.c: the prefill half of push between real processes on loopback (issue 22
 * findings 3 and 4, issue 23). Four requesters that register, fill their share of push jobs
 * and stop progressing leave an honest requester its slot, and the prefill's stall check frees
 * theirs; a push writes for as long as its requester waits, at most the prefill's max_push_ms;
 * a push request on the data plane without a registered writer's handle is refused. Time
 * is moved with the prefill process's injectable clock (clock_advance_ms), never slept into:
 * a stalled requester is one that stopped calling progress and was then stopped (SIGSTOP). */
#include "auth.h"
#include "clock.h"
#include "core.h"
#include "layouts.h"
#include "msg_mac.h"
#include "prefill.h"
#include "push_limits.h"
#include "push_request.h"
#include "sidechan.h"
#include "transport.h"

#include <zmq.h>

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
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define PAGE     4096
#define BLOCKS   64
#define STALLERS 4
#define PUSHES   64 /* each staller's: the default max_pushes; four of them were 256 */
#define P_TIMEOUT                                                                                  \
    60000             /* the prefill's timeout_ms, so its stall bound: far beyond any wait         \
                         of a test on a slow machine, and reached only by moving its clock */
#define WAIT_MS 60000 /* the longest any wait for the other processes here may take */

static const char layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 262144}], 'views': ["
    "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 4096, 'stride': 4096,"
    " 'num_blocks': 64}]}";

/* What the prefill process of a test is given before it forks. */
static struct {
    uint32_t timeout_ms;
    uint32_t max_push_ms;
} config = {P_TIMEOUT, KVX_DEFAULT_MAX_PUSH_MS};

/* What a prefill process says about itself on 's'. */
struct report {
    kvx_agent_stats_t stats;
    uint64_t stalled_lines; /* log lines of a stalled writer */
    char push_line[400];    /* its last log line about a push, or "" */
};

static uint64_t pattern_word(uint64_t index)
{
    return (index + 1) * 0x9e3779b97f4a7c15u;
}

/* Collects what the tests look for in the prefill's log. */
static void log_line(void *arg, const char *line)
{
    struct report *r = arg;

    if (strstr(line, "stalled") != NULL)
        r->stalled_lines++;
    if (strncmp(line, "push", 4) == 0)
        snprintf(r->push_line, sizeof(r->push_line), "%s", line);
}

/* A prefill process, its storage filled with the pattern, serving until 'q' on `go`; on 's'
 * it writes a struct report on `ready`; on 'a' and 8 bytes it moves its clock forward that
 * many ms (then answers 'a' once a loop turn ran past it). */
static int run_prefill(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                                               KVX_AGENT_PARAM_FIELD_MAX_PUSH_MS,
                                 .listen      = "127.0.0.1:0",
                                 .timeout_ms  = config.timeout_ms,
                                 .max_push_ms = config.max_push_ms};
    struct report log         = {0};
    kvx_agent_t *agent;
    uint64_t *words;
    uint64_t size;

    alarm(300);
    if (agent_from_quoted(layout, &params, &agent) != KVX_OK)
        return 10;
    kvx_agent_set_log_callback(agent, log_line, &log);
    words = kvx_agent_storage(agent, 0, &size);
    for (uint64_t i = 0; i < size / 8; i++)
        words[i] = pattern_word(i);
    report_serving(ready, agent);
    for (;;) {
        struct pollfd item = {.fd = go, .events = POLLIN};
        uint64_t ms;
        char c;

        kvx_agent_progress(agent, 5);
        if (poll(&item, 1, 0) <= 0)
            continue;
        if (read(go, &c, 1) != 1 || c == 'q')
            break;
        if (c == 'a') {
            if (read(go, &ms, sizeof(ms)) != sizeof(ms))
                return 11;
            clock_advance_ms(ms);
            kvx_agent_progress(agent, 0); /* its timers run on this turn */
            if (write(ready, "a", 1) != 1)
                return 12;
            continue;
        }
        kvx_agent_stats(agent, &log.stats, sizeof(log.stats));
        if (write(ready, &log, sizeof(log)) != sizeof(log))
            return 13;
    }
    return kvx_agent_destroy(agent) == KVX_OK ? 0 : 14;
}

struct prefill {
    pid_t pid;
    int ready;
    int go;
    char address[ADDRESS_SIZE];
};

static void prefill_start(struct prefill *p)
{
    int go[2];

    assert_int_equal(pipe(go), 0);
    p->pid = start_prefill(run_prefill, go[0], p->address, &p->ready);
    close(go[0]);
    p->go = go[1];
}

static struct report prefill_report(const struct prefill *p)
{
    struct report r;

    assert_int_equal(write(p->go, "s", 1), 1);
    assert_int_equal(read(p->ready, &r, sizeof(r)), sizeof(r));
    return r;
}

static void prefill_advance(const struct prefill *p, uint64_t ms)
{
    char c;

    assert_int_equal(write(p->go, "a", 1), 1);
    assert_int_equal(write(p->go, &ms, sizeof(ms)), sizeof(ms));
    assert_int_equal(read(p->ready, &c, 1), 1);
}

static void prefill_end(struct prefill *p)
{
    int status;

    assert_int_equal(write(p->go, "q", 1), 1);
    assert_int_equal(waitpid(p->pid, &status, 0), p->pid);
    close(p->go);
    close(p->ready);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Reports of `p` until `reached` holds, or fails after WAIT_MS. */
static struct report prefill_wait(const struct prefill *p, bool (*reached)(const struct report *),
                                  const char *what)
{
    uint64_t start = clock_ms();
    struct report r;

    for (r = prefill_report(p); !reached(&r); r = prefill_report(p)) {
        if (clock_ms() - start > WAIT_MS)
            fail_msg("waited %d ms for %s: %" PRIu64 " pushes in flight, %" PRIu64 " refused",
                     WAIT_MS, what, r.stats.pushes_serving, r.stats.pushes_refused);
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    return r;
}

/* A requester in a process of its own: connects to `address` with `timeout_ms`, pushes block
 * 0 once (which registers it and proves its worker), then posts `count` pushes and writes
 * 'p' on `ready`, and never calls progress again: its worker acknowledges nothing, so the
 * prefill's flushes to it never complete. It waits to be killed. */
static pid_t requester_start(const char *address, uint32_t timeout_ms, size_t count)
{
    int ready[2];
    char c;
    pid_t pid;

    assert_int_equal(pipe(ready), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                     .timeout_ms = timeout_ms};
        uint64_t blocks[PUSHES];
        kvx_group_ids_t groups[PUSHES];
        kvx_request_t request;
        kvx_agent_t *agent;
        kvx_peer_t *peer;
        kvx_xfer_t *xfer;

        close(ready[0]);
        alarm(300);
        /* On the data plane a request leaves with its requester's progress, which a staller
         * never makes after posting: the side channel's I/O thread sends them all. */
        setenv("KVX_PUSH_REQUESTS", "side-channel", 1);
        if (agent_from_quoted(layout, &params, &agent) != KVX_OK ||
            kvx_agent_connect(agent, address, &peer) != KVX_OK)
            _exit(20);
        blocks[0] = 0;
        groups[0] = (kvx_group_ids_t){&blocks[0], 1};
        request   = (kvx_request_t){&groups[0], 1, NULL, 0, NULL};
        if (kvx_write(agent, &peer, 1, 1, &request, NULL) != KVX_OK)
            _exit(21);
        for (size_t i = 0; i < count && i < PUSHES; i++) {
            blocks[i] = i % BLOCKS;
            groups[i] = (kvx_group_ids_t){&blocks[i], 1};
            request   = (kvx_request_t){&groups[i], 1, NULL, 0, NULL};
            if (kvx_write_post(agent, &peer, 1, 100 + i, &request, NULL, NULL, &xfer) != KVX_OK)
                _exit(22);
        }
        (void)!write(ready[1], "p", 1);
        for (;;)
            pause();
    }
    close(ready[1]);
    assert_int_equal(read(ready[0], &c, 1), 1); /* EOF: it failed; its status says where */
    close(ready[0]);
    return pid;
}

static void requester_kill(pid_t pid)
{
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
}

static size_t expected_answers; /* pushes the prefill must have served or refused */

static bool all_answered(const struct report *r)
{
    return r->stats.pushes_serving + r->stats.pushes_refused >= expected_answers;
}

static bool none_serving(const struct report *r)
{
    return r->stats.pushes_serving == 0;
}

static bool one_serving(const struct report *r)
{
    return r->stats.pushes_serving == 1;
}

/* An honest push of blocks 3, 17 and 40 from `p`: completes, and every byte is the prefill's. */
static void honest_push(const struct prefill *p, uint64_t request_id)
{
    uint64_t blocks[]     = {3, 17, 40};
    kvx_group_ids_t group = {blocks, 3};
    kvx_request_t request = {&group, 1, NULL, 0, NULL};
    kvx_agent_t *agent    = NULL;
    kvx_peer_t *peer;
    const uint64_t *words;
    kvx_status_t status;

    assert_int_equal(agent_from_quoted(layout, NULL, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, p->address, &peer), KVX_OK);
    status = kvx_write(agent, &peer, 1, request_id, &request, NULL);
    if (status != KVX_OK)
        fail_msg("the honest push: %s", kvx_errmsg());
    words = kvx_agent_storage(agent, 0, NULL);
    for (size_t b = 0; b < 3; b++) {
        for (size_t i = 0; i < PAGE / 8; i++) {
            uint64_t index = blocks[b] * PAGE / 8 + i;

            if (words[index] != pattern_word(index))
                fail_msg("block %" PRIu64 ", word %zu: not the prefill's", blocks[b], i);
        }
    }
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
}

/* Finding 3: four requesters register, post 64 pushes each (the 256 jobs) and stop. Each
 * writer's first job has a slot of its own and the rest are shared fairly, so they hold at
 * most PUSH_SHARED_JOBS + 4, and an honest push completes, verified, while they still hold
 * them. Then the prefill's clock passes its stall bound (timeout_ms): every stalled job
 * fails, its slot is free, and the prefill serves on. */
static void stalled_requesters_leave_an_honest_push_its_slot(void **state)
{
    struct prefill p;
    pid_t stallers[STALLERS];
    struct report r;

    (void)state;
    prefill_start(&p);
    for (size_t i = 0; i < STALLERS; i++)
        stallers[i] = requester_start(p.address, 120000, PUSHES);
    expected_answers = STALLERS * PUSHES;
    r                = prefill_wait(&p, all_answered, "every staller's pushes");
    for (size_t i = 0; i < STALLERS; i++)
        kill(stallers[i], SIGSTOP);
    print_message("stallers hold %" PRIu64 " pushes, %" PRIu64 " refused\n", r.stats.pushes_serving,
                  r.stats.pushes_refused);
    assert_true(r.stats.pushes_serving >= STALLERS);
    assert_true(r.stats.pushes_serving <= PUSH_SHARED_JOBS + STALLERS);

    honest_push(&p, 7);
    r = prefill_report(&p);
    /* the honest push came through its kept slot, not because the stallers let go */
    assert_true(r.stats.pushes_serving >= PUSH_SHARED_JOBS);
    assert_int_equal(r.stalled_lines, 0);

    /* the stall bound, on the prefill's clock: a check every timeout / 4 */
    for (int i = 0; i < 8 && prefill_report(&p).stats.pushes_serving > 0; i++)
        prefill_advance(&p, P_TIMEOUT / 4 + 1);
    r = prefill_wait(&p, none_serving, "the stalled pushes to fail");
    assert_int_equal(r.stalled_lines, STALLERS);
    assert_non_null(strstr(r.push_line, "completed nothing for"));
    honest_push(&p, 8);
    for (size_t i = 0; i < STALLERS; i++)
        requester_kill(stallers[i]);
    prefill_end(&p);
}

/* Finding 4: a push writes for as long as its requester waits, at most max_push_ms, whatever
 * the prefill's own timeout_ms. A requester posts one push and stalls; the prefill's clock
 * then jumps to 1 s before the deadline the row expects (the push is still in flight), then
 * past it (the push fails, naming it). The stall check sees the first jump once, right after
 * the push's last step: with a 10 min timeout it runs every 150 s of real time, so it has
 * not run before, however slow the machine, and counts the step as progress. */
static const struct deadline_case {
    const char *rule;
    uint32_t requester_ms; /* the requester's timeout_ms */
    uint32_t timeout_ms;   /* the prefill's */
    uint32_t max_push_ms;  /* the prefill's */
    uint32_t expected_ms;
} deadline_cases[] = {
    {"the_requesters_deadline_beyond_the_prefills_timeout", 900000, 600000, 3600000, 900000},
    {"capped_at_max_push_ms", 120000, 600000, 5000, 5000},
};

static void a_push_writes_as_long_as_its_requester_waits(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof(deadline_cases) / sizeof(deadline_cases[0]); c++) {
        const struct deadline_case *row = &deadline_cases[c];
        char expected[64];
        struct prefill p;
        struct report r;
        pid_t requester;

        print_message("%s\n", row->rule);
        config.timeout_ms  = row->timeout_ms;
        config.max_push_ms = row->max_push_ms;
        prefill_start(&p);
        config.timeout_ms  = P_TIMEOUT;
        config.max_push_ms = KVX_DEFAULT_MAX_PUSH_MS;
        requester          = requester_start(p.address, row->requester_ms, 1);
        prefill_wait(&p, one_serving, "the requester's push");
        kill(requester, SIGSTOP);
        prefill_advance(&p, row->expected_ms - 1000);
        assert_int_equal(prefill_report(&p).stats.pushes_serving, 1); /* not before it */
        prefill_advance(&p, 1001);
        r = prefill_wait(&p, none_serving, "the push's deadline");
        snprintf(expected, sizeof(expected), "not written within %" PRIu32 " ms", row->expected_ms);
        if (strstr(r.push_line, expected) == NULL)
            fail_msg("%s: the prefill logged \"%s\", not \"%s\"", row->rule, r.push_line, expected);
        assert_int_equal(r.stalled_lines, 0);
        requester_kill(requester);
        prefill_end(&p);
    }
}

/* ---- push requests on the data plane (issue 23) ---- */

static uint64_t refused_before; /* the prefill's push_messages_refused before a step */

static bool two_more_refused(const struct report *r)
{
    return r->stats.push_messages_refused >= refused_before + 2;
}

struct answer_seen {
    bool seen;
    struct push_am_answer answer;
    char text[600];
};

static void answer_record(void *arg, const void *data, size_t size,
                          const struct transport_msg_from *from)
{
    struct answer_seen *a = arg;

    (void)from;
    if (a->seen || !push_am_answer_parse(data, size, &a->answer))
        return;
    snprintf(a->text, sizeof(a->text), "%.*s", (int)a->answer.text_size, a->answer.text);
    a->seen = true;
}

/* The insider, a process of its own with the deployment's secret: an agent that registers
 * (an honest push of block 9, so the prefill has a writer of it), then, from a UCX endpoint of
 * its own that the prefill never saw, a push request message for blocks 3 and 17 with a handle
 * it made up, and a message that is not a request. The first must be answered "refused,
 * unregistered" naming its id and handle, at once; nothing may land in the agent's memory,
 * zeroed after its push. Exits 0 when so. */
static int run_message_insider(const char *address, int go)
{
    uint64_t ids[]          = {3, 17};
    kvx_group_ids_t group   = {ids, 2};
    kvx_request_t request   = {&group, 1, NULL, 0, NULL};
    uint64_t honest_id      = 9;
    kvx_group_ids_t honest  = {&honest_id, 1};
    kvx_request_t registers = {&honest, 1, NULL, 0, NULL};
    uint8_t handle[PUSH_HANDLE_LEN];
    uint8_t message[PUSH_AM_MAX];
    struct answer_seen seen = {0};
    struct auth_keys keys;
    kvx_metadata_info_t info;
    kvx_metadata_t *md;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    struct transport *t;
    struct transport_conn *conn;
    void *zmq = zmq_ctx_new();
    uint64_t *words;
    uint64_t size;
    void *bytes;
    size_t body_size;
    void *body;
    uint8_t tagged[PUSH_AM_MAX] = {0};
    size_t framed;

    alarm(60);
    if (read(go, message, 1) != 1) /* the honest requester pushed once */
        return 49;
    if (agent_from_quoted(layout, NULL, &agent) != KVX_OK ||
        kvx_agent_connect(agent, address, &peer) != KVX_OK ||
        kvx_write(agent, &peer, 1, 1, &registers, NULL) != KVX_OK) {
        printf("insider: %s\n", kvx_errmsg());
        fflush(stdout);
        return 50;
    }
    words = kvx_agent_storage(agent, 0, &size);
    memset(words, 0, size);
    if (auth_keys_derive(test_auth_key, &keys) != KVX_OK ||
        sidechan_fetch(zmq, address, &keys, VERB_METADATA, 1 << 24, 10000, &bytes, &size) !=
            KVX_OK ||
        kvx_metadata_unpack(bytes, size, kvx_agent_regions(agent), KVX_MODE_PULL, &md) != KVX_OK)
        return 51;
    kvx_metadata_get_info(md, &info);
    for (size_t i = 0; i < sizeof(handle); i++)
        handle[i] = (uint8_t)(0xa5 ^ i);
    if (transport_create("sm,cma,tcp", false, &t) != KVX_OK ||
        transport_msg_set_handler(t, CORE_AM_PUSH_ANSWER, true, answer_record, &seen) != KVX_OK ||
        transport_conn_create(t, info.transport_address.data, info.transport_address.size,
                              "127.0.0.1", NULL, 0, &conn) != KVX_OK)
        return 52;
    /* [tag][request]: a made-up handle, and a tag of zeros (no key to make one with) */
    if (push_request_encode(7, handle, 10000, 0, &request, &body, &body_size) != KVX_OK ||
        body_size > sizeof(tagged) - MSG_MAC_LEN)
        return 53;
    memcpy(tagged + MSG_MAC_LEN, body, body_size);
    framed = push_am_request_frame(77, tagged, MSG_MAC_LEN + body_size, message);
    if (framed == 0 ||
        transport_msg_send(conn, CORE_AM_PUSH_REQUEST, message, framed) != KVX_OK)
        return 53;
    for (uint64_t deadline = clock_ms() + 10000; !seen.seen && clock_ms() < deadline;)
        transport_conn_progress(conn);
    printf("insider: answer %s\n", seen.seen ? seen.text : "(none)");
    fflush(stdout);
    if (!seen.seen || seen.answer.id != 77 || memcmp(seen.answer.handle, handle, 16) != 0 ||
        strstr(seen.text, "kvx-error [unregistered]") != seen.text)
        return 54;
    memcpy(message, "not a push request", 18);
    if (transport_msg_send(conn, CORE_AM_PUSH_REQUEST, message, 18) != KVX_OK)
        return 55;
    for (int i = 0; i < 1000; i++) /* it leaves: this process progresses its own worker */
        transport_conn_progress(conn);
    for (uint64_t deadline = clock_ms() + 200; clock_ms() < deadline;)
        kvx_agent_progress(agent, 10); /* a write, had the prefill made one, lands here */
    for (uint64_t i = 0; i < size / 8 && size > 0; i++) {
        if (words[i] != 0)
            return 56;
    }
    free(body);
    transport_conn_destroy(conn);
    transport_destroy(t);
    kvx_metadata_destroy(md);
    free(bytes);
    kvx_peer_destroy(peer);
    kvx_agent_destroy(agent);
    zmq_ctx_term(zmq);
    return 0;
}

/* Issue 23: push requests travel as messages on the data plane, where anyone who reaches
 * the prefill's worker can send one; only a registered writer's handle, which the side channel
 * gave its registrant, makes one a push. An honest requester's pushes complete by message,
 * verified, before and after an insider's endpoint sends a made-up handle (refused at once,
 * to it, counted) and a malformed message (counted); the honest requester's zeroed memory
 * takes no byte meanwhile. */
static void data_plane_push_requests_need_a_registered_handle(void **state)
{
    struct prefill p;
    kvx_agent_t *agent = NULL;
    kvx_peer_t *peer;
    uint64_t ids[]        = {3, 17, 40};
    kvx_group_ids_t group = {ids, 3};
    kvx_request_t request = {&group, 1, NULL, 0, NULL};
    uint64_t *words;
    uint64_t size;
    pid_t insider;
    struct report report;
    int status;
    int go[2];

    (void)state;
    prefill_start(&p);
    /* forked before this process has UCX of its own: a child inherits none of it well */
    assert_int_equal(pipe(go), 0);
    insider = fork();
    assert_true(insider >= 0);
    if (insider == 0) {
        close(go[1]);
        _exit(run_message_insider(p.address, go[0]));
    }
    close(go[0]);
    assert_int_equal(agent_from_quoted(layout, NULL, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    if (kvx_write(agent, &peer, 1, 1, &request, NULL) != KVX_OK)
        fail_msg("the honest push: %s", kvx_errmsg());
    words = kvx_agent_storage(agent, 0, &size);
    assert_true(words[3 * PAGE / 8] == pattern_word(3 * PAGE / 8));
    memset(words, 0, size);
    report = prefill_report(&p);
    assert_int_equal(report.stats.pushes_by_message, 1); /* the push came on the data plane */
    assert_int_equal(report.stats.push_messages_refused, 0);
    refused_before = report.stats.push_messages_refused;
    assert_int_equal(write(go[1], "g", 1), 1);
    close(go[1]);
    while (waitpid(insider, &status, WNOHANG) == 0)
        kvx_agent_progress(agent, 10); /* a write, had the prefill made one, lands here */
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    report = prefill_wait(&p, two_more_refused, "the insider's two messages refused");
    assert_int_equal(report.stats.push_messages_refused, 2);
    assert_int_equal(report.stats.pushes_by_message, 2); /* and the insider's honest one */
    kvx_agent_progress(agent, 0);
    for (uint64_t i = 0; i < size / 8; i++) {
        if (words[i] != 0)
            fail_msg("word %" PRIu64 " of the honest requester changed", i);
    }
    if (kvx_write(agent, &peer, 1, 2, &request, NULL) != KVX_OK)
        fail_msg("the honest push after the insider: %s", kvx_errmsg());
    for (size_t b = 0; b < 3; b++) {
        for (size_t i = 0; i < PAGE / 8; i++) {
            uint64_t index = ids[b] * PAGE / 8 + i;

            if (words[index] != pattern_word(index))
                fail_msg("block %" PRIu64 ", word %zu: not the prefill's", ids[b], i);
        }
    }
    assert_int_equal(prefill_report(&p).stats.pushes_by_message, 3);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    prefill_end(&p);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stalled_requesters_leave_an_honest_push_its_slot),
        cmocka_unit_test(a_push_writes_as_long_as_its_requester_waits),
        cmocka_unit_test(data_plane_push_requests_need_a_registered_handle),
    };

    setenv("UCX_NET_DEVICES", "lo", 0);
    /* the writers' pushes, as across hosts: on one host a push would go as a read */
    setenv("KVX_PUSH_ON_ONE_HOST", "writers", 1);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]); /* one test by name, when debugging */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

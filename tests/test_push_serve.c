/* test_push_serve.c: the prefill half of push between real processes on loopback (issue 22
 * findings 3 and 4). Four requesters that register, fill their share of push jobs and stop
 * progressing leave an honest requester its slot, and the prefill's stall check frees theirs;
 * a push writes for as long as its requester waits, at most the prefill's max_push_ms. Time
 * is moved with the prefill process's injectable clock (clock_advance_ms), never slept into:
 * a stalled requester is one that stopped calling progress and was then stopped (SIGSTOP). */
#include "clock.h"
#include "layouts.h"
#include "prefill.h"
#include "push_limits.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stalled_requesters_leave_an_honest_push_its_slot),
        cmocka_unit_test(a_push_writes_as_long_as_its_requester_waits),
    };

    setenv("UCX_NET_DEVICES", "lo", 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

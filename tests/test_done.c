/* test_done.c: issue 21, "never another prompt's tokens", between real processes on
 * loopback: a transfer succeeds only when the prefill side's hold was alive for it. A done
 * with a wrong token, a reference read twice, a stale one (lease expired) and a done past the
 * parking deadline fail their reads with KVX_ERR_PEER_REFUSED and change no hold; a done that
 * comes before its hold waits for it; dones travel as messages on the data plane once the
 * connection has a handle, and mean the same; a push with the token is its rank's done, and
 * one with a wrong token writes nothing; on one host a push goes as a read, with its done; a
 * prefill that answers every done "resend" fails the read at its second. The prefill process
 * takes commands, among them moving its clock, so no wall-clock window decides anything. */
#define _DEFAULT_SOURCE /* SO_RCVBUFFORCE, for the capture */
#include "auth.h"
#include "clock.h"
#include "conn.h"
#include "core.h"
#include "done_handles.h"
#include "msg_mac.h"
#include "notify.h"
#include "prefill.h"
#include "peer.h"
#include "prng.h"
#include "push_request.h"
#include "sidechan.h"
#include "transport.h"
#include "xfer_log.h"
#include "zsocket.h"

#include <zmq.h>

#include <setjmp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#define PAGE 4096
/* Ten minutes, on both sides: only the test's clock moves a lease, a parked done's wait or a
 * deadline, never the seconds a loaded machine takes. */
#define LEASE_MS   600000
#define TIMEOUT_MS 600000
/* The decode side's deadline behind the liar: one that believes every "resend" sends its done
 * again until then (issue 36 finding 9), and the test must end either way. */
#define LIAR_TIMEOUT_MS 10000

static const char mla_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536}], 'views': ["
    "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 4096, 'stride': 4096,"
    " 'num_blocks': 16}]}";

/* Word i of the prefill side's storage. */
static uint64_t pattern_word(uint64_t index)
{
    return (index + 1) * 0x9e3779b97f4a7c15u;
}

/* Block `id` of the decode side's storage holds the prefill side's block `id`. */
static bool block_matches(const kvx_agent_t *agent, uint64_t id)
{
    const uint64_t *words = kvx_agent_storage(agent, 0, NULL);

    for (uint64_t i = id * PAGE / 8; i < (id + 1) * PAGE / 8; i++) {
        if (words[i] != pattern_word(i))
            return false;
    }
    return true;
}

static bool block_is_zero(const kvx_agent_t *agent, uint64_t id)
{
    const uint64_t *words = kvx_agent_storage(agent, 0, NULL);

    for (uint64_t i = id * PAGE / 8; i < (id + 1) * PAGE / 8; i++) {
        if (words[i] != 0)
            return false;
    }
    return true;
}

static void block_clear(const kvx_agent_t *agent, uint64_t id)
{
    memset((char *)kvx_agent_storage(agent, 0, NULL) + id * PAGE, 0, PAGE);
}

/* What the prefill process answers each command with. */
struct report {
    kvx_agent_stats_t stats;
    int releases;          /* release callbacks run */
    uint64_t last_release; /* the request id of the last one */
};

/* A hold command: request `request_id`'s block `block` for `consumers` ranks, with `token`. */
struct hold_command {
    uint64_t request_id;
    uint64_t block;
    uint32_t consumers;
    kvx_token_t token;
};

static void on_release(void *arg, uint64_t request_id, const kvx_group_ids_t *groups,
                       size_t num_groups)
{
    struct report *report = arg;

    (void)groups;
    (void)num_groups;
    report->releases++;
    report->last_release = request_id;
}

/* Runs one command byte of `go`: 'H' and a struct hold_command holds; 'a' and 4 bytes of
 * milliseconds moves this process's clock; 'e' and 4 bytes of a count serves until that many
 * dones came early in all (or 10 s); 's' only reports. Returns false on 'q' or a broken pipe. */
static bool prefill_command(kvx_agent_t *agent, int go, int ready, struct report *report)
{
    struct hold_command hold;
    uint32_t amount = 0;
    char command;

    if (read(go, &command, 1) != 1 || command == 'q')
        return false;
    if (command == 'H') {
        kvx_group_ids_t group = {&hold.block, 1};

        if (read(go, &hold, sizeof(hold)) != sizeof(hold) ||
            kvx_hold(agent, hold.request_id, &group, 1, hold.consumers, &hold.token) != KVX_OK)
            return false;
    } else if (command == 'a' || command == 'e') {
        if (read(go, &amount, sizeof(amount)) != sizeof(amount))
            return false;
    }
    if (command == 'a')
        clock_advance_ms(amount);
    for (uint64_t start = clock_ms(); command == 'e' && clock_ms() - start < 10000;) {
        kvx_agent_stats(agent, &report->stats, sizeof(report->stats));
        if (report->stats.dones_early >= amount)
            break;
        kvx_agent_progress(agent, 10);
    }
    for (int i = 0; i < 3; i++) /* timers fire, answers go, releases run */
        kvx_agent_progress(agent, 0);
    kvx_agent_stats(agent, &report->stats, sizeof(report->stats));
    return write(ready, report, sizeof(*report)) == sizeof(*report);
}

/* The prefill's storage is the caller's (aligned_alloc), as an engine's cache is, rather than
 * kvx's: on one host its kvx then serves reads as messages instead of the reader copying from
 * a mapping. Set before the prefill process is forked. */
static bool prefill_malloced;

/* The prefill process: its storage holds the pattern; serves and runs commands until 'q'. */
static int run_prefill(int ready, int go)
{
    static void *bases[1];
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                                               KVX_AGENT_PARAM_FIELD_LEASE_MS |
                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .listen     = "127.0.0.1:0",
                                 .lease_ms   = LEASE_MS,
                                 .timeout_ms = TIMEOUT_MS};
    struct report report      = {0};
    kvx_agent_t *agent;
    uint64_t size;
    uint64_t *words;

    alarm(120);
    if (prefill_malloced) {
        bases[0] = aligned_alloc(PAGE, 16 * PAGE);
        if (bases[0] == NULL)
            return 10;
        params.field_mask |= KVX_AGENT_PARAM_FIELD_STORAGE_BASES;
        params.storage_bases = bases;
    }
    if (agent_from_quoted(mla_layout, &params, &agent) != KVX_OK)
        return 10;
    words = kvx_agent_storage(agent, 0, &size);
    for (uint64_t i = 0; i < size / 8; i++)
        words[i] = pattern_word(i);
    kvx_agent_set_release_callback(agent, on_release, &report);
    report_serving(ready, agent);
    for (;;) {
        struct pollfd item = {.fd = go, .events = POLLIN};

        kvx_agent_progress(agent, 10);
        if (poll(&item, 1, 0) > 0 && !prefill_command(agent, go, ready, &report))
            break;
    }
    kvx_agent_destroy(agent);
    return 0;
}

/* The liar (issue 36 finding 9): a man in the middle of the side channel that holds the
 * deployment's secret, as any insider does. It relays every request of the decode agent to
 * the prefill's side channel and every reply back, framed as sidechan.h says, over one
 * connection to the prefill per connection of the decode agent's (a hold binds a rank to its
 * connection), but answers every done DONE_ANSWER_RESEND. The prefill's metadata names its
 * UCX worker, not its side channel: the decode agent sends every side-channel request to the
 * address it connected to, the liar's (peer.c link_open), while its reads go to the prefill. */
#define LIAR_MAX_LINKS 8  /* the decode agent's connections: its metadata fetch, its kept one */
#define LIAR_MAX_DONES 16 /* done ids a link remembers: one done is in flight at a time */

struct liar_link {
    uint8_t identity[SIDECHAN_MAX_IDENTITY]; /* the connection's routing id at the liar */
    size_t identity_size;                    /* bytes */
    void *dealer;                            /* the liar's connection to the prefill */
    uint64_t dones[LIAR_MAX_DONES];          /* ids of the last dones relayed (never 0) */
    size_t num_dones;                        /* relayed in all: the next at % LIAR_MAX_DONES */
};

struct liar {
    void *zmq;
    struct auth_keys keys; /* the deployment's, from test_auth_key */
    void *router;          /* where the decode agent connects: a CURVE server */
    struct liar_link links[LIAR_MAX_LINKS];
    size_t num_links;
    uint64_t forged; /* answers to dones replaced */
};

static char liar_target[ADDRESS_SIZE]; /* the prefill's side channel; set before the fork */
/* An honest relay instead (issue 36 finding 6): forges no answer; 'd' closes its connections
 * to the prefill, as a connection that drops does, and the next request opens new ones. Set
 * before the fork. */
static bool liar_honest;

/* The link of the connection whose routing id is `identity`: found, or opened the first time
 * (a CURVE client with the deployment's keys, as the decode agent is); NULL when full. */
static struct liar_link *liar_link_find(struct liar *liar, zmq_msg_t *identity)
{
    size_t size = zmq_msg_size(identity);
    char endpoint[ADDRESS_SIZE + 8];
    int linger = 0;
    struct liar_link *link;

    for (size_t i = 0; i < liar->num_links; i++) {
        link = &liar->links[i];
        if (link->identity_size == size &&
            memcmp(link->identity, zmq_msg_data(identity), size) == 0)
            return link;
    }
    if (liar->num_links == LIAR_MAX_LINKS || size > SIDECHAN_MAX_IDENTITY)
        return NULL;
    link = &liar->links[liar->num_links];
    snprintf(endpoint, sizeof(endpoint), "tcp://%s", liar_target);
    link->dealer = zmq_socket(liar->zmq, ZMQ_DEALER);
    if (link->dealer == NULL ||
        zmq_setsockopt(link->dealer, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        auth_client_socket(link->dealer, &liar->keys) != KVX_OK ||
        zmq_connect(link->dealer, endpoint) != 0) {
        if (link->dealer != NULL)
            zmq_close(link->dealer);
        return NULL;
    }
    link->identity_size = size;
    memcpy(link->identity, zmq_msg_data(identity), size);
    liar->num_links++;
    return link;
}

/* Relays one request, [identity][delimiter][verb][id][body], to the prefill without its
 * identity, remembering a done's id; drops one of another shape. */
static void liar_relay_request(struct liar *liar)
{
    zmq_msg_t frames[5];
    int count              = zsocket_receive(liar->router, frames, 5);
    struct liar_link *link = NULL;

    if (count >= 4 && count <= 5 && zmq_msg_size(&frames[3]) == 8)
        link = liar_link_find(liar, &frames[0]);
    if (link != NULL && zmq_msg_size(&frames[2]) == strlen(VERB_DONE) &&
        memcmp(zmq_msg_data(&frames[2]), VERB_DONE, strlen(VERB_DONE)) == 0)
        memcpy(&link->dones[link->num_dones++ % LIAR_MAX_DONES], zmq_msg_data(&frames[3]), 8);
    for (int i = 1; link != NULL && i < count; i++)
        zmq_send(link->dealer, zmq_msg_data(&frames[i]), zmq_msg_size(&frames[i]),
                 ZMQ_DONTWAIT | (i + 1 < count ? ZMQ_SNDMORE : 0));
    zsocket_frames_close(frames, count, 5);
}

/* Relays one reply of the prefill's, [delimiter][id][body], back to link's connection; the
 * body of one whose id is a done's becomes DONE_ANSWER_RESEND, unless the liar is honest. */
static void liar_relay_reply(struct liar *liar, struct liar_link *link)
{
    zmq_msg_t frames[3];
    int count    = zsocket_receive(link->dealer, frames, 3);
    bool is_done = false;
    const void *body;
    size_t size;
    uint64_t id;

    if (count == 3 && zmq_msg_size(&frames[1]) == 8) {
        memcpy(&id, zmq_msg_data(&frames[1]), 8);
        for (size_t i = 0; i < LIAR_MAX_DONES; i++)
            is_done = is_done || (id != 0 && link->dones[i] == id);
        is_done = is_done && !liar_honest;
        body    = is_done ? DONE_ANSWER_RESEND : zmq_msg_data(&frames[2]);
        size    = is_done ? strlen(DONE_ANSWER_RESEND) : zmq_msg_size(&frames[2]);
        liar->forged += is_done;
        zmq_send(liar->router, link->identity, link->identity_size, ZMQ_DONTWAIT | ZMQ_SNDMORE);
        zmq_send(liar->router, "", 0, ZMQ_DONTWAIT | ZMQ_SNDMORE);
        zmq_send(liar->router, &id, 8, ZMQ_DONTWAIT | ZMQ_SNDMORE);
        zmq_send(liar->router, body, size, ZMQ_DONTWAIT);
    }
    zsocket_frames_close(frames, count, 3);
}

/* Closes every connection to the prefill: a link is opened again by its next request. */
static void liar_links_drop(struct liar *liar)
{
    for (size_t i = 0; i < liar->num_links; i++)
        zmq_close(liar->links[i].dealer);
    memset(liar->links, 0, sizeof(liar->links));
    liar->num_links = 0;
}

/* The liar's process: listens on loopback, reports where (as a prefill does), and relays
 * until 'q' on `go`; 's' writes how many answers it forged on `ready`, and 'd' drops its
 * connections to the prefill first (liar_links_drop). */
static int run_liar(int ready, int go)
{
    struct liar liar           = {0};
    char address[ADDRESS_SIZE] = {0};
    size_t size                = sizeof(address);
    int linger                 = 0;
    char command;

    alarm(120);
    liar.zmq    = zmq_ctx_new();
    liar.router = liar.zmq != NULL ? zmq_socket(liar.zmq, ZMQ_ROUTER) : NULL;
    if (liar.router == NULL || auth_keys_derive(test_auth_key, &liar.keys) != KVX_OK ||
        zmq_setsockopt(liar.router, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        auth_server_socket(liar.router, &liar.keys) != KVX_OK ||
        zmq_bind(liar.router, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(liar.router, ZMQ_LAST_ENDPOINT, address, &size) != 0)
        return 10;
    memmove(address, address + strlen("tcp://"), sizeof(address) - strlen("tcp://"));
    if (write(ready, address, sizeof(address)) != sizeof(address))
        return 11;
    for (;;) {
        zmq_pollitem_t items[2 + LIAR_MAX_LINKS] = {{.fd = go, .events = ZMQ_POLLIN},
                                                    {.socket = liar.router, .events = ZMQ_POLLIN}};
        size_t num_links = liar.num_links; /* a request may open one: polled next time */

        for (size_t i = 0; i < num_links; i++)
            items[2 + i] = (zmq_pollitem_t){.socket = liar.links[i].dealer, .events = ZMQ_POLLIN};
        if (zmq_poll(items, (int)(2 + num_links), 1000) < 0)
            break;
        if (items[0].revents != 0) {
            if (read(go, &command, 1) != 1 || (command != 's' && command != 'd'))
                break;
            if (command == 'd') {
                liar_links_drop(&liar);
                num_links = 0; /* their poll items are closed sockets now */
            }
            if (write(ready, &liar.forged, 8) != 8)
                break;
        }
        if (items[1].revents != 0)
            liar_relay_request(&liar);
        for (size_t i = 0; i < num_links; i++) {
            if (items[2 + i].revents != 0)
                liar_relay_reply(&liar, &liar.links[i]);
        }
    }
    for (size_t i = 0; i < liar.num_links; i++)
        zmq_close(liar.links[i].dealer);
    zmq_close(liar.router);
    zmq_ctx_term(liar.zmq);
    return 0;
}

/* One test's processes: the prefill child, and this process's decode agent and peer; the
 * liar child too, for a session through it (session_setup_liar). */
struct session {
    pid_t pid;
    int ready;
    int go;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    char prefill_address[ADDRESS_SIZE]; /* its side channel, even behind the liar */
    pid_t liar_pid;                     /* 0: none */
    int liar_ready;
    int liar_go;
};

/* The decode agent talks to the prefill through the liar, with LIAR_TIMEOUT_MS. Set before
 * the processes are forked. */
static bool through_liar;

/* Forks the liar in front of the prefill at `address`, which then names the liar. */
static void liar_start(struct session *s, char address[ADDRESS_SIZE])
{
    int go[2];

    assert_int_equal(pipe(go), 0);
    memcpy(liar_target, address, ADDRESS_SIZE);
    s->liar_pid = start_prefill(run_liar, go[0], address, &s->liar_ready);
    close(go[0]);
    s->liar_go = go[1];
}

/* How many answers to dones the liar forged so far. */
static uint64_t liar_forged(const struct session *s)
{
    uint64_t forged = 0;

    assert_int_equal(write(s->liar_go, "s", 1), 1);
    assert_int_equal(read(s->liar_ready, &forged, sizeof(forged)), sizeof(forged));
    return forged;
}

/* The decode agent's transports: NULL for the default (one host: reads are copies from the
 * prefill's storage mapped here), or "tcp" (reads served by the prefill's kvx). */
static int session_open(void **state, const char *transports)
{
    struct session *s         = calloc(1, sizeof(*s));
    kvx_agent_params_t params = {.field_mask =
                                     KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                                     (transports != NULL ? KVX_AGENT_PARAM_FIELD_TRANSPORTS : 0),
                                 .timeout_ms = through_liar ? LIAR_TIMEOUT_MS : TIMEOUT_MS,
                                 .transports = transports};
    char listen[ADDRESS_SIZE];
    int go[2];

    assert_non_null(s);
    assert_int_equal(pipe(go), 0);
    s->pid = start_prefill(run_prefill, go[0], listen, &s->ready); /* before our agent */
    close(go[0]);
    s->go = go[1];
    memcpy(s->prefill_address, listen, ADDRESS_SIZE);
    if (through_liar)
        liar_start(s, listen); /* before our agent too; `listen` names the liar now */
    assert_int_equal(agent_from_quoted(mla_layout, &params, &s->agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(s->agent, listen, &s->peer), KVX_OK);
    *state = s;
    return 0;
}

static int session_setup(void **state)
{
    return session_open(state, NULL);
}

static int session_setup_tcp(void **state)
{
    return session_open(state, "tcp");
}

/* The prefill's storage malloc'ed (prefill_malloced), default transports. */
static int session_setup_malloced(void **state)
{
    int result;

    prefill_malloced = true;
    result           = session_open(state, NULL);
    prefill_malloced = false;
    return result;
}

/* Pushes to the prefill's writers, as across hosts: on one host they go as reads unless
 * KVX_PUSH_ON_ONE_HOST=writers, which the agent reads when it is made. A small push's writer
 * answers with the bytes; with KVX_PUSH_BYTES=puts too, it puts them. */
static int session_open_env(void **state, const char *name, const char *value)
{
    int result;

    setenv("KVX_PUSH_ON_ONE_HOST", "writers", 1);
    if (name != NULL)
        setenv(name, value, 1);
    result = session_open(state, NULL);
    unsetenv("KVX_PUSH_ON_ONE_HOST");
    if (name != NULL)
        unsetenv(name);
    return result;
}

static int session_setup_writers(void **state)
{
    return session_open_env(state, NULL, NULL);
}

static int session_setup_puts(void **state)
{
    return session_open_env(state, "KVX_PUSH_BYTES", "puts");
}

/* Through the liar, every done on the side channel (KVX_DONES, which the agent reads when it
 * is made), so that the liar answers each one. */
static int session_setup_liar(void **state)
{
    int result;

    through_liar = true;
    setenv("KVX_DONES", "side-channel", 1);
    result = session_open(state, NULL);
    unsetenv("KVX_DONES");
    through_liar = false;
    return result;
}

static int session_teardown(void **state)
{
    struct session *s = *state;
    int status;

    kvx_peer_destroy(s->peer);
    for (int i = 0; i < 3; i++)
        kvx_agent_progress(s->agent, 0);
    if (kvx_agent_destroy(s->agent) != KVX_OK) { /* the next fork would inherit UCX */
        fprintf(stderr, "teardown: %s; stopping here\n", kvx_errmsg());
        fflush(stdout);
        kill(s->pid, SIGKILL);
        _exit(1);
    }
    (void)!write(s->go, "q", 1);
    waitpid(s->pid, &status, 0);
    close(s->go);
    close(s->ready);
    if (s->liar_pid != 0) {
        (void)!write(s->liar_go, "q", 1);
        waitpid(s->liar_pid, &status, 0);
        close(s->liar_go);
        close(s->liar_ready);
    }
    free(s);
    return 0;
}

/* Sends a command and returns the prefill process's report, progressing our agent while it
 * runs (a done is sent by our progress once the gets completed). */
static struct report command(struct session *s, char c, const void *arg, size_t size)
{
    struct pollfd item = {.fd = s->ready, .events = POLLIN};
    struct report report;

    assert_int_equal(write(s->go, &c, 1), 1);
    if (size > 0)
        assert_int_equal(write(s->go, arg, size), (ssize_t)size);
    while (poll(&item, 1, 0) == 0)
        kvx_agent_progress(s->agent, 5);
    assert_int_equal(read(s->ready, &report, sizeof(report)), sizeof(report));
    return report;
}

static struct report hold(struct session *s, uint64_t request_id, uint64_t block,
                          const kvx_token_t *token)
{
    struct hold_command h = {request_id, block, 1, *token};

    return command(s, 'H', &h, sizeof(h));
}

static struct report advance(struct session *s, uint32_t ms)
{
    return command(s, 'a', &ms, sizeof(ms));
}

/* Serves until `count` dones came early in all. */
static struct report early_wait(struct session *s, uint32_t count)
{
    return command(s, 'e', &count, sizeof(count));
}

static kvx_token_t token_new(void)
{
    kvx_token_t token;

    assert_int_equal(kvx_token_generate(&token), KVX_OK);
    return token;
}

/* A pull or a push of request `request_id`, block `block` on both sides, presenting `token`
 * (NULL: none); returns the status, its message in kvx_errmsg(). */
static kvx_status_t transfer(struct session *s, bool push, uint64_t request_id, uint64_t block,
                             const kvx_token_t *token)
{
    kvx_group_ids_t group = {&block, 1};
    kvx_request_t request = {&group, 1, NULL, 0, token};

    return (push ? kvx_write : kvx_read)(s->agent, &s->peer, 1, request_id, &request, NULL);
}

static kvx_xfer_t *read_post(struct session *s, uint64_t request_id, uint64_t *block,
                             const kvx_token_t *token, struct callback_log *log)
{
    kvx_group_ids_t group = {block, 1};
    kvx_request_t request = {&group, 1, NULL, 0, token};
    kvx_xfer_t *xfer      = NULL;

    assert_int_equal(
        kvx_read_post(s->agent, &s->peer, 1, request_id, &request, on_xfer, log, &xfer), KVX_OK);
    return xfer;
}

static kvx_agent_stats_t decode_stats(const struct session *s)
{
    kvx_agent_stats_t stats;

    kvx_agent_stats(s->agent, &stats, sizeof(stats));
    return stats;
}

/* A read with a wrong token (or none) is refused, fails whole, and leaves the hold as it was
 * until its lease; a read after the lease expired is refused as stale, and alters nothing. */
static void a_wrong_token_is_refused_and_the_hold_stays_until_its_lease(void **state)
{
    struct session *s = *state;
    kvx_token_t token = token_new();
    kvx_token_t wrong = token;
    uint64_t block    = 3;
    const kvx_group_ids_t *failed;
    size_t num_failed;
    kvx_group_ids_t group = {&block, 1};
    kvx_request_t request = {&group, 1, NULL, 0, &wrong};
    struct report r;
    kvx_xfer_t *xfer;

    wrong.bytes[7] ^= 1;
    hold(s, 1, block, &token);
    assert_int_equal(kvx_read_post(s->agent, &s->peer, 1, 1, &request, NULL, NULL, &xfer), KVX_OK);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_REFUSED);
    assert_string_equal(kvx_xfer_error(xfer),
                        "read 1: remote rank 0: wrong token: the request is held with another");
    kvx_xfer_failed_blocks(xfer, &failed, &num_failed);
    assert_int_equal(num_failed, 1);
    assert_int_equal(failed[0].count, 1);
    assert_int_equal(failed[0].ids[0], block);
    kvx_xfer_destroy(xfer);
    assert_int_equal(transfer(s, false, 1, block, NULL), KVX_ERR_PEER_REFUSED); /* no token */
    assert_non_null(strstr(kvx_errmsg(), "remote rank 0: wrong token"));
    assert_int_equal(decode_stats(s).dones_refused, 2);
    assert_null(kvx_peer_down_reason(s->peer)); /* a refusal is no transport failure */
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.tokens_refused, 2);
    assert_int_equal(r.stats.held, 1);
    assert_int_equal(r.releases, 0);

    r = advance(s, LEASE_MS);
    assert_int_equal(r.stats.leases_expired, 1);
    assert_int_equal(r.releases, 1);
    assert_int_equal(transfer(s, false, 1, block, &token), KVX_ERR_PEER_REFUSED);
    assert_string_equal(kvx_errmsg(), "read 1: remote rank 0: hold's lease expired: the blocks "
                                      "may have been reused");
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.releases, 1);
    assert_int_equal(r.stats.released, 0);
    assert_int_equal(r.stats.done_unknown, 1);
    assert_int_equal(decode_stats(s).dones_refused, 3);
}

/* The same reference read twice: the first read releases the hold (one release callback),
 * the second is refused, its blocks may belong to another prompt by now. */
static void the_same_reference_read_twice_is_refused_the_second_time(void **state)
{
    struct session *s = *state;
    kvx_token_t token = token_new();
    struct report r;

    hold(s, 2, 5, &token);
    block_clear(s->agent, 5);
    assert_int_equal(transfer(s, false, 2, 5, &token), KVX_OK);
    assert_true(block_matches(s->agent, 5));
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.released, 1);
    assert_int_equal(r.releases, 1);
    assert_int_equal(r.last_release, 2);
    assert_int_equal(transfer(s, false, 2, 5, &token), KVX_ERR_PEER_REFUSED);
    assert_string_equal(kvx_errmsg(), "read 2: remote rank 0: hold released already: the blocks "
                                      "may have been reused");
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.releases, 1);
    assert_int_equal(r.stats.released, 1);
    assert_int_equal(decode_stats(s).transfers, 1);
    assert_int_equal(decode_stats(s).transfers_failed, 1);
}

/* A done that comes before its hold (a fast decode side in an engine) waits on the prefill
 * side; the read completes once the hold is made, which the done then releases. One whose
 * hold comes with another token is refused then. */
static void a_done_before_its_hold_waits_for_it(void **state)
{
    struct session *s       = *state;
    kvx_token_t token       = token_new();
    kvx_token_t other       = token_new();
    uint64_t block          = 6;
    struct callback_log log = {0};
    kvx_xfer_t *xfer;
    struct report r;

    block_clear(s->agent, block);
    xfer = read_post(s, 3, &block, &token, &log);
    r    = early_wait(s, 1);
    assert_int_equal(r.stats.dones_early, 1);
    assert_int_equal(r.stats.held, 0);
    kvx_agent_progress(s->agent, 20);
    assert_int_equal(kvx_xfer_status(xfer), KVX_INPROGRESS); /* the bytes came, the answer not */
    r = hold(s, 3, block, &token);
    assert_int_equal(r.stats.released, 1); /* applied at the hold: its only consumer */
    assert_int_equal(r.releases, 1);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_OK);
    assert_int_equal(log.calls, 1);
    assert_true(block_matches(s->agent, block));
    kvx_xfer_destroy(xfer);

    xfer = read_post(s, 4, &block, &token, &log);
    early_wait(s, 2);
    r = hold(s, 4, block, &other);
    assert_int_equal(r.stats.tokens_refused, 1);
    assert_int_equal(r.stats.held, 1);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_REFUSED);
    assert_non_null(strstr(kvx_xfer_error(xfer), "read 4: remote rank 0: wrong token"));
    kvx_xfer_destroy(xfer);
}

/* A parked done whose hold does not come within the prefill side's timeout is answered "no
 * such request"; one whose answer does not come within the decode side's deadline fails
 * there, the peer still up. Both deadlines are moved to by the clocks. */
static void parked_dones_end_at_their_deadlines(void **state)
{
    struct session *s       = *state;
    kvx_token_t token       = token_new();
    uint64_t block          = 8;
    struct callback_log log = {0};
    kvx_xfer_t *xfer;
    struct report r;

    xfer = read_post(s, 5, &block, &token, &log);
    early_wait(s, 1);
    r = advance(s, TIMEOUT_MS);
    assert_int_equal(r.stats.done_unknown, 1);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_REFUSED);
    assert_string_equal(kvx_xfer_error(xfer), "read 5: remote rank 0: no such request: not held "
                                              "within 600000 ms");
    kvx_xfer_destroy(xfer);

    xfer = read_post(s, 6, &block, &token, &log);
    early_wait(s, 2);
    clock_advance_ms(TIMEOUT_MS); /* ours: the transfer's deadline */
    assert_int_equal(kvx_xfer_wait(xfer), KVX_ERR_PEER_TIMEOUT);
    assert_non_null(strstr(kvx_xfer_error(xfer), "read 6: 1 of 1 prefill ranks did not answer"));
    assert_null(kvx_peer_down_reason(s->peer));
    kvx_xfer_destroy(xfer);
    assert_int_equal(log.calls, 2);
    block_clear(s->agent, 9);
    assert_int_equal(transfer(s, false, 10, 9, NULL), KVX_OK); /* serves on: nothing held */
    assert_true(block_matches(s->agent, 9));
}

static uint64_t dones_by_message(const struct report *r)
{
    return r->stats.dones_by_message;
}

static uint64_t dones_with_reads(const struct report *r)
{
    return r->stats.dones_with_reads;
}

/* Requests `id` to `id + 2` once the connection has a done handle (the first done, of a
 * request not held, asks for it): a held request read, counted and released, and `judged`
 * (the prefill's count of dones that went the new way) grows by one; read twice, refused, and
 * it grows again; read before its hold, sent back `resends` times, parked on the side channel,
 * and released at the hold, `judged` unchanged. Every byte compared. */
static void dones_judged_the_new_way(struct session *s, uint64_t id,
                                     uint64_t (*judged)(const struct report *), uint64_t resends)
{
    kvx_token_t token       = token_new();
    uint64_t block          = 12;
    struct callback_log log = {0};
    char refused[128];
    kvx_xfer_t *xfer;
    struct report r;

    assert_int_equal(transfer(s, false, id - 1, 10, NULL), KVX_OK); /* nothing held: asks */
    r = command(s, 's', NULL, 0);
    assert_int_equal(judged(&r), 0);
    hold(s, id, 11, &token);
    block_clear(s->agent, 11);
    assert_int_equal(transfer(s, false, id, 11, &token), KVX_OK);
    assert_true(block_matches(s->agent, 11));
    r = command(s, 's', NULL, 0);
    assert_int_equal(judged(&r), 1);
    assert_int_equal(r.stats.released, 1);
    assert_int_equal(r.last_release, id);
    assert_int_equal(transfer(s, false, id, 11, &token), KVX_ERR_PEER_REFUSED);
    snprintf(refused, sizeof(refused),
             "read %" PRIu64 ": remote rank 0: hold released already: the blocks may have been "
             "reused",
             id);
    assert_string_equal(kvx_errmsg(), refused);
    r = command(s, 's', NULL, 0);
    assert_int_equal(judged(&r), 2);

    block_clear(s->agent, block);
    xfer = read_post(s, id + 1, &block, &token, &log);
    r    = early_wait(s, 1);
    assert_int_equal(r.stats.dones_early, 1);
    assert_int_equal(judged(&r), 2); /* sent back, not judged */
    assert_int_equal(decode_stats(s).dones_resent, resends);
    r = hold(s, id + 1, block, &token);
    assert_int_equal(r.stats.released, 2);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_OK);
    assert_true(block_matches(s->agent, block));
    kvx_xfer_destroy(xfer);
}

/* Once the connection has a done handle (its first done asks for one, and goes on the side
 * channel), dones travel as messages on the data plane and mean what they meant there. One
 * that comes before its hold is sent back once, to the side channel, where it waits. */
static void dones_travel_as_messages_once_the_connection_has_a_handle(void **state)
{
    dones_judged_the_new_way(*state, 21, dones_by_message, 1);
}

/* Reads the prefill serves (over tcp) take their done along once the connection has a handle:
 * one message, judged once the read's answer left the prefill's memory, and answered as the
 * side channel would. One before its hold comes back twice (as a message once the data is
 * here, then on the side channel, where it waits). Four blocks (one 16 KiB pair) complete
 * too, whether UCX sent their answer at once or by rendezvous (then the done is sent back and
 * comes again once the data is here). Every byte compared. */
static void a_small_served_read_takes_its_done_along(void **state)
{
    struct session *s     = *state;
    kvx_token_t token     = token_new();
    uint64_t four[4]      = {0, 1, 2, 3};
    kvx_group_ids_t group = {four, 4};
    kvx_request_t request = {&group, 1, NULL, 0, &token};
    struct report r;

    dones_judged_the_new_way(s, 31, dones_with_reads, 2);
    for (int i = 0; i < 4; i++)
        block_clear(s->agent, four[i]);
    r = command(s, 'H', &(struct hold_command){33, 0, 1, token}, sizeof(struct hold_command));
    assert_int_equal(r.stats.held, 1);
    assert_int_equal(kvx_read(s->agent, &s->peer, 1, 33, &request, NULL), KVX_OK);
    for (int i = 0; i < 4; i++)
        assert_true(block_matches(s->agent, four[i]));
    assert_int_equal(command(s, 's', NULL, 0).stats.released, 3);
}

/* A served read whose answer goes by rendezvous (eight blocks, 32 KiB in one pair, from the
 * prefill's malloc'ed storage over shared memory) takes its done along too: the prefill judges
 * it when the rendezvous completed, so it is counted with its read and never sent back. */
static void a_rendezvous_read_has_its_done_judged_when_it_completes(void **state)
{
    struct session *s     = *state;
    kvx_token_t token     = token_new();
    uint64_t ids[8]       = {0, 1, 2, 3, 4, 5, 6, 7};
    kvx_group_ids_t group = {ids, 8};
    kvx_request_t request = {&group, 1, NULL, 0, &token};
    kvx_read_stats_t stats;
    struct report r;

    /* the connection's first done goes on the side channel, and gets it a done handle */
    assert_int_equal(transfer(s, false, 20, 15, NULL), KVX_OK);
    hold(s, 21, 0, &token);
    for (uint64_t i = 0; i < 8; i++)
        block_clear(s->agent, i);
    assert_int_equal(kvx_read(s->agent, &s->peer, 1, 21, &request, &stats), KVX_OK);
    assert_int_equal(stats.posted, 1); /* one pair: one read, one answer */
    for (uint64_t i = 0; i < 8; i++)
        assert_true(block_matches(s->agent, i));
    assert_int_equal(decode_stats(s).dones_resent, 0);
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.dones_with_reads, 1);
    assert_int_equal(r.stats.released, 1);
    assert_int_equal(r.releases, 1);
}

/* A push with the request's token is its rank's done: the hold is released (one callback)
 * after the writes; a second push of the same reference is refused. The writer answers with
 * the bytes (`with_bytes`), or puts them. */
static void push_releases_the_hold(struct session *s, bool with_bytes)
{
    kvx_token_t token = token_new();
    struct report r;

    hold(s, 7, 10, &token);
    block_clear(s->agent, 10);
    assert_int_equal(transfer(s, true, 7, 10, &token), KVX_OK);
    assert_true(block_matches(s->agent, 10));
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.pushes_with_bytes, with_bytes ? 1 : 0);
    assert_int_equal(r.stats.released, 1);
    assert_int_equal(r.stats.held, 0);
    assert_int_equal(r.releases, 1);
    assert_int_equal(r.last_release, 7);
    block_clear(s->agent, 10);
    assert_int_equal(transfer(s, true, 7, 10, &token), KVX_ERR_PEER_REFUSED);
    assert_non_null(strstr(kvx_errmsg(), "hold released already"));
    assert_true(block_is_zero(s->agent, 10)); /* refused before any put */
    assert_int_equal(command(s, 's', NULL, 0).releases, 1);
}

static void a_push_with_its_token_releases_the_hold(void **state)
{
    push_releases_the_hold(*state, true);
}

static void a_push_put_with_its_token_releases_the_hold(void **state)
{
    push_releases_the_hold(*state, false);
}

/* A push with a wrong token is refused before anything is written; the hold stays. A push
 * without a token involves no hold. */
static void a_push_with_a_wrong_token_writes_nothing(void **state)
{
    struct session *s = *state;
    kvx_token_t token = token_new();
    kvx_token_t wrong = token_new();
    struct report r;

    hold(s, 8, 11, &token);
    block_clear(s->agent, 11);
    assert_int_equal(transfer(s, true, 8, 11, &wrong), KVX_ERR_PEER_REFUSED);
    assert_non_null(strstr(kvx_errmsg(), "by remote rank 0: push 8: wrong token"));
    assert_true(block_is_zero(s->agent, 11));
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.tokens_refused, 1);
    assert_int_equal(r.stats.held, 1);
    assert_int_equal(r.releases, 0);
    assert_int_equal(transfer(s, true, 8, 11, NULL), KVX_OK); /* no token: no hold involved */
    assert_true(block_matches(s->agent, 11));
    assert_int_equal(command(s, 's', NULL, 0).stats.held, 1);
}

/* A push with a token for a request not held yet waits for its hold, then writes and
 * releases it. */
static void a_push_before_its_hold_waits_for_it(void **state)
{
    struct session *s       = *state;
    kvx_token_t token       = token_new();
    uint64_t block          = 12;
    kvx_group_ids_t group   = {&block, 1};
    kvx_request_t request   = {&group, 1, NULL, 0, &token};
    struct callback_log log = {0};
    kvx_xfer_t *xfer;
    struct report r;

    block_clear(s->agent, block);
    assert_int_equal(kvx_write_post(s->agent, &s->peer, 1, 9, &request, on_xfer, &log, &xfer),
                     KVX_OK);
    r = early_wait(s, 1);
    assert_int_equal(r.stats.dones_early, 1);
    assert_int_equal(r.stats.pushes_serving, 1);
    assert_true(block_is_zero(s->agent, block)); /* nothing written before the hold */
    r = hold(s, 9, block, &token);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_OK);
    assert_true(block_matches(s->agent, block));
    kvx_xfer_destroy(xfer);
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.released, 1);
    assert_int_equal(r.releases, 1);
}

/* Holds block `id` as request `id`, pushes it with the token (*token_p gets it), and checks
 * the bytes, the decode side's pushes_as_reads and that the hold was released; returns the
 * prefill side's report. */
static struct report held_block_pushed(struct session *s, uint64_t id, uint64_t as_reads,
                                       kvx_token_t *token_p)
{
    struct report r;

    *token_p = token_new();
    hold(s, id, id, token_p);
    block_clear(s->agent, id);
    assert_int_equal(transfer(s, true, id, id, token_p), KVX_OK);
    assert_true(block_matches(s->agent, id));
    assert_int_equal(decode_stats(s).pushes_as_reads, as_reads);
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.released, 1);
    assert_int_equal(r.releases, 1);
    assert_int_equal(r.last_release, id);
    return r;
}

/* On one host a push goes as a read of the prefill's blocks, with a read's done: counted,
 * it releases the hold; refused (a repeat), it fails the push, after the bytes were read as a
 * read's refusal does. Nothing goes to a writer. */
static void a_push_on_one_host_goes_as_a_read(void **state)
{
    struct session *s = *state;
    kvx_token_t token;
    struct report r = held_block_pushed(s, 13, 1, &token);

    assert_int_equal(r.stats.pushes_by_message + r.stats.pushes_serving, 0);
    assert_int_equal(transfer(s, true, 13, 13, &token), KVX_ERR_PEER_REFUSED);
    assert_non_null(strstr(kvx_errmsg(), "write 13"));
    assert_non_null(strstr(kvx_errmsg(), "released already"));
    assert_int_equal(decode_stats(s).pushes_as_reads, 2);
    assert_int_equal(command(s, 's', NULL, 0).releases, 1);
}

/* Over TCP alone (as across hosts) a push goes to the prefill's writer, which answers a
 * 4 KiB share with its bytes, no puts. */
static void a_push_over_tcp_goes_to_the_writer(void **state)
{
    kvx_token_t token;

    assert_int_equal(held_block_pushed(*state, 14, 0, &token).stats.pushes_with_bytes, 1);
}

/* Issue 36 finding 9: a prefill (here the liar, an insider between us and the real one)
 * that answers every done "resend" made the decode side send it again until its deadline,
 * 43,980 times in 5 s. A done resent on the side channel is answered there, so a second
 * "resend" is a malformed answer: the read fails at once, its done resent once. */
static void a_second_resend_of_a_done_is_a_malformed_answer(void **state)
{
    struct session *s     = *state;
    kvx_token_t token     = token_new();
    uint64_t block        = 4;
    kvx_group_ids_t group = {&block, 1};
    kvx_request_t request = {&group, 1, NULL, 0, &token};
    char error[256]       = "";
    uint64_t start;
    uint64_t elapsed; /* ms */
    kvx_status_t status;
    kvx_xfer_t *xfer;

    hold(s, 40, block, &token);
    start = clock_ms();
    assert_int_equal(kvx_read_post(s->agent, &s->peer, 1, 40, &request, NULL, NULL, &xfer), KVX_OK);
    status  = kvx_xfer_wait(xfer);
    elapsed = clock_ms() - start;
    if (kvx_xfer_error(xfer) != NULL)
        snprintf(error, sizeof(error), "%s", kvx_xfer_error(xfer));
    kvx_xfer_destroy(xfer); /* before any assert, so a failure still tears down cleanly */
    assert_int_equal(status, KVX_ERR_IO);
    assert_non_null(strstr(error, "read 40: remote rank 0: a malformed answer to its done"));
    assert_true(elapsed < LIAR_TIMEOUT_MS / 2); /* at once (ms), not at its deadline */
    assert_true(decode_stats(s).dones_resent <= 2);
    /* every done we sent was answered "resend" by the liar: all but the last were believed */
    assert_int_equal(liar_forged(s), decode_stats(s).dones_resent + 1);
}

/* An insider's raw connection to the prefill's side channel at `address`: a DEALER with the
 * deployment's keys, which any insider has (test_security.c's flood() makes them too). The
 * timeouts only keep a broken run from hanging: every wait below ends on what the prefill
 * answered or counted. */
static void *insider_open(void *zmq, const char *address)
{
    static struct auth_keys keys; /* derived once: a churn opens a thousand */
    static bool derived;
    char endpoint[ADDRESS_SIZE + 8];
    void *socket = zmq_socket(zmq, ZMQ_DEALER);
    int linger   = 0;
    int timeout  = 60000; /* ms */

    assert_non_null(socket);
    if (!derived)
        assert_int_equal(auth_keys_derive(test_auth_key, &keys), KVX_OK);
    derived = true;
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(socket, ZMQ_SNDTIMEO, &timeout, sizeof(timeout));
    zmq_setsockopt(socket, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    assert_int_equal(auth_client_socket(socket, &keys), KVX_OK);
    snprintf(endpoint, sizeof(endpoint), "tcp://%s", address);
    assert_int_equal(zmq_connect(socket, endpoint), 0);
    return socket;
}

/* Sends request `id` with `verb` and `size` bytes of `body`, framed as sidechan.h says (every
 * verb we send has a body frame, VERB_DONE_HANDLE's empty). */
static void insider_send(void *socket, const char *verb, uint64_t id, const void *body, size_t size)
{
    assert_int_equal(zmq_send(socket, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(socket, verb, strlen(verb), ZMQ_SNDMORE), (int)strlen(verb));
    assert_int_equal(zmq_send(socket, &id, 8, ZMQ_SNDMORE), 8);
    assert_int_equal(zmq_send(socket, body, size, 0), (int)size);
}

/* The next reply, [delimiter][id][body]: its id, and its body NUL-terminated in text. */
static uint64_t insider_receive(void *socket, char text[SIDECHAN_MAX_REPLY + 1])
{
    zmq_msg_t frames[3];
    int count = zsocket_receive(socket, frames, 3);
    uint64_t id;

    if (count == 0) { /* nothing yet: wait for it (RCVTIMEO bounds a broken run) */
        zmq_pollitem_t item = {.socket = socket, .events = ZMQ_POLLIN};

        assert_int_equal(zmq_poll(&item, 1, 60000), 1);
        count = zsocket_receive(socket, frames, 3);
    }
    assert_int_equal(count, 3);
    assert_int_equal(zmq_msg_size(&frames[1]), 8);
    assert_true(zmq_msg_size(&frames[2]) <= SIDECHAN_MAX_REPLY);
    memcpy(&id, zmq_msg_data(&frames[1]), 8);
    memcpy(text, zmq_msg_data(&frames[2]), zmq_msg_size(&frames[2]));
    text[zmq_msg_size(&frames[2])] = '\0';
    zsocket_frames_close(frames, count, 3);
    return id;
}

#define SENTINEL_ID UINT64_MAX /* the request after a flood: its answer says all was read */

/* Floods the prefill with `count` dones on `socket` for random request ids that nobody holds,
 * each with a random token (valid-looking: a done with a token waits for its hold), as our
 * rank 0 reading 4 KiB; then asks for a done handle, answered at once: the prefill reads a
 * connection's requests in order, so that answer comes after every done was taken. */
static void insider_flood_dones(void *socket, struct prng *g, int count)
{
    for (int i = 0; i < count; i++) {
        kvx_token_t token;
        uint64_t words[2] = {prng_next(g) | 1, prng_next(g)};
        struct notify_read note;

        memcpy(token.bytes, words, sizeof(token.bytes));
        note = notify_done_read((uint64_t)1 << 40 | prng_next(g) >> 24, 0, &token, PAGE);
        insider_send(socket, VERB_DONE, (uint64_t)i + 1, &note, sizeof(note));
    }
    insider_send(socket, VERB_DONE_HANDLE, SENTINEL_ID, "", 0);
}

/* Reads a flood's answers up to the sentinel's; returns how many refused a done as one too
 * many early (the parked ones are not answered yet). */
static int insider_flood_refused(void *socket)
{
    char text[SIDECHAN_MAX_REPLY + 1];
    const char *prefix = DONE_ANSWER_REFUSED " too many early dones";
    int refused        = 0;

    while (insider_receive(socket, text) != SENTINEL_ID)
        refused += strncmp(text, prefix, strlen(prefix)) == 0;
    assert_int_equal(strncmp(text, REPLY_DONE_HANDLE " ", strlen(REPLY_DONE_HANDLE) + 1), 0);
    return refused;
}

/* The prefill's report once exactly `connected` authenticated connections are open there:
 * the ones closed here were closed there too. */
static struct report prefill_connected(struct session *s, uint64_t connected)
{
    struct report r;

    do
        r = command(s, 's', NULL, 0);
    while (r.stats.peers_connected != connected);
    return r;
}

/* Our read of request `request_id` (block 6), whose done comes before its hold: it waits
 * (dones_early grows by one), and counts when the hold comes, which it releases. */
static void an_honest_done_waits_for_its_hold(struct session *s, uint64_t request_id)
{
    kvx_token_t token       = token_new();
    uint64_t block          = 6;
    struct callback_log log = {0};
    struct report r         = command(s, 's', NULL, 0);
    uint64_t early          = r.stats.dones_early;
    uint64_t released       = r.stats.released;
    kvx_xfer_t *xfer;

    block_clear(s->agent, block);
    xfer = read_post(s, request_id, &block, &token, &log);
    r    = early_wait(s, (uint32_t)early + 1);
    if (r.stats.dones_early != early + 1) { /* refused: the read ends first, for the teardown */
        kvx_status_t status = kvx_xfer_wait(xfer);
        char error[256];

        snprintf(error, sizeof(error), "%s",
                 kvx_xfer_error(xfer) != NULL ? kvx_xfer_error(xfer) : "");
        kvx_xfer_destroy(xfer);
        fail_msg("our done before its hold was not parked: %s: %s", kvx_status_str(status), error);
    }
    kvx_agent_progress(s->agent, 20);
    assert_int_equal(kvx_xfer_status(xfer), KVX_INPROGRESS);
    r = hold(s, request_id, block, &token);
    assert_int_equal(r.stats.released, released + 1);
    assert_int_equal(r.last_release, request_id);
    assert_int_equal(kvx_xfer_wait(xfer), KVX_OK);
    assert_true(block_matches(s->agent, block));
    kvx_xfer_destroy(xfer);
}

#define FLOOD_CONNECTIONS 8
#define FLOOD_DONES       640 /* a connection's: 5,120 in all, more than the old list held */

/* Issue 36 finding 5: 4,096 dones for random requests over 8 insider connections filled the
 * one bound of the early list, and an honest done before its hold was refused "too many early
 * dones". Each connection has a share now (early.h): a flood parks EARLY_PER_CONN of each of
 * its connections and the rest is refused, while our done still waits for its hold and
 * counts when it comes. */
static void a_flood_of_early_dones_crowds_out_only_its_own_connections(void **state)
{
    struct session *s = *state;
    void *zmq         = zmq_ctx_new();
    void *sockets[FLOOD_CONNECTIONS];
    int refused[FLOOD_CONNECTIONS];
    struct prng g;
    struct report r;

    prng_init(&g, prng_seed_from_env(36005));
    for (int i = 0; i < FLOOD_CONNECTIONS; i++)
        sockets[i] = insider_open(zmq, s->prefill_address);
    for (int i = 0; i < FLOOD_CONNECTIONS; i++)
        insider_flood_dones(sockets[i], &g, FLOOD_DONES);
    for (int i = 0; i < FLOOD_CONNECTIONS; i++)
        refused[i] = insider_flood_refused(sockets[i]); /* every done of theirs was taken */

    an_honest_done_waits_for_its_hold(s, 50);

    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.dones_early, FLOOD_CONNECTIONS * EARLY_PER_CONN + 1);
    for (int i = 0; i < FLOOD_CONNECTIONS; i++) {
        assert_int_equal(refused[i], FLOOD_DONES - EARLY_PER_CONN);
        zmq_close(sockets[i]);
    }
    zmq_ctx_term(zmq);
}

#define CLOSED_CONNECTIONS 16 /* a round's: 1,024 dones, all parked */

/* What closed connections left parked is freed when the list is full: rounds of 16 insider
 * connections park their shares and close, until EARLY_MAX wait; our done before its hold then
 * still waits for it, and counts. (A connection that closes takes its shares' answers' only
 * reader with it; the prefill learns it from the descriptor, done_handles.h.) */
static void parked_dones_of_closed_connections_make_room_when_the_list_is_full(void **state)
{
    struct session *s = *state;
    void *zmq         = zmq_ctx_new();
    void *sockets[CLOSED_CONNECTIONS];
    struct prng g;
    struct report r;

    prng_init(&g, prng_seed_from_env(36055));
    prefill_connected(s, 1); /* ours: the metadata's connection is closed by now */
    for (int round = 0; round < EARLY_MAX / (CLOSED_CONNECTIONS * EARLY_PER_CONN); round++) {
        for (int i = 0; i < CLOSED_CONNECTIONS; i++) {
            sockets[i] = insider_open(zmq, s->prefill_address);
            insider_flood_dones(sockets[i], &g, EARLY_PER_CONN);
        }
        for (int i = 0; i < CLOSED_CONNECTIONS; i++) {
            (void)insider_flood_refused(sockets[i]);
            zmq_close(sockets[i]);
        }
        prefill_connected(s, 1);
    }
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.dones_early, EARLY_MAX); /* full, of closed connections' */

    an_honest_done_waits_for_its_hold(s, 51);
    zmq_ctx_term(zmq);
}

/* Connections at once: within the prefill's handshakes from one address (32) and, with ours,
 * its max_peers (64). */
#define CHURN_AT_ONCE 28

/* `count` insiders come and go, as fetches and restarted workers do, CHURN_AT_ONCE at a time:
 * each connects, asks for a done handle, and closes once it has one. Before the next ones
 * connect, the prefill has counted these closed (its gate admits max_peers at once, 64, and
 * counts a close when its event comes, which a loaded machine delays); none is refused. */
static void insiders_churn(struct session *s, int count)
{
    char text[SIDECHAN_MAX_REPLY + 1];
    void *sockets[CHURN_AT_ONCE];
    void *zmq              = zmq_ctx_new();
    uint64_t peers_refused = command(s, 's', NULL, 0).stats.peers_refused;
    struct report r;

    for (int done = 0; done < count; done += CHURN_AT_ONCE) {
        int n = count - done < CHURN_AT_ONCE ? count - done : CHURN_AT_ONCE;

        for (int i = 0; i < n; i++) {
            sockets[i] = insider_open(zmq, s->prefill_address);
            insider_send(sockets[i], VERB_DONE_HANDLE, 1, "", 0);
        }
        for (int i = 0; i < n; i++) {
            assert_int_equal(insider_receive(sockets[i], text), 1);
            assert_int_equal(strncmp(text, REPLY_DONE_HANDLE " ", strlen(REPLY_DONE_HANDLE) + 1),
                             0);
            zmq_close(sockets[i]);
        }
        do /* ours (the relay's) are a few: the rest are closing */
            r = command(s, 's', NULL, 0);
        while (r.stats.peers_connected > 4);
    }
    assert_int_equal(r.stats.peers_refused, peers_refused);
    zmq_ctx_term(zmq);
}

#define CHURN (DONE_HANDLES_MAX + 64) /* connections: more than the table's slots */

/* A held request read: its done goes as a message and is judged there (the prefill's
 * dones_by_message grows to `by_message`), with `resent` dones sent back so far. */
static void a_held_read_judged_as_a_message(struct session *s, uint64_t request_id,
                                            uint64_t by_message, uint64_t resent)
{
    kvx_token_t token = token_new();
    struct report r;

    hold(s, request_id, 11, &token);
    block_clear(s->agent, 11);
    assert_int_equal(transfer(s, false, request_id, 11, &token), KVX_OK);
    assert_true(block_matches(s->agent, 11));
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.last_release, request_id);
    assert_int_equal(decode_stats(s).dones_resent, resent);
    assert_int_equal(r.stats.dones_by_message, by_message);
}

/* Issue 36 finding 6: a connection kept its done handle's slot for ever, so 1,024 connections
 * later (1.1 s of churn, or a day of fetches and worker restarts) a live decode agent's
 * handle went to another, and its dones went back to the side channel for good. A slot is
 * freed once its connection closed: after more connections than slots came and went, our
 * dones still go as messages, never sent back. */
static void done_handles_outlive_churn_of_other_connections(void **state)
{
    struct session *s = *state;

    assert_int_equal(transfer(s, false, 60, 10, NULL), KVX_OK); /* asks for our handle */
    a_held_read_judged_as_a_message(s, 61, 1, 0);
    insiders_churn(s, CHURN);
    a_held_read_judged_as_a_message(s, 62, 2, 0);
}

/* Has the relay close its connections to the prefill; returns once it did. */
static void liar_drop(struct session *s)
{
    uint64_t forged;

    assert_int_equal(write(s->liar_go, "d", 1), 1);
    assert_int_equal(read(s->liar_ready, &forged, sizeof(forged)), sizeof(forged));
    assert_int_equal(forged, 0); /* honest */
}

/* Issue 36 finding 6, the decode side: a done sent back because the prefill no longer knew
 * our handle (its connection, here the relay's, closed and its slot went to another) asks for
 * a handle again, and the next done goes as a message once more. */
static void a_done_sent_back_for_a_lost_handle_asks_for_another(void **state)
{
    struct session *s = *state;

    assert_int_equal(transfer(s, false, 70, 10, NULL), KVX_OK); /* asks, through the relay */
    a_held_read_judged_as_a_message(s, 71, 1, 0);
    liar_drop(s);                                 /* the relay's connections to it close */
    insiders_churn(s, CHURN);                     /* its slot is freed, and goes to another */
    a_held_read_judged_as_a_message(s, 72, 1, 1); /* sent back: asks again */
    a_held_read_judged_as_a_message(s, 73, 2, 1);
}

/* Through an honest relay, whose connections to the prefill can be dropped. */
static kvx_agent_t *decode_agent_with(const kvx_agent_params_t *params)
{
    kvx_agent_t *agent = NULL;

    assert_int_equal(agent_from_quoted(mla_layout, params, &agent), KVX_OK);
    return agent;
}

/* Request ids of the sniffing tests: a capture of loopback sees every test's traffic, and
 * other tests (ctest -j) use small ids. */
#define SNIFFED 0x736e696666000000ull

/* A capture of loopback's frames, as anyone on a data plane's path sees them; -1 where this
 * process may not (AF_PACKET needs CAP_NET_RAW). */
static int loopback_capture(void)
{
    /* frames under 4 KiB only: the messages sniffed are a few hundred bytes, and other tests'
     * bulk transfers on loopback (ctest -j) would fill the buffer before they are read */
    struct sock_filter small[] = {
        {BPF_LD | BPF_W | BPF_LEN, 0, 0, 0},
        {BPF_JMP | BPF_JGE | BPF_K, 0, 1, 4096},
        {BPF_RET | BPF_K, 0, 0, 0},
        {BPF_RET | BPF_K, 0, 0, 0xffff},
    };
    struct sock_fprog program = {.len = sizeof(small) / sizeof(small[0]), .filter = small};
    struct sockaddr_ll where  = {.sll_family   = AF_PACKET,
                                 .sll_protocol = htons(ETH_P_ALL),
                                 .sll_ifindex  = (int)if_nametoindex("lo")};
    int size                  = 16 << 20;
    int fd                    = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, 0); /* none yet */

    if (fd < 0)
        return -1;
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size));
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof(program)) != 0 ||
        bind(fd, (struct sockaddr *)&where, sizeof(where)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A done message the capture saw: what precedes its done (the message's header, the handle
 * and, with tags, the tag) and the done itself. */
struct sniffed {
    uint8_t head[64];
    size_t head_size;
    struct notify_read note;
};

/* Reads every frame captured so far and keeps the done message of request `request_id` from
 * rank `rank`: its done found by those fields, its start by the message's magic before it.
 * False when none was seen. */
static bool sniff_done(int capture, uint64_t request_id, uint32_t rank, struct sniffed *out)
{
    static uint8_t frame[1 << 17];
    const uint32_t magic = PUSH_AM_REQUEST_MAGIC;
    uint8_t fields[16];
    bool found = false;
    ssize_t n;

    memcpy(fields, &request_id, 8);
    memcpy(fields + 8, &rank, 4);
    memset(fields + 12, 0, 4); /* struct notify's reserved */
    while ((n = recv(capture, frame, sizeof(frame), 0)) > 0) {
        for (size_t at = offsetof(struct notify, request_id);
             !found && at + sizeof(out->note) <= (size_t)n + offsetof(struct notify, request_id);
             at++) {
            size_t note = at - offsetof(struct notify, request_id);

            if (memcmp(frame + at, fields, sizeof(fields)) != 0)
                continue;
            for (size_t start = note >= sizeof(out->head) ? note - sizeof(out->head) : 0;
                 start + sizeof(magic) <= note; start++) {
                if (memcmp(frame + start, &magic, sizeof(magic)) == 0) {
                    out->head_size = note - start;
                    memcpy(out->head, frame + start, out->head_size);
                    memcpy(&out->note, frame + note, sizeof(out->note));
                    found = true;
                }
            }
        }
    }
    return found;
}

/* Issue 36 finding 4: dones travel in the clear on the data plane, and a third party who saw
 * rank 1's done (for its handle) and rank 0's (for the hold's token) made rank 1's done of a
 * two-consumer hold: the hold was released before rank 1 read, and rank 1's own read was
 * refused. Now a done message carries a tag of its bytes under a key that only the encrypted
 * side channel carried: the forgery is dropped (counted in notifications_dropped), and rank
 * 1's read and done release the hold. Over tcp, so that the messages leave the processes. */
static void a_done_made_from_sniffed_ones_is_dropped(void **state)
{
    struct session *s          = *state;
    kvx_agent_params_t params  = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                                               KVX_AGENT_PARAM_FIELD_TRANSPORTS |
                                               KVX_AGENT_PARAM_FIELD_TP_RANK |
                                               KVX_AGENT_PARAM_FIELD_TP_SIZE,
                                 .timeout_ms = TIMEOUT_MS,
                                 .transports = "tcp",
                                 .tp_rank    = 1,
                                 .tp_size    = 2};
    kvx_agent_params_t insider = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                                                KVX_AGENT_PARAM_FIELD_TRANSPORTS,
                                  .timeout_ms = TIMEOUT_MS,
                                  .transports = "tcp"};
    kvx_token_t token = token_new();
    uint8_t forged[PUSH_AM_MAX];
    struct notify_read note;
    struct sniffed rank1;
    struct sniffed rank0;
    kvx_agent_t *third;
    kvx_peer_t *third_peer;
    kvx_agent_t *decode1;
    kvx_peer_t *peer1;
    kvx_group_ids_t group;
    kvx_request_t request;
    uint64_t block = 11;
    struct report before;
    struct report r;
    int capture = loopback_capture();

    if (capture < 0)
        skip(); /* not root: no capture */
    decode1 = decode_agent_with(&params);
    assert_int_equal(kvx_agent_connect(decode1, s->prefill_address, &peer1), KVX_OK);
    /* both ranks' first dones ask for their handles; their second ones go as messages */
    for (uint64_t id = SNIFFED; id < SNIFFED + 2; id++) {
        group   = (kvx_group_ids_t){&block, 1};
        request = (kvx_request_t){&group, 1, NULL, 0, NULL};
        assert_int_equal(transfer(s, false, id, 10, NULL), KVX_OK);
        assert_int_equal(kvx_read(decode1, &peer1, 1, id, &request, NULL), KVX_OK);
    }
    assert_true(sniff_done(capture, SNIFFED + 1, 1, &rank1)); /* rank 1's handle, in the clear */
    r = command(s, 'H', &(struct hold_command){SNIFFED + 2, block, 2, token}, sizeof(struct hold_command));
    block_clear(s->agent, block);
    assert_int_equal(transfer(s, false, SNIFFED + 2, block, &token), KVX_OK); /* rank 0 counted */
    assert_true(block_matches(s->agent, block));
    assert_true(sniff_done(capture, SNIFFED + 2, 0, &rank0)); /* the hold's token, in the clear */
    close(capture);
    assert_memory_equal(&rank0.note.done.token, &token, sizeof(token));

    /* rank 1's done of the held request: rank 1's message with rank 0's token */
    note                 = rank1.note;
    note.done.request_id = SNIFFED + 2;
    note.done.token      = rank0.note.done.token;
    memcpy(forged, rank1.head, rank1.head_size);
    memcpy(forged + rank1.head_size, &note, sizeof(note));
    before = command(s, 's', NULL, 0);
    assert_int_equal(before.stats.released, 0);
    third = decode_agent_with(&insider);
    assert_int_equal(kvx_agent_connect(third, s->prefill_address, &third_peer), KVX_OK);
    assert_int_equal(transport_msg_send(peer_conn(third_peer)->transport, CORE_AM_DONE, forged,
                                        rank1.head_size + sizeof(note)),
                     KVX_OK);
    /* until the prefill judged it: dropped, or (before) counted, which released the hold */
    for (uint64_t end = clock_ms() + 10000;; kvx_agent_progress(third, 1)) {
        r = command(s, 's', NULL, 0);
        if (r.stats.notifications_dropped > before.stats.notifications_dropped ||
            r.stats.released > before.stats.released || clock_ms() > end)
            break;
    }
    assert_int_equal(r.stats.released, 0);
    assert_int_equal(r.stats.notifications_dropped, before.stats.notifications_dropped + 1);

    /* rank 1 reads, and its own done releases the hold */
    group   = (kvx_group_ids_t){&block, 1};
    request = (kvx_request_t){&group, 1, NULL, 0, &token};
    block_clear(decode1, block);
    assert_int_equal(kvx_read(decode1, &peer1, 1, SNIFFED + 2, &request, NULL), KVX_OK);
    assert_true(block_matches(decode1, block));
    r = command(s, 's', NULL, 0);
    assert_int_equal(r.stats.released, 1);
    assert_int_equal(r.last_release, SNIFFED + 2);
    kvx_peer_destroy(third_peer);
    assert_int_equal(kvx_agent_destroy(third), KVX_OK);
    kvx_peer_destroy(peer1);
    assert_int_equal(kvx_agent_destroy(decode1), KVX_OK);
}

/* Reads every frame captured so far and keeps a push request message of request
 * `request_id` that the capture saw: its writer handle, and what came between the message's
 * header and the request (the tag, where messages carry one). False when none was seen. */
static bool sniff_push(int capture, uint64_t request_id, uint8_t handle[PUSH_HANDLE_LEN],
                       uint8_t tag[MSG_MAC_LEN], size_t *tag_size_p)
{
    static uint8_t frame[1 << 17];
    const uint32_t magic = PUSH_AM_REQUEST_MAGIC;
    bool found           = false;
    ssize_t n;

    while ((n = recv(capture, frame, sizeof(frame), 0)) > 0) {
        for (size_t at = 0; !found && at + PUSH_AM_REQUEST_HEADER < (size_t)n; at++) {
            if (memcmp(frame + at, &magic, sizeof(magic)) != 0)
                continue;
            for (size_t tag_size = 0; !found && tag_size <= MSG_MAC_LEN; tag_size += MSG_MAC_LEN) {
                size_t start = at + PUSH_AM_REQUEST_HEADER + tag_size;
                struct push_request req;

                for (size_t end = (size_t)n; !found && end > start && end + 64 > (size_t)n; end--) {
                    if (push_request_decode(frame + start, end - start, &req) != KVX_OK)
                        continue;
                    if (req.request_id == request_id) {
                        memcpy(handle, req.handle, PUSH_HANDLE_LEN);
                        memcpy(tag, frame + at + PUSH_AM_REQUEST_HEADER, tag_size);
                        *tag_size_p = tag_size;
                        found       = true;
                    }
                    push_request_free(&req);
                }
            }
        }
    }
    return found;
}

/* Issue 36 finding 4, for pushes: a push request on the data plane names its writer by a
 * handle in the clear, and one without a token writes any of the prefill's blocks into any of
 * the registrant's. A third party who saw our push (its handle) asked the prefill to write
 * its block 12 into our block 13; now a request carries a tag under the writer's key, which
 * only the side channel carried, and the made-up one is dropped (push_messages_refused):
 * block 13 stays as it was. Over tcp, so that the messages leave the processes. */
static void a_push_made_from_a_sniffed_one_writes_nothing(void **state)
{
    struct session *s          = *state;
    kvx_agent_params_t insider = {.field_mask = KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                                                KVX_AGENT_PARAM_FIELD_TRANSPORTS,
                                  .timeout_ms = TIMEOUT_MS,
                                  .transports = "tcp"};
    uint64_t to_block          = 13;
    uint64_t from_block        = 12;
    kvx_group_ids_t to         = {&to_block, 1};
    kvx_group_ids_t from       = {&from_block, 1};
    kvx_request_t made_up      = {&to, 1, &from, 1, NULL};
    uint8_t handle[PUSH_HANDLE_LEN];
    uint8_t forged[PUSH_AM_MAX];
    uint8_t message[PUSH_AM_MAX];
    size_t tag_size = 0;
    void *body      = NULL;
    size_t size     = 0;
    size_t framed;
    kvx_agent_t *third;
    kvx_peer_t *third_peer;
    struct report before;
    struct report r;
    int capture = loopback_capture();

    if (capture < 0)
        skip(); /* not root: no capture */
    block_clear(s->agent, 10);
    assert_int_equal(transfer(s, true, SNIFFED + 10, 10, NULL), KVX_OK); /* ours, by message */
    assert_true(block_matches(s->agent, 10));
    assert_true(sniff_push(capture, SNIFFED + 10, handle, forged, &tag_size));
    close(capture);
    print_message("the push request seen, with %zu bytes between its header and itself\n",
                  tag_size);
    assert_int_equal(push_request_encode(SNIFFED + 11, handle, 10000, 0, &made_up, &body, &size), KVX_OK);
    assert_true(tag_size + size <= sizeof(forged));
    memcpy(forged + tag_size, body, size); /* after the tag it saw, if any */
    free(body);
    framed = push_am_request_frame(99, forged, tag_size + size, message);
    assert_true(framed > 0);

    block_clear(s->agent, to_block);
    before = command(s, 's', NULL, 0);
    third  = decode_agent_with(&insider);
    assert_int_equal(kvx_agent_connect(third, s->prefill_address, &third_peer), KVX_OK);
    assert_int_equal(
        transport_msg_send(peer_conn(third_peer)->transport, CORE_AM_PUSH_REQUEST, message, framed),
        KVX_OK);
    /* until the prefill dropped it, or (before) wrote it: our agent serves the writes */
    for (uint64_t end = clock_ms() + 10000;; kvx_agent_progress(third, 1)) {
        r = command(s, 's', NULL, 0);
        if (r.stats.push_messages_refused > before.stats.push_messages_refused ||
            (r.stats.pushes_by_message > before.stats.pushes_by_message &&
             r.stats.pushes_serving == 0) ||
            clock_ms() > end)
            break;
    }
    assert_int_equal(r.stats.push_messages_refused, before.stats.push_messages_refused + 1);
    assert_int_equal(r.stats.pushes_by_message, before.stats.pushes_by_message);
    assert_true(block_is_zero(s->agent, to_block));
    kvx_peer_destroy(third_peer);
    assert_int_equal(kvx_agent_destroy(third), KVX_OK);
}

static int session_setup_relay(void **state)
{
    int result;

    through_liar = true;
    liar_honest  = true;
    result       = session_open(state, NULL);
    liar_honest  = false;
    through_liar = false;
    return result;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(a_wrong_token_is_refused_and_the_hold_stays_until_its_lease,
                                        session_setup, session_teardown),
        cmocka_unit_test_setup_teardown(the_same_reference_read_twice_is_refused_the_second_time,
                                        session_setup, session_teardown),
        cmocka_unit_test_setup_teardown(a_done_before_its_hold_waits_for_it, session_setup,
                                        session_teardown),
        cmocka_unit_test_setup_teardown(parked_dones_end_at_their_deadlines, session_setup,
                                        session_teardown),
        cmocka_unit_test_setup_teardown(dones_travel_as_messages_once_the_connection_has_a_handle,
                                        session_setup, session_teardown),
        cmocka_unit_test_setup_teardown(a_small_served_read_takes_its_done_along, session_setup_tcp,
                                        session_teardown),
        cmocka_unit_test_setup_teardown(a_rendezvous_read_has_its_done_judged_when_it_completes,
                                        session_setup_malloced, session_teardown),
        cmocka_unit_test_setup_teardown(a_push_with_its_token_releases_the_hold,
                                        session_setup_writers, session_teardown),
        cmocka_unit_test_setup_teardown(a_push_put_with_its_token_releases_the_hold,
                                        session_setup_puts, session_teardown),
        cmocka_unit_test_setup_teardown(a_push_with_a_wrong_token_writes_nothing,
                                        session_setup_writers, session_teardown),
        cmocka_unit_test_setup_teardown(a_push_before_its_hold_waits_for_it, session_setup_writers,
                                        session_teardown),
        cmocka_unit_test_setup_teardown(a_push_on_one_host_goes_as_a_read, session_setup,
                                        session_teardown),
        cmocka_unit_test_setup_teardown(a_push_over_tcp_goes_to_the_writer, session_setup_tcp,
                                        session_teardown),
        cmocka_unit_test_setup_teardown(a_done_made_from_sniffed_ones_is_dropped,
                                        session_setup_tcp, session_teardown),
        cmocka_unit_test_setup_teardown(a_push_made_from_a_sniffed_one_writes_nothing,
                                        session_setup_tcp, session_teardown),
        cmocka_unit_test_setup_teardown(a_second_resend_of_a_done_is_a_malformed_answer,
                                        session_setup_liar, session_teardown),
        cmocka_unit_test_setup_teardown(a_flood_of_early_dones_crowds_out_only_its_own_connections,
                                        session_setup, session_teardown),
        cmocka_unit_test_setup_teardown(
            parked_dones_of_closed_connections_make_room_when_the_list_is_full, session_setup,
            session_teardown),
        cmocka_unit_test_setup_teardown(done_handles_outlive_churn_of_other_connections,
                                        session_setup, session_teardown),
        cmocka_unit_test_setup_teardown(a_done_sent_back_for_a_lost_handle_asks_for_another,
                                        session_setup_relay, session_teardown),
    };

    setenv("UCX_NET_DEVICES", "lo", 1); /* never another interface */
    alarm(600);                         /* a hang fails the run instead of stalling CI */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

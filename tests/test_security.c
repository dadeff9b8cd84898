/* test_security.c: issue 11's attacks on a prefill process, each between real processes on
 * loopback: a peer without the secret (or with another) gets no metadata and no answer while
 * an authenticated one is served; forged push registrations (this process's own worker, a
 * third agent's) are refused and change no byte of anyone; a done or heartbeat with a wrong
 * token changes no hold; floods stay within the listener's memory bound; and the rules of an
 * agent without a secret and of the key file. */
#include "auth.h"
#include "clock.h"
#include "core.h"
#include "layouts.h"
#include "prefill.h"
#include "push_request.h"
#include "sidechan.h"
#include "wire.h" /* white-box: the victim's TCP segment sizes, which a forger copies */

#include <zmq.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define PAGE   4096
#define BLOCKS 16

static const char layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536}], 'views': ["
    "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 4096, 'stride': 4096,"
    " 'num_blocks': 16}]}";

/* What the prefill process of a test is given before it forks. */
static struct {
    uint32_t max_peers;
    uint32_t timeout_ms;
} config = {64, 10000};

#define BURST_SOURCES 150

/* What a prefill process says about itself on 's'. */
struct report {
    kvx_agent_stats_t stats;
    uint64_t refused_lines; /* log lines that name 127.0.0.1 refused */
    uint64_t named_77;      /* log lines that name 127.0.0.77 refused */
    uint8_t named_burst[BURST_SOURCES]; /* log lines that name 127.0.3.(i + 1) refused */
    bool intact;            /* its storage still holds its pattern, every byte */
    uint64_t rss_peak_kib;  /* VmHWM */
};

static uint64_t pattern_word(uint64_t seed, uint64_t index)
{
    return (seed << 48 | (index + 1)) * 0x9e3779b97f4a7c15u;
}

static void pattern_fill(kvx_agent_t *agent, uint64_t seed)
{
    uint64_t size;
    uint64_t *words = kvx_agent_storage(agent, 0, &size);

    for (uint64_t i = 0; i < size / 8; i++)
        words[i] = pattern_word(seed, i);
}

static bool pattern_intact(const kvx_agent_t *agent, uint64_t seed)
{
    uint64_t size;
    const uint64_t *words = kvx_agent_storage(agent, 0, &size);

    for (uint64_t i = 0; i < size / 8; i++) {
        if (words[i] != pattern_word(seed, i))
            return false;
    }
    return true;
}

static uint64_t rss_peak_kib(void)
{
    char line[256];
    uint64_t kib = 0;
    FILE *status = fopen("/proc/self/status", "r");

    while (status != NULL && fgets(line, sizeof(line), status) != NULL)
        sscanf(line, "VmHWM: %" SCNu64, &kib);
    if (status != NULL)
        fclose(status);
    return kib;
}

/* Refusal lines by the address they name. */
static struct {
    uint64_t local;   /* 127.0.0.1 */
    uint64_t named_77;
    uint8_t burst[BURST_SOURCES]; /* 127.0.3.1 to 127.0.3.BURST_SOURCES */
} refused_lines;

static void count_refused(void *arg, const char *line)
{
    int n = 0;

    (void)arg;
    if (strstr(line, "side channel: refused 127.0.0.1:") != NULL)
        refused_lines.local++;
    if (strstr(line, "side channel: refused 127.0.0.77:") != NULL)
        refused_lines.named_77++;
    if (sscanf(line, "side channel: refused 127.0.3.%d:", &n) == 1 && n >= 1 &&
        n <= BURST_SOURCES && refused_lines.burst[n - 1] < UINT8_MAX)
        refused_lines.burst[n - 1]++;
}

/* A prefill process: its storage filled with the pattern of seed `go`'s first byte... kept
 * simple: seed 1. Holds request 7 with a token it reports after its address, then serves;
 * on 's' on `go` it writes a struct report on `ready`, on 'p' it stops turning its agent's
 * loop (ZeroMQ's threads go on) until 'r', on 'q' it exits. */
static int run_prefill(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                                               KVX_AGENT_PARAM_FIELD_MAX_PEERS |
                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .listen     = "127.0.0.1:0",
                                 .max_peers  = config.max_peers,
                                 .timeout_ms = config.timeout_ms};
    uint64_t block            = 5;
    kvx_group_ids_t group     = {&block, 1};
    kvx_agent_t *agent;
    kvx_token_t token;

    alarm(120);
    if (agent_from_quoted(layout, &params, &agent) != KVX_OK)
        return 10;
    kvx_agent_set_log_callback(agent, count_refused, NULL);
    pattern_fill(agent, 1);
    if (hold_new(agent, 7, &group, 1, 1, &token) != KVX_OK)
        return 11;
    report_serving(ready, agent);
    report_token(ready, &token);
    for (bool paused = false;;) {
        struct pollfd item = {.fd = go, .events = POLLIN};
        struct report r;
        char c;

        if (!paused)
            kvx_agent_progress(agent, 5);
        if (poll(&item, 1, paused ? 5 : 0) <= 0)
            continue;
        if (read(go, &c, 1) != 1 || c == 'q')
            break;
        if (c == 'p' || c == 'r') {
            paused = c == 'p';
            continue;
        }
        kvx_agent_stats(agent, &r.stats, sizeof(r.stats));
        r.refused_lines = refused_lines.local;
        r.named_77      = refused_lines.named_77;
        memcpy(r.named_burst, refused_lines.burst, sizeof(r.named_burst));
        r.intact        = pattern_intact(agent, 1);
        r.rss_peak_kib  = rss_peak_kib();
        if (write(ready, &r, sizeof(r)) != sizeof(r))
            return 12;
    }
    return kvx_agent_destroy(agent) == KVX_OK ? 0 : 13;
}

struct prefill {
    pid_t pid;
    int ready;
    int go;
    char address[ADDRESS_SIZE];
    kvx_token_t token;
};

static void prefill_start(struct prefill *p)
{
    int go[2];

    assert_int_equal(pipe(go), 0);
    p->pid = start_prefill(run_prefill, go[0], p->address, &p->ready);
    close(go[0]);
    p->go    = go[1];
    p->token = read_token(p->ready);
}

static struct report prefill_report(const struct prefill *p)
{
    struct report r;

    assert_int_equal(write(p->go, "s", 1), 1);
    assert_int_equal(read(p->ready, &r, sizeof(r)), sizeof(r));
    return r;
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

static kvx_agent_t *decode_agent(const kvx_agent_params_t *params)
{
    kvx_agent_t *agent = NULL;

    assert_int_equal(agent_from_quoted(layout, params, &agent), KVX_OK);
    return agent;
}

/* A verified read of block 5 (the pattern of seed 1) with `token`; returns the status. */
static kvx_status_t read_block5(kvx_agent_t *agent, kvx_peer_t *peer, const kvx_token_t *token)
{
    uint64_t block        = 5;
    kvx_group_ids_t group = {&block, 1};
    kvx_request_t request = {&group, 1, NULL, 0, token};
    const uint64_t *words = (const uint64_t *)kvx_agent_storage(agent, 0, NULL) + 5 * PAGE / 8;
    kvx_status_t status   = kvx_read(agent, &peer, 1, 7, &request, NULL);

    for (size_t i = 0; status == KVX_OK && i < PAGE / 8; i++) {
        if (words[i] != pattern_word(1, 5 * PAGE / 8 + i))
            fail_msg("word %zu of block 5 differs", i);
    }
    return status;
}

/* Attack 1: a peer without the secret, or with another one, or speaking plain ZeroMQ, gets
 * no metadata, no checksums and no answer; each refusal is counted, the address logged once; the
 * prefill process serves an authenticated decode process meanwhile. */
static void a_peer_without_the_secret_gets_nothing(void **state)
{
    const uint8_t other_key[KVX_AUTH_KEY_LEN] = "another deployment's secret key.";
    kvx_agent_params_t wrong                  = {.field_mask = KVX_AGENT_PARAM_FIELD_AUTH_KEY |
                                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                                 .auth_key   = other_key,
                                                 .timeout_ms = 10000};
    kvx_agent_params_t insecure               = {.field_mask = KVX_AGENT_PARAM_FIELD_INSECURE |
                                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                                 .insecure   = true,
                                                 .timeout_ms = 10000};
    struct auth_keys plain                    = {.curve = false};
    struct auth_keys other;
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer = NULL;
    struct report r;
    void *zmq;
    void *reply = NULL;
    size_t size;

    (void)state;
    prefill_start(&p);
    agent = decode_agent(&wrong);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_ERR_PEER_REFUSED);
    assert_non_null(strstr(kvx_errmsg(), "handshake failed"));
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    agent = decode_agent(&insecure);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_ERR_PEER_REFUSED);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    /* plain ZeroMQ asking for the metadata: refused before a byte of it is read */
    zmq = zmq_ctx_new();
    assert_int_equal(
        sidechan_fetch(zmq, p.address, &plain, VERB_METADATA, 1 << 20, 10000, &reply, &size),
        KVX_ERR_PEER_REFUSED);
    assert_null(reply);
    /* nor checksums of its memory (verification), in plain ZeroMQ or with another secret */
    assert_int_equal(
        sidechan_fetch(zmq, p.address, &plain, VERB_CHECKSUM, 1 << 20, 10000, &reply, &size),
        KVX_ERR_PEER_REFUSED);
    assert_int_equal(auth_keys_derive(other_key, &other), KVX_OK);
    assert_int_equal(
        sidechan_fetch(zmq, p.address, &other, VERB_CHECKSUM, 1 << 20, 10000, &reply, &size),
        KVX_ERR_PEER_REFUSED);
    assert_null(reply);
    zmq_ctx_term(zmq);

    agent = decode_agent(NULL); /* the tests' secret */
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    assert_int_equal(read_block5(agent, peer, &p.token), KVX_OK);
    r = prefill_report(&p);
    assert_true(r.stats.auth_refused >= 5);
    assert_int_equal(r.stats.verify_served + r.stats.verify_refused, 0); /* never reached */
    /* one address, logged once (a peer that closed before the gate read its address is
     * logged without it) */
    assert_true(r.refused_lines <= 1);
    assert_int_equal(r.stats.released, 1);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    prefill_end(&p);
}

/* The metadata a prefill process serves, unpacked against our table in pull mode. */
static kvx_metadata_t *metadata_fetch(const char *address, const kvx_regions_t *local)
{
    struct auth_keys keys;
    void *zmq = zmq_ctx_new();
    void *bytes;
    size_t size;
    kvx_metadata_t *md = NULL;

    assert_int_equal(auth_keys_derive(test_auth_key, &keys), KVX_OK);
    assert_int_equal(
        sidechan_fetch(zmq, address, &keys, VERB_METADATA, 1 << 24, 10000, &bytes, &size), KVX_OK);
    assert_int_equal(kvx_metadata_unpack(bytes, size, local, KVX_MODE_PULL, &md), KVX_OK);
    free(bytes);
    zmq_ctx_term(zmq);
    return md;
}

/* Push metadata that names the worker, keys and bases of the agent `victim` described: what a
 * requester who read that agent's metadata could forge, stating the TCP segment sizes
 * `segments` ({tx, rx}; NULL: none, as a kvx from before issue 22). */
static void push_metadata(const kvx_regions_t *table, const kvx_metadata_t *victim,
                          const uint64_t *segments, void **buf_p, size_t *size_p)
{
    kvx_metadata_info_t info;
    kvx_registration_info_t reg;
    uint64_t base;
    kvx_blob_t key;
    kvx_metadata_params_t mp;

    kvx_metadata_get_info(victim, &info);
    assert_int_equal(info.num_registrations, 1);
    assert_int_equal(kvx_metadata_registration(victim, 0, &reg), KVX_OK);
    base = reg.base + 5 * PAGE; /* and a forged base: block 0 written lands on its block 5 */
    key  = reg.remote_key;
    mp   = (kvx_metadata_params_t){.field_mask = KVX_METADATA_PARAM_FIELD_MODE |
                                                 KVX_METADATA_PARAM_FIELD_STORAGE_BASES |
                                                 KVX_METADATA_PARAM_FIELD_REMOTE_KEYS |
                                                 KVX_METADATA_PARAM_FIELD_TRANSPORT_ADDRESS,
                                   .mode              = KVX_MODE_PUSH,
                                   .storage_bases     = &base,
                                   .remote_keys       = &key,
                                   .transport_address = info.transport_address};
    if (segments != NULL) {
        mp.field_mask |= KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS;
        mp.tcp_tx_seg_size = segments[0];
        mp.tcp_rx_seg_size = segments[1];
    }
    assert_int_equal(kvx_metadata_pack(table, &mp, buf_p, size_p), KVX_OK);
}

/* The same with the victim's own TCP segment sizes, so that the registration is judged on
 * what it names, not refused for its segments. */
static void forged_push_metadata(const kvx_regions_t *table, const kvx_metadata_t *victim,
                                 void **buf_p, size_t *size_p)
{
    const uint64_t segments[2] = {victim->tcp_tx_seg_size, victim->tcp_rx_seg_size};

    push_metadata(table, victim, segments, buf_p, size_p);
}

/* One request on an authenticated connection of its own; its answer's text (freed by the
 * caller), or NULL when none came within `timeout_ms`. */
static char *request_answer(struct sidechan_client *client, const char *verb, const void *body,
                            size_t size, int timeout_ms)
{
    uint64_t id;
    char *reply = NULL;
    size_t reply_size;

    assert_int_equal(sidechan_client_send(client, verb, 9, body, size), KVX_OK);
    while (sidechan_client_wait(client, timeout_ms)) {
        if (sidechan_client_recv(client, &id, &reply, &reply_size) && id == 9)
            return reply;
        free(reply);
    }
    return NULL;
}

/* Attack 3: an authenticated requester registers push metadata naming the prefill process's
 * own worker, then a third agent's worker and keys with a forged base (both refused at once:
 * a writer writes only over a link its requester opened to the prefill), then pushes with a handle it was never
 * given (refused); no byte of the prefill process or the third agent changed, and an honest
 * push still works. */
static void forged_pushes_are_refused_and_change_no_byte(void **state)
{
    struct prefill p;
    struct prefill third;
    struct auth_keys keys;
    struct sidechan_client *client;
    kvx_metadata_t *md;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    void *zmq;
    void *forged;
    size_t size;
    char *answer;
    struct report r;
    uint64_t block        = 0;
    kvx_group_ids_t group = {&block, 1};
    kvx_request_t request = {&group, 1, NULL, 0, NULL};
    void *push;
    size_t push_size;
    const uint8_t handle[16] = {0};

    (void)state;
    config.timeout_ms = 3000; /* the proof's deadline: a refusal, not a speed, is tested */
    prefill_start(&p);
    prefill_start(&third);
    config.timeout_ms = 10000;
    agent             = decode_agent(NULL);
    assert_int_equal(auth_keys_derive(test_auth_key, &keys), KVX_OK);
    zmq = zmq_ctx_new();
    assert_int_equal(sidechan_client_create(zmq, p.address, &keys, 8, &client), KVX_OK);

    md = metadata_fetch(p.address, kvx_agent_regions(agent));
    forged_push_metadata(kvx_agent_regions(agent), md, &forged, &size);
    kvx_metadata_destroy(md);
    answer = request_answer(client, VERB_PUSH_REGISTER, forged, size, 10000);
    assert_non_null(answer);
    /* over kvx's links a writer takes only a link its peer opened to it, never a worker */
    assert_non_null(strstr(answer, "names a worker, not a link"));
    free(answer);
    kvx_free(forged);

    md = metadata_fetch(third.address, kvx_agent_regions(agent));
    forged_push_metadata(kvx_agent_regions(agent), md, &forged, &size);
    kvx_metadata_destroy(md);
    answer = request_answer(client, VERB_PUSH_REGISTER, forged, size, 20000);
    assert_non_null(answer);
    assert_non_null(strstr(answer, "names a worker, not a link"));
    free(answer);
    kvx_free(forged);

    assert_int_equal(push_request_encode(1, handle, 0, 0, &request, &push, &push_size), KVX_OK);
    answer = request_answer(client, VERB_PUSH, push, push_size, 10000);
    assert_non_null(answer);
    assert_non_null(strstr(answer, "no registered writer"));
    free(answer);
    free(push);
    sidechan_client_destroy(client);
    zmq_ctx_term(zmq);

    r = prefill_report(&p);
    assert_true(r.intact);
    assert_int_equal(r.stats.pushes_refused, 3);
    assert_true(prefill_report(&third).intact);

    /* an honest push, whose proof comes back, still writes */
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    block = 5;
    assert_int_equal(kvx_write(agent, &peer, 1, 11, &request, NULL), KVX_OK);
    for (size_t i = 0; i < PAGE / 8; i++)
        assert_true(((const uint64_t *)kvx_agent_storage(agent, 0, NULL))[5 * PAGE / 8 + i] ==
                    pattern_word(1, 5 * PAGE / 8 + i));
    assert_true(prefill_report(&p).intact);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    prefill_end(&third);
    prefill_end(&p);
}

/* Attack 4: a done and a heartbeat with a wrong token change no hold; the real token's done
 * releases it. Issue 21: the reads whose dones were refused fail, saying why. */
static void a_wrong_token_releases_nothing(void **state)
{
    struct prefill p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    kvx_token_t wrong;
    uint64_t id = 7;
    struct report r;

    (void)state;
    prefill_start(&p);
    wrong = p.token;
    wrong.bytes[0] ^= 0x80;
    agent = decode_agent(NULL);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    assert_int_equal(kvx_heartbeat(agent, &peer, 1, &id, &wrong, 1), KVX_OK);
    assert_int_equal(read_block5(agent, peer, &wrong), KVX_ERR_PEER_REFUSED); /* forged */
    assert_non_null(strstr(kvx_errmsg(), "remote rank 0: wrong token"));
    assert_int_equal(read_block5(agent, peer, NULL), KVX_ERR_PEER_REFUSED); /* no token at all */
    assert_non_null(strstr(kvx_errmsg(), "remote rank 0: wrong token"));
    do
        r = prefill_report(&p);
    while (r.stats.tokens_refused < 3);
    assert_int_equal(r.stats.tokens_refused, 3);
    assert_int_equal(r.stats.held, 1);
    assert_int_equal(r.stats.released, 0);
    assert_int_equal(read_block5(agent, peer, &p.token), KVX_OK);
    do
        r = prefill_report(&p);
    while (r.stats.released < 1);
    assert_int_equal(r.stats.held, 0);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    prefill_end(&p);
}

/* Sends `count` messages of `size` bytes (a push verb, garbage body) on each of `n`
 * authenticated connections, blocking on each for up to 2 s, then closes them once what was
 * sent is delivered; returns how many were sent. */
static int flood(const char *address, int n, int count, size_t size)
{
    struct auth_keys keys;
    void *zmq      = zmq_ctx_new();
    char *body     = calloc(1, size);
    void **sockets = calloc((size_t)n, sizeof(*sockets));
    char endpoint[ADDRESS_SIZE + 8];
    int hwm     = 2;
    int timeout = 2000;
    int linger  = 30000; /* every message sent is delivered before the context ends */
    int sent    = 0;

    assert_non_null(body);
    assert_int_equal(auth_keys_derive(test_auth_key, &keys), KVX_OK);
    snprintf(endpoint, sizeof(endpoint), "tcp://%s", address);
    for (int i = 0; i < n; i++) {
        sockets[i] = zmq_socket(zmq, ZMQ_DEALER);
        zmq_setsockopt(sockets[i], ZMQ_SNDHWM, &hwm, sizeof(hwm));
        zmq_setsockopt(sockets[i], ZMQ_SNDTIMEO, &timeout, sizeof(timeout));
        zmq_setsockopt(sockets[i], ZMQ_LINGER, &linger, sizeof(linger));
        assert_int_equal(auth_client_socket(sockets[i], &keys), KVX_OK);
        assert_int_equal(zmq_connect(sockets[i], endpoint), 0);
    }
    for (int m = 0; m < count; m++) {
        for (int i = 0; i < n; i++) {
            zmq_send(sockets[i], "", 0, ZMQ_SNDMORE);
            zmq_send(sockets[i], VERB_PUSH, strlen(VERB_PUSH), ZMQ_SNDMORE);
            zmq_send(sockets[i], "IDIDIDID", 8, ZMQ_SNDMORE);
            sent += zmq_send(sockets[i], body, size, 0) >= 0; /* a dropped peer times out */
        }
    }
    for (int i = 0; i < n; i++)
        zmq_close(sockets[i]);
    zmq_ctx_term(zmq);
    free(sockets);
    free(body);
    return sent;
}

/* Attack 5: 16 connections each sending 10.5 MB frames (dropped at the first: above
 * max_message), then 16 sending 30 messages of max_message each: the prefill process's peak
 * memory grows by less than its bound (max_peers x 8 queued x max_message; 16 connections
 * here: 128 MiB), it keeps serving, and a 17th connection past max_peers is refused. */
static void floods_stay_within_the_memory_bound(void **state)
{
#if defined(__SANITIZE_ADDRESS__)
    const uint64_t quarantine_kib = 256 * 1024; /* freed memory ASan keeps back, by default */
#else
    const uint64_t quarantine_kib = 0;
#endif
    const uint64_t bound_kib = 16ull * 8 * 1024 + 32 * 1024 + quarantine_kib; /* + slack */
    struct prefill p;
    struct report before;
    struct report after;
    int sent;
    kvx_agent_t *agent;
    kvx_peer_t *peer;

    (void)state;
    config.max_peers = 16;
    prefill_start(&p);
    config.max_peers = 64;
    before           = prefill_report(&p);
    (void)flood(p.address, 16, 3, 10500000);            /* every one dropped at its first frame */
    sent = flood(p.address, 16, 30, (1u << 20) - 1024); /* CURVE adds 33 bytes a frame */
    assert_true(sent > 16 * 30 / 2);
    /* until what was sent came in, or nothing more comes for 2 s: a connection the gate
     * refused while the last flood's were still counted open loses what it had queued */
    after = prefill_report(&p);
    for (uint64_t last = clock_ms(), seen = 0;
         after.stats.pushes_refused < (uint64_t)sent && clock_ms() - last < 2000;
         after = prefill_report(&p)) {
        if (after.stats.pushes_refused != seen)
            last = clock_ms();
        seen = after.stats.pushes_refused;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    print_message("peak RSS %" PRIu64 " KiB -> %" PRIu64 " KiB (bound + %" PRIu64 " KiB); %" PRIu64
                  " flood messages served and refused\n",
                  before.rss_peak_kib, after.rss_peak_kib, bound_kib, after.stats.pushes_refused);
    assert_true(after.stats.pushes_refused >= (uint64_t)sent * 9 / 10); /* the flood came in */
    assert_true(after.rss_peak_kib - before.rss_peak_kib < bound_kib);
    agent = decode_agent(NULL);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    assert_int_equal(read_block5(agent, peer, &p.token), KVX_OK);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    prefill_end(&p);
}

static struct report report_until(const struct prefill *p, bool (*done)(const struct report *),
                                  uint64_t deadline_ms);

static bool no_connections(const struct report *r)
{
    return r->stats.peers_connected == 0 && r->stats.handshakes == 0;
}

/* Past max_peers authenticated connections, a handshake is refused by ZAP, counted as such
 * (and not as a failed handshake); the gauges follow every connection's close. */
static void connections_past_max_peers_are_refused(void **state)
{
    struct prefill p;
    kvx_agent_t *agents[3];
    kvx_peer_t *peers[2];
    kvx_peer_t *extra;
    struct report r;

    (void)state;
    config.max_peers = 2;
    prefill_start(&p);
    config.max_peers = 64;
    for (int i = 0; i < 3; i++)
        agents[i] = decode_agent(NULL);
    /* each connected peer keeps one connection (its socket); the handshake's own is closed */
    assert_int_equal(kvx_agent_connect(agents[0], p.address, &peers[0]), KVX_OK);
    assert_int_equal(kvx_agent_connect(agents[1], p.address, &peers[1]), KVX_OK);
    assert_int_equal(kvx_agent_connect(agents[2], p.address, &extra), KVX_ERR_PEER_REFUSED);
    r = prefill_report(&p);
    assert_true(r.stats.peers_refused >= 1);
    assert_int_equal(r.stats.auth_refused, 0); /* refused by ZAP: not a failed handshake */
    assert_int_equal(r.stats.peers_connected, 2);
    for (int i = 0; i < 2; i++) {
        kvx_peer_destroy(peers[i]);
        assert_int_equal(kvx_agent_destroy(agents[i]), KVX_OK);
    }
    assert_int_equal(kvx_agent_destroy(agents[2]), KVX_OK);
    /* every connection closed: the gauges come back to zero */
    r = report_until(&p, no_connections, 20000);
    assert_int_equal(r.stats.peers_connected, 0);
    assert_int_equal(r.stats.handshakes, 0);
    prefill_end(&p);
}

/* A TCP socket from `source` (an IPv4 address of this host: 127.0.0.0/8 binds any) to
 * `address` ("IP:PORT"), its connect started and not waited for; -1 on failure. */
static int raw_connect(const char *source, const char *address)
{
    struct sockaddr_in from = {.sin_family = AF_INET};
    struct sockaddr_in to   = {.sin_family = AF_INET};
    char host[ADDRESS_SIZE];
    const char *colon = strrchr(address, ':');
    int fd            = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

    snprintf(host, sizeof(host), "%.*s", (int)(colon - address), address);
    to.sin_port = htons((uint16_t)atoi(colon + 1));
    if (fd < 0 || inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
        inet_pton(AF_INET, host, &to.sin_addr) != 1 ||
        bind(fd, (struct sockaddr *)&from, sizeof(from)) != 0 ||
        (connect(fd, (struct sockaddr *)&to, sizeof(to)) != 0 && errno != EINPROGRESS)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

#define SILENT_SOCKETS 200

/* The stranger of finding 2: SILENT_SOCKETS sockets that never send a byte, half from
 * 127.0.0.66 and half from 100 addresses of their own, each opened again as soon as the
 * listener closes it, until a byte comes on `stop` (or 120 s). A forked process. */
static int run_silent(const char *address, int stop)
{
    struct pollfd items[SILENT_SOCKETS + 1];
    char sources[SILENT_SOCKETS][32];

    alarm(120);
    for (int i = 0; i < SILENT_SOCKETS; i++) {
        if (i < SILENT_SOCKETS / 2)
            snprintf(sources[i], sizeof(sources[i]), "127.0.0.66");
        else
            snprintf(sources[i], sizeof(sources[i]), "127.0.1.%d", i - SILENT_SOCKETS / 2 + 1);
        items[i] = (struct pollfd){.fd = raw_connect(sources[i], address), .events = POLLIN};
    }
    items[SILENT_SOCKETS] = (struct pollfd){.fd = stop, .events = POLLIN};
    for (;;) {
        if (poll(items, SILENT_SOCKETS + 1, 1000) < 0 && errno != EINTR)
            return 1;
        if (items[SILENT_SOCKETS].revents != 0)
            return 0;
        for (int i = 0; i < SILENT_SOCKETS; i++) {
            char bytes[64];

            if (items[i].fd >= 0 && items[i].revents == 0)
                continue;
            /* the listener's greeting is read and dropped; its close is answered by a new one */
            if (items[i].fd >= 0 && !(items[i].revents & (POLLHUP | POLLERR)) &&
                read(items[i].fd, bytes, sizeof(bytes)) > 0)
                continue;
            if (items[i].fd >= 0)
                close(items[i].fd);
            items[i].fd = raw_connect(sources[i], address);
        }
    }
}

static pid_t silent_start(const char *address, int *stop_p)
{
    int stop[2];
    pid_t pid;

    assert_int_equal(pipe(stop), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(stop[1]);
        _exit(run_silent(address, stop[0]));
    }
    close(stop[0]);
    *stop_p = stop[1];
    return pid;
}

static void silent_end(pid_t pid, int stop)
{
    int status;

    assert_int_equal(write(stop, "q", 1), 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(stop);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* A report once `done` holds of it, polled every 10 ms for up to `deadline_ms`; the last one
 * either way. */
static struct report report_until(const struct prefill *p, bool (*done)(const struct report *),
                                  uint64_t deadline_ms)
{
    uint64_t end     = clock_ms() + deadline_ms;
    struct report r = prefill_report(p);

    while (!done(&r) && clock_ms() < end) {
        nanosleep(&(struct timespec){0, 10000000}, NULL);
        r = prefill_report(p);
    }
    return r;
}

static bool silent_held(const struct report *r)
{
    /* 32 of 127.0.0.66's (the per-source cap) and the 100 others in their handshake, and the
     * cap refusing the rest of 127.0.0.66's */
    return r->stats.handshakes >= 100 && r->stats.handshakes_refused > 0;
}

static bool one_peer_left(const struct report *r)
{
    return r->stats.handshakes == 0 && r->stats.peers_connected == 1;
}

/* Issue 22 finding 2: 200 silent TCP sockets, reopened as the listener closes them, used to
 * fill max_peers (64) and lock every new peer out. Handshakes are counted apart from admitted
 * peers now: an honest connect and verified read succeed within 1 s, no peer is refused, the
 * gauges come back to the one honest peer, and a silent socket is closed at its
 * handshake deadline. */
static void silent_sockets_do_not_lock_peers_out(void **state)
{
    struct prefill p;
    struct report r;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    pid_t silent;
    int stop;
    int lone;
    uint64_t started;
    double elapsed_ms;
    char byte[64];

    (void)state;
    prefill_start(&p);
    silent = silent_start(p.address, &stop);
    r      = report_until(&p, silent_held, 20000);
    assert_true(silent_held(&r));
    agent   = decode_agent(NULL);
    started = clock_ms();
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    assert_int_equal(read_block5(agent, peer, &p.token), KVX_OK);
    elapsed_ms = (double)(clock_ms() - started);
    r          = prefill_report(&p);
    print_message("honest connect and read in %.0f ms beside %" PRIu64 " handshakes in progress "
                  "(%" PRIu64 " closed past the bounds so far)\n",
                  elapsed_ms, r.stats.handshakes, r.stats.handshakes_refused);
    assert_true(elapsed_ms < 1000);
    assert_int_equal(r.stats.peers_refused, 0);
    silent_end(silent, stop);
    r = report_until(&p, one_peer_left, 20000);
    assert_int_equal(r.stats.handshakes, 0);
    assert_int_equal(r.stats.peers_connected, 1); /* the peer's kept socket */

    /* one silent socket: closed at its handshake deadline (10 s) */
    lone    = raw_connect("127.0.0.67", p.address);
    started = clock_ms();
    for (struct pollfd item = {.fd = lone, .events = POLLIN};
         poll(&item, 1, 10000) > 0 && read(lone, byte, sizeof(byte)) > 0;)
        ;
    elapsed_ms = (double)(clock_ms() - started);
    close(lone);
    print_message("a silent socket was closed after %.0f ms\n", elapsed_ms);
    assert_true(elapsed_ms < 15000);

    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    prefill_end(&p);
}

static bool source_full(const struct report *r)
{
    return r->stats.handshakes >= 32 && r->stats.handshakes_refused >= 8;
}

/* Issue 36 finding 3: 40 silent sockets from 127.0.0.1, the honest peer's own address, used
 * to fill that address's 32 handshake places and close every later arrival from it, the
 * honest peer's too (its connect was refused). Now an arrival closes its address's oldest
 * handshake: the honest connect and verified read succeed, and the gauges come back. */
static void a_source_crowds_out_only_itself(void **state)
{
    struct prefill p;
    struct report r;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    int silent[40];

    (void)state;
    prefill_start(&p);
    for (int i = 0; i < 40; i++) {
        silent[i] = raw_connect("127.0.0.1", p.address);
        assert_true(silent[i] >= 0);
    }
    r = report_until(&p, source_full, 20000);
    assert_true(source_full(&r));
    agent = decode_agent(NULL);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    assert_int_equal(read_block5(agent, peer, &p.token), KVX_OK);
    r = prefill_report(&p);
    assert_int_equal(r.stats.peers_refused, 0);
    for (int i = 0; i < 40; i++)
        close(silent[i]);
    r = report_until(&p, one_peer_left, 20000);
    assert_int_equal(r.stats.handshakes, 0);
    assert_int_equal(r.stats.peers_connected, 1);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    prefill_end(&p);
}

/* `n` authenticated connections from `source` (an address of this host) to `address`, open
 * and silent: an insider holding slots. ZeroMQ reconnects one the prefill closes, as a
 * persistent attacker would. Returns their context, for insider_end. */
static void *insider_start(const char *source, const char *address, int n, void **sockets)
{
    struct auth_keys keys;
    void *zmq = zmq_ctx_new();
    char endpoint[2 * ADDRESS_SIZE + 16];
    int linger = 0;

    assert_int_equal(auth_keys_derive(test_auth_key, &keys), KVX_OK);
    snprintf(endpoint, sizeof(endpoint), "tcp://%s:0;%s", source, address);
    for (int i = 0; i < n; i++) {
        sockets[i] = zmq_socket(zmq, ZMQ_DEALER);
        zmq_setsockopt(sockets[i], ZMQ_LINGER, &linger, sizeof(linger));
        assert_int_equal(auth_client_socket(sockets[i], &keys), KVX_OK);
        assert_int_equal(zmq_connect(sockets[i], endpoint), 0);
    }
    return zmq;
}

static void insider_end(void *zmq, void **sockets, int n)
{
    for (int i = 0; i < n; i++)
        zmq_close(sockets[i]);
    zmq_ctx_term(zmq);
}

static bool four_peers(const struct report *r)
{
    return r->stats.peers_connected == 4 && r->stats.handshakes == 0;
}

/* Issue 36 finding 7: an insider's 4 idle connections from 127.0.0.2 filled max_peers (4) and
 * every new peer was refused, for as long as it kept them. Now a full listener closes one
 * connection of the address that holds two more than the newcomer's: the honest decode agent
 * from 127.0.0.1 connects and reads, an insider's connection was closed for it, and the
 * insider's reconnects are refused (its address no longer holds two more than the busiest). */
static void an_address_holding_every_slot_gives_one_up(void **state)
{
    struct prefill p;
    struct report r;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    void *sockets[4];
    void *insider;

    (void)state;
    config.max_peers = 4;
    prefill_start(&p);
    config.max_peers = 64;
    insider = insider_start("127.0.0.2", p.address, 4, sockets);
    r       = report_until(&p, four_peers, 20000);
    assert_true(four_peers(&r));
    agent = decode_agent(NULL);
    assert_int_equal(kvx_agent_connect(agent, p.address, &peer), KVX_OK);
    assert_int_equal(read_block5(agent, peer, &p.token), KVX_OK);
    r = prefill_report(&p);
    assert_true(r.stats.peers_evicted >= 1);
    assert_true(r.stats.peers_connected <= 4);
    insider_end(insider, sockets, 4);
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    r = report_until(&p, no_connections, 20000);
    assert_int_equal(r.stats.peers_connected, 0);
    prefill_end(&p);
}

static bool named_77(const struct report *r)
{
    return r->named_77 > 0;
}

/* Issue 22 finding 9: a bad greeting sent from 127.0.0.77 by a peer that closes at once is
 * logged naming 127.0.0.77 (it was "?": the address was read after the peer had gone), once,
 * however often it comes back. The monitor's thread names a descriptor within microseconds
 * of its accept, a race it can in principle lose, so the stranger tries again every 100 ms
 * for up to 20 s; how many tries it took is printed. */
static void a_bad_greeting_is_logged_naming_its_address(void **state)
{
    static const char greeting[] = "\xff\0\0\0\0\0\0\0\x01\x7f\x03\0NULL garbage";
    struct prefill p;
    struct report r;
    uint64_t end;
    int tries = 0;

    (void)state;
    prefill_start(&p);
    end = clock_ms() + 20000;
    do {
        int fd = raw_connect("127.0.0.77", p.address);
        struct pollfd item = {.fd = fd, .events = POLLOUT};

        assert_true(fd >= 0);
        assert_int_equal(poll(&item, 1, 10000), 1); /* connected */
        assert_int_equal(write(fd, greeting, sizeof(greeting) - 1), sizeof(greeting) - 1);
        close(fd);
        tries++;
        r = report_until(&p, named_77, 100);
    } while (r.named_77 == 0 && clock_ms() < end);
    print_message("named after %d tries\n", tries);
    assert_int_equal(r.named_77, 1);
    for (int i = 0; i < 10; i++) { /* again: counted, not logged again */
        int fd = raw_connect("127.0.0.77", p.address);
        struct pollfd item = {.fd = fd, .events = POLLOUT};

        assert_int_equal(poll(&item, 1, 10000), 1);
        assert_int_equal(write(fd, greeting, sizeof(greeting) - 1), sizeof(greeting) - 1);
        close(fd);
    }
    end = clock_ms() + 20000;
    do
        r = prefill_report(&p);
    while (r.stats.auth_refused < (uint64_t)tries + 10 && clock_ms() < end);
    assert_true(r.stats.auth_refused >= (uint64_t)tries + 10);
    assert_int_equal(r.named_77, 1);
    prefill_end(&p);
}

static bool burst_accepted(const struct report *r)
{
    return r->stats.handshakes >= BURST_SOURCES;
}

/* Issue 36 finding 10: bad greetings from BURST_SOURCES addresses at once queue more refusal
 * lines than one turn writes (LOOP_LOG_LINES); the dropped ones' addresses were marked logged
 * all the same and never named (18 of 300). Now an address is marked only by a line written.
 * Each round, every address not named yet connects; once all are accepted (the gate has
 * their addresses), P's loop pauses, all send the bad greeting of finding 9 and see ZeroMQ
 * close, and P's next turn meets every refusal at once. Every address is named exactly once
 * within a few rounds. */
static void every_refused_address_is_named_once(void **state)
{
    static const char greeting[] = "\xff\0\0\0\0\0\0\0\x01\x7f\x03\0NULL garbage";
    struct prefill p;
    struct report r;
    int fds[BURST_SOURCES];
    uint64_t expected = 0;
    int rounds        = 0;
    int named;

    (void)state;
    prefill_start(&p);
    r = prefill_report(&p);
    do {
        for (int i = 0; i < BURST_SOURCES; i++) {
            char source[32];
            struct pollfd item;

            fds[i] = -1;
            if (r.named_burst[i] != 0)
                continue;
            snprintf(source, sizeof(source), "127.0.3.%d", i + 1);
            fds[i] = raw_connect(source, p.address);
            item   = (struct pollfd){.fd = fds[i], .events = POLLOUT};
            assert_int_equal(poll(&item, 1, 10000), 1); /* connected */
            expected++;
        }
        r = report_until(&p, burst_accepted, 20000);
        /* with P's loop paused, ZeroMQ refuses every greeting: its events wait for one turn */
        assert_int_equal(write(p.go, "p", 1), 1);
        for (int i = 0; i < BURST_SOURCES; i++) {
            if (fds[i] >= 0)
                assert_int_equal(write(fds[i], greeting, sizeof(greeting) - 1),
                                 sizeof(greeting) - 1);
        }
        for (int i = 0; i < BURST_SOURCES; i++) {
            struct pollfd item = {.fd = fds[i], .events = POLLIN};
            char bytes[64];

            while (fds[i] >= 0 && poll(&item, 1, 10000) == 1 &&
                   read(fds[i], bytes, sizeof(bytes)) > 0) /* the greeting, then the close */
                ;
        }
        assert_int_equal(write(p.go, "r", 1), 1);
        for (uint64_t end = clock_ms() + 20000;
             r = prefill_report(&p), r.stats.auth_refused < expected && clock_ms() < end;)
            nanosleep(&(struct timespec){0, 10000000}, NULL);
        assert_true(r.stats.auth_refused >= expected);
        for (int i = 0; i < BURST_SOURCES; i++) {
            if (fds[i] >= 0)
                close(fds[i]);
        }
        named = 0;
        for (int i = 0; i < BURST_SOURCES; i++)
            named += r.named_burst[i] != 0;
        rounds++;
        print_message("round %d: %d of %d addresses named\n", rounds, named, BURST_SOURCES);
    } while (named < BURST_SOURCES && rounds < 10);
    assert_int_equal(named, BURST_SOURCES);
    for (int i = 0; i < BURST_SOURCES; i++)
        assert_int_equal(r.named_burst[i], 1);
    prefill_end(&p);
}

/* Secure by default: no secret and not insecure, insecure on a non-loopback address, and
 * both at once are refused; insecure on loopback is allowed. */
static void an_agent_needs_a_secret_or_loopback(void **state)
{
    kvx_agent_t *agent = NULL;
    kvx_layout_t *l;

    (void)state;
    assert_int_equal(layout_from_quoted(layout, &l), KVX_OK);
    assert_int_equal(kvx_agent_create(l, NULL, &agent), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "no auth key"));
    assert_int_equal(
        kvx_agent_create(l,
                         &(kvx_agent_params_t){.field_mask = KVX_AGENT_PARAM_FIELD_INSECURE |
                                                             KVX_AGENT_PARAM_FIELD_LISTEN,
                                               .insecure = true,
                                               .listen   = "0.0.0.0:0"},
                         &agent),
        KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "loopback only"));
    assert_int_equal(
        kvx_agent_create(l,
                         &(kvx_agent_params_t){.field_mask = KVX_AGENT_PARAM_FIELD_INSECURE |
                                                             KVX_AGENT_PARAM_FIELD_AUTH_KEY,
                                               .insecure = true,
                                               .auth_key = test_auth_key},
                         &agent),
        KVX_ERR_INVALID);
    assert_int_equal(
        kvx_agent_create(l,
                         &(kvx_agent_params_t){.field_mask = KVX_AGENT_PARAM_FIELD_INSECURE |
                                                             KVX_AGENT_PARAM_FIELD_LISTEN,
                                               .insecure = true,
                                               .listen   = "127.0.0.1:0"},
                         &agent),
        KVX_OK);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);
    kvx_layout_destroy(l);
}

/* The key file: created new with mode 0600 (never over an existing file), read back; a file
 * others may read, a FIFO and a file of another shape are refused. */
/* Issue 24: which key file a front end uses is the library's answer alone: the file given,
 * else the one KVX_AUTH_FILE names, an empty string counting as none. */
static void the_key_file_is_the_one_given_else_the_environment_s(void **state)
{
    (void)state;
    assert_string_equal(KVX_AUTH_FILE_ENV, "KVX_AUTH_FILE");
    assert_int_equal(setenv(KVX_AUTH_FILE_ENV, "/from/env.key", 1), 0);
    assert_string_equal(kvx_auth_file("/given.key"), "/given.key");
    assert_string_equal(kvx_auth_file(NULL), "/from/env.key");
    assert_string_equal(kvx_auth_file(""), "/from/env.key");
    assert_int_equal(setenv(KVX_AUTH_FILE_ENV, "", 1), 0);
    assert_null(kvx_auth_file(NULL));
    assert_int_equal(unsetenv(KVX_AUTH_FILE_ENV), 0);
    assert_null(kvx_auth_file(NULL));
    assert_null(kvx_auth_file(""));
    assert_string_equal(kvx_auth_file("/given.key"), "/given.key");
}

static void the_key_file_is_private_and_strict(void **state)
{
    char dir[] = "/tmp/kvx-key-XXXXXX";
    char path[64];
    char fifo[64];
    uint8_t key[KVX_AUTH_KEY_LEN];
    uint8_t again[KVX_AUTH_KEY_LEN];
    struct stat st;
    FILE *f;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/key", dir);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    assert_int_equal(kvx_auth_key_create(path), KVX_OK);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(kvx_auth_key_load(path, key), KVX_OK);
    assert_int_equal(kvx_auth_key_create(path), KVX_ERR_IO); /* exists: kept */
    assert_int_equal(kvx_auth_key_load(path, again), KVX_OK);
    assert_memory_equal(key, again, sizeof(key));
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(kvx_auth_key_load(path, key), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "chmod 600"));
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(kvx_auth_key_load(fifo, key), KVX_ERR_INVALID); /* and no hang */
    assert_int_equal(unlink(path), 0);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("kvx-auth-key 1 not hex\n", f);
    fclose(f);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(kvx_auth_key_load(path, key), KVX_ERR_INVALID);
    unlink(path);
    unlink(fifo);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(an_agent_needs_a_secret_or_loopback),
        cmocka_unit_test(the_key_file_is_private_and_strict),
        cmocka_unit_test(the_key_file_is_the_one_given_else_the_environment_s),
        cmocka_unit_test(a_peer_without_the_secret_gets_nothing),
        cmocka_unit_test(forged_pushes_are_refused_and_change_no_byte),
        cmocka_unit_test(a_wrong_token_releases_nothing),
        cmocka_unit_test(floods_stay_within_the_memory_bound),
        cmocka_unit_test(connections_past_max_peers_are_refused),
        cmocka_unit_test(silent_sockets_do_not_lock_peers_out),
        cmocka_unit_test(a_source_crowds_out_only_itself),
        cmocka_unit_test(an_address_holding_every_slot_gives_one_up),
        cmocka_unit_test(a_bad_greeting_is_logged_naming_its_address),
        cmocka_unit_test(every_refused_address_is_named_once),
    };

    setenv("UCX_NET_DEVICES", "lo", 0);
    /* the writers' pushes, as across hosts: on one host a push would go as a read */
    setenv("KVX_PUSH_ON_ONE_HOST", "writers", 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

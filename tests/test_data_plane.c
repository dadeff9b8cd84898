/* test_data_plane.c: what an insider (a process with the deployment's secret, so with a
 * prefill agent's metadata) can do to that prefill process's memory over UCX (issue 22,
 * finding 1). It runs as another OS user, as an insider on another host would be: same-host
 * transports (CMA, shared memory) are the OS user boundary's and nothing kvx can add to.
 * With UCX's own calls it puts over a block and at an address outside every storage, gets
 * from such an address and past the storage's end; with kvx's protocol it reads past the end,
 * writes with the read grant, and reads eight ranges in one message (served, every byte
 * compared) and eight with one past the end (all refused). The prefill process stays alive,
 * its pattern intact, kvx's refusals are counted, and an honest verified read follows. */
#include "auth.h"
#include "clock.h"
#include "core.h"
#include "prefill.h"
#include "sidechan.h"
#include "transport.h"

#include <ucp/api/ucp.h>
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
#include <unistd.h>
#include <cmocka.h>

#define PAGE     4096
#define NOBODY   65534
#define ATTACK_S 2
#define GRANT_BYTES                                                                                \
    24 /* a grant's prefix and token; a UCX key may follow (transport.c) */ /* how long the        \
                                                                               insider progresses  \
                                                                               its own UCX calls   \
                                                                               before giving up */

static const char layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 65536}], 'views': ["
    "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 4096, 'stride': 4096,"
    " 'num_blocks': 16}]}";

static const char *transports; /* the prefill's UCX_TLS */
/* The insider's: another user cannot attach the prefill's shared memory (UCX fails to connect
 * over it), so it picks TCP, which the prefill's default list accepts too. */
#define INSIDER_TLS "tcp"

static uint8_t pattern_byte(uint64_t i)
{
    return (uint8_t)(i * 131 + 7);
}

/* What the prefill process reports on 's'. */
struct report {
    kvx_agent_stats_t stats;
    bool intact;
};

/* The prefill: its storage holds the pattern; request 7 holds block 5; reports on 's',
 * exits on 'q'. */
static int run_prefill(int ready, int go)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_LISTEN |
                                               KVX_AGENT_PARAM_FIELD_TRANSPORTS,
                                 .listen     = "127.0.0.1:0",
                                 .transports = transports};
    uint64_t block            = 5;
    kvx_group_ids_t group     = {&block, 1};
    kvx_agent_t *agent;
    kvx_token_t token;
    uint64_t size;
    uint8_t *bytes;

    alarm(120);
    signal(SIGSEGV, SIG_DFL); /* a crash is this process's death, not cmocka's test's */
    if (agent_from_quoted(layout, &params, &agent) != KVX_OK)
        return 10;
    bytes = kvx_agent_storage(agent, 0, &size);
    for (uint64_t i = 0; i < size; i++)
        bytes[i] = pattern_byte(i);
    if (hold_new(agent, 7, &group, 1, 1, &token) != KVX_OK)
        return 11;
    report_serving(ready, agent);
    report_token(ready, &token);
    for (;;) {
        struct pollfd item = {.fd = go, .events = POLLIN};
        struct report r    = {.intact = true};
        char c;

        kvx_agent_progress(agent, 5);
        if (poll(&item, 1, 0) <= 0)
            continue;
        if (read(go, &c, 1) != 1 || c == 'q')
            break;
        kvx_agent_stats(agent, &r.stats, sizeof(r.stats));
        for (uint64_t i = 0; i < size; i++)
            r.intact = r.intact && bytes[i] == pattern_byte(i);
        if (write(ready, &r, sizeof(r)) != sizeof(r))
            return 12;
    }
    return kvx_agent_destroy(agent) == KVX_OK ? 0 : 13;
}

/* ---- the insider, a forked process of another user ---- */

struct insider {
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_ep_h ep;
    ucp_mem_h memh;
    ucp_rkey_h rkey;
    uint8_t buf[PAGE];
};

static void insider_done(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    (void)user_data;
    ucp_request_free(request);
}

/* UCX's own calls, as any UCX program with the victim's worker address could make them, with
 * the UCX key a grant carries after its 24 bytes (for a same-host mapping) when there is one,
 * else a key of its own memory in place of the one it was not given. */
static int insider_ucx(const void *address, uint64_t base, uint64_t size, kvx_blob_t grant)
{
    ucp_params_t params       = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                                 .features   = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    ucp_worker_params_t wp    = {.field_mask = 0};
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address    = address};
    ucp_mem_map_params_t mp   = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                               UCP_MEM_MAP_PARAM_FIELD_LENGTH};
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.send = insider_done};
    struct insider in;
    ucp_config_t *config;
    void *packed;
    size_t packed_size;
    const uint64_t targets[][2] = {
        {base + 5 * PAGE, 1}, /* a put over block 5 */
        {0x1000, 1},          /* a put outside every registration */
        {0x1000, 0},          /* a get from there */
        {base + size, 0},     /* a get past the storage's end */
    };

    memset(in.buf, 0xee, sizeof(in.buf));
    if (ucp_config_read(NULL, NULL, &config) != UCS_OK ||
        ucp_config_modify(config, "TLS", INSIDER_TLS) != UCS_OK ||
        ucp_init(&params, config, &in.context) != UCS_OK)
        return 20;
    ucp_config_release(config);
    mp.address = in.buf;
    mp.length  = sizeof(in.buf);
    if (ucp_worker_create(in.context, &wp, &in.worker) != UCS_OK)
        return 21;
    /* Issue 36 finding 1: the owner gives UCX no TCP (kvx's links carry it), so UCX over TCP
     * reaches nothing of it: no UCT listener, no parser of its lengths, to attack. */
    if (ucp_ep_create(in.worker, &ep_params, &in.ep) != UCS_OK) {
        printf("insider: UCX over TCP cannot reach the owner at all\n");
        fflush(stdout);
        ucp_worker_destroy(in.worker);
        ucp_cleanup(in.context);
        return 0;
    }
    if (ucp_mem_map(in.context, &mp, &in.memh) != UCS_OK ||
        ucp_rkey_pack(in.context, in.memh, &packed, &packed_size) != UCS_OK ||
        ucp_ep_rkey_unpack(
            in.ep, grant.size > GRANT_BYTES ? (const uint8_t *)grant.data + GRANT_BYTES : packed,
            &in.rkey) != UCS_OK)
        return 21; /* the attack must really be made */
    printf("insider: UCX calls with %s\n",
           grant.size > GRANT_BYTES ? "the key in the grant" : "a key of its own");
    for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++) {
        ucs_status_ptr_t sp = targets[i][1]
                                  ? ucp_put_nbx(in.ep, in.buf, PAGE, targets[i][0], in.rkey, &rp)
                                  : ucp_get_nbx(in.ep, in.buf, PAGE, targets[i][0], in.rkey, &rp);

        printf("insider: UCX %s at 0x%" PRIx64 ": %s\n", targets[i][1] ? "put" : "get",
               targets[i][0],
               UCS_PTR_IS_ERR(sp) ? ucs_status_string(UCS_PTR_STATUS(sp)) : "posted");
    }
    fflush(stdout);
    for (uint64_t deadline = clock_ms() + ATTACK_S * 1000; clock_ms() < deadline;)
        ucp_worker_progress(in.worker);
    /* Never waits for what the prefill does not answer: the worker goes with it. */
    ucp_rkey_buffer_release(packed);
    ucp_rkey_destroy(in.rkey);
    ucp_worker_destroy(in.worker);
    ucp_mem_unmap(in.context, in.memh);
    ucp_cleanup(in.context);
    return 0;
}

static void op_finished(void *arg, struct transport_op *op)
{
    (void)op;
    *(bool *)arg = true;
}

/* The reads or writes of `pairs` on `conn` into or from `local`, in one post (small reads
 * then travel as one message), waited for: KVX_OK, the refusal's status, or
 * KVX_ERR_PEER_TIMEOUT when no answer came (a refusal is an answer). */
static kvx_status_t move(struct transport_conn *conn, bool put, const kvx_pair_t *pairs,
                         size_t count, uint8_t *local, uint64_t remote_base)
{
    void *local_bases[1]            = {local};
    kvx_mem_type_t local_mems[1]    = {KVX_MEM_DRAM};
    uint64_t remote_bases[1]        = {remote_base};
    struct transport_targets target = {local_bases, local_mems, remote_bases, false};
    bool finished                   = false;
    struct transport_op *op;
    kvx_status_t status;

    if (transport_op_create(conn, op_finished, &finished, &op) != KVX_OK)
        return KVX_ERR_NO_MEMORY;
    status = transport_rma_post(op, put, pairs, count, &target);
    transport_op_arm(op);
    for (uint64_t deadline = clock_ms() + 10000;
         status == KVX_OK && !finished && clock_ms() < deadline;)
        transport_conn_progress(conn);
    if (status == KVX_OK)
        status = finished ? transport_op_status(op, "insider") : KVX_ERR_PEER_TIMEOUT;
    printf("insider: kvx %s of %zu at %" PRIu64 ": %s\n", put ? "write" : "read", count,
           pairs->remote_offset, status == KVX_OK ? "served" : kvx_errmsg());
    fflush(stdout);
    transport_op_release(op);
    return status;
}

static kvx_status_t move_one(struct transport_conn *conn, bool put, const kvx_pair_t *pair,
                             uint8_t *local, uint64_t remote_base)
{
    return move(conn, put, pair, 1, local, remote_base);
}

/* Reads of `len` bytes at the start of every other block in one post: 8 ranges (one message;
 * its answer eager for a few bytes, by rendezvous for pages), then the same with one range
 * past the storage's end, which refuses them all. 0 when the first read got the pattern and
 * the second was refused. */
static int insider_vectored(struct transport_conn *conn, const kvx_registration_info_t *reg,
                            uint64_t len)
{
    static uint8_t local[8 * PAGE];
    kvx_pair_t pairs[8];

    for (uint64_t i = 0; i < 8; i++)
        pairs[i] = (kvx_pair_t){0, 0, i * len, 2 * i * PAGE, len};
    memset(local, 0xee, sizeof(local));
    if (move(conn, false, pairs, 8, local, reg->base) != KVX_OK)
        return 34;
    for (uint64_t i = 0; i < 8 * len; i++) {
        if (local[i] != pattern_byte(2 * (i / len) * PAGE + i % len))
            return 35;
    }
    pairs[5].remote_offset = reg->size;
    return move(conn, false, pairs, 8, local, reg->base) == KVX_ERR_IO ? 0 : 36;
}

/* A connection to the worker at `address` with one storage at `base` that `grant` reaches,
 * claimed larger than any: the owner's checks, not ours, must stop what goes past its end. */
static struct transport_conn *conn_with_grant(struct transport *t, const kvx_blob_t *address,
                                              kvx_blob_t grant, uint64_t base)
{
    struct transport_remote_mem mem = {grant, base, (uint64_t)1 << 40, false};
    struct transport_conn *conn     = NULL;

    if (transport_conn_create(t, address->data, address->size, "127.0.0.1", &mem, 1, &conn) != KVX_OK)
        printf("insider: %s\n", kvx_errmsg());
    return conn;
}

/* kvx's protocol with the grant the metadata carries: a read past the storage's end, a write
 * over block 5 and one past the end (the read grant allows no write). Each must be refused. */
static int insider_kvx(const kvx_metadata_info_t *info, kvx_registration_info_t *reg)
{
    uint8_t local[PAGE];
    const kvx_pair_t past_end    = {0, 0, 0, reg->size, PAGE};
    const kvx_pair_t over_block5 = {0, 0, 0, 5 * PAGE, PAGE};
    struct transport *t;
    struct transport_conn *conn;
    int refused;
    int status;

    if (transport_create(INSIDER_TLS, false, &t) != KVX_OK)
        return 30;
    if ((conn = conn_with_grant(t, &info->transport_address, reg->remote_key, reg->base)) == NULL)
        return 31;
    memset(local, 0xee, sizeof(local));
    refused = (move_one(conn, false, &past_end, local, reg->base) == KVX_ERR_IO) +
              (move_one(conn, true, &over_block5, local, reg->base) == KVX_ERR_IO) +
              (move_one(conn, true, &past_end, local, reg->base) == KVX_ERR_IO);
    status = refused == 3 ? insider_vectored(conn, reg, 64) : 33;
    if (status == 0)
        status = insider_vectored(conn, reg, PAGE);
    transport_conn_destroy(conn);
    transport_destroy(t);
    return status;
}

static int run_insider(const char *address)
{
    struct auth_keys keys;
    void *zmq = zmq_ctx_new();
    kvx_agent_t *agent;
    void *bytes;
    size_t size;
    kvx_metadata_t *md;
    kvx_metadata_info_t info;
    kvx_registration_info_t reg;
    int status;

    alarm(60);
    signal(SIGSEGV, SIG_DFL); /* a crash is this process's death, not cmocka's test's */
    if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        return 40;
    if (agent_from_quoted(layout, NULL, &agent) != KVX_OK ||
        auth_keys_derive(test_auth_key, &keys) != KVX_OK ||
        sidechan_fetch(zmq, address, &keys, VERB_METADATA, 1 << 24, 10000, &bytes, &size) !=
            KVX_OK ||
        kvx_metadata_unpack(bytes, size, kvx_agent_regions(agent), KVX_MODE_PULL, &md) != KVX_OK)
        return 41;
    kvx_metadata_get_info(md, &info);
    if (kvx_metadata_registration(md, 0, &reg) != KVX_OK)
        return 42;
    status = insider_kvx(&info, &reg);
    if (status == 0)
        status = insider_ucx(info.transport_address.data, reg.base, reg.size, reg.remote_key);
    kvx_metadata_destroy(md);
    free(bytes);
    kvx_agent_destroy(agent);
    zmq_ctx_term(zmq);
    return status;
}

/* ---- the other direction: a decode agent's storage that prefills may push into ---- */

/* What the owner publishes, as push metadata carries it, and what it reports at the end. */
struct owner_grants {
    uint8_t address[2048];
    size_t address_size;
    uint8_t read_grant[1024];
    uint8_t write_grant[1024];
    size_t read_size;
    size_t write_size;
    uint64_t base;
};

struct owner_report {
    struct transport_data_counters counters;
    bool block3_written; /* the honest write's bytes */
    bool block3_intact;  /* or still the pattern */
    bool rest_intact;    /* every other byte still the pattern */
};

#define OWNER_SIZE (16 * PAGE)

static const char *owner_tls; /* the owner's transports */

/* The owner: a served transport (tcp) with one storage of the pattern; publishes its worker
 * address, grants and base on `ready`, serves until a byte on `go`, then reports. */
static int run_owner(int ready, int go)
{
    struct owner_grants g = {0};
    struct owner_report r = {.block3_written = true, .block3_intact = true, .rest_intact = true};
    struct transport *t;
    struct transport_mem *mem;
    uint8_t *bytes;
    void *buf;
    size_t size;

    alarm(120);
    if (transport_create(owner_tls, false, &t) != KVX_OK ||
        transport_listen(t, "127.0.0.1") != KVX_OK || /* links, where its list has tcp */
        transport_mem_map(t, NULL, OWNER_SIZE, &mem) != KVX_OK)
        return 50;
    bytes = transport_mem_address(mem);
    for (uint64_t i = 0; i < OWNER_SIZE; i++)
        bytes[i] = pattern_byte(i);
    g.base = (uint64_t)(uintptr_t)bytes;
    for (int writable = 0; writable < 2; writable++) {
        if (transport_mem_pack_rkey(t, mem, writable, &buf, &size) != KVX_OK ||
            size > sizeof(g.read_grant))
            return 51;
        memcpy(writable ? g.write_grant : g.read_grant, buf, size);
        *(writable ? &g.write_size : &g.read_size) = size;
        free(buf);
    }
    if (transport_worker_address(t, &buf, &g.address_size) != KVX_OK ||
        g.address_size > sizeof(g.address))
        return 52;
    memcpy(g.address, buf, g.address_size);
    free(buf);
    if (write(ready, &g, sizeof(g)) != sizeof(g))
        return 53;
    for (struct pollfd item = {.fd = go, .events = POLLIN}; poll(&item, 1, 0) == 0;)
        transport_progress(t);
    r.counters = *transport_data_counters(t);
    for (uint64_t i = 0; i < OWNER_SIZE; i++) {
        if (i / PAGE == 3) {
            r.block3_written = r.block3_written && bytes[i] == 0xab;
            r.block3_intact  = r.block3_intact && bytes[i] == pattern_byte(i);
        } else {
            r.rest_intact = r.rest_intact && bytes[i] == pattern_byte(i);
        }
    }
    if (write(ready, &r, sizeof(r)) != sizeof(r))
        return 54;
    transport_mem_unmap(t, mem);
    transport_destroy(t);
    return 0;
}

/* A prefill that a decode agent registered with holds its write grant; one that did not (or an
 * insider who read only its pull metadata) holds at most the read grant. With UCX's own puts,
 * the read grant and writes past the storage's end, nothing of the owner changes; the write
 * grant writes inside the storage, and the owner sees exactly those bytes. */
struct owner {
    pid_t pid;
    int ready;
    int go;
    struct owner_grants grants;
};

/* Forks an owner on `tls` and reads what it publishes. */
static void owner_start(struct owner *o, const char *tls)
{
    int ready[2];
    int go[2];

    owner_tls = tls;
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    fflush(stdout);
    o->pid = fork();
    assert_true(o->pid >= 0);
    if (o->pid == 0) {
        close(ready[0]);
        close(go[1]);
        _exit(run_owner(ready[1], go[0]));
    }
    close(ready[1]);
    close(go[0]);
    o->ready = ready[0];
    o->go    = go[1];
    assert_int_equal(read(o->ready, &o->grants, sizeof(o->grants)), sizeof(o->grants));
}

/* Stops it; what it reports. */
static struct owner_report owner_end(struct owner *o)
{
    struct owner_report r;
    int status;

    assert_int_equal(write(o->go, "q", 1), 1);
    assert_int_equal(read(o->ready, &r, sizeof(r)), sizeof(r));
    assert_int_equal(waitpid(o->pid, &status, 0), o->pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(o->ready);
    close(o->go);
    return r;
}

/* A prefill that a decode agent registered with holds its write grant; one that did not (or an
 * insider who read only its pull metadata) holds at most the read grant. With UCX's own puts,
 * the read grant and writes past the storage's end, nothing of the owner changes; the write
 * grant writes inside the storage, and the owner sees exactly those bytes. */
static void pushes_write_only_with_the_write_grant_inside_the_storage(void **state)
{
    struct owner o;
    struct owner_report r;
    struct transport *t;
    struct transport_conn *reader;
    struct transport_conn *writer;
    uint8_t local[PAGE];
    const kvx_pair_t block3      = {0, 0, 0, 3 * PAGE, PAGE};
    const kvx_pair_t past_end    = {0, 0, 0, OWNER_SIZE, PAGE};
    const struct owner_grants *g = &o.grants;

    (void)state;
    owner_start(&o, "tcp");
    assert_int_equal(
        insider_ucx(g->address, g->base, OWNER_SIZE, (kvx_blob_t){g->read_grant, g->read_size}), 0);
    assert_int_equal(transport_create("tcp", false, &t), KVX_OK);
    reader = conn_with_grant(t, &(kvx_blob_t){g->address, g->address_size},
                             (kvx_blob_t){g->read_grant, g->read_size}, g->base);
    writer = conn_with_grant(t, &(kvx_blob_t){g->address, g->address_size},
                             (kvx_blob_t){g->write_grant, g->write_size}, g->base);
    assert_non_null(reader);
    assert_non_null(writer);
    memset(local, 0xab, sizeof(local));
    assert_int_equal(move_one(reader, true, &block3, local, g->base), KVX_ERR_IO);
    assert_int_equal(move_one(writer, true, &past_end, local, g->base), KVX_ERR_IO);
    assert_int_equal(move_one(writer, true, &block3, local, g->base), KVX_OK);
    transport_conn_destroy(reader);
    transport_conn_destroy(writer);
    transport_destroy(t);

    r = owner_end(&o);
    assert_true(r.block3_written);
    assert_true(r.rest_intact);
    assert_int_equal(r.counters.writes, 1);
    assert_int_equal(r.counters.refused, 2);
}

/* A keyed owner (no TCP: UCX keys, not grants) serves no kvx request at all: its tokens are
 * zeros that nobody was given, and a grant forged of zeros is refused. */
static void a_keyed_owner_serves_no_forged_grant(void **state)
{
    struct owner o;
    struct owner_report r;
    struct transport *t;
    struct transport_conn *conn;
    uint8_t local[PAGE];
    uint8_t forged[8 + 16]       = "kvxgrnt1"; /* the grant's prefix, then a token of zeros */
    const kvx_pair_t block3      = {0, 0, 0, 3 * PAGE, PAGE};
    const struct owner_grants *g = &o.grants;

    (void)state;
    owner_start(&o, "sm,cma");
    assert_int_equal(transport_create("sm,cma", false, &t), KVX_OK);
    conn = conn_with_grant(t, &(kvx_blob_t){g->address, g->address_size},
                           (kvx_blob_t){forged, sizeof(forged)}, g->base);
    assert_non_null(conn);
    memset(local, 0xab, sizeof(local));
    assert_int_equal(move_one(conn, true, &block3, local, g->base), KVX_ERR_IO);
    assert_int_equal(move_one(conn, false, &block3, local, g->base), KVX_ERR_IO);
    transport_conn_destroy(conn);
    transport_destroy(t);
    r                = owner_end(&o);
    r.block3_written = !r.block3_written; /* nothing was written: block 3 keeps its pattern */
    assert_true(r.rest_intact);
    assert_int_equal(r.counters.writes + r.counters.reads, 0);
    assert_int_equal(r.counters.refused, 2);
}

/* ---- the test ---- */

static void an_insider_neither_writes_nor_reads_outside_its_grant(const char *tls)
{
    char address[ADDRESS_SIZE];
    int go[2];
    int ready;
    int status;
    pid_t prefill;
    pid_t insider;
    struct report r;
    kvx_token_t token;
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TRANSPORTS, .transports = tls};
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    uint64_t block        = 5;
    kvx_group_ids_t group = {&block, 1};
    kvx_request_t request;
    const uint8_t *got;

    transports = tls;
    assert_int_equal(pipe(go), 0);
    prefill = start_prefill(run_prefill, go[0], address, &ready);
    close(go[0]);
    token = read_token(ready);
    fflush(stdout);
    insider = fork();
    assert_true(insider >= 0);
    if (insider == 0)
        _exit(run_insider(address));
    assert_int_equal(waitpid(insider, &status, 0), insider);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    if (waitpid(prefill, &status, WNOHANG) == prefill) /* it must have survived */
        fail_msg("the prefill died: %s %d", WIFSIGNALED(status) ? "signal" : "exit",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    assert_int_equal(write(go[1], "s", 1), 1);
    assert_int_equal(read(ready, &r, sizeof(r)), sizeof(r));
    assert_true(r.intact);
    assert_true(r.stats.data_refused >= 5); /* three reads and writes, two vectored reads */
    print_message("%s: the prefill refused %" PRIu64 " of the insider's requests\n", tls,
                  r.stats.data_refused);

    /* An honest decode agent reads block 5, every byte compared. */
    assert_int_equal(agent_from_quoted(layout, &params, &agent), KVX_OK);
    assert_int_equal(kvx_agent_connect(agent, address, &peer), KVX_OK);
    request = (kvx_request_t){&group, 1, NULL, 0, &token};
    assert_int_equal(kvx_read(agent, &peer, 1, 7, &request, NULL), KVX_OK);
    got = (const uint8_t *)kvx_agent_storage(agent, 0, NULL) + 5 * PAGE;
    for (uint64_t i = 0; i < PAGE; i++)
        assert_int_equal(got[i], pattern_byte(5 * PAGE + i));
    kvx_peer_destroy(peer);
    assert_int_equal(kvx_agent_destroy(agent), KVX_OK);

    assert_int_equal(write(go[1], "q", 1), 1);
    assert_int_equal(waitpid(prefill, &status, 0), prefill);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(go[1]);
    close(ready);
}

static void over_tcp(void **state)
{
    (void)state;
    an_insider_neither_writes_nor_reads_outside_its_grant("tcp");
}

static void over_the_default_transports(void **state)
{
    (void)state;
    an_insider_neither_writes_nor_reads_outside_its_grant("sm,cma,tcp");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(over_tcp),
        cmocka_unit_test(over_the_default_transports),
        cmocka_unit_test(pushes_write_only_with_the_write_grant_inside_the_storage),
        cmocka_unit_test(a_keyed_owner_serves_no_forged_grant),
    };

    setenv("UCX_NET_DEVICES", "lo", 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

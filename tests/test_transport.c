/* test_transport.c: the UCX transport between real processes on loopback: gets and puts with
 * every byte compared, an active message at the main worker, bounded closes to dead peers. */
#include "clock.h"
#include "transport.h"
#include "transport_private.h" /* white-box: the close window of transport_log.c */

#include <ucs/config/global_opts.h>
#ifndef asm
#define asm __asm__ /* UCX 1.22's log header spells inline assembly `asm` (transport_log.c) */
#endif
#include <ucs/debug/log_def.h>

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#define STORAGE_SIZE (4u << 20)  /* bytes on each side */
#define BLOCK        (64u << 10) /* bytes per block */
#define NUM_BLOCKS   (STORAGE_SIZE / BLOCK)
#define TIMEOUT_MS   10000 /* for what must complete: a hang fails instead of blocking CI */
#define TARGET_MS    30000 /* a target process ends itself after this long */
#define STALL_MS     300   /* progress towards a stopped peer before giving up */
#define DESTROY_MAX  2.0   /* seconds a destroy may take: a bound on a hang, not a timing */
#define AM_DONE      1
#define COPY_SLICE   (1u << 20) /* bytes of queued copies a progress loop makes at a time */

/* The byte the target holds at `offset` before any put, and the byte the parent puts. */
static uint8_t p_pattern(uint64_t offset)
{
    return (uint8_t)(offset * 131u + (offset >> 12) * 7u + 1u);
}

static uint8_t d_pattern(uint64_t offset)
{
    return (uint8_t)(offset * 29u + 101u);
}

/* Blocks the parent reads from (remote) into (local), and writes from (local) into (remote). */
static const uint32_t get_remote[] = {5, 6, 7, 1, 60, 33, 34, 2};
static const uint32_t get_local[]  = {0, 1, 2, 9, 10, 40, 41, 63};
static const uint32_t put_remote[] = {11, 12, 50};
#define NUM_GETS (sizeof(get_remote) / sizeof(get_remote[0]))
#define NUM_PUTS (sizeof(put_remote) / sizeof(put_remote[0]))

static bool write_all(int fd, const void *data, size_t size)
{
    for (const char *p = data; size > 0;) {
        ssize_t n = write(fd, p, size);
        if (n <= 0)
            return false;
        p += n;
        size -= (size_t)n;
    }
    return true;
}

static bool read_all(int fd, void *data, size_t size)
{
    for (char *p = data; size > 0;) {
        ssize_t n = read(fd, p, size);
        if (n <= 0)
            return false;
        p += n;
        size -= (size_t)n;
    }
    return true;
}

static bool write_blob(int fd, const void *data, uint64_t size)
{
    return write_all(fd, &size, sizeof(size)) && write_all(fd, data, size);
}

static void *read_blob(int fd, uint64_t *size_p)
{
    void *data;

    if (!read_all(fd, size_p, sizeof(*size_p)) || *size_p > (1u << 20))
        return NULL;
    data = malloc(*size_p + 1);
    if (data != NULL && !read_all(fd, data, *size_p)) {
        free(data);
        return NULL;
    }
    return data;
}

/* ----------------------------------------------------------------------------------------
 * The target process: maps a storage, publishes its main worker's address, the storage's key
 * and base, then progresses until the "done" message came (or it is killed).
 * -------------------------------------------------------------------------------------- */

struct target_params {
    const char *tls; /* NULL: the default list */
    bool ucx_memory; /* UCX allocates the storage (shared memory); else it is malloc'd */
    bool read_only;  /* its key grants reads only: a TCP-served grant then carries the UCX key
                        a peer on this host maps the storage with */
};

struct target_state {
    uint8_t *storage;
    bool notified;
    bool puts_ok;
};

/* The notification is sent only after the parent's puts were flushed: the bytes are here. */
static void target_on_done(void *arg, const void *data, size_t size)
{
    struct target_state *s = arg;

    s->notified = true;
    s->puts_ok  = size == 4 && memcmp(data, "done", 4) == 0;
    for (size_t i = 0; i < NUM_PUTS && s->puts_ok; i++) {
        uint64_t base = (uint64_t)put_remote[i] * BLOCK;

        for (uint64_t b = 0; b < BLOCK && s->puts_ok; b++)
            s->puts_ok = s->storage[base + b] == d_pattern(base + b);
    }
}

/* Returns the target's exit status. */
static int target_run(const struct target_params *params, int to_parent)
{
    struct transport *t = NULL;
    struct transport_mem *mem;
    struct target_state state = {0};
    uint8_t *own              = NULL;
    void *address;
    void *rkey;
    size_t address_size;
    size_t rkey_size;
    uint64_t base;
    uint64_t deadline;

    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a stopped orphan would never see an alarm */
    alarm(TARGET_MS / 1000 + 5);
    if (!params->ucx_memory && (own = aligned_alloc(4096, STORAGE_SIZE)) == NULL)
        return 9;
    /* with tcp in the list, the parent reaches it over a link (transport_listen) */
    if (transport_create(params->tls, false, &t) != KVX_OK ||
        transport_listen(t, "127.0.0.1") != KVX_OK ||
        transport_mem_map(t, own, STORAGE_SIZE, &mem) != KVX_OK)
        return 10;
    state.storage = transport_mem_address(mem);
    for (uint64_t i = 0; i < STORAGE_SIZE; i++)
        state.storage[i] = p_pattern(i);
    if (transport_am_set_handler(t, AM_DONE, target_on_done, &state) != KVX_OK ||
        transport_worker_address(t, &address, &address_size) != KVX_OK ||
        transport_mem_pack_rkey(t, mem, !params->read_only, &rkey, &rkey_size) != KVX_OK)
        return 11;
    base = (uint64_t)(uintptr_t)state.storage;
    if (!write_blob(to_parent, address, address_size) || !write_blob(to_parent, rkey, rkey_size) ||
        !write_all(to_parent, &base, sizeof(base)))
        return 12;
    deadline = clock_ms() + TARGET_MS;
    while (!state.notified && clock_ms() < deadline)
        transport_progress(t);
    free(address);
    free(rkey);
    transport_mem_unmap(t, mem);
    transport_destroy(t);
    free(own);
    return !state.notified ? 14 : state.puts_ok ? 0 : 13;
}

/* ----------------------------------------------------------------------------------------
 * The parent's side, and what a failed assertion leaves behind: the teardown ends it, because
 * the next test forks, and a child forked while this process has a UCX context cannot use UCX.
 * -------------------------------------------------------------------------------------- */

static struct leftovers {
    pid_t pid;
    int from_target;
    struct transport *t;
    struct transport_mem *mem;
    struct transport_conn *conn;
    uint8_t *local;
} left = {.from_target = -1};

static int leftovers_clean(void **state)
{
    (void)state;
    transport_conn_destroy(left.conn);
    if (left.mem != NULL)
        transport_mem_unmap(left.t, left.mem);
    transport_destroy(left.t);
    free(left.local);
    if (left.pid > 0) {
        kill(left.pid, SIGKILL);
        waitpid(left.pid, NULL, 0);
    }
    if (left.from_target >= 0)
        close(left.from_target);
    left = (struct leftovers){.from_target = -1};
    return 0;
}

/* Forks the target, before this process has any UCX context. */
static void target_start(const struct target_params *params)
{
    int pipe_fds[2];
    pid_t pid;

    assert_null(left.t);
    assert_int_equal(pipe(pipe_fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipe_fds[0]);
        _exit(target_run(params, pipe_fds[1]));
    }
    close(pipe_fds[1]);
    left.pid         = pid;
    left.from_target = pipe_fds[0];
}

/* This process's transport and its own storage of zeros, mapped. */
static void local_open(const char *tls)
{
    left.local = aligned_alloc(4096, STORAGE_SIZE);
    assert_non_null(left.local);
    memset(left.local, 0, STORAGE_SIZE);
    assert_int_equal(transport_create(tls, false, &left.t), KVX_OK);
    assert_int_equal(transport_mem_map(left.t, left.local, STORAGE_SIZE, &left.mem), KVX_OK);
}

/* Connects to the target with what it published, its storage claimed `size` bytes long;
 * returns the target storage's base. */
static uint64_t conn_open_claiming(uint64_t size)
{
    uint64_t address_size;
    uint64_t rkey_size;
    uint64_t base                   = 0;
    void *address                   = read_blob(left.from_target, &address_size);
    void *rkey                      = read_blob(left.from_target, &rkey_size);
    bool got_base                   = read_all(left.from_target, &base, sizeof(base));
    struct transport_remote_mem mem = {{rkey, rkey_size}, base, size, false};
    kvx_status_t status;

    assert_non_null(address);
    assert_non_null(rkey);
    assert_true(got_base);
    status = transport_conn_create(left.t, address, address_size, "127.0.0.1", &mem, 1, &left.conn);
    free(address);
    free(rkey);
    assert_int_equal(status, KVX_OK);
    return base;
}

static uint64_t conn_open(void)
{
    return conn_open_claiming(STORAGE_SIZE);
}

static void target_stop(void)
{
    int status;

    assert_int_equal(kill(left.pid, SIGSTOP), 0);
    assert_int_equal(waitpid(left.pid, &status, WUNTRACED), left.pid);
    assert_true(WIFSTOPPED(status));
}

static void target_kill(void)
{
    assert_int_equal(kill(left.pid, SIGKILL), 0);
    assert_int_equal(waitpid(left.pid, NULL, 0), left.pid);
    left.pid = 0;
}

/* Reaps the target, which ends on its own within TIMEOUT_MS; returns its wait status. */
static int target_wait(void)
{
    uint64_t deadline = clock_ms() + TIMEOUT_MS;
    int status        = 0;
    pid_t got;

    while ((got = waitpid(left.pid, &status, WNOHANG)) == 0 && clock_ms() < deadline)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    assert_int_equal(got, left.pid);
    left.pid = 0;
    return status;
}

static void conn_close(void)
{
    transport_conn_destroy(left.conn);
    left.conn = NULL;
}

static void local_close(void)
{
    transport_mem_unmap(left.t, left.mem);
    left.mem = NULL;
    transport_destroy(left.t);
    left.t = NULL;
    free(left.local);
    left.local = NULL;
    close(left.from_target);
    left.from_target = -1;
}

/* Fails the test with kvx's message unless `status` is KVX_OK. */
static void expect_ok(kvx_status_t status, const char *what)
{
    if (status != KVX_OK)
        fail_msg("%s: %d: %s", what, status, kvx_errmsg());
}

/* What an op's finished callback saw: each must run exactly once. */
struct done {
    size_t calls;
};

static void op_finished(void *arg, struct transport_op *op)
{
    struct done *d = arg;

    (void)op;
    d->calls++;
}

/* Progresses the connection until `d` saw its op finish or `timeout_ms` passed; never waits
 * after the deadline. */
static bool progress_until_done(const struct done *d, uint64_t timeout_ms)
{
    uint64_t deadline = clock_ms() + timeout_ms;

    while (d->calls == 0 && clock_ms() < deadline) {
        transport_conn_progress(left.conn);
        transport_copies_run(left.t, COPY_SLICE); /* the loop's copies, a slice a turn */
    }
    return d->calls > 0;
}

/* Progresses the connection (while there is one) and the main worker for `ms`, whatever
 * completes. */
static void progress_for(uint64_t ms)
{
    uint64_t deadline = clock_ms() + ms;

    while (clock_ms() < deadline) {
        if (left.conn != NULL)
            transport_conn_progress(left.conn);
        transport_progress(left.t);
        transport_copies_run(left.t, COPY_SLICE);
        transport_settle_run(left.t);
    }
}

/* One armed op of `count` block-sized gets or puts (block i to block i when `blocks` is NULL),
 * with a flush after puts when `flush`; what posting returned goes to `status_p`. */
static struct transport_op *rma_batch_try(struct done *d, bool put, const uint32_t *blocks,
                                          size_t count, bool flush, uint64_t remote_base,
                                          kvx_status_t *status_p)
{
    void *local_bases[1]             = {left.local};
    uint64_t remote_bases[1]         = {remote_base};
    kvx_mem_type_t local_mems[1]     = {KVX_MEM_DRAM};
    struct transport_targets targets = {local_bases, local_mems, remote_bases, false};
    kvx_pair_t pairs[NUM_BLOCKS];
    struct transport_op *op;

    assert_true(count <= NUM_BLOCKS);
    for (size_t i = 0; i < count; i++) {
        uint64_t b = blocks != NULL ? blocks[i] : i;

        pairs[i] = (kvx_pair_t){0, 0, b * BLOCK, b * BLOCK, BLOCK};
    }
    assert_int_equal(transport_op_create(left.conn, op_finished, d, &op), KVX_OK);
    *status_p = transport_rma_post(op, put, pairs, count, &targets);
    if (*status_p == KVX_OK && flush)
        *status_p = transport_flush_post(op);
    transport_op_arm(op);
    return op;
}

/* The same, posted without an error. */
static struct transport_op *rma_batch(struct done *d, bool put, const uint32_t *blocks,
                                      size_t count, bool flush, uint64_t remote_base)
{
    kvx_status_t status;
    struct transport_op *op = rma_batch_try(d, put, blocks, count, flush, remote_base, &status);

    expect_ok(status, put ? "posting puts" : "posting gets");
    return op;
}

/* ---------------------------------------------------------------------------------------- */

/* Over `tls`: NULL (the default, which includes TCP: kvx serves reads and writes itself) or
 * a list without TCP (UCX's own gets and puts, with keys). */
static void exact_bytes_move_over(const char *tls)
{
    const struct target_params params = {tls, true, false};
    void *local_bases[1];
    uint64_t remote_bases[1];
    kvx_mem_type_t local_mems[1] = {KVX_MEM_DRAM};
    struct transport_targets targets;
    kvx_pair_t pairs[NUM_GETS];
    struct transport_op *op;
    struct done got          = {0};
    struct done put          = {0};
    struct done sent         = {0};
    bool is_read[NUM_BLOCKS] = {false};
    int status;

    target_start(&params);
    local_open(tls);
    remote_bases[0] = conn_open();
    local_bases[0]  = left.local;
    targets         = (struct transport_targets){local_bases, local_mems, remote_bases, false};

    /* Pull: scattered blocks, then every byte compared, and the rest untouched. */
    for (size_t i = 0; i < NUM_GETS; i++)
        pairs[i] = (kvx_pair_t){0, 0, (uint64_t)get_local[i] * BLOCK,
                                (uint64_t)get_remote[i] * BLOCK, BLOCK};
    assert_int_equal(transport_op_create(left.conn, op_finished, &got, &op), KVX_OK);
    assert_int_equal(transport_rma_post(op, false, pairs, NUM_GETS, &targets), KVX_OK);
    transport_op_arm(op);
    assert_true(progress_until_done(&got, TIMEOUT_MS));
    assert_int_equal(got.calls, 1);
    assert_int_equal(transport_op_pending(op), 0);
    assert_int_equal(transport_op_status(op, "gets"), KVX_OK);
    transport_op_release(op);
    for (size_t i = 0; i < NUM_GETS; i++)
        is_read[get_local[i]] = true;
    for (uint64_t b = 0; b < NUM_BLOCKS; b++) {
        for (uint64_t o = 0; o < BLOCK; o++) {
            uint64_t at      = b * BLOCK + o;
            uint8_t expected = 0;

            for (size_t i = 0; i < NUM_GETS; i++) {
                if (get_local[i] == b)
                    expected = p_pattern((uint64_t)get_remote[i] * BLOCK + o);
            }
            if (left.local[at] != expected)
                fail_msg("local byte %llu is %u, expected %u (block %s)", (unsigned long long)at,
                         left.local[at], expected, is_read[b] ? "read" : "untouched");
        }
    }

    /* Push: the parent's pattern into three target blocks and a flush; then the notification,
     * which the target checks the bytes on. */
    for (size_t i = 0; i < NUM_PUTS; i++) {
        uint64_t off = (uint64_t)put_remote[i] * BLOCK;

        for (uint64_t o = 0; o < BLOCK; o++)
            left.local[off + o] = d_pattern(off + o);
    }
    op = rma_batch(&put, true, put_remote, NUM_PUTS, true, remote_bases[0]);
    assert_true(progress_until_done(&put, TIMEOUT_MS));
    assert_int_equal(put.calls, 1);
    assert_int_equal(transport_op_status(op, "puts"), KVX_OK);
    transport_op_release(op);

    assert_int_equal(transport_op_create(left.conn, op_finished, &sent, &op), KVX_OK);
    assert_int_equal(transport_am_post(op, AM_DONE, "done", 4), KVX_OK);
    transport_op_arm(op);
    assert_true(progress_until_done(&sent, TIMEOUT_MS));
    assert_int_equal(sent.calls, 1);
    assert_int_equal(transport_op_status(op, "the notification"), KVX_OK);
    transport_op_release(op);

    /* Exit status 0: the message reached the target's handler and the bytes were there. */
    status = target_wait();
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(transport_ops_orphaned(left.t), 0);
    conn_close();
    local_close();
    assert_int_equal(got.calls, 1);
    assert_int_equal(put.calls, 1);
    assert_int_equal(sent.calls, 1);
}

static void gets_and_puts_move_exact_bytes_and_notify_the_main_worker(void **state)
{
    (void)state;
    exact_bytes_move_over(NULL);
}

static void keyed_gets_and_puts_move_exact_bytes_and_notify_the_main_worker(void **state)
{
    (void)state;
    exact_bytes_move_over("sm,cma");
}

/* The hang this reproduces: after the deadline the old code cancelled the requests and waited
 * for them, and UCX never cancels RMA or flush requests. Over TCP only, with malloc'd target
 * memory, nothing moves while the target is stopped; releasing the op and closing the
 * connection must still return at once. Over tcp the connection is a kvx link, closed at once:
 * its records go with it, and no callback comes from it even after the target continues. */
static void put_and_flush_towards_stopped_peer_over_tcp_end_within_deadline(void **state)
{
    const struct target_params params = {"tcp", false, false};
    struct transport_op *op;
    struct done warm    = {0};
    struct done stalled = {0};
    uint64_t remote_base;
    double took;

    (void)state;
    target_start(&params);
    local_open("tcp");
    remote_base = conn_open();

    /* The connection works while the target runs. */
    op = rma_batch(&warm, true, NULL, 1, true, remote_base);
    assert_true(progress_until_done(&warm, TIMEOUT_MS));
    assert_int_equal(transport_op_status(op, "warm-up put"), KVX_OK);
    transport_op_release(op);

    target_stop();
    op = rma_batch(&stalled, true, NULL, NUM_BLOCKS, true, remote_base);
    progress_for(STALL_MS);
    assert_true(transport_op_pending(op) > 0);
    assert_int_equal(stalled.calls, 0);
    print_message("after %d ms towards the stopped target: %zu of %zu operations pending\n",
                  STALL_MS, transport_op_pending(op), transport_op_posted(op));

    /* The deadline passed: no waiting from here on. */
    transport_op_release(op);
    assert_int_equal(transport_ops_orphaned(left.t), 1);
    took = clock_seconds();
    conn_close();
    took = clock_seconds() - took;
    print_message("closing the connection took %.3f ms\n", took * 1e3);
    if (took >= DESTROY_MAX)
        fail_msg("closing the connection took %.3f s", took);
    assert_int_equal(transport_ops_orphaned(left.t), 0); /* its link closed: nothing can come */
    kill(left.pid, SIGCONT);
    progress_for(STALL_MS); /* the main worker: a parked connection is never progressed */
    assert_int_equal(stalled.calls, 0);

    target_kill();
    local_close();
}

/* A peer killed with puts in flight (stopped first, so they surely are) and gets posted after
 * it died: however UCX ends them (a reset, an error at posting, never), destroying the
 * connection frees every op record, released or not, and no callback runs after release. */
static void destroying_conn_after_peer_killed_frees_every_op_record(void **state)
{
    const struct target_params params = {"tcp", false, false};
    struct transport_op *warm_op;
    struct transport_op *puts_op;
    struct transport_op *gets_op;
    struct done warm = {0};
    struct done puts = {0};
    struct done gets = {0};
    kvx_status_t gets_posted;
    size_t gets_calls;
    uint64_t remote_base;
    double took;

    (void)state;
    target_start(&params);
    local_open("tcp");
    remote_base = conn_open();
    warm_op     = rma_batch(&warm, false, NULL, 1, false, remote_base);
    assert_true(progress_until_done(&warm, TIMEOUT_MS));
    transport_op_release(warm_op);

    target_stop();
    puts_op = rma_batch(&puts, true, NULL, NUM_BLOCKS, true, remote_base);
    progress_for(STALL_MS / 6);
    assert_true(transport_op_pending(puts_op) > 0);
    transport_op_release(puts_op); /* its deadline passed */
    assert_int_equal(transport_ops_orphaned(left.t), 1);
    target_kill();

    /* Posting towards the dead peer may fail at once (UCX saw the reset) or be accepted. */
    gets_op = rma_batch_try(&gets, false, NULL, NUM_BLOCKS, false, remote_base, &gets_posted);
    assert_true(gets_posted == KVX_OK || gets_posted == KVX_ERR_IO ||
                gets_posted == KVX_ERR_PEER_DOWN); /* the link saw the reset */
    if (gets_posted != KVX_OK)
        print_message("posting gets after the kill: %s\n", kvx_errmsg());
    progress_for(STALL_MS);
    print_message("after the kill: gets %zu of %zu pending, finished %zu times, %s\n",
                  transport_op_pending(gets_op), transport_op_posted(gets_op), gets.calls,
                  transport_op_status(gets_op, "gets") == KVX_OK ? "ok" : kvx_errmsg());
    assert_int_equal(puts.calls, 0);
    assert_true(gets.calls <= 1);

    gets_calls = gets.calls;
    took       = clock_seconds();
    conn_close(); /* frees the gets' record too, still owned here, or parks it */
    took = clock_seconds() - took;
    if (took >= DESTROY_MAX)
        fail_msg("destroying the connection took %.3f s", took);
    /* Writes over TCP wait for the owner's answer, which a dead peer never sends: closing the
     * connection's link ends them and frees their records (ASan checks it does). */
    assert_int_equal(puts.calls, 0);
    assert_int_equal(gets.calls, gets_calls);
    local_close();
}

/* Blocks of the local storage holding the target's bytes of the same block (the gets below
 * read block b into block b): a block not copied still holds zeros, which no block of the
 * target's pattern is. */
static size_t blocks_copied(void)
{
    size_t copied = 0;

    for (uint64_t b = 0; b < NUM_BLOCKS; b++) {
        bool same = true;

        for (uint64_t o = 0; o < BLOCK && same; o++)
            same = left.local[b * BLOCK + o] == p_pattern(b * BLOCK + o);
        copied += same;
    }
    return copied;
}

/* Issue 23: a post never makes a large copy. Reads of a storage mapped here (UCX-allocated
 * memory of a process on this host) are copies; the post makes at most TRANSPORT_COPY_INLINE
 * bytes of them and queues the rest, which each transport_copies_run makes at most a budget
 * of, so a post of the whole storage returns having copied a bounded part, even with the
 * target stopped (a copy needs nothing of it). Counted in bytes that landed, not in time.
 * A connection closed with copies still queued drops them: nothing lands after the close. */
static void large_mapped_read_is_copied_by_the_loop_in_slices(void **state)
{
    const struct target_params params = {NULL, true, true}; /* mapped here on 1.13 and 1.22 */
    const size_t inline_blocks        = TRANSPORT_COPY_INLINE / BLOCK;
    const size_t slice_blocks         = COPY_SLICE / BLOCK;
    struct transport_op *op;
    struct done got     = {0};
    struct done dropped = {0};
    uint64_t remote_base;
    size_t copied;
    size_t turns = 0;
    char lanes[256];

    (void)state;
    target_start(&params);
    local_open(params.tls);
    remote_base = conn_open();
    transport_conn_describe(left.conn, lanes, sizeof(lanes));
    if (strstr(lanes, "memcpy(1 of 1 storages mapped)") == NULL) {
        print_message("UCX %s: not mapped here (%s): nothing to copy\n", kvx_ucx_version(), lanes);
        conn_close();
        target_kill();
        local_close();
        skip();
    }
    target_stop();

    op     = rma_batch(&got, false, NULL, NUM_BLOCKS, false, remote_base);
    copied = blocks_copied();
    print_message("the post copied %zu of %u blocks (at most %zu)\n", copied, NUM_BLOCKS,
                  inline_blocks);
    assert_true(copied <= inline_blocks);
    assert_int_equal(got.calls, 0); /* never inside the call */
    assert_int_equal(transport_op_pending(op), 1);
    while (got.calls == 0 && turns <= NUM_BLOCKS) {
        size_t before = blocks_copied();

        assert_true(transport_copies_run(left.t, COPY_SLICE) > 0);
        turns++;
        copied = blocks_copied();
        assert_true(copied > before && copied - before <= slice_blocks);
    }
    assert_int_equal(got.calls, 1);
    assert_int_equal(copied, NUM_BLOCKS);
    assert_true(turns >= (NUM_BLOCKS - inline_blocks) / slice_blocks);
    assert_int_equal(transport_op_status(op, "copies"), KVX_OK);
    assert_int_equal(transport_copies_run(left.t, COPY_SLICE), 0);
    transport_op_release(op);

    /* Closed with copies queued: they never land, and nobody is told. */
    memset(left.local, 0, STORAGE_SIZE);
    rma_batch(&dropped, false, NULL, NUM_BLOCKS, false, remote_base);
    copied = blocks_copied();
    conn_close(); /* the op goes with its connection: nothing of it is pending */
    assert_int_equal(transport_copies_run(left.t, STORAGE_SIZE), 0);
    assert_int_equal(blocks_copied(), copied);
    assert_int_equal(dropped.calls, 0);
    assert_int_equal(transport_ops_orphaned(left.t), 0);

    target_kill();
    local_close();
}

/* Bad input from a peer is an error, never a crash. */
/* A target's UCX-allocated storage is mapped here and read with memcpy (the test above
 * checks its bytes); one whose metadata claims more than UCX mapped is not, and reads of it go
 * through UCX: a lying peer cannot make a copy fault. */
static void mapped_storage_is_used_only_where_every_page_is_mapped(void **state)
{
    const struct target_params params = {"sm,cma", true, false}; /* keys, not grants */
    char lanes[256];

    (void)state;
    for (int lying = 0; lying < 2; lying++) {
        target_start(&params);
        local_open(params.tls);
        conn_open_claiming(lying ? (uint64_t)1 << 40 : STORAGE_SIZE);
        transport_conn_describe(left.conn, lanes, sizeof(lanes));
        if (lying)
            assert_null(strstr(lanes, "memcpy"));
        else if (strstr(lanes, "memcpy(1 of 1 storages mapped)") == NULL &&
                 strncmp(kvx_ucx_version(), "1.13.", 5) == 0)
            fail_msg("not mapped: %s", lanes);
        else if (strstr(lanes, "memcpy") == NULL) /* UCX 1.22 on "sm,cma": rkey_ptr says
                                                     unreachable at connect; reads take CMA */
            print_message("UCX %s: not mapped at connect: %s\n", kvx_ucx_version(), lanes);
        conn_close();
        target_kill();
        local_close();
    }
}

static void empty_worker_address_is_refused(void **state)
{
    struct transport_conn *conn = NULL;

    (void)state;
    assert_int_equal(transport_create(NULL, false, &left.t), KVX_OK);
    assert_int_equal(transport_conn_create(left.t, "", 0, NULL, NULL, 0, &conn), KVX_ERR_INVALID);
    assert_null(conn);
    transport_destroy(left.t);
    left.t = NULL;
}

/* Issue 24 item 10: UCX's own lines, dispatched through UCX's real handler stack. Routed,
 * a warning and an error become the transport's lines; in a worker's close window the
 * warnings of what a peer left pending are counted into one line, an error still comes
 * through; not routed, nothing is taken (UCX prints it, as without kvx). */
static void ucx_log_lines_are_routed_and_close_warnings_summed(void **state)
{
    ucs_log_component_config_t *component = &ucs_global_opts.log_component;
    char line[512];

    (void)state;
    assert_int_equal(transport_create("tcp", false, &left.t), KVX_OK);
    transport_log_route(left.t, true);
    ucs_log_dispatch(__FILE__, __LINE__, __func__, UCS_LOG_LEVEL_WARN, component,
                     "kvx test warning %d", 7);
    ucs_log_dispatch(__FILE__, __LINE__, __func__, UCS_LOG_LEVEL_ERROR, component,
                     "kvx test error %s", "x");
    assert_true(transport_log_next(left.t, line, sizeof(line)));
    assert_string_equal(line, "UCX WARN: kvx test warning 7");
    assert_true(transport_log_next(left.t, line, sizeof(line)));
    assert_string_equal(line, "UCX ERROR: kvx test error x");
    assert_false(transport_log_next(left.t, line, sizeof(line)));

    transport_log_close_begin(left.t, false);
    ucs_log_dispatch(__FILE__, __LINE__, __func__, UCS_LOG_LEVEL_WARN, component,
                     "worker %p: %u pending operations were not flushed", (void *)line, 3u);
    for (unsigned i = 1; i < 45; i++) /* UCX's own words, as a closing worker prints them */
        ucs_log_dispatch(__FILE__, __LINE__, __func__, UCS_LOG_LEVEL_WARN, component,
                         "object %p%s was not returned to mpool %s", (void *)(line + i), "",
                         "ucp_requests");
    ucs_log_dispatch(__FILE__, __LINE__, __func__, UCS_LOG_LEVEL_ERROR, component,
                     "kvx test error while closing");
    transport_log_close_end();
    assert_true(transport_log_next(left.t, line, sizeof(line)));
    assert_string_equal(line, "UCX ERROR: kvx test error while closing");
    assert_true(transport_log_next(left.t, line, sizeof(line)));
    assert_non_null(strstr(line, "UCX: 45 warnings not shown, of closed connections' workers"));
    assert_false(transport_log_next(left.t, line, sizeof(line)));

    for (int i = 0; i < 20; i++) /* a full queue counts what it could not keep */
        ucs_log_dispatch(__FILE__, __LINE__, __func__, UCS_LOG_LEVEL_WARN, component,
                         "kvx test flood %d", i);
    for (int i = 0; i < 16; i++)
        assert_true(transport_log_next(left.t, line, sizeof(line)));
    assert_string_equal(line, "UCX WARN: kvx test flood 15");
    assert_true(transport_log_next(left.t, line, sizeof(line)));
    assert_string_equal(line, "UCX: 4 more lines not kept (more than 16 at once)");

    transport_log_route(left.t, false);
    ucs_log_dispatch(__FILE__, __LINE__, __func__, UCS_LOG_LEVEL_WARN, component,
                     "kvx test warning printed by UCX, as without kvx");
    assert_false(transport_log_next(left.t, line, sizeof(line)));
    transport_destroy(left.t);
    left.t = NULL;
}

int main(void)
{
    /* Every test that forks comes before any that only creates a context here. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(gets_and_puts_move_exact_bytes_and_notify_the_main_worker,
                                  leftovers_clean),
        cmocka_unit_test_teardown(keyed_gets_and_puts_move_exact_bytes_and_notify_the_main_worker,
                                  leftovers_clean),
        cmocka_unit_test_teardown(put_and_flush_towards_stopped_peer_over_tcp_end_within_deadline,
                                  leftovers_clean),
        cmocka_unit_test_teardown(destroying_conn_after_peer_killed_frees_every_op_record,
                                  leftovers_clean),
        cmocka_unit_test_teardown(mapped_storage_is_used_only_where_every_page_is_mapped,
                                  leftovers_clean),
        cmocka_unit_test_teardown(large_mapped_read_is_copied_by_the_loop_in_slices,
                                  leftovers_clean),
        cmocka_unit_test_teardown(empty_worker_address_is_refused, leftovers_clean),
        cmocka_unit_test_teardown(ucx_log_lines_are_routed_and_close_warnings_summed,
                                  leftovers_clean),
    };

    setenv("UCX_NET_DEVICES", "lo", 1); /* never another interface */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

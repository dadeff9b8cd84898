/* test_transport.c: the UCX transport between two real processes on loopback: a prefill
 * process maps a storage and publishes its worker address and remote key; the decode process
 * gets scattered blocks and compares every byte, then puts blocks back and notifies, and the
 * prefill process checks them after the notification arrived. */
#include "transport.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#define STORAGE_SIZE (4u << 20)  /* bytes on each side */
#define BLOCK        (64u << 10) /* bytes per block */
#define NUM_BLOCKS   (STORAGE_SIZE / BLOCK)
#define TIMEOUT_MS   10000
#define AM_DONE      1

/* The byte P holds at `offset` before any put, and the byte D puts there. */
static uint8_t p_pattern(uint64_t offset)
{
    return (uint8_t)(offset * 131u + (offset >> 12) * 7u + 1u);
}

static uint8_t d_pattern(uint64_t offset)
{
    return (uint8_t)(offset * 29u + 101u);
}

/* Blocks D reads from (remote) into (local), and D writes from (local) into (remote). */
static const uint32_t get_remote[] = {5, 6, 7, 1, 60, 33, 34, 2};
static const uint32_t get_local[]  = {0, 1, 2, 9, 10, 40, 41, 63};
static const uint32_t put_remote[] = {11, 12, 50};

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

struct p_state {
    uint8_t *storage;
    bool notified;
    bool puts_ok;
};

/* The notification arrives only after D's puts were flushed: the bytes must be there. */
static void p_on_done(void *arg, const void *data, size_t size)
{
    struct p_state *p = arg;

    p->notified = true;
    p->puts_ok  = size == 4 && memcmp(data, "done", 4) == 0;
    for (size_t i = 0; i < sizeof(put_remote) / sizeof(put_remote[0]) && p->puts_ok; i++) {
        uint64_t base = (uint64_t)put_remote[i] * BLOCK;

        for (uint64_t b = 0; b < BLOCK && p->puts_ok; b++)
            p->puts_ok = p->storage[base + b] == d_pattern(base + b);
    }
}

/* The prefill process: returns its exit status. */
static int run_prefill(int to_d, int from_d)
{
    struct transport *t = NULL;
    struct transport_mem *mem;
    struct p_state state = {0};
    void *address;
    void *rkey;
    size_t address_size;
    size_t rkey_size;
    uint64_t base;
    char go;

    alarm(30); /* a hung test fails instead of blocking CI */
    if (transport_create(NULL, &t) != KVX_OK ||
        transport_mem_map(t, NULL, STORAGE_SIZE, &mem) != KVX_OK)
        return 10;
    state.storage = transport_mem_address(mem);
    for (uint64_t i = 0; i < STORAGE_SIZE; i++)
        state.storage[i] = p_pattern(i);
    if (transport_am_set_handler(t, AM_DONE, p_on_done, &state) != KVX_OK ||
        transport_worker_address(t, &address, &address_size) != KVX_OK ||
        transport_mem_pack_rkey(t, mem, &rkey, &rkey_size) != KVX_OK)
        return 11;
    base = (uint64_t)(uintptr_t)state.storage;
    if (!write_blob(to_d, address, address_size) || !write_blob(to_d, rkey, rkey_size) ||
        !write_all(to_d, &base, sizeof(base)) || !read_all(from_d, &go, 1))
        return 12;
    while (!state.notified)
        transport_progress(t);
    free(address);
    free(rkey);
    transport_mem_unmap(t, mem);
    transport_destroy(t);
    return state.puts_ok ? 0 : 13;
}

static void transfers_move_exact_bytes_between_processes(void **state)
{
    int p_to_d[2];
    int d_to_p[2];
    struct transport *t;
    struct transport_mem *mem;
    struct transport_ep *ep;
    struct transport_rkey *rkey;
    uint8_t *local = aligned_alloc(4096, STORAGE_SIZE);
    kvx_pair_t pairs[8];
    uint64_t address_size;
    uint64_t rkey_size;
    uint64_t remote_base;
    void *address;
    void *packed_rkey;
    int status;
    pid_t pid;

    (void)state;
    assert_non_null(local);
    assert_int_equal(pipe(p_to_d), 0);
    assert_int_equal(pipe(d_to_p), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(run_prefill(p_to_d[1], d_to_p[0]));

    memset(local, 0, STORAGE_SIZE);
    assert_int_equal(transport_create(NULL, &t), KVX_OK);
    assert_int_equal(transport_mem_map(t, local, STORAGE_SIZE, &mem), KVX_OK);
    address     = read_blob(p_to_d[0], &address_size);
    packed_rkey = read_blob(p_to_d[0], &rkey_size);
    assert_non_null(address);
    assert_non_null(packed_rkey);
    assert_true(read_all(p_to_d[0], &remote_base, sizeof(remote_base)));
    assert_int_equal(transport_ep_create(t, address, address_size, &ep), KVX_OK);
    assert_int_equal(transport_rkey_unpack(ep, packed_rkey, rkey_size, &rkey), KVX_OK);

    /* Pull: scattered blocks, then every byte compared, and the rest untouched. */
    for (size_t i = 0; i < 8; i++)
        pairs[i] = (kvx_pair_t){0, 0, (uint64_t)get_local[i] * BLOCK,
                                (uint64_t)get_remote[i] * BLOCK, BLOCK};
    {
        void *local_bases[1]             = {local};
        uint64_t remote_bases[1]         = {remote_base};
        struct transport_rkey *rkeys[1]  = {rkey};
        struct transport_targets targets = {local_bases, remote_bases, rkeys, false};
        bool is_read[NUM_BLOCKS]         = {false};

        assert_int_equal(transport_rma(t, ep, false, pairs, 8, &targets, TIMEOUT_MS), KVX_OK);
        for (size_t i = 0; i < 8; i++)
            is_read[get_local[i]] = true;
        for (uint64_t b = 0; b < NUM_BLOCKS; b++) {
            for (uint64_t o = 0; o < BLOCK; o++) {
                uint64_t at      = b * BLOCK + o;
                uint8_t expected = 0;

                for (size_t i = 0; i < 8; i++) {
                    if (get_local[i] == b)
                        expected = p_pattern((uint64_t)get_remote[i] * BLOCK + o);
                }
                if (local[at] != expected)
                    fail_msg("local byte %llu is %u, expected %u (block %s)",
                             (unsigned long long)at, local[at], expected,
                             is_read[b] ? "read" : "untouched");
            }
        }

        /* Push: D's pattern into three P blocks, then the notification. */
        for (size_t i = 0; i < 3; i++) {
            uint64_t off = (uint64_t)put_remote[i] * BLOCK;

            for (uint64_t o = 0; o < BLOCK; o++)
                local[off + o] = d_pattern(off + o);
            pairs[i] = (kvx_pair_t){0, 0, off, off, BLOCK};
        }
        assert_int_equal(transport_rma(t, ep, true, pairs, 3, &targets, TIMEOUT_MS), KVX_OK);
    }
    assert_true(write_all(d_to_p[1], "g", 1));
    assert_int_equal(transport_am_send(t, ep, AM_DONE, "done", 4, TIMEOUT_MS), KVX_OK);

    assert_int_equal(waitpid(pid, &status, 0), pid);
    transport_rkey_destroy(rkey);
    transport_ep_destroy(t, ep);
    transport_mem_unmap(t, mem);
    transport_destroy(t);
    free(address);
    free(packed_rkey);
    free(local);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Bad input from a peer is an error, never a crash. */
static void garbage_address_and_key_are_rejected(void **state)
{
    struct transport *t;
    struct transport_ep *ep = NULL;

    (void)state;
    assert_int_equal(transport_create(NULL, &t), KVX_OK);
    assert_int_equal(transport_ep_create(t, "", 0, &ep), KVX_ERR_INVALID);
    assert_null(ep);
    transport_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(transfers_move_exact_bytes_between_processes),
        cmocka_unit_test(garbage_address_and_key_are_rejected),
    };

    setenv("UCX_NET_DEVICES", "lo", 1); /* never another interface */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* errmode_probe.c: what UCP_ERR_HANDLING_MODE_PEER costs against _NONE for one-sided gets and
 * puts to a forked target, the lanes UCX picks, and closes to a stopped peer. No kvx calls. */
#include "bench_common.h"

#include <ucp/api/ucp.h>

#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROBE_WAIT_NS     (UINT64_C(10) * 1000000000) /* deadline of every benchmark wait */
#define PROBE_CLOSE_NS    (UINT64_C(2) * 1000000000)  /* cap on a close to a stopped target */
#define PROBE_IDLE_MS     120000 /* a target without commands this long exits */
#define PROBE_MAX_BATCH   64
#define PROBE_MAX_REPEATS 15
#define PROBE_MAX_BLOB    65536 /* bytes: ceiling on a worker address or packed rkey */
#define PROBE_NUM_SIZES   3
#define PROBE_NUM_MODES   2
#define PROBE_NUM_MEMS    2
#define PROBE_NUM_OPS     2
#define PROBE_NUM_TARGETS 8 /* 2 benchmark targets, 6 close probes */
#define PROBE_PATTERN_PUT 0x5c

static const uint64_t probe_sizes[PROBE_NUM_SIZES]   = {4096, 65536, 1048576}; /* bytes */
static const char *const mode_names[PROBE_NUM_MODES] = {"none", "peer"};
static const ucp_err_handling_mode_t mode_values[PROBE_NUM_MODES] = {UCP_ERR_HANDLING_MODE_NONE,
                                                                     UCP_ERR_HANDLING_MODE_PEER};
/* Target memory: ucp_mem_map with UCP_MEM_MAP_ALLOCATE, or aligned_alloc + ucp_mem_map. */
static const char *const mem_names[PROBE_NUM_MEMS] = {"alloc", "user"};
static const char *const op_names[PROBE_NUM_OPS]   = {"get", "put"};

static const char usage[] =
    "usage: errmode_probe [--iters N] [--repeats N] [--batch N] [--rma-only]\n"
    "\n"
    "Forks targets, then measures ucp_get_nbx and ucp_put_nbx + ucp_ep_flush_nbx from this\n"
    "process into a target's memory (ucp_mem_map with UCP_MEM_MAP_ALLOCATE, or aligned_alloc\n"
    "registered with ucp_mem_map) for blocks of 4K, 64K and 1M, BATCH blocks (16) per\n"
    "iteration, ITERS iterations (200) per repeat, REPEATS repeats (3, interleaved), with\n"
    "error handling mode none and peer. Then times ucp_ep_close_nbx to SIGSTOPped targets.\n"
    "Features are kvx's (RMA, AM, WAKEUP), or RMA alone with --rma-only.\n"
    "UCX_TLS defaults to sm,cma,tcp and UCX_NET_DEVICES to lo when not set.\n";

/* A forked target as the parent sees it: its process, its socket and what it sent. */
struct target {
    pid_t pid;
    int fd;                               /* parent's end of the socketpair */
    bool stopped;                         /* SIGSTOPped by the parent */
    void *address;                        /* the target worker's address */
    uint64_t address_len;                 /* bytes */
    uint64_t region_addr[PROBE_NUM_MEMS]; /* target virtual addresses */
    void *rkey_buf[PROBE_NUM_MEMS];       /* packed rkeys */
    uint64_t rkey_len[PROBE_NUM_MEMS];    /* bytes */
};

/* What the target writes first, followed by the address and the two packed rkeys. */
struct target_hello {
    uint64_t address_len;                 /* bytes */
    uint64_t region_addr[PROBE_NUM_MEMS]; /* target virtual addresses */
    uint64_t rkey_len[PROBE_NUM_MEMS];    /* bytes */
};

static struct target targets[PROBE_NUM_TARGETS];
static size_t num_targets;
static uint64_t region_len; /* bytes of each target region and of the local buffer */
static unsigned ep_errors;  /* calls of the peer-mode error handler */
/* kvx's own features (src/transport.c); --rma-only drops AM and WAKEUP. Without AM, UCX 1.13
 * selects no rma_bw (zcopy) lanes at all, so cma is never used. */
static uint64_t features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;

/* Prints the message, kills every target and exits: the probe never hangs on a failure. */
__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fprintf(stderr, "errmode_probe: error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    for (size_t i = 0; i < num_targets; i++) {
        if (targets[i].pid > 0) /* never kill(-1) */
            kill(targets[i].pid, SIGKILL);
    }
    exit(1);
}

/* Writes all of buf to fd, or fails. */
static bool fd_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = write(fd, p, len);

        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* Reads exactly len bytes from fd within timeout_ms in all; false on EOF, error or timeout. */
static bool fd_read_all(int fd, void *buf, size_t len, int timeout_ms)
{
    uint64_t deadline = clock_ns() + (uint64_t)timeout_ms * 1000000;
    char *p           = buf;

    while (len > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        uint64_t now      = clock_ns();
        ssize_t n;

        if (now >= deadline || poll(&pfd, 1, (int)((deadline - now) / 1000000) + 1) <= 0)
            return false;
        n = read(fd, p, len);
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* The name of the mapping that holds addr in /proc/self/maps (which segment UCX allocated). */
static void mapping_name_print(const char *what, uintptr_t addr)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];

    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long lo, hi;
        int pos = 0;

        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &pos) >= 2 && addr >= lo &&
            addr < hi) {
            line[strcspn(line, "\n")] = '\0';
            printf("target: %s region at 0x%" PRIxPTR " is mapped from \"%s\"\n", what, addr,
                   pos > 0 ? line + pos : "");
            break;
        }
    }
    fclose(f);
}

/* The target: maps its two regions, sends its address and rkeys, then obeys commands:
 * 'p' progress its worker without pause, 'i' block on the socket, 'q' clean up and exit.
 * An end of file or PROBE_IDLE_MS without a command also ends it. Never returns. */
__attribute__((noreturn)) static void target_run(int fd, bool verbose)
{
    ucp_params_t params         = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = features};
    ucp_worker_params_t wparams = {.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                   .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct target_hello hello   = {0};
    ucp_mem_h memh[PROBE_NUM_MEMS];
    void *rkey_buf[PROBE_NUM_MEMS];
    size_t rkey_len[PROBE_NUM_MEMS];
    void *user_mem = aligned_alloc(4096, region_len);
    ucp_address_t *address;
    size_t address_len;
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_config_t *config;
    bool progressing = false;
    char cmd         = 'i';

    if (user_mem == NULL || ucp_config_read(NULL, NULL, &config) != UCS_OK)
        goto err;
    if (ucp_init(&params, config, &context) != UCS_OK)
        goto err;
    ucp_config_release(config);
    if (ucp_worker_create(context, &wparams, &worker) != UCS_OK ||
        ucp_worker_get_address(worker, &address, &address_len) != UCS_OK)
        goto err;
    for (int m = 0; m < PROBE_NUM_MEMS; m++) {
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                                 UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                                   .address = m == 0 ? NULL : user_mem,
                                   .length  = region_len,
                                   .flags   = m == 0 ? UCP_MEM_MAP_ALLOCATE : 0};
        ucp_mem_attr_t attr     = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};

        if (ucp_mem_map(context, &mp, &memh[m]) != UCS_OK ||
            ucp_mem_query(memh[m], &attr) != UCS_OK ||
            ucp_rkey_pack(context, memh[m], &rkey_buf[m], &rkey_len[m]) != UCS_OK)
            goto err;
        memset(attr.address, 0x11 * (m + 1), region_len);
        hello.region_addr[m] = (uintptr_t)attr.address;
        hello.rkey_len[m]    = rkey_len[m];
        if (verbose)
            mapping_name_print(mem_names[m], (uintptr_t)attr.address);
    }
    fflush(stdout);
    hello.address_len = address_len;
    if (!fd_write_all(fd, &hello, sizeof(hello)) || !fd_write_all(fd, address, address_len) ||
        !fd_write_all(fd, rkey_buf[0], rkey_len[0]) || !fd_write_all(fd, rkey_buf[1], rkey_len[1]))
        goto err;

    for (;;) {
        if (progressing) {
            for (int i = 0; i < 1024; i++)
                ucp_worker_progress(worker);
            if (recv(fd, &cmd, 1, MSG_DONTWAIT) == 0)
                break;
        } else if (!fd_read_all(fd, &cmd, 1, PROBE_IDLE_MS)) {
            break;
        }
        if (cmd == 'q')
            break;
        progressing = cmd == 'p';
    }

    for (int m = 0; m < PROBE_NUM_MEMS; m++) {
        ucp_rkey_buffer_release(rkey_buf[m]);
        ucp_mem_unmap(context, memh[m]);
    }
    ucp_worker_release_address(worker, address);
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    free(user_mem);
    _exit(0);

err:
    fprintf(stderr, "errmode_probe: target %d: UCX setup failed\n", (int)getpid());
    _exit(1);
}

/* Forks a target before the parent has any UCX state; the child closes the parent's ends of
 * the earlier targets' sockets so that each target sees end of file when the parent dies. */
static void target_fork(bool verbose)
{
    struct target *t = &targets[num_targets];
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        fail("socketpair failed");
    fflush(stdout);
    t->pid = fork();
    if (t->pid < 0)
        fail("fork failed");
    if (t->pid == 0) {
        /* A parent that dies inside UCX (an abort) must not leave a stopped target behind. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1)
            _exit(1);
        for (size_t i = 0; i < num_targets; i++)
            close(targets[i].fd);
        close(sv[0]);
        target_run(sv[1], verbose);
    }
    close(sv[1]);
    t->fd = sv[0];
    num_targets++;
}

/* Reads what target t sent (within the 10 s deadline). */
static void target_hello_read(struct target *t)
{
    struct target_hello hello;

    if (!fd_read_all(t->fd, &hello, sizeof(hello), 10000))
        fail("target %d sent no hello within 10 s", (int)t->pid);
    if (hello.address_len == 0 || hello.address_len > PROBE_MAX_BLOB ||
        hello.rkey_len[0] > PROBE_MAX_BLOB || hello.rkey_len[1] > PROBE_MAX_BLOB)
        fail("target %d: hello lengths out of range", (int)t->pid);
    t->address_len = hello.address_len;
    t->address     = malloc(hello.address_len);
    if (t->address == NULL || !fd_read_all(t->fd, t->address, t->address_len, 10000))
        fail("target %d: worker address not received", (int)t->pid);
    for (int m = 0; m < PROBE_NUM_MEMS; m++) {
        t->region_addr[m] = hello.region_addr[m];
        t->rkey_len[m]    = hello.rkey_len[m];
        t->rkey_buf[m]    = malloc(t->rkey_len[m] + 1);
        if (t->rkey_buf[m] == NULL || !fd_read_all(t->fd, t->rkey_buf[m], t->rkey_len[m], 10000))
            fail("target %d: rkey %d not received", (int)t->pid, m);
    }
}

static void target_command(struct target *t, char cmd)
{
    if (!fd_write_all(t->fd, &cmd, 1))
        fail("target %d: command '%c' not sent", (int)t->pid, cmd);
}

/* Waits (deadline timeout_ns) for t to exit, be killed or stop, as `what` says. */
static void target_wait(struct target *t, int options, uint64_t timeout_ns, const char *what)
{
    uint64_t deadline = clock_ns() + timeout_ns;
    int wstatus;

    for (;;) {
        pid_t got = waitpid(t->pid, &wstatus, options | WNOHANG);

        if (got == t->pid)
            return;
        if (got < 0)
            fail("waitpid of target %d failed", (int)t->pid);
        if (clock_ns() > deadline)
            fail("target %d did not %s within %" PRIu64 " ms", (int)t->pid, what,
                 timeout_ns / 1000000);
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
}

static void ep_error_handle(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    ep_errors++;
    printf("peer-mode error handler: %s\n", ucs_status_string(status));
}

static ucp_ep_h ep_create(ucp_worker_h worker, struct target *t, int mode)
{
    ucp_ep_params_t params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                              .address  = t->address,
                              .err_mode = mode_values[mode]};
    ucp_ep_h ep;
    ucs_status_t status;

    if (mode_values[mode] == UCP_ERR_HANDLING_MODE_PEER) {
        params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.err_handler.cb = ep_error_handle;
    }
    status = ucp_ep_create(worker, &params, &ep);
    if (status != UCS_OK)
        fail("ucp_ep_create (%s): %s", mode_names[mode], ucs_status_string(status));
    return ep;
}

/* Completes every request of reqs (NULL: done at posting) within one 10 s deadline. */
static void requests_wait(ucp_worker_h worker, void **reqs, size_t n, const char *what)
{
    uint64_t deadline = clock_ns() + PROBE_WAIT_NS;

    for (size_t i = 0; i < n; i++) {
        ucs_status_t status;

        if (reqs[i] == NULL)
            continue;
        if (UCS_PTR_IS_ERR(reqs[i]))
            fail("%s: posting failed: %s", what, ucs_status_string(UCS_PTR_STATUS(reqs[i])));
        while ((status = ucp_request_check_status(reqs[i])) == UCS_INPROGRESS) {
            ucp_worker_progress(worker);
            if (clock_ns() > deadline)
                fail("%s: not complete within 10 s", what);
        }
        ucp_request_free(reqs[i]);
        if (status != UCS_OK)
            fail("%s: completed with %s", what, ucs_status_string(status));
    }
}

static void ep_flush(ucp_worker_h worker, ucp_ep_h ep)
{
    ucp_request_param_t param = {0};
    void *req                 = ucp_ep_flush_nbx(ep, &param);

    requests_wait(worker, &req, 1, "ucp_ep_flush_nbx");
}

/* Gets `len` bytes at offset 0 of region m into buf and waits for them. */
static void get_one(ucp_worker_h worker, ucp_ep_h ep, ucp_rkey_h rkey, uint64_t raddr, void *buf,
                    size_t len)
{
    ucp_request_param_t param = {0};
    void *req                 = ucp_get_nbx(ep, buf, len, raddr, rkey, &param);

    requests_wait(worker, &req, 1, "ucp_get_nbx");
}

/* Prints the lines of ucp_ep_print_info holding "lane[" with a prefix, and the put[N]/get[N]
 * and rma_bw lines: UCX 1.13 labels an rma lane only through those. */
static void lanes_print(ucp_ep_h ep, const char *prefix)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f    = open_memstream(&text, &len);
    char *line;

    if (f == NULL)
        fail("open_memstream failed");
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strstr(line, "lane[") != NULL || strstr(line, "put[") != NULL ||
            strstr(line, "get[") != NULL || strstr(line, "rma_bw:") != NULL)
            printf("%s %s\n", prefix, line + strspn(line, "# "));
    }
    free(text);
}

/* One repeat of (op, size): iters x (batch ops, then wait for all; puts add an ep flush).
 * Returns nanoseconds of the whole timed loop, after 3 untimed warm-up iterations. */
static uint64_t rma_run(ucp_worker_h worker, ucp_ep_h ep, ucp_rkey_h rkey, uint64_t raddr,
                        char *local, int op, uint64_t size, uint64_t batch, uint64_t iters)
{
    ucp_request_param_t param = {0};
    void *reqs[PROBE_MAX_BATCH + 1];
    uint64_t start = 0;

    for (uint64_t i = 0; i < iters + 3; i++) {
        size_t n = batch;

        if (i == 3)
            start = clock_ns();
        for (uint64_t b = 0; b < batch; b++) {
            if (op == 0)
                reqs[b] = ucp_get_nbx(ep, local + b * size, size, raddr + b * size, rkey, &param);
            else
                reqs[b] = ucp_put_nbx(ep, local + b * size, size, raddr + b * size, rkey, &param);
        }
        if (op == 1)
            reqs[n++] = ucp_ep_flush_nbx(ep, &param);
        requests_wait(worker, reqs, n, op == 0 ? "get batch" : "put batch");
    }
    return clock_ns() - start;
}

/* Follows req for up to 2 s; returns its status, UCS_INPROGRESS if still pending. */
static ucs_status_t request_follow(ucp_worker_h worker, void *req)
{
    uint64_t deadline = clock_ns() + PROBE_CLOSE_NS;
    ucs_status_t status;

    if (req == NULL)
        return UCS_OK;
    if (UCS_PTR_IS_ERR(req))
        return UCS_PTR_STATUS(req);
    while ((status = ucp_request_check_status(req)) == UCS_INPROGRESS && clock_ns() < deadline)
        ucp_worker_progress(worker);
    return status;
}

/* Times ucp_ep_close_nbx (forced or flushed) on an endpoint of `mode` to target t after
 * SIGSTOPping t (once a get has completed the wireup). with_get: post a 1M get from t's user
 * region after the stop and leave it outstanding at the close. A close still pending after the
 * 2 s cap is reported, t is killed, and the close is followed for 2 s more.
 * Returns false if a request is still pending at the end (the worker must then be leaked). */
static bool close_probe(ucp_worker_h worker, struct target *t, int mode, bool force, bool with_get,
                        char *local)
{
    ucp_request_param_t param     = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                     .flags        = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    ucp_request_param_t get_param = {0};
    char label[64];
    ucp_ep_h ep = ep_create(worker, t, mode);
    ucp_rkey_h rkey;
    uint64_t start, elapsed;
    ucs_status_t status, get_status = UCS_OK;
    void *get_req = NULL;
    void *req;

    snprintf(label, sizeof(label), "close[%s,%s,stopped target%s]", mode_names[mode],
             force ? "force" : "flush", with_get ? ",1M get outstanding" : "");
    if (ucp_ep_rkey_unpack(ep, t->rkey_buf[1], &rkey) != UCS_OK)
        fail("ucp_ep_rkey_unpack failed");
    target_command(t, 'p');
    get_one(worker, ep, rkey, t->region_addr[1], local, 4096);
    ep_flush(worker, ep);
    start = clock_ns();
    while (clock_ns() - start < 100000000) /* 100 ms: let both sides finish the wireup */
        ucp_worker_progress(worker);
    kill(t->pid, SIGSTOP);
    target_wait(t, WUNTRACED, PROBE_CLOSE_NS, "stop");
    t->stopped = true;
    if (with_get) {
        get_req = ucp_get_nbx(ep, local, 1048576, t->region_addr[1], rkey, &get_param);
        if (UCS_PTR_IS_ERR(get_req))
            fail("%s: posting the get failed: %s", label,
                 ucs_status_string(UCS_PTR_STATUS(get_req)));
        get_status = get_req == NULL ? UCS_OK : ucp_request_check_status(get_req);
    }
    ucp_rkey_destroy(rkey);

    start   = clock_ns();
    req     = ucp_ep_close_nbx(ep, &param);
    status  = request_follow(worker, req);
    elapsed = clock_ns() - start;
    if (status != UCS_INPROGRESS) {
        printf("%s: completed in %.3f ms, status %s%s\n", label, (double)elapsed / 1e6,
               ucs_status_string(status), req == NULL ? " (returned NULL: done inline)" : "");
        if (req != NULL && !UCS_PTR_IS_ERR(req))
            ucp_request_free(req);
    } else {
        printf("%s: NOT complete after %.0f ms\n", label, (double)elapsed / 1e6);
        fflush(stdout);
        kill(t->pid, SIGKILL);
        target_wait(t, 0, PROBE_CLOSE_NS, "die of SIGKILL");
        t->pid  = -1;
        start   = clock_ns();
        status  = request_follow(worker, req);
        elapsed = clock_ns() - start;
        if (status == UCS_INPROGRESS) {
            printf("%s: still pending %.0f ms after the target was killed\n", label,
                   (double)elapsed / 1e6);
        } else {
            printf("%s: completed %.3f ms after the target was killed, status %s\n", label,
                   (double)elapsed / 1e6, ucs_status_string(status));
            ucp_request_free(req);
        }
    }
    if (with_get) {
        const char *when = get_status == UCS_INPROGRESS ? "pending at the close" : "done before";
        bool pending;

        get_status = request_follow(worker, get_req); /* the close may fail it only later */
        pending    = get_status == UCS_INPROGRESS;
        printf("%s: the get was %s; 2 s later %s\n", label, when,
               pending ? "still pending" : ucs_status_string(get_status));
        if (get_req != NULL && !pending)
            ucp_request_free(get_req);
        if (pending)
            status = UCS_INPROGRESS;
    }
    fflush(stdout);
    return status != UCS_INPROGRESS;
}

/* Whether a 4K get, and a 4K put + flush, complete while target t is blocked in read() and
 * not progressing its worker (none: the transport reaches its memory alone; needed: the
 * operation is emulated over active messages). On entry t is idle; on exit it is idle again. */
static void progress_need_print(ucp_worker_h worker, ucp_ep_h ep, ucp_rkey_h rkey, struct target *t,
                                int mode, int m, char *local)
{
    ucp_request_param_t param = {0};
    const char *need[2];

    nanosleep(&(struct timespec){.tv_nsec = 20000000}, NULL); /* t is surely in read() now */
    for (int op = 0; op < PROBE_NUM_OPS; op++) {
        void *reqs[2] = {NULL, NULL};
        uint64_t deadline;
        bool done;

        if (op == 0) {
            reqs[0] = ucp_get_nbx(ep, local, 4096, t->region_addr[m], rkey, &param);
        } else {
            /* offset 8K: no byte that a later check reads */
            reqs[0] = ucp_put_nbx(ep, local, 4096, t->region_addr[m] + 8192, rkey, &param);
            reqs[1] = ucp_ep_flush_nbx(ep, &param);
        }
        deadline = clock_ns() + 200000000; /* 200 ms */
        for (;;) {
            done = true;
            for (int i = 0; i < 2; i++) {
                if (UCS_PTR_IS_ERR(reqs[i]))
                    fail("progress probe: posting failed");
                if (reqs[i] != NULL && ucp_request_check_status(reqs[i]) == UCS_INPROGRESS)
                    done = false;
            }
            if (done || clock_ns() > deadline)
                break;
            ucp_worker_progress(worker);
        }
        need[op] = done ? "no" : "yes";
        if (!done)
            target_command(t, 'p');
        requests_wait(worker, reqs, 2, "progress probe");
        if (!done)
            target_command(t, 'i');
        nanosleep(&(struct timespec){.tv_nsec = 20000000}, NULL);
    }
    printf("target progress needed[%s,%s]: get %s, put+flush %s\n", mode_names[mode], mem_names[m],
           need[0], need[1]);
}

static bool arg_u64(const char *text, uint64_t lo, uint64_t hi, uint64_t *value_p)
{
    char *end;
    unsigned long long v = strtoull(text, &end, 10);

    if (*text == '\0' || *end != '\0' || v < lo || v > hi)
        return false;
    *value_p = v;
    return true;
}

int main(int argc, char **argv)
{
    uint64_t iters = 200, repeats = 3, batch = 16;
    static uint64_t ns[PROBE_NUM_MODES][PROBE_NUM_MEMS][PROBE_NUM_OPS][PROBE_NUM_SIZES]
                      [PROBE_MAX_REPEATS];
    ucp_params_t params         = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = features};
    ucp_worker_params_t wparams = {.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                   .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_mem_map_params_t mp     = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH};
    ucp_ep_h eps[PROBE_NUM_MODES];
    ucp_rkey_h rkeys[PROBE_NUM_MODES][PROBE_NUM_MEMS];
    int expected[PROBE_NUM_MODES][PROBE_NUM_MEMS] = {{0x11, 0x22}, {0x11, 0x22}}; /* byte 0 */
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_config_t *config;
    ucp_mem_h local_memh;
    bool clean = true;
    char *local;

    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--iters") == 0) {
            if (!arg_u64(argv[++i], 1, 1000000, &iters))
                goto usage_error;
        } else if (i + 1 < argc && strcmp(argv[i], "--repeats") == 0) {
            if (!arg_u64(argv[++i], 1, PROBE_MAX_REPEATS, &repeats))
                goto usage_error;
        } else if (strcmp(argv[i], "--rma-only") == 0) {
            features = UCP_FEATURE_RMA;
        } else if (i + 1 < argc && strcmp(argv[i], "--batch") == 0) {
            if (!arg_u64(argv[++i], 1, PROBE_MAX_BATCH, &batch))
                goto usage_error;
        } else {
            goto usage_error;
        }
    }
    params.features = features; /* after --rma-only */
    setenv("UCX_TLS", "sm,cma,tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);
    region_len = batch * probe_sizes[PROBE_NUM_SIZES - 1];
    printf("errmode_probe: UCX %s, UCX_TLS %s, UCX_NET_DEVICES %s, batch %" PRIu64
           ", iters %" PRIu64 ", repeats %" PRIu64 ", features %s\n",
           ucp_get_version_string(), getenv("UCX_TLS"), getenv("UCX_NET_DEVICES"), batch, iters,
           repeats, features == UCP_FEATURE_RMA ? "rma" : "rma,am,wakeup");

    /* Targets 0-1: benchmarks (none, peer); 2-7: close probes. All forked before ucp_init. */
    for (int i = 0; i < PROBE_NUM_TARGETS; i++)
        target_fork(i == 0);
    local = aligned_alloc(4096, region_len);
    if (local == NULL)
        fail("out of memory for %" PRIu64 " bytes", region_len);
    memset(local, 0, region_len);
    if (ucp_config_read(NULL, NULL, &config) != UCS_OK ||
        ucp_init(&params, config, &context) != UCS_OK)
        fail("ucp_init failed");
    ucp_config_release(config);
    if (ucp_worker_create(context, &wparams, &worker) != UCS_OK)
        fail("ucp_worker_create failed");
    mp.address = local;
    mp.length  = region_len;
    if (ucp_mem_map(context, &mp, &local_memh) != UCS_OK)
        fail("ucp_mem_map of the local buffer failed");
    for (size_t i = 0; i < num_targets; i++)
        target_hello_read(&targets[i]);

    for (int mode = 0; mode < PROBE_NUM_MODES; mode++) {
        char prefix[32];

        eps[mode] = ep_create(worker, &targets[mode], mode);
        for (int m = 0; m < PROBE_NUM_MEMS; m++) {
            if (ucp_ep_rkey_unpack(eps[mode], targets[mode].rkey_buf[m], &rkeys[mode][m]) != UCS_OK)
                fail("ucp_ep_rkey_unpack (%s, %s) failed", mode_names[mode], mem_names[m]);
        }
        target_command(&targets[mode], 'p');
        get_one(worker, eps[mode], rkeys[mode][0], targets[mode].region_addr[0], local, 4096);
        ep_flush(worker, eps[mode]);
        snprintf(prefix, sizeof(prefix), "lanes[%s]:", mode_names[mode]);
        lanes_print(eps[mode], prefix);
        target_command(&targets[mode], 'i');
        for (int m = 0; m < PROBE_NUM_MEMS; m++)
            progress_need_print(worker, eps[mode], rkeys[mode][m], &targets[mode], mode, m, local);
    }
    fflush(stdout);

    /* Repeats interleave the modes, so that the noise of the 2 shared cores falls on both. */
    for (uint64_t r = 0; r < repeats; r++) {
        for (int mode = 0; mode < PROBE_NUM_MODES; mode++) {
            struct target *t = &targets[mode];

            target_command(t, 'p');
            for (int m = 0; m < PROBE_NUM_MEMS; m++) {
                for (int s = 0; s < PROBE_NUM_SIZES; s++) {
                    uint64_t size = probe_sizes[s];
                    char check[64];

                    memset(local, 0, size);
                    ns[mode][m][0][s][r] = rma_run(worker, eps[mode], rkeys[mode][m],
                                                   t->region_addr[m], local, 0, size, batch, iters);
                    if (local[0] != (char)expected[mode][m] ||
                        local[size - 1] != (char)expected[mode][m])
                        fail("get (%s, %s, %" PRIu64 "): wrong bytes", mode_names[mode],
                             mem_names[m], size);
                    memset(local, PROBE_PATTERN_PUT, batch * size);
                    ns[mode][m][1][s][r] = rma_run(worker, eps[mode], rkeys[mode][m],
                                                   t->region_addr[m], local, 1, size, batch, iters);
                    memset(check, 0, sizeof(check));
                    get_one(worker, eps[mode], rkeys[mode][m], t->region_addr[m] + size - 64, check,
                            sizeof(check));
                    if (check[0] != PROBE_PATTERN_PUT || check[63] != PROBE_PATTERN_PUT)
                        fail("put (%s, %s, %" PRIu64 "): bytes not at the target", mode_names[mode],
                             mem_names[m], size);
                    expected[mode][m] = PROBE_PATTERN_PUT;
                }
            }
            target_command(t, 'i');
        }
    }

    printf("\n%-5s %-6s %-4s %8s %10s %10s %10s  (GB/s = 1e9 B/s; min, max of %" PRIu64
           " repeats)\n",
           "mode", "memory", "op", "block", "GB/s", "min", "max", repeats);
    for (int mode = 0; mode < PROBE_NUM_MODES; mode++) {
        for (int m = 0; m < PROBE_NUM_MEMS; m++) {
            for (int op = 0; op < PROBE_NUM_OPS; op++) {
                for (int s = 0; s < PROBE_NUM_SIZES; s++) {
                    uint64_t *v  = ns[mode][m][op][s];
                    double bytes = (double)(probe_sizes[s] * batch * iters);

                    qsort(v, repeats, sizeof(*v), stats_compare);
                    printf("%-5s %-6s %-4s %7" PRIu64 "K %10.3f %10.3f %10.3f\n", mode_names[mode],
                           mem_names[m], op_names[op], probe_sizes[s] / 1024,
                           bytes / (double)v[repeats / 2], bytes / (double)v[repeats - 1],
                           bytes / (double)v[0]);
                }
            }
        }
    }
    printf("\n");

    /* Benchmark endpoints: a flushed close with the target progressing, as a baseline. */
    for (int mode = 0; mode < PROBE_NUM_MODES; mode++) {
        ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = 0};
        uint64_t start;
        void *req;

        for (int m = 0; m < PROBE_NUM_MEMS; m++)
            ucp_rkey_destroy(rkeys[mode][m]);
        target_command(&targets[mode], 'p');
        start = clock_ns();
        req   = ucp_ep_close_nbx(eps[mode], &param);
        requests_wait(worker, &req, 1, "ucp_ep_close_nbx of a benchmark endpoint");
        printf("close[%s,flush,live target]: completed in %.3f ms\n", mode_names[mode],
               (double)(clock_ns() - start) / 1e6);
        target_command(&targets[mode], 'q');
        target_wait(&targets[mode], 0, PROBE_WAIT_NS, "exit");
        targets[mode].pid = -1;
    }
    fflush(stdout);

    /* Stopped targets: forced and flushed closes in peer mode, a flushed one in none mode;
     * first with nothing outstanding, then with a get outstanding (none mode last: in none
     * mode UCX never fails what a dead peer held, so that close may never complete). */
    clean = close_probe(worker, &targets[2], 1, true, false, local) && clean;
    clean = close_probe(worker, &targets[3], 1, false, false, local) && clean;
    clean = close_probe(worker, &targets[4], 0, false, false, local) && clean;
    clean = close_probe(worker, &targets[5], 1, true, true, local) && clean;
    clean = close_probe(worker, &targets[6], 1, false, true, local) && clean;
    if (clean) /* a pending request left by an earlier probe would disturb this one */
        clean = close_probe(worker, &targets[7], 0, false, true, local);
    printf("peer-mode error handler calls: %u\n", ep_errors);

    for (size_t i = 2; i < num_targets; i++) {
        if (targets[i].pid > 0) {
            kill(targets[i].pid, SIGKILL);
            target_wait(&targets[i], 0, PROBE_WAIT_NS, "die of SIGKILL");
        }
    }
    if (!clean) {
        printf("a close request is still pending: the worker and context are left to exit\n");
        return 0;
    }
    ucp_mem_unmap(context, local_memh);
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    for (size_t i = 0; i < num_targets; i++) {
        free(targets[i].address);
        free(targets[i].rkey_buf[0]);
        free(targets[i].rkey_buf[1]);
        close(targets[i].fd);
    }
    free(local);
    return 0;

usage_error:
    fprintf(stderr, "errmode_probe: error: bad arguments\n\n%s", usage);
    return 2;
}

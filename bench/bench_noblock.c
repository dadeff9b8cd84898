/* bench_noblock.c: how long kvx's public posts hold their caller, and how long one turn of the
 * loop lasts under load (issue 23): the p50/p99 of kvx_read_post and kvx_write_post for 1 GiB
 * requests (and post + wait of a few 4 KiB blocks, which must stay fast), the longest turn of
 * the prefill agent's loop while 8 verified 1 GiB pulls flood it with checksum requests, and
 * the longest kvx_xfer_destroy and turn of the decode agent while 16 connections close with
 * 1 GiB pulls in flight towards a stopped prefill process. Printed, never asserted: timings on
 * a shared machine are noisy.
 *
 *   bench_noblock [--transports LIST] [--prefill-malloc] [--pulls N]
 *
 * --prefill-malloc gives the prefill agent memory of its own (malloc) instead of memory UCX
 * allocates, so same-host reads take UCX's lanes (CMA, or kvx-served over TCP) instead of a
 * mapping. Run with UCX_NET_DEVICES=lo. */
#include "bench_common.h"

#include "kvx.h"

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BIG_BLOCKS   1024 /* of 1 MiB: a 1 GiB request */
#define SMALL_BLOCKS 4    /* of 4 KiB: the latency request */
#define SMALL_RUNS   200
#define PUSHES       6
#define FLOOD_PULLS  8     /* verified at once: 8 x 8 checksum requests of 64 MiB out */
#define CLOSING      16    /* connections closed at once */
#define TIMEOUT_MS   20000 /* the agents' deadline: a bound on a hang, not a timing */

static const char layout_json[] =
    "{\"kvx_layout\": 1, \"storages\": [{\"name\": \"big\", \"size\": 1073741824},"
    " {\"name\": \"small\", \"size\": 4194304}], \"views\": ["
    "{\"name\": \"big.mla\", \"group\": 0, \"kind\": \"mla\", \"storage\": \"big\","
    " \"page\": 1048576, \"stride\": 1048576, \"num_blocks\": 1024},"
    "{\"name\": \"small.mla\", \"group\": 1, \"kind\": \"mla\", \"storage\": \"small\","
    " \"page\": 4096, \"stride\": 4096, \"num_blocks\": 1024}]}";

static const char *transports; /* NULL: kvx's default */

/* Nanoseconds this thread ran: a turn's own work, without the time another process had the
 * core (2 shared cores here: wall time alone mostly measures the neighbours). */
static uint64_t cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The longest turn seen: wall and CPU time, ns. */
struct longest {
    uint64_t wall;
    uint64_t cpu;
};

/* One timed turn of `agent` (kvx_agent_progress with timeout 0 runs one). */
static void turn_timed(kvx_agent_t *agent, struct longest *l)
{
    uint64_t wall = clock_ns();
    uint64_t cpu  = cpu_ns();

    kvx_agent_progress(agent, 0);
    wall    = clock_ns() - wall;
    cpu     = cpu_ns() - cpu;
    l->wall = wall > l->wall ? wall : l->wall;
    l->cpu  = cpu > l->cpu ? cpu : l->cpu;
}
static bool prefill_malloc;

static void die(const char *what)
{
    fprintf(stderr, "bench_noblock: %s: %s\n", what, kvx_errmsg());
    exit(1);
}

static kvx_agent_t *agent_make(const char *listen, void **bases)
{
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_INSECURE |
                                               KVX_AGENT_PARAM_FIELD_TIMEOUT_MS,
                                 .insecure   = true,
                                 .timeout_ms = TIMEOUT_MS};
    kvx_layout_t *layout;
    kvx_agent_t *agent;

    if (listen != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_LISTEN;
        params.listen = listen;
    }
    if (transports != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_TRANSPORTS;
        params.transports = transports;
    }
    if (bases != NULL) {
        params.field_mask |= KVX_AGENT_PARAM_FIELD_STORAGE_BASES;
        params.storage_bases = bases;
    }
    if (kvx_layout_load_buffer(layout_json, strlen(layout_json), &layout) != KVX_OK ||
        kvx_agent_create(layout, &params, &agent) != KVX_OK)
        die("creating an agent");
    kvx_layout_destroy(layout);
    return agent;
}

/* The prefill process: serves, and times every turn of its loop (one kvx_agent_progress with
 * timeout 0 is one turn); the parent asks for the longest since its last reset. */
static int prefill(int ready, int command, int answer)
{
    void *bases[2] = {NULL, NULL};
    kvx_agent_t *agent;
    struct longest longest = {0, 0};
    uint64_t size;
    char address[64] = {0};

    if (prefill_malloc) {
        bases[0] = aligned_alloc(4096, (size_t)BIG_BLOCKS << 20);
        bases[1] = aligned_alloc(4096, (size_t)4 << 20);
        if (bases[0] == NULL || bases[1] == NULL)
            return 1;
    }
    agent = agent_make("127.0.0.1:0", prefill_malloc ? bases : NULL);
    for (size_t s = 0; s < 2; s++) {
        uint8_t *base = kvx_agent_storage(agent, s, &size);

        for (uint64_t i = 0; i < size; i += 4096)
            base[i] = (uint8_t)(i >> 12 | 1); /* every page touched, and not zero */
    }
    snprintf(address, sizeof(address), "%s", kvx_agent_listen_address(agent));
    if (write(ready, address, sizeof(address)) != (ssize_t)sizeof(address))
        return 1;
    for (;;) {
        struct pollfd items[2] = {{.fd = kvx_agent_fd(agent), .events = POLLIN},
                                  {.fd = command, .events = POLLIN}};
        char c;

        poll(items, 2, 1);
        if (items[1].revents != 0) {
            if (read(command, &c, 1) != 1 || c == 'q')
                break;
            if (c == 'r')
                longest = (struct longest){0, 0};
            if (c == 'm' && write(answer, &longest, sizeof(longest)) != sizeof(longest))
                break;
        }
        turn_timed(agent, &longest);
    }
    kvx_agent_destroy(agent);
    free(bases[0]);
    free(bases[1]);
    return 0;
}

struct prefill_link {
    pid_t pid;
    int command;
    int answer;
    char address[64];
};

static void prefill_start(struct prefill_link *p)
{
    int ready[2], command[2], answer[2];

    if (pipe(ready) != 0 || pipe(command) != 0 || pipe(answer) != 0)
        exit(1);
    p->pid = fork();
    if (p->pid == 0)
        _exit(prefill(ready[1], command[0], answer[1]));
    p->command = command[1];
    p->answer  = answer[0];
    if (read(ready[0], p->address, sizeof(p->address)) != (ssize_t)sizeof(p->address))
        exit(1);
}

static struct longest prefill_longest_turn(struct prefill_link *p)
{
    struct longest longest = {0, 0};

    if (write(p->command, "m", 1) != 1 ||
        read(p->answer, &longest, sizeof(longest)) != (ssize_t)sizeof(longest))
        exit(1);
    return longest;
}

static void prefill_reset(struct prefill_link *p)
{
    if (write(p->command, "r", 1) != 1)
        exit(1);
}

/* Sorted samples' p50, p99 and max, in microseconds. */
static void samples_print(const char *what, uint64_t *ns, size_t n)
{
    qsort(ns, n, sizeof(*ns), stats_compare);
    printf("%-44s p50 %9.1f us  p99 %9.1f us  max %9.1f us  (%zu runs)\n", what, ns[n / 2] / 1e3,
           ns[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] / 1e3, ns[n - 1] / 1e3, n);
}

static uint64_t big_ids[BIG_BLOCKS];
static uint64_t small_ids[SMALL_BLOCKS] = {3, 100, 517, 1000};

static kvx_request_t big_request(kvx_group_ids_t groups[2])
{
    groups[0] = (kvx_group_ids_t){big_ids, BIG_BLOCKS};
    groups[1] = (kvx_group_ids_t){NULL, 0};
    return (kvx_request_t){groups, 2, NULL, 0, NULL};
}

/* Runs turns of `agent` until every transfer of `xfers` settled (each callback counts into
 * `*settled`), timing each turn; returns the longest, in ns. */
static struct longest turns_until(kvx_agent_t *agent, const size_t *settled, size_t want)
{
    struct longest longest = {0, 0};
    uint64_t end           = clock_ns() + (uint64_t)3 * TIMEOUT_MS * 1000000;

    while (*settled < want && clock_ns() < end) {
        struct pollfd item = {.fd = kvx_agent_fd(agent), .events = POLLIN};

        poll(&item, 1, 1);
        turn_timed(agent, &longest);
    }
    if (*settled < want)
        die("transfers did not settle");
    return longest;
}

static void on_settled(void *arg, kvx_xfer_t *xfer, kvx_status_t status)
{
    (void)xfer;
    (void)status;
    (*(size_t *)arg)++;
}

/* Post p99 of 1 GiB pulls and pushes, and post + wait of a few 4 KiB blocks. */
static void posts_measure(kvx_agent_t *agent, kvx_peer_t *peer, int pulls)
{
    kvx_group_ids_t groups[2];
    kvx_group_ids_t small_groups[2] = {{NULL, 0}, {small_ids, SMALL_BLOCKS}};
    kvx_request_t request           = big_request(groups);
    kvx_request_t small             = {small_groups, 2, NULL, 0, NULL};
    uint64_t small_post[SMALL_RUNS];
    uint64_t small_total[SMALL_RUNS];
    uint64_t *post  = calloc((size_t)(pulls > PUSHES ? pulls : PUSHES), sizeof(*post));
    uint64_t *total = calloc((size_t)pulls, sizeof(*total));
    kvx_xfer_t *xfer;

    if (post == NULL || total == NULL)
        exit(1);
    for (int r = 0; r < SMALL_RUNS; r++) {
        uint64_t start = clock_ns();

        if (kvx_read_post(agent, &peer, 1, 10 + r, &small, NULL, NULL, &xfer) != KVX_OK)
            die("a small pull");
        small_post[r] = clock_ns() - start;
        if (kvx_xfer_wait(xfer) != KVX_OK)
            die("a small pull's wait");
        small_total[r] = clock_ns() - start;
        kvx_xfer_destroy(xfer);
    }
    samples_print("kvx_read_post, 4 blocks of 4 KiB", small_post, SMALL_RUNS);
    samples_print("kvx_read_post + wait, 4 blocks of 4 KiB", small_total, SMALL_RUNS);
    for (int r = 0; r < pulls; r++) {
        uint64_t start = clock_ns();

        if (kvx_read_post(agent, &peer, 1, 1000 + r, &request, NULL, NULL, &xfer) != KVX_OK)
            die("a 1 GiB pull");
        post[r] = clock_ns() - start;
        if (kvx_xfer_wait(xfer) != KVX_OK)
            die("a 1 GiB pull's wait");
        total[r] = clock_ns() - start;
        kvx_xfer_destroy(xfer);
    }
    printf("%-44s %9.1f us (the first: pages fault in on both sides)\n",
           "kvx_read_post, 1 GiB, the first", post[0] / 1e3);
    if (pulls > 1) {
        samples_print("kvx_read_post, 1 GiB (1024 blocks of 1 MiB)", post + 1, (size_t)pulls - 1);
        qsort(total + 1, (size_t)pulls - 1, sizeof(*total), stats_compare);
        printf("%-44s %.2f GB/s median, post to completion (%.2f to %.2f)\n", "  its transfer",
               (double)((uint64_t)BIG_BLOCKS << 20) / (double)total[pulls / 2],
               (double)((uint64_t)BIG_BLOCKS << 20) / (double)total[pulls - 1],
               (double)((uint64_t)BIG_BLOCKS << 20) / (double)total[1]);
    }
    for (int r = 0; r <= PUSHES; r++) {
        uint64_t start = clock_ns();

        if (kvx_write_post(agent, &peer, 1, 2000 + r, &request, NULL, NULL, &xfer) != KVX_OK)
            die("a 1 GiB push");
        if (r == 0)
            printf("%-44s %9.1f us (the first after connecting)\n",
                   "kvx_write_post, 1 GiB, the first", (clock_ns() - start) / 1e3);
        else
            post[r - 1] = clock_ns() - start;
        if (kvx_xfer_wait(xfer) != KVX_OK)
            die("a 1 GiB push's wait");
        kvx_xfer_destroy(xfer);
    }
    samples_print("kvx_write_post, 1 GiB, later ones", post, PUSHES);
    free(post);
    free(total);
}

/* The prefill agent's longest turn while FLOOD_PULLS verified pulls ask for checksums. */
static void flood_measure(kvx_agent_t *agent, kvx_peer_t *peer, struct prefill_link *p)
{
    kvx_group_ids_t groups[2];
    kvx_request_t request = big_request(groups);
    kvx_xfer_t *xfers[FLOOD_PULLS];
    size_t settled = 0;
    struct longest decode;
    struct longest prefill;

    prefill_reset(p);
    for (int i = 0; i < FLOOD_PULLS; i++) {
        if (kvx_read_post(agent, &peer, 1, 3000 + i, &request, on_settled, &settled, &xfers[i]) !=
                KVX_OK ||
            kvx_xfer_verify(xfers[i]) != KVX_OK)
            die("a verified pull");
    }
    decode  = turns_until(agent, &settled, FLOOD_PULLS);
    prefill = prefill_longest_turn(p);
    printf("%-44s %9.1f ms wall, %7.1f ms CPU (%d verified 1 GiB pulls: %d checksum requests"
           " of 64 MiB)\n",
           "longest prefill turn, checksum flood", prefill.wall / 1e6, prefill.cpu / 1e6,
           FLOOD_PULLS, FLOOD_PULLS * 16);
    printf("%-44s %9.1f ms wall, %7.1f ms CPU (it hashes its own side of each answer)\n",
           "  longest decode turn meanwhile", decode.wall / 1e6, decode.cpu / 1e6);
    for (int i = 0; i < FLOOD_PULLS; i++) {
        if (kvx_xfer_status(xfers[i]) != KVX_OK)
            printf("  pull %d: %s\n", i, kvx_xfer_error(xfers[i]));
        kvx_xfer_destroy(xfers[i]);
    }
}

/* CLOSING connections, each with a 1 GiB pull in flight towards a stopped prefill process,
 * closed at once by destroying their transfers; then the turns until every callback ran. */
static void closing_measure(kvx_agent_t *agent, struct prefill_link *p)
{
    kvx_group_ids_t groups[2];
    kvx_request_t request = big_request(groups);
    kvx_peer_t *peers[CLOSING];
    kvx_xfer_t *xfers[CLOSING];
    uint64_t destroy[CLOSING];
    size_t settled = 0;
    struct longest longest;

    for (int i = 0; i < CLOSING; i++) {
        if (kvx_agent_connect(agent, p->address, &peers[i]) != KVX_OK)
            die("connecting");
    }
    for (int i = 0; i < CLOSING; i++) {
        if (kvx_read_post(agent, &peers[i], 1, 4000 + i, &request, on_settled, &settled,
                          &xfers[i]) != KVX_OK)
            die("a pull to close");
    }
    kill(p->pid, SIGSTOP);
    kvx_agent_progress(agent, 0); /* one turn: the pulls are under way */
    for (int i = 0; i < CLOSING; i++) {
        uint64_t start = clock_ns();

        kvx_xfer_destroy(xfers[i]); /* cancels it: its peer's connection closes */
        destroy[i] = clock_ns() - start;
    }
    longest = turns_until(agent, &settled, CLOSING);
    kill(p->pid, SIGCONT);
    samples_print("kvx_xfer_destroy, 1 GiB pull in flight", destroy, CLOSING);
    printf("%-44s %9.1f ms wall, %7.1f ms CPU (%d connections closing, the prefill stopped)\n",
           "longest decode turn until all settled", longest.wall / 1e6, longest.cpu / 1e6, CLOSING);
    for (int i = 0; i < CLOSING; i++)
        kvx_peer_destroy(peers[i]);
    kvx_agent_progress(agent, 0);
}

int main(int argc, char **argv)
{
    struct prefill_link p;
    kvx_agent_t *agent;
    kvx_peer_t *peer;
    char lanes[256];
    int pulls = 20;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--transports") == 0 && i + 1 < argc)
            transports = argv[++i];
        else if (strcmp(argv[i], "--prefill-malloc") == 0)
            prefill_malloc = true;
        else if (strcmp(argv[i], "--pulls") == 0 && i + 1 < argc)
            pulls = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_noblock [--transports LIST] [--prefill-malloc]"
                            " [--pulls N]\n");
            return 2;
        }
    }
    if (pulls < 1)
        pulls = 1;
    for (uint64_t i = 0; i < BIG_BLOCKS; i++)
        big_ids[i] = i;
    prefill_start(&p);
    agent = agent_make(NULL, NULL);
    if (kvx_agent_connect(agent, p.address, &peer) != KVX_OK)
        die("connecting");
    posts_measure(agent, peer, pulls);
    snprintf(lanes, sizeof(lanes), "%s", kvx_peer_transports(peer));
    printf("lanes: %s; prefill memory: %s; UCX %s\n", lanes,
           prefill_malloc ? "malloc" : "UCX-allocated", kvx_ucx_version());
    flood_measure(agent, peer, &p);
    closing_measure(agent, &p);
    kvx_peer_destroy(peer);
    kvx_agent_progress(agent, 0);
    if (kvx_agent_destroy(agent) != KVX_OK)
        die("destroying the agent");
    (void)!write(p.command, "q", 1);
    waitpid(p.pid, NULL, 0);
    return 0;
}

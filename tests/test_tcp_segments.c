/* test_tcp_segments.c: issue 22 finding 8 between real processes on loopback. A libkvx client
 * that sets no UCX_TCP_* of its own (as an engine embedding kvx does not) is pulled from and
 * pushed into over tcp by `kvx serve` sending 256 KiB segments, and stays alive with every
 * byte verified: on UCX 1.13 it once aborted in UCX (tcp_ep.c, "hdr->length <= rx_seg_size"),
 * because only the command line set the sizes. Since UCX carries no TCP (kvx's links do), peers
 * with any segment settings interoperate. The client runs in a child of its own, so an abort in
 * UCX is reported as one. */
#include "layouts.h"
#include "prefill.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#define BLOCKS  16
#define SEED    42
#define WAIT_MS 60000 /* the longest a server may take to start, on a loaded machine */

/* Blocks of 128 KiB, apart (stride twice that) so that each moves as one message of its own:
 * larger than UCX's default 64 KiB receive segment and smaller than its rendezvous threshold,
 * so UCX sends each in segments as large as the sender's. */
static const char layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 4194304}], 'views': ["
    "{'name': 'layers.0.mla', 'kind': 'mla', 'storage': 'kv', 'page': 131072, 'stride': 262144,"
    " 'num_blocks': 16}]}";

/* The files every process of the test shares: the layout and the deployment's secret. */
static char dir[64];
static char layout_path[96];
static char key_path[96];

/* A `kvx serve` process and the address it serves on. */
struct server {
    pid_t pid;
    int out; /* its standard output and error */
    char address[ADDRESS_SIZE];
};

/* What a client child reports. */
struct outcome {
    kvx_status_t connect;  /* of kvx_agent_connect */
    kvx_status_t transfer; /* of the pull or push (KVX_OK if not reached) */
    kvx_status_t check;    /* every byte against the server's pattern */
    char message[600];     /* kvx_errmsg() of the first failure */
};

/* Sets the environment variable `name` to `value`, or unsets it when `value` is NULL. */
static void env_put(const char *name, const char *value)
{
    if (value != NULL)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* Starts `kvx serve` on the layout, filled with SEED, with UCX_TCP_TX_SEG_SIZE and
 * UCX_TCP_RX_SEG_SIZE in its environment as given (NULL: unset), and waits for its
 * "serving ... on HOST:PORT:" line. */
static void server_start(struct server *s, const char *tx, const char *rx)
{
    const char *bin = getenv("KVX_BINARY_DIR");
    char kvx[512];
    char text[4096] = "";
    size_t used     = 0;
    int out[2];

    snprintf(kvx, sizeof(kvx), "%s/kvx", bin != NULL ? bin : ".");
    assert_int_equal(pipe(out), 0);
    s->pid = fork();
    assert_true(s->pid >= 0);
    if (s->pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        dup2(out[1], STDERR_FILENO);
        close(out[0]);
        env_put("UCX_TCP_TX_SEG_SIZE", tx);
        env_put("UCX_TCP_RX_SEG_SIZE", rx);
        execl(kvx, kvx, "serve", layout_path, "--listen", "127.0.0.1:0", "--fill", "42", "--auth",
              key_path, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    s->out = out[0];
    for (;;) {
        struct pollfd item = {.fd = s->out, .events = POLLIN};
        const char *line;
        ssize_t n;

        if (poll(&item, 1, WAIT_MS) != 1)
            fail_msg("kvx serve did not start within %d ms: %s", WAIT_MS, text);
        n = read(s->out, text + used, sizeof(text) - 1 - used);
        if (n <= 0)
            fail_msg("kvx serve exited before it served: %s", text);
        used += (size_t)n;
        text[used] = '\0';
        line       = strstr(text, "serving ");
        if (line != NULL && strstr(line, ": ") != NULL && strstr(line, " on ") != NULL &&
            sscanf(strstr(line, " on ") + 4, "%63[0-9.:]", s->address) == 1) {
            s->address[strlen(s->address) - 1] = '\0'; /* the ':' after HOST:PORT */
            return;
        }
    }
}

/* The server still runs (it did not exit or abort). */
static bool server_alive(const struct server *s)
{
    return waitpid(s->pid, NULL, WNOHANG) == 0;
}

/* Stops the server with SIGTERM and checks that it exits cleanly. */
static void server_stop(struct server *s)
{
    int wstatus;

    assert_int_equal(kill(s->pid, SIGTERM), 0);
    assert_int_equal(waitpid(s->pid, &wstatus, 0), s->pid);
    close(s->out);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
        fail_msg("kvx serve did not stop cleanly: wait status 0x%x", wstatus);
}

/* The client, in a child: an agent on `tcp` with the test's secret, connected to `address`;
 * a pull (or push) of every block, checked against the server's pattern. */
static struct outcome client_work(const char *address, bool push)
{
    static uint64_t ids[BLOCKS];
    kvx_group_ids_t group = {ids, BLOCKS};
    kvx_request_t request = {&group, 1, NULL, 0, NULL};
    uint8_t key[KVX_AUTH_KEY_LEN];
    kvx_agent_params_t params = {.field_mask = KVX_AGENT_PARAM_FIELD_TRANSPORTS |
                                               KVX_AGENT_PARAM_FIELD_AUTH_KEY,
                                 .transports = "tcp",
                                 .auth_key   = key};
    struct outcome o          = {KVX_OK, KVX_OK, KVX_OK, ""};
    kvx_agent_t *agent        = NULL;
    kvx_peer_t *peer          = NULL;
    kvx_status_t status;

    for (uint64_t b = 0; b < BLOCKS; b++)
        ids[b] = b;
    status = kvx_auth_key_load(key_path, key);
    if (status == KVX_OK)
        status = agent_from_quoted(layout, &params, &agent);
    if (status == KVX_OK)
        status = kvx_agent_zero(agent);
    if (status != KVX_OK) {
        o.connect = status;
        snprintf(o.message, sizeof(o.message), "no agent: %s", kvx_errmsg());
        return o;
    }
    o.connect = kvx_agent_connect(agent, address, &peer);
    if (o.connect == KVX_OK)
        o.transfer = (push ? kvx_write : kvx_read)(agent, &peer, 1, 1, &request, NULL);
    if (o.connect == KVX_OK && o.transfer == KVX_OK)
        o.check = kvx_agent_check_pattern(agent, SEED);
    if (o.connect != KVX_OK || o.transfer != KVX_OK || o.check != KVX_OK)
        snprintf(o.message, sizeof(o.message), "%s", kvx_errmsg());
    kvx_peer_destroy(peer);
    kvx_agent_progress(agent, 0);
    kvx_agent_destroy(agent);
    return o;
}

/* Runs client_work in a child whose environment has the given UCX_TCP_* (NULL: unset), and
 * fails the test if UCX killed it. */
static struct outcome client_run(const char *address, bool push, const char *tx, const char *rx)
{
    struct outcome o = {KVX_ERR_INTERNAL, KVX_OK, KVX_OK, "no report"};
    int report[2];
    int wstatus;
    pid_t pid;

    assert_int_equal(pipe(report), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(report[0]);
        alarm(120);
        env_put("UCX_TCP_TX_SEG_SIZE", tx);
        env_put("UCX_TCP_RX_SEG_SIZE", rx);
        o = client_work(address, push);
        _exit(write(report[1], &o, sizeof(o)) == (ssize_t)sizeof(o) ? 0 : 1);
    }
    close(report[1]);
    if (read(report[0], &o, sizeof(o)) != (ssize_t)sizeof(o))
        o = (struct outcome){KVX_ERR_INTERNAL, KVX_OK, KVX_OK, "the client died before reporting"};
    close(report[0]);
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    if (WIFSIGNALED(wstatus))
        fail_msg("the client was killed by signal %d (%s: UCX aborts a receiver on a TCP segment"
                 " larger than its own, issue 22 finding 8)",
                 WTERMSIG(wstatus), strsignal(WTERMSIG(wstatus)));
    return o;
}

/* The client's transfer completed and every byte matched the server's pattern. */
static void assert_verified(const struct outcome *o, const char *what)
{
    if (o->connect != KVX_OK || o->transfer != KVX_OK || o->check != KVX_OK)
        fail_msg("%s: connect %s, transfer %s, check %s: %s", what, kvx_status_str(o->connect),
                 kvx_status_str(o->transfer), kvx_status_str(o->check), o->message);
}

/* `kvx serve` sending 256 KiB segments, as the command line's environment once made it on
 * UCX 1.13, pulled from and pushed into by a client that sets nothing: the library's own
 * sizes let it receive them (they did not, on 1.13: it aborted). */
static void client_without_environment_survives_256k_segments(void **state)
{
    struct server s;
    struct outcome o;

    (void)state;
    server_start(&s, "256k", "256k");
    o = client_run(s.address, false, NULL, NULL);
    assert_verified(&o, "pull over tcp");
    o = client_run(s.address, true, NULL, NULL);
    assert_verified(&o, "push over tcp");
    assert_true(server_alive(&s));
    server_stop(&s);
}

/* Neither side sets anything: the library's sizes on both, pull and push verified. */
static void neither_side_sets_segments(void **state)
{
    struct server s;
    struct outcome o;

    (void)state;
    server_start(&s, NULL, NULL);
    o = client_run(s.address, false, NULL, NULL);
    assert_verified(&o, "pull over tcp");
    o = client_run(s.address, true, NULL, NULL);
    assert_verified(&o, "push over tcp");
    server_stop(&s);
}

/* UCX carries nothing over TCP any more (kvx's links do: issue 36 finding 1), so its segment
 * settings, which once had to agree (a receiver aborted in UCX on a larger segment), no longer
 * matter: a server receiving 8 KiB segments and a client with kvx's 256 KiB, and the other way
 * round, interoperate, pull and push verified, and the server lives. */
static void segment_settings_no_longer_matter(void **state)
{
    struct server s;
    struct outcome o;

    (void)state;
    server_start(&s, NULL, "8k");
    o = client_run(s.address, false, NULL, NULL);
    assert_verified(&o, "pull from a server with 8 KiB segments");
    o = client_run(s.address, true, NULL, NULL);
    assert_verified(&o, "push into a client of a server with 8 KiB segments");
    o = client_run(s.address, false, NULL, "8k");
    assert_verified(&o, "pull with the server's setting");
    assert_true(server_alive(&s));
    server_stop(&s);
    server_start(&s, NULL, NULL);
    o = client_run(s.address, false, NULL, "8k");
    assert_verified(&o, "pull into a client with 8 KiB segments");
    o = client_run(s.address, true, NULL, "8k");
    assert_verified(&o, "push from a client with 8 KiB segments");
    assert_true(server_alive(&s));
    server_stop(&s);
}

static int files_make(void **state)
{
    char text[sizeof(layout)];
    FILE *f;

    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/kvx-segments-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(layout_path, sizeof(layout_path), "%s/layout.json", dir);
    snprintf(key_path, sizeof(key_path), "%s/auth.key", dir);
    for (size_t i = 0; i < sizeof(layout); i++)
        text[i] = layout[i] == '\'' ? '"' : layout[i];
    f = fopen(layout_path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0)
        return -1;
    return kvx_auth_key_create(key_path) == KVX_OK ? 0 : -1;
}

static int files_remove(void **state)
{
    (void)state;
    unlink(layout_path);
    unlink(key_path);
    rmdir(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(client_without_environment_survives_256k_segments),
        cmocka_unit_test(neither_side_sets_segments),
        cmocka_unit_test(segment_settings_no_longer_matter),
    };

    setenv("UCX_NET_DEVICES", "lo", 0); /* never another interface */
    unsetenv("UCX_TCP_TX_SEG_SIZE");    /* the client is an engine that sets none */
    unsetenv("UCX_TCP_RX_SEG_SIZE");
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, files_make, files_remove);
}

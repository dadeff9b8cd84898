/* fuzz_handshake.c: libFuzzer target for the side channel's handshake (gate.c, sidechan.c):
 * the bytes a peer without the secret can send a listening agent before anything is
 * answered. One CURVE listener behind its gate lives for the whole run; each input is written
 * to it on a TCP connection of its own, which then closes, and the listener is served until
 * the gate saw the connection go. Invariant: nothing the input carried ever reaches a verb's
 * handler (CURVE cannot be completed without the keys), and the gate tracks no connection
 * once it closed. Aborts on a broken invariant. */
#include "auth.h"
#include "fuzz_invariant.h"
#include "gate.h"
#include "loop.h"
#include "sidechan.h"

#include <zmq.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void handler_must_not_run(void *arg, const struct sidechan_request *request)
{
    (void)arg;
    (void)request;
    fuzz_fail("an unauthenticated peer's request reached a handler");
}

static const struct sidechan_verb verbs[] = {
    {"kvx-metadata 3", false, handler_must_not_run},
    {"kvx-heartbeat 3", true, handler_must_not_run},
};

static struct listener {
    void *zmq;
    struct loop loop;
    struct gate *gate;
    struct sidechan_server *server;
    int port;
} listener;

static void listener_open(void)
{
    static const uint8_t secret[KVX_AUTH_KEY_LEN] = "the fuzzer's own deployment key";
    const struct sidechan_limits limits           = {1 << 16, 8, 1000};
    const struct gate_limits admission            = {8, 256, 32, 1000};
    struct auth_keys keys;
    char bound[64];

    listener.zmq = zmq_ctx_new();
    if (loop_init(&listener.loop) != KVX_OK || auth_keys_derive(secret, &keys) != KVX_OK ||
        gate_create(listener.zmq, &keys, &admission, &listener.loop, &listener.gate) != KVX_OK ||
        sidechan_server_create(listener.zmq, "127.0.0.1:0", &limits, &keys, listener.gate, bound,
                               sizeof(bound), &listener.server) != KVX_OK)
        fuzz_fail("the listener could not start");
    listener.port = atoi(strrchr(bound, ':') + 1);
}

/* Serves the gate and the listener once; drops log lines (the gate logs refusals). */
static void listener_serve(void)
{
    uint64_t malformed = 0;

    gate_serve(listener.gate);
    sidechan_server_serve(listener.server, verbs, sizeof(verbs) / sizeof(verbs[0]), NULL, 64,
                          &malformed);
    loop_queue_run(&listener.loop); /* its log lines, to nobody */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sockaddr_in to = {.sin_family = AF_INET};
    int fd;

    if (listener.zmq == NULL)
        listener_open();
    to.sin_port        = htons((uint16_t)listener.port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* a full accept queue refuses for a moment: the listener accepts from its own thread */
    for (int attempt = 0;; attempt++) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&to, sizeof(to)) == 0)
            break;
        if (attempt == 1000)
            fuzz_fail("no connection to the listener: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        listener_serve();
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    /* closed with a reset, as a peer may, so that a long run leaves no TIME_WAIT behind */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &(struct linger){1, 0}, sizeof(struct linger));
    for (size_t sent = 0; sent < size;) {
        ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);

        if (n <= 0)
            break; /* the listener closed it: what it may do with bytes it refuses */
        sent += (size_t)n;
        listener_serve();
    }
    close(fd);
    /* until the gate saw it go (a refused handshake, or the close), at most about a second */
    for (int round = 0; round < 1000; round++) {
        listener_serve();
        if (gate_counters(listener.gate)->connections == 0)
            break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    invariant(gate_counters(listener.gate)->connections == 0,
              "a closed connection is not counted open");
    return 0;
}

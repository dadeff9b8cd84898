/* fuzz_link.c: libFuzzer target for kvx's TCP links (tcplink.c), as a peer that proved the key
 * drives one: the input is the byte stream that follows the hello, written into the accepting
 * end of a socket pair, then closed. Every header must decode to what re-encodes to the same
 * bytes; every frame the link hands its owner must hold exactly what its header says, and a
 * body goes only where the owner's sink said. Aborts on a broken invariant; the sanitizers
 * catch a byte written past a buffer. */
#include "fuzz_invariant.h"
#include "msg_mac.h"
#include "tcplink.h"

#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK(c) invariant((c), #c)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SINK_SIZE (64u << 10)

static const uint8_t key[16] = "fuzz the link ok";
static uint8_t sink_area[SINK_SIZE + 64]; /* the tail stays a canary */

struct owner {
    bool down;
    size_t frames;
};

static size_t on_sink(void *arg, struct tcplink *l, const struct tcplink_header *h,
                      const struct iovec **iov)
{
    static struct iovec pieces[3];

    (void)arg;
    (void)l;
    if (h->length > SINK_SIZE)
        return 0; /* dropped: read and thrown away */
    /* three pieces, the middle one empty, so that a body crosses piece boundaries */
    pieces[0] = (struct iovec){sink_area, h->length / 2};
    pieces[1] = (struct iovec){sink_area + h->length / 2, 0};
    pieces[2] = (struct iovec){sink_area + h->length / 2, h->length - h->length / 2};
    *iov      = pieces;
    return 3;
}

static void on_frame(void *arg, struct tcplink *l, const struct tcplink_header *h,
                     const uint8_t *body)
{
    struct owner *o = arg;
    uint8_t again[TCPLINK_HEADER_SIZE];
    struct tcplink_header back;

    (void)l;
    o->frames++;
    /* what the link handed over decodes again from its own encoding */
    tcplink_header_encode(h, again);
    CHECK(tcplink_header_decode(again, &back));
    CHECK(memcmp(&back, h, sizeof(back)) == 0);
    if (h->kind == TCPLINK_DATA || h->kind == TCPLINK_WRITE) {
        CHECK(body == NULL);
    } else {
        CHECK(h->length == 0 || body != NULL);
    }
    if (h->kind == TCPLINK_READ) {
        struct tcplink_range r;

        for (uint32_t i = 0; i < h->count; i++)
            (void)tcplink_range_decode(body, i, &r);
    }
}

static void on_down(void *arg, struct tcplink *l, const char *why)
{
    (void)l;
    (void)why;
    ((struct owner *)arg)->down = true;
}

static const struct tcplink_events events = {.sink = on_sink, .frame = on_frame, .down = on_down};

/* The opener's side of the hello, made here with the key: its first message, then its proof
 * once the acceptor's answer is in. */
static bool hello(int fd, struct tcplink *l)
{
    uint8_t open[40]   = "kvxlink1";
    uint8_t answer[40] = {0};
    uint8_t text[49];
    uint8_t proof[16];
    size_t got = 0;

    memset(open + 8, 0x11, 16);  /* the id */
    memset(open + 24, 0x22, 16); /* the opener's nonce */
    if (write(fd, open, sizeof(open)) != (ssize_t)sizeof(open))
        return false;
    for (int turns = 0; got < sizeof(answer) && turns < 100; turns++) {
        ssize_t r;

        tcplink_progress(l);
        r = recv(fd, answer + got, sizeof(answer) - got, MSG_DONTWAIT);
        if (r > 0)
            got += (size_t)r;
    }
    if (got < sizeof(answer))
        return false;
    text[0] = 'C';
    memcpy(text + 1, open + 8, 16);
    memcpy(text + 17, open + 24, 16);
    memcpy(text + 33, answer + 8, 16);
    msg_mac_siphash(key, text, sizeof(text), proof, sizeof(proof));
    return write(fd, proof, sizeof(proof)) == (ssize_t)sizeof(proof);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct owner o = {0};
    struct tcplink *l;
    int fds[2];
    int epoll_fd = epoll_create1(0);

    if (size >= TCPLINK_HEADER_SIZE) { /* a header: decoded, it re-encodes to its bytes */
        struct tcplink_header h;
        uint8_t again[TCPLINK_HEADER_SIZE];

        if (tcplink_header_decode(data, &h)) {
            tcplink_header_encode(&h, again);
            CHECK(memcmp(again, data, TCPLINK_HEADER_SIZE) == 0);
        }
    }
    if (epoll_fd < 0 || size > 200000 || socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
        if (epoll_fd >= 0)
            close(epoll_fd);
        return 0;
    }
    memset(sink_area + SINK_SIZE, 0x5a, 64);
    CHECK(tcplink_accept(fds[0], key, epoll_fd, &events, &o, &l) == KVX_OK);
    CHECK(hello(fds[1], l));
    for (int turns = 0; turns < 100 && !tcplink_is_up(l); turns++)
        tcplink_progress(l);
    CHECK(tcplink_is_up(l));
    /* the input as the peer's stream, the link reading as it goes (the pair's buffer is small) */
    for (size_t sent = 0; sent < size;) {
        ssize_t w = send(fds[1], data + sent, size - sent, MSG_DONTWAIT);

        if (w > 0)
            sent += (size_t)w;
        if (tcplink_progress(l) == 0 && w <= 0 && (o.down || tcplink_is_down(l)))
            break;
    }
    shutdown(fds[1], SHUT_WR);
    for (int turns = 0; turns < 10000 && !o.down; turns++)
        if (tcplink_progress(l) == 0 && !tcplink_busy(l))
            break;
    for (size_t i = 0; i < 64; i++)
        CHECK(sink_area[SINK_SIZE + i] == 0x5a);
    tcplink_close(l);
    close(fds[1]);
    close(epoll_fd);
    return 0;
}

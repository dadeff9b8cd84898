/* tcplink.c: one connection of kvx's TCP data plane (tcplink.h).
 *
 * The hello, before any frame: both ends prove they know the key and neither trusts a length
 * from the other before that. Every message of it has a fixed size.
 *
 *   opener   -> acceptor   "kvxlink1", the link's id (16), the opener's nonce (16)
 *   acceptor -> opener     "kvxlink1", the acceptor's nonce (16),
 *                          SipHash-128(key, "S" id nonce_o nonce_a)
 *   opener   -> acceptor   SipHash-128(key, "C" id nonce_o nonce_a)
 *
 * Fresh nonces on both sides make a tag seen on the wire useless on another connection, and
 * the two roles tag different bytes, so an acceptor's answer is never an opener's proof. */
#include "tcplink.h"

#include "clock.h"
#include "error.h"
#include "msg_mac.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define HELLO_MAGIC      "kvxlink1"
#define HELLO_MAGIC_LEN  8
#define HELLO_OPEN_LEN   (HELLO_MAGIC_LEN + 16 + 16)          /* magic, id, nonce */
#define HELLO_ANSWER_LEN (HELLO_MAGIC_LEN + 16 + MSG_MAC_LEN) /* magic, nonce, tag */
#define HELLO_PROOF_LEN  MSG_MAC_LEN

/* Bytes read from the socket at once, and what one progress call moves each way at most: a
 * busy link cannot hold the loop (the rest waits for the next turn). */
#define RX_BUFFER  (256u << 10)
#define TURN_BYTES ((size_t)8 << 20)
#define WRITE_IOVS 64

enum state { CONNECTING, HELLO, UP, DOWN };
enum rx_state { RX_HEADER, RX_BODY, RX_SINK };

struct out_frame {
    struct out_frame *next;
    uint8_t header[TCPLINK_HEADER_SIZE];
    uint8_t *inline_body;
    size_t inline_size;
    struct iovec *iov; /* the header, the inline body, the caller's pieces */
    int iovcnt;
    size_t total;
    size_t written;
    tcplink_sent_t sent;
    void *sent_arg;
    const void *owner;
};

struct tcplink {
    int fd;
    int epoll_fd;
    uint32_t watching; /* the epoll events asked for now */
    enum state state;
    bool opener;
    char why[160]; /* why it went down */
    char peer[INET6_ADDRSTRLEN];
    double started;
    const struct tcplink_events *events;
    void *arg;
    struct msg_mac *mac; /* under the key */
    uint8_t id[16];
    uint8_t nonce_o[16];
    uint8_t nonce_a[16];
    /* the hello */
    uint8_t hello_out[HELLO_ANSWER_LEN];
    size_t hello_out_len;
    size_t hello_out_done;
    uint8_t hello_in[HELLO_OPEN_LEN];
    size_t hello_in_need;
    size_t hello_in_len;
    /* frames out */
    struct out_frame *head;
    struct out_frame *tail;
    size_t queued;
    bool writing; /* inside frames_write: a frame queued meanwhile waits for it */
    /* frames in */
    uint8_t *rx;
    size_t rx_len; /* bytes in rx */
    size_t rx_off; /* of them, taken */
    enum rx_state rx_state;
    struct tcplink_header h; /* the frame being received */
    uint8_t *body;           /* RX_BODY: its body */
    size_t body_cap;
    size_t body_done;
    const struct iovec *sink; /* RX_SINK: where its body goes (the owner's); none: dropped */
    size_t sink_cnt;
    size_t sink_at;  /* the piece being filled */
    size_t sink_off; /* bytes of it filled */
    size_t sink_left;
};

static void tcplink_down(struct tcplink *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static size_t frames_write(struct tcplink *l, size_t budget);

void tcplink_fail(struct tcplink *l, const char *why)
{
    tcplink_down(l, "%s", why);
}

/* A frame out is done with: its sender is told whether it went whole, and it is freed. */
static void frame_end_sent(struct out_frame *f, bool sent)
{
    if (f->sent != NULL)
        f->sent(f->sent_arg, sent);
    free(f->inline_body);
    free(f->iov);
    free(f);
}

static void frames_fail(struct tcplink *l)
{
    while (l->head != NULL) {
        struct out_frame *f = l->head;

        l->head = f->next;
        frame_end_sent(f, false);
    }
    l->tail   = NULL;
    l->queued = 0;
}

static void tcplink_down(struct tcplink *l, const char *fmt, ...)
{
    va_list ap;

    if (l->state == DOWN)
        return;
    va_start(ap, fmt);
    vsnprintf(l->why, sizeof(l->why), fmt, ap);
    va_end(ap);
    l->state = DOWN;
    if (l->fd >= 0) {
        epoll_ctl(l->epoll_fd, EPOLL_CTL_DEL, l->fd, NULL);
        close(l->fd);
        l->fd = -1;
    }
    frames_fail(l);
    if (l->events->down != NULL)
        l->events->down(l->arg, l, l->why);
}

/* Asks epoll for what the link can use: reading unless its queue out is full, writing while
 * it has something to write or is connecting. */
static void watch_update(struct tcplink *l)
{
    uint32_t want = 0;
    struct epoll_event ev;

    if (l->state == DOWN)
        return;
    if (l->state == CONNECTING || l->hello_out_done < l->hello_out_len ||
        (l->state == UP && l->head != NULL))
        want |= EPOLLOUT;
    if (l->state != CONNECTING && l->queued < TCPLINK_QUEUE_MAX)
        want |= EPOLLIN;
    if (want == l->watching)
        return;
    ev = (struct epoll_event){.events = want, .data.ptr = l};
    if (epoll_ctl(l->epoll_fd, EPOLL_CTL_MOD, l->fd, &ev) == 0)
        l->watching = want;
}

static kvx_status_t tcplink_new(int fd, const uint8_t key[16], int epoll_fd,
                                const struct tcplink_events *events, void *arg,
                                struct tcplink **tcplink_p)
{
    struct tcplink *l = calloc(1, sizeof(*l));
    struct epoll_event ev;
    kvx_status_t status;
    int one = 1;

    if (l == NULL || (l->rx = malloc(RX_BUFFER)) == NULL) {
        free(l);
        close(fd);
        return error_no_memory("a link");
    }
    l->fd       = fd;
    l->epoll_fd = epoll_fd;
    l->events   = events;
    l->arg      = arg;
    l->started  = clock_seconds();
    l->watching = EPOLLIN | EPOLLOUT;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); /* whatever the caller made it */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    status = msg_mac_create(key, &l->mac);
    ev     = (struct epoll_event){.events = l->watching, .data.ptr = l};
    if (status == KVX_OK && epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
        status = error_set(KVX_ERR_INTERNAL, "link: watching its socket: %s", strerror(errno));
    if (status != KVX_OK) {
        msg_mac_destroy(l->mac);
        free(l->rx);
        free(l);
        close(fd);
        return status;
    }
    *tcplink_p = l;
    return KVX_OK;
}

/* What a role's tag covers: the role, the link's id and both nonces. */
#define HELLO_TEXT_LEN (1 + 16 + 16 + 16)
static void hello_text(const struct tcplink *l, char role, uint8_t text[HELLO_TEXT_LEN])
{
    text[0] = (uint8_t)role;
    memcpy(text + 1, l->id, 16);
    memcpy(text + 17, l->nonce_o, 16);
    memcpy(text + 33, l->nonce_a, 16);
}

static void hello_tag(struct tcplink *l, char role, uint8_t tag[MSG_MAC_LEN])
{
    uint8_t text[HELLO_TEXT_LEN];

    hello_text(l, role, text);
    msg_mac_tag(l->mac, text, sizeof(text), tag);
}

static bool hello_verify(struct tcplink *l, char role, const uint8_t tag[MSG_MAC_LEN])
{
    uint8_t text[HELLO_TEXT_LEN];

    hello_text(l, role, text);
    return msg_mac_verify(l->mac, text, sizeof(text), tag);
}

kvx_status_t tcplink_connect(const char *host, uint16_t port, const uint8_t key[16],
                             const uint8_t id[16], int epoll_fd,
                             const struct tcplink_events *events, void *arg,
                             struct tcplink **tcplink_p)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai   = NULL;
    char service[8];
    struct tcplink *l;
    kvx_status_t status;
    int fd;
    int rc;

    snprintf(service, sizeof(service), "%u", port);
    if ((rc = getaddrinfo(host, service, &hints, &ai)) != 0)
        return error_set(KVX_ERR_PEER_DOWN, "link: resolving %s: %s", host, gai_strerror(rc));
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS)) {
        status = error_set(KVX_ERR_PEER_DOWN, "link: connecting to %s:%u: %s", host, port,
                           strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return status;
    }
    freeaddrinfo(ai);
    if ((status = tcplink_new(fd, key, epoll_fd, events, arg, &l)) != KVX_OK)
        return status;
    if (RAND_bytes(l->nonce_o, sizeof(l->nonce_o)) != 1) {
        tcplink_close(l);
        return error_set(KVX_ERR_INTERNAL, "link: no random bytes for a nonce");
    }
    l->opener = true;
    l->state  = CONNECTING;
    memcpy(l->id, id, 16);
    snprintf(l->peer, sizeof(l->peer), "%s", host);
    memcpy(l->hello_out, HELLO_MAGIC, HELLO_MAGIC_LEN);
    memcpy(l->hello_out + HELLO_MAGIC_LEN, l->id, 16);
    memcpy(l->hello_out + HELLO_MAGIC_LEN + 16, l->nonce_o, 16);
    l->hello_out_len = HELLO_OPEN_LEN;
    l->hello_in_need = HELLO_ANSWER_LEN;
    watch_update(l);
    *tcplink_p = l;
    return KVX_OK;
}

kvx_status_t tcplink_accept(int fd, const uint8_t key[16], int epoll_fd,
                            const struct tcplink_events *events, void *arg,
                            struct tcplink **tcplink_p)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    struct tcplink *l;
    kvx_status_t status = tcplink_new(fd, key, epoll_fd, events, arg, &l);

    if (status != KVX_OK)
        return status;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0)
        getnameinfo((struct sockaddr *)&ss, len, l->peer, sizeof(l->peer), NULL, 0, NI_NUMERICHOST);
    if (RAND_bytes(l->nonce_a, sizeof(l->nonce_a)) != 1) {
        tcplink_close(l);
        return error_set(KVX_ERR_INTERNAL, "link: no random bytes for a nonce");
    }
    l->state         = HELLO;
    l->hello_in_need = HELLO_OPEN_LEN;
    watch_update(l);
    *tcplink_p = l;
    return KVX_OK;
}

void tcplink_close(struct tcplink *l)
{
    if (l == NULL)
        return;
    l->events = &(const struct tcplink_events){0}; /* no event from the close itself */
    tcplink_down(l, "closed");
    msg_mac_destroy(l->mac);
    free(l->rx);
    free(l->body);
    free(l);
}

kvx_status_t tcplink_send(struct tcplink *l, const struct tcplink_header *h,
                          const void *inline_body, size_t inline_size, const struct iovec *iov,
                          int iovcnt, tcplink_sent_t sent, void *sent_arg, const void *owner)
{
    struct out_frame *f;

    if (l->state == DOWN)
        return error_set(KVX_ERR_PEER_DOWN, "link to %s: %s", l->peer, l->why);
    if ((f = calloc(1, sizeof(*f))) == NULL ||
        (f->iov = malloc((size_t)(iovcnt + 2) * sizeof(*f->iov))) == NULL ||
        (inline_size > 0 && (f->inline_body = malloc(inline_size)) == NULL)) {
        if (f != NULL)
            free(f->iov);
        free(f);
        return error_no_memory("a frame");
    }
    tcplink_header_encode(h, f->header);
    f->iov[f->iovcnt++] = (struct iovec){f->header, TCPLINK_HEADER_SIZE};
    if (inline_size > 0) {
        memcpy(f->inline_body, inline_body, inline_size);
        f->iov[f->iovcnt++] = (struct iovec){f->inline_body, inline_size};
    }
    for (int i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len > 0)
            f->iov[f->iovcnt++] = iov[i];
    }
    f->total    = TCPLINK_HEADER_SIZE + h->length;
    f->sent     = sent;
    f->sent_arg = sent_arg;
    f->owner    = owner;
    if (l->tail != NULL)
        l->tail->next = f;
    else
        l->head = f;
    l->tail = f;
    l->queued++;
    /* Written at once where the socket takes it: waiting for the loop's next turn to see the
     * socket writable cost a wakeup per message (a 4 KiB push took 1.7x as long). Not from
     * inside frames_write (a `sent` callback that answers): it goes on with the queue. */
    if (l->state == UP && !l->writing)
        frames_write(l, TURN_BYTES);
    watch_update(l);
    return KVX_OK;
}

bool tcplink_drop(struct tcplink *l, const void *owner)
{
    struct out_frame **at = &l->head;
    bool clean            = true;

    l->tail = NULL;
    while (*at != NULL) {
        struct out_frame *f = *at;

        if (f->owner != owner) {
            l->tail = f;
            at      = &f->next;
            continue;
        }
        if (f->written > 0) {
            clean   = false;
            l->tail = f;
            at      = &f->next;
            continue;
        }
        *at = f->next;
        l->queued--;
        frame_end_sent(f, false);
    }
    watch_update(l);
    return clean;
}

/* Writes what the queue holds, up to `budget` bytes; frames written whole are told. */
static size_t frames_write(struct tcplink *l, size_t budget)
{
    size_t moved = 0;

    l->writing = true;
    while (l->head != NULL && moved < budget) {
        struct iovec iov[WRITE_IOVS];
        int n = 0;
        ssize_t w;

        /* gather from the frames in order, skipping what of the first was written */
        for (struct out_frame *f = l->head; f != NULL && n < WRITE_IOVS; f = f->next) {
            size_t skip = f->written;

            for (int i = 0; i < f->iovcnt && n < WRITE_IOVS; i++) {
                if (skip >= f->iov[i].iov_len) {
                    skip -= f->iov[i].iov_len;
                    continue;
                }
                iov[n++] =
                    (struct iovec){(char *)f->iov[i].iov_base + skip, f->iov[i].iov_len - skip};
                skip = 0;
            }
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};

        w = sendmsg(l->fd, &msg, MSG_NOSIGNAL); /* a peer gone is an error here, not SIGPIPE */
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            l->writing = false;
            tcplink_down(l, "writing: %s", strerror(errno));
            return moved;
        }
        moved += (size_t)w;
        while (w > 0 && l->head != NULL) {
            struct out_frame *f = l->head;
            size_t take = f->total - f->written < (size_t)w ? f->total - f->written : (size_t)w;

            f->written += take;
            w -= (ssize_t)take;
            if (f->written < f->total)
                break;
            l->head = f->next;
            if (l->head == NULL)
                l->tail = NULL;
            l->queued--;
            frame_end_sent(f, true);
            if (l->state == DOWN) /* the callback closed it */
                break;
        }
    }
    l->writing = false;
    return moved;
}

/* Reads what the socket has into the receive buffer (taken bytes first moved out of the way);
 * false when the peer closed or failed (the link is down then). */
static bool rx_fill(struct tcplink *l, size_t *moved)
{
    ssize_t r;

    if (l->rx_off > 0) {
        memmove(l->rx, l->rx + l->rx_off, l->rx_len - l->rx_off);
        l->rx_len -= l->rx_off;
        l->rx_off = 0;
    }
    if (l->rx_len == RX_BUFFER)
        return true;
    r = recv(l->fd, l->rx + l->rx_len, RX_BUFFER - l->rx_len, 0);
    if (r == 0) {
        tcplink_down(l, "the peer closed it");
        return false;
    }
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return true;
        tcplink_down(l, "reading: %s", strerror(errno));
        return false;
    }
    l->rx_len += (size_t)r;
    *moved += (size_t)r;
    return true;
}

static size_t rx_have(const struct tcplink *l)
{
    return l->rx_len - l->rx_off;
}

/* ---- the hello ---- */

static void hello_step(struct tcplink *l)
{
    uint8_t *in = l->hello_in;

    if (l->opener && l->hello_in_need == HELLO_ANSWER_LEN) { /* the acceptor's answer */
        if (memcmp(in, HELLO_MAGIC, HELLO_MAGIC_LEN) != 0) {
            tcplink_down(l, "the peer is not a kvx link (its hello)");
            return;
        }
        memcpy(l->nonce_a, in + HELLO_MAGIC_LEN, 16);
        if (!hello_verify(l, 'S', in + HELLO_MAGIC_LEN + 16)) {
            tcplink_down(l, "the peer did not prove the link's key");
            return;
        }
        hello_tag(l, 'C', l->hello_out);
        l->hello_out_len  = HELLO_PROOF_LEN;
        l->hello_out_done = 0;
        l->hello_in_need  = 0;
        l->state          = UP; /* the acceptor closes it if the proof is wrong */
        if (l->events->up != NULL)
            l->events->up(l->arg, l);
        return;
    }
    if (!l->opener && l->hello_in_need == HELLO_OPEN_LEN) { /* the opener's first bytes */
        if (memcmp(in, HELLO_MAGIC, HELLO_MAGIC_LEN) != 0) {
            tcplink_down(l, "the peer is not a kvx link (its hello)");
            return;
        }
        memcpy(l->id, in + HELLO_MAGIC_LEN, 16);
        memcpy(l->nonce_o, in + HELLO_MAGIC_LEN + 16, 16);
        memcpy(l->hello_out, HELLO_MAGIC, HELLO_MAGIC_LEN);
        memcpy(l->hello_out + HELLO_MAGIC_LEN, l->nonce_a, 16);
        hello_tag(l, 'S', l->hello_out + HELLO_MAGIC_LEN + 16);
        l->hello_out_len  = HELLO_ANSWER_LEN;
        l->hello_out_done = 0;
        l->hello_in_need  = HELLO_PROOF_LEN;
        l->hello_in_len   = 0;
        return;
    }
    /* the acceptor: the opener's proof */
    if (!hello_verify(l, 'C', in)) {
        tcplink_down(l, "the peer did not prove the link's key");
        return;
    }
    l->hello_in_need = 0;
    l->state         = UP;
    if (l->events->up != NULL)
        l->events->up(l->arg, l);
}

/* Moves hello bytes both ways as far as the socket lets them; returns the bytes moved. */
static size_t hello_run(struct tcplink *l)
{
    size_t moved = 0;

    while (l->state == HELLO || (l->state == UP && l->hello_out_done < l->hello_out_len)) {
        if (l->hello_out_done < l->hello_out_len) {
            ssize_t w = send(l->fd, l->hello_out + l->hello_out_done,
                             l->hello_out_len - l->hello_out_done, MSG_NOSIGNAL);

            if (w < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                    break;
                tcplink_down(l, "writing its hello: %s", strerror(errno));
                break;
            }
            l->hello_out_done += (size_t)w;
            moved += (size_t)w;
            continue;
        }
        if (l->state != HELLO)
            break;
        /* exactly the hello's bytes, never more: what follows it is frames */
        ssize_t r =
            recv(l->fd, l->hello_in + l->hello_in_len, l->hello_in_need - l->hello_in_len, 0);

        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            tcplink_down(l, r == 0 ? "the peer closed it in its hello" : "reading its hello: %s",
                         strerror(errno));
            break;
        }
        if (r < 0)
            break;
        moved += (size_t)r;
        l->hello_in_len += (size_t)r;
        if (l->hello_in_len == l->hello_in_need) {
            l->hello_in_len = 0;
            hello_step(l);
        }
    }
    return moved;
}

/* ---- frames in ---- */

/* A header in hand: checks it and sets up where its body goes. */
static void frame_begin(struct tcplink *l)
{
    struct tcplink_header *h = &l->h;

    if (!tcplink_header_decode(l->rx + l->rx_off, h)) {
        tcplink_down(l, "the peer sent a malformed frame header");
        return;
    }
    l->rx_off += TCPLINK_HEADER_SIZE;
    if (h->kind == TCPLINK_DATA || h->kind == TCPLINK_WRITE) {
        size_t sum = 0;

        l->sink     = NULL;
        l->sink_cnt = h->length > 0 ? l->events->sink(l->arg, l, h, &l->sink) : 0;
        if (l->state == DOWN)
            return;
        for (size_t i = 0; i < l->sink_cnt; i++)
            sum += l->sink[i].iov_len;
        if (l->sink_cnt > 0 && sum != h->length) {
            tcplink_down(l, "a frame's body does not fit where it goes"); /* the owner's bug */
            return;
        }
        l->sink_at   = 0;
        l->sink_off  = 0;
        l->sink_left = h->length;
        l->rx_state  = RX_SINK;
        return;
    }
    if (h->length > l->body_cap) {
        uint8_t *body = realloc(l->body, h->length);

        if (body == NULL) {
            tcplink_down(l, "no memory for a frame of %llu bytes", (unsigned long long)h->length);
            return;
        }
        l->body     = body;
        l->body_cap = h->length;
    }
    l->body_done = 0;
    l->rx_state  = RX_BODY;
}

/* `n` bytes of the body went to the piece being filled. */
static void sink_advance(struct tcplink *l, size_t n)
{
    l->sink_left -= n;
    l->sink_off += n;
    while (l->sink_at < l->sink_cnt && l->sink_off == l->sink[l->sink_at].iov_len) {
        l->sink_at++;
        l->sink_off = 0;
    }
}

/* Puts `n` bytes of body where they go (or nowhere: a dropped body). */
static void sink_put(struct tcplink *l, const uint8_t *from, size_t n)
{
    if (l->sink_at == l->sink_cnt) { /* dropped */
        l->sink_left -= n;
        return;
    }
    while (n > 0) {
        const struct iovec *v = &l->sink[l->sink_at];
        size_t take           = v->iov_len - l->sink_off < n ? v->iov_len - l->sink_off : n;

        memcpy((char *)v->iov_base + l->sink_off, from, take);
        from += take;
        n -= take;
        sink_advance(l, take);
    }
}

/* Receives a large body straight into its memory, past the buffer; false when the socket had
 * nothing more. */
static bool sink_recv(struct tcplink *l, size_t *moved)
{
    const struct iovec *v = &l->sink[l->sink_at];
    ssize_t r = recv(l->fd, (char *)v->iov_base + l->sink_off, v->iov_len - l->sink_off, 0);

    if (r == 0) {
        tcplink_down(l, "the peer closed it");
        return false;
    }
    if (r < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            tcplink_down(l, "reading: %s", strerror(errno));
        return false;
    }
    *moved += (size_t)r;
    sink_advance(l, (size_t)r);
    return true;
}

static void frame_end(struct tcplink *l, const uint8_t *body)
{
    struct tcplink_header h = l->h;

    l->rx_state = RX_HEADER;
    l->events->frame(l->arg, l, &h, body);
}

/* Receives frames, up to `budget` bytes. */
static size_t frames_read(struct tcplink *l, size_t budget)
{
    size_t moved = 0;

    while (l->state == UP && moved < budget && l->queued < TCPLINK_QUEUE_MAX) {
        switch (l->rx_state) {
        case RX_HEADER:
            if (rx_have(l) < TCPLINK_HEADER_SIZE) {
                size_t before = rx_have(l);

                if (!rx_fill(l, &moved) || rx_have(l) == before)
                    return moved;
                continue;
            }
            frame_begin(l);
            continue;
        case RX_BODY: {
            size_t take = l->h.length - l->body_done;

            if (take > rx_have(l))
                take = rx_have(l);
            if (take > 0) /* an empty body has no buffer */
                memcpy(l->body + l->body_done, l->rx + l->rx_off, take);
            l->rx_off += take;
            l->body_done += take;
            if (l->body_done == l->h.length) {
                frame_end(l, l->body);
                continue;
            }
            if (!rx_fill(l, &moved) || rx_have(l) == 0)
                return moved;
            continue;
        }
        case RX_SINK: {
            size_t take = l->sink_left < rx_have(l) ? l->sink_left : rx_have(l);

            sink_put(l, l->rx + l->rx_off, take);
            l->rx_off += take;
            if (l->sink_left == 0) {
                frame_end(l, NULL);
                continue;
            }
            /* large bodies go straight from the socket to their memory */
            if (l->sink_at < l->sink_cnt && l->sink_left >= RX_BUFFER / 4) {
                if (!sink_recv(l, &moved))
                    return moved;
                continue;
            }
            if (!rx_fill(l, &moved) || rx_have(l) == 0)
                return moved;
            continue;
        }
        }
    }
    return moved;
}

size_t tcplink_progress(struct tcplink *l)
{
    size_t moved = 0;

    if (l->state == DOWN)
        return 0;
    if (l->state == CONNECTING) {
        struct pollfd p = {.fd = l->fd, .events = POLLOUT};
        int err         = 0;
        socklen_t len   = sizeof(err);

        if (poll(&p, 1, 0) <= 0)
            return 0; /* still connecting */
        /* writable: connected, or refused (its error says so) */
        if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
            tcplink_down(l, "connecting to %s: %s", l->peer, strerror(err != 0 ? err : errno));
            return 1;
        }
        l->state = HELLO;
        moved++;
    }
    moved += hello_run(l);
    if (l->state == UP) {
        moved += frames_write(l, TURN_BYTES);
        if (l->state == UP)
            moved += frames_read(l, TURN_BYTES);
        if (l->state == UP && l->head != NULL)
            moved += frames_write(l, TURN_BYTES);
    }
    watch_update(l);
    return moved;
}

bool tcplink_busy(const struct tcplink *l)
{
    /* a whole header (or the rest of a body) already in the buffer: no socket event will say so */
    return l->state == UP && l->queued < TCPLINK_QUEUE_MAX && rx_have(l) > 0 &&
           (l->rx_state != RX_HEADER || rx_have(l) >= TCPLINK_HEADER_SIZE);
}

bool tcplink_named(const struct tcplink *l)
{
    return l->state == UP ||
           (l->state == HELLO && !l->opener && l->hello_in_need == HELLO_PROOF_LEN);
}

const char *tcplink_why(const struct tcplink *l)
{
    return l->why;
}

bool tcplink_is_up(const struct tcplink *l)
{
    return l->state == UP;
}

bool tcplink_is_down(const struct tcplink *l)
{
    return l->state == DOWN;
}

const uint8_t *tcplink_id(const struct tcplink *l)
{
    return l->id;
}

size_t tcplink_queued(const struct tcplink *l)
{
    return l->queued;
}

const char *tcplink_peer(const struct tcplink *l)
{
    return l->peer;
}

double tcplink_started(const struct tcplink *l)
{
    return l->started;
}

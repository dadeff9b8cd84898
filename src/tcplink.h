/* tcplink.h: kvx's own TCP data plane, one connection of it: a non-blocking socket that proves
 * both ends know a 128-bit key before it reads any length from the other (its hello), then
 * carries kvx's frames (tcplink_frame.h) both ways: a queue of frames out, written with writev
 * straight from the memory they name, and frames in, each checked before a byte of its body is
 * read, bodies that carry bulk data received straight into the memory their owner names.
 *
 * UCX's TCP transport trusts the lengths a peer sends before anything proves who it is (issue
 * 36 finding 1: one message of a claimed megabyte overran its receive buffer), so kvx moves
 * nothing over it: across hosts the bytes go over links. A link knows nothing of storages,
 * grants or operations: its owner (transport_link.c) does, through tcplink_events. */
#ifndef KVX_SRC_TCPLINK_H
#define KVX_SRC_TCPLINK_H

#include "kvx.h"
#include "tcplink_frame.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct tcplink;

/* What a link asks of its owner. Every call comes from inside tcplink_progress. */
struct tcplink_events {
    /* Where the body of a DATA or WRITE frame goes: points *iov at pieces of memory that
     * together hold exactly h->length bytes (the owner's, alive until the frame event) and
     * returns their count, or returns 0 to have the body read and dropped. */
    size_t (*sink)(void *arg, struct tcplink *l, const struct tcplink_header *h,
                   const struct iovec **iov);
    /* A whole frame arrived: its body is in `body` (READ, MSG, AM; valid during the call) or
     * already in the sink's memory (DATA, WRITE; `body` is NULL). */
    void (*frame)(void *arg, struct tcplink *l, const struct tcplink_header *h,
                  const uint8_t *body);
    /* The link is up: both ends proved the key. */
    void (*up)(void *arg, struct tcplink *l);
    /* The link failed or was closed by the peer (`why` says which); nothing more comes. */
    void (*down)(void *arg, struct tcplink *l, const char *why);
};

/* A queued frame was written to the socket whole (`sent` true), or the link went down first
 * (false): the memory its iovecs named may be reused. It must not close the link. */
typedef void (*tcplink_sent_t)(void *arg, bool sent);

/* Frames in a link's queue out at most; past it the link reads nothing more from its peer
 * until some were written (a peer that never reads its answers holds only its own link). An
 * honest peer has at most TRANSPORT's window of requests out, far fewer. */
#define TCPLINK_QUEUE_MAX 4096

/* Connects to `host`:`port` without waiting, as the side that opens links: it proves `key`
 * and names itself by `id` (a push writer finds the link so: transport_link.c). The socket is
 * watched through `epoll_fd` (its events carry `l` as data.ptr). */
kvx_status_t tcplink_connect(const char *host, uint16_t port, const uint8_t key[16],
                             const uint8_t id[16], int epoll_fd,
                             const struct tcplink_events *events, void *arg,
                             struct tcplink **tcplink_p);
/* Takes a socket `fd` accepted by a listener: the peer proves `key`. */
kvx_status_t tcplink_accept(int fd, const uint8_t key[16], int epoll_fd,
                            const struct tcplink_events *events, void *arg,
                            struct tcplink **tcplink_p);
/* Closes the socket at once: nothing more is read into any memory, queued frames are told
 * `sent` false, no event comes after it. NULL-safe. */
void tcplink_close(struct tcplink *l);

/* Takes the link down from inside one of its events (a frame its owner refuses): the socket
 * closes, queued frames are told `sent` false, `down` comes, and nothing more is read. Free
 * it with tcplink_close, outside its events. */
void tcplink_fail(struct tcplink *l, const char *why);

/* Queues a frame: the header (copied), `inline_size` bytes at `inline_body` (copied), then the
 * `iovcnt` pieces of memory (named, not copied: they must stay until `sent` ran). The frame's
 * h->length must be inline_size plus the pieces' sizes. `owner` tags it for tcplink_drop. It
 * is written at once as far as the socket takes it, so `sent` (and, if the write fails, the
 * link's `down`) may run before this returns. */
kvx_status_t tcplink_send(struct tcplink *l, const struct tcplink_header *h,
                          const void *inline_body, size_t inline_size, const struct iovec *iov,
                          int iovcnt, tcplink_sent_t sent, void *sent_arg, const void *owner);
/* Drops the queued frames tagged `owner` that no byte of was written (they are told `sent`
 * false); false when one of them is partly written: the link must then be closed. */
bool tcplink_drop(struct tcplink *l, const void *owner);

/* Does what the socket allows, a bounded amount per call; returns the work done. Events come
 * from here; the link may be down after it (tcplink_is_down). */
size_t tcplink_progress(struct tcplink *l);
/* Work the link can do without waiting for its socket (bytes in hand): do not sleep. */
bool tcplink_busy(const struct tcplink *l);

bool tcplink_is_up(const struct tcplink *l);
/* Accepted, and its opener named it (its id is known): up, or proving its key. */
bool tcplink_named(const struct tcplink *l);
/* Why it went down (once tcplink_is_down). */
const char *tcplink_why(const struct tcplink *l);
bool tcplink_is_down(const struct tcplink *l);
const uint8_t *tcplink_id(const struct tcplink *l); /* 16 bytes */
size_t tcplink_queued(const struct tcplink *l);     /* frames in its queue out */
/* The peer's address ("198.18.1.2"), for the owner's bounds on links per address. */
const char *tcplink_peer(const struct tcplink *l);
/* Seconds (clock_seconds) when it was opened or accepted. */
double tcplink_started(const struct tcplink *l);

#endif

/* transport_link.c: a transport's connections over kvx's own TCP links (tcplink.h), where its
 * transports include tcp: UCX then carries nothing over TCP (its receive path trusts a peer's
 * lengths before anything proves who it is: issue 36 finding 1), and a peer on another host,
 * or in another network namespace, is reached over a link instead.
 *
 * A connection opens its link to the peer's listener (the port in its worker address, at the
 * host its side channel was reached at) and proves the peer's read grant; the peer serves its
 * reads there, checking each range against its storages, and a push writer of the peer's
 * finds that same link by its id (transport_conn_address) and writes into our storages over
 * it, each write with our write grant. So only the side that listens accepts links, and
 * closing a connection closes its link: nothing of it lands after.
 *
 * Requests are answered in order, so each link keeps its requests in a queue; an answer must
 * be the queue's head, or the link is a liar and goes down. */
#define _GNU_SOURCE /* accept4 */
#include "clock.h"
#include "error.h"
#include "msg_mac.h"
#include "tcplink.h"
#include "transport_private.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* A link accepted must prove its key within this long; at most LINK_HELLOS may be proving at
 * once (more: the oldest of the address with the most goes, so a source crowds out only
 * itself), and at most LINK_ACCEPTED may be open. */
#define LINK_HELLO_SECONDS 5.0
#define LINK_HELLOS        64
#define LINK_ACCEPTED      1024

/* The trailer a listening transport adds to its worker address, and a link reference (what a
 * push writer is given to find the link its decode peer opened). */
#define TRAILER_MAGIC "kvxlnk01"
/* magic, port and zeros, host id, the key a link proves (the read grant's token: the address
 * travels where grants do, to authenticated peers only) */
#define TRAILER_SIZE (8 + 8 + TRANSPORT_HOST_ID_SIZE + TRANSPORT_TOKEN_SIZE)
#define REF_MAGIC    "kvxlref1"
#define REF_SIZE     (8 + 16)

/* One of our reads or writes on a link, until its answer. */
struct link_request {
    struct link_request *next;
    struct transport_link *tl;
    struct transport_op *op; /* NULL: its connection went; the answer is taken and dropped */
    struct transport_conn *conn;
    uint8_t kind; /* TCPLINK_READ or TCPLINK_WRITE */
    uint64_t cookie;
    uint64_t length; /* READ: of the answer's body */
    int count;
    struct iovec iov[]; /* READ: where its bytes go */
};

struct transport_link {
    struct transport *t;
    struct tcplink *link;
    struct transport_conn *conn; /* the connection that opened it; NULL: accepted */
    unsigned borrowers;          /* accepted: push writers' connections on it */
    struct transport_link *prev; /* in t->links_accepted */
    struct transport_link *next;
    struct link_request *head; /* in the order sent */
    struct link_request *tail;
    uint64_t next_cookie;
    bool write_granted;    /* the WRITE being received */
    struct iovec write_to; /* where its bytes go */
};

/* A READ's answer being sent: the ranges of our storages, and the attachment for the hook. */
struct link_answer {
    struct transport *t;
    struct transport_link *tl;
    bool served; /* not refused */
    uint32_t attach_size;
    uint8_t attach[TCPLINK_ATTACH_MAX];
    struct iovec iov[];
};

static const struct tcplink_events link_events;

/* ---- requests ---- */

static void request_unlink(struct transport_link *tl, struct link_request *r)
{
    struct link_request **at = &tl->head;

    tl->tail = NULL;
    while (*at != NULL && *at != r) {
        tl->tail = *at;
        at       = &(*at)->next;
    }
    if (*at == NULL)
        return;
    *at = r->next;
    while (*at != NULL) {
        tl->tail = *at;
        at       = &(*at)->next;
    }
}

static void request_end(struct link_request *r, ucs_status_t status)
{
    struct transport_op *op = r->op;

    free(r);
    if (op != NULL)
        transport_op_complete(op, status);
}

/* A request's frame did not go (the link went down, or its connection dropped it). */
static void request_unsent(void *arg, bool sent)
{
    struct link_request *r = arg;

    if (sent)
        return;
    request_unlink(r->tl, r);
    request_end(r, UCS_ERR_CANCELED);
}

static void requests_fail(struct transport_link *tl)
{
    while (tl->head != NULL) {
        struct link_request *r = tl->head;

        tl->head = r->next;
        request_end(r, UCS_ERR_CONNECTION_RESET);
    }
    tl->tail = NULL;
}

static kvx_status_t request_send(struct transport_link *tl, struct link_request *r,
                                 struct tcplink_header *h, const void *inline_body,
                                 size_t inline_size, const struct iovec *iov, int iovcnt)
{
    kvx_status_t status;

    r->tl     = tl;
    r->cookie = h->cookie = ++tl->next_cookie;
    if (tl->tail != NULL)
        tl->tail->next = r;
    else
        tl->head = r;
    tl->tail = r;
    if (r->op != NULL)
        transport_op_posted_one(r->op);
    status = tcplink_send(tl->link, h, inline_body, inline_size, iov, iovcnt, request_unsent, r,
                          r->conn);
    if (status != KVX_OK) {
        request_unlink(tl, r);
        request_end(r, UCS_ERR_CANCELED);
    }
    return status;
}

/* ---- serving the peer ---- */

static bool token_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t diff = 0;

    for (size_t i = 0; i < TRANSPORT_TOKEN_SIZE; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

/* Where [offset, offset + length) of our storage `index` is, if the link may touch it: a
 * storage of host memory, the range non-empty and inside it. */
static void *storage_range(const struct transport *t, uint32_t index, uint64_t offset,
                           uint64_t length)
{
    const struct transport_mem *mem = index < t->num_mems ? t->mems[index] : NULL;

    if (mem == NULL || mem->device || length == 0 || offset > mem->size ||
        length > mem->size - offset)
        return NULL;
    return (char *)mem->address + offset;
}

static void answer_sent(void *arg, bool sent)
{
    struct link_answer *a = arg;

    if (a->attach_size > 0 && a->t->read_hook != NULL) {
        struct transport_msg_from from = {a->t, NULL, sent ? a->tl : NULL};

        a->t->read_hook(a->t->read_hook_arg, a->attach, a->attach_size, sent && a->served, &from);
    }
    free(a);
}

/* A READ: answered with the bytes of every range, or refused whole. Only on a link the peer
 * opened to us: it proved our read grant. */
static void read_serve(struct transport_link *tl, const struct tcplink_header *h,
                       const uint8_t *body)
{
    struct transport *t          = tl->t;
    struct link_answer *a        = malloc(sizeof(*a) + h->count * sizeof(struct iovec));
    struct tcplink_header answer = {.kind = TCPLINK_DATA, .cookie = h->cookie};
    bool ok                      = a != NULL && tl->conn == NULL;
    uint64_t total               = 0;

    for (uint32_t i = 0; ok && i < h->count; i++) {
        struct tcplink_range range;
        void *at;

        ok = tcplink_range_decode(body, i, &range) &&
             (at = storage_range(t, range.storage, range.offset, range.length)) != NULL &&
             range.length <= UINT64_MAX - total;
        if (ok) {
            a->iov[i] = (struct iovec){at, range.length};
            total += range.length;
        }
    }
    if (a == NULL) {
        tcplink_fail(tl->link, "no memory for an answer");
        return;
    }
    a->t           = t;
    a->tl          = tl;
    a->served      = ok;
    a->attach_size = h->attach;
    memcpy(a->attach, body + (size_t)h->count * TCPLINK_RANGE_SIZE, h->attach);
    if (ok) {
        t->counters.reads++;
        answer.length = total;
    } else {
        t->counters.refused++;
        answer.status = TCPLINK_REFUSED;
    }
    if (tcplink_send(tl->link, &answer, NULL, 0, a->iov, ok ? (int)h->count : 0, answer_sent, a,
                     NULL) != KVX_OK)
        answer_sent(a, false);
}

/* ---- the link's events ---- */

static size_t link_sink(void *arg, struct tcplink *l, const struct tcplink_header *h,
                        const struct iovec **iov)
{
    struct transport_link *tl = arg;
    struct link_request *r    = tl->head;

    if (h->kind == TCPLINK_WRITE) { /* a peer's push writer, with our write grant */
        void *at = token_equal(h->token, tl->t->write_token)
                       ? storage_range(tl->t, h->storage, h->offset, h->length)
                       : NULL;

        tl->write_granted = at != NULL;
        if (at == NULL)
            return 0; /* read and dropped, then refused */
        tl->write_to = (struct iovec){at, h->length};
        *iov         = &tl->write_to;
        return 1;
    }
    /* an answer to our oldest request, of exactly the length it asked for */
    if (r == NULL || r->kind != TCPLINK_READ || r->cookie != h->cookie || r->length != h->length) {
        tcplink_fail(l, "the peer answered a read it was not asked");
        return 0;
    }
    if (r->op == NULL)
        return 0; /* its connection went: dropped */
    *iov = r->iov;
    return (size_t)r->count;
}

static void message_deliver(struct transport_link *tl, const struct tcplink_header *h,
                            const uint8_t *body)
{
    struct transport *t = tl->t;

    if (h->kind == TCPLINK_AM) {
        if (t->am[h->id].handler != NULL)
            t->am[h->id].handler(t->am[h->id].arg, body, h->length);
        return;
    }
    /* a message on a link we opened reaches only handlers set for connections too */
    struct msg_slot *slot = &t->msg[h->id];

    if (slot->handler != NULL && (tl->conn == NULL || slot->conns)) {
        struct transport_msg_from from = {t, NULL, tl};

        slot->handler(slot->arg, body, h->length, &from);
    }
}

static void link_frame(void *arg, struct tcplink *l, const struct tcplink_header *h,
                       const uint8_t *body)
{
    struct transport_link *tl = arg;
    struct link_request *r    = tl->head;

    tl->t->progressing++;
    switch (h->kind) {
    case TCPLINK_READ:
        read_serve(tl, h, body);
        break;
    case TCPLINK_WRITE: {
        struct tcplink_header answer = {.kind = TCPLINK_WRITTEN, .cookie = h->cookie};

        if (tl->write_granted) {
            tl->t->counters.writes++;
        } else {
            tl->t->counters.refused++;
            answer.status = TCPLINK_REFUSED;
        }
        tl->write_granted = false;
        tcplink_send(l, &answer, NULL, 0, NULL, 0, NULL, NULL, NULL);
        break;
    }
    case TCPLINK_DATA:
    case TCPLINK_WRITTEN:
        if (r == NULL || r->cookie != h->cookie ||
            r->kind != (h->kind == TCPLINK_DATA ? TCPLINK_READ : TCPLINK_WRITE)) {
            tcplink_fail(l, "the peer answered a request it was not asked");
            break;
        }
        tl->head = r->next;
        if (tl->head == NULL)
            tl->tail = NULL;
        request_end(r, h->status == TCPLINK_OK ? UCS_OK : UCS_ERR_REJECTED);
        break;
    default: /* TCPLINK_MSG, TCPLINK_AM */
        message_deliver(tl, h, body);
        break;
    }
    tl->t->progressing--;
}

static void link_up(void *arg, struct tcplink *l)
{
    (void)arg;
    (void)l;
}

static void link_down(void *arg, struct tcplink *l, const char *why)
{
    struct transport_link *tl = arg;

    (void)l;
    if (tl->conn != NULL)
        snprintf(tl->conn->link_down, sizeof(tl->conn->link_down), "%s", why);
    tl->t->progressing++;
    requests_fail(tl);
    tl->t->progressing--;
}

static const struct tcplink_events link_events = {
    .sink  = link_sink,
    .frame = link_frame,
    .up    = link_up,
    .down  = link_down,
};

static void link_free(struct transport_link *tl)
{
    tcplink_close(tl->link); /* queued frames fail: their requests go with their ops told */
    requests_fail(tl);
    free(tl);
}

/* ---- the listener and the links accepted ---- */

static void accepted_unlink(struct transport_link *tl)
{
    struct transport *t = tl->t;

    if (tl->prev != NULL)
        tl->prev->next = tl->next;
    else
        t->links_accepted = tl->next;
    if (tl->next != NULL)
        tl->next->prev = tl->prev;
    t->num_links_accepted--;
}

/* Room for one more link proving its key: the oldest of the address with the most goes. */
static void hellos_bound(struct transport *t)
{
    struct transport_link *victim = NULL;
    size_t proving                = 0;
    size_t most                   = 0;

    for (struct transport_link *a = t->links_accepted; a != NULL; a = a->next)
        proving += !tcplink_is_up(a->link) && !tcplink_is_down(a->link);
    if (proving < LINK_HELLOS)
        return;
    for (struct transport_link *a = t->links_accepted; a != NULL; a = a->next) {
        size_t same = 0;

        if (tcplink_is_up(a->link) || tcplink_is_down(a->link))
            continue;
        for (struct transport_link *b = t->links_accepted; b != NULL; b = b->next)
            same += !tcplink_is_up(b->link) && !tcplink_is_down(b->link) &&
                    strcmp(tcplink_peer(a->link), tcplink_peer(b->link)) == 0;
        /* the list is newest first: ties go to the older */
        if (same >= most) {
            most   = same;
            victim = a;
        }
    }
    if (victim != NULL)
        tcplink_fail(victim->link, "too many links proving their key");
}

static size_t links_accept(struct transport *t)
{
    size_t accepted = 0;

    for (;;) {
        int fd = accept4(t->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        struct transport_link *tl;

        if (fd < 0)
            return accepted; /* EAGAIN, or a connection gone before it was taken */
        accepted++;
        if (t->num_links_accepted >= LINK_ACCEPTED || (tl = calloc(1, sizeof(*tl))) == NULL) {
            close(fd);
            continue;
        }
        hellos_bound(t);
        tl->t = t;
        if (tcplink_accept(fd, t->read_token, t->link_epoll, &link_events, tl, &tl->link) !=
            KVX_OK) {
            free(tl);
            continue;
        }
        tl->next = t->links_accepted;
        if (tl->next != NULL)
            tl->next->prev = tl;
        t->links_accepted = tl;
        t->num_links_accepted++;
    }
}

/* A marker in the link epoll set's events: the listener (the main worker's has NULL). */
static int listener_marker;

size_t link_plane_progress(struct transport *t)
{
    struct epoll_event evs[64];
    size_t worked = 0;
    int n         = epoll_wait(t->link_epoll, evs, 64, 0);

    for (int i = 0; i < n; i++) {
        if (evs[i].data.ptr == &listener_marker)
            worked += links_accept(t);
        else if (evs[i].data.ptr != NULL) /* a link's socket: tcplink.c watches it so */
            worked += tcplink_progress(evs[i].data.ptr);
    }
    for (struct transport_link *tl = t->links_accepted; tl != NULL; tl = tl->next) {
        if (tcplink_busy(tl->link))
            worked += tcplink_progress(tl->link);
    }
    return worked;
}

bool link_plane_busy(const struct transport *t)
{
    for (const struct transport_link *tl = t->links_accepted; tl != NULL; tl = tl->next) {
        if (tcplink_busy(tl->link))
            return true;
    }
    return false;
}

size_t link_plane_reap(struct transport *t)
{
    struct transport_link *tl = t->links_accepted;
    size_t reaped             = 0;
    double now                = -1;

    while (tl != NULL) {
        struct transport_link *next = tl->next;

        if (!tcplink_is_up(tl->link) && !tcplink_is_down(tl->link)) {
            if (now < 0)
                now = clock_seconds();
            if (now - tcplink_started(tl->link) > LINK_HELLO_SECONDS)
                tcplink_fail(tl->link, "it did not prove its key in time");
        }
        if (tcplink_is_down(tl->link) && tl->borrowers == 0) {
            accepted_unlink(tl);
            link_free(tl);
            reaped++;
        }
        tl = next;
    }
    return reaped;
}

/* What tells this host and network namespace from others: the kernel's boot id and the
 * namespace's inode. Two processes with the same id reach each other over UCX's shared memory;
 * others (another host, or a network namespace of this one, where UCX's shared memory stalls)
 * over links. */
static void host_id_read(uint8_t id[TRANSPORT_HOST_ID_SIZE])
{
    char boot[64] = "";
    struct stat st;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    uint8_t text[sizeof(boot) + sizeof(st.st_ino) + sizeof(st.st_dev)] = {0};

    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    memcpy(text, boot, sizeof(boot));
    if (stat("/proc/self/ns/net", &st) == 0) {
        memcpy(text + sizeof(boot), &st.st_ino, sizeof(st.st_ino));
        memcpy(text + sizeof(boot) + sizeof(st.st_ino), &st.st_dev, sizeof(st.st_dev));
    }
    msg_mac_siphash((const uint8_t[MSG_MAC_KEY_LEN]){0}, text, sizeof(text), id,
                    TRANSPORT_HOST_ID_SIZE);
}

kvx_status_t link_plane_create(struct transport *t, int worker_fd)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};

    t->listen_fd  = -1;
    t->link_epoll = epoll_create1(EPOLL_CLOEXEC);
    if (t->link_epoll < 0 ||
        (worker_fd >= 0 && epoll_ctl(t->link_epoll, EPOLL_CTL_ADD, worker_fd, &ev) != 0)) {
        if (t->link_epoll >= 0)
            close(t->link_epoll);
        t->link_epoll = -1;
        return error_set(KVX_ERR_INTERNAL, "transport: an epoll set for links: %s",
                         strerror(errno));
    }
    host_id_read(t->host_id);
    return KVX_OK;
}

void link_plane_destroy(struct transport *t)
{
    while (t->links_accepted != NULL) {
        struct transport_link *tl = t->links_accepted;

        accepted_unlink(tl);
        link_free(tl);
    }
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    if (t->link_epoll >= 0)
        close(t->link_epoll);
}

kvx_status_t transport_listen(struct transport *t, const char *host)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai   = NULL;
    struct sockaddr_storage ss;
    socklen_t len         = sizeof(ss);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listener_marker};
    int one               = 1;
    int fd;
    int rc;

    if (!t->links || t->listen_fd >= 0)
        return KVX_OK;
    if (strcmp(host, "*") == 0 || host[0] == '\0')
        host = NULL; /* every interface, as the side channel */
    if ((rc = getaddrinfo(host, "0", &hints, &ai)) != 0)
        return error_set(KVX_ERR_INVALID, "transport: the links' address %s: %s",
                         host != NULL ? host : "*", gai_strerror(rc));
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0 ||
        epoll_ctl(t->link_epoll, EPOLL_CTL_ADD, fd, &ev) != 0) {
        kvx_status_t status = error_set(KVX_ERR_IO, "transport: listening for links at %s: %s",
                                        host != NULL ? host : "*", strerror(errno));

        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return status;
    }
    freeaddrinfo(ai);
    t->listen_fd   = fd;
    t->listen_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                    : ((struct sockaddr_in *)&ss)->sin_port);
    return KVX_OK;
}

/* ---- addresses ---- */

size_t link_trailer_size(const struct transport *t)
{
    return t->listen_fd >= 0 ? TRAILER_SIZE : 0;
}

void link_trailer_write(const struct transport *t, uint8_t *out)
{
    memset(out, 0, TRAILER_SIZE);
    memcpy(out, TRAILER_MAGIC, 8);
    out[8] = (uint8_t)(t->listen_port & 0xff);
    out[9] = (uint8_t)(t->listen_port >> 8);
    memcpy(out + 16, t->host_id, TRANSPORT_HOST_ID_SIZE);
    memcpy(out + 16 + TRANSPORT_HOST_ID_SIZE, t->read_token, TRANSPORT_TOKEN_SIZE);
}

bool link_trailer_read(const void *address, size_t *size, struct link_address *out)
{
    const uint8_t *p = (const uint8_t *)address + *size - TRAILER_SIZE;

    if (*size <= TRAILER_SIZE || memcmp(p, TRAILER_MAGIC, 8) != 0)
        return false;
    out->port = (uint16_t)(p[8] | p[9] << 8);
    memcpy(out->host_id, p + 16, TRANSPORT_HOST_ID_SIZE);
    memcpy(out->key, p + 16 + TRANSPORT_HOST_ID_SIZE, TRANSPORT_TOKEN_SIZE);
    *size -= TRAILER_SIZE;
    return true;
}

bool link_ref_read(const void *address, size_t size, uint8_t id[16])
{
    if (size != REF_SIZE || memcmp(address, REF_MAGIC, 8) != 0)
        return false;
    memcpy(id, (const uint8_t *)address + 8, 16);
    return true;
}

kvx_status_t link_conn_address(struct transport_conn *conn, void **buf_p, size_t *size_p)
{
    uint8_t *ref = malloc(REF_SIZE);

    if (ref == NULL)
        return error_no_memory("a link reference");
    memcpy(ref, REF_MAGIC, 8);
    memcpy(ref + 8, tcplink_id(conn->link->link), 16);
    *buf_p  = ref;
    *size_p = REF_SIZE;
    return KVX_OK;
}

/* ---- connections over links ---- */

/* The worker's event descriptor, watched with the link's (a connection with both). */
static int worker_fd(ucp_worker_h worker)
{
    int fd = -1;

    return ucp_worker_get_efd(worker, &fd) == UCS_OK ? fd : -1;
}

kvx_status_t link_conn_open(struct transport_conn *conn, const char *host,
                            const struct link_address *at)
{
    struct transport_link *tl = calloc(1, sizeof(*tl));
    uint8_t id[16];
    kvx_status_t status;

    if (tl == NULL)
        return error_no_memory("a link");
    if (host == NULL) {
        free(tl);
        return error_set(KVX_ERR_INVALID, "transport: the peer is on another host or network "
                                          "namespace, and its side channel's host is not known "
                                          "here");
    }
    conn->link_epoll = epoll_create1(EPOLL_CLOEXEC);
    if (conn->link_epoll < 0 || RAND_bytes(id, sizeof(id)) != 1 ||
        (conn->worker != NULL &&
         epoll_ctl(conn->link_epoll, EPOLL_CTL_ADD, worker_fd(conn->worker),
                   &(struct epoll_event){.events = EPOLLIN, .data.ptr = NULL}) != 0)) {
        free(tl);
        return error_set(KVX_ERR_INTERNAL, "transport: a link's epoll set or id");
    }
    tl->t    = conn->t;
    tl->conn = conn;
    status =
        tcplink_connect(host, at->port, at->key, id, conn->link_epoll, &link_events, tl, &tl->link);
    if (status != KVX_OK) {
        free(tl);
        return status;
    }
    conn->link = tl;
    snprintf(conn->link_to, sizeof(conn->link_to), "%s:%u", host, at->port);
    return KVX_OK;
}

void transport_links_share(struct transport *t, struct transport *listener)
{
    t->link_source = listener;
}

kvx_status_t link_conn_borrow(struct transport_conn *conn, const uint8_t id[16])
{
    struct transport *source     = conn->t->link_source != NULL ? conn->t->link_source : conn->t;
    struct transport_link *found = NULL;

    /* The decode side registers once its end of the link is up, so this end has its id, but
     * may not have taken its proof yet (or this process has not turned since): writes then
     * wait in the link's queue until it is up, and fail if it never is. */
    link_plane_progress(source);
    for (struct transport_link *tl = source->links_accepted; tl != NULL; tl = tl->next) {
        if (tcplink_named(tl->link) && memcmp(tcplink_id(tl->link), id, 16) == 0 &&
            (found == NULL || tcplink_is_up(tl->link)))
            found = tl;
    }
    if (found == NULL)
        return error_set(KVX_ERR_PEER_DOWN,
                         "transport: the link the decode side opened to this agent is gone");
    found->borrowers++;
    conn->link          = found;
    conn->link_borrowed = true;
    /* never ready: the link is progressed with its listener's transport */
    conn->link_epoll = epoll_create1(EPOLL_CLOEXEC);
    snprintf(conn->link_to, sizeof(conn->link_to), "%s (its link)", tcplink_peer(found->link));
    return conn->link_epoll >= 0
               ? KVX_OK
               : error_set(KVX_ERR_INTERNAL, "transport: an epoll set: %s", strerror(errno));
}

void link_conn_close(struct transport_conn *conn)
{
    struct transport_link *tl = conn->link;

    conn->link = NULL;
    if (conn->link_epoll >= 0)
        close(conn->link_epoll);
    conn->link_epoll = -1;
    if (tl == NULL)
        return;
    if (!conn->link_borrowed) {
        link_free(tl);
        return;
    }
    /* a writer on the peer's link: its frames not begun are dropped; one begun takes the link
     * down (its bytes would no longer be ours to send); answers still to come are dropped */
    if (!tcplink_drop(tl->link, conn))
        tcplink_fail(tl->link, "a writer closed in the middle of a write");
    for (struct link_request *r = tl->head; r != NULL; r = r->next) {
        if (r->conn == conn && r->op != NULL) {
            struct transport_op *op = r->op;

            r->op   = NULL;
            r->conn = NULL;
            transport_op_complete(op, UCS_ERR_CANCELED);
        }
    }
    tl->borrowers--;
}

kvx_status_t transport_conn_ready(struct transport_conn *conn, bool *ready_p)
{
    struct tcplink *l = conn->link != NULL ? conn->link->link : NULL;

    *ready_p = l == NULL || tcplink_is_up(l);
    if (l != NULL && tcplink_is_down(l))
        return error_set(KVX_ERR_PEER_DOWN, "its data link (%s): %s", conn->link_to,
                         tcplink_why(l));
    return KVX_OK;
}

size_t link_conn_progress(struct transport_conn *conn)
{
    if (conn->link_borrowed) /* the link is its listener's transport's */
        return link_plane_progress(conn->link->t);
    return tcplink_progress(conn->link->link);
}

bool link_conn_busy(const struct transport_conn *conn)
{
    return tcplink_busy(conn->link->link);
}

void link_conn_describe(const struct transport_conn *conn, char *buf, size_t size)
{
    snprintf(buf, size, "kvx-tcp(%s)", conn->link_to);
}

/* Reads of the peer's storages into our host memory, as few READs as the ranges allow; the
 * attachment goes with the post's only READ. */
kvx_status_t link_reads_post(struct transport_op *op, const struct tcplink_range *ranges,
                             void *const *locals, size_t count)
{
    struct transport_conn *conn = op->conn;

    for (size_t first = 0; first < count;) {
        size_t n    = count - first < TCPLINK_READ_RANGES ? count - first : TCPLINK_READ_RANGES;
        bool attach = first == 0 && n == count && op->attach_size > 0;
        size_t body = n * TCPLINK_RANGE_SIZE + (attach ? op->attach_size : 0);
        struct link_request *r  = malloc(sizeof(*r) + n * sizeof(struct iovec));
        uint8_t *bytes          = malloc(body);
        struct tcplink_header h = {.kind   = TCPLINK_READ,
                                   .count  = (uint32_t)n,
                                   .attach = attach ? (uint32_t)op->attach_size : 0,
                                   .length = body};
        kvx_status_t status;

        if (r == NULL || bytes == NULL) {
            free(r);
            free(bytes);
            return error_no_memory("a read");
        }
        *r = (struct link_request){.op = op, .conn = conn, .kind = TCPLINK_READ, .count = (int)n};
        for (size_t i = 0; i < n; i++) {
            tcplink_range_encode(&ranges[first + i], bytes + i * TCPLINK_RANGE_SIZE);
            r->iov[i] = (struct iovec){locals[first + i], ranges[first + i].length};
            r->length += ranges[first + i].length;
        }
        if (attach)
            memcpy(bytes + n * TCPLINK_RANGE_SIZE, op->attach, op->attach_size);
        status = request_send(conn->link, r, &h, bytes, body, NULL, 0);
        free(bytes);
        if (status != KVX_OK)
            return status;
        op->attached = op->attached || attach;
        first += n;
    }
    return KVX_OK;
}

kvx_status_t link_write_post(struct transport_op *op, uint32_t storage, uint64_t offset,
                             const void *local, uint64_t len)
{
    struct transport_conn *conn = op->conn;
    struct link_request *r      = malloc(sizeof(*r));
    struct tcplink_header h     = {
            .kind = TCPLINK_WRITE, .storage = storage, .offset = offset, .length = len};
    struct iovec iov = {(void *)local, len};

    if (r == NULL)
        return error_no_memory("a write");
    if (conn->settling) { /* closing: nothing more is written (docs/agent.md "Push") */
        free(r);
        return error_set(KVX_ERR_PEER_DOWN, "transport: the connection is closing");
    }
    *r = (struct link_request){.op = op, .conn = conn, .kind = TCPLINK_WRITE};
    memcpy(h.token, conn->storages[storage].token, TCPLINK_TOKEN_SIZE);
    return request_send(conn->link, r, &h, NULL, 0, &iov, 1);
}

static void am_sent(void *arg, bool sent)
{
    transport_op_complete(arg, sent ? UCS_OK : UCS_ERR_CANCELED);
}

kvx_status_t link_am_post(struct transport_op *op, unsigned id, const void *data, size_t size)
{
    struct tcplink_header h = {.kind = TCPLINK_AM, .id = (uint8_t)id, .length = size};
    kvx_status_t status;

    transport_op_posted_one(op);
    status = tcplink_send(op->conn->link->link, &h, data, size, NULL, 0, am_sent, op, op->conn);
    if (status != KVX_OK)
        transport_op_complete(op, UCS_ERR_CANCELED);
    return status;
}

kvx_status_t link_msg_send(struct transport_link *tl, unsigned id, const void *data, size_t size)
{
    struct tcplink_header h = {.kind = TCPLINK_MSG, .id = (uint8_t)id, .length = size};

    if (size > TRANSPORT_MSG_MAX)
        return error_set(KVX_ERR_INTERNAL, "transport: a message of %zu bytes", size);
    return tcplink_send(tl->link, &h, data, size, NULL, 0, NULL, NULL, NULL);
}

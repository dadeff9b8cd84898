/* transport_am.c: kvx's own reads and writes, over UCX active messages, for transports on
 * which UCX checks no remote key. Over TCP UCX emulates gets and puts in software and its
 * target serves any address with any key (docs/security.md "The data plane"), so such a
 * transport hands peers grants instead of keys, and serves their requests itself:
 *
 *   read     requester -> owner   header: read token, cookie, storage, offset, length; then
 *                                 the attachment, if any
 *   reads    requester -> owner   header: read token, cookie, count; then count ranges
 *                                 (storage, offset, length): small reads, one message; then
 *                                 the attachment, if any
 *   data     owner -> requester   header: cookie, status; then the bytes (eager or rendezvous),
 *                                 a vectored read's ranges one after the other
 *   write    writer -> owner      header: write token, cookie, storage, offset; then the bytes
 *   written  owner -> writer      header: cookie, status, once the bytes are in memory
 *
 * The owner checks the token and that (storage, offset, length) lies inside one of its
 * storages before it touches memory; anything else is answered "refused" and counted. The
 * requester matches an answer to its request by the cookie (index and generation, so an
 * answer to a request that ended finds nothing) and takes exactly the length it asked for.
 * An attachment (transport_op_attach: a done, for kvx) goes to the owner's read hook once the
 * answer was sent, saying whether its bytes had left the owner's memory by then.
 * Large messages go by UCX's rendezvous, which moves them with the fastest lane it has (a CMA
 * or RDMA get of the sender's own buffer).
 *
 * The owner keeps a record of each answer until UCX is done with it, and a rendezvous answer
 * is done only once its requester took the bytes: a requester that asks and never takes them
 * (stopped, dead, or an insider doing it on purpose) holds records. Each requester (the
 * endpoint its messages come with) has a share of them, AM_SHARE, past which its messages are
 * refused; all of them together stay under AM_MAX_SERVING; and a record older than AM_ANSWER_MS
 * is written off: it counts against neither any more (am_replies_expire says why that is all
 * that can be done). */
#include "clock.h"
#include "error.h"
#include "transport_private.h"

#include <stdlib.h>
#include <string.h>

/* Ids of the protocol's messages, above the ones kvx's files set (TRANSPORT_AM_IDS). */
enum { AM_READ = 24, AM_DATA, AM_WRITE, AM_WRITTEN, AM_READV };

/* The requester's destination is device memory (read_one): its answer must not be eager,
 * whatever the owner's memory is, since data_arrived copies nothing into device memory. The
 * owner cannot tell an honest requester's device destination from a lie, so it honours the
 * flag for any read: a rendezvous answer pins a record until it is taken, but so does any
 * read past UCX's rendezvous threshold without the flag, so ignoring it would spare no record
 * (the share does that) and would fail honest device reads of host memory. */
#define AM_FLAG_RENDEZVOUS 1u
/* A read's answer of at most this many bytes of host memory goes eagerly (reply_send): UCX
 * chose a rendezvous from 8 KiB over shared memory; eager, batch-1 pulls of 8 and 16 KiB took
 * 1.7x and 1.2-1.9x the GB/s, and from 32 KiB the copies cost more than the round trip saves
 * (docs/performance.md "Small read answers sent eagerly"). */
#define AM_EAGER_ANSWER_MAX 16384
/* Requests a connection has out at once; more wait for answers to come. Honest requesters stay
 * well inside the owner's bound below, however large a transfer is. */
#define AM_WINDOW 512
/* Answers in flight at once on the owner's side, across its peers (64 peers' windows and
 * more): about 18 MiB of records. Past it requests are dropped, and their senders' deadlines
 * answer. A backstop: AM_SHARE keeps one requester from reaching it. */
#define AM_MAX_SERVING 65536
/* Answers in flight at once to one requester (one endpoint: a connection's worker): twice the
 * window, the most an honest connection has out, so an honest requester never meets it, and
 * one that sends requests and never takes the answers holds at most this many records (issue
 * 36 finding 2: 70,000 such reads had held AM_MAX_SERVING, and every peer's reads failed). */
#define AM_SHARE (2 * AM_WINDOW)
/* How long an answer counts against its requester's share and AM_MAX_SERVING, ms. An honest
 * requester starts taking a rendezvous answer as soon as its progress returns (data_arrived),
 * and its read fails at its own deadline (KVX_DEFAULT_TIMEOUT_MS, 10 s) anyway; 60 s leaves
 * six of those. Writing a record off cuts no transfer (am_replies_expire): an answer taken
 * later, however slow its link, still completes, and its done is still judged. */
#define AM_ANSWER_MS 60000
/* Records written off and still held by UCX (a dead requester's rendezvous answers never end:
 * am_replies_expire). Past it nothing more is written off, so memory stays bounded at about
 * twice AM_MAX_SERVING's records (and UCX's requests under them). */
#define AM_MAX_WRITTEN_OFF AM_MAX_SERVING
/* Loop turns between two readings of the clock by am_replies_expire while answers are out: a
 * reading costs tens of nanoseconds, a turn of a spinning loop little more (clock.h), and the
 * bound is a minute. */
#define AM_EXPIRE_TURNS 64

enum { AM_STATUS_OK = 0, AM_STATUS_REFUSED = 1 };

struct am_read_header {
    uint8_t token[TRANSPORT_TOKEN_SIZE];
    uint64_t cookie;
    uint64_t offset;
    uint64_t length;
    uint32_t storage;
    uint32_t flags;
};

struct am_write_header {
    uint8_t token[TRANSPORT_TOKEN_SIZE];
    uint64_t cookie;
    uint64_t offset;
    uint32_t storage;
    uint32_t flags;
};

struct am_readv_header {
    uint8_t token[TRANSPORT_TOKEN_SIZE];
    uint64_t cookie;
    uint32_t count; /* ranges, 2 to AM_READV_MAX, in the message's data */
    uint32_t flags; /* none yet: the answer is the transport's choice, host memory only */
};

struct am_answer_header {
    uint64_t cookie;
    uint32_t status;
    uint32_t reserved;
};

/* A read or write this side asked for, until its answer came or its send failed. */
struct am_request {
    struct am_record record; /* first: the list's pointer is the request's */
    struct transport_op *op;
    struct transport_conn *conn;
    void *local;
    uint64_t length;
    uint64_t cookie; /* generation << 32 | index */
    uint32_t index;
    bool write;
    bool device;
    bool ended;     /* its operation was counted complete */
    bool sending;   /* UCX still holds its header */
    bool receiving; /* UCX is receiving its data (rendezvous), or will (desc) */
    void *desc;     /* a rendezvous to receive once progress returned */
    struct am_request *next_receive;
    /* Waiting for room in the connection's window (AM_WINDOW): what to send then. */
    bool waiting;
    unsigned id;
    const void *data;
    size_t data_length;
    uint32_t send_flags;
    struct am_request *next_waiting;
    union {
        struct am_read_header read;
        struct am_write_header write;
        struct am_readv_header readv;
    } header;
    /* A vectored read's: where each range's bytes go, and the ranges asked for (its data,
     * followed by the attachment); a single read's data is its attachment (`more`). */
    uint32_t num_iov;
    struct am_range *ranges;
    uint8_t *more;
    ucp_dt_iov_t iov[];
};

/* The owner's side of one message: an answer being sent, or a write's bytes being received
 * and then its answer sent. Counted against its requester's share (by `ep`) and in
 * t->serving, and linked oldest first, until it ends or is written off. */
struct am_reply {
    struct am_record record;
    struct transport *t;
    ucp_ep_h ep;
    struct am_answer_header header;
    void *request;     /* UCX's, while it sends the answer or receives a write's bytes */
    uint64_t since_ms; /* clock_ms() when it was made */
    struct am_reply *older;
    struct am_reply *newer;
    bool written_off; /* past AM_ANSWER_MS: counted nowhere, freed when UCX lets it go */
    /* A write's rendezvous, received once progress returned (am_writes_receive) by the
     * worker it arrived on: the main one, or a connection's (conn, counted there). */
    ucp_worker_h worker;
    struct transport_conn *conn;
    void *desc;
    void *dest;
    uint64_t length;
    struct am_reply *next_queued;
    /* A read's attachment (a done), handed to the read hook once the answer left our memory:
     * at once, or when a rendezvous answer's send completed (reply_sent). */
    uint8_t attach[TRANSPORT_ATTACH_MAX];
    size_t attach_size;
    /* A vectored read's answer: the ranges of our storages it sends, in order. */
    uint32_t num_iov;
    ucp_dt_iov_t iov[];
};

/* One requester's count of records: a slot of t->shares, open addressing by endpoint. */
struct am_share {
    ucp_ep_h ep;    /* NULL: a free slot */
    uint32_t count; /* its records counted now, at most AM_SHARE */
};

void am_record_link(struct am_record *r, struct am_record **list)
{
    r->list = list;
    r->prev = NULL;
    r->next = *list;
    if (*list != NULL)
        (*list)->prev = r;
    *list = r;
}

void am_record_unlink(struct am_record *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        *r->list = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
}

void am_records_free(struct am_record **list)
{
    while (*list != NULL) {
        struct am_record *r = *list;

        am_record_unlink(r);
        free(r);
    }
}

/* Compares in constant time: how long it takes says nothing of where a guess went wrong. */
static bool token_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t diff = 0;

    for (size_t i = 0; i < TRANSPORT_TOKEN_SIZE; i++)
        diff |= (uint8_t)(a[i] ^ b[i]);
    return diff == 0;
}

/* The storage `index` of this transport if it serves peers at all (a keyed one hands out no
 * grant: its tokens are zeros nobody was given) and [offset, offset + length) lies inside. */
static struct transport_mem *granted(const struct transport *t, uint32_t index, uint64_t offset,
                                     uint64_t length)
{
    struct transport_mem *mem = t->served && index < t->num_mems ? t->mems[index] : NULL;

    if (mem == NULL || offset > mem->size || length > mem->size - offset)
        return NULL;
    return mem;
}

/* ---- the owner's side: serving reads and writes on the main worker ---- */

/* The home slot of `ep` in a table of `slots` (a power of 2) slots. */
static size_t share_home(ucp_ep_h ep, size_t slots)
{
    return (size_t)(((uint64_t)(uintptr_t)ep >> 4) * 0x9e3779b97f4a7c15u >> 32) & (slots - 1);
}

/* The slot of `ep`'s share, or of the free slot where it would go. */
static struct am_share *share_slot(const struct transport *t, ucp_ep_h ep)
{
    size_t i = share_home(ep, t->num_share_slots);

    while (t->shares[i].ep != NULL && t->shares[i].ep != ep)
        i = (i + 1) & (t->num_share_slots - 1);
    return &t->shares[i];
}

/* Doubles the share table (64 slots at first); false, and the table unchanged, without
 * memory. At most twice the requesters with records: AM_MAX_SERVING of them, 2 MiB. */
static bool shares_grow(struct transport *t)
{
    size_t slots            = t->num_share_slots > 0 ? t->num_share_slots * 2 : 64;
    struct am_share *old    = t->shares;
    size_t num_old          = t->num_share_slots;
    struct am_share *shares = calloc(slots, sizeof(*shares));

    if (shares == NULL)
        return false;
    t->shares          = shares;
    t->num_share_slots = slots;
    for (size_t i = 0; i < num_old; i++) {
        if (old[i].ep != NULL)
            *share_slot(t, old[i].ep) = old[i];
    }
    free(old);
    return true;
}

/* Counts one more record against `ep`'s share; false, and nothing counted, past AM_SHARE or
 * without memory for the table. */
static bool share_take(struct transport *t, ucp_ep_h ep)
{
    struct am_share *share;

    if ((t->num_shares + 1) * 2 > t->num_share_slots && !shares_grow(t))
        return false;
    share = share_slot(t, ep);
    if (share->ep == NULL) {
        share->ep = ep;
        t->num_shares++;
    }
    if (share->count == AM_SHARE)
        return false;
    share->count++;
    return true;
}

/* Counts one record less against `ep`'s share; its slot is freed at 0, and the slots after it
 * that would have been found there move back (linear probing keeps no tombstones). */
static void share_give(struct transport *t, ucp_ep_h ep)
{
    size_t mask            = t->num_share_slots - 1;
    struct am_share *share = share_slot(t, ep);
    size_t hole;

    if (share->ep == NULL || --share->count > 0)
        return; /* never: a record counted is in its share */
    t->num_shares--;
    hole = (size_t)(share - t->shares);
    for (size_t i = (hole + 1) & mask; t->shares[i].ep != NULL; i = (i + 1) & mask) {
        size_t home = share_home(t->shares[i].ep, t->num_share_slots);

        /* stays where it is if its home is cyclically in (hole, i] */
        if (hole < i ? hole < home && home <= i : hole < home || home <= i)
            continue;
        t->shares[hole] = t->shares[i];
        hole            = i;
    }
    t->shares[hole] = (struct am_share){0};
}

void am_serve_free(struct transport *t)
{
    free(t->shares);
    t->shares          = NULL;
    t->num_share_slots = 0;
    t->num_shares      = 0;
}

/* Takes a counted record out of its share, t->serving and the list of the counted. */
static void reply_uncount(struct am_reply *r)
{
    struct transport *t = r->t;

    share_give(t, r->ep);
    t->serving--;
    if (r->older != NULL)
        r->older->newer = r->newer;
    else
        t->oldest = r->newer;
    if (r->newer != NULL)
        r->newer->older = r->older;
    else
        t->newest = r->older;
}

static void reply_free(struct am_reply *r)
{
    am_record_unlink(&r->record);
    if (r->written_off)
        r->t->written_off--;
    else
        reply_uncount(r);
    free(r);
}

static void reply_sent(void *request, ucs_status_t status, void *user_data)
{
    struct am_reply *r = user_data;

    ucp_request_free(request);
    r->request = NULL;
    /* The requester has the bytes now: its done may be judged. A requester that went away
     * has nothing of ours to undo, and no answer to get. */
    if (status == UCS_OK && r->attach_size > 0 && r->t->read_hook != NULL) {
        struct transport_msg_from from = {r->t, r->ep, NULL};

        r->t->read_hook(r->t->read_hook_arg, r->attach, r->attach_size, true, &from);
    }
    reply_free(r);
}

/* Sends an answer (and, for a read, the bytes) at once, from the handler or completion that
 * made it: the requester's endpoint is UCX's, valid during that callback, and may be gone
 * after it (a requester that died). The record goes when UCX is done with it. Returns whether
 * UCX sent it at once (the bytes of our memory it carries were copied out), is still sending
 * it (the record stays until reply_sent), or failed (the record is gone). `flags`: UCX's,
 * to make it go by rendezvous (device memory) or eagerly (a small read's answer: copied out
 * at once, so a done that came with it is judged at once, where a rendezvous takes a round
 * trip more and sends the done back to come again). */
enum reply_sending { REPLY_SENT, REPLY_SENDING, REPLY_FAILED };

static enum reply_sending reply_send(struct am_reply *r, unsigned id, const void *data,
                                     uint64_t length, uint32_t flags)
{
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send   = reply_sent,
        .user_data = r,
        .flags     = flags,
    };
    ucs_status_ptr_t sp;

    if (r->num_iov > 0 && r->header.status == AM_STATUS_OK) { /* a vectored read's ranges */
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        param.datatype = ucp_dt_make_iov();
        data           = r->iov;
        length         = r->num_iov;
    }
    sp = ucp_am_send_nbx(r->ep, id, &r->header, sizeof(r->header), data, length, &param);

    if (sp == NULL || UCS_PTR_IS_ERR(sp))
        reply_free(r);
    else
        r->request = sp;
    return sp == NULL ? REPLY_SENT : UCS_PTR_IS_ERR(sp) ? REPLY_FAILED : REPLY_SENDING;
}

/* Hands a read's attachment to the read hook, `sent` as the reply's send said. */
static void attachment_give(struct transport *t, const void *data, size_t size, bool sent,
                            const ucp_am_recv_param_t *param)
{
    struct transport_msg_from from = {t, param->reply_ep, NULL};

    if (size > 0 && t->read_hook != NULL)
        t->read_hook(t->read_hook_arg, data, size, sent, &from);
}

/* Sends a read's answer and hands its attachment to the read hook once the answer left our
 * memory: now if UCX sent it at once, else when its send completes (reply_sent), the round
 * trip a hook answering "come again" would have added; now too, as not sent, if it failed. */
static void read_answer(struct am_reply *r, const void *data, uint64_t length, uint32_t flags,
                        const void *attachment, size_t size, const ucp_am_recv_param_t *param)
{
    struct transport *t = r->t;
    enum reply_sending sending;

    if (size > 0) /* size <= TRANSPORT_ATTACH_MAX: checked on arrival */
        memcpy(r->attach, attachment, size);
    r->attach_size = size;
    sending        = reply_send(r, AM_DATA, data, length, flags);
    if (sending != REPLY_SENDING)
        attachment_give(t, attachment, size, sending == REPLY_SENT, param);
}

void transport_set_read_hook(struct transport *t, transport_read_hook_t hook, void *arg)
{
    t->read_hook     = hook;
    t->read_hook_arg = arg;
}

static void written_received(void *request, ucs_status_t status, size_t length, void *user_data);

/* Starts receiving the writes' bytes queued by write_served: UCX's TCP transport defers what
 * a receive started inside its receive callback sends (the rendezvous's answer) to a later
 * wakeup, milliseconds away. The answer follows once the bytes are in memory. */
void am_writes_receive(struct transport *t)
{
    struct am_reply *queued = t->queued;

    t->queued = NULL;
    while (queued != NULL) {
        struct am_reply *r       = queued;
        ucp_request_param_t recv = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.recv_am   = written_received,
            .user_data    = r,
        };
        ucs_status_ptr_t sp;

        queued = r->next_queued;
        sp     = ucp_am_recv_data_nbx(r->worker, r->desc, r->dest, r->length, &recv);
        if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
            /* Done in place, or failed: the endpoint may be gone by now, so nothing is sent
             * on a failure; the writer's deadline answers it. */
            if (sp == NULL)
                reply_send(r, AM_WRITTEN, NULL, 0, 0);
            else
                reply_free(r);
            continue;
        }
        r->request = sp;
        if (r->conn != NULL)
            r->conn->writes_receiving++;
    }
}

/* A reply record to requester `ep`, with room for `num_iov` ranges of a vectored read, counted
 * against its share; NULL, counted refused, past the share or AM_MAX_SERVING (or without
 * memory): the message is dropped unanswered, and its requester's deadline answers it. */
static struct am_reply *reply_create(struct transport *t, ucp_ep_h ep, uint64_t cookie,
                                     uint32_t num_iov)
{
    struct am_reply *r = NULL;

    if (t->serving < AM_MAX_SERVING && share_take(t, ep)) {
        r = calloc(1, sizeof(*r) + num_iov * sizeof(r->iov[0]));
        if (r == NULL)
            share_give(t, ep);
    }
    if (r == NULL) {
        t->counters.refused++;
        return NULL;
    }
    r->t        = t;
    r->ep       = ep;
    r->header   = (struct am_answer_header){.cookie = cookie, .status = AM_STATUS_OK};
    r->since_ms = clock_ms();
    r->older    = t->newest;
    if (t->newest != NULL)
        t->newest->newer = r;
    else
        t->oldest = r;
    t->newest = r;
    am_record_link(&r->record, &t->replies);
    t->serving++;
    return r;
}

/* UCX cannot end a rendezvous whose requester never takes it. Endpoints here have no
 * peer-failure mode (docs/agent.md "Closing"), so a dead requester's never fails, and the
 * calls that would end it do nothing for it: ucp_request_cancel ends only tag receives (UCX
 * 1.13.1 to 1.22 and master's ucp_request.c) and ucp_ep_close_nbx's force mode is refused
 * without that mode; the owner's main worker, which would take them with it, serves every
 * peer. So an answer past AM_ANSWER_MS is written off: it leaves its requester's share,
 * t->serving (so the loop sleeps again) and the list of the counted, and its record stays
 * until UCX lets it go, which a requester that takes the bytes later still makes it do. Its
 * request is cancelled all the same, for a UCX that can (its callback then frees the record,
 * maybe at once); a write's receive on a connection's worker is not touched (that worker may
 * be closing, and its closing ends the receive). Stops at AM_MAX_WRITTEN_OFF: what is past it
 * stays counted, so memory stays bounded. */
size_t am_replies_expire(struct transport *t)
{
    size_t ended = 0;
    uint64_t now;

    if (t->oldest == NULL || ++t->expire_turns < AM_EXPIRE_TURNS)
        return 0;
    t->expire_turns = 0;
    now             = clock_ms();
    while (t->oldest != NULL && now - t->oldest->since_ms >= AM_ANSWER_MS &&
           t->written_off < AM_MAX_WRITTEN_OFF) {
        struct am_reply *r = t->oldest;
        void *request      = r->conn == NULL ? r->request : NULL;

        reply_uncount(r);
        r->written_off = true;
        t->written_off++;
        ended++;
        if (request != NULL)
            ucp_request_cancel(t->worker, request); /* last: it may free r */
    }
    return ended;
}

/* Whether `token` lets its holder read. Who may write may read, as with a UCX key mapped for
 * writes (MEM_PROT_WRITE); both compared, so the time taken says nothing of which token was
 * close. */
static bool may_read(const struct transport *t, const uint8_t token[TRANSPORT_TOKEN_SIZE])
{
    bool reader = token_equal(token, t->read_token);
    bool writer = token_equal(token, t->write_token);

    return reader || writer;
}

/* Answers a read (single or vectored) "refused", counted; its attachment is sent back. */
static void read_refuse(struct transport *t, struct am_reply *r, const void *attachment,
                        size_t size, const ucp_am_recv_param_t *param)
{
    t->counters.refused++;
    r->header.status = AM_STATUS_REFUSED;
    reply_send(r, AM_DATA, NULL, 0, 0);
    attachment_give(t, attachment, size, false, param);
}

static ucs_status_t read_served(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
    struct transport *t = arg;
    struct am_read_header h;
    struct transport_mem *mem;
    struct am_reply *r;

    if (header_length != sizeof(h) || length > TRANSPORT_ATTACH_MAX ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        t->counters.refused++; /* not kvx's: nothing to answer to */
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    if ((r = reply_create(t, param->reply_ep, h.cookie, 0)) == NULL)
        return UCS_OK; /* the requester's deadline answers for us */
    mem = granted(t, h.storage, h.offset, h.length);
    if (!may_read(t, h.token) || mem == NULL) {
        read_refuse(t, r, data, length, param);
        return UCS_OK;
    }
    t->counters.reads++;
    read_answer(r, (char *)mem->address + h.offset, h.length,
                (h.flags & AM_FLAG_RENDEZVOUS) != 0               ? UCP_AM_SEND_FLAG_RNDV
                : h.length <= AM_EAGER_ANSWER_MAX && !mem->device ? UCP_AM_SEND_FLAG_EAGER
                                                                  : 0,
                data, length, param);
    return UCS_OK;
}

bool am_ranges_granted(const struct transport *t, const void *data, size_t length, uint32_t count,
                       ucp_dt_iov_t *iov)
{
    const struct transport_mem *mem;
    struct am_range range;

    if (count < 2 || count > AM_READV_MAX || length != count * sizeof(range))
        return false;
    for (uint32_t i = 0; i < count; i++) {
        memcpy(&range, (const char *)data + i * sizeof(range), sizeof(range));
        mem = granted(t, range.storage, range.offset, range.length);
        if (mem == NULL || range.length == 0 || range.reserved != 0 || mem->device)
            return false;
        iov[i] = (ucp_dt_iov_t){(char *)mem->address + range.offset, range.length};
    }
    return true;
}

/* Bytes of a vectored read's ranges. */
static uint64_t iov_bytes(const ucp_dt_iov_t *iov, uint32_t count)
{
    uint64_t total = 0;

    for (uint32_t i = 0; i < count; i++)
        total += iov[i].length;
    return total;
}

/* A vectored read: its ranges' bytes in one answer, or one refusal for all of them. The
 * ranges come as the message's data, so they must have come with it (eager, not rendezvous). */
static ucs_status_t readv_served(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    struct transport *t = arg;
    struct am_readv_header h;
    struct am_reply *r;
    size_t ranges; /* bytes of the message's data that are ranges; the attachment follows */

    if (header_length != sizeof(h) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        t->counters.refused++;
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    ranges = (size_t)h.count * sizeof(struct am_range);
    if (h.count > AM_READV_MAX || length < ranges || length - ranges > TRANSPORT_ATTACH_MAX ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        t->counters.refused++; /* not kvx's */
        return UCS_OK;
    }
    if ((r = reply_create(t, param->reply_ep, h.cookie, h.count)) == NULL)
        return UCS_OK; /* no room (counted): the requester's deadline answers */
    r->num_iov = h.count;
    if (h.flags != 0 || !may_read(t, h.token) ||
        !am_ranges_granted(t, data, ranges, h.count, r->iov)) {
        read_refuse(t, r, (char *)data + ranges, length - ranges, param);
        return UCS_OK;
    }
    t->counters.reads += h.count;
    read_answer(r, NULL, 0,
                iov_bytes(r->iov, h.count) <= AM_EAGER_ANSWER_MAX ? UCP_AM_SEND_FLAG_EAGER : 0,
                (char *)data + ranges, length - ranges, param);
    return UCS_OK;
}

static void written_received(void *request, ucs_status_t status, size_t length, void *user_data)
{
    struct am_reply *r = user_data;

    (void)length;
    ucp_request_free(request);
    r->request = NULL;
    if (r->conn != NULL)
        r->conn->writes_receiving--;
    /* the writer went away, or UCX cancelled it (or a closed connection's worker is being
     * destroyed, its endpoints with it): none to answer */
    if (status != UCS_OK || (r->conn != NULL && (r->conn->parked || r->conn->settling))) {
        reply_free(r);
        return;
    }
    reply_send(r, AM_WRITTEN, NULL, 0, 0);
}

/* A write to our storages, arrived on `worker` (of connection `conn`, or NULL: the main one). */
static ucs_status_t write_serve(struct transport *t, ucp_worker_h worker,
                                struct transport_conn *conn, const void *header,
                                size_t header_length, void *data, size_t length,
                                const ucp_am_recv_param_t *param)
{
    bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    struct am_write_header h;
    struct transport_mem *mem;
    struct am_reply *r;

    /* A rendezvous refused without an answer fails its sender's send with the status. */
    if (header_length != sizeof(h) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        t->counters.refused++;
        return rendezvous ? UCS_ERR_REJECTED : UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    if ((r = reply_create(t, param->reply_ep, h.cookie, 0)) == NULL)
        return rendezvous ? UCS_ERR_NO_RESOURCE : UCS_OK;
    mem = granted(t, h.storage, h.offset, length);
    /* Device memory takes no memcpy: its writer must send it by rendezvous. A closing
     * connection takes nothing more: its owner was told its writes ended. */
    if (!token_equal(h.token, t->write_token) || mem == NULL || (mem->device && !rendezvous) ||
        (conn != NULL && (conn->settling || conn->parked))) {
        t->counters.refused++;
        r->header.status = AM_STATUS_REFUSED;
        reply_send(r, AM_WRITTEN, NULL, 0, 0);
        return UCS_OK;
    }
    t->counters.writes++;
    if (!rendezvous) {
        memcpy((char *)mem->address + h.offset, data, length);
        reply_send(r, AM_WRITTEN, NULL, 0, 0);
        return UCS_OK;
    }
    r->worker      = worker;
    r->conn        = conn;
    r->desc        = data; /* received once progress returned (am_writes_receive) */
    r->dest        = (char *)mem->address + h.offset;
    r->length      = length;
    r->next_queued = t->queued;
    t->queued      = r;
    return UCS_INPROGRESS;
}

static ucs_status_t write_served(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    struct transport *t = arg;

    return write_serve(t, t->worker, NULL, header, header_length, data, length, param);
}

/* A write that came to a connection's own worker: the writer a peer connected to the
 * address we registered with it (transport_conn_address), so that closing that connection
 * ends its writes (transport_conn_destroy). */
static ucs_status_t conn_write_served(void *arg, const void *header, size_t header_length,
                                      void *data, size_t length, const ucp_am_recv_param_t *param)
{
    struct transport_conn *conn = arg;

    return write_serve(conn->t, conn->worker, conn, header, header_length, data, length, param);
}

static kvx_status_t handler_set(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb,
                                void *arg)
{
    ucp_am_handler_param_t param = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id  = id,
        .cb  = cb,
        .arg = arg,
    };
    ucs_status_t st = ucp_worker_set_am_recv_handler(worker, &param);

    return st == UCS_OK ? KVX_OK : transport_ucs_error("setting an active-message handler", st);
}

kvx_status_t am_serve_set(struct transport *t)
{
    kvx_status_t status = handler_set(t->worker, AM_READ, read_served, t);

    if (status == KVX_OK)
        status = handler_set(t->worker, AM_READV, readv_served, t);
    return status == KVX_OK ? handler_set(t->worker, AM_WRITE, write_served, t) : status;
}

/* ---- the requester's side: a connection's reads and writes ---- */

static void request_free_if_done(struct am_request *req)
{
    if (!req->ended || req->sending || req->receiving)
        return;
    am_record_unlink(&req->record);
    free(req);
}

/* Counts the request's operation complete, once, and frees its cookie. */
static void request_end(struct am_request *req, ucs_status_t status)
{
    struct transport_conn *conn = req->conn;

    if (req->ended)
        return;
    req->ended = true;
    conn->in_flight -= !req->waiting;
    conn->by_cookie[req->index]                  = NULL;
    conn->free_cookies[conn->num_free_cookies++] = req->index;
    transport_op_complete(req->op, status);
}

/* The request an answer names, if it is still waiting for one. */
static struct am_request *request_find(struct transport_conn *conn, const void *header,
                                       size_t header_length, struct am_answer_header *h)
{
    struct am_request *req;
    uint32_t index;

    if (header_length != sizeof(*h))
        return NULL;
    memcpy(h, header, sizeof(*h));
    index = (uint32_t)h->cookie;
    if (index >= conn->num_cookies || (req = conn->by_cookie[index]) == NULL ||
        h->cookie != req->cookie || req->receiving)
        return NULL;
    return req;
}

static void data_received(void *request, ucs_status_t status, size_t length, void *user_data)
{
    struct am_request *req = user_data;

    ucp_request_free(request);
    req->receiving = false;
    request_end(req, status == UCS_OK && length == req->length ? status : UCS_ERR_IO_ERROR);
    request_free_if_done(req);
}

static ucs_status_t data_arrived(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    struct transport_conn *conn = arg;
    bool rendezvous             = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    struct am_answer_header h;
    struct am_request *req = request_find(conn, header, header_length, &h);

    if (req == NULL || req->write)
        return UCS_OK; /* not an answer we wait for: dropped */
    if (h.status != AM_STATUS_OK) {
        request_end(req, UCS_ERR_REJECTED);
        request_free_if_done(req);
        return UCS_OK;
    }
    /* Exactly what was asked for, or nothing: a peer's length never decides where we write. */
    if (length != req->length || (!rendezvous && req->device)) {
        request_end(req, UCS_ERR_MESSAGE_TRUNCATED);
        request_free_if_done(req);
        return UCS_OK;
    }
    if (!rendezvous) {
        size_t at = 0;

        for (uint32_t i = 0; i < req->num_iov; at += req->iov[i++].length)
            memcpy(req->iov[i].buffer, (const char *)data + at, req->iov[i].length);
        if (req->num_iov == 0)
            memcpy(req->local, data, length);
        request_end(req, UCS_OK);
        request_free_if_done(req);
        return UCS_OK;
    }
    /* Received once progress returned (am_receives_start), as answers are sent. */
    req->receiving    = true;
    req->desc         = data;
    req->next_receive = conn->receives;
    conn->receives    = req;
    return UCS_INPROGRESS;
}

void am_receives_start(struct transport_conn *conn)
{
    struct am_request *queued = conn->receives;

    conn->receives = NULL;
    while (queued != NULL) {
        struct am_request *req   = queued;
        ucp_request_param_t recv = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.recv_am   = data_received,
            .user_data    = req,
        };
        ucs_status_ptr_t sp;

        queued = req->next_receive;
        if (req->num_iov > 0) { /* straight into each range's place */
            recv.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
            recv.datatype = ucp_dt_make_iov();
        }
        sp = ucp_am_recv_data_nbx(conn->worker, req->desc,
                                  req->num_iov > 0 ? (void *)req->iov : req->local,
                                  req->num_iov > 0 ? req->num_iov : req->length, &recv);
        if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
            req->receiving = false;
            request_end(req, sp == NULL ? UCS_OK : UCS_PTR_STATUS(sp));
            request_free_if_done(req);
        }
    }
}

static ucs_status_t written_arrived(void *arg, const void *header, size_t header_length, void *data,
                                    size_t length, const ucp_am_recv_param_t *param)
{
    struct am_answer_header h;
    struct am_request *req = request_find(arg, header, header_length, &h);

    (void)data;
    (void)length;
    (void)param;
    if (req != NULL && req->write) {
        request_end(req, h.status == AM_STATUS_OK ? UCS_OK : UCS_ERR_REJECTED);
        request_free_if_done(req);
    }
    return UCS_OK;
}

kvx_status_t am_conn_set(struct transport_conn *conn)
{
    kvx_status_t status = handler_set(conn->worker, AM_DATA, data_arrived, conn);

    if (status == KVX_OK)
        status = handler_set(conn->worker, AM_WRITE, conn_write_served, conn);
    return status == KVX_OK ? handler_set(conn->worker, AM_WRITTEN, written_arrived, conn) : status;
}

void am_conn_free(struct transport_conn *conn)
{
    free(conn->by_cookie);
    free(conn->free_cookies);
}

static void request_sent(void *request, ucs_status_t status, void *user_data)
{
    struct am_request *req = user_data;

    ucp_request_free(request);
    req->sending = false;
    if (status != UCS_OK)
        request_end(req, status);
    request_free_if_done(req);
}

/* A request record with a free cookie, linked to its connection; with room for `num_iov`
 * ranges of a vectored read and `more` bytes after them (an attachment). */
static kvx_status_t request_create(struct transport_op *op, uint32_t storage, void *local,
                                   uint64_t length, uint32_t num_iov, size_t more,
                                   struct am_request **req_p)
{
    struct transport_conn *conn = op->conn;
    struct am_request *req;

    if (storage >= conn->num_rkeys || !conn->storages[storage].served)
        return error_set(KVX_ERR_INTERNAL, "transport: storage %u is not served by the peer",
                         storage);
    if (conn->num_free_cookies == 0) {
        size_t n        = conn->num_cookies > 0 ? conn->num_cookies * 2 : 64;
        void *by_cookie = realloc(conn->by_cookie, n * sizeof(*conn->by_cookie));
        void *free_slots =
            by_cookie != NULL ? realloc(conn->free_cookies, n * sizeof(uint32_t)) : NULL;

        if (by_cookie != NULL)
            conn->by_cookie = by_cookie;
        if (free_slots == NULL || n > UINT32_MAX)
            return error_no_memory("a connection's requests");
        conn->free_cookies = free_slots;
        for (size_t i = n; i-- > conn->num_cookies;) {
            conn->by_cookie[i]                           = NULL;
            conn->free_cookies[conn->num_free_cookies++] = (uint32_t)i;
        }
        conn->num_cookies = n;
    }
    req = calloc(1, sizeof(*req) + num_iov * (sizeof(req->ranges[0]) + sizeof(req->iov[0])) + more);
    if (req == NULL)
        return error_no_memory("a request");
    req->num_iov = num_iov;
    req->ranges  = (struct am_range *)(req->iov + num_iov); /* iov's 16 bytes keep them aligned */
    req->more    = (uint8_t *)(req->ranges + num_iov);
    req->op      = op;
    req->conn    = conn;
    req->local   = local;
    req->length  = length;
    req->index   = conn->free_cookies[--conn->num_free_cookies];
    conn->by_cookie[req->index] = req;
    /* Every request its own cookie: a late answer to an ended one never matches a new one. */
    req->cookie = (uint64_t)++conn->generation << 32 | req->index;
    am_record_link(&req->record, &conn->requests);
    *req_p = req;
    return KVX_OK;
}

/* Sends a request's message now. */
static ucs_status_ptr_t request_send_now(struct am_request *req)
{
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send   = request_sent,
        .user_data = req,
        .flags     = UCP_AM_SEND_FLAG_REPLY | req->send_flags,
    };
    size_t header_length = req->write         ? sizeof(req->header.write)
                           : req->num_iov > 0 ? sizeof(req->header.readv)
                                              : sizeof(req->header.read);
    ucs_status_ptr_t sp  = ucp_am_send_nbx(req->conn->ep, req->id, &req->header, header_length,
                                           req->data, req->data_length, &param);

    req->waiting = false;
    req->conn->in_flight++;
    req->sending = sp != NULL && !UCS_PTR_IS_ERR(sp);
    return sp;
}

/* Counts the request in its op and sends it, or queues it behind the connection's window;
 * undoes it if UCX refused. */
static kvx_status_t request_send(struct am_request *req, unsigned id, const void *data,
                                 size_t data_length, uint32_t flags)
{
    struct transport_conn *conn = req->conn;
    ucs_status_ptr_t sp;

    req->id          = id;
    req->data        = data;
    req->data_length = data_length;
    req->send_flags  = flags;
    transport_op_posted_one(req->op);
    if (conn->in_flight >= AM_WINDOW || conn->waiting != NULL) {
        req->waiting       = true;
        req->next_waiting  = NULL;
        *conn->waiting_end = req;
        conn->waiting_end  = &req->next_waiting;
        return KVX_OK;
    }
    sp = request_send_now(req);
    if (UCS_PTR_IS_ERR(sp)) {
        request_end(req, UCS_PTR_STATUS(sp));
        request_free_if_done(req);
        return transport_ucs_error("sending a request", UCS_PTR_STATUS(sp));
    }
    return KVX_OK;
}

void am_waiting_send(struct transport_conn *conn)
{
    while (conn->waiting != NULL && conn->in_flight < AM_WINDOW) {
        struct am_request *req = conn->waiting;
        ucs_status_ptr_t sp;

        conn->waiting = req->next_waiting;
        if (conn->waiting == NULL)
            conn->waiting_end = &conn->waiting;
        sp = request_send_now(req);
        if (UCS_PTR_IS_ERR(sp)) {
            request_end(req, UCS_PTR_STATUS(sp));
            request_free_if_done(req);
        }
    }
}

/* One read, with op's attachment when `attach`. */
static kvx_status_t read_one(struct transport_op *op, uint32_t storage, uint64_t offset,
                             void *local, uint64_t len, bool local_device, bool attach)
{
    size_t more = attach ? op->attach_size : 0;
    struct am_request *req;
    kvx_status_t status = request_create(op, storage, local, len, 0, more, &req);

    if (status != KVX_OK)
        return status;
    req->device      = local_device;
    req->header.read = (struct am_read_header){
        .cookie  = req->cookie,
        .offset  = offset,
        .length  = len,
        .storage = storage,
        .flags   = local_device ? AM_FLAG_RENDEZVOUS : 0,
    };
    memcpy(req->header.read.token, op->conn->storages[storage].token, TRANSPORT_TOKEN_SIZE);
    memcpy(req->more, op->attach, more);
    return request_send(req, AM_READ, req->more, more, UCP_AM_SEND_FLAG_EAGER);
}

kvx_status_t am_read_post(struct transport_op *op, uint32_t storage, uint64_t offset, void *local,
                          uint64_t len, bool local_device)
{
    return read_one(op, storage, offset, local, len, local_device, false);
}

/* Sends what `reads` gathered (one range: as a plain read), with op's attachment when
 * `attach`, and empties it. */
static kvx_status_t reads_send(struct transport_op *op, struct am_reads *reads, bool attach)
{
    uint32_t count = reads->count;
    size_t more    = attach ? op->attach_size : 0;
    struct am_request *req;
    kvx_status_t status;

    reads->count = 0;
    reads->bytes = 0;
    if (count <= 1)
        return count == 0 ? KVX_OK
                          : read_one(op, reads->ranges[0].storage, reads->ranges[0].offset,
                                     reads->locals[0], reads->ranges[0].length, false, attach);
    status = request_create(op, reads->ranges[0].storage, NULL, 0, count, more, &req);
    if (status != KVX_OK)
        return status;
    for (uint32_t i = 0; i < count; i++) {
        req->ranges[i] = reads->ranges[i];
        req->iov[i]    = (ucp_dt_iov_t){reads->locals[i], reads->ranges[i].length};
        req->length += reads->ranges[i].length;
    }
    memcpy(req->more, op->attach, more); /* right after the ranges: one buffer */
    req->header.readv = (struct am_readv_header){.cookie = req->cookie, .count = count};
    memcpy(req->header.readv.token, op->conn->storages[reads->ranges[0].storage].token,
           TRANSPORT_TOKEN_SIZE);
    return request_send(req, AM_READV, req->ranges, count * sizeof(req->ranges[0]) + more,
                        UCP_AM_SEND_FLAG_EAGER);
}

kvx_status_t am_reads_flush(struct transport_op *op, struct am_reads *reads)
{
    return reads_send(op, reads, false);
}

kvx_status_t am_reads_post_attached(struct transport_op *op, struct am_reads *reads)
{
    kvx_status_t status = reads_send(op, reads, true);

    op->attached = status == KVX_OK;
    return status;
}

kvx_status_t am_reads_add(struct transport_op *op, struct am_reads *reads, uint32_t storage,
                          uint64_t offset, void *local, uint64_t len)
{
    const struct conn_storage *storages = op->conn->storages;
    kvx_status_t status;

    /* Device memory of the owner's is read alone: its answer may not be a copy. */
    if (len > AM_READV_RANGE || len == 0 || storage >= op->conn->num_rkeys ||
        storages[storage].device)
        return am_read_post(op, storage, offset, local, len, false);
    /* One message carries one token: a storage granted by another starts the next. */
    if (reads->count == AM_READV_MAX || reads->bytes + len > AM_READV_BYTES ||
        (reads->count > 0 && memcmp(storages[reads->ranges[0].storage].token,
                                    storages[storage].token, TRANSPORT_TOKEN_SIZE) != 0)) {
        if ((status = am_reads_flush(op, reads)) != KVX_OK)
            return status;
    }
    reads->ranges[reads->count] =
        (struct am_range){.storage = storage, .offset = offset, .length = len};
    reads->locals[reads->count++] = local;
    reads->bytes += len;
    return KVX_OK;
}

kvx_status_t am_write_post(struct transport_op *op, uint32_t storage, uint64_t offset,
                           const void *local, uint64_t len)
{
    struct am_request *req = NULL; /* set when request_create succeeds: GCC -O2 cannot tell */
    kvx_status_t status = request_create(op, storage, (void *)(uintptr_t)local, len, 0, 0, &req);
    bool device;

    if (status != KVX_OK)
        return status;
    device            = op->conn->storages[storage].device;
    req->write        = true;
    req->header.write = (struct am_write_header){
        .cookie  = req->cookie,
        .offset  = offset,
        .storage = storage,
    };
    memcpy(req->header.write.token, op->conn->storages[storage].token, TRANSPORT_TOKEN_SIZE);
    return request_send(req, AM_WRITE, local, len, device ? UCP_AM_SEND_FLAG_RNDV : 0);
}

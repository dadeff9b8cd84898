/* transport_private.h: the records transport.c and transport_am.c share (never included
 * elsewhere): the context, mappings, connections and operation records, and the calls with
 * which kvx's own reads and writes (transport_am.c) count operations and find storages. */
#ifndef KVX_SRC_TRANSPORT_PRIVATE_H
#define KVX_SRC_TRANSPORT_PRIVATE_H

#include "transport.h"
#include "unmap_slices.h"

#include <ucp/api/ucp.h>

/* Active-message ids a transport accepts handlers for; kvx uses a handful. */
#define TRANSPORT_AM_IDS 16
/* Connections closed with operations pending, kept parked (transport_conn_destroy). */
#define TRANSPORT_MAX_PARKED 16
/* A closing connection's local operations get this long to finish (transport_settle_run),
 * and progress calls that do nothing end the wait sooner. The close, and then each turn of
 * the loop, give all settling connections together at most TRANSPORT_SETTLE_SLICE seconds,
 * so settling never holds a turn or the caller. */
#define TRANSPORT_SETTLE_SECONDS 1.0
#define TRANSPORT_SETTLE_IDLE    64
#define TRANSPORT_SETTLE_SLICE   0.0005
/* A connection whose worker a peer's push writer was connected to settles at least this long,
 * idle or not (conn_settle_round says why). */
#define TRANSPORT_SETTLE_WRITER 0.1

/* A grant a peer presents with each read or write (transport_am.c), 128 random bits. */
#define TRANSPORT_TOKEN_SIZE 16

/* UCX log lines kept for the agent between two of its turns (transport_log.c). */
#define TRANSPORT_LOG_LINES 16
#define TRANSPORT_LOG_LINE  384 /* bytes of one */

struct am_reply;
struct am_request;
struct am_share;
struct transport_link; /* transport_link.c: a connection's or an accepted kvx TCP link */
struct tcplink_range;

/* What tells this host and network namespace from others (transport_link.c). */
#define TRANSPORT_HOST_ID_SIZE 16

/* transport_log.c: a transport's place in the process-wide log routing (attach at create,
 * detach at destroy, after its last worker), and the window in which this thread destroys
 * one of its workers: the warnings UCX prints there about work a peer left are counted, not
 * shown, and while `destroying` (the whole transport) nothing is routed to it any more. */
void transport_log_attach(struct transport *t);
void transport_log_detach(struct transport *t);
void transport_log_close_begin(struct transport *t, bool destroying);
void transport_log_close_end(void);

/* Puts kvx's UCX settings into `config` where the environment sets none, for the UCX version
 * loaded (transport_settings.c), and says which TCP segment sizes UCX will use: both 0 when
 * `tcp` is false (the transport list has no tcp). An environment UCX would refuse, or that
 * kvx cannot read, is an error naming the variable. */
kvx_status_t transport_settings_apply(ucp_config_t *config, bool tcp,
                                      struct transport_segments *segments_p);

struct am_slot {
    transport_am_handler_t handler;
    void *arg;
};

/* A handler of kvx's small messages (transport_msg.c), on the main worker and on every
 * connection's worker. */
struct msg_slot {
    struct transport *t;
    transport_msg_handler_t handler;
    void *arg;
    bool conns; /* on every connection's worker too */
};

/* A record of kvx's active-message protocol that UCX may still call back for (a request sent
 * or a reply being received): kept on a list so that a worker destroyed under it frees it. */
struct am_record {
    struct am_record *prev;
    struct am_record *next;
    struct am_record **list;
};

struct transport {
    ucp_context_h context;
    ucp_worker_h worker; /* the main worker: its address is the one peers connect to */
    struct am_slot am[TRANSPORT_AM_IDS];
    struct msg_slot msg[TRANSPORT_AM_IDS]; /* set on each connection's worker too */
    size_t orphaned;               /* op records released while UCX still owed completions */
    size_t pending;                /* operations posted on live connections, not completed */
    struct transport_conn *parked; /* closed with operations pending: never progressed again */
    size_t num_parked;
    struct transport_conn *settling; /* closed, finishing what needs nothing of the peer */
    size_t num_settling;
    struct transport_conn *unmapping; /* settled, its peer's storages leaving our page tables */
    struct transport_op *copying;     /* ops with copies from mapped storages left, oldest first */
    struct transport_op *copying_tail;
    unsigned progressing; /* progress calls under way: nothing may be closed inside one */
    /* Its transports include one on which UCX checks no key (TCP's software RMA): the context
     * has no RMA, peers get grants instead of keys, and kvx serves their reads and writes. */
    bool served;
    uint8_t read_token[TRANSPORT_TOKEN_SIZE];  /* what a peer's read must present */
    uint8_t write_token[TRANSPORT_TOKEN_SIZE]; /* what a peer's write must present (push) */
    struct transport_mem **mems;               /* by storage index (order of mapping) */
    size_t num_mems;
    struct am_record *replies; /* the main worker's: answers and writes being received */
    size_t serving;            /* of those, counted (transport_am.c: not written off) */
    struct am_reply *oldest;   /* the counted ones, oldest first (am_replies_expire) */
    struct am_reply *newest;
    struct am_share *shares;         /* each requester's count of them, by its endpoint */
    size_t num_share_slots;          /* 0, or a power of 2 */
    size_t num_shares;               /* requesters with records counted */
    size_t written_off;              /* records past their bound that UCX still holds */
    unsigned expire_turns;           /* loop turns since am_replies_expire read the clock */
    struct am_reply *queued;         /* writes to receive once progress returned */
    transport_read_hook_t read_hook; /* a served read's attachment (transport_set_read_hook) */
    void *read_hook_arg;
    struct transport_data_counters counters;
    struct transport_segments tcp_segments; /* what UCX uses (transport_settings.c) */
    /* Its list had tcp: UCX gets none (transport_link.c), peers UCX cannot reach on this host
     * go over kvx's links. */
    bool links;
    bool ucx_host;  /* UCX's list reaches processes of this host (not only "self") */
    bool ucx_net;   /* and of other hosts (RDMA) */
    int link_epoll; /* the listener, the links accepted and the main worker's event fd */
    int listen_fd;  /* -1: not listening for links */
    uint16_t listen_port;
    struct transport_link *links_accepted; /* newest first */
    struct transport *link_source;         /* whose accepted links writers borrow (or NULL) */
    size_t num_links_accepted;
    uint8_t host_id[TRANSPORT_HOST_ID_SIZE];
    /* UCX's log (transport_log.c), all under its mutex */
    struct transport *log_next; /* in the process's list of transports */
    bool log_routed;            /* UCX's warnings and errors come here, not to stdout */
    bool log_destroying;        /* transport_destroy under way: nothing more is routed */
    char log_lines[TRANSPORT_LOG_LINES][TRANSPORT_LOG_LINE];
    size_t num_log_lines;
    uint64_t log_dropped; /* lines past TRANSPORT_LOG_LINES */
    uint64_t log_quieted; /* close-time warnings counted, not shown */
};

struct transport_mem {
    struct transport *t;
    ucp_mem_h memh;       /* peers may read it */
    ucp_mem_h write_memh; /* peers may write it (push), mapped when first packed; or NULL */
    void *address;
    size_t size; /* bytes */
    size_t index;
    bool device;
};

/* How a connection reaches one storage of its peer. */
struct conn_storage {
    bool served; /* through the peer's kvx (a grant), not a UCX key */
    uint8_t token[TRANSPORT_TOKEN_SIZE];
    uint64_t size;
    bool device;
};

/* A worker per connection, because UCX offers no bounded way to end the operations of one
 * endpoint without its peer-failure mode (docs/agent.md "Closing"): destroying the worker
 * is, and it takes only this connection's operations with it. */
struct transport_conn {
    struct transport *t;
    ucp_worker_h worker;
    ucp_ep_h ep;
    ucp_rkey_h *rkeys; /* by the peer's storage index; NULL where it is served */
    struct conn_storage *storages;
    /* By the peer's storage index: where its memory is mapped into this process, minus its
     * base in the peer's (so mapped[s] + remote address is local), or 0 where it is not. */
    uintptr_t *mapped;
    size_t num_rkeys;
    size_t num_mapped;
    struct prefault_range *ranges;      /* of the mapped storages, num_mapped of them */
    struct prefault *prefault;          /* of the mapped storages; stopped before their keys go */
    struct unmap_slices unmap;          /* closing: those ranges leaving our page tables */
    struct transport_op *ops;           /* every op record of this connection, released or not */
    struct transport_conn *next_parked; /* in t->parked */
    struct am_record *requests;         /* kvx reads and writes awaiting their answer */
    struct am_request **by_cookie;      /* the same, by the cookie's index */
    struct am_request *receives;        /* answers to receive once progress returned */
    struct am_request *waiting;         /* requests behind the window, oldest first */
    struct am_request **waiting_end;
    size_t in_flight;       /* requests sent and not answered */
    uint32_t *free_cookies; /* indices of by_cookie not in use */
    size_t num_cookies;
    size_t num_free_cookies;
    uint32_t generation; /* of cookies: an answer to a request that ended finds nothing */
    struct transport_conn *next_settling; /* in t->settling, then in t->unmapping */
    double settle_deadline;               /* clock_seconds() when settling gives up */
    unsigned settle_idle;                 /* progress calls in a row that did nothing */
    size_t writes_receiving; /* a writer's rendezvous bytes being received by its worker */
    bool push_target;        /* its address was handed out for a writer (transport_conn_address) */
    /* A kvx link (transport_link.c): its own, or (borrowed) a push writer's on the link its
     * peer opened to us. `linked`: its data goes over it, and it has no worker or endpoint;
     * else it is the link a push writer of the peer writes over, beside UCX's endpoint. */
    struct transport_link *link;
    bool linked;
    bool link_borrowed;
    int link_epoll; /* its event descriptor: the link's socket (and its worker's descriptor) */
    char link_to[96];
    char link_down[160]; /* why its link went down: what its failed operations say */
    bool parked;
    bool settling; /* closing (transport_settle_run): completions tell no owner */
};

/* A read from a peer storage mapped here (transport_conn.mapped): a plain copy, made by the
 * loop a slice at a time (transport_copies_run) when the post's own budget is spent. */
struct op_copy {
    void *dst;
    const void *src;
    size_t len; /* bytes */
};

struct transport_op {
    struct transport_conn *conn;
    transport_op_finished_t finished;
    void *arg;
    size_t posted; /* operations whose completion callback is still to come or came */
    size_t completed;
    int first_error; /* 0, or the UCX status of the first failure */
    bool armed;
    bool released;
    struct transport_op *prev; /* in conn->ops */
    struct transport_op *next;
    struct op_copy *copies; /* queued copies, copied in order; counted as one operation */
    size_t num_copies;
    size_t max_copies;
    size_t next_copy;               /* the first not finished */
    size_t copy_done;               /* bytes of copies[next_copy] already copied */
    struct transport_op *copy_next; /* in t->copying while it has copies left */
    bool copying;
    uint8_t am[TRANSPORT_AM_MAX];         /* an active message's bytes, alive until it completes */
    uint8_t attach[TRANSPORT_ATTACH_MAX]; /* transport_op_attach's bytes */
    size_t attach_size;                   /* 0: none */
    bool attached;                        /* they went with the post's one read message */
};

/* Who sent a message, for an answer (transport_msg.c; transport_am.c makes one for a read's
 * attachment). */
struct transport_msg_from {
    struct transport *t;
    ucp_ep_h ep;                 /* the sender's, as UCX gave it; NULL: no way back */
    struct transport_link *link; /* or the link it came on */
};

kvx_status_t transport_ucs_error(const char *what, ucs_status_t status);

/* Sets `cb` as the handler of active-message `id` on `worker`. */
kvx_status_t transport_worker_set_handler(ucp_worker_h worker, unsigned id,
                                          ucp_am_recv_callback_t cb, void *arg);

/* One more operation of `op` whose completion will be reported (transport_op_complete). */
void transport_op_posted_one(struct transport_op *op);
/* One operation of `op` completed, with a UCX status. */
void transport_op_complete(struct transport_op *op, ucs_status_t status);

/* transport_copy.c: queues a copy on `op` (its first makes the op one more pending operation,
 * completed by transport_copies_run after its last copy), and drops the copies of `op` not
 * made yet: their operation counts as completed, cancelled, and nobody is told (the op is
 * being let go, or its connection closed). */
kvx_status_t copy_queue_add(struct transport_op *op, void *dst, const void *src, size_t len);
void copy_queue_drop(struct transport_op *op);

void am_record_link(struct am_record *r, struct am_record **list);
void am_record_unlink(struct am_record *r);

/* transport_am.c: sets the handlers of the protocol on a worker (the main one serves reads
 * and writes, a connection's receives their answers). */
kvx_status_t am_serve_set(struct transport *t);
kvx_status_t am_conn_set(struct transport_conn *conn);
/* One range of a vectored read, as it travels: which bytes of the owner's storage. */
struct am_range {
    uint32_t storage;
    uint32_t reserved; /* zero */
    uint64_t offset;
    uint64_t length;
};

/* Small reads of one post on one connection, gathered into one message: a request and an
 * answer per read cost more than the bytes of a 4 KiB block over TCP. A read larger than
 * AM_READV_RANGE goes alone, as one message of AM_READV_MAX ranges or AM_READV_BYTES would. */
#define AM_READV_MAX   64
#define AM_READV_RANGE ((uint64_t)64 << 10)
#define AM_READV_BYTES ((uint64_t)256 << 10)
struct am_reads {
    uint32_t count;
    uint64_t bytes;
    struct am_range ranges[AM_READV_MAX];
    void *locals[AM_READV_MAX];
};

/* Adds a read of `len` bytes of the peer's storage `storage` at `offset` into host memory at
 * `local` to `reads` (empty: zeroed), sending what was gathered first when it is full. */
kvx_status_t am_reads_add(struct transport_op *op, struct am_reads *reads, uint32_t storage,
                          uint64_t offset, void *local, uint64_t len);
/* Sends what `reads` gathered (one range: as a plain read) and empties it. */
kvx_status_t am_reads_flush(struct transport_op *op, struct am_reads *reads);
/* The owner's check of a vectored read: whether `length` bytes of `data` are `count` ranges
 * (2 to AM_READV_MAX), each non-empty and inside one of the storages `t` serves; if so, fills
 * iov[count] with where their bytes are. Never trusts the bytes: a fuzz target's. */
bool am_ranges_granted(const struct transport *t, const void *data, size_t length, uint32_t count,
                       ucp_dt_iov_t *iov);
/* Posts one read or write of `len` bytes between `local` and the peer's storage `storage` at
 * `offset`, completed in `op` when the peer answered. */
kvx_status_t am_read_post(struct transport_op *op, uint32_t storage, uint64_t offset, void *local,
                          uint64_t len, bool local_device);
/* Posts the reads of `pairs` as one message carrying op->attach (a single read of any size, or
 * up to AM_READV_MAX small ones: am_reads_one_message says which posts qualify). */
kvx_status_t am_reads_post_attached(struct transport_op *op, struct am_reads *reads);
kvx_status_t am_write_post(struct transport_op *op, uint32_t storage, uint64_t offset,
                           const void *local, uint64_t len);
/* Receives the writes the main worker's handler queued (after its progress returned). */
void am_writes_receive(struct transport *t);
/* Starts receiving the rendezvous answers a connection's handlers queued. */
void am_receives_start(struct transport_conn *conn);
/* Sends the requests waiting for room in the connection's window. */
void am_waiting_send(struct transport_conn *conn);
/* The owner's answers nobody took (transport_am.c): writes off those older than their bound,
 * so that they count against neither their requester's share nor the bound of all; called once
 * a turn of the loop (transport_settle_run), outside progress, it reads the clock once in
 * AM_EXPIRE_TURNS calls while answers are out. Returns the records written off. */
size_t am_replies_expire(struct transport *t);
/* Frees the requesters' shares (after the main worker and its records). */
void am_serve_free(struct transport *t);
/* Frees what a destroyed worker left of the protocol's records on `list`. */
void am_records_free(struct am_record **list);
/* Frees a connection's cookie table (after its worker). */
void am_conn_free(struct transport_conn *conn);

/* transport_link.c: kvx's TCP links under a transport whose list had tcp. The plane: an epoll
 * set holding `worker_fd` (the main worker's), then the listener (transport_listen), the links
 * accepted, progressed and bounded (reap: once a turn, outside progress). */
kvx_status_t link_plane_create(struct transport *t, int worker_fd);
void link_plane_destroy(struct transport *t);
size_t link_plane_progress(struct transport *t);
bool link_plane_busy(const struct transport *t);
size_t link_plane_reap(struct transport *t);
/* The trailer a listening transport appends to its worker address (0 bytes when not
 * listening), and a peer's, read from the end of its address (`size` then shrinks to UCX's
 * part): its port and host id. */
struct link_address {
    uint16_t port;
    uint8_t host_id[TRANSPORT_HOST_ID_SIZE];
    uint8_t key[TRANSPORT_TOKEN_SIZE]; /* what its links prove */
};
size_t link_trailer_size(const struct transport *t);
void link_trailer_write(const struct transport *t, uint8_t *out);
bool link_trailer_read(const void *address, size_t *size, struct link_address *out);
/* A link reference (transport_conn_address of a connection over a link): the link's id. */
bool link_ref_read(const void *address, size_t size, uint8_t id[16]);
kvx_status_t link_conn_address(struct transport_conn *conn, void **buf_p, size_t *size_p);
/* A connection's own link to the peer's listener at `host` and its trailer's port, proving its
 * trailer's key; or a push writer's, on the accepted link with `id`. */
kvx_status_t link_conn_open(struct transport_conn *conn, const char *host,
                            const struct link_address *at);
kvx_status_t link_conn_borrow(struct transport_conn *conn, const uint8_t id[16]);
/* Closes its link (a borrowed one: drops its frames and answers), telling no op's owner. */
void link_conn_close(struct transport_conn *conn);
size_t link_conn_progress(struct transport_conn *conn);
bool link_conn_busy(const struct transport_conn *conn);
void link_conn_describe(const struct transport_conn *conn, char *buf, size_t size);
/* Posts reads of `count` ranges of the peer's storages into host memory at `locals`, each an
 * operation of `op` completed by its answer; the post's attachment goes with its only READ. */
kvx_status_t link_reads_post(struct transport_op *op, const struct tcplink_range *ranges,
                             void *const *locals, size_t count);
kvx_status_t link_write_post(struct transport_op *op, uint32_t storage, uint64_t offset,
                             const void *local, uint64_t len);
kvx_status_t link_am_post(struct transport_op *op, unsigned id, const void *data, size_t size);
kvx_status_t link_msg_send(struct transport_link *tl, unsigned id, const void *data, size_t size);

/* transport_msg.c: sets the message handlers set so far on a new connection's worker. */
kvx_status_t msg_conn_set(struct transport_conn *conn);

#endif

/* transport.h: UCX under kvx: one context with a main worker per agent (peers connect to it),
 * whole-storage memory maps with packed remote keys, and connections, each an endpoint on a
 * worker of its own so that closing one is always bounded. Operations are posted and counted,
 * never waited for. Knows nothing of requests or leases. */
#ifndef KVX_SRC_TRANSPORT_H
#define KVX_SRC_TRANSPORT_H

#include "kvx.h"

struct transport;      /* a UCX context and its main worker */
struct transport_mem;  /* one mapped storage */
struct transport_conn; /* a worker of its own, an endpoint on it and the peer's remote keys */
struct transport_op;   /* completion counting of one batch of operations on one connection */

/* What an agent with GPU storages adds to its default lists: UCX's CUDA copy engine (staging
 * and host <-> device) and CUDA IPC (device to device between processes of one host). Across
 * hosts GPUDirect RDMA is the RDMA transports' own ("rc", "dc"), listed by the user. */
#define TRANSPORT_GPU_TLS "cuda_copy,cuda_ipc"

/* Creates a context with RMA and active messages and its main worker. `tls` is a UCX_TLS list
 * (NULL: KVX_DEFAULT_TRANSPORTS); `one_rail` keeps every operation of a connection on one lane
 * per kind (push writers: what proved the peer also carries its data). UCX reads the rest of
 * its environment as usual (UCX_NET_DEVICES, ...). Destroy every connection first. */
kvx_status_t transport_create(const char *tls, bool one_rail, struct transport **transport_p);
void transport_destroy(struct transport *t);

/* Maps `size` bytes once, whole: the caller's memory at `address`, or memory UCX allocates
 * when `address` is NULL (so peers on this host can map it through shared memory). */
kvx_status_t transport_mem_map(struct transport *t, void *address, size_t size,
                               struct transport_mem **mem_p);
/* Maps `size` bytes of CUDA device memory at `address` (allocated by the caller: src/gpu.h).
 * UCX moves it only with its CUDA transports (TRANSPORT_GPU_TLS) in the context's list; a UCX
 * built without CUDA support is refused by name. */
kvx_status_t transport_mem_map_gpu(struct transport *t, void *address, size_t size,
                                   struct transport_mem **mem_p);
void transport_mem_unmap(struct transport *t, struct transport_mem *mem);
void *transport_mem_address(const struct transport_mem *mem);

/* What a peer needs to reach a mapping, as a malloc'd copy the caller frees (it travels in
 * the handshake metadata, to authenticated peers only): a UCX remote key that grants reads
 * (or, `writable`, writes too: push registrations), or, where this transport serves its own
 * memory (its transports include TCP), kvx's grant: a token the peer presents with each
 * request. */
kvx_status_t transport_mem_pack_rkey(struct transport *t, struct transport_mem *mem, bool writable,
                                     void **buf_p, size_t *size_p);

/* The sizes of UCX's TCP segments in this transport, bytes: the largest active message it
 * sends in one segment (tx) and the largest it receives (rx): kvx's 256 KiB, or what the
 * environment's UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE set (UCX's defaults for the one
 * not set). Both 0 without tcp in its list. A receiver aborts in UCX on a segment larger than
 * its rx, so peers compare them at the handshake (conn_open). */
struct transport_segments {
    uint64_t tx;
    uint64_t rx;
};
struct transport_segments transport_tcp_segments(const struct transport *t);

/* Where the transports include TCP, UCX would serve peers' gets and puts at any address with
 * any key (its software RMA): the context then has no RMA, peers get grants instead of keys,
 * and this transport serves their reads and writes itself, each checked against its storages
 * (transport_am.c). These count them: reads and writes served, and those refused (a wrong
 * token, a range outside every storage, a malformed message). */
struct transport_data_counters {
    uint64_t reads;
    uint64_t writes;
    uint64_t refused;
};
const struct transport_data_counters *transport_data_counters(const struct transport *t);

/* UCX's warnings and errors as lines of the agent's log (transport_log.c): taken from UCX's
 * own output while `routed` (the agent has a log callback), else printed by UCX as usual.
 * transport_log_next gives the next queued line ("UCX WARN: ...") into `line`, then one that
 * counts the close-time warnings not shown; false when there is none. Callable from the
 * agent's thread while UCX logs from any. */
void transport_log_route(struct transport *t, bool routed);
bool transport_log_next(struct transport *t, char *line, size_t size);

/* Where the transports include tcp, UCX is given none: a peer on another host or network
 * namespace is reached over kvx's own TCP links (transport_link.c), which prove a grant of the
 * peer's before either side reads a length from the other. A listening agent takes links at
 * `host` (its side channel's; "*": every interface) on a port of the kernel's choosing, which
 * its worker address carries. Does nothing where the transports have no tcp. */
kvx_status_t transport_listen(struct transport *t, const char *host);

/* Push writers of `t` take the links peers opened to `listener` (a link connection's
 * transport_conn_address names one there): call before connecting. */
void transport_links_share(struct transport *t, struct transport *listener);

/* The main worker's address, as a malloc'd copy the caller frees (with the links' port when
 * listening). */
kvx_status_t transport_worker_address(struct transport *t, void **buf_p, size_t *size_p);
/* The address of a connection's own worker (malloc'd): a peer's push writer connects there,
 * so that closing the connection ends whatever that writer still sends (it is never
 * progressed again), where writes to the main worker could land after a push failed. */
kvx_status_t transport_conn_address(struct transport_conn *conn, void **buf_p, size_t *size_p);

/* One storage of the peer: its packed remote key and where it is in the peer's process. */
struct transport_remote_mem {
    kvx_blob_t rkey;
    uint64_t base;
    uint64_t size;
    bool device; /* GPU memory of the peer: never copied from a mapping here */
};

/* A connection to the worker whose packed address is `address`, with the peer's storages'
 * remote keys unpacked on it. A storage that UCX maps into this process (shared memory the
 * peer allocated through UCX, on this host) is read with memcpy from that mapping, whatever
 * protocol UCX would pick; transport_conn_describe reports it. Creating one does not wait:
 * UCX wires the endpoint up as operations need it. A peer on another host or network namespace
 * is reached over a kvx link to its listener at `host` (the host its side channel was reached
 * at; NULL where the address is a link reference: transport_conn_address). */
kvx_status_t transport_conn_create(struct transport *t, const void *address, size_t size,
                                   const char *host, const struct transport_remote_mem *mems,
                                   size_t num_mems, struct transport_conn **conn_p);

/* Whether the connection's link (kvx's TCP data plane, if it has one) is up: both ends proved
 * the key. An error once it is down (refused, closed, or not a kvx link at the other end). A
 * decode agent waits for it before it names the link to a prefill (push registration). */
kvx_status_t transport_conn_ready(struct transport_conn *conn, bool *ready_p);

/* Closes a connection and never waits. Copies from its mapped storages not made yet are
 * dropped. With nothing pending, its keys go, then its worker with its endpoint. With
 * operations still pending it settles first (transport_settle_run): the loop progresses it a
 * few calls a turn so that what needs nothing of the peer (UCX 1.22's queued CMA gets) ends,
 * for at most TRANSPORT_SETTLE_SECONDS; then it is freed, or, with operations still pending (a
 * peer that stopped or died), parked: never progressed again, destroyed with the transport or
 * once more than a few are parked (transport.c says why). Its owners are never told of what
 * completes after this call; local copies may still land while it settles (callers that
 * report a failure wait for transport_settling to be 0). Must not be called from inside a
 * transport progress call. NULL-safe. */
void transport_conn_destroy(struct transport_conn *conn);

/* The closing connections' phase of the loop, and the served answers' (transport_am.c: those
 * nobody took within their bound are written off): the settling connections get progress calls
 * for at most TRANSPORT_SETTLE_SLICE seconds together, then each is freed once nothing of it
 * is pending, or parked once it made no progress for a while or its deadline passed; a settled
 * one with mapped peer storages first waits for its populating thread to end and has them
 * leave our page tables, UNMAP_SLICE bytes a call for all such together. Returns the progress
 * calls that did something, the connections that left the state and those still unmapping,
 * and the answers written off. */
size_t transport_settle_run(struct transport *t);

/* Connections closed and still settling: until it is 0, a closed connection's local copies
 * may still write our memory. */
size_t transport_settling(const struct transport *t);

/* Bytes of reads from a peer's storage mapped here that a post copies itself; the rest is
 * queued on the op and copied by transport_copies_run, so a post of a large request returns
 * at once (docs/agent.md, "The loop"). A request of a few blocks is still copied in the post,
 * as fast as before. */
#define TRANSPORT_COPY_INLINE ((size_t)256 << 10)

/* Makes up to `budget` bytes of the queued copies, oldest op first; an op whose last copy
 * is made completes (its `finished` runs, as from progress). Returns the number of copies
 * worked on (0: nothing was queued). */
size_t transport_copies_run(struct transport *t, size_t budget);

/* A batch's completion counter. `finished` (may be NULL) runs once, from inside transport
 * progress, when the batch was armed and every operation of it completed; it may only record
 * that (queue its owner), never post or destroy. */
typedef void (*transport_op_finished_t)(void *arg, struct transport_op *op);

kvx_status_t transport_op_create(struct transport_conn *conn, transport_op_finished_t finished,
                                 void *arg, struct transport_op **op_p);

/* Gives the op up: freed now if nothing of it is pending, else when its last operation
 * completes or its connection is destroyed; `finished` never runs after this. NULL-safe. */
void transport_op_release(struct transport_op *op);

/* Where a pair list's storage indices point: local base addresses by local storage index,
 * remote base addresses by remote storage index (the keys are the connection's). */
struct transport_targets {
    void *const *local_bases;
    const kvx_mem_type_t *local_mems; /* by local storage index: host memory takes memcpy */
    const uint64_t *remote_bases;
    bool mirrored; /* the pairs are the peer's plan: their remote side is ours (push) */
};

/* Posts one get (or put) per pair on the op's connection without waiting. On error some
 * operations may be pending: release the op (and close the connection). */
kvx_status_t transport_rma_post(struct transport_op *op, bool put, const kvx_pair_t *pairs,
                                size_t count, const struct transport_targets *targets);

/* Bytes (at most TRANSPORT_ATTACH_MAX, copied) that the next transport_rma_post of reads sends
 * with them when every one of them is served by the peer's kvx and they travel as one message
 * (transport_am.c): the peer's owner hook (transport_set_read_hook) gets them after it served
 * that message. Whether they went: transport_op_attached, after the post. */
#define TRANSPORT_ATTACH_MAX 128
void transport_op_attach(struct transport_op *op, const void *data, size_t size);
bool transport_op_attached(const struct transport_op *op);

/* Posts a flush of the connection's endpoint, counted in `op`: puts posted before it are
 * complete at the target when it completes, which is what lets a notification follow. Posts
 * nothing where every storage of the peer is served (its writes complete on its answer). */
kvx_status_t transport_flush_post(struct transport_op *op);

/* Posts an eager active message of at most TRANSPORT_AM_MAX bytes (copied into the op). */
#define TRANSPORT_AM_MAX 64
kvx_status_t transport_am_post(struct transport_op *op, unsigned id, const void *data, size_t size);

/* Nothing more will be posted on `op`: `finished` runs once everything completed (at once,
 * from inside this call, when nothing is pending). */
void transport_op_arm(struct transport_op *op);

/* Posted and not completed yet; KVX_OK or an error naming the first failed operation. */
size_t transport_op_pending(const struct transport_op *op);
size_t transport_op_posted(const struct transport_op *op);
kvx_status_t transport_op_status(const struct transport_op *op, const char *what);

/* Active messages arrive at the main worker: a handler per id receives each message's bytes
 * during progress. */
typedef void (*transport_am_handler_t)(void *arg, const void *data, size_t size);
kvx_status_t transport_am_set_handler(struct transport *t, unsigned id,
                                      transport_am_handler_t handler, void *arg);

/* kvx's own small messages beside the data (transport_msg.c): eager active messages of at
 * most TRANSPORT_MSG_MAX bytes, copied when sent. A handler set for an id runs, during
 * progress, for each such message that arrives at the worker it was set on; `from` lets it answer
 * the sender at once (transport_msg_reply), and is valid only during the call, because the sender's
 * endpoint is UCX's and may be gone after it. */
#define TRANSPORT_MSG_MAX 73728 /* 72 KiB: a small push answered with its bytes */
struct transport_msg_from;
typedef void (*transport_msg_handler_t)(void *arg, const void *data, size_t size,
                                        const struct transport_msg_from *from);

/* Set on the main worker's owner: `hook` gets the bytes a peer attached to a read message
 * (transport_op_attach) once the read's answer, the bytes of our memory it read included, has
 * left our memory (UCX sent it at once, or its rendezvous completed), with `sent` true, or
 * when it could not be sent or the read was refused, with `sent` false; and `from` to answer
 * the peer (transport_msg_reply). Runs inside progress. */
typedef void (*transport_read_hook_t)(void *arg, const void *data, size_t size, bool sent,
                                      const struct transport_msg_from *from);
void transport_set_read_hook(struct transport *t, transport_read_hook_t hook, void *arg);
/* On the main worker, and with `conns` on the workers of connections made later too (set it
 * before connecting). */
kvx_status_t transport_msg_set_handler(struct transport *t, unsigned id, bool conns,
                                       transport_msg_handler_t handler, void *arg);
/* Sends a message on the connection's endpoint without waiting; it leaves with the
 * connection's progress, and goes with the connection if it has not left by then. */
kvx_status_t transport_msg_send(struct transport_conn *conn, unsigned id, const void *data,
                                size_t size);
/* Answers the message being handled, to its sender; false when it carries no way back (it was
 * not sent by transport_msg_send) or the answer could not be sent. */
bool transport_msg_reply(const struct transport_msg_from *from, unsigned id, const void *data,
                         size_t size);

/* Describes the transports UCX really chose for a connection, lane by lane, with each lane's
 * role ("sysv(am) posix cma(rma_bw)"): the configured list is only what UCX may choose from. */
void transport_conn_describe(struct transport_conn *conn, char *buf, size_t size);

/* Progresses the main worker, or a connection's worker, once; returns the events handled. */
unsigned transport_progress(struct transport *t);
unsigned transport_conn_progress(struct transport_conn *conn);

/* True inside a progress call (a completion callback runs there): what closes a connection
 * or frees an op's owner must not run then. */
bool transport_progressing(const struct transport *t);

/* Sleeping until UCX has work: a worker's event file descriptor (-1 if it has none), and
 * arming it, which returns false when events are already pending (progress again instead
 * of sleeping); transport_arm also returns false while copies are queued or connections
 * settle: the loop has work of its own then. */
int transport_event_fd(struct transport *t);
bool transport_arm(struct transport *t);
int transport_conn_event_fd(struct transport_conn *conn);
bool transport_conn_arm(struct transport_conn *conn);

/* Operation records still alive because UCX has not completed them (a peer that stopped
 * answering), across every connection: bounded by what was posted on live connections. */
size_t transport_ops_orphaned(const struct transport *t);

/* Operations posted on connections that are not parked and not completed yet: while there
 * are some, a completion may come from any progress call. */
size_t transport_ops_pending(const struct transport *t);

#endif

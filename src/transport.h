/* transport.h: UCX under kvx: one context and worker per agent, whole-storage memory maps
 * with packed remote keys, endpoints from worker addresses, batches of one-sided gets or
 * puts with completion counting, and active messages. Knows nothing of requests or leases. */
#ifndef KVX_SRC_TRANSPORT_H
#define KVX_SRC_TRANSPORT_H

#include "kvx.h"

struct transport;      /* a UCX context and its one worker */
struct transport_mem;  /* one mapped storage */
struct transport_ep;   /* an endpoint to a peer's worker */
struct transport_rkey; /* a peer storage's unpacked remote key, bound to an endpoint */

/* Default transports on one host: shared memory, cross-memory attach, TCP for wire-up. */
#define TRANSPORT_DEFAULT_TLS "sm,cma,tcp"

/* Creates a context with RMA and active messages and its worker. `tls` is a UCX_TLS list
 * (NULL: TRANSPORT_DEFAULT_TLS); UCX reads the rest of its environment as usual
 * (UCX_NET_DEVICES, ...). */
kvx_status_t transport_create(const char *tls, struct transport **transport_p);
void transport_destroy(struct transport *t);

/* Maps `size` bytes once, whole: the caller's memory at `address`, or memory UCX allocates
 * when `address` is NULL (so peers on this host can map it through shared memory). */
kvx_status_t transport_mem_map(struct transport *t, void *address, size_t size,
                               struct transport_mem **mem_p);
void transport_mem_unmap(struct transport *t, struct transport_mem *mem);
void *transport_mem_address(const struct transport_mem *mem);

/* The packed remote key of a mapping and this worker's address, as malloc'd copies the
 * caller frees (they travel in the handshake metadata). */
kvx_status_t transport_mem_pack_rkey(struct transport *t, struct transport_mem *mem, void **buf_p,
                                     size_t *size_p);
kvx_status_t transport_worker_address(struct transport *t, void **buf_p, size_t *size_p);

/* An endpoint to the worker whose packed address is `address`, and remote keys on it. */
kvx_status_t transport_ep_create(struct transport *t, const void *address, size_t size,
                                 struct transport_ep **ep_p);
void transport_ep_destroy(struct transport *t, struct transport_ep *ep);
kvx_status_t transport_rkey_unpack(struct transport_ep *ep, const void *buf, size_t size,
                                   struct transport_rkey **rkey_p);
void transport_rkey_destroy(struct transport_rkey *rkey);

/* Where a pair list's storage indices point: local base addresses by local storage index,
 * remote base addresses and keys by remote storage index. */
struct transport_targets {
    void *const *local_bases;
    const uint64_t *remote_bases;
    struct transport_rkey *const *rkeys;
    bool mirrored; /* the pairs are the peer's plan: their remote side is ours (push) */
};

/* Completion counting of one batch of operations. It must live until every posted
 * operation completed (transport_op_pending() is false), or until the endpoint it was
 * posted on is destroyed, which cancels what is pending. */
struct transport_op {
    size_t posted; /* operations whose completion callback is still to come or came */
    size_t completed;
    int first_error; /* 0, or the UCX status of the first failure */
};

/* Posts one get (or put) per pair without waiting. Even on error some operations may be
 * pending: wait for them (or destroy the endpoint) before releasing `op`. */
kvx_status_t transport_rma_post(struct transport_ep *ep, bool put, const kvx_pair_t *pairs,
                                size_t count, const struct transport_targets *targets,
                                struct transport_op *op);

static inline bool transport_op_pending(const struct transport_op *op)
{
    return op->completed < op->posted;
}

/* Releases a heap-allocated `op`: now, or when the transport is destroyed if some of its
 * operations are still pending (their completions must find it). */
void transport_op_release(struct transport *t, struct transport_op *op);

/* KVX_OK when every operation of `op` succeeded, else an error naming the first failure. */
kvx_status_t transport_op_status(const struct transport_op *op, const char *what);

/* Posts one get (or put) per pair, progresses until every one completed, then flushes the
 * endpoint, so the data is complete at the target when this returns KVX_OK. Fails with
 * the first failed completion, or KVX_ERR_IO after `timeout_ms`; the endpoint is failed for
 * good then, and destroying it cancels what is pending. */
kvx_status_t transport_rma(struct transport *t, struct transport_ep *ep, bool put,
                           const kvx_pair_t *pairs, size_t count,
                           const struct transport_targets *targets, int timeout_ms);

/* Active messages: a handler per id receives each message's bytes during progress. */
typedef void (*transport_am_handler_t)(void *arg, const void *data, size_t size);
kvx_status_t transport_am_set_handler(struct transport *t, unsigned id,
                                      transport_am_handler_t handler, void *arg);
kvx_status_t transport_am_send(struct transport *t, struct transport_ep *ep, unsigned id,
                               const void *data, size_t size, int timeout_ms);

/* Describes the transports UCX really chose for `ep`, lane by lane, with each lane's role
 * ("sysv(am) posix cma(rma_bw)"): the configured list is only what UCX may choose from. */
void transport_ep_describe(struct transport_ep *ep, char *buf, size_t size);

/* Progresses the worker once; returns the number of events it handled. */
unsigned transport_progress(struct transport *t);

/* Sleeping until UCX has work: the worker's event file descriptor (-1 if it has none), and
 * arming it, which returns false when events are already pending (progress again instead
 * of sleeping). */
int transport_event_fd(struct transport *t);
bool transport_arm(struct transport *t);

#endif

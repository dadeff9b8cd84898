/* agent.h: an agent and its peers as agent.c and agent_peer.c share them. The agent owns the
 * region table, the mapped storages, the transport and the side channel. */
#ifndef KVX_SRC_AGENT_H
#define KVX_SRC_AGENT_H

#include "agent_hold.h"
#include "notify.h"
#include "stats.h"
#include "regions.h"
#include "transport.h"

/* Side-channel request of a decode agent, and the active message of its notifications
 * (notify.h has their bytes). */
#define AGENT_METADATA_REQUEST "kvx-metadata 1"
#define AGENT_AM_NOTIFY        1

struct kvx_agent {
    kvx_regions_t *regions;
    struct transport *transport;
    char *transports;            /* the UCX_TLS list given to the transport */
    struct transport_mem **mems; /* by storage */
    void **bases;                /* by storage */
    size_t num_storages;
    uint32_t tp_rank;
    uint32_t tp_size;
    uint32_t timeout_ms;
    void *zmq;                /* ZeroMQ context */
    void *router;             /* the listening side channel, or NULL */
    int event_fd;             /* UCX's wakeup descriptor, or -1: progress sleeps on it */
    char listen_address[300]; /* "HOST:PORT" it is bound to (the real port when given 0) */
    void *metadata;           /* this agent's packed metadata, served to peers */
    size_t metadata_size;
    void *push_metadata; /* the same in push mode, sent with push requests */
    size_t push_metadata_size;
    kvx_pairs_t *pairs;         /* reused by every read */
    kvx_agent_stats_t stats;    /* the hold counters are the hold table's */
    struct hold_table holds;    /* requests held for their consumers */
    struct kvx_xfer *xfers;     /* posted transfers in flight, a list for O(1) removal */
    uint64_t xfers_unlinked;    /* transfers that left the list: iterations notice removals */
    struct kvx_xfer *xfer_pool; /* finished transfers kept for reuse (agent_xfer.c) */
    size_t xfer_pooled;
    struct kvx_peer *peers;           /* connected peers, heartbeated by progress */
    struct push_writer *push_writers; /* decode agents this one pushes to (agent_push.c) */
    uint64_t push_uses;
    char *engine_id;
    uint64_t instance; /* random per agent: a restart at the same address answers another */
    uint32_t heartbeat_ms;
    uint32_t peer_ttl_ms;
    uint64_t peers_checked_ms;
    kvx_log_cb_t log;
    void *log_arg;
};

struct kvx_peer {
    kvx_agent_t *agent;
    kvx_metadata_t *metadata;
    struct transport_ep *ep;
    struct transport_rkey **rkeys; /* by the peer's storage index */
    uint64_t *remote_bases;        /* by the peer's storage index */
    size_t num_storages;
    uint32_t tp_rank;
    kvx_peer_plan_t *plan;
    char *address;        /* HOST:PORT of its side channel */
    char transports[256]; /* what UCX chose, after the first read */
    /* liveness (agent_live.c) */
    void *dealer;              /* side-channel socket for heartbeats; NULL once down */
    uint64_t instance;         /* of the prefill agent, from its first answer */
    uint64_t waiting_since_ms; /* the oldest heartbeat not answered yet; 0: none */
    uint64_t last_heartbeat_ms;
    uint64_t last_used_ms;
    uint64_t *wanted; /* request ids heartbeats carry */
    size_t num_wanted;
    size_t wanted_capacity;
    char down[256];        /* why it is down; "" while usable */
    struct kvx_peer *prev; /* in the agent's list */
    struct kvx_peer *next;
};

#define AGENT_HEARTBEAT_REQUEST "kvx-heartbeat 1" /* then a frame of request ids */

/* One line to the agent's log callback, if any. */
__attribute__((format(printf, 2, 3))) void agent_log(kvx_agent_t *agent, const char *format, ...);

/* Liveness of peers (agent_live.c): start heartbeating a freshly connected peer (its first
 * answer within the timeout gives the instance); stop; and the periodic turn of progress. */
kvx_status_t agent_peer_live_start(kvx_peer_t *peer);
void agent_peer_live_stop(kvx_peer_t *peer);
void agent_peers_progress(kvx_agent_t *agent);

/* A request on the peer's side-channel socket (the one heartbeats use, kept open), and its
 * one reply frame (malloc'd, NUL-terminated), waiting at most the agent's timeout while
 * progressing our worker. Heartbeat answers that come first are taken as such: the peer
 * answers one socket's requests in order. A peer that does not answer in time is down. */
kvx_status_t agent_peer_request(kvx_peer_t *peer, const void *const *frames, const size_t *sizes,
                                size_t num_frames, void **reply_p, size_t *reply_size_p);

/* A reply's bytes as a malloc'd copy with a NUL after them, so text replies print safely. */
kvx_status_t agent_reply_copy(const void *data, size_t size, void **reply_p, size_t *size_p);

/* Marks `peer` down with `reason` (once), counted as a dead peer when `dead` (not when
 * dropped for idling): its endpoint and heartbeats close and every transfer in flight with
 * it fails with the reason. */
void agent_peer_down(kvx_peer_t *peer, const char *reason, bool dead);

/* Frees the transfers kept for reuse (agent destruction). */
void agent_xfers_free_pool(kvx_agent_t *agent);

/* Fails every transfer in flight that reads from or notifies `peer` (agent_xfer.c). */
void agent_xfers_fail_peer(kvx_agent_t *agent, const kvx_peer_t *peer, const char *reason);

/* A transfer of `request_id` completed: it is no longer wanted from `peer`. */
void agent_peer_unwant(kvx_peer_t *peer, uint64_t request_id);

/* Completes or fails the posted transfers whose operations finished or whose deadline
 * passed (agent_xfer.c); called by kvx_agent_progress. */
void agent_xfers_progress(kvx_agent_t *agent);

/* Counts a finished transfer in the agent's stats: its figures when it completed. */
void agent_count_transfer(kvx_agent_t *agent, const kvx_read_stats_t *stats, kvx_status_t status);

/* Connects the transport to `peer` (its metadata decoded) and unpacks its remote keys, for
 * reading from it or, in push mode, writing into it. */
kvx_status_t agent_peer_transport_connect(kvx_peer_t *peer);

/* The peer among `peers` that is remote TP rank `rank`, or NULL. */
kvx_peer_t *agent_peer_of_rank(kvx_peer_t *const *peers, size_t num_peers, uint32_t rank);

/* "tcp://HOST:PORT" for a side-channel address "HOST:PORT"; `what` names it in errors. */
kvx_status_t agent_endpoint(const char *address, const char *what, char *endpoint, size_t size);

#endif

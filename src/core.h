/* core.h: what every file of an agent shares, below all of them: the region table, the mapped
 * storages, the transport, the ZeroMQ context, the settings, the loop and the counters. Each
 * counter of `stats` is written by one file only (the one that names it in kvx_agent_stats). */
#ifndef KVX_SRC_CORE_H
#define KVX_SRC_CORE_H

#include "kvx.h"
#include "loop.h"
#include "transport.h"

/* Active message of done notifications (notify.h has its bytes). */
#define CORE_AM_NOTIFY 1

/* Side-channel verbs (sidechan.h frames them). */
#define VERB_METADATA  "kvx-metadata 2"
#define VERB_HEARTBEAT "kvx-heartbeat 2" /* body: request ids still wanted */
#define VERB_PUSH      "kvx-push 2"      /* body: a push request (push_request.h) */
#define REPLY_PUSHED   "kvx-done"
#define REPLY_ERROR    "kvx-error " /* then the message */

struct xfer_set;

struct core {
    struct kvx_agent *agent; /* whose core this is */
    struct xfer_set *xfers;  /* the agent's transfers (xfer.c) */
    kvx_regions_t *regions;
    struct transport *transport;
    const char *transports; /* the UCX_TLS list given to the transport */
    void *zmq;
    void **bases; /* by storage */
    size_t num_storages;
    uint32_t tp_rank;
    uint32_t tp_size;
    uint32_t timeout_ms;
    uint32_t heartbeat_ms;
    uint32_t peer_ttl_ms;
    uint64_t instance; /* random per agent: a restart at the same address answers another */
    const char *engine_id;
    struct loop loop;
    kvx_agent_stats_t stats;
    struct kvx_peer *peers; /* connected peers, a list (peer.c) */
    struct kvx_peer *down;  /* peers gone down whose transfers are still to fail (peer.c) */
    size_t num_peers;       /* handles the caller holds */
    size_t num_xfers;       /* transfer handles not destroyed yet, or destroyed and still to
                               run their callback (xfer.c) */
};

#endif

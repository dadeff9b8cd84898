/* core.h: what every file of an agent shares, below all of them: the region table, the mapped
 * storages, the transport, the ZeroMQ context, the settings, the loop and the counters. Each
 * counter of `stats` is written by one file only (the one that names it in kvx_agent_stats). */
#ifndef KVX_SRC_CORE_H
#define KVX_SRC_CORE_H

#include "auth.h"
#include "early.h"
#include "kvx.h"
#include "loop.h"
#include "transport.h"

/* Active message a push writer sends to the worker a requester named: its proof (push_serve.h). */
#define CORE_AM_PUSH_PROOF 2
/* Messages (transport.h, transport_msg_*) of a push on the data plane (push_request.h): the
 * request, decode side to the prefill's main worker, and its answer, from the prefill's
 * writer (or, refused for its handle, back to the requester's connection). */
#define CORE_AM_PUSH_REQUEST 3
#define CORE_AM_PUSH_ANSWER  4
/* A done on the data plane (done_handles.h), decode side to the prefill's main worker, framed
 * as a push request is (push_request.h) with the handle and the done as its body, and its
 * answer, framed as a push's with the done handle in the writer handle's place. */
#define CORE_AM_DONE        5
#define CORE_AM_DONE_ANSWER 6

/* Side-channel verbs (sidechan.h frames them), all behind the gate (gate.h). */
#define VERB_METADATA      "kvx-metadata 3"
#define VERB_HEARTBEAT     "kvx-heartbeat 3"     /* body: wanted requests and tokens (notify.h) */
#define VERB_DONE          "kvx-done 4"          /* body: a done (notify.h); answered (notify.h) */
#define VERB_PUSH_REGISTER "kvx-push-register 4" /* body: the requester's push metadata */
#define VERB_PUSH_PROOF    "kvx-push-proof 3"    /* body: the proof its worker received */
#define VERB_PUSH          "kvx-push 3"          /* body: a push request (push_request.h) */
#define VERB_CHECKSUM      "kvx-checksum 3"      /* body: ranges to hash (checksum.h) */
#define VERB_DONE_HANDLE   "kvx-done-handle 2"   /* no body; answered REPLY_DONE_HANDLE */
#define REPLY_PUSHED       "kvx-done"
#define REPLY_REGISTERED   "kvx-registered"  /* then " ", the writer's handle (32 hex), " ", its key (32 hex) */
#define REPLY_DONE_HANDLE  "kvx-done-handle" /* then " ", the handle (32 hex), " ", its key (32 hex) */
#define REPLY_ERROR        "kvx-error "      /* then the message */

struct xfer_set;
struct hold_table;
struct done_handles;
struct checksum_jobs;

struct core {
    struct kvx_agent *agent;           /* whose core this is */
    struct xfer_set *xfers;            /* the agent's transfers (xfer.c) */
    struct hold_table *holds;          /* prefill side: the requests held (hold.c; the agent's) */
    struct early_list early;           /* prefill side: dones and pushes waiting for their hold */
    struct done_handles *done_handles; /* prefill side: for dones as messages (done_handles.h) */
    struct checksum_jobs *checksums;   /* our memory being hashed, either side (checksum_serve.h) */
    struct loop_limit dones_refused_log;  /* prefill side: refused dones logged (done_serve.c) */
    struct loop_limit tokens_refused_log; /* prefill side: heartbeats' wrong tokens (agent.c) */
    kvx_regions_t *regions;
    struct transport *transport;
    const char *transports; /* the UCX_TLS list given to the transport */
    void *zmq;
    void **bases;      /* by storage */
    struct gpu **gpus; /* by storage: the device of a GPU storage (gpu.h), else NULL */
    size_t num_storages;
    uint32_t tp_rank;
    uint32_t tp_size;
    uint32_t timeout_ms;
    uint32_t heartbeat_ms;
    uint32_t peer_ttl_ms;
    uint32_t verify_one_in;  /* decode side: verify every Nth transfer posted; 0: none */
    bool push_side_channel;  /* decode side: push requests on the side channel, not messages */
    bool done_side_channel;  /* decode side: dones on the side channel, not messages */
    bool push_bytes_as_puts; /* decode side: no push is answered with its bytes */
    bool push_writers_on_one_host; /* decode side: pushes to prefills of this host go to their
                                      writers, not as reads (xfer.c, push_as_read) */
    uint64_t instance; /* random per agent: a restart at the same address answers another */
    const char *engine_id;
    struct auth_keys keys; /* the side channel's, or insecure */
    struct loop loop;
    kvx_agent_stats_t stats;
    struct kvx_peer *peers; /* connected peers, a list (peer.c) */
    struct kvx_peer *down;  /* peers gone down whose transfers are still to fail (peer.c) */
    size_t num_peers;       /* handles the caller holds */
    size_t num_xfers;       /* transfer handles not destroyed yet, or destroyed and still to
                               run their callback (xfer.c) */
};

#endif

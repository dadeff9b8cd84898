/* agent.c: an agent's life and its loop. Creating registers the layout, maps every storage
 * once and packs the metadata peers ask for; kvx_agent_progress runs the phases of
 * docs/agent.md ("The loop") in order; the public calls that tie peers, transfers and holds
 * together live here, above the files they call (xfer, push_serve, peer, conn, sidechan,
 * hold, loop, transport). Parses no layouts. */
#include "core.h"

#include "checksum_serve.h"
#include "clock.h"
#include "done_handles.h"
#include "done_serve.h"
#include "error.h"
#include "gate.h"
#include "gpu.h"
#include "hold.h"
#include "hostport.h"
#include "notify.h"
#include "pattern.h"
#include "peer.h"
#include "push_request.h"
#include "push_serve.h"
#include "regions.h"
#include "sidechan.h"
#include "xfer.h"
#include "zsocket.h"

#include <openssl/rand.h>
#include <zmq.h>

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What one side-channel connection may make a listener hold (sidechan_limits): ZeroMQ drops
 * a peer that sends a message longer than max_message, and stops reading one that has this
 * many queued. */
#define AGENT_RECV_HWM 8
/* A connection must finish its handshake within this, and only this many may be in theirs at
 * once (at least 256, at least max_peers), this many of them from one address: strangers
 * hold handshakes, never the admitted peers' places (docs/security.md, "Bounded everything").
 * The handshake includes the ZAP answer, which the agent's loop gives: in a busy engine (vLLM
 * on 2 cores, its progress thread waiting for Python's lock) 1 s refused honest decode
 * workers, and 5 s still cut some whose P was starved for seconds (issue 35), so it is the
 * decode side's default deadline: a slow but live P finishes within the time D waits anyway.
 * The bounds, not the deadline, are what keep strangers from filling it. */
#define AGENT_HANDSHAKE_MS          10000
#define AGENT_MIN_HANDSHAKES        256
#define AGENT_HANDSHAKES_PER_SOURCE 32
#define AGENT_PROGRESS_ROUNDS       1024 /* main-worker progress rounds in one turn */
#define AGENT_REQUESTS_PER_TURN     64   /* side-channel requests served in one turn */
/* Bytes of same-host copies (reads from a peer's storage mapped here) made in one turn: about
 * half a millisecond of memcpy here, so a large pull never holds a turn (docs/agent.md). */
#define AGENT_COPY_BYTES_PER_TURN ((size_t)4 << 20)
/* Bytes of our memory hashed in one turn, for checksum requests and our own verifications:
 * under a millisecond of XXH3 here. */
#define AGENT_HASH_BYTES_PER_TURN ((uint64_t)4 << 20)
/* How long the loop keeps turning without sleeping while UCX operations of ours are in flight,
 * or a done or push request we sent as a message awaits its answer: about the gap between the
 * steps of a transfer that needs the peer (an emulated get's reply, a flush, a done's or a
 * push's answer), so such a transfer does not pay a wakeup (tens of microseconds here) per
 * step. With nothing of ours in flight (a side-channel answer, a heartbeat) it sleeps at once:
 * spinning then only takes the core from ZeroMQ's threads that bring the answer. */
#define AGENT_SPIN_US 200
/* Checking a ZeroMQ socket costs a system call or two (its mailbox's poll and a getpid) whether
 * anything came or not: paid on every turn, with the arming of every source before each
 * return of an idle kvx_agent_progress(agent, 0), they were most of a 4 KiB pull's time over
 * shared memory (about 50 system calls a transfer across both processes). So once a check of
 * the side channel found nothing, the next comes when one of its descriptors is readable (one
 * epoll_wait for all of them, every AGENT_SIDE_POLL_US: loop_side_ready), or after
 * AGENT_SIDE_CHECK_US at the latest, for what a send took the edge of. */
#define AGENT_SIDE_CHECK_US 100
#define AGENT_SIDE_POLL_US  5
/* How long a call that returns without sleeping (kvx_agent_progress(agent, 0)) leaves the
 * descriptor readable after the last event before it arms every source (a dozen system calls,
 * and UCX's shared memory then signals each message a socket write): a prefill spinning on it
 * serves back-to-back requests without arming between them, and an event loop waiting on the
 * descriptor calls again for this long at most before it sleeps. */
#define AGENT_LINGER_US 8
/* The longest sleep while UCX operations of ours are in flight: UCX's wakeup descriptor
 * signals what arrives, not every local completion (a put or flush that finishes), so such a
 * sleep must end on its own soon. */
#define AGENT_PENDING_SLEEP_MS 1

struct kvx_agent {
    struct core core;
    struct transport_mem **mems; /* by storage */
    struct gpu **gpus;           /* by storage: its device, for "vram" storages; else NULL */
    void **gpu_owned;            /* by storage: device memory kvx allocated for it, or NULL */
    char *transports;
    char *engine_id;
    void *metadata; /* this agent's packed metadata, served to peers */
    size_t metadata_size;
    void *push_metadata; /* the same in push mode, sent with push requests */
    size_t push_metadata_size;
    struct gate *gate;            /* who may talk to the side channel, or NULL */
    struct sidechan_server *side; /* the listening side channel, or NULL */
    char listen_address[300];     /* "HOST:PORT" it is bound to (the real port when given 0) */
    struct push_server *pushes;
    struct xfer_set *xfers;
    struct hold_table holds;
    struct loop_timer lease_timer; /* at the earliest lease end of the hold table */
    double idle_since;             /* clock_seconds() of the first idle turn in a row; 0: busy */
    double side_checked;           /* clock_seconds() of the last check of the side channel */
    double side_polled;            /* and of the last look at its descriptors */
    bool side_quiet;               /* and it found nothing */
    double armed; /* clock_seconds() when every source was armed, no event since; 0: not */
    kvx_release_cb_t release;
    void *release_arg;
    char *push_transports;
    uint32_t max_peers;
    uint32_t max_message;
    uint32_t max_pushes;
    uint32_t max_push_ms;
    bool insecure;
};

/* A push writer's proof, as a UCX active message on the main worker from anyone: handed to
 * the peer it names, which returns it on its authenticated side channel. */
static void agent_on_proof(void *arg, const void *data, size_t size)
{
    kvx_agent_t *agent = arg;
    struct push_proof proof;

    if (!push_proof_parse(data, size, &proof)) {
        agent->core.stats.notifications_dropped++;
        return;
    }
    peers_forward_proof(&agent->core, &proof);
}

/* A push's answer on the data plane (push_request.h), on the main worker (from a prefill's
 * writer) or a connection's (a refusal from the prefill's main worker), from anyone: kept for
 * the push it names when it carries that peer's writer handle. */
static void agent_on_push_answer(void *arg, const void *data, size_t size,
                                 const struct transport_msg_from *from)
{
    kvx_agent_t *agent = arg;

    (void)from;
    peers_push_answer(&agent->core, data, size);
}

/* A released hold's completion: the user's callback, from the completion phase. */
static void release_run(struct loop_event *event)
{
    struct hold_release *r =
        (struct hold_release *)((char *)event - offsetof(struct hold_release, event));
    kvx_agent_t *agent = r->owner;

    if (agent->release != NULL)
        agent->release(agent->release_arg, r->request_id, r->groups, r->num_groups);
    hold_release_free(r);
}

/* The hold table's hook: queue the release. */
static void agent_on_release(void *arg, struct hold_release *r)
{
    kvx_agent_t *agent = arg;

    if (r->expired)
        loop_log(&agent->core.loop, "request %" PRIu64 ": lease expired, its blocks released",
                 r->request_id);
    else
        loop_info(&agent->core.loop, "request %" PRIu64 ": released, every consumer reported",
                  r->request_id);
    r->owner     = agent;
    r->event.run = release_run;
    loop_queue(&agent->core.loop, &r->event);
}

/* The lease timer follows the hold table's earliest lease end. */
static void agent_lease_timer_update(kvx_agent_t *agent)
{
    uint64_t next = hold_table_next_expiry(&agent->holds);

    if (next == UINT64_MAX)
        loop_timer_stop(&agent->core.loop, &agent->lease_timer);
    else if (agent->lease_timer.index == LOOP_TIMER_IDLE || agent->lease_timer.deadline_ms != next)
        loop_timer_start(&agent->core.loop, &agent->lease_timer, next); /* else a lease lags */
}

static void agent_lease_fire(struct loop_timer *timer)
{
    kvx_agent_t *agent = (kvx_agent_t *)((char *)timer - offsetof(kvx_agent_t, lease_timer));

    hold_table_expire(&agent->holds, clock_ms());
    agent_lease_timer_update(agent);
}

/* A random instance number: a prefill agent restarted at the same address answers
 * heartbeats with another, which is how decode agents notice. Never 0 ("not known yet"). */
static uint64_t agent_instance(void)
{
    uint64_t instance = 0;
    FILE *random      = fopen("/dev/urandom", "rb");

    if (random != NULL) {
        if (fread(&instance, sizeof(instance), 1, random) != 1)
            instance = 0;
        fclose(random);
    }
    instance ^= (uint64_t)getpid() << 32 ^ clock_ms();
    return instance != 0 ? instance : 1;
}

/* Opens the device of every "vram" storage, before anything else is set up: without CUDA in
 * the build, the driver or the device, the error names the storage and what is missing. */
static kvx_status_t agent_gpus_open(kvx_agent_t *agent)
{
    const kvx_regions_t *regions = agent->core.regions;
    size_t n                     = kvx_regions_num_storages(regions);

    agent->gpus      = calloc(n + 1, sizeof(*agent->gpus));
    agent->gpu_owned = calloc(n + 1, sizeof(*agent->gpu_owned));
    if (agent->gpus == NULL || agent->gpu_owned == NULL)
        return error_no_memory("the agent's GPUs");
    agent->core.gpus = agent->gpus; /* verification hashes GPU storages through them */
    for (size_t s = 0; s < n; s++) {
        if (regions->storage_mems[s] == KVX_MEM_VRAM &&
            gpu_open(regions->storage_devices[s], &agent->gpus[s]) != KVX_OK)
            return error_set(KVX_ERR_INVALID, "storage %s (\"mem\": \"vram\", device %lld): %s",
                             regions->storage_names[s], (long long)regions->storage_devices[s],
                             kvx_errmsg());
    }
    return KVX_OK;
}

/* Maps GPU storage `s` of `size` bytes: the engine's device memory, checked to be its
 * device's, or device memory kvx allocates. Never host memory in its place. */
static kvx_status_t agent_gpu_storage_map(kvx_agent_t *agent, size_t s, void *given, size_t size)
{
    const kvx_regions_t *regions = agent->core.regions;
    kvx_status_t status          = KVX_OK;
    void *base                   = given;

    if (given != NULL)
        status = gpu_check_device_memory(agent->gpus[s], given, size);
    else if ((status = gpu_alloc(agent->gpus[s], size, &agent->gpu_owned[s])) == KVX_OK)
        base = agent->gpu_owned[s];
    if (status == KVX_OK)
        status = transport_mem_map_gpu(agent->core.transport, base, size, &agent->mems[s]);
    if (status != KVX_OK)
        return error_set(status, "storage %s (\"mem\": \"vram\", device %lld): %s",
                         regions->storage_names[s], (long long)regions->storage_devices[s],
                         kvx_errmsg());
    return KVX_OK;
}

/* Maps each storage: the caller's memory, or memory UCX allocates (device memory for "vram"
 * storages). */
static kvx_status_t agent_storages_map(kvx_agent_t *agent, const kvx_agent_params_t *params)
{
    bool given = params != NULL && (params->field_mask & KVX_AGENT_PARAM_FIELD_STORAGE_BASES);
    uint64_t size;
    kvx_status_t status;

    agent->core.num_storages = kvx_regions_num_storages(agent->core.regions);
    agent->mems              = calloc(agent->core.num_storages, sizeof(*agent->mems));
    agent->core.bases        = calloc(agent->core.num_storages, sizeof(*agent->core.bases));
    if (agent->mems == NULL || agent->core.bases == NULL)
        return error_no_memory("the agent's storages");
    for (size_t s = 0; s < agent->core.num_storages; s++) {
        size = agent->core.regions->storage_sizes[s];
        if (size > SIZE_MAX)
            return error_set(KVX_ERR_INVALID, "storage %s: too large for this host",
                             agent->core.regions->storage_names[s]);
        if (agent->gpus[s] != NULL)
            status = agent_gpu_storage_map(agent, s, given ? params->storage_bases[s] : NULL,
                                           (size_t)size);
        else
            status =
                transport_mem_map(agent->core.transport, given ? params->storage_bases[s] : NULL,
                                  (size_t)size, &agent->mems[s]);
        if (status != KVX_OK)
            return status;
        agent->core.bases[s] = transport_mem_address(agent->mems[s]);
    }
    return KVX_OK;
}

/* Packs this agent's metadata for `mode`: table, addresses, remote keys, worker address, and
 * the TCP segment sizes its peers check theirs against. */
static kvx_status_t agent_metadata_pack(kvx_agent_t *agent, const kvx_agent_params_t *params,
                                        kvx_transfer_mode_t mode, void **buf_p, size_t *size_p)
{
    uint64_t mask            = params != NULL ? params->field_mask : 0;
    size_t n                 = agent->core.num_storages;
    uint64_t *bases          = calloc(n, sizeof(*bases));
    kvx_blob_t *keys         = calloc(n, sizeof(*keys));
    void *address            = NULL;
    size_t address_size      = 0;
    kvx_status_t status      = KVX_OK;
    kvx_metadata_params_t mp = {
        .field_mask = KVX_METADATA_PARAM_FIELD_TP_RANK | KVX_METADATA_PARAM_FIELD_TP_SIZE |
                      KVX_METADATA_PARAM_FIELD_STORAGE_BASES |
                      KVX_METADATA_PARAM_FIELD_REMOTE_KEYS |
                      KVX_METADATA_PARAM_FIELD_TRANSPORT_ADDRESS | KVX_METADATA_PARAM_FIELD_MODE,
        .mode          = mode,
        .tp_rank       = agent->core.tp_rank,
        .tp_size       = agent->core.tp_size,
        .storage_bases = bases,
        .remote_keys   = keys,
    };

    if (mask & KVX_AGENT_PARAM_FIELD_NAME) {
        mp.field_mask |= KVX_METADATA_PARAM_FIELD_AGENT_NAME;
        mp.agent_name = params->name;
    }
    if (mask & KVX_AGENT_PARAM_FIELD_ENGINE_ID) {
        mp.field_mask |= KVX_METADATA_PARAM_FIELD_ENGINE_ID;
        mp.engine_id = params->engine_id;
    }
    if (bases == NULL || keys == NULL) {
        status = error_no_memory("the agent's metadata");
        goto out;
    }
    for (size_t s = 0; s < n && status == KVX_OK; s++) {
        void *key;

        bases[s]     = (uint64_t)(uintptr_t)agent->core.bases[s];
        status       = transport_mem_pack_rkey(agent->core.transport, agent->mems[s],
                                               mode == KVX_MODE_PUSH, &key, &keys[s].size);
        keys[s].data = key;
    }
    if (status == KVX_OK)
        status = transport_worker_address(agent->core.transport, &address, &address_size);
    if (status == KVX_OK) {
        struct transport_segments seg = transport_tcp_segments(agent->core.transport);

        mp.field_mask |= KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS;
        mp.tcp_tx_seg_size   = seg.tx;
        mp.tcp_rx_seg_size   = seg.rx;
        mp.transport_address = (kvx_blob_t){address, address_size};
        status               = kvx_metadata_pack(agent->core.regions, &mp, buf_p, size_p);
    }

out:
    for (size_t s = 0; keys != NULL && s < n; s++)
        free((void *)keys[s].data);
    free(keys);
    free(bases);
    free(address);
    return status;
}

/* VERB_METADATA: this agent's packed metadata. */
static void serve_metadata(void *arg, const struct sidechan_request *request)
{
    kvx_agent_t *agent = arg;

    sidechan_reply(agent->side, &request->origin, agent->metadata, agent->metadata_size);
}

/* VERB_HEARTBEAT: the requests a decode rank still wants get their leases extended, each only
 * with its hold's token; the answer says who we are. A malformed list is counted and
 * answered with an error. */
static void serve_heartbeat(void *arg, const struct sidechan_request *request)
{
    kvx_agent_t *agent = arg;
    uint64_t now       = clock_ms();
    char reply[600];
    size_t count;

    if (!heartbeat_ids_parse(request->body, request->body_size, &count)) {
        agent->core.stats.notifications_dropped++;
        snprintf(reply, sizeof(reply), "%sheartbeat of %zu bytes is not a list of ids", REPLY_ERROR,
                 request->body_size);
    } else {
        agent->core.stats.notifications++;
        for (size_t i = 0; i < count; i++) {
            struct heartbeat_entry entry = heartbeat_entry(request->body, i);
            uint64_t forged              = agent->holds.forged;

            hold_table_extend(&agent->holds, entry.request_id, &entry.token, now);
            if (agent->holds.forged != forged) /* the answer cannot say it: the log does */
                loop_log_limited(&agent->core.loop, &agent->core.tokens_refused_log, now,
                                 "refused heartbeat entries",
                                 "request %" PRIu64 ": heartbeat refused: wrong token: the "
                                 "request is held with another",
                                 entry.request_id);
        }
        alive_answer_format(reply, sizeof(reply), agent->core.instance, agent->engine_id);
    }
    sidechan_reply(agent->side, &request->origin, reply, strlen(reply));
}

/* VERB_DONE: a decode rank has its data; it learns whether the hold was alive for it. */
static void serve_done(void *arg, const struct sidechan_request *request)
{
    kvx_agent_t *agent = arg;

    done_serve(&agent->core, agent->side, request);
}

static void serve_done_handle(void *arg, const struct sidechan_request *request)
{
    kvx_agent_t *agent = arg;

    done_serve_handle(&agent->core, agent->side, request);
}

/* A done as a message on the main worker (done_handles.h): from anyone; judged as its
 * handle's connection's. */
static void agent_on_done_message(void *arg, const void *data, size_t size,
                                  const struct transport_msg_from *from)
{
    done_serve_message(arg, data, size, false, true, from);
}

/* A done attached to a served read (transport_set_read_hook), after the read's answer. */
static void agent_on_read_done(void *arg, const void *data, size_t size, bool sent,
                               const struct transport_msg_from *from)
{
    done_serve_message(arg, data, size, true, sent, from);
}

/* The answer to a done we sent as a message, on a connection's worker. */
static void agent_on_done_answer(void *arg, const void *data, size_t size,
                                 const struct transport_msg_from *from)
{
    (void)from;
    peers_done_answer(arg, data, size);
}

static void serve_push(void *arg, const struct sidechan_request *request)
{
    push_serve(((kvx_agent_t *)arg)->pushes, request);
}

static void serve_push_register(void *arg, const struct sidechan_request *request)
{
    push_register(((kvx_agent_t *)arg)->pushes, request);
}

static void serve_push_proof(void *arg, const struct sidechan_request *request)
{
    push_prove(((kvx_agent_t *)arg)->pushes, request);
}

static void serve_checksum(void *arg, const struct sidechan_request *request)
{
    kvx_agent_t *agent = arg;

    checksum_serve(&agent->core, agent->core.checksums, agent->side, request);
}

/* The side channel's verbs, one table: what a listening agent answers, and only to peers its
 * gate let through. */
static const struct sidechan_verb agent_verbs[] = {
    {VERB_METADATA, false, serve_metadata},
    {VERB_HEARTBEAT, true, serve_heartbeat},
    {VERB_DONE, true, serve_done},
    {VERB_DONE_HANDLE, true, serve_done_handle},
    {VERB_PUSH_REGISTER, true, serve_push_register},
    {VERB_PUSH_PROOF, true, serve_push_proof},
    {VERB_PUSH, true, serve_push},
    {VERB_CHECKSUM, true, serve_checksum},
};

const char *kvx_agent_listen_address(const kvx_agent_t *agent)
{
    return agent->side != NULL ? agent->listen_address : NULL;
}

int kvx_agent_fd(const kvx_agent_t *agent)
{
    return agent->core.loop.epoll_fd;
}

/* Frees what is left in the completion queue at destruction: released holds whose callback
 * never ran (a destroy never calls back; transfers were all gone, or it would be busy). */
static void agent_queue_drop(kvx_agent_t *agent)
{
    struct loop *loop = &agent->core.loop;

    while (loop->head != NULL) {
        struct loop_event *event = loop->head;

        loop_unqueue(loop, event);
        if (event->run == release_run)
            hold_release_free(
                (struct hold_release *)((char *)event - offsetof(struct hold_release, event)));
    }
}

/* Tears down what kvx_agent_create set up, in reverse; every part may be missing. */
static void agent_free(kvx_agent_t *agent)
{
    struct core *core = &agent->core;

    push_server_destroy(agent->pushes);
    dones_drop(core);
    done_handles_free(core->done_handles);
    core->done_handles = NULL;
    xfer_set_destroy(agent->xfers);
    checksum_jobs_destroy(core->checksums); /* after the transfers, whose verifications add */
    agent_queue_drop(agent);
    if (agent->side != NULL) {
        loop_unwatch_fd(&core->loop, sidechan_server_fd(agent->side));
        sidechan_server_destroy(agent->side);
    }
    if (agent->gate != NULL) {
        void *sockets[2];
        size_t n = gate_sockets(agent->gate, sockets);

        for (size_t i = 0; i < n; i++)
            loop_unwatch_fd(&core->loop, zsocket_fd(sockets[i]));
        gate_destroy(agent->gate);
    }
    if (core->zmq != NULL)
        zmq_ctx_term(core->zmq);
    for (size_t s = 0; agent->mems != NULL && s < core->num_storages; s++)
        transport_mem_unmap(core->transport, agent->mems[s]);
    transport_destroy(core->transport);
    /* Opened before the storages were counted: a create that failed between has some. */
    for (size_t s = 0; agent->gpus != NULL && s < kvx_regions_num_storages(core->regions); s++) {
        if (agent->gpus[s] != NULL)
            gpu_free(agent->gpus[s], agent->gpu_owned[s]);
        gpu_close(agent->gpus[s]);
    }
    free(agent->gpus);
    free(agent->gpu_owned);
    hold_table_free(&agent->holds);
    kvx_regions_destroy(core->regions);
    loop_fini(&core->loop);
    free(agent->metadata);
    free(agent->push_metadata);
    free(agent->transports);
    free(agent->push_transports);
    free(agent->engine_id);
    free(agent->mems);
    free(core->bases);
    free(agent);
}

kvx_status_t kvx_agent_destroy(kvx_agent_t *agent)
{
    if (agent == NULL)
        return KVX_OK;
    if (agent->core.num_peers > 0 || agent->core.num_xfers > 0)
        return error_set(KVX_ERR_BUSY,
                         "agent: %zu peers and %zu transfers are still there: destroy them"
                         " (and progress once, so cancelled transfers run their callbacks)",
                         agent->core.num_peers, agent->core.num_xfers);
    agent_free(agent);
    return KVX_OK;
}

/* Secure by default: an agent is either given the deployment's secret or told it is
 * insecure, and an insecure one listens only on loopback. */
static kvx_status_t agent_auth(kvx_agent_t *agent, const kvx_agent_params_t *params)
{
    uint64_t mask         = params != NULL ? params->field_mask : 0;
    const uint8_t *secret = (mask & KVX_AGENT_PARAM_FIELD_AUTH_KEY) ? params->auth_key : NULL;
    kvx_status_t status   = auth_keys_choose(secret, agent->insecure, &agent->core.keys);
    struct hostport hp; /* a name counts by what it resolves to, not by its spelling */

    if (status != KVX_OK || !agent->insecure || !(mask & KVX_AGENT_PARAM_FIELD_LISTEN) ||
        params->listen == NULL)
        return status;
    status = hostport_resolve(params->listen, "listen", &hp);
    if (status == KVX_OK && !hp.loopback)
        status = error_set(KVX_ERR_INVALID,
                           "agent: insecure, so it may listen on loopback only, not on \"%.64s\": "
                           "give an auth key",
                           params->listen);
    return status;
}

/* Binds the side channel behind its gate: the ZAP handler first, so no connection is ever
 * admitted without it, then the listening socket within its limits, then the push server. */
/* kvx's TCP links listen where the side channel will (transport_listen), before the metadata
 * that names their port is packed. */
static kvx_status_t agent_links_listen(kvx_agent_t *agent, const kvx_agent_params_t *params,
                                       uint64_t mask)
{
    struct hostport hp;
    kvx_status_t status;

    if (!(mask & KVX_AGENT_PARAM_FIELD_LISTEN) || params->listen == NULL)
        return KVX_OK;
    status = hostport_resolve(params->listen, "listen", &hp);
    return status == KVX_OK ? transport_listen(agent->core.transport, hp.host) : status;
}

static kvx_status_t agent_listen(kvx_agent_t *agent, const char *listen)
{
    struct core *core                   = &agent->core;
    const struct sidechan_limits limits = {agent->max_message, AGENT_RECV_HWM, AGENT_HANDSHAKE_MS};
    const struct gate_limits admission  = {.max_peers      = agent->max_peers,
                                           .max_handshakes = agent->max_peers > AGENT_MIN_HANDSHAKES
                                                                 ? agent->max_peers
                                                                 : AGENT_MIN_HANDSHAKES,
                                           .per_source     = AGENT_HANDSHAKES_PER_SOURCE,
                                           .handshake_ms   = AGENT_HANDSHAKE_MS};
    void *sockets[2];
    size_t n;
    kvx_status_t status =
        gate_create(core->zmq, &core->keys, &admission, &core->loop, &agent->gate);

    if (status != KVX_OK)
        return status;
    status =
        sidechan_server_create(core->zmq, listen, &limits, &core->keys, agent->gate,
                               agent->listen_address, sizeof(agent->listen_address), &agent->side);
    n = gate_sockets(agent->gate, sockets);
    for (size_t i = 0; status == KVX_OK && i < n; i++)
        status = loop_watch_fd(&core->loop, zsocket_fd(sockets[i]), true);
    if (status == KVX_OK)
        status = loop_watch_fd(&core->loop, sidechan_server_fd(agent->side), true);
    if (status == KVX_OK)
        status = push_server_create(core, agent->side, agent->push_transports, agent->max_pushes,
                                    agent->max_push_ms, &agent->pushes);
    if (status == KVX_OK) /* pushes and dones on the data plane come to the main worker only */
        status = transport_msg_set_handler(core->transport, CORE_AM_PUSH_REQUEST, false,
                                           push_serve_message, agent->pushes);
    if (status == KVX_OK)
        status = transport_msg_set_handler(core->transport, CORE_AM_DONE, false,
                                           agent_on_done_message, core);
    if (status == KVX_OK)
        transport_set_read_hook(core->transport, agent_on_read_done, core);
    if (status == KVX_OK && strncmp(listen, "0.0.0.0:", 8) == 0)
        loop_log(&core->loop, "side channel: listening on every interface (%s)",
                 agent->listen_address);
    return status;
}

static kvx_status_t agent_settings(kvx_agent_t *agent, const kvx_agent_params_t *params)
{
    const uint64_t known = KVX_AGENT_PARAM_FIELD_NAME | KVX_AGENT_PARAM_FIELD_TRANSPORTS |
                           KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_ENGINE_ID |
                           KVX_AGENT_PARAM_FIELD_TP_RANK | KVX_AGENT_PARAM_FIELD_TP_SIZE |
                           KVX_AGENT_PARAM_FIELD_STORAGE_BASES | KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                           KVX_AGENT_PARAM_FIELD_LEASE_MS | KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS |
                           KVX_AGENT_PARAM_FIELD_PEER_TTL_MS | KVX_AGENT_PARAM_FIELD_AUTH_KEY |
                           KVX_AGENT_PARAM_FIELD_INSECURE | KVX_AGENT_PARAM_FIELD_MAX_PEERS |
                           KVX_AGENT_PARAM_FIELD_MAX_MESSAGE | KVX_AGENT_PARAM_FIELD_MAX_PUSHES |
                           KVX_AGENT_PARAM_FIELD_PUSH_TRANSPORTS |
                           KVX_AGENT_PARAM_FIELD_VERIFY_ONE_IN | KVX_AGENT_PARAM_FIELD_MAX_PUSH_MS;
    uint64_t mask     = params != NULL ? params->field_mask : 0;
    struct core *core = &agent->core;

    if ((mask & ~known) != 0)
        return error_set(KVX_ERR_INVALID, "agent params: unknown field bits 0x%" PRIx64,
                         mask & ~known);
    core->tp_rank = (mask & KVX_AGENT_PARAM_FIELD_TP_RANK) ? params->tp_rank : 0;
    core->tp_size = (mask & KVX_AGENT_PARAM_FIELD_TP_SIZE) ? params->tp_size : 1;
    /* which decode ranks a hold's consumers can be (hold.h) */
    agent->holds.tp_rank = core->tp_rank;
    agent->holds.tp_size = core->tp_size;
    core->timeout_ms =
        (mask & KVX_AGENT_PARAM_FIELD_TIMEOUT_MS) ? params->timeout_ms : KVX_DEFAULT_TIMEOUT_MS;
    agent->holds.lease_ms =
        (mask & KVX_AGENT_PARAM_FIELD_LEASE_MS) ? params->lease_ms : KVX_DEFAULT_LEASE_MS;
    /* Push requests travel on the data plane unless the environment keeps them on the side
     * channel: a prefill agent older than that drops them (docs/agent.md, "Write"). */
    core->push_side_channel = getenv("KVX_PUSH_REQUESTS") != NULL &&
                              strcmp(getenv("KVX_PUSH_REQUESTS"), "side-channel") == 0;
    /* Dones too (docs/agent.md, "Read"), for the same reason and for measuring both ways. */
    core->done_side_channel =
        getenv("KVX_DONES") != NULL && strcmp(getenv("KVX_DONES"), "side-channel") == 0;
    /* Pushes to a prefill of this host go as reads (docs/agent.md, "Write") unless kept on the
     * writers, for measuring both ways and for the tests of the writers themselves. */
    /* And small pushes answered with their bytes, the same way. */
    core->push_bytes_as_puts =
        getenv("KVX_PUSH_BYTES") != NULL && strcmp(getenv("KVX_PUSH_BYTES"), "puts") == 0;
    core->push_writers_on_one_host = getenv("KVX_PUSH_ON_ONE_HOST") != NULL &&
                                     strcmp(getenv("KVX_PUSH_ON_ONE_HOST"), "writers") == 0;
    core->heartbeat_ms = (mask & KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS) ? params->heartbeat_ms
                                                                     : KVX_DEFAULT_HEARTBEAT_MS;
    core->peer_ttl_ms =
        (mask & KVX_AGENT_PARAM_FIELD_PEER_TTL_MS) ? params->peer_ttl_ms : KVX_DEFAULT_PEER_TTL_MS;
    agent->engine_id  = strdup((mask & KVX_AGENT_PARAM_FIELD_ENGINE_ID) && params->engine_id != NULL
                                   ? params->engine_id
                                   : "");
    agent->transports = strdup((mask & KVX_AGENT_PARAM_FIELD_TRANSPORTS) && params->transports
                                   ? params->transports
                                   : KVX_DEFAULT_TRANSPORTS);
    agent->push_transports =
        strdup((mask & KVX_AGENT_PARAM_FIELD_PUSH_TRANSPORTS) && params->push_transports
                   ? params->push_transports
                   : KVX_DEFAULT_PUSH_TRANSPORTS);
    agent->max_peers =
        (mask & KVX_AGENT_PARAM_FIELD_MAX_PEERS) ? params->max_peers : KVX_DEFAULT_MAX_PEERS;
    agent->max_message =
        (mask & KVX_AGENT_PARAM_FIELD_MAX_MESSAGE) ? params->max_message : KVX_DEFAULT_MAX_MESSAGE;
    agent->max_pushes =
        (mask & KVX_AGENT_PARAM_FIELD_MAX_PUSHES) ? params->max_pushes : KVX_DEFAULT_MAX_PUSHES;
    agent->max_push_ms =
        (mask & KVX_AGENT_PARAM_FIELD_MAX_PUSH_MS) ? params->max_push_ms : KVX_DEFAULT_MAX_PUSH_MS;
    agent->insecure     = (mask & KVX_AGENT_PARAM_FIELD_INSECURE) && params->insecure;
    core->verify_one_in = (mask & KVX_AGENT_PARAM_FIELD_VERIFY_ONE_IN) ? params->verify_one_in : 0;
    if (agent->engine_id == NULL || agent->transports == NULL || agent->push_transports == NULL)
        return error_no_memory("an agent");
    if (agent->max_peers == 0 || agent->max_pushes == 0 || agent->max_message < 4096)
        return error_set(KVX_ERR_INVALID,
                         "agent: max_peers and max_pushes must be > 0, max_message >= 4096");
    if (agent->max_push_ms == 0)
        return error_set(KVX_ERR_INVALID, "agent: max_push_ms must be > 0");
    core->engine_id  = agent->engine_id;
    core->transports = agent->transports;
    if (core->heartbeat_ms == 0 || core->peer_ttl_ms == 0 || core->timeout_ms == 0)
        return error_set(KVX_ERR_INVALID,
                         "agent: timeout_ms, heartbeat_ms and peer_ttl_ms must be > 0");
    if (core->tp_size < 1 || core->tp_size > KVX_MAX_TP || core->tp_rank >= core->tp_size)
        return error_set(KVX_ERR_INVALID,
                         "agent: tp_rank %" PRIu32 " of tp_size %" PRIu32 " is not a rank",
                         core->tp_rank, core->tp_size);
    return agent_auth(agent, params);
}

/* Replaces a default transport list with `list`. */
static kvx_status_t agent_transports_replace(char **transports_p, const char *list)
{
    char *copy = strdup(list);

    if (copy == NULL)
        return error_no_memory("a transport list");
    free(*transports_p);
    *transports_p = copy;
    return KVX_OK;
}

/* An agent with GPU storages adds UCX's CUDA transports to each default list it keeps: UCX
 * moves device memory only with them. A list the caller gave is the caller's (docs/gpu.md). */
static kvx_status_t agent_transports_for_gpu(kvx_agent_t *agent, const kvx_agent_params_t *params)
{
    uint64_t mask       = params != NULL ? params->field_mask : 0;
    kvx_status_t status = KVX_OK;
    bool gpu            = false;

    for (size_t s = 0; s < kvx_regions_num_storages(agent->core.regions); s++)
        gpu |= agent->gpus[s] != NULL;
    if (gpu && !((mask & KVX_AGENT_PARAM_FIELD_TRANSPORTS) && params->transports != NULL))
        status = agent_transports_replace(&agent->transports,
                                          KVX_DEFAULT_TRANSPORTS "," TRANSPORT_GPU_TLS);
    if (status == KVX_OK && gpu &&
        !((mask & KVX_AGENT_PARAM_FIELD_PUSH_TRANSPORTS) && params->push_transports != NULL))
        status = agent_transports_replace(&agent->push_transports,
                                          KVX_DEFAULT_PUSH_TRANSPORTS ",cuda_copy");
    agent->core.transports = agent->transports;
    return status;
}

kvx_status_t kvx_agent_create(const kvx_layout_t *layout, const kvx_agent_params_t *params,
                              kvx_agent_t **agent_p)
{
    uint64_t mask      = params != NULL ? params->field_mask : 0;
    kvx_agent_t *agent = NULL;
    struct core *core;
    kvx_status_t status;

    if (agent_p == NULL)
        return error_set(KVX_ERR_INVALID, "agent: no result pointer");
    agent = calloc(1, sizeof(*agent));
    if (agent == NULL)
        return error_no_memory("an agent");
    core                 = &agent->core;
    core->agent          = agent;
    core->instance       = agent_instance();
    agent->holds.release = agent_on_release;
    agent->holds.arg     = agent;
    core->holds          = &agent->holds;
    loop_timer_init(&agent->lease_timer, agent_lease_fire);
    core->zmq = zmq_ctx_new();
    if ((status = loop_init(&core->loop)) != KVX_OK || (status = agent_settings(agent, params)) ||
        (status = core->zmq != NULL ? KVX_OK : error_no_memory("a ZeroMQ context")) != KVX_OK ||
        (status = kvx_regions_register(layout, &core->regions)) != KVX_OK ||
        (status = agent_gpus_open(agent)) != KVX_OK ||
        (status = agent_transports_for_gpu(agent, params)) != KVX_OK ||
        (status = transport_create(agent->transports, false, &core->transport)) != KVX_OK ||
        (status = agent_storages_map(agent, params)) != KVX_OK ||
        (status = transport_am_set_handler(core->transport, CORE_AM_PUSH_PROOF, agent_on_proof,
                                           agent)) != KVX_OK ||
        (status = transport_msg_set_handler(core->transport, CORE_AM_PUSH_ANSWER, true,
                                            agent_on_push_answer, agent)) != KVX_OK ||
        (status = transport_msg_set_handler(core->transport, CORE_AM_DONE_ANSWER, true,
                                            agent_on_done_answer, core)) != KVX_OK ||
        (status = agent_links_listen(agent, params, mask)) != KVX_OK ||
        (status = agent_metadata_pack(agent, params, KVX_MODE_PULL, &agent->metadata,
                                      &agent->metadata_size)) != KVX_OK ||
        (status = agent_metadata_pack(agent, params, KVX_MODE_PUSH, &agent->push_metadata,
                                      &agent->push_metadata_size)) != KVX_OK ||
        (status = loop_watch_fd(&core->loop, transport_event_fd(core->transport), false)) !=
            KVX_OK ||
        (status = checksum_jobs_create(&core->checksums)) != KVX_OK ||
        (status = xfer_set_create(core, &agent->xfers)) != KVX_OK)
        goto err;
    core->xfers = agent->xfers;
    if ((mask & KVX_AGENT_PARAM_FIELD_LISTEN) && params->listen != NULL &&
        (status = agent_listen(agent, params->listen)) != KVX_OK)
        goto err;
    *agent_p = agent;
    return KVX_OK;

err:
    agent_free(agent);
    return status;
}

const kvx_regions_t *kvx_agent_regions(const kvx_agent_t *agent)
{
    return agent->core.regions;
}

void *kvx_agent_storage(const kvx_agent_t *agent, size_t index, uint64_t *size_p)
{
    if (index >= agent->core.num_storages)
        return NULL;
    if (size_p != NULL)
        *size_p = agent->core.regions->storage_sizes[index];
    return agent->core.bases[index];
}

kvx_mem_type_t kvx_agent_storage_mem(const kvx_agent_t *agent, size_t index)
{
    return index < agent->core.num_storages ? agent->core.regions->storage_mems[index]
                                            : KVX_MEM_DRAM;
}

/* Where [offset, offset + len) of storage `index` is, when it is all inside the storage. */
static kvx_status_t agent_storage_range(const kvx_agent_t *agent, size_t index, uint64_t offset,
                                        size_t len, char **at_p)
{
    const kvx_regions_t *regions = agent->core.regions;

    if (index >= agent->core.num_storages)
        return error_set(KVX_ERR_OUT_OF_RANGE, "storage %zu: the agent has %zu", index,
                         agent->core.num_storages);
    if (offset > regions->storage_sizes[index] || len > regions->storage_sizes[index] - offset)
        return error_set(KVX_ERR_OUT_OF_RANGE,
                         "storage %s: %zu bytes from offset %" PRIu64 " pass its end (%" PRIu64
                         " bytes)",
                         regions->storage_names[index], len, offset, regions->storage_sizes[index]);
    *at_p = (char *)agent->core.bases[index] + offset;
    return KVX_OK;
}

kvx_status_t kvx_agent_storage_write(kvx_agent_t *agent, size_t index, uint64_t offset,
                                     const void *src, size_t len)
{
    char *at            = NULL;
    kvx_status_t status = agent_storage_range(agent, index, offset, len, &at);

    if (status != KVX_OK)
        return status;
    if (agent->gpus[index] != NULL)
        return gpu_copy(agent->gpus[index], at, src, len);
    memcpy(at, src, len);
    return KVX_OK;
}

kvx_status_t kvx_agent_storage_read(const kvx_agent_t *agent, size_t index, uint64_t offset,
                                    void *dst, size_t len)
{
    char *at            = NULL;
    kvx_status_t status = agent_storage_range(agent, index, offset, len, &at);

    if (status != KVX_OK)
        return status;
    if (agent->gpus[index] != NULL)
        return gpu_copy(agent->gpus[index], dst, at, len);
    memcpy(dst, at, len);
    return KVX_OK;
}

void kvx_agent_stats(const kvx_agent_t *agent, kvx_agent_stats_t *stats_p, size_t size)
{
    kvx_agent_stats_t stats = agent->core.stats;

    stats.held               = agent->holds.count;
    stats.released           = agent->holds.released;
    stats.done_unknown       = agent->holds.unknown;
    stats.done_repeated      = agent->holds.repeated;
    stats.leases_expired     = agent->holds.expired;
    stats.ops_orphaned       = transport_ops_orphaned(agent->core.transport);
    stats.pushes_serving     = agent->pushes != NULL ? push_jobs(agent->pushes) : 0;
    stats.tokens_refused     = agent->holds.forged;
    stats.dones_early        = agent->core.early.parked;
    stats.data_reads_served  = transport_data_counters(agent->core.transport)->reads;
    stats.data_writes_served = transport_data_counters(agent->core.transport)->writes;
    stats.data_refused       = transport_data_counters(agent->core.transport)->refused;
    if (agent->gate != NULL) {
        const struct gate_counters *gate = gate_counters(agent->gate);

        stats.auth_refused       = gate->auth_refused;
        stats.peers_refused      = gate->peers_refused;
        stats.peers_evicted      = gate->peers_evicted;
        stats.peers_connected    = gate->connections;
        stats.handshakes         = gate->handshakes;
        stats.handshakes_refused = gate->handshakes_refused;
    }
    stats.dones_rank_refused = agent->holds.ranks_refused;
    memcpy(stats_p, &stats, size < sizeof(stats) ? size : sizeof(stats));
}

const kvx_pairs_t *kvx_agent_last_pairs(const kvx_agent_t *agent)
{
    return xfer_set_last_pairs(agent->xfers);
}

kvx_status_t kvx_agent_fill_pattern(kvx_agent_t *agent, uint64_t seed)
{
    return pattern_fill_storages(&agent->core, seed, false);
}

kvx_status_t kvx_agent_zero(kvx_agent_t *agent)
{
    return pattern_fill_storages(&agent->core, 0, true);
}

kvx_status_t kvx_agent_fill_pattern_range(kvx_agent_t *agent, uint64_t seed, size_t index,
                                          uint64_t offset, uint64_t len)
{
    char *at            = NULL;
    kvx_status_t status = agent_storage_range(agent, index, offset, len, &at);

    return status == KVX_OK ? pattern_fill_range(&agent->core, index, offset, len, seed, false)
                            : status;
}

kvx_status_t kvx_agent_zero_range(kvx_agent_t *agent, size_t index, uint64_t offset, uint64_t len)
{
    char *at            = NULL;
    kvx_status_t status = agent_storage_range(agent, index, offset, len, &at);

    return status == KVX_OK ? pattern_fill_range(&agent->core, index, offset, len, 0, true)
                            : status;
}

kvx_status_t kvx_agent_check_pattern(const kvx_agent_t *agent, uint64_t seed)
{
    return pattern_check_pairs(&agent->core, xfer_set_last_pairs(agent->xfers), seed);
}

void kvx_agent_set_log_callback(kvx_agent_t *agent, kvx_log_cb_t callback, void *arg)
{
    agent->core.loop.log     = callback;
    agent->core.loop.log_arg = arg;
    transport_log_route(agent->core.transport, callback != NULL);
}

void kvx_agent_set_log_level(kvx_agent_t *agent, kvx_log_level_t level)
{
    agent->core.loop.log_quiet = level == KVX_LOG_WARN;
}

void kvx_agent_set_release_callback(kvx_agent_t *agent, kvx_release_cb_t callback, void *arg)
{
    agent->release     = callback;
    agent->release_arg = arg;
}

kvx_status_t kvx_token_generate(kvx_token_t *token_p)
{
    if (token_p == NULL)
        return error_set(KVX_ERR_INVALID, "token: no result pointer");
    if (RAND_bytes(token_p->bytes, KVX_TOKEN_LEN) != 1)
        return error_set(KVX_ERR_INTERNAL, "token: the system's random source failed");
    return KVX_OK;
}

kvx_status_t kvx_hold(kvx_agent_t *agent, uint64_t request_id, const kvx_group_ids_t *groups,
                      size_t num_groups, uint32_t consumers, const kvx_token_t *token)
{
    kvx_status_t status;

    if (agent == NULL || token == NULL)
        return error_set(KVX_ERR_INVALID, "hold: agent and token are required");
    status =
        hold_table_add(&agent->holds, request_id, token, groups, num_groups, consumers, clock_ms());
    if (status != KVX_OK)
        return status;
    /* Dones and pushes that came first are served now, as if they had just arrived. */
    early_release(&agent->core.early, request_id);
    agent_lease_timer_update(agent);
    return KVX_OK;
}

/* UCX's warnings and errors since the last turn, as log lines (transport_log.c): not events,
 * so a warning alone never keeps the loop awake. */
static void agent_ucx_log(struct core *core)
{
    char line[LOOP_LOG_LINE];

    while (transport_log_next(core->transport, line, sizeof(line)))
        loop_log(&core->loop, "%s", line);
}

/* Whether this turn looks at the side channel's sockets (AGENT_SIDE_CHECK_US). */
static bool agent_side_due(kvx_agent_t *agent, double now)
{
    if (!agent->side_quiet || now - agent->side_checked >= AGENT_SIDE_CHECK_US * 1e-6)
        return true;
    if (now - agent->side_polled < AGENT_SIDE_POLL_US * 1e-6)
        return false;
    agent->side_polled = now;
    return loop_side_ready(&agent->core.loop);
}

/* One turn of the loop, its phases in order (docs/agent.md "The loop"), at `now` (read once a
 * turn: struct clock_now); returns the events it handled. User callbacks run only in the last
 * phase. */
static size_t agent_turn(kvx_agent_t *agent, struct clock_now now)
{
    struct core *core  = &agent->core;
    bool side          = agent_side_due(agent, now.seconds);
    size_t events      = 0;
    size_t side_events = 0;
    uint64_t malformed = 0;

    /* 1. UCX: the main worker (notifications, peers' operations that need us), every
     * connection's worker, then what their completions moved on. Bounded, so a peer keeping
     * the worker busy (a large pull of our memory) cannot hold the turn. */
    for (int round = 0; round < AGENT_PROGRESS_ROUNDS && transport_progress(core->transport) > 0;
         round++)
        events++;
    events += transport_copies_run(core->transport, AGENT_COPY_BYTES_PER_TURN);
    events += transport_settle_run(core->transport);
    events += peers_progress(core);
    if (agent->pushes != NULL)
        events += push_progress(agent->pushes);
    events += xfers_advance(agent->xfers);
    /* 2. The side channel: who may connect (before anything they send), requests to us,
     * replies to our requests, its sockets looked at when due (agent_side_due); and the
     * answers that came as messages, every turn. */
    if (side) {
        if (agent->gate != NULL)
            side_events += gate_serve(agent->gate);
        if (agent->side != NULL)
            side_events += sidechan_server_serve(agent->side, agent_verbs,
                                                 sizeof(agent_verbs) / sizeof(agent_verbs[0]),
                                                 agent, AGENT_REQUESTS_PER_TURN, &malformed);
    }
    core->stats.notifications_dropped += malformed;
    events += checksum_jobs_run(core, core->checksums, agent->side, AGENT_HASH_BYTES_PER_TURN);
    side_events += peers_serve(core, side);
    if (side) {
        agent->side_checked = now.seconds;
        agent->side_quiet   = side_events == 0;
    }
    events += side_events;
    /* 3. Deadlines, heartbeats and leases, from the one timer heap. */
    events += loop_timers_run(&core->loop, now.ms);
    /* 4. Peers that went down (in any phase above) fail what they had in flight, and their
     * connections close, before any of it is reported. */
    events += xfers_fail_down_peers(agent->xfers);
    /* 5. Completions: the only place user callbacks run; UCX's own lines join the log. */
    agent_ucx_log(core);
    events += loop_queue_run(&core->loop);
    return events;
}

/* Arms every source before a sleep; true when one has work already. */
static bool agent_busy(kvx_agent_t *agent)
{
    bool busy = !transport_arm(agent->core.transport);

    busy |= peers_busy(&agent->core);
    if (agent->pushes != NULL)
        busy |= push_busy(agent->pushes);
    if (agent->side != NULL)
        busy |= sidechan_server_readable(agent->side) || gate_readable(agent->gate);
    busy |= checksum_jobs_pending(agent->core.checksums);
    return busy;
}

/* Sleeps until an event or `timeout_ms`: on the agent's descriptor, and on each ZeroMQ socket
 * through zmq_poll, which reads ZeroMQ's edge-triggered ZMQ_FD the way ZeroMQ means it to be
 * read (an epoll on ZMQ_FD alone was seen to sleep through replies). */
#define AGENT_POLL_SOCKETS 64
static void agent_wait(kvx_agent_t *agent, int timeout_ms)
{
    zmq_pollitem_t items[AGENT_POLL_SOCKETS + 4];
    void *sockets[AGENT_POLL_SOCKETS];
    size_t n = 0;
    size_t count;

    items[n++] = (zmq_pollitem_t){.fd = agent->core.loop.epoll_fd, .events = ZMQ_POLLIN};
    if (agent->side != NULL) {
        void *gate[2];
        size_t num_gate = gate_sockets(agent->gate, gate);

        items[n++] =
            (zmq_pollitem_t){.socket = sidechan_server_socket(agent->side), .events = ZMQ_POLLIN};
        for (size_t i = 0; i < num_gate; i++)
            items[n++] = (zmq_pollitem_t){.socket = gate[i], .events = ZMQ_POLLIN};
    }
    count = peers_sockets(&agent->core, sockets, AGENT_POLL_SOCKETS);
    for (size_t i = 0; i < count; i++)
        items[n++] = (zmq_pollitem_t){.socket = sockets[i], .events = ZMQ_POLLIN};
    if (count == AGENT_POLL_SOCKETS && timeout_ms > 5)
        timeout_ms = 5; /* more peers than items: the rest are served within 5 ms */
    zmq_poll(items, (int)n, timeout_ms);
    loop_wait_done(&agent->core.loop);
}

/* Turns until `done(arg)` (or, with done NULL, until a turn handled an event) or until
 * `timeout_ms` passed. After a turn that found nothing to do (after AGENT_SPIN_US of them while
 * UCX operations are in flight), the sources are armed and the loop sleeps on the agent's
 * descriptor until an event or the next deadline; before that, and after any busy turn, the
 * descriptor is left readable, so an event loop waiting on it calls again. */
static void agent_run(kvx_agent_t *agent, uint64_t timeout_ms, bool (*done)(const void *),
                      const void *arg)
{
    struct loop *loop    = &agent->core.loop;
    struct clock_now now = clock_now();
    uint64_t start       = now.ms;

    for (;;) {
        size_t events = agent_turn(agent, now);
        bool finished = done != NULL ? done(arg) : events > 0;
        bool leaving;
        uint64_t next;
        uint64_t sleep;
        bool busy;

        now     = clock_now(); /* after the turn: for what follows, and the next turn */
        leaving = finished || now.ms - start >= timeout_ms;
        if (events == 0 && agent->idle_since == 0)
            agent->idle_since = now.seconds;
        if (events > 0)
            agent->armed = 0;
        /* Armed by an earlier call, and nothing happened since: what was armed still holds,
         * so arming again would only be its system calls, which a caller spinning on
         * kvx_agent_progress(agent, 0) paid on every call. Again every AGENT_SIDE_CHECK_US all
         * the same, so that a descriptor readable with nothing for us (a wakeup UCX or ZeroMQ
         * consumed without an event) keeps an event loop turning no longer than that. */
        if (leaving && agent->armed != 0 &&
            now.seconds - agent->armed < AGENT_SIDE_CHECK_US * 1e-6 && loop_sleep_prepared(loop))
            return;
        if (events > 0 || (leaving && now.seconds - agent->idle_since < AGENT_LINGER_US * 1e-6) ||
            ((transport_ops_pending(agent->core.transport) > 0 ||
              peers_awaiting_answers(&agent->core)) &&
             now.seconds - agent->idle_since < AGENT_SPIN_US * 1e-6)) {
            if (events > 0)
                agent->idle_since = 0;
            loop_wake(loop);
            if (leaving)
                return;
            continue;
        }
        busy              = agent_busy(agent);
        agent->armed      = busy ? 0 : now.seconds;
        agent->side_quiet = agent->side_quiet && !busy; /* the busy source may be a socket */
        loop_prepare_sleep(loop, busy);
        if (leaving)
            return;
        if (busy) {
            agent->idle_since = 0;
            continue;
        }
        next  = loop_next_deadline(loop);
        sleep = timeout_ms - (now.ms - start);
        if (next != UINT64_MAX)
            sleep = next <= now.ms ? 0 : next - now.ms < sleep ? next - now.ms : sleep;
        if (transport_ops_pending(agent->core.transport) > 0 && sleep > AGENT_PENDING_SLEEP_MS)
            sleep = AGENT_PENDING_SLEEP_MS;
        agent_wait(agent, sleep > INT32_MAX ? INT32_MAX : (int)sleep);
        agent->side_quiet = false; /* what woke us may be on the side channel */
        now               = clock_now();
    }
}

kvx_status_t kvx_agent_progress(kvx_agent_t *agent, int timeout_ms)
{
    if (agent == NULL)
        return error_set(KVX_ERR_INVALID, "progress: no agent");
    agent_run(agent, timeout_ms > 0 ? (uint64_t)timeout_ms : 0, NULL, NULL);
    return KVX_OK;
}

static bool xfer_done(const void *xfer)
{
    return xfer_settled(xfer);
}

kvx_status_t kvx_xfer_wait(kvx_xfer_t *xfer)
{
    kvx_agent_t *agent;

    if (xfer == NULL)
        return error_set(KVX_ERR_INVALID, "wait: no transfer");
    agent = xfer_core(xfer)->agent;
    /* The transfer's deadline bounds this: it fails there at the latest. */
    agent_run(agent, UINT64_MAX, xfer_done, xfer);
    if (kvx_xfer_status(xfer) != KVX_OK)
        error_set(kvx_xfer_status(xfer), "%s", kvx_xfer_error(xfer));
    return kvx_xfer_status(xfer);
}

static bool verify_done(const void *xfer)
{
    return xfer_verify_ended(xfer);
}

kvx_status_t kvx_xfer_verify(kvx_xfer_t *xfer)
{
    bool wait = false;
    kvx_status_t status;

    if (xfer == NULL)
        return error_set(KVX_ERR_INVALID, "verify: no transfer");
    status = xfer_verify_post(xfer, &wait);
    if (status != KVX_OK || !wait)
        return status;
    /* The verification's deadline (the agent's timeout) bounds this. */
    agent_run(xfer_core(xfer)->agent, UINT64_MAX, verify_done, xfer);
    return xfer_verify_finish(xfer);
}

kvx_status_t kvx_agent_connect(kvx_agent_t *agent, const char *address, kvx_peer_t **peer_p)
{
    if (agent == NULL || address == NULL || peer_p == NULL)
        return error_set(KVX_ERR_INVALID, "connect: agent, address and result are required");
    return peer_connect(&agent->core, address, peer_p);
}

void kvx_peer_destroy(kvx_peer_t *peer)
{
    struct core *core;

    if (peer == NULL)
        return;
    core = peer_core(peer);
    xfers_cancel_peer(core->xfers, peer);
    core->num_peers--;
    peer_free(peer);
}

kvx_status_t kvx_peer_reconnect(kvx_peer_t *peer)
{
    struct core *core;

    if (peer == NULL)
        return error_set(KVX_ERR_INVALID, "reconnect: no peer");
    core = peer_core(peer);
    /* A peer up is closed by its caller. One that went down outside the loop (a restart that
     * kvx_write_post's registration noticed) may still wait for the failed-peers phase: its
     * transfers fail now, as that phase would fail them, before it comes back (issue 22
     * finding 6: it came back still queued, and the next turn closed its new connection). */
    if (!peer_is_down(peer))
        xfers_cancel_peer(core->xfers, peer);
    else
        xfers_fail_down_peers(core->xfers);
    return peer_reconnect(peer);
}

kvx_status_t kvx_read_post(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                           uint64_t request_id, const kvx_request_t *request,
                           kvx_xfer_cb_t callback, void *arg, kvx_xfer_t **xfer_p)
{
    if (agent == NULL || peers == NULL || num_peers == 0 || request == NULL || xfer_p == NULL)
        return error_set(KVX_ERR_INVALID, "read: agent, peers, request and result are required");
    return xfer_pull_post(agent->xfers, peers, num_peers, request_id, request, callback, arg,
                          xfer_p);
}

kvx_status_t kvx_write_post(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                            uint64_t request_id, const kvx_request_t *request,
                            kvx_xfer_cb_t callback, void *arg, kvx_xfer_t **xfer_p)
{
    if (agent == NULL || peers == NULL || num_peers == 0 || request == NULL || xfer_p == NULL)
        return error_set(KVX_ERR_INVALID, "write: agent, peers, request and result are required");
    return xfer_push_post(agent->xfers, agent->push_metadata, agent->push_metadata_size, peers,
                          num_peers, request_id, request, callback, arg, xfer_p);
}

/* A post, a wait and a destroy: the blocking form of a transfer. */
static kvx_status_t xfer_blocking(kvx_status_t status, kvx_xfer_t *const *xfer_p,
                                  kvx_read_stats_t *stats_p)
{
    kvx_xfer_t *xfer = *xfer_p;

    if (status != KVX_OK)
        return status;
    status = kvx_xfer_wait(xfer);
    if (status == KVX_OK && stats_p != NULL)
        kvx_xfer_stats(xfer, stats_p);
    kvx_xfer_destroy(xfer);
    return status;
}

kvx_status_t kvx_read(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                      uint64_t request_id, const kvx_request_t *request, kvx_read_stats_t *stats_p)
{
    kvx_xfer_t *xfer = NULL;

    return xfer_blocking(
        kvx_read_post(agent, peers, num_peers, request_id, request, NULL, NULL, &xfer), &xfer,
        stats_p);
}

kvx_status_t kvx_write(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                       uint64_t request_id, const kvx_request_t *request, kvx_read_stats_t *stats_p)
{
    kvx_xfer_t *xfer = NULL;

    return xfer_blocking(
        kvx_write_post(agent, peers, num_peers, request_id, request, NULL, NULL, &xfer), &xfer,
        stats_p);
}

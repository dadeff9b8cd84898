/* agent.c: an agent's life: register the layout, map every storage once, pack the metadata
 * peers ask for, and serve the side channel and notifications. Connecting and reading are in
 * agent_peer.c. Parses no layouts. */
#include "agent.h"

#include "agent_push.h"

#include "clock.h"
#include "error.h"

#include <zmq.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Bytes a side-channel message may have: ZeroMQ drops a peer that sends more, so a stranger
 * cannot make a listener buffer more than a push request needs. */
#define AGENT_MAX_REQUEST          PUSH_MAX_REQUEST_SIZE
#define AGENT_DEFAULT_TIMEOUT_MS   10000
#define AGENT_DEFAULT_LEASE_MS     30000
#define AGENT_DEFAULT_HEARTBEAT_MS 5000
#define AGENT_DEFAULT_PEER_TTL_MS  3600000
#define AGENT_POLL_MS              5 /* longest sleep: leases and heartbeats stay this punctual */
#define AGENT_PROGRESS_ROUNDS      1024 /* UCX progress rounds in one turn of kvx_agent_progress */

/* A notification from a decode agent: `done` for one request. Anything malformed is counted
 * and dropped. */
static void agent_on_notify(void *arg, const void *data, size_t size)
{
    kvx_agent_t *agent = arg;
    uint64_t request_id;

    if (!notify_done_parse(data, size, &request_id)) {
        agent->stats.notifications_dropped++;
        return;
    }
    agent->stats.notifications++;
    hold_table_done(&agent->holds, request_id);
}

void agent_log(kvx_agent_t *agent, const char *format, ...)
{
    char line[700];
    va_list args;

    if (agent->log == NULL)
        return;
    va_start(args, format);
    vsnprintf(line, sizeof(line), format, args);
    va_end(args);
    agent->log(agent->log_arg, line);
}

void kvx_agent_set_log_callback(kvx_agent_t *agent, kvx_log_cb_t callback, void *arg)
{
    agent->log     = callback;
    agent->log_arg = arg;
}

static void agent_on_expired(void *arg, uint64_t request_id)
{
    agent_log(arg, "request %" PRIu64 ": lease expired, its blocks released", request_id);
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

/* Maps each storage: the caller's memory, or memory UCX allocates. */
static kvx_status_t agent_storages_map(kvx_agent_t *agent, const kvx_agent_params_t *params)
{
    bool given = params != NULL && (params->field_mask & KVX_AGENT_PARAM_FIELD_STORAGE_BASES);
    uint64_t size;
    kvx_status_t status;

    agent->num_storages = kvx_regions_num_storages(agent->regions);
    agent->mems         = calloc(agent->num_storages, sizeof(*agent->mems));
    agent->bases        = calloc(agent->num_storages, sizeof(*agent->bases));
    if (agent->mems == NULL || agent->bases == NULL)
        return error_no_memory("the agent's storages");
    for (size_t s = 0; s < agent->num_storages; s++) {
        size = agent->regions->storage_sizes[s];
        if (size > SIZE_MAX)
            return error_set(KVX_ERR_INVALID, "storage %s: too large for this host",
                             agent->regions->storage_names[s]);
        status = transport_mem_map(agent->transport, given ? params->storage_bases[s] : NULL,
                                   (size_t)size, &agent->mems[s]);
        if (status != KVX_OK)
            return status;
        agent->bases[s] = transport_mem_address(agent->mems[s]);
    }
    return KVX_OK;
}

/* Packs this agent's metadata for `mode`: table, addresses, remote keys, worker address. */
static kvx_status_t agent_metadata_pack(kvx_agent_t *agent, const kvx_agent_params_t *params,
                                        kvx_transfer_mode_t mode, void **buf_p, size_t *size_p)
{
    uint64_t mask            = params != NULL ? params->field_mask : 0;
    size_t n                 = agent->num_storages;
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
        .tp_rank       = agent->tp_rank,
        .tp_size       = agent->tp_size,
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

        bases[s] = (uint64_t)(uintptr_t)agent->bases[s];
        status   = transport_mem_pack_rkey(agent->transport, agent->mems[s], &key, &keys[s].size);
        keys[s].data = key;
    }
    if (status == KVX_OK)
        status = transport_worker_address(agent->transport, &address, &address_size);
    if (status == KVX_OK) {
        mp.transport_address = (kvx_blob_t){address, address_size};
        status               = kvx_metadata_pack(agent->regions, &mp, buf_p, size_p);
    }

out:
    for (size_t s = 0; keys != NULL && s < n; s++)
        free((void *)keys[s].data);
    free(keys);
    free(bases);
    free(address);
    return status;
}

kvx_status_t agent_endpoint(const char *address, const char *what, char *endpoint, size_t size)
{
    if (strchr(address, ':') == NULL || strlen(address) + sizeof("tcp://") > size)
        return error_set(KVX_ERR_INVALID, "%s: \"%.64s\" is not HOST:PORT", what, address);
    snprintf(endpoint, size, "tcp://%s", address);
    return KVX_OK;
}

/* Binds the side channel at "HOST:PORT"; port 0 lets the kernel choose a free one, which
 * kvx_agent_listen_address reports (tests and tools use it to never collide). */
static kvx_status_t agent_listen(kvx_agent_t *agent, const char *listen)
{
    int64_t max_request = AGENT_MAX_REQUEST;
    int linger          = 0;
    char endpoint[300];
    size_t bound_size   = sizeof(endpoint);
    kvx_status_t status = agent_endpoint(listen, "listen", endpoint, sizeof(endpoint));
    size_t length       = strlen(endpoint);

    if (status != KVX_OK)
        return status;
    if (length > 2 && strcmp(endpoint + length - 2, ":0") == 0)
        strcpy(endpoint + length - 1, "*"); /* ZeroMQ's spelling of "any free port" */
    agent->router = zmq_socket(agent->zmq, ZMQ_ROUTER);
    if (agent->router == NULL ||
        zmq_setsockopt(agent->router, ZMQ_MAXMSGSIZE, &max_request, sizeof(max_request)) != 0 ||
        zmq_setsockopt(agent->router, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_bind(agent->router, endpoint) != 0 ||
        zmq_getsockopt(agent->router, ZMQ_LAST_ENDPOINT, endpoint, &bound_size) != 0)
        return error_set(KVX_ERR_IO, "listen %s: %s", listen, zmq_strerror(zmq_errno()));
    snprintf(agent->listen_address, sizeof(agent->listen_address), "%s",
             endpoint + strlen("tcp://"));
    return KVX_OK;
}

const char *kvx_agent_listen_address(const kvx_agent_t *agent)
{
    return agent->router != NULL ? agent->listen_address : NULL;
}

void kvx_agent_destroy(kvx_agent_t *agent)
{
    if (agent == NULL)
        return;
    while (agent->peers != NULL)
        kvx_peer_destroy(agent->peers); /* their sockets must close before the context */
    push_writers_free(agent);
    agent_xfers_free_pool(agent);
    if (agent->router != NULL)
        zmq_close(agent->router);
    if (agent->zmq != NULL)
        zmq_ctx_term(agent->zmq);
    for (size_t s = 0; agent->mems != NULL && s < agent->num_storages; s++)
        transport_mem_unmap(agent->transport, agent->mems[s]);
    transport_destroy(agent->transport);
    kvx_pairs_destroy(agent->pairs);
    hold_table_free(&agent->holds);
    kvx_regions_destroy(agent->regions);
    free(agent->metadata);
    free(agent->push_metadata);
    free(agent->transports);
    free(agent->engine_id);
    free(agent->mems);
    free(agent->bases);
    free(agent);
}

kvx_status_t kvx_agent_create(const kvx_layout_t *layout, const kvx_agent_params_t *params,
                              kvx_agent_t **agent_p)
{
    const uint64_t known = KVX_AGENT_PARAM_FIELD_NAME | KVX_AGENT_PARAM_FIELD_TRANSPORTS |
                           KVX_AGENT_PARAM_FIELD_LISTEN | KVX_AGENT_PARAM_FIELD_ENGINE_ID |
                           KVX_AGENT_PARAM_FIELD_TP_RANK | KVX_AGENT_PARAM_FIELD_TP_SIZE |
                           KVX_AGENT_PARAM_FIELD_STORAGE_BASES | KVX_AGENT_PARAM_FIELD_TIMEOUT_MS |
                           KVX_AGENT_PARAM_FIELD_LEASE_MS | KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS |
                           KVX_AGENT_PARAM_FIELD_PEER_TTL_MS;
    uint64_t mask = params != NULL ? params->field_mask : 0;
    const char *tls =
        (mask & KVX_AGENT_PARAM_FIELD_TRANSPORTS) ? params->transports : TRANSPORT_DEFAULT_TLS;
    kvx_agent_t *agent = NULL;
    kvx_status_t status;

    if (agent_p == NULL || (mask & ~known) != 0)
        return error_set(KVX_ERR_INVALID, "agent params: unknown field bits 0x%" PRIx64,
                         mask & ~known);
    agent = calloc(1, sizeof(*agent));
    if (agent == NULL)
        return error_no_memory("an agent");
    agent->tp_rank = (mask & KVX_AGENT_PARAM_FIELD_TP_RANK) ? params->tp_rank : 0;
    agent->tp_size = (mask & KVX_AGENT_PARAM_FIELD_TP_SIZE) ? params->tp_size : 1;
    agent->timeout_ms =
        (mask & KVX_AGENT_PARAM_FIELD_TIMEOUT_MS) ? params->timeout_ms : AGENT_DEFAULT_TIMEOUT_MS;
    agent->holds.lease_ms =
        (mask & KVX_AGENT_PARAM_FIELD_LEASE_MS) ? params->lease_ms : AGENT_DEFAULT_LEASE_MS;
    agent->heartbeat_ms      = (mask & KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS) ? params->heartbeat_ms
                                                                           : AGENT_DEFAULT_HEARTBEAT_MS;
    agent->peer_ttl_ms       = (mask & KVX_AGENT_PARAM_FIELD_PEER_TTL_MS) ? params->peer_ttl_ms
                                                                          : AGENT_DEFAULT_PEER_TTL_MS;
    agent->instance          = agent_instance();
    agent->holds.on_expired  = agent_on_expired;
    agent->holds.expired_arg = agent;
    agent->engine_id  = strdup((mask & KVX_AGENT_PARAM_FIELD_ENGINE_ID) && params->engine_id != NULL
                                   ? params->engine_id
                                   : "");
    agent->transports = strdup(tls);
    agent->zmq        = zmq_ctx_new();
    if (agent->transports == NULL || agent->zmq == NULL || agent->engine_id == NULL) {
        status = error_no_memory("an agent");
        goto err;
    }
    if (agent->heartbeat_ms == 0 || agent->peer_ttl_ms == 0) {
        status = error_set(KVX_ERR_INVALID, "agent: heartbeat_ms and peer_ttl_ms must be > 0");
        goto err;
    }
    if (agent->tp_size < 1 || agent->tp_size > KVX_MAX_TP || agent->tp_rank >= agent->tp_size) {
        status = error_set(KVX_ERR_INVALID,
                           "agent: tp_rank %" PRIu32 " of tp_size %" PRIu32 " is not a rank",
                           agent->tp_rank, agent->tp_size);
        goto err;
    }
    if ((status = kvx_regions_register(layout, &agent->regions)) != KVX_OK ||
        (status = kvx_pairs_create(&agent->pairs)) != KVX_OK ||
        (status = transport_create(tls, &agent->transport)) != KVX_OK ||
        (status = agent_storages_map(agent, params)) != KVX_OK ||
        (status = transport_am_set_handler(agent->transport, AGENT_AM_NOTIFY, agent_on_notify,
                                           agent)) != KVX_OK ||
        (status = agent_metadata_pack(agent, params, KVX_MODE_PULL, &agent->metadata,
                                      &agent->metadata_size)) != KVX_OK ||
        (status = agent_metadata_pack(agent, params, KVX_MODE_PUSH, &agent->push_metadata,
                                      &agent->push_metadata_size)) != KVX_OK)
        goto err;
    if ((mask & KVX_AGENT_PARAM_FIELD_LISTEN) && params->listen != NULL &&
        (status = agent_listen(agent, params->listen)) != KVX_OK)
        goto err;
    agent->event_fd = transport_event_fd(agent->transport);
    *agent_p        = agent;
    return KVX_OK;

err:
    kvx_agent_destroy(agent);
    return status;
}

const kvx_regions_t *kvx_agent_regions(const kvx_agent_t *agent)
{
    return agent->regions;
}

void *kvx_agent_storage(const kvx_agent_t *agent, size_t index, uint64_t *size_p)
{
    if (index >= agent->num_storages)
        return NULL;
    if (size_p != NULL)
        *size_p = agent->regions->storage_sizes[index];
    return agent->bases[index];
}

void kvx_agent_stats(const kvx_agent_t *agent, kvx_agent_stats_t *stats_p)
{
    *stats_p                = agent->stats;
    stats_p->held           = agent->holds.count;
    stats_p->released       = agent->holds.released;
    stats_p->done_unknown   = agent->holds.unknown;
    stats_p->leases_expired = agent->holds.expired;
}

const kvx_pairs_t *kvx_agent_last_pairs(const kvx_agent_t *agent)
{
    return agent->pairs;
}

/* True when frame `f` holds exactly the text `text`. */
static bool frame_is(zmq_msg_t *f, const char *text)
{
    return zmq_msg_size(f) == strlen(text) && memcmp(zmq_msg_data(f), text, strlen(text)) == 0;
}

/* A heartbeat: the request ids a decode agent still wants get their leases extended; the
 * answer says who we are. A malformed list is counted and answered with an error. */
static void heartbeat_serve(kvx_agent_t *agent, zmq_msg_t *ids, char *reply, size_t size)
{
    uint64_t now = clock_ms();
    size_t count;

    if (!heartbeat_ids_parse(zmq_msg_data(ids), zmq_msg_size(ids), &count)) {
        agent->stats.notifications_dropped++;
        snprintf(reply, size, "kvx-error heartbeat of %zu bytes is not a list of ids",
                 zmq_msg_size(ids));
        return;
    }
    agent->stats.notifications++;
    for (size_t i = 0; i < count; i++)
        hold_table_extend(&agent->holds, heartbeat_id(zmq_msg_data(ids), i), now);
    alive_answer_format(reply, size, agent->instance, agent->engine_id);
}

/* Answers one side-channel request, if one is waiting: the metadata, or a push served and
 * acknowledged, or an error text for anything else. A message of the wrong shape is dropped
 * and counted. */
static void agent_serve_one(kvx_agent_t *agent)
{
    zmq_msg_t frames[4]; /* identity, empty delimiter, request, push body */
    int count      = 0;
    bool malformed = false;
    bool more      = true;
    char reply[600];
    kvx_status_t status;

    while (more) {
        zmq_msg_t extra;
        zmq_msg_t *msg = count < 4 ? &frames[count] : &extra;

        zmq_msg_init(msg);
        if (zmq_msg_recv(msg, agent->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(msg);
            break;
        }
        more = zmq_msg_more(msg);
        if (msg == &extra) {
            malformed = true;
            zmq_msg_close(msg);
        } else {
            count++;
        }
    }
    if (count == 0)
        return;
    if (malformed || count < 3 || zmq_msg_size(&frames[1]) != 0) {
        agent->stats.notifications_dropped++;
        goto out;
    }
    zmq_send(agent->router, zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), ZMQ_SNDMORE);
    zmq_send(agent->router, "", 0, ZMQ_SNDMORE);
    if (count == 3 && frame_is(&frames[2], AGENT_METADATA_REQUEST)) {
        zmq_send(agent->router, agent->metadata, agent->metadata_size, 0);
    } else if (count == 4 && frame_is(&frames[2], AGENT_HEARTBEAT_REQUEST)) {
        heartbeat_serve(agent, &frames[3], reply, sizeof(reply));
        zmq_send(agent->router, reply, strlen(reply), 0);
    } else if (count == 4 && frame_is(&frames[2], AGENT_PUSH_REQUEST)) {
        status = push_serve(agent, zmq_msg_data(&frames[3]), zmq_msg_size(&frames[3]));
        if (status == KVX_OK)
            snprintf(reply, sizeof(reply), "%s", AGENT_PUSH_DONE);
        else
            snprintf(reply, sizeof(reply), "kvx-error %s", kvx_errmsg());
        agent->stats.notifications_dropped += status != KVX_OK;
        zmq_send(agent->router, reply, strlen(reply), 0);
    } else {
        static const char unknown[] = "kvx-error unknown request";

        zmq_send(agent->router, unknown, sizeof(unknown) - 1, 0);
        agent->stats.notifications_dropped++;
    }

out:
    for (int i = 0; i < count; i++)
        zmq_msg_close(&frames[i]);
}

kvx_status_t kvx_agent_progress(kvx_agent_t *agent, int timeout_ms)
{
    /* The side channel, and UCX's event descriptor: an idle agent sleeps until either has
     * work instead of for a fixed step, so a peer's operations that need our worker (gets
     * of engine memory, puts, wire-up) do not wait for the next turn. */
    zmq_pollitem_t items[2] = {{.socket = agent->router, .events = ZMQ_POLLIN},
                               {.fd = agent->event_fd, .events = ZMQ_POLLIN}};
    zmq_pollitem_t *poll    = agent->router != NULL ? &items[0] : &items[1];
    int num_items           = (agent->router != NULL) + (agent->event_fd >= 0);
    uint64_t timeout        = timeout_ms > 0 ? (uint64_t)timeout_ms : 0;
    uint64_t start          = clock_ms();

    for (;;) {
        unsigned events  = 0;
        uint64_t elapsed = clock_ms() - start;
        int sleep_ms;

        /* UCX first: notifications must not wait behind the side channel. Bounded, so that
         * a peer keeping the worker busy (a large pull of our memory) cannot hold the call. */
        for (int round = 0;
             round < AGENT_PROGRESS_ROUNDS && transport_progress(agent->transport) > 0; round++)
            events++;
        agent_xfers_progress(agent);
        agent_peers_progress(agent);
        events += hold_table_expire(&agent->holds, clock_ms());
        /* A few ms at most, so that leases and heartbeats stay on time; no sleep once
         * something happened, or when arming finds UCX events already pending. */
        sleep_ms = events > 0 || elapsed >= timeout    ? 0
                   : timeout - elapsed < AGENT_POLL_MS ? (int)(timeout - elapsed)
                                                       : AGENT_POLL_MS;
        if (sleep_ms > 0 && agent->event_fd >= 0 && !transport_arm(agent->transport))
            sleep_ms = 0;
        if (zmq_poll(poll, num_items, sleep_ms) < 0 && zmq_errno() != EINTR)
            return error_set(KVX_ERR_IO, "side channel: %s", zmq_strerror(zmq_errno()));
        if (agent->router != NULL && (items[0].revents & ZMQ_POLLIN)) {
            agent_serve_one(agent);
            events++;
        }
        if (events > 0 || clock_ms() - start >= timeout)
            return KVX_OK;
    }
}

void kvx_agent_set_release_callback(kvx_agent_t *agent, kvx_release_cb_t callback, void *arg)
{
    agent->holds.callback = callback;
    agent->holds.arg      = arg;
}

kvx_status_t kvx_hold(kvx_agent_t *agent, uint64_t request_id, const kvx_group_ids_t *groups,
                      size_t num_groups, uint32_t consumers)
{
    if (agent == NULL)
        return error_set(KVX_ERR_INVALID, "hold: no agent");
    return hold_table_add(&agent->holds, request_id, groups, num_groups, consumers, clock_ms());
}

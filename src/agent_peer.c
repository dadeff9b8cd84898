/* agent_peer.c: the decode side of an agent: ask a prefill agent for its metadata over the
 * side channel, check it, connect the transport, then pull requests and notify after the
 * data is complete. */
#include "agent.h"

#include "agent_push.h"

#include "clock.h"
#include "error.h"

#include <zmq.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Releases what a connection holds: plan, keys, endpoint, metadata, heartbeats. */
static void peer_disconnect(kvx_peer_t *peer)
{
    agent_xfers_fail_peer(peer->agent, peer, "destroyed");
    agent_peer_live_stop(peer);
    kvx_peer_plan_destroy(peer->plan);
    for (size_t s = 0; peer->rkeys != NULL && s < peer->num_storages; s++)
        transport_rkey_destroy(peer->rkeys[s]);
    transport_ep_destroy(peer->agent->transport, peer->ep);
    kvx_metadata_destroy(peer->metadata);
    free(peer->rkeys);
    free(peer->remote_bases);
}

void kvx_peer_destroy(kvx_peer_t *peer)
{
    if (peer == NULL)
        return;
    peer_disconnect(peer);
    free(peer->wanted);
    free(peer->address);
    free(peer);
}

kvx_status_t agent_reply_copy(const void *data, size_t size, void **reply_p, size_t *size_p)
{
    char *copy = malloc(size + 1);

    if (copy == NULL)
        return error_no_memory("the peer's reply");
    memcpy(copy, data, size);
    copy[size] = '\0';
    *reply_p   = copy;
    *size_p    = size;
    return KVX_OK;
}

/* Asks the agent listening at `address` for its metadata on a fresh REQ socket; the reply
 * (malloc'd) within the agent's timeout, at most KVX_MAX_METADATA_SIZE bytes. */
static kvx_status_t metadata_request(kvx_agent_t *agent, const char *address, void **reply_p,
                                     size_t *reply_size_p)
{
    int64_t max_reply = KVX_MAX_METADATA_SIZE;
    int timeout       = (int)agent->timeout_ms;
    int linger        = 0;
    void *socket      = zmq_socket(agent->zmq, ZMQ_REQ);
    char endpoint[300];
    zmq_msg_t reply;
    kvx_status_t status = agent_endpoint(address, "peer", endpoint, sizeof(endpoint));

    if (status != KVX_OK || socket == NULL ||
        zmq_setsockopt(socket, ZMQ_MAXMSGSIZE, &max_reply, sizeof(max_reply)) != 0 ||
        zmq_setsockopt(socket, ZMQ_RCVTIMEO, &timeout, sizeof(timeout)) != 0 ||
        zmq_setsockopt(socket, ZMQ_SNDTIMEO, &timeout, sizeof(timeout)) != 0 ||
        zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_connect(socket, endpoint) != 0 ||
        zmq_send(socket, AGENT_METADATA_REQUEST, strlen(AGENT_METADATA_REQUEST), 0) < 0) {
        if (status == KVX_OK)
            status = error_set(KVX_ERR_IO, "peer %s: %s", address, zmq_strerror(zmq_errno()));
        if (socket != NULL)
            zmq_close(socket);
        return status;
    }
    zmq_msg_init(&reply);
    if (zmq_msg_recv(&reply, socket, 0) < 0) {
        status = error_set(KVX_ERR_IO, "peer %s: no answer within %" PRIu32 " ms (%s)", address,
                           agent->timeout_ms, zmq_strerror(zmq_errno()));
    } else if (zmq_msg_more(&reply)) {
        status = error_set(KVX_ERR_INVALID, "peer %s: the reply has more than one frame", address);
    } else {
        status =
            agent_reply_copy(zmq_msg_data(&reply), zmq_msg_size(&reply), reply_p, reply_size_p);
    }
    zmq_msg_close(&reply);
    zmq_close(socket);
    return status;
}

kvx_status_t agent_peer_transport_connect(kvx_peer_t *peer)
{
    kvx_metadata_info_t info;
    kvx_registration_info_t reg;
    kvx_status_t status;

    kvx_metadata_get_info(peer->metadata, &info);
    status = transport_ep_create(peer->agent->transport, info.transport_address.data,
                                 info.transport_address.size, &peer->ep);
    if (status != KVX_OK)
        return status;
    peer->num_storages = info.num_registrations;
    peer->rkeys        = calloc(peer->num_storages, sizeof(*peer->rkeys));
    peer->remote_bases = calloc(peer->num_storages, sizeof(*peer->remote_bases));
    if (peer->rkeys == NULL || peer->remote_bases == NULL)
        return error_no_memory("the peer's keys");
    for (size_t s = 0; s < peer->num_storages; s++) {
        kvx_metadata_registration(peer->metadata, s, &reg);
        peer->remote_bases[s] = reg.base;
        status = transport_rkey_unpack(peer->ep, reg.remote_key.data, reg.remote_key.size,
                                       &peer->rkeys[s]);
        if (status != KVX_OK)
            return status;
    }
    return KVX_OK;
}

/* The handshake on `peer` (agent and address set, nothing connected): ask for the metadata,
 * check it (hash, then table), plan, connect the transport, start heartbeats. On error the
 * message names the peer and the step, and the caller disconnects what was set up. */
static kvx_status_t peer_connect(kvx_peer_t *peer)
{
    kvx_agent_t *agent            = peer->agent;
    kvx_peer_plan_params_t params = {
        .field_mask = KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP | KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK,
        .local_tp   = agent->tp_size,
        .local_rank = agent->tp_rank,
    };
    kvx_metadata_info_t info;
    kvx_status_t status;
    void *bytes = NULL;
    size_t size = 0;

    status = metadata_request(agent, peer->address, &bytes, &size);
    if (status == KVX_OK)
        status = kvx_metadata_unpack(bytes, size, agent->regions, KVX_MODE_PULL, &peer->metadata);
    free(bytes);
    if (status == KVX_OK)
        status = kvx_metadata_validate(peer->metadata, agent->regions, &params, NULL);
    if (status == KVX_OK) {
        kvx_metadata_get_info(peer->metadata, &info);
        peer->tp_rank = info.tp_rank;
        params.field_mask |= KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP;
        params.remote_tp = info.tp_size;
        status = kvx_peer_plan_create(agent->regions, kvx_metadata_regions(peer->metadata), &params,
                                      &peer->plan);
    }
    if (status == KVX_OK)
        status = agent_peer_transport_connect(peer);
    if (status == KVX_OK)
        status = agent_peer_live_start(peer);
    if (status != KVX_OK) {
        /* Name the peer: the step's message says what, this says who. */
        char what[768];

        snprintf(what, sizeof(what), "%s", kvx_errmsg());
        return error_set(status, "peer %s: %s", peer->address, what);
    }
    agent_log(agent, "peer %s (rank %" PRIu32 ", instance %016" PRIx64 ") connected", peer->address,
              peer->tp_rank, peer->instance);
    return KVX_OK;
}

kvx_status_t kvx_agent_connect(kvx_agent_t *agent, const char *address, kvx_peer_t **peer_p)
{
    kvx_peer_t *peer;
    kvx_status_t status;

    if (agent == NULL || address == NULL || peer_p == NULL)
        return error_set(KVX_ERR_INVALID, "connect: agent, address and result are required");
    peer = calloc(1, sizeof(*peer));
    if (peer == NULL)
        return error_no_memory("a peer");
    peer->agent   = agent;
    peer->address = strdup(address);
    status        = peer->address != NULL ? peer_connect(peer) : error_no_memory("a peer");
    if (status != KVX_OK) {
        kvx_peer_destroy(peer);
        return status;
    }
    *peer_p = peer;
    return KVX_OK;
}

kvx_status_t kvx_peer_reconnect(kvx_peer_t *peer)
{
    uint64_t instance;
    kvx_status_t status;

    if (peer == NULL)
        return error_set(KVX_ERR_INVALID, "reconnect: no peer");
    instance = peer->instance;
    peer_disconnect(peer);
    /* Everything of the old connection goes; the address and the wanted ids stay. */
    *peer  = (kvx_peer_t){.agent           = peer->agent,
                          .address         = peer->address,
                          .wanted          = peer->wanted,
                          .num_wanted      = peer->num_wanted,
                          .wanted_capacity = peer->wanted_capacity};
    status = peer_connect(peer);
    if (status != KVX_OK) {
        char what[600];

        snprintf(what, sizeof(what), "reconnect failed: %s", kvx_errmsg());
        agent_peer_down(peer, what, true);
        return error_set(status, "%s", what + strlen("reconnect failed: "));
    }
    if (peer->instance != instance)
        agent_log(peer->agent, "peer %s restarted: instance %016" PRIx64 " replaces %016" PRIx64,
                  peer->address, peer->instance, instance);
    return KVX_OK;
}

const char *kvx_peer_transports(const kvx_peer_t *peer)
{
    return peer->transports[0] != '\0' ? peer->transports : peer->agent->transports;
}

kvx_status_t kvx_write(kvx_agent_t *agent, kvx_peer_t *const *peers, size_t num_peers,
                       uint64_t request_id, const kvx_request_t *request, kvx_read_stats_t *stats_p)
{
    void *body               = NULL;
    size_t size              = 0;
    kvx_read_stats_t counted = {0};
    kvx_pairs_stats_t stats;
    kvx_status_t status;
    double start;

    if (agent == NULL || peers == NULL || num_peers == 0 || request == NULL)
        return error_set(KVX_ERR_INVALID, "write: agent, peers and request are required");
    /* Our own plan says which prefill ranks hold our blocks, and checks the request first. */
    status = kvx_peer_plan_request(peers[0]->plan, request, agent->pairs);
    if (status == KVX_OK)
        status = push_request_encode(request_id, agent->push_metadata, agent->push_metadata_size,
                                     request, &body, &size);
    start = clock_seconds();
    for (size_t r = 0; status == KVX_OK && r < kvx_pairs_num_reads(agent->pairs); r++) {
        uint32_t rank;
        kvx_peer_t *peer;
        void *reply;
        size_t reply_size;

        kvx_pairs_read(agent->pairs, r, &rank, NULL);
        peer = agent_peer_of_rank(peers, num_peers, rank);
        if (peer == NULL) {
            status = error_set(KVX_ERR_INVALID,
                               "write: the request needs remote rank %" PRIu32
                               ", which is not among the %zu peers",
                               rank, num_peers);
            break;
        }
        status = agent_peer_request(peer, (const void *const[]){AGENT_PUSH_REQUEST, body},
                                    (const size_t[]){strlen(AGENT_PUSH_REQUEST), size}, 2, &reply,
                                    &reply_size);
        if (status != KVX_OK)
            break;
        if (strcmp(reply, AGENT_PUSH_DONE) != 0)
            status = error_set(KVX_ERR_IO, "write %" PRIu64 " by remote rank %" PRIu32 ": %.400s",
                               request_id, rank, (const char *)reply);
        free(reply);
    }
    free(body);
    if (status == KVX_OK) {
        kvx_pairs_stats(agent->pairs, &stats);
        counted = (kvx_read_stats_t){stats.descriptors, stats.coalesced, stats.bytes,
                                     clock_seconds() - start};
        if (stats_p != NULL)
            *stats_p = counted;
    }
    agent_count_transfer(agent, &counted, status);
    /* Notifications the writers sent after their data are ours to count. */
    while (transport_progress(agent->transport) > 0)
        ;
    return status;
}

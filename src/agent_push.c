/* agent_push.c: push mode. The decode side sends its metadata and a request on the side
 * channel; the prefill side checks them, plans the request from the decode side's view,
 * writes its share with puts, flushes, notifies, and answers. Decoding treats the bytes as
 * hostile: every count is checked before use. */
#include "agent_push.h"

#include "error.h"

#include "kvx.pb-c.h"

#include <zmq.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void push_request_free(struct push_request *req)
{
    for (size_t g = 0; req->groups != NULL && g < req->num_groups; g++) {
        free((void *)req->groups[g].ids);
        if (req->has_remote)
            free((void *)req->groups[req->num_groups + g].ids);
    }
    free(req->groups);
    free(req->metadata);
    *req = (struct push_request){0};
}

/* Copies `n` protobuf groups into `out` (owned copies), counting ids into *total_p. */
static kvx_status_t groups_copy(Kvx__Group *const *in, size_t n, kvx_group_ids_t *out,
                                size_t *total_p)
{
    for (size_t g = 0; g < n; g++) {
        uint64_t *ids;

        if (__builtin_add_overflow(*total_p, in[g]->n_ids, total_p) || *total_p > PUSH_MAX_IDS)
            return error_set(KVX_ERR_INVALID, "push request: more than %u block ids", PUSH_MAX_IDS);
        ids = malloc((in[g]->n_ids > 0 ? in[g]->n_ids : 1) * sizeof(*ids));
        if (ids == NULL)
            return error_no_memory("push request ids");
        if (in[g]->n_ids > 0)
            memcpy(ids, in[g]->ids, in[g]->n_ids * sizeof(*ids));
        out[g] = (kvx_group_ids_t){ids, in[g]->n_ids};
    }
    return KVX_OK;
}

kvx_status_t push_request_decode(const void *buf, size_t size, struct push_request *req)
{
    Kvx__PushRequest *msg;
    kvx_status_t status = KVX_OK;
    size_t total        = 0;

    *req = (struct push_request){0};
    if (size > PUSH_MAX_REQUEST_SIZE)
        return error_set(KVX_ERR_INVALID, "push request: %zu bytes is more than %u", size,
                         PUSH_MAX_REQUEST_SIZE);
    msg = kvx__push_request__unpack(NULL, size, buf);
    if (msg == NULL)
        return error_set(KVX_ERR_INVALID, "push request: %zu bytes are not a push request", size);
    if (msg->n_local < 1 || msg->n_local > PUSH_MAX_GROUPS ||
        (msg->n_remote != 0 && msg->n_remote != msg->n_local))
        status = error_set(KVX_ERR_INVALID,
                           "push request: %zu local and %zu remote groups"
                           " (1..%d local; remote none or as many)",
                           msg->n_local, msg->n_remote, PUSH_MAX_GROUPS);
    if (status == KVX_OK && (msg->metadata.len == 0 || msg->metadata.len > KVX_MAX_METADATA_SIZE))
        status =
            error_set(KVX_ERR_INVALID, "push request: metadata of %zu bytes", msg->metadata.len);
    if (status == KVX_OK) {
        req->request_id = msg->request_id;
        req->num_groups = msg->n_local;
        req->has_remote = msg->n_remote > 0;
        req->groups     = calloc(2 * msg->n_local, sizeof(*req->groups));
        req->metadata   = malloc(msg->metadata.len);
        if (req->groups == NULL || req->metadata == NULL)
            status = error_no_memory("a push request");
    }
    if (status == KVX_OK) {
        memcpy(req->metadata, msg->metadata.data, msg->metadata.len);
        req->metadata_size = msg->metadata.len;
        status             = groups_copy(msg->local, msg->n_local, req->groups, &total);
    }
    if (status == KVX_OK && req->has_remote)
        status = groups_copy(msg->remote, msg->n_remote, req->groups + req->num_groups, &total);
    kvx__push_request__free_unpacked(msg, NULL);
    if (status != KVX_OK)
        push_request_free(req);
    return status;
}

kvx_status_t push_request_encode(uint64_t request_id, const void *metadata, size_t metadata_size,
                                 const kvx_request_t *request, void **buf_p, size_t *size_p)
{
    size_t n             = request->num_local_groups;
    size_t nr            = request->remote != NULL ? request->num_remote_groups : 0;
    Kvx__PushRequest msg = KVX__PUSH_REQUEST__INIT;
    Kvx__Group *groups   = calloc(n + nr, sizeof(*groups));
    Kvx__Group **local   = calloc(n, sizeof(*local));
    Kvx__Group **remote  = calloc(nr > 0 ? nr : 1, sizeof(*remote));
    kvx_status_t status  = KVX_OK;
    void *buf            = NULL;
    size_t size;

    if (groups == NULL || local == NULL || remote == NULL) {
        status = error_no_memory("a push request");
        goto out;
    }
    for (size_t g = 0; g < n + nr; g++) {
        const kvx_group_ids_t *ids = g < n ? &request->local[g] : &request->remote[g - n];

        kvx__group__init(&groups[g]);
        groups[g].n_ids = ids->count;
        groups[g].ids   = (uint64_t *)ids->ids;
        if (g < n)
            local[g] = &groups[g];
        else
            remote[g - n] = &groups[g];
    }
    msg.request_id = request_id;
    msg.metadata   = (ProtobufCBinaryData){metadata_size, (uint8_t *)metadata};
    msg.n_local    = n;
    msg.local      = local;
    msg.n_remote   = nr;
    msg.remote     = remote;
    size           = kvx__push_request__get_packed_size(&msg);
    if (size > PUSH_MAX_REQUEST_SIZE) {
        status = error_set(KVX_ERR_INVALID, "push request: %zu bytes is more than %u", size,
                           PUSH_MAX_REQUEST_SIZE);
        goto out;
    }
    buf = malloc(size > 0 ? size : 1);
    if (buf == NULL) {
        status = error_no_memory("a push request");
        goto out;
    }
    kvx__push_request__pack(&msg, buf);
    *buf_p  = buf;
    *size_p = size;

out:
    free(groups);
    free(local);
    free(remote);
    return status;
}

/* The decode agents this one has written to, kept so that a push does not create an endpoint,
 * unpack keys and prepare a plan every time (about a millisecond): a writer is found by the
 * exact bytes of the metadata its push requests carry, which name its worker, so a restarted
 * decode process is a new writer. Least recently used goes first; a failed write drops its
 * writer. */
#define PUSH_WRITERS 16

struct push_writer {
    void *metadata;
    size_t metadata_size;
    kvx_peer_t *peer;
    uint64_t used; /* agent->push_uses when last used */
};

static void push_writer_drop(struct push_writer *w)
{
    kvx_peer_destroy(w->peer);
    free(w->metadata);
    *w = (struct push_writer){0};
}

void push_writers_free(kvx_agent_t *agent)
{
    for (size_t i = 0; agent->push_writers != NULL && i < PUSH_WRITERS; i++)
        push_writer_drop(&agent->push_writers[i]);
    free(agent->push_writers);
    agent->push_writers = NULL;
}

/* The decode agent of `req` as a peer of ours: its metadata checked (hash for push mode, then
 * the tables through the planner, from its view: it is the one whose blocks are filled), its
 * endpoint and keys. */
static kvx_status_t push_writer_connect(kvx_agent_t *agent, const struct push_request *req,
                                        kvx_peer_t **peer_p)
{
    kvx_peer_t *peer = calloc(1, sizeof(*peer));
    kvx_metadata_info_t info;
    kvx_peer_plan_params_t params;
    kvx_status_t status;

    if (peer == NULL)
        return error_no_memory("a push peer");
    peer->agent = agent;
    status = kvx_metadata_unpack(req->metadata, req->metadata_size, agent->regions, KVX_MODE_PUSH,
                                 &peer->metadata);
    if (status == KVX_OK) {
        kvx_metadata_get_info(peer->metadata, &info);
        params = (kvx_peer_plan_params_t){
            .field_mask = KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP |
                          KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK |
                          KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP,
            .local_tp   = info.tp_size,
            .local_rank = info.tp_rank,
            .remote_tp  = agent->tp_size,
        };
        status = kvx_peer_plan_create(kvx_metadata_regions(peer->metadata), agent->regions, &params,
                                      &peer->plan);
    }
    if (status == KVX_OK)
        status = agent_peer_transport_connect(peer);
    if (status != KVX_OK) {
        kvx_peer_destroy(peer);
        return status;
    }
    *peer_p = peer;
    return KVX_OK;
}

/* The writer for `req`'s metadata: cached, or connected now in the least recently used
 * slot. */
static kvx_status_t push_writer_find(kvx_agent_t *agent, const struct push_request *req,
                                     struct push_writer **writer_p)
{
    struct push_writer *oldest = NULL;
    kvx_status_t status;

    if (agent->push_writers == NULL &&
        (agent->push_writers = calloc(PUSH_WRITERS, sizeof(*agent->push_writers))) == NULL)
        return error_no_memory("push writers");
    agent->push_uses++;
    for (size_t i = 0; i < PUSH_WRITERS; i++) {
        struct push_writer *w = &agent->push_writers[i];

        if (w->peer != NULL && w->metadata_size == req->metadata_size &&
            memcmp(w->metadata, req->metadata, req->metadata_size) == 0) {
            w->used   = agent->push_uses;
            *writer_p = w;
            return KVX_OK;
        }
        if (oldest == NULL || w->used < oldest->used)
            oldest = w;
    }
    push_writer_drop(oldest);
    oldest->metadata = malloc(req->metadata_size);
    if (oldest->metadata == NULL)
        return error_no_memory("a push writer");
    status = push_writer_connect(agent, req, &oldest->peer);
    if (status != KVX_OK) {
        push_writer_drop(oldest);
        return status;
    }
    memcpy(oldest->metadata, req->metadata, req->metadata_size);
    oldest->metadata_size = req->metadata_size;
    oldest->used          = agent->push_uses;
    *writer_p             = oldest;
    return KVX_OK;
}

/* Writes this rank's share of `req` into the decode agent `peer` stands for: plan the request
 * from the decode side's view, one put per pair from this side's memory, a flush, and a
 * notification. */
static kvx_status_t push_write(kvx_agent_t *agent, const struct push_request *req, kvx_peer_t *peer)
{
    struct notify note    = notify_done(req->request_id, agent->tp_rank);
    kvx_request_t request = {req->groups, req->num_groups,
                             req->has_remote ? req->groups + req->num_groups : NULL,
                             req->has_remote ? req->num_groups : 0};
    kvx_status_t status   = kvx_peer_plan_request(peer->plan, &request, agent->pairs);

    for (size_t r = 0; status == KVX_OK && r < kvx_pairs_num_reads(agent->pairs); r++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(agent->pairs, r, &rank, &count);
        /* The plan is the decode side's: its "local" is our destination. */
        struct transport_targets targets = {agent->bases, peer->remote_bases, peer->rkeys, true};

        if (rank != agent->tp_rank)
            continue; /* another prefill rank writes that share */
        status = transport_rma(agent->transport, peer->ep, true, p, count, &targets,
                               (int)agent->timeout_ms);
    }
    /* The puts were flushed: the data is there before the notification. */
    if (status == KVX_OK)
        status = transport_am_send(agent->transport, peer->ep, AGENT_AM_NOTIFY, &note, sizeof(note),
                                   (int)agent->timeout_ms);
    return status;
}

kvx_status_t push_serve(kvx_agent_t *agent, const void *body, size_t size)
{
    struct push_request req;
    struct push_writer *writer = NULL;
    kvx_status_t status        = push_request_decode(body, size, &req);

    if (status != KVX_OK)
        return status;
    status = push_writer_find(agent, &req, &writer);
    if (status == KVX_OK) {
        status = push_write(agent, &req, writer->peer);
        if (status != KVX_OK)
            push_writer_drop(writer); /* a dead or broken writer: connect afresh next time */
    }
    push_request_free(&req);
    return status;
}

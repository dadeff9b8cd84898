/* probe.c: kvx_peer_probe, the handshake's checks before an agent exists: a prefill agent's
 * metadata fetched over the side channel and checked against our region table, with no
 * memory mapped, no transport and nothing kept. Beside peer.c, over the side channel and the
 * wire's checks; an agent's connect repeats all of it and then connects the transport. */
#include "auth.h"
#include "core.h"
#include "error.h"
#include "sidechan.h"

#include <zmq.h>

#include <stdlib.h>

kvx_status_t kvx_peer_probe(const kvx_regions_t *local, const kvx_agent_params_t *params,
                            const char *address)
{
    uint64_t mask         = params != NULL ? params->field_mask : 0;
    const uint8_t *secret = (mask & KVX_AGENT_PARAM_FIELD_AUTH_KEY) ? params->auth_key : NULL;
    bool insecure         = (mask & KVX_AGENT_PARAM_FIELD_INSECURE) && params->insecure;
    uint32_t timeout_ms =
        (mask & KVX_AGENT_PARAM_FIELD_TIMEOUT_MS) ? params->timeout_ms : KVX_DEFAULT_TIMEOUT_MS;
    kvx_peer_plan_params_t checks = {
        .field_mask = KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP | KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK,
        .local_tp   = (mask & KVX_AGENT_PARAM_FIELD_TP_SIZE) ? params->tp_size : 1,
        .local_rank = (mask & KVX_AGENT_PARAM_FIELD_TP_RANK) ? params->tp_rank : 0,
    };
    kvx_metadata_t *metadata = NULL;
    struct auth_keys keys;
    void *bytes = NULL;
    size_t size = 0;
    kvx_status_t status;
    void *zmq;

    if (local == NULL || address == NULL)
        return error_set(KVX_ERR_INVALID, "probe: a region table and an address are required");
    status = auth_keys_choose(secret, insecure, &keys);
    if (status != KVX_OK)
        return status;
    zmq = zmq_ctx_new();
    if (zmq == NULL)
        return error_set(KVX_ERR_INTERNAL, "probe: ZeroMQ: %s", zmq_strerror(zmq_errno()));
    /* the same steps as an agent's handshake (peer.c link_open), in the same order */
    status = sidechan_fetch(zmq, address, &keys, VERB_METADATA, KVX_MAX_METADATA_SIZE, timeout_ms,
                            &bytes, &size);
    if (status == KVX_OK)
        status = kvx_metadata_unpack(bytes, size, local, KVX_MODE_PULL, &metadata);
    if (status == KVX_OK)
        status = kvx_metadata_validate(metadata, local, &checks, NULL);
    kvx_metadata_destroy(metadata);
    free(bytes);
    zmq_ctx_term(zmq); /* the fetch closed its sockets, with no linger */
    if (status != KVX_OK) {
        char what[768];

        snprintf(what, sizeof(what), "%s", kvx_errmsg());
        return error_set(status, "peer %s: %s", address, what);
    }
    return KVX_OK;
}

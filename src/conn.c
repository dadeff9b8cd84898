/* conn.c: opening a connection from a peer's metadata: decode (hash first), check the TCP
 * segments and the table, plan, connect the transport with the peer's keys, and digest the peer's
 * table so transfers can tell when two ranks' tables are the same; and our push metadata for the
 * peer, naming this connection's worker. Keeps no list of connections. */
#include "conn.h"

#include "error.h"
#include "regions.h"
#include "wire.h"

#include <openssl/evp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SHA-256 over what pairs are computed from on the peer's side: its TP size, block size and
 * every region's storage, offset, length, stride and capacity. */
static kvx_status_t table_digest(const kvx_regions_t *table, uint32_t tp_size,
                                 uint8_t digest[CONN_DIGEST_LEN])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int length;
    bool ok = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
              EVP_DigestUpdate(ctx, &tp_size, sizeof(tp_size)) == 1 &&
              EVP_DigestUpdate(ctx, &table->block_size, sizeof(table->block_size)) == 1;

    for (size_t r = 0; ok && r < table->num_regions; r++) {
        const struct region *g = &table->regions[r];
        uint64_t fields[5]     = {g->storage, g->offset, g->block_len, g->stride, g->num_blocks};

        ok = EVP_DigestUpdate(ctx, fields, sizeof(fields)) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(ctx, digest, &length) == 1;
    EVP_MD_CTX_free(ctx);
    return ok ? KVX_OK : error_set(KVX_ERR_INTERNAL, "connection: SHA-256 failed");
}

/* The transport connection: the worker address and every registration's key and base. */
static kvx_status_t conn_transport_open(struct transport *t, const char *host, struct conn *c)
{
    kvx_metadata_info_t info;
    kvx_registration_info_t reg;
    struct transport_remote_mem *mems;
    kvx_status_t status;

    kvx_metadata_get_info(c->metadata, &info);
    mems            = calloc(info.num_registrations + 1, sizeof(*mems));
    c->remote_bases = calloc(info.num_registrations + 1, sizeof(*c->remote_bases));
    if (mems == NULL || c->remote_bases == NULL) {
        free(mems);
        return error_no_memory("the peer's keys");
    }
    for (size_t s = 0; s < info.num_registrations; s++) {
        kvx_metadata_registration(c->metadata, s, &reg);
        c->remote_bases[s] = reg.base;
        mems[s]            = (struct transport_remote_mem){reg.remote_key, reg.base, reg.size,
                                                           reg.mem == KVX_MEM_VRAM};
    }
    status = transport_conn_create(t, info.transport_address.data, info.transport_address.size,
                                   host, mems, info.num_registrations, &c->transport);
    free(mems);
    return status;
}

kvx_status_t conn_open(struct transport *t, const char *host, const kvx_regions_t *local,
                       uint32_t local_tp,
                       uint32_t local_rank, kvx_transfer_mode_t mode, const void *metadata,
                       size_t size, struct conn **conn_p)
{
    struct conn *c                = calloc(1, sizeof(*c));
    kvx_peer_plan_params_t params = {
        .field_mask = KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP | KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK,
        .local_tp   = local_tp,
        .local_rank = local_rank,
    };
    kvx_metadata_info_t info;
    kvx_status_t status;

    if (c == NULL)
        return error_no_memory("a connection");
    status = kvx_metadata_unpack(metadata, size, local, mode, &c->metadata);
    if (status == KVX_OK) {
        /* before anything connects: a segment too large for its receiver aborts it in UCX */
        struct transport_segments seg = transport_tcp_segments(t);

        status = wire_tcp_segments_agree(c->metadata, seg.tx, seg.rx);
    }
    if (status == KVX_OK && mode == KVX_MODE_PULL)
        status = kvx_metadata_validate(c->metadata, local, &params, NULL);
    if (status == KVX_OK) {
        const kvx_regions_t *remote = kvx_metadata_regions(c->metadata);

        kvx_metadata_get_info(c->metadata, &info);
        c->tp_rank = info.tp_rank;
        c->tp_size = info.tp_size;
        params.field_mask |= KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP;
        if (mode == KVX_MODE_PULL) {
            params.remote_tp = info.tp_size;
            status           = kvx_peer_plan_create(local, remote, &params, &c->plan);
        } else {
            /* the peer's view: it is the one whose blocks are filled */
            params.local_tp   = info.tp_size;
            params.local_rank = info.tp_rank;
            params.remote_tp  = local_tp;
            status            = kvx_peer_plan_create(remote, local, &params, &c->plan);
        }
        if (status == KVX_OK)
            status = table_digest(remote, info.tp_size, c->table_digest);
    }
    if (status == KVX_OK)
        status = conn_transport_open(t, host, c);
    if (status != KVX_OK) {
        conn_close(c);
        return status;
    }
    *conn_p = c;
    return KVX_OK;
}

void conn_close(struct conn *conn)
{
    if (conn == NULL)
        return;
    transport_conn_destroy(conn->transport);
    kvx_peer_plan_destroy(conn->plan);
    kvx_metadata_destroy(conn->metadata);
    free(conn->remote_bases);
    free(conn->push_metadata);
    free(conn);
}

kvx_status_t conn_push_metadata(struct conn *conn, const void *own, size_t own_size,
                                const void **buf_p, size_t *size_p)
{
    if (conn->push_metadata == NULL) {
        void *address = NULL;
        size_t address_size;
        kvx_status_t status = transport_conn_address(conn->transport, &address, &address_size);

        if (status == KVX_OK)
            status = wire_metadata_readdress(own, own_size, address, address_size,
                                             &conn->push_metadata, &conn->push_metadata_size);
        free(address);
        if (status != KVX_OK)
            return status;
    }
    *buf_p  = conn->push_metadata;
    *size_p = conn->push_metadata_size;
    return KVX_OK;
}

const char *conn_transports(struct conn *conn)
{
    if (conn->transports[0] == '\0' && conn->transport != NULL)
        transport_conn_describe(conn->transport, conn->transports, sizeof(conn->transports));
    return conn->transports;
}

bool conn_one_host(struct conn *conn)
{
    /* UCX's transports that reach only a process on the same host; "memcpy" is kvx's own
     * mapped storages (transport_conn_describe). */
    static const char *const one_host[] = {"posix", "sysv", "xpmem", "cma", "knem", "memcpy"};
    char described[sizeof(conn->transports)];
    char *save = NULL;

    if (conn->one_host != CONN_HOST_UNKNOWN || conn->transport == NULL)
        return conn->one_host == CONN_HOST_THIS;
    /* Not conn_transports': before wire-up a TCP lane shows as such, and that description
     * must not stay the peer's. */
    transport_conn_describe(conn->transport, described, sizeof(described));
    conn->one_host = CONN_HOST_OTHER;
    for (char *lane = strtok_r(described, " ", &save); lane != NULL;
         lane       = strtok_r(NULL, " ", &save)) {
        lane[strcspn(lane, "(")] = '\0';
        for (size_t i = 0; i < sizeof(one_host) / sizeof(one_host[0]); i++) {
            if (strcmp(lane, one_host[i]) == 0)
                conn->one_host = CONN_HOST_THIS;
        }
    }
    return conn->one_host == CONN_HOST_THIS;
}

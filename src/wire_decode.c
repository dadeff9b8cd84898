/* wire_decode.c: the two-phase decode of a peer's metadata: envelope (version, hash,
 * factors) first, then the body, every count, length and offset checked before use. The
 * result owns copies of everything; the peer's bytes are not kept. */
#include "wire.h"

#include "error.h"
#include "text.h"

#include "kvx.pb-c.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INT63_MAX ((uint64_t)INT64_MAX)

void kvx_metadata_destroy(kvx_metadata_t *md)
{
    if (md == NULL)
        return;
    for (size_t i = 0; i < md->num_registrations; i++)
        free(md->registrations[i].remote_key);
    for (size_t i = 0; i < md->max_differences; i++)
        free(md->differences[i]);
    free(md->differences);
    free(md->registrations);
    free(md->engine_id);
    free(md->agent_name);
    free(md->transport_address);
    kvx_regions_destroy(md->regions);
    free(md);
}

/* Copies `b` into a NUL-terminated string after checking its length (at most
 * KVX_MAX_NAME_LEN, at least 1 unless `may_be_empty`) and that it holds no NUL. */
static kvx_status_t name_copy(const ProtobufCBinaryData *b, const char *what, bool may_be_empty,
                              char **out_p)
{
    char *copy;

    if (b->len > KVX_MAX_NAME_LEN)
        return error_set(KVX_ERR_INVALID, "metadata: %s: %zu bytes is longer than %d", what, b->len,
                         KVX_MAX_NAME_LEN);
    if (b->len == 0 && !may_be_empty)
        return error_set(KVX_ERR_INVALID, "metadata: %s: is empty", what);
    if (b->len > 0 && memchr(b->data, '\0', b->len) != NULL)
        return error_set(KVX_ERR_INVALID, "metadata: %s: holds a NUL byte", what);
    if (b->len > 0) {
        /* a peer's names are printed in messages and logs: the layout's rule holds (text.h) */
        const char *why;
        size_t bad = text_find_unprintable((const char *)b->data, b->len, &why);

        if (bad < b->len)
            return error_set(KVX_ERR_INVALID, "metadata: %s: byte %zu (0x%02x) is %s", what, bad,
                             b->data[bad], why);
    }
    copy = malloc(b->len + 1);
    if (copy == NULL)
        return error_no_memory("a metadata name");
    if (b->len > 0)
        memcpy(copy, b->data, b->len);
    copy[b->len] = '\0';
    *out_p       = copy;
    return KVX_OK;
}

static kvx_status_t blob_copy(const ProtobufCBinaryData *b, const char *what, uint8_t **out_p,
                              size_t *size_p)
{
    if (b->len > KVX_MAX_BLOB_SIZE)
        return error_set(KVX_ERR_INVALID, "metadata: %s: %zu bytes is more than %d", what, b->len,
                         KVX_MAX_BLOB_SIZE);
    *size_p = b->len;
    *out_p  = NULL;
    if (b->len == 0)
        return KVX_OK;
    *out_p = malloc(b->len);
    if (*out_p == NULL)
        return error_no_memory("a metadata blob");
    memcpy(*out_p, b->data, b->len);
    return KVX_OK;
}

/* Appends "name: local X, remote Y" to msg when a factor differs. */
static void factor_compare_text(char *msg, size_t size, const char *name, const char *local,
                                const char *remote)
{
    size_t used = strlen(msg);

    if (strcmp(local, remote) != 0)
        snprintf(msg + used, size - used, "%s%s: local \"%.64s\", remote \"%.64s\"",
                 used > 0 ? "; " : "", name, local, remote);
}

static void factor_compare_number(char *msg, size_t size, const char *name, uint64_t local,
                                  uint64_t remote)
{
    size_t used = strlen(msg);

    if (local != remote)
        snprintf(msg + used, size - used, "%s%s: local %" PRIu64 ", remote %" PRIu64,
                 used > 0 ? "; " : "", name, local, remote);
}

/* Phase one: version and compatibility hash, before the body is touched. */
static kvx_status_t envelope_check(const Kvx__Envelope *env, const kvx_regions_t *local,
                                   kvx_transfer_mode_t mode)
{
    uint8_t local_hash[KVX_COMPAT_HASH_LEN];
    uint8_t sent_hash[KVX_COMPAT_HASH_LEN];
    Kvx__CompatFactors mine;
    const Kvx__CompatFactors *theirs = env->factors;
    char diff[768]                   = "";

    if (env->wire_version != KVX_WIRE_VERSION)
        return error_set(KVX_ERR_INVALID,
                         "metadata: wire version %" PRIu32 ", this agent speaks %d",
                         env->wire_version, KVX_WIRE_VERSION);
    if (env->compat_hash.len != KVX_COMPAT_HASH_LEN)
        return error_set(KVX_ERR_INVALID, "metadata: compat_hash: %zu bytes, expected %d",
                         env->compat_hash.len, KVX_COMPAT_HASH_LEN);
    wire_factors_fill(local, mode, &mine);
    if (wire_factors_hash(&mine, local_hash) != KVX_OK)
        return KVX_ERR_INTERNAL;
    if (memcmp(local_hash, env->compat_hash.data, KVX_COMPAT_HASH_LEN) == 0)
        return KVX_OK;
    if (theirs == NULL)
        return error_set(KVX_ERR_INVALID, "metadata: the compatibility hash differs and the peer"
                                          " sent no factors to say why");
    if (wire_factors_hash(theirs, sent_hash) != KVX_OK)
        return KVX_ERR_INTERNAL;
    if (memcmp(sent_hash, env->compat_hash.data, KVX_COMPAT_HASH_LEN) != 0)
        return error_set(KVX_ERR_INVALID, "metadata: the peer's factors do not match its own"
                                          " compatibility hash");
    factor_compare_number(diff, sizeof(diff), "wire_version", mine.wire_version,
                          theirs->wire_version);
    factor_compare_text(diff, sizeof(diff), "model_id", mine.model_id, theirs->model_id);
    factor_compare_text(diff, sizeof(diff), "model_revision", mine.model_revision,
                        theirs->model_revision);
    factor_compare_text(diff, sizeof(diff), "dtype", mine.dtype, theirs->dtype);
    factor_compare_text(diff, sizeof(diff), "cache_dtype", mine.cache_dtype, theirs->cache_dtype);
    factor_compare_number(diff, sizeof(diff), "kv_heads", mine.kv_heads, theirs->kv_heads);
    factor_compare_number(diff, sizeof(diff), "head_size", mine.head_size, theirs->head_size);
    factor_compare_number(diff, sizeof(diff), "layers", mine.layers, theirs->layers);
    factor_compare_text(diff, sizeof(diff), "backend", mine.backend, theirs->backend);
    factor_compare_text(diff, sizeof(diff), "mode",
                        mine.mode == KVX__TRANSFER_MODE__PUSH ? "push" : "pull",
                        theirs->mode == KVX__TRANSFER_MODE__PUSH ? "push" : "pull");
    return error_set(KVX_ERR_INVALID, "metadata: incompatible peer: %s", diff);
}

static kvx_status_t registrations_copy(const Kvx__AgentMetadata *body, kvx_metadata_t *md,
                                       char **names)
{
    char what[64];
    kvx_status_t status;

    for (size_t s = 0; s < body->n_registrations; s++) {
        const Kvx__Registration *w   = body->registrations[s];
        struct registration_copy *rc = &md->registrations[s];

        snprintf(what, sizeof(what), "registrations[%zu].storage", s);
        status = name_copy(&w->storage, what, false, &names[s]);
        if (status != KVX_OK)
            return status;
        if (w->size < 1 || w->size > INT63_MAX)
            return error_set(KVX_ERR_INVALID,
                             "metadata: registrations[%zu].size: %" PRIu64 " is not in 1..2^63-1",
                             s, w->size);
        if (w->address > UINT64_MAX - w->size)
            return error_set(KVX_ERR_INVALID,
                             "metadata: registrations[%zu]: %" PRIu64 " bytes at 0x%" PRIx64
                             " wrap around the address space",
                             s, w->size, w->address);
        if (w->mem != KVX__MEM_TYPE__DRAM && w->mem != KVX__MEM_TYPE__VRAM)
            return error_set(KVX_ERR_INVALID,
                             "metadata: registrations[%zu].mem: %d is not a"
                             " memory type",
                             s, (int)w->mem);
        if (w->device < 0)
            return error_set(KVX_ERR_INVALID,
                             "metadata: registrations[%zu].device: %" PRId64 " is negative", s,
                             w->device);
        snprintf(what, sizeof(what), "registrations[%zu].remote_key", s);
        status = blob_copy(&w->remote_key, what, &rc->remote_key, &rc->remote_key_size);
        if (status != KVX_OK)
            return status;
        rc->base   = w->address;
        rc->size   = w->size;
        rc->mem    = w->mem == KVX__MEM_TYPE__VRAM ? KVX_MEM_VRAM : KVX_MEM_DRAM;
        rc->device = w->device;
    }
    return KVX_OK;
}

/* One region: sane counts, and every block inside its registration. */
static kvx_status_t region_copy(const Kvx__Region *w, size_t i, const kvx_metadata_t *md,
                                struct region *r)
{
    uint64_t end;

    if (w->storage >= md->num_registrations)
        return error_set(KVX_ERR_INVALID,
                         "metadata: regions[%zu].storage: %" PRIu32
                         " is not one of %zu registrations",
                         i, w->storage, md->num_registrations);
    if (w->block_len < 1 || w->stride < 1 || w->num_blocks < 1 || w->heads < 1 ||
        w->block_len > INT63_MAX || w->stride > INT63_MAX || w->num_blocks > INT63_MAX ||
        w->offset > INT63_MAX || w->heads > INT63_MAX)
        return error_set(KVX_ERR_INVALID,
                         "metadata: regions[%zu]: block_len, stride, num_blocks"
                         " and heads must be in 1..2^63-1 and offset below 2^63",
                         i);
    if (w->group < -1)
        return error_set(KVX_ERR_INVALID, "metadata: regions[%zu].group: %" PRId64 " is below -1",
                         i, w->group);
    if (__builtin_mul_overflow(w->num_blocks - 1, w->stride, &end) ||
        __builtin_add_overflow(end, w->offset, &end) ||
        __builtin_add_overflow(end, w->block_len, &end) || end > md->registrations[w->storage].size)
        return error_set(KVX_ERR_INVALID,
                         "metadata: regions[%zu]: its blocks run past its"
                         " registration of %" PRIu64 " bytes",
                         i, md->registrations[w->storage].size);
    *r = (struct region){
        .storage      = w->storage,
        .first_member = (uint32_t)i,
        .num_members  = 1,
        .offset       = w->offset,
        .block_len    = w->block_len,
        .stride       = w->stride,
        .num_blocks   = w->num_blocks,
        .heads        = w->heads,
        .group        = w->group,
        .mla          = w->mla,
        .packed_row   = w->packed_row,
        .scratch      = w->scratch,
        .ssm          = w->ssm,
        .ple          = w->ple,
        .head_split   = w->head_split,
    };
    return KVX_OK;
}

static void names_free(char **names, size_t count)
{
    for (size_t i = 0; names != NULL && i < count; i++)
        free(names[i]);
    free(names);
}

/* The peer's region table: its regions in its order, each its own single member. */
static kvx_status_t table_build(const Kvx__AgentMetadata *body, kvx_metadata_t *md)
{
    size_t nr            = body->n_regions;
    size_t ns            = body->n_registrations;
    char **region_names  = calloc(nr, sizeof(*region_names));
    char **storage_names = calloc(ns, sizeof(*storage_names));
    kvx_regions_t *t     = calloc(1, sizeof(*t));
    kvx_status_t status  = KVX_OK;
    char what[64];

    md->registrations = calloc(ns, sizeof(*md->registrations));
    if (region_names == NULL || storage_names == NULL || t == NULL || md->registrations == NULL) {
        status = error_no_memory("the peer's table");
        goto out;
    }
    md->num_registrations = ns;
    status                = registrations_copy(body, md, storage_names);
    if (status != KVX_OK)
        goto out;
    t->regions         = calloc(nr, sizeof(*t->regions));
    t->members         = calloc(nr, sizeof(*t->members));
    t->storage_sizes   = calloc(ns, sizeof(*t->storage_sizes));
    t->storage_mems    = calloc(ns, sizeof(*t->storage_mems));
    t->storage_devices = calloc(ns, sizeof(*t->storage_devices));
    if (t->regions == NULL || t->members == NULL || t->storage_sizes == NULL ||
        t->storage_mems == NULL || t->storage_devices == NULL) {
        status = error_no_memory("the peer's table");
        goto out;
    }
    for (size_t i = 0; i < nr; i++) {
        snprintf(what, sizeof(what), "regions[%zu].name", i);
        status = name_copy(&body->regions[i]->name, what, false, &region_names[i]);
        if (status == KVX_OK)
            status = region_copy(body->regions[i], i, md, &t->regions[i]);
        if (status != KVX_OK)
            goto out;
        t->members[i] = (uint32_t)i;
    }
    for (size_t s = 0; s < ns; s++) {
        t->storage_sizes[s]   = md->registrations[s].size;
        t->storage_mems[s]    = md->registrations[s].mem;
        t->storage_devices[s] = md->registrations[s].device;
    }
    t->num_regions   = nr;
    t->num_views     = nr;
    t->num_storages  = ns;
    t->block_size    = body->block_size;
    t->view_names    = regions_names_copy(region_names, nr, sizeof(char *), 0);
    t->storage_names = regions_names_copy(storage_names, ns, sizeof(char *), 0);
    if (t->view_names == NULL || t->storage_names == NULL) {
        status = error_no_memory("the peer's table");
        goto out;
    }
    status = regions_number(t);
    if (status != KVX_OK)
        goto out;
    md->regions = t;
    t           = NULL;

out:
    kvx_regions_destroy(t);
    names_free(region_names, nr);
    names_free(storage_names, ns);
    return status;
}

/* Phase two: the body, after the envelope passed. */
static kvx_status_t body_check(const Kvx__AgentMetadata *body, const Kvx__Envelope *env,
                               kvx_transfer_mode_t mode)
{
    if (body->wire_version != KVX_WIRE_VERSION)
        return error_set(KVX_ERR_INVALID,
                         "metadata: body wire version %" PRIu32 " differs from its envelope's",
                         body->wire_version);
    if (body->compat_hash.len != KVX_COMPAT_HASH_LEN ||
        memcmp(body->compat_hash.data, env->compat_hash.data, KVX_COMPAT_HASH_LEN) != 0)
        return error_set(KVX_ERR_INVALID, "metadata: body hash differs from its envelope's");
    if (body->tp_size < 1 || body->tp_size > KVX_MAX_TP || body->tp_rank >= body->tp_size)
        return error_set(KVX_ERR_INVALID,
                         "metadata: tp_rank %" PRIu32 " of tp_size %" PRIu32
                         " is not a rank of 1..%d",
                         body->tp_rank, body->tp_size, KVX_MAX_TP);
    if (body->block_size < 1 || body->block_size > INT63_MAX)
        return error_set(KVX_ERR_INVALID,
                         "metadata: block_size %" PRIu64 " is not in"
                         " 1..2^63-1",
                         body->block_size);
    if (body->mode != KVX__TRANSFER_MODE__PULL && body->mode != KVX__TRANSFER_MODE__PUSH)
        return error_set(KVX_ERR_INVALID, "metadata: mode %d is not pull or push", (int)body->mode);
    if ((body->mode == KVX__TRANSFER_MODE__PUSH) != (mode == KVX_MODE_PUSH))
        return error_set(KVX_ERR_INVALID, "metadata: the body's mode differs from the mode its"
                                          " envelope was hashed with");
    if (body->n_regions < 1 || body->n_regions > KVX_MAX_VIEWS)
        return error_set(KVX_ERR_INVALID, "metadata: %zu regions is not in 1..%d", body->n_regions,
                         KVX_MAX_VIEWS);
    if (body->n_registrations < 1 || body->n_registrations > KVX_MAX_STORAGES)
        return error_set(KVX_ERR_INVALID, "metadata: %zu registrations is not in 1..%d",
                         body->n_registrations, KVX_MAX_STORAGES);
    return KVX_OK;
}

/* The peer's TCP segment sizes, or UCX's defaults for a peer that states none (an older kvx,
 * which may well have used tcp with them). */
static kvx_status_t tcp_segments_copy(const Kvx__AgentMetadata *body, kvx_metadata_t *md)
{
    const Kvx__TcpSegments *seg = body->tcp_segments;
    kvx_status_t status;

    md->tcp_segments_stated = seg != NULL;
    md->tcp_tx_seg_size     = seg != NULL ? seg->tx : WIRE_UCX_TCP_TX_DEFAULT;
    md->tcp_rx_seg_size     = seg != NULL ? seg->rx : WIRE_UCX_TCP_RX_DEFAULT;
    if (seg != NULL &&
        (status = wire_tcp_segments_check(seg->tx, seg->rx, "metadata: tcp_segments")) != KVX_OK)
        return status;
    return KVX_OK;
}

kvx_status_t kvx_metadata_unpack(const void *buf, size_t size, const kvx_regions_t *local,
                                 kvx_transfer_mode_t mode, kvx_metadata_t **metadata_p)
{
    Kvx__Envelope *env       = NULL;
    Kvx__AgentMetadata *body = NULL;
    kvx_metadata_t *md       = NULL;
    kvx_status_t status;

    if (buf == NULL || local == NULL || metadata_p == NULL)
        return error_set(KVX_ERR_INVALID, "metadata: bytes, local table and result are"
                                          " required");
    if (size > KVX_MAX_METADATA_SIZE)
        return error_set(KVX_ERR_INVALID, "metadata: %zu bytes is more than the %u accepted", size,
                         KVX_MAX_METADATA_SIZE);
    env = kvx__envelope__unpack(NULL, size, buf);
    if (env == NULL)
        return error_set(KVX_ERR_INVALID, "metadata: %zu bytes are not a kvx envelope", size);
    status = envelope_check(env, local, mode);
    if (status != KVX_OK)
        goto out;
    body = kvx__agent_metadata__unpack(NULL, env->body.len, env->body.data);
    if (body == NULL) {
        status = error_set(KVX_ERR_INVALID,
                           "metadata: the body (%zu bytes) is not a kvx agent"
                           " metadata message",
                           env->body.len);
        goto out;
    }
    status = body_check(body, env, mode);
    if (status != KVX_OK)
        goto out;
    md = calloc(1, sizeof(*md));
    if (md == NULL) {
        status = error_no_memory("metadata");
        goto out;
    }
    md->tp_rank    = body->tp_rank;
    md->tp_size    = body->tp_size;
    md->block_size = body->block_size;
    md->mode       = body->mode == KVX__TRANSFER_MODE__PUSH ? KVX_MODE_PUSH : KVX_MODE_PULL;
    /* any number: the sender uses the lower of it and its own; absent is an older kvx's 2 */
    md->done_version = body->done_version != 0 ? body->done_version : 2;
    md->push_messages = body->push_messages;
    md->done_messages = body->done_messages;
    if ((status = name_copy(&body->engine_id, "engine_id", true, &md->engine_id)) != KVX_OK ||
        (status = name_copy(&body->agent_name, "agent_name", true, &md->agent_name)) != KVX_OK ||
        (status = blob_copy(&body->transport_address, "transport_address", &md->transport_address,
                            &md->transport_address_size)) != KVX_OK ||
        (status = table_build(body, md)) != KVX_OK ||
        (status = tcp_segments_copy(body, md)) != KVX_OK)
        goto out;
    *metadata_p = md;
    md          = NULL;

out:
    kvx_metadata_destroy(md);
    kvx__agent_metadata__free_unpacked(body, NULL);
    kvx__envelope__free_unpacked(env, NULL);
    return status;
}

void kvx_metadata_get_info(const kvx_metadata_t *md, kvx_metadata_info_t *info_p)
{
    *info_p = (kvx_metadata_info_t){
        .engine_id         = md->engine_id,
        .agent_name        = md->agent_name,
        .tp_rank           = md->tp_rank,
        .tp_size           = md->tp_size,
        .block_size        = md->block_size,
        .mode              = md->mode,
        .num_registrations = md->num_registrations,
        .transport_address = {md->transport_address, md->transport_address_size},
    };
}

kvx_status_t kvx_metadata_registration(const kvx_metadata_t *md, size_t index,
                                       kvx_registration_info_t *info_p)
{
    const struct registration_copy *r;

    if (index >= md->num_registrations)
        return error_set(KVX_ERR_OUT_OF_RANGE, "registration %zu: the peer has %zu", index,
                         md->num_registrations);
    r       = &md->registrations[index];
    *info_p = (kvx_registration_info_t){
        .storage    = md->regions->storage_names[index],
        .base       = r->base,
        .size       = r->size,
        .mem        = r->mem,
        .device     = r->device,
        .remote_key = {r->remote_key, r->remote_key_size},
    };
    return KVX_OK;
}

const kvx_regions_t *kvx_metadata_regions(const kvx_metadata_t *md)
{
    return md->regions;
}

/* wire.c: agent metadata on the wire (proto/kvx.proto): the compatibility hash, packing, and
 * the two-phase decode of a peer's bytes, each count and length checked before use. */
#include "wire.h"

#include "error.h"

#include "kvx.pb-c.h"

#include <openssl/evp.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The factors of `regions` (docs/wire.md): strings point into the table's model. */
void wire_factors_fill(const kvx_regions_t *regions, kvx_transfer_mode_t mode,
                       Kvx__CompatFactors *f)
{
    const kvx_model_t *m = kvx_regions_model(regions);

    kvx__compat_factors__init(f);
    f->wire_version   = KVX_WIRE_VERSION;
    f->model_id       = (char *)(m != NULL ? m->id : "");
    f->model_revision = (char *)(m != NULL ? m->revision : "");
    f->dtype          = (char *)(m != NULL ? m->dtype : "");
    f->cache_dtype    = (char *)(m != NULL ? m->cache_dtype : "");
    f->kv_heads       = m != NULL ? m->kv_heads : 0;
    f->head_size      = m != NULL ? m->head_size : 0;
    f->layers         = m != NULL ? m->layers : 0;
    f->backend        = (char *)(m != NULL ? m->backend : "");
    f->mode           = mode == KVX_MODE_PUSH ? KVX__TRANSFER_MODE__PUSH : KVX__TRANSFER_MODE__PULL;
}

/* SHA-256 of the canonical encoding: "kvx-compat" and then, for every factor in a fixed
 * order, its name and its value as text, each followed by a NUL byte. Factors hold no NUL,
 * so the encoding is unambiguous, and it does not depend on protobuf's byte layout. */
kvx_status_t wire_factors_hash(const Kvx__CompatFactors *f, uint8_t hash[KVX_COMPAT_HASH_LEN])
{
    char numbers[5][24];
    const char *pairs[][2] = {
        {"wire_version", numbers[0]},
        {"model_id", f->model_id},
        {"model_revision", f->model_revision},
        {"dtype", f->dtype},
        {"cache_dtype", f->cache_dtype},
        {"kv_heads", numbers[1]},
        {"head_size", numbers[2]},
        {"layers", numbers[3]},
        {"backend", f->backend},
        {"mode", numbers[4]},
    };
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok         = ctx != NULL && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;

    snprintf(numbers[0], sizeof(numbers[0]), "%" PRIu32, f->wire_version);
    snprintf(numbers[1], sizeof(numbers[1]), "%" PRIu64, f->kv_heads);
    snprintf(numbers[2], sizeof(numbers[2]), "%" PRIu64, f->head_size);
    snprintf(numbers[3], sizeof(numbers[3]), "%" PRIu64, f->layers);
    snprintf(numbers[4], sizeof(numbers[4]), "%s",
             f->mode == KVX__TRANSFER_MODE__PUSH ? "push" : "pull");
    ok = ok && EVP_DigestUpdate(ctx, "kvx-compat", sizeof("kvx-compat")) == 1;
    for (size_t i = 0; ok && i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        const char *value = pairs[i][1] != NULL ? pairs[i][1] : "";

        ok = EVP_DigestUpdate(ctx, pairs[i][0], strlen(pairs[i][0]) + 1) == 1 &&
             EVP_DigestUpdate(ctx, value, strlen(value) + 1) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(ctx, hash, NULL) == 1;
    EVP_MD_CTX_free(ctx);
    return ok ? KVX_OK : error_set(KVX_ERR_INTERNAL, "compat hash: SHA-256 failed in libcrypto");
}

kvx_status_t kvx_compat_hash(const kvx_regions_t *regions, kvx_transfer_mode_t mode,
                             uint8_t hash[KVX_COMPAT_HASH_LEN])
{
    Kvx__CompatFactors f;

    if (regions == NULL || hash == NULL)
        return error_set(KVX_ERR_INVALID, "compat hash: table and output are required");
    wire_factors_fill(regions, mode, &f);
    return wire_factors_hash(&f, hash);
}

static ProtobufCBinaryData text_bytes(const char *text)
{
    return (ProtobufCBinaryData){strlen(text), (uint8_t *)text};
}

/* The body: everything but the envelope's fields. Pointers refer to `regions` and params;
 * the arrays are freed by the caller. */
static kvx_status_t body_fill(const kvx_regions_t *t, const kvx_metadata_params_t *p,
                              Kvx__AgentMetadata *md, Kvx__Region *regions,
                              Kvx__Region **region_ptrs, Kvx__Registration *regs,
                              Kvx__Registration **reg_ptrs)
{
    uint64_t mask = p != NULL ? p->field_mask : 0;

    md->engine_id = text_bytes((mask & KVX_METADATA_PARAM_FIELD_ENGINE_ID) ? p->engine_id : "");
    md->agent_name =
        text_bytes((mask & KVX_METADATA_PARAM_FIELD_AGENT_NAME) ? p->agent_name : "kvx");
    md->tp_rank    = (mask & KVX_METADATA_PARAM_FIELD_TP_RANK) ? p->tp_rank : 0;
    md->tp_size    = (mask & KVX_METADATA_PARAM_FIELD_TP_SIZE) ? p->tp_size : 1;
    md->block_size = t->block_size;
    md->done_version = WIRE_DONE_VERSION;
    md->push_messages = true;
    md->done_messages = true;
    for (size_t s = 0; s < t->num_storages; s++) {
        kvx__registration__init(&regs[s]);
        regs[s].storage = text_bytes(t->storage_names[s]);
        regs[s].address = (mask & KVX_METADATA_PARAM_FIELD_STORAGE_BASES) ? p->storage_bases[s] : 0;
        regs[s].size    = t->storage_sizes[s];
        regs[s].mem =
            t->storage_mems[s] == KVX_MEM_VRAM ? KVX__MEM_TYPE__VRAM : KVX__MEM_TYPE__DRAM;
        regs[s].device = t->storage_devices[s];
        if (mask & KVX_METADATA_PARAM_FIELD_REMOTE_KEYS) {
            if (p->remote_keys[s].size > KVX_MAX_BLOB_SIZE)
                return error_set(KVX_ERR_INVALID, "remote_keys[%zu]: %zu bytes is more than %d", s,
                                 p->remote_keys[s].size, KVX_MAX_BLOB_SIZE);
            regs[s].remote_key =
                (ProtobufCBinaryData){p->remote_keys[s].size, (uint8_t *)p->remote_keys[s].data};
        }
        reg_ptrs[s] = &regs[s];
    }
    for (size_t i = 0; i < t->num_regions; i++) {
        const struct region *r = &t->regions[i];
        Kvx__Region *w         = &regions[i];

        kvx__region__init(w);
        w->name        = text_bytes(regions_region_name(t, r));
        w->storage     = r->storage;
        w->offset      = r->offset;
        w->block_len   = r->block_len;
        w->stride      = r->stride;
        w->num_blocks  = r->num_blocks;
        w->group       = r->group;
        w->mla         = r->mla;
        w->packed_row  = r->packed_row;
        w->scratch     = r->scratch;
        w->ssm         = r->ssm;
        w->ple         = r->ple;
        w->head_split  = r->head_split;
        w->heads       = r->heads;
        w->address     = regs[r->storage].address + r->offset;
        w->mem         = regs[r->storage].mem;
        w->device      = regs[r->storage].device;
        region_ptrs[i] = w;
    }
    md->n_regions       = t->num_regions;
    md->regions         = region_ptrs;
    md->n_registrations = t->num_storages;
    md->registrations   = reg_ptrs;
    if (mask & KVX_METADATA_PARAM_FIELD_TRANSPORT_ADDRESS) {
        if (p->transport_address.size > KVX_MAX_BLOB_SIZE)
            return error_set(KVX_ERR_INVALID, "transport_address: %zu bytes is more than %d",
                             p->transport_address.size, KVX_MAX_BLOB_SIZE);
        md->transport_address =
            (ProtobufCBinaryData){p->transport_address.size, (uint8_t *)p->transport_address.data};
    }
    return KVX_OK;
}

kvx_status_t kvx_metadata_pack(const kvx_regions_t *t, const kvx_metadata_params_t *p, void **buf_p,
                               size_t *size_p)
{
    const uint64_t known =
        KVX_METADATA_PARAM_FIELD_ENGINE_ID | KVX_METADATA_PARAM_FIELD_AGENT_NAME |
        KVX_METADATA_PARAM_FIELD_TP_RANK | KVX_METADATA_PARAM_FIELD_TP_SIZE |
        KVX_METADATA_PARAM_FIELD_MODE | KVX_METADATA_PARAM_FIELD_STORAGE_BASES |
        KVX_METADATA_PARAM_FIELD_REMOTE_KEYS | KVX_METADATA_PARAM_FIELD_TRANSPORT_ADDRESS |
        KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS;
    uint64_t mask             = p != NULL ? p->field_mask : 0;
    kvx_transfer_mode_t mode  = (mask & KVX_METADATA_PARAM_FIELD_MODE) ? p->mode : KVX_MODE_PULL;
    Kvx__AgentMetadata md     = KVX__AGENT_METADATA__INIT;
    Kvx__Envelope envelope    = KVX__ENVELOPE__INIT;
    Kvx__TcpSegments segments = KVX__TCP_SEGMENTS__INIT;
    Kvx__CompatFactors factors;
    uint8_t hash[KVX_COMPAT_HASH_LEN];
    Kvx__Region *regions         = calloc(t->num_regions, sizeof(*regions));
    Kvx__Region **region_ptrs    = calloc(t->num_regions, sizeof(*region_ptrs));
    Kvx__Registration *regs      = calloc(t->num_storages, sizeof(*regs));
    Kvx__Registration **reg_ptrs = calloc(t->num_storages, sizeof(*reg_ptrs));
    uint8_t *body                = NULL;
    uint8_t *out                 = NULL;
    kvx_status_t status;
    size_t size;

    if ((mask & ~known) != 0) {
        status = error_set(KVX_ERR_INVALID, "metadata params: unknown field bits 0x%" PRIx64,
                           mask & ~known);
        goto out;
    }
    if (p != NULL && (((mask & KVX_METADATA_PARAM_FIELD_ENGINE_ID) &&
                       (p->engine_id == NULL || strlen(p->engine_id) > KVX_MAX_NAME_LEN)) ||
                      ((mask & KVX_METADATA_PARAM_FIELD_AGENT_NAME) &&
                       (p->agent_name == NULL || strlen(p->agent_name) > KVX_MAX_NAME_LEN)) ||
                      ((mask & KVX_METADATA_PARAM_FIELD_MODE) && p->mode != KVX_MODE_PULL &&
                       p->mode != KVX_MODE_PUSH))) {
        status = error_set(KVX_ERR_INVALID,
                           "metadata params: engine_id and agent_name must be"
                           " set and at most %d bytes, mode pull or push",
                           KVX_MAX_NAME_LEN);
        goto out;
    }
    {
        uint32_t rank    = (mask & KVX_METADATA_PARAM_FIELD_TP_RANK) ? p->tp_rank : 0;
        uint32_t tp_size = (mask & KVX_METADATA_PARAM_FIELD_TP_SIZE) ? p->tp_size : 1;

        if (tp_size < 1 || tp_size > KVX_MAX_TP || rank >= tp_size) {
            status = error_set(KVX_ERR_INVALID,
                               "metadata params: tp_rank %" PRIu32 " of tp_size %" PRIu32
                               " is not a rank of 1..%d",
                               rank, tp_size, KVX_MAX_TP);
            goto out;
        }
    }
    if (mask & KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS) {
        status = wire_tcp_segments_check(p->tcp_tx_seg_size, p->tcp_rx_seg_size,
                                         "metadata params: tcp segments");
        if (status != KVX_OK)
            goto out;
        segments.tx     = p->tcp_tx_seg_size;
        segments.rx     = p->tcp_rx_seg_size;
        md.tcp_segments = &segments;
    }
    if (regions == NULL || region_ptrs == NULL || regs == NULL || reg_ptrs == NULL) {
        status = error_no_memory("metadata");
        goto out;
    }
    wire_factors_fill(t, mode, &factors);
    status = wire_factors_hash(&factors, hash);
    if (status != KVX_OK)
        goto out;
    md.wire_version = KVX_WIRE_VERSION;
    md.mode         = factors.mode;
    md.factors      = &factors;
    md.compat_hash  = (ProtobufCBinaryData){KVX_COMPAT_HASH_LEN, hash};
    status          = body_fill(t, p, &md, regions, region_ptrs, regs, reg_ptrs);
    if (status != KVX_OK)
        goto out;

    size = kvx__agent_metadata__get_packed_size(&md);
    body = malloc(size > 0 ? size : 1);
    if (body == NULL) {
        status = error_no_memory("metadata");
        goto out;
    }
    kvx__agent_metadata__pack(&md, body);
    envelope.wire_version = KVX_WIRE_VERSION;
    envelope.compat_hash  = md.compat_hash;
    envelope.factors      = &factors;
    envelope.body         = (ProtobufCBinaryData){size, body};
    size                  = kvx__envelope__get_packed_size(&envelope);
    if (size > KVX_MAX_METADATA_SIZE) {
        status = error_set(KVX_ERR_INVALID,
                           "metadata: %zu bytes is more than the %u a peer"
                           " accepts",
                           size, KVX_MAX_METADATA_SIZE);
        goto out;
    }
    out = malloc(size);
    if (out == NULL) {
        status = error_no_memory("metadata");
        goto out;
    }
    kvx__envelope__pack(&envelope, out);
    *buf_p  = out;
    *size_p = size;
    out     = NULL;

out:
    free(out);
    free(body);
    free(regions);
    free(region_ptrs);
    free(regs);
    free(reg_ptrs);
    return status;
}

kvx_status_t wire_metadata_readdress(const void *buf, size_t size, const void *address,
                                     size_t address_size, void **buf_p, size_t *size_p)
{
    Kvx__Envelope *env       = kvx__envelope__unpack(NULL, size, buf);
    Kvx__AgentMetadata *body = env != NULL ? kvx__agent_metadata__unpack(NULL, env->body.len,
                                                                         env->body.data)
                                           : NULL;
    ProtobufCBinaryData own_body;
    ProtobufCBinaryData own_address = {0, NULL};
    kvx_status_t status = KVX_OK;
    uint8_t *packed     = NULL;
    uint8_t *out        = NULL;
    size_t body_size;

    if (body == NULL) {
        status = error_set(KVX_ERR_INTERNAL, "metadata: our own bytes do not decode");
        goto out;
    }
    own_address             = body->transport_address;
    body->transport_address = (ProtobufCBinaryData){address_size, (uint8_t *)address};
    body_size               = kvx__agent_metadata__get_packed_size(body);
    packed                  = malloc(body_size > 0 ? body_size : 1);
    if (packed == NULL) {
        status = error_no_memory("metadata");
        goto out;
    }
    kvx__agent_metadata__pack(body, packed);
    own_body  = env->body;
    env->body = (ProtobufCBinaryData){body_size, packed};
    size      = kvx__envelope__get_packed_size(env);
    out       = malloc(size);
    if (out != NULL)
        kvx__envelope__pack(env, out);
    env->body = own_body; /* freed by the unpacker's own free */
    if (out == NULL) {
        status = error_no_memory("metadata");
        goto out;
    }
    *buf_p  = out;
    *size_p = size;

out:
    free(packed);
    if (body != NULL) {
        body->transport_address = own_address; /* the unpacker's, freed with it */
        kvx__agent_metadata__free_unpacked(body, NULL);
    }
    if (env != NULL)
        kvx__envelope__free_unpacked(env, NULL);
    return status;
}

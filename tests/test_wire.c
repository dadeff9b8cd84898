/* test_wire.c: the handshake metadata of kvx.h "Wire": every field through pack and unpack,
 * the compatibility hash, each kind of mismatch with its exact message, remote-table
 * validation, the TCP segment sizes each side states and their check (issue 22 finding 8),
 * and hostile bytes (truncations, bit flips, limits). Peers that break a rule are
 * written by hand, field by field as proto/kvx.proto numbers them, so no generated code is
 * needed here; a_hand_written_peer_packs_the_same_bytes proves the writer matches pack. */
#include "layouts.h"
#include "regions.h" /* white-box: a hand-written peer copies head_split, which kvx.h hides */
#include "wire.h"    /* white-box: the peer's TCP segments, which kvx.h does not show */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128; /* region ends of 63-bit fields never overflow it */

/* Every kind of region: attn and swa (head-split), a packed MLA row, a group -1 alias,
 * scratch, mamba (ssm) and ple, over four storages with distinct memory and devices. */
#define ROUND_TRIP_LAYOUT                                                                          \
    "{'kvx_layout': 1, 'block_size': 16,"                                                          \
    " 'model': {'id': 'org/model-a', 'revision': 'r1', 'dtype': 'bfloat16',"                       \
    " 'cache_dtype': 'fp8_e4m3', 'kv_heads': 8, 'head_size': 128, 'layers': 4,"                    \
    " 'backend': 'FLASH_ATTN'},"                                                                   \
    " 'storages': [{'name': 'kv', 'size': 65536, 'mem': 'vram', 'device': 1},"                     \
    " {'name': 'latent', 'size': 4096, 'mem': 'vram', 'device': 3},"                               \
    " {'name': 'shared', 'size': 256}, {'name': 'state', 'size': 8192, 'mem': 'dram'}],"           \
    " 'views': ["                                                                                  \
    "{'name': 'layers.0.attn', 'kind': 'attn', 'storage': 'kv', 'page': 1024, 'stride': 1024,"     \
    " 'num_blocks': 32, 'heads': 4},"                                                              \
    "{'name': 'layers.0.swa', 'kind': 'swa', 'storage': 'kv', 'offset': 32768, 'page': 512,"       \
    " 'stride': 512, 'num_blocks': 64, 'heads': 2},"                                               \
    "{'name': 'layers.1.mla', 'kind': 'mla', 'storage': 'latent', 'page': 24, 'stride': 64,"       \
    " 'num_blocks': 64, 'dense': false},"                                                          \
    "{'name': 'layers.2.a', 'kind': 'mla', 'group': 0, 'storage': 'shared', 'page': 32,"           \
    " 'stride': 64, 'num_blocks': 4},"                                                             \
    "{'name': 'layers.2.b', 'kind': 'mla', 'group': 1, 'storage': 'shared', 'page': 32,"           \
    " 'stride': 64, 'num_blocks': 4},"                                                             \
    "{'name': 'layers.3.ple', 'kind': 'ple', 'storage': 'state', 'page': 256, 'stride': 256,"      \
    " 'num_blocks': 8, 'group': 2},"                                                               \
    "{'name': 'layers.3.compressor', 'kind': 'scratch', 'storage': 'state', 'offset': 2048,"       \
    " 'page': 128, 'stride': 256, 'num_blocks': 8, 'group': 2},"                                   \
    "{'name': 'layers.3.mamba', 'kind': 'mamba', 'storage': 'state', 'offset': 4096,"              \
    " 'page': 512, 'stride': 512, 'num_blocks': 8, 'group': 3}]}"

/* One storage and one view: the table behind the factor tests, where only the model counts. */
#define SMALL_LAYOUT                                                                               \
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 4096}], 'views': [{'name': 'l',"        \
    " 'kind': 'attn', 'storage': 'kv', 'page': 256, 'stride': 256, 'num_blocks': 16}]}"

/* ROUND_TRIP_LAYOUT's model, as the factor tests start from it. */
static const kvx_model_t model_a = {"org/model-a", "r1", "bfloat16",  "fp8_e4m3", 8,
                                    128,           4,    "FLASH_ATTN"};

/* The SHA-256 of model_a's factors in pull mode: changes only with the canonical encoding. */
#define MODEL_A_HASH "df6fbbb141920e5adb9c0cde667d6b20c3b430c6c8b19667a911080c936aa5f0"

static char filler[KVX_MAX_BLOB_SIZE + 1]; /* 'x' bytes for over-long names and blobs */

static kvx_regions_t *table_with_model(const char *quoted, const kvx_model_t *model)
{
    kvx_layout_t *layout = NULL;
    kvx_regions_t *table = NULL;

    if (layout_from_quoted(quoted, &layout) != KVX_OK)
        fail_msg("layout rejected: %s", kvx_errmsg());
    if (model != NULL)
        assert_int_equal(kvx_layout_set_model(layout, model), KVX_OK);
    if (kvx_regions_register(layout, &table) != KVX_OK)
        fail_msg("layout not registered: %s", kvx_errmsg());
    kvx_layout_destroy(layout);
    return table;
}

static kvx_regions_t *table_load(const char *quoted)
{
    return table_with_model(quoted, NULL);
}

static void hash_hex(const kvx_regions_t *t, kvx_transfer_mode_t mode, char hex[65])
{
    uint8_t hash[KVX_COMPAT_HASH_LEN];

    assert_int_equal(kvx_compat_hash(t, mode, hash), KVX_OK);
    for (size_t i = 0; i < KVX_COMPAT_HASH_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", hash[i]);
}

/* Unpacks bytes that must fail: KVX_ERR_INVALID, exactly `msg`, and no output written. */
static void unpack_rejects(const char *rule, const void *buf, size_t size,
                           const kvx_regions_t *local, kvx_transfer_mode_t mode, const char *msg)
{
    static char untouched;
    kvx_metadata_t *md  = (kvx_metadata_t *)(void *)&untouched;
    kvx_status_t status = kvx_metadata_unpack(buf, size, local, mode, &md);

    if (status != KVX_ERR_INVALID || md != (kvx_metadata_t *)(void *)&untouched ||
        (msg != NULL && strcmp(kvx_errmsg(), msg) != 0) || kvx_errmsg()[0] == '\0')
        fail_msg("%s: status %d, message \"%s\"; expected \"%s\"", rule, status, kvx_errmsg(),
                 msg != NULL ? msg : "(any)");
}

static kvx_metadata_t *unpack_ok(const char *rule, const void *buf, size_t size,
                                 const kvx_regions_t *local, kvx_transfer_mode_t mode)
{
    kvx_metadata_t *md = NULL;

    if (kvx_metadata_unpack(buf, size, local, mode, &md) != KVX_OK)
        fail_msg("%s: rejected: %s", rule, kvx_errmsg());
    return md;
}

/* Everything kvx.h promises of decoded metadata: limits, a numbered table whose every block
 * lies inside its registration, and a validation whose status agrees with its count. */
static void metadata_check(kvx_metadata_t *md, const kvx_regions_t *local)
{
    const kvx_regions_t *t = kvx_metadata_regions(md);
    kvx_metadata_info_t info;
    kvx_registration_info_t reg;
    kvx_region_info_t r;
    uint64_t next = 0;
    size_t count;
    kvx_status_t status;

    kvx_metadata_get_info(md, &info);
    assert_true(strlen(info.engine_id) <= KVX_MAX_NAME_LEN);
    assert_true(strlen(info.agent_name) <= KVX_MAX_NAME_LEN);
    assert_true(info.tp_size >= 1 && info.tp_size <= KVX_MAX_TP && info.tp_rank < info.tp_size);
    assert_true(info.block_size >= 1 && info.block_size <= (uint64_t)INT64_MAX);
    assert_true(info.transport_address.size <= KVX_MAX_BLOB_SIZE);
    assert_true(info.num_registrations >= 1 && info.num_registrations <= KVX_MAX_STORAGES);
    assert_int_equal(info.num_registrations, kvx_regions_num_storages(t));
    assert_int_equal(kvx_metadata_registration(md, info.num_registrations, &reg),
                     KVX_ERR_OUT_OF_RANGE);
    for (size_t s = 0; s < info.num_registrations; s++) {
        assert_int_equal(kvx_metadata_registration(md, s, &reg), KVX_OK);
        assert_true(reg.storage[0] != '\0' && strlen(reg.storage) <= KVX_MAX_NAME_LEN);
        assert_string_equal(reg.storage, kvx_regions_storage_name(t, s));
        assert_true(reg.size >= 1 && reg.remote_key.size <= KVX_MAX_BLOB_SIZE);
    }
    assert_true(kvx_regions_count(t) >= 1 && kvx_regions_count(t) <= KVX_MAX_VIEWS);
    for (size_t i = 0; i < kvx_regions_count(t); i++) {
        assert_int_equal(kvx_regions_get(t, i, &r), KVX_OK);
        assert_true(r.name[0] != '\0' && r.num_members == 1 && r.members[0] == i);
        assert_true(r.first_descriptor == next && r.storage < info.num_registrations);
        assert_int_equal(kvx_metadata_registration(md, r.storage, &reg), KVX_OK);
        assert_true(r.block_len >= 1 && r.num_blocks >= 1 && r.group >= -1);
        assert_true((u128)r.offset + (u128)(r.num_blocks - 1) * r.stride + r.block_len <= reg.size);
        next += r.num_blocks;
    }
    assert_true(kvx_regions_num_descriptors(t) == next);
    status = kvx_metadata_validate(md, local, NULL, &count);
    assert_int_equal(status, count == 0 ? KVX_OK : KVX_ERR_INVALID);
    for (size_t i = 0; i < count && i < KVX_MAX_DIFFERENCES; i++)
        assert_non_null(kvx_metadata_difference(md, i));
    assert_null(
        kvx_metadata_difference(md, count < KVX_MAX_DIFFERENCES ? count : KVX_MAX_DIFFERENCES));
}

/* ---------------------------------------------------------------------------------------
 * A hand-written peer: what kvx_metadata_pack would send, field by field in number order
 * with zero values left out (as protobuf-c packs proto3), except for a list of changes, so
 * any field can carry a value kvx itself would never send.
 * ------------------------------------------------------------------------------------- */

struct pb {
    uint8_t *data;
    size_t len; /* bytes written */
    size_t cap; /* bytes allocated */
};

static void pb_raw(struct pb *b, const void *data, size_t len)
{
    if (b->len + len > b->cap) {
        b->cap  = b->len + len > 2 * b->cap ? b->len + len + 256 : 2 * b->cap;
        b->data = realloc(b->data, b->cap);
        assert_non_null(b->data);
    }
    if (len > 0)
        memcpy(b->data + b->len, data, len);
    b->len += len;
}

static void pb_varint(struct pb *b, uint64_t v)
{
    do {
        uint8_t byte = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));

        pb_raw(b, &byte, 1);
        v >>= 7;
    } while (v != 0);
}

static void pb_uint(struct pb *b, uint32_t field, uint64_t v)
{
    if (v != 0) {
        pb_varint(b, (uint64_t)field << 3);
        pb_varint(b, v);
    }
}

static void pb_bytes(struct pb *b, uint32_t field, const void *data, size_t len, bool always)
{
    if (len != 0 || always) {
        pb_varint(b, (uint64_t)field << 3 | 2);
        pb_varint(b, len);
        pb_raw(b, data, len);
    }
}

static void pb_text(struct pb *b, uint32_t field, const char *text)
{
    pb_bytes(b, field, text, text != NULL ? strlen(text) : 0, false);
}

/* Moves `inner` into `b` as message field `field` (present, even when empty). */
static void pb_message(struct pb *b, uint32_t field, struct pb *inner)
{
    pb_bytes(b, field, inner->data, inner->len, true);
    free(inner->data);
    *inner = (struct pb){0};
}

/* What a change sets; `index` picks the region or registration. Text fields take a length
 * of 'x' bytes, TEXT_NUL ("kv\0x"), TEXT_ESC, TEXT_BAD or TEXT_OTHER ("layers.9.other"). */
enum peer_field {
    END,
    ENV_VERSION,
    ENV_HASH_LEN,
    ENV_HASH_FLIP,
    ENV_NO_FACTORS,
    BODY_VERSION,
    BODY_HASH_FLIP,
    ENGINE_ID,
    AGENT_NAME,
    TP_RANK,
    TP_SIZE,
    BLOCK_SIZE,
    MODE,
    NUM_REGIONS,
    NUM_REGISTRATIONS,
    TRANSPORT,
    REG_NAME,
    REG_SIZE,
    REG_MEM,
    REG_DEVICE,
    REG_KEY,
    REGION_NAME,
    REGION_STORAGE,
    REGION_OFFSET,
    REGION_BLOCK_LEN,
    REGION_STRIDE,
    REGION_NUM_BLOCKS,
    REGION_GROUP,
    REGION_MLA,
    REGION_PLE,
    REGION_HEADS,
    REGION_HEAD_SPLIT,
    ALL_BLOCK_LEN_DIV,
    ALL_GROUPS,
    SEG_TX, /* TcpSegments.tx: the message is sent when either of these is changed */
    SEG_RX,
    DONE_VERSION, /* AgentMetadata.done_version */
    PUSH_MESSAGES, /* AgentMetadata.push_messages */
    DONE_MESSAGES, /* AgentMetadata.done_messages */
    LOCAL_TP,     /* not sent: the local side's validation setting */
    LOCAL_BLOCK_SIZE
};

#define TEXT_SAME  UINT64_MAX
#define TEXT_NUL   (UINT64_MAX - 1)
#define TEXT_OTHER (UINT64_MAX - 2)
#define TEXT_ESC   (UINT64_MAX - 3) /* "kv\x1b[2J": a terminal's escape */
#define TEXT_BAD   (UINT64_MAX - 4) /* "kv\xff": not UTF-8 */
#define TWO63      ((uint64_t)1 << 63)
#define NEG(x)     ((uint64_t)(int64_t)(x)) /* a negative value, as a change carries it */

/* Recurring message tails. */
#define SANE_COUNTS  "block_len, stride, num_blocks and heads must be in 1..2^63-1"
#define SANE         SANE_COUNTS " and offset below 2^63"
#define SAME_REGIONS "both sides register the same regions"
#define SAME_GROUP   "a region takes the same group's block ids on both sides"
#define SAME_KIND    "the same kind of region on both sides"
#define STRIDE_512   "stride: remote 512 is smaller than its block_len 1024: stride >= block_len"
#define TP_2_3       "tp: local 2, remote 3: one TP size must divide the other"
#define WHOLE        "the local block must hold a whole number of remote blocks"

struct peer_change {
    enum peer_field field;
    size_t index;
    uint64_t value;
};

struct peer {
    const struct peer_change *changes; /* up to END or num_changes */
    size_t num_changes;
};

/* `value`, unless a change sets this field. */
static uint64_t pick(const struct peer *p, enum peer_field field, size_t index, uint64_t value)
{
    for (size_t i = 0; i < p->num_changes && p->changes[i].field != END; i++)
        if (p->changes[i].field == field && p->changes[i].index == index)
            value = p->changes[i].value;
    return value;
}

static void pick_bytes(struct pb *b, uint32_t number, const struct peer *p, enum peer_field field,
                       size_t index, const void *data, size_t len)
{
    static const char nul_text[] = "kv\0x";
    uint64_t v                   = pick(p, field, index, TEXT_SAME);

    if (v == TEXT_NUL)
        data = nul_text, len = sizeof(nul_text) - 1;
    else if (v == TEXT_ESC)
        data = "kv\x1b[2J", len = 6;
    else if (v == TEXT_BAD)
        data = "kv\xff", len = 3;
    else if (v == TEXT_OTHER)
        data = "layers.9.other", len = strlen("layers.9.other");
    else if (v != TEXT_SAME)
        data = filler, len = v;
    pb_bytes(b, number, data, len, false);
}

static void factors_write(struct pb *b, uint32_t field, const kvx_model_t *m, uint32_t mode)
{
    static const kvx_model_t none = {NULL, NULL, NULL, NULL, 0, 0, 0, NULL};
    struct pb f                   = {0};

    m = m != NULL ? m : &none;
    pb_uint(&f, 1, KVX_WIRE_VERSION);
    pb_text(&f, 2, m->id);
    pb_text(&f, 3, m->revision);
    pb_text(&f, 4, m->dtype);
    pb_text(&f, 5, m->cache_dtype);
    pb_uint(&f, 6, m->kv_heads);
    pb_uint(&f, 7, m->head_size);
    pb_uint(&f, 8, m->layers);
    pb_text(&f, 9, m->backend);
    pb_uint(&f, 10, mode);
    pb_message(b, field, &f);
}

static void region_write(struct pb *body, const struct peer *p, const kvx_regions_t *t, size_t i,
                         const uint64_t *bases)
{
    static const struct region none = {0};
    const struct region *r          = i < t->num_regions ? &t->regions[i] : &none;
    const char *name                = i < t->num_regions ? regions_region_name(t, r) : "";
    uint64_t group = pick(p, REGION_GROUP, i, pick(p, ALL_GROUPS, 0, (uint64_t)r->group));
    struct pb m    = {0};

    pick_bytes(&m, 1, p, REGION_NAME, i, name, strlen(name));
    pb_uint(&m, 2, pick(p, REGION_STORAGE, i, r->storage));
    pb_uint(&m, 3, pick(p, REGION_OFFSET, i, r->offset));
    pb_uint(&m, 4, pick(p, REGION_BLOCK_LEN, i, r->block_len / pick(p, ALL_BLOCK_LEN_DIV, 0, 1)));
    pb_uint(&m, 5, pick(p, REGION_STRIDE, i, r->stride));
    pb_uint(&m, 6, pick(p, REGION_NUM_BLOCKS, i, r->num_blocks));
    pb_uint(&m, 7, (group << 1) ^ ((int64_t)group < 0 ? UINT64_MAX : 0)); /* sint64: zigzag */
    pb_uint(&m, 8, pick(p, REGION_MLA, i, r->mla));
    pb_uint(&m, 9, r->packed_row);
    pb_uint(&m, 10, r->scratch);
    pb_uint(&m, 11, r->ssm);
    pb_uint(&m, 12, pick(p, REGION_PLE, i, r->ple));
    pb_uint(&m, 13, pick(p, REGION_HEADS, i, r->heads));
    if (i < t->num_regions) {
        pb_uint(&m, 14, bases[r->storage] + r->offset);
        pb_uint(&m, 15, t->storage_mems[r->storage] == KVX_MEM_VRAM);
        pb_uint(&m, 16, (uint64_t)t->storage_devices[r->storage]);
    }
    pb_uint(&m, 17, pick(p, REGION_HEAD_SPLIT, i, r->head_split));
    pb_message(body, 10, &m);
}

/* The bytes kvx_metadata_pack(t, params) gives, with `changes` applied; the caller frees. */
static uint8_t *peer_encode(const kvx_regions_t *t, const kvx_metadata_params_t *params,
                            const struct peer_change *changes, size_t num_changes, size_t *size_p)
{
    static const uint64_t no_bases[KVX_MAX_STORAGES + 1];
    const struct peer p      = {changes, num_changes};
    uint64_t mask            = params != NULL ? params->field_mask : 0;
    kvx_transfer_mode_t mode = (mask & KVX_METADATA_PARAM_FIELD_MODE) ? params->mode : 0;
    const uint64_t *bases =
        (mask & KVX_METADATA_PARAM_FIELD_STORAGE_BASES) ? params->storage_bases : no_bases;
    const char *engine_id = (mask & KVX_METADATA_PARAM_FIELD_ENGINE_ID) ? params->engine_id : "";
    const char *agent  = (mask & KVX_METADATA_PARAM_FIELD_AGENT_NAME) ? params->agent_name : "kvx";
    kvx_blob_t address = (mask & KVX_METADATA_PARAM_FIELD_TRANSPORT_ADDRESS)
                             ? params->transport_address
                             : (kvx_blob_t){NULL, 0};
    uint8_t hash[2][KVX_COMPAT_HASH_LEN]; /* envelope, body */
    struct pb body = {0};
    struct pb env  = {0};

    for (size_t k = 0; k < 2; k++) {
        uint64_t flip = pick(&p, k == 0 ? ENV_HASH_FLIP : BODY_HASH_FLIP, 0, KVX_COMPAT_HASH_LEN);

        assert_int_equal(kvx_compat_hash(t, mode, hash[k]), KVX_OK);
        if (flip < KVX_COMPAT_HASH_LEN)
            hash[k][flip] ^= 0x01;
    }
    pb_uint(&body, 1, pick(&p, BODY_VERSION, 0, KVX_WIRE_VERSION));
    pick_bytes(&body, 2, &p, ENGINE_ID, 0, engine_id, strlen(engine_id));
    pick_bytes(&body, 3, &p, AGENT_NAME, 0, agent, strlen(agent));
    pb_uint(&body, 4,
            pick(&p, TP_RANK, 0, (mask & KVX_METADATA_PARAM_FIELD_TP_RANK) ? params->tp_rank : 0));
    pb_uint(&body, 5,
            pick(&p, TP_SIZE, 0, (mask & KVX_METADATA_PARAM_FIELD_TP_SIZE) ? params->tp_size : 1));
    pb_uint(&body, 6, pick(&p, BLOCK_SIZE, 0, t->block_size));
    pb_uint(&body, 7, pick(&p, MODE, 0, mode));
    factors_write(&body, 8, kvx_regions_model(t), mode);
    pb_bytes(&body, 9, hash[1], KVX_COMPAT_HASH_LEN, false);
    for (size_t i = 0; i < pick(&p, NUM_REGIONS, 0, t->num_regions); i++)
        region_write(&body, &p, t, i, bases);
    for (size_t s = 0; s < pick(&p, NUM_REGISTRATIONS, 0, t->num_storages); s++) {
        bool known       = s < t->num_storages;
        const char *name = known ? t->storage_names[s] : "";
        kvx_blob_t key   = known && (mask & KVX_METADATA_PARAM_FIELD_REMOTE_KEYS)
                               ? params->remote_keys[s]
                               : (kvx_blob_t){NULL, 0};
        struct pb m      = {0};

        pick_bytes(&m, 1, &p, REG_NAME, s, name, strlen(name));
        pb_uint(&m, 2, known ? bases[s] : 0);
        pb_uint(&m, 3, pick(&p, REG_SIZE, s, known ? t->storage_sizes[s] : 0));
        pb_uint(&m, 4, pick(&p, REG_MEM, s, known && t->storage_mems[s] == KVX_MEM_VRAM));
        pb_uint(&m, 5, pick(&p, REG_DEVICE, s, known ? (uint64_t)t->storage_devices[s] : 0));
        pick_bytes(&m, 6, &p, REG_KEY, s, key.data, key.size);
        pb_message(&body, 11, &m);
    }
    pick_bytes(&body, 12, &p, TRANSPORT, 0, address.data, address.size);
    if ((mask & KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS) || pick(&p, SEG_TX, 0, 0) != 0 ||
        pick(&p, SEG_RX, 0, 0) != 0) {
        bool stated = (mask & KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS) != 0;
        struct pb m = {0};

        pb_uint(&m, 1, pick(&p, SEG_TX, 0, stated ? params->tcp_tx_seg_size : 0));
        pb_uint(&m, 2, pick(&p, SEG_RX, 0, stated ? params->tcp_rx_seg_size : 0));
        pb_message(&body, 13, &m);
    }
    pb_uint(&body, 14, pick(&p, DONE_VERSION, 0, WIRE_DONE_VERSION));
    pb_uint(&body, 15, pick(&p, PUSH_MESSAGES, 0, 1));
    pb_uint(&body, 16, pick(&p, DONE_MESSAGES, 0, 1));

    pb_uint(&env, 1, pick(&p, ENV_VERSION, 0, KVX_WIRE_VERSION));
    pb_bytes(&env, 2, hash[0], pick(&p, ENV_HASH_LEN, 0, KVX_COMPAT_HASH_LEN), false);
    if (pick(&p, ENV_NO_FACTORS, 0, 0) == 0)
        factors_write(&env, 3, kvx_regions_model(t), mode);
    pb_bytes(&env, 4, body.data, body.len, false);
    free(body.data);
    *size_p = env.len;
    return env.data;
}

/* ---------------------------------------------------------------------------------------
 * Round trip
 * ------------------------------------------------------------------------------------- */

static const uint64_t all_bases[]  = {0x7f0000000000, 0x7f0000100000, 0x1000, 0};
static const uint8_t key_bytes[]   = {0x00, 0xff, 0x10, 0x00, 0x7f};
static const kvx_blob_t all_keys[] = {
    {"rkey-kv", 7}, {key_bytes, sizeof(key_bytes)}, {NULL, 0}, {filler, KVX_MAX_BLOB_SIZE}};
static const char transport[] = "ucx\0worker-address\xfe";

/* Every field of kvx_metadata_params_t set, push mode. */
static const kvx_metadata_params_t all_params = {
    .field_mask        = 0x1ff,
    .engine_id         = "engine-7f3a",
    .agent_name        = "prefill-3",
    .tp_rank           = 3,
    .tp_size           = 4,
    .mode              = KVX_MODE_PUSH,
    .storage_bases     = all_bases,
    .remote_keys       = all_keys,
    .transport_address = {transport, sizeof(transport)},
    .tcp_tx_seg_size   = 65536,
    .tcp_rx_seg_size   = 262144,
};

static void round_trip_keeps_every_field(void **state)
{
    kvx_regions_t *local = table_load(ROUND_TRIP_LAYOUT);
    const kvx_regions_t *remote;
    kvx_metadata_info_t info;
    kvx_registration_info_t reg;
    kvx_region_info_t l;
    kvx_region_info_t r;
    kvx_metadata_t *md;
    void *buf   = NULL;
    size_t size = 0;

    (void)state;
    assert_int_equal(kvx_metadata_pack(local, &all_params, &buf, &size), KVX_OK);
    md = unpack_ok("round trip", buf, size, local, KVX_MODE_PUSH);
    kvx_metadata_get_info(md, &info);
    assert_string_equal(info.engine_id, "engine-7f3a");
    assert_string_equal(info.agent_name, "prefill-3");
    assert_int_equal(info.tp_rank, 3);
    assert_int_equal(info.tp_size, 4);
    assert_int_equal(info.block_size, 16);
    assert_int_equal(info.mode, KVX_MODE_PUSH);
    assert_int_equal(info.num_registrations, 4);
    assert_int_equal(info.transport_address.size, sizeof(transport));
    assert_memory_equal(info.transport_address.data, transport, sizeof(transport));
    assert_true(md->tcp_segments_stated && md->tcp_tx_seg_size == 65536 &&
                md->tcp_rx_seg_size == 262144);
    for (size_t s = 0; s < 4; s++) {
        assert_int_equal(kvx_metadata_registration(md, s, &reg), KVX_OK);
        assert_string_equal(reg.storage, kvx_regions_storage_name(local, s));
        assert_int_equal(reg.base, all_bases[s]);
        assert_int_equal(reg.size, local->storage_sizes[s]);
        assert_int_equal(reg.mem, local->storage_mems[s]);
        assert_int_equal(reg.device, local->storage_devices[s]);
        assert_int_equal(reg.remote_key.size, all_keys[s].size);
        if (all_keys[s].size > 0)
            assert_memory_equal(reg.remote_key.data, all_keys[s].data, all_keys[s].size);
    }
    assert_int_equal(reg.mem, KVX_MEM_DRAM); /* the last one; the first is vram on device 1 */
    assert_int_equal(kvx_metadata_registration(md, 0, &reg), KVX_OK);
    assert_true(reg.mem == KVX_MEM_VRAM && reg.device == 1 && reg.size == 65536);

    remote = kvx_metadata_regions(md);
    assert_int_equal(kvx_regions_count(remote), kvx_regions_count(local));
    assert_int_equal(kvx_regions_count(remote), 7);
    assert_int_equal(kvx_regions_num_descriptors(remote), kvx_regions_num_descriptors(local));
    assert_int_equal(kvx_regions_block_size(remote), 16);
    assert_int_equal(kvx_regions_num_storages(remote), 4);
    for (size_t i = 0; i < kvx_regions_count(local); i++) {
        assert_int_equal(kvx_regions_get(local, i, &l), KVX_OK);
        assert_int_equal(kvx_regions_get(remote, i, &r), KVX_OK);
        assert_string_equal(r.name, l.name);
        assert_int_equal(r.storage, l.storage);
        assert_string_equal(r.storage_name, l.storage_name);
        assert_int_equal(r.offset, l.offset);
        assert_int_equal(r.block_len, l.block_len);
        assert_int_equal(r.stride, l.stride);
        assert_int_equal(r.num_blocks, l.num_blocks);
        assert_int_equal(r.first_descriptor, l.first_descriptor);
        assert_int_equal(r.group, l.group);
        assert_int_equal(r.heads, l.heads);
        assert_true(r.mla == l.mla && r.packed_row == l.packed_row && r.scratch == l.scratch &&
                    r.ssm == l.ssm && r.ple == l.ple);
        assert_int_equal(remote->regions[i].head_split, local->regions[i].head_split);
        assert_true(r.num_members == 1 && r.members[0] == i);
    }
    /* The layout covers every kind the wire carries. */
    assert_true(local->regions[0].head_split && local->regions[0].heads == 4);
    assert_true(local->regions[2].mla && local->regions[2].packed_row);
    assert_true(local->regions[3].group == -1 && local->regions[4].scratch);
    assert_true(local->regions[5].ssm && local->regions[6].ple);
    metadata_check(md, local);
    kvx_metadata_destroy(md);
    kvx_free(buf);
    kvx_regions_destroy(local);
}

static void unset_params_take_their_defaults(void **state)
{
    kvx_regions_t *local                  = table_load(ROUND_TRIP_LAYOUT);
    kvx_metadata_params_t none            = {0};
    const kvx_metadata_params_t *params[] = {NULL, &none};
    kvx_metadata_info_t info;
    kvx_registration_info_t reg;

    (void)state;
    for (size_t k = 0; k < 2; k++) {
        void *buf   = NULL;
        size_t size = 0;
        kvx_metadata_t *md;

        assert_int_equal(kvx_metadata_pack(local, params[k], &buf, &size), KVX_OK);
        md = unpack_ok("defaults", buf, size, local, KVX_MODE_PULL);
        kvx_metadata_get_info(md, &info);
        assert_string_equal(info.engine_id, "");
        assert_string_equal(info.agent_name, "kvx");
        assert_true(info.tp_rank == 0 && info.tp_size == 1 && info.mode == KVX_MODE_PULL);
        assert_int_equal(info.transport_address.size, 0);
        /* no sizes stated: UCX's defaults (tx 8 KiB, rx 64 KiB) are assumed */
        assert_true(!md->tcp_segments_stated && md->tcp_tx_seg_size == 8192 &&
                    md->tcp_rx_seg_size == 65536);
        for (size_t s = 0; s < info.num_registrations; s++) {
            assert_int_equal(kvx_metadata_registration(md, s, &reg), KVX_OK);
            assert_true(reg.base == 0 && reg.remote_key.size == 0);
        }
        kvx_metadata_destroy(md);
        kvx_free(buf);
    }
    kvx_regions_destroy(local);
}

/* The hand-written peer of the tests below is only as good as its likeness to pack. */
static void a_hand_written_peer_packs_the_same_bytes(void **state)
{
    kvx_regions_t *local                  = table_load(ROUND_TRIP_LAYOUT);
    const kvx_metadata_params_t *params[] = {NULL, &all_params};

    (void)state;
    for (size_t k = 0; k < 2; k++) {
        void *buf   = NULL;
        size_t size = 0;
        size_t written;
        uint8_t *bytes = peer_encode(local, params[k], NULL, 0, &written);

        assert_int_equal(kvx_metadata_pack(local, params[k], &buf, &size), KVX_OK);
        assert_int_equal(written, size);
        assert_memory_equal(bytes, buf, size);
        free(bytes);
        kvx_free(buf);
    }
    kvx_regions_destroy(local);
}

/* A peer states which done it reads (issue 24 item 9: a version-3 done carries the bytes
 * read); an older kvx states nothing and is sent version 2, which it parses. */
static void a_peer_states_the_done_version_it_reads(void **state)
{
    kvx_regions_t *local                = table_load(ROUND_TRIP_LAYOUT);
    const struct peer_change older[]    = {{DONE_VERSION, 0, 0}};
    const struct peer_change newer[]    = {{DONE_VERSION, 0, 7}};
    const struct peer_change *changes[] = {NULL, older, newer};
    const uint32_t expected[]           = {WIRE_DONE_VERSION, 2, 7};

    (void)state;
    for (size_t k = 0; k < 3; k++) {
        size_t size;
        uint8_t *bytes     = peer_encode(local, NULL, changes[k], changes[k] != NULL, &size);
        kvx_metadata_t *md = unpack_ok("done version", bytes, size, local, KVX_MODE_PULL);

        assert_int_equal(md->done_version, expected[k]);
        kvx_metadata_destroy(md);
        free(bytes);
    }
    kvx_regions_destroy(local);
}

/* A prefill agent states that it takes push requests and dones as data-plane messages
 * (issue 23); an older kvx states nothing, and its decode peers send them on the side
 * channel. */
static void a_peer_states_whether_it_takes_push_messages(void **state)
{
    kvx_regions_t *local                = table_load(ROUND_TRIP_LAYOUT);
    const struct peer_change no_push[]  = {{PUSH_MESSAGES, 0, 0}};
    const struct peer_change no_done[]  = {{DONE_MESSAGES, 0, 0}};
    const struct peer_change *changes[] = {NULL, no_push, no_done};
    const bool push[]                   = {true, false, true};
    const bool done[]                   = {true, true, false};
    size_t size;
    kvx_metadata_t *md;

    (void)state;
    for (size_t k = 0; k < 3; k++) {
        uint8_t *bytes = peer_encode(local, NULL, changes[k], changes[k] != NULL, &size);

        md = unpack_ok("push messages", bytes, size, local, KVX_MODE_PULL);
        assert_int_equal(md->push_messages, push[k]);
        assert_int_equal(md->done_messages, done[k]);
        kvx_metadata_destroy(md);
        free(bytes);
    }
    kvx_regions_destroy(local);
}

static void pack_rejects_bad_params_and_writes_nothing(void **state)
{
    kvx_regions_t *local              = table_load(ROUND_TRIP_LAYOUT);
    kvx_blob_t big_keys[4]            = {{NULL, 0}, {NULL, 0}, {filler, KVX_MAX_BLOB_SIZE + 1}};
    kvx_metadata_params_t unknown     = {.field_mask = 1u << 9};
    kvx_metadata_params_t no_rx       = {.field_mask      = KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS,
                                         .tcp_tx_seg_size = 8192};
    kvx_metadata_params_t huge_tx     = {.field_mask      = KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS,
                                         .tcp_tx_seg_size = KVX_MAX_TCP_SEGMENT + 1ull,
                                         .tcp_rx_seg_size = KVX_MAX_TCP_SEGMENT};
    kvx_metadata_params_t big_key     = {.field_mask  = KVX_METADATA_PARAM_FIELD_REMOTE_KEYS,
                                         .remote_keys = big_keys};
    kvx_metadata_params_t big_address = {.field_mask = KVX_METADATA_PARAM_FIELD_TRANSPORT_ADDRESS,
                                         .transport_address = {filler, KVX_MAX_BLOB_SIZE + 1}};
    const struct {
        const kvx_metadata_params_t *params;
        const char *msg;
    } cases[] = {
        {&unknown, "metadata params: unknown field bits 0x200"},
        {&no_rx, "metadata params: tcp segments: tx 8192, rx 0: each must be 1..1073741824"
                 " bytes, or both 0 (no tcp)"},
        {&huge_tx, "metadata params: tcp segments: tx 1073741825, rx 1073741824: each must be"
                   " 1..1073741824 bytes, or both 0 (no tcp)"},
        {&big_key, "remote_keys[2]: 4097 bytes is more than 4096"},
        {&big_address, "transport_address: 4097 bytes is more than 4096"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        void *buf   = (void *)filler;
        size_t size = 7;

        assert_int_equal(kvx_metadata_pack(local, cases[i].params, &buf, &size), KVX_ERR_INVALID);
        assert_string_equal(kvx_errmsg(), cases[i].msg);
        assert_true(buf == (void *)filler && size == 7);
    }
    kvx_regions_destroy(local);
}

/* ---------------------------------------------------------------------------------------
 * The compatibility hash
 * ------------------------------------------------------------------------------------- */

static void compat_hash_is_pinned(void **state)
{
    kvx_regions_t *local = table_load(ROUND_TRIP_LAYOUT);
    char hex[65];

    (void)state;
    hash_hex(local, KVX_MODE_PULL, hex);
    assert_string_equal(hex, MODEL_A_HASH);
    assert_int_equal(kvx_compat_hash(NULL, KVX_MODE_PULL, (uint8_t *)filler), KVX_ERR_INVALID);
    kvx_regions_destroy(local);
}

static void compat_hash_ignores_key_order_and_non_factor_fields(void **state)
{
    /* The model object last and its keys shuffled; other names, counts and block size. */
    kvx_regions_t *shuffled = table_load(
        "{'views': [{'num_blocks': 3, 'page': 128, 'stride': 128, 'storage': 's', 'kind': 'mla', "
        "'name': 'x'}],"
        " 'storages': [{'size': 1000, 'name': 's'}], 'block_size': 64, 'kvx_layout': 1,"
        " 'model': {'backend': 'FLASH_ATTN', 'layers': 4, 'head_size': 128, 'kv_heads': 8,"
        " 'cache_dtype': 'fp8_e4m3', 'dtype': 'bfloat16', 'revision': 'r1',"
        " 'id': 'org/model-a'}}");
    kvx_regions_t *api = table_with_model(SMALL_LAYOUT, &model_a);
    char hex[65];

    (void)state;
    hash_hex(shuffled, KVX_MODE_PULL, hex);
    assert_string_equal(hex, MODEL_A_HASH);
    hash_hex(api, KVX_MODE_PULL, hex);
    assert_string_equal(hex, MODEL_A_HASH);
    kvx_regions_destroy(shuffled);
    kvx_regions_destroy(api);
}

static const struct factor_change {
    const char *factor;
    const char *text;     /* the peer's value of a string factor */
    uint64_t number;      /* or of a count */
    const char *fragment; /* what the mismatch message says of it */
} factor_changes[] = {
    {"model_id", "org/model-b", 0, "model_id: local \"org/model-a\", remote \"org/model-b\""},
    {"model_revision", "r2", 0, "model_revision: local \"r1\", remote \"r2\""},
    {"dtype", "float16", 0, "dtype: local \"bfloat16\", remote \"float16\""},
    {"cache_dtype", "auto", 0, "cache_dtype: local \"fp8_e4m3\", remote \"auto\""},
    {"kv_heads", NULL, 16, "kv_heads: local 8, remote 16"},
    {"head_size", NULL, 64, "head_size: local 128, remote 64"},
    {"layers", NULL, 61, "layers: local 4, remote 61"},
    {"backend", "FLASHINFER", 0, "backend: local \"FLASH_ATTN\", remote \"FLASHINFER\""},
};

#define NUM_FACTOR_CHANGES (sizeof(factor_changes) / sizeof(factor_changes[0]))

/* Sets one factor of `m` by its wire name. */
static void model_set(kvx_model_t *m, const struct factor_change *c)
{
    static const char *const text_names[]   = {"model_id", "model_revision", "dtype", "cache_dtype",
                                               "backend"};
    static const char *const number_names[] = {"kv_heads", "head_size", "layers"};
    const char **texts[] = {&m->id, &m->revision, &m->dtype, &m->cache_dtype, &m->backend};
    uint64_t *numbers[]  = {&m->kv_heads, &m->head_size, &m->layers};

    for (size_t i = 0; i < 5; i++)
        if (strcmp(c->factor, text_names[i]) == 0)
            *texts[i] = c->text;
    for (size_t i = 0; i < 3; i++)
        if (strcmp(c->factor, number_names[i]) == 0)
            *numbers[i] = c->number;
}

static void compat_hash_changes_with_each_factor(void **state)
{
    enum { N = NUM_FACTOR_CHANGES };
    char hex[N + 2][65];

    (void)state;
    for (size_t i = 0; i <= N; i++) {
        kvx_model_t m = model_a;
        kvx_regions_t *t;

        if (i < N)
            model_set(&m, &factor_changes[i]);
        t = table_with_model(SMALL_LAYOUT, &m);
        hash_hex(t, KVX_MODE_PULL, hex[i]);
        if (i == N)
            hash_hex(t, KVX_MODE_PUSH, hex[N + 1]); /* the mode is a factor too */
        kvx_regions_destroy(t);
    }
    assert_string_equal(hex[N], MODEL_A_HASH);
    for (size_t i = 0; i < N + 2; i++)
        for (size_t j = i + 1; j < N + 2; j++)
            if (strcmp(hex[i], hex[j]) == 0)
                fail_msg("factor changes %zu and %zu hash alike", i, j);
}

static void compat_hash_treats_a_null_revision_as_empty(void **state)
{
    kvx_model_t m = model_a;
    kvx_regions_t *t;
    char hex[2][65];

    (void)state;
    for (size_t k = 0; k < 2; k++) {
        m.revision = k == 0 ? NULL : "";
        t          = table_with_model(SMALL_LAYOUT, &m);
        hash_hex(t, KVX_MODE_PULL, hex[k]);
        kvx_regions_destroy(t);
    }
    assert_string_equal(hex[0], hex[1]);
    assert_string_not_equal(hex[0], MODEL_A_HASH);
}

/* ---------------------------------------------------------------------------------------
 * The envelope: version and hash, before the body is read
 * ------------------------------------------------------------------------------------- */

/* A peer whose table has `model` (NULL: none) and `mode` is turned away with `msg`. */
static void mismatch_rejected(const kvx_regions_t *local, const kvx_model_t *model,
                              kvx_transfer_mode_t mode, const char *msg)
{
    kvx_metadata_params_t params = {.field_mask = KVX_METADATA_PARAM_FIELD_MODE, .mode = mode};
    kvx_regions_t *remote        = table_with_model(SMALL_LAYOUT, model);
    void *buf                    = NULL;
    size_t size                  = 0;

    assert_int_equal(kvx_metadata_pack(remote, &params, &buf, &size), KVX_OK);
    unpack_rejects(msg, buf, size, local, KVX_MODE_PULL, msg);
    kvx_free(buf);
    kvx_regions_destroy(remote);
}

static void hash_mismatch_names_each_differing_factor(void **state)
{
    kvx_regions_t *local = table_with_model(SMALL_LAYOUT, &model_a);
    kvx_model_t m        = model_a;
    char msg[512];

    (void)state;
    for (size_t i = 0; i < NUM_FACTOR_CHANGES; i++) {
        kvx_model_t one = model_a;

        model_set(&one, &factor_changes[i]);
        snprintf(msg, sizeof(msg), "metadata: incompatible peer: %s", factor_changes[i].fragment);
        mismatch_rejected(local, &one, KVX_MODE_PULL, msg);
    }
    mismatch_rejected(local, &model_a, KVX_MODE_PUSH,
                      "metadata: incompatible peer: mode: local \"pull\", remote \"push\"");
    model_set(&m, &factor_changes[0]);
    model_set(&m, &factor_changes[4]);
    mismatch_rejected(local, &m, KVX_MODE_PULL,
                      "metadata: incompatible peer: model_id: local \"org/model-a\", remote"
                      " \"org/model-b\"; kv_heads: local 8, remote 16");
    mismatch_rejected(
        local, NULL, KVX_MODE_PULL,
        "metadata: incompatible peer: model_id: local \"org/model-a\", remote \"\"; model_revision:"
        " local \"r1\", remote \"\"; dtype: local \"bfloat16\", remote \"\"; cache_dtype: local"
        " \"fp8_e4m3\", remote \"\"; kv_heads: local 8, remote 0; head_size: local 128, remote 0;"
        " layers: local 4, remote 0; backend: local \"FLASH_ATTN\", remote \"\"");
    kvx_regions_destroy(local);
}

/* Peers that break one rule of the envelope or the body, each turned away by a message that
 * names the field, its value and the rule. */
static const struct bad_peer_case {
    struct peer_change changes[3];
    const char *msg;
} bad_peer_cases[] = {
    /* The envelope: version, hash, factors. */
    {{{ENV_VERSION, 0, 2}}, "metadata: wire version 2, this agent speaks 1"},
    {{{ENV_VERSION, 0, 0}}, "metadata: wire version 0, this agent speaks 1"},
    {{{ENV_HASH_LEN, 0, 31}}, "metadata: compat_hash: 31 bytes, expected 32"},
    {{{ENV_HASH_FLIP, 0, 5}},
     "metadata: the peer's factors do not match its own compatibility hash"},
    {{{ENV_HASH_FLIP, 0, 0}, {ENV_NO_FACTORS, 0, 1}},
     "metadata: the compatibility hash differs and the peer sent no factors to say why"},
    /* The body as a whole. */
    {{{BODY_VERSION, 0, 2}}, "metadata: body wire version 2 differs from its envelope's"},
    {{{BODY_HASH_FLIP, 0, 31}}, "metadata: body hash differs from its envelope's"},
    {{{TP_RANK, 0, 1}}, "metadata: tp_rank 1 of tp_size 1 is not a rank of 1..4096"},
    {{{TP_SIZE, 0, 0}}, "metadata: tp_rank 0 of tp_size 0 is not a rank of 1..4096"},
    {{{TP_SIZE, 0, 4097}}, "metadata: tp_rank 0 of tp_size 4097 is not a rank of 1..4096"},
    {{{BLOCK_SIZE, 0, 0}}, "metadata: block_size 0 is not in 1..2^63-1"},
    {{{BLOCK_SIZE, 0, TWO63}}, "metadata: block_size 9223372036854775808 is not in 1..2^63-1"},
    {{{MODE, 0, 2}}, "metadata: mode 2 is not pull or push"},
    {{{NUM_REGIONS, 0, 0}}, "metadata: 0 regions is not in 1..65536"},
    {{{NUM_REGIONS, 0, 65537}}, "metadata: 65537 regions is not in 1..65536"},
    {{{NUM_REGISTRATIONS, 0, 0}}, "metadata: 0 registrations is not in 1..4096"},
    {{{NUM_REGISTRATIONS, 0, 4097}}, "metadata: 4097 registrations is not in 1..4096"},
    {{{ENGINE_ID, 0, 256}}, "metadata: engine_id: 256 bytes is longer than 255"},
    {{{AGENT_NAME, 0, TEXT_NUL}}, "metadata: agent_name: holds a NUL byte"},
    {{{TRANSPORT, 0, 4097}}, "metadata: transport_address: 4097 bytes is more than 4096"},
    /* Registrations. */
    {{{REG_NAME, 1, 0}}, "metadata: registrations[1].storage: is empty"},
    {{{REG_NAME, 1, 256}}, "metadata: registrations[1].storage: 256 bytes is longer than 255"},
    {{{REG_NAME, 2, TEXT_NUL}}, "metadata: registrations[2].storage: holds a NUL byte"},
    {{{REG_SIZE, 0, 0}}, "metadata: registrations[0].size: 0 is not in 1..2^63-1"},
    {{{REG_SIZE, 3, TWO63}},
     "metadata: registrations[3].size: 9223372036854775808 is not in 1..2^63-1"},
    {{{REG_MEM, 0, 2}}, "metadata: registrations[0].mem: 2 is not a memory type"},
    {{{REG_DEVICE, 1, NEG(-1)}}, "metadata: registrations[1].device: -1 is negative"},
    {{{REG_KEY, 3, 4097}}, "metadata: registrations[3].remote_key: 4097 bytes is more than 4096"},
    /* Regions: names, storage index, sane numbers, inside their registration. */
    {{{REGION_NAME, 2, 0}}, "metadata: regions[2].name: is empty"},
    {{{REGION_NAME, 2, 256}}, "metadata: regions[2].name: 256 bytes is longer than 255"},
    {{{REGION_NAME, 6, TEXT_NUL}}, "metadata: regions[6].name: holds a NUL byte"},
    /* Issue 11: a peer's names are printed: control bytes and broken UTF-8 are refused. */
    {{{REGION_NAME, 1, TEXT_ESC}},
     "metadata: regions[1].name: byte 2 (0x1b) is a control character"},
    {{{REG_NAME, 0, TEXT_BAD}},
     "metadata: registrations[0].storage: byte 2 (0xff) is not valid UTF-8"},
    {{{AGENT_NAME, 0, TEXT_ESC}}, "metadata: agent_name: byte 2 (0x1b) is a control character"},
    {{{REGION_STORAGE, 1, 4}}, "metadata: regions[1].storage: 4 is not one of 4 registrations"},
    {{{REGION_BLOCK_LEN, 0, 0}}, "metadata: regions[0]: " SANE},
    {{{REGION_STRIDE, 4, 0}}, "metadata: regions[4]: " SANE},
    {{{REGION_HEADS, 5, 0}}, "metadata: regions[5]: " SANE},
    {{{REGION_OFFSET, 0, TWO63}}, "metadata: regions[0]: " SANE},
    {{{REGION_GROUP, 3, NEG(-2)}}, "metadata: regions[3].group: -2 is below -1"},
    {{{REGION_OFFSET, 0, 32769}}, /* 32 blocks of 1024 bytes end one byte past 65536 */
     "metadata: regions[0]: its blocks run past its registration of 65536 bytes"},
    {{{REG_SIZE, 0, 65535}}, /* region 1 ends at 65536 */
     "metadata: regions[1]: its blocks run past its registration of 65535 bytes"},
    {{{REGION_NUM_BLOCKS, 2, (uint64_t)1 << 62}}, /* the end overflows 64 bits */
     "metadata: regions[2]: its blocks run past its registration of 4096 bytes"},
    {{{REG_SIZE, 2, TWO63 - 1}, {REGION_STRIDE, 3, 1}, {REGION_NUM_BLOCKS, 3, TWO63 - 170}},
     /* 160 descriptors before region 3, then 8 per region */
     "the table's descriptor count overflows 63 bits at region 5"},
    /* TCP segments (issue 22): both 0 (no tcp) or each within the limit. */
    {{{SEG_RX, 0, 65536}},
     "metadata: tcp_segments: tx 0, rx 65536: each must be 1..1073741824 bytes, or both 0 (no"
     " tcp)"},
    {{{SEG_TX, 0, 8192}},
     "metadata: tcp_segments: tx 8192, rx 0: each must be 1..1073741824 bytes, or both 0 (no"
     " tcp)"},
    {{{SEG_TX, 0, 8192}, {SEG_RX, 0, UINT64_MAX}},
     "metadata: tcp_segments: tx 8192, rx 18446744073709551615: each must be 1..1073741824"
     " bytes, or both 0 (no tcp)"},
};

static void bad_peers_are_rejected_by_name(void **state)
{
    kvx_regions_t *local = table_load(ROUND_TRIP_LAYOUT);

    (void)state;
    for (size_t i = 0; i < sizeof(bad_peer_cases) / sizeof(bad_peer_cases[0]); i++) {
        const struct bad_peer_case *c = &bad_peer_cases[i];
        size_t size;
        uint8_t *bytes = peer_encode(local, NULL, c->changes, 3, &size);

        unpack_rejects(c->msg, bytes, size, local, KVX_MODE_PULL, c->msg);
        free(bytes);
    }
    kvx_regions_destroy(local);
}

static void bytes_that_are_no_envelope_or_body_are_rejected(void **state)
{
    kvx_regions_t *local        = table_load(ROUND_TRIP_LAYOUT);
    static const uint8_t junk[] = {0xff, 0xff};
    static const uint8_t cut[]  = {0x08}; /* a varint tag with no value */
    uint8_t hash[KVX_COMPAT_HASH_LEN];
    struct pb env = {0};

    (void)state;
    unpack_rejects("no envelope", junk, sizeof(junk), local, KVX_MODE_PULL,
                   "metadata: 2 bytes are not a kvx envelope");
    assert_int_equal(kvx_compat_hash(local, KVX_MODE_PULL, hash), KVX_OK);
    pb_uint(&env, 1, KVX_WIRE_VERSION);
    pb_bytes(&env, 2, hash, KVX_COMPAT_HASH_LEN, false);
    pb_bytes(&env, 4, cut, sizeof(cut), false);
    unpack_rejects("no body", env.data, env.len, local, KVX_MODE_PULL,
                   "metadata: the body (1 bytes) is not a kvx agent metadata message");
    env.len -= 3; /* the envelope without its body: an empty body */
    unpack_rejects("empty body", env.data, env.len, local, KVX_MODE_PULL,
                   "metadata: body wire version 0 differs from its envelope's");
    unpack_rejects("required arguments", NULL, 0, local, KVX_MODE_PULL,
                   "metadata: bytes, local table and result are required");
    free(env.data);
    kvx_regions_destroy(local);
}

/* ---------------------------------------------------------------------------------------
 * Remote-table validation (kvx_metadata_validate, docs/plan.md length rules)
 * ------------------------------------------------------------------------------------- */

/* Changes to the round-trip peer (TP 1, block size 16) and the local settings (LOCAL_TP,
 * LOCAL_BLOCK_SIZE), then every difference validation must list, in order. */
static const struct difference_case {
    const char *rule;
    struct peer_change changes[4];
    const char *differences[3];
} difference_cases[] = {
    {"the same table agrees", {{END, 0, 0}}, {NULL}},
    {"region count", {{NUM_REGIONS, 0, 6}}, {"regions: local 7, remote 6: " SAME_REGIONS}},
    {"region name",
     {{REGION_NAME, 1, TEXT_OTHER}},
     {"region 1: name: local \"layers.0.swa\", remote \"layers.9.other\": both sides register"
      " the same names in the same order"}},
    {"region group",
     {{REGION_GROUP, 0, 5}},
     {"region 0 (layers.0.attn): group: local 0, remote 5: " SAME_GROUP}},
    {"region kind: mla",
     {{REGION_MLA, 2, 0}},
     {"region 2 (layers.1.mla): kind: local mla, remote none: " SAME_KIND}},
    {"region kind: ple against head-split",
     {{REGION_PLE, 6, 0}, {REGION_HEAD_SPLIT, 6, 1}},
     {"region 6 (layers.3.ple): kind: local ple, remote head-split: " SAME_KIND}},
    {"stride below block_len",
     {{REGION_STRIDE, 0, 512}},
     {"region 0 (layers.0.attn): " STRIDE_512}},
    {"local TP 2 reads TP 1 blocks of the same length: heads replicated",
     {{LOCAL_TP, 0, 2}},
     {NULL}},
    {"local TP 2 reads TP 1 blocks of twice the length",
     {{LOCAL_TP, 0, 2}, {REGION_BLOCK_LEN, 0, 2048}, {REGION_STRIDE, 0, 2048}},
     {NULL}},
    {"local TP 2, remote TP 1: a remote block shorter than the local",
     {{LOCAL_TP, 0, 2}, {REGION_BLOCK_LEN, 0, 512}},
     {"region 0 (layers.0.attn): block_len: local 1024, remote 512: head-split: the remote"
      " block_len must be the local 1024 x TP ratio 2 (or a divisor of the ratio, for heads"
      " replicated across local ranks)"}},
    {"local TP 1, remote TP 2: a remote block a quarter of the local",
     {{TP_SIZE, 0, 2}, {REGION_BLOCK_LEN, 0, 256}},
     {"region 0 (layers.0.attn): block_len: local 1024, remote 256: head-split: the local 1024"
      " must be the remote block_len x TP ratio 2 (or the ratio over a divisor, for heads"
      " replicated across remote ranks)"}},
    {"replicated MLA is never split under TP",
     {{LOCAL_TP, 0, 2}, {REGION_BLOCK_LEN, 2, 32}},
     {"region 2 (layers.1.mla): block_len: local 64, remote 32: replicated MLA regions are"
      " never split: the remote block_len must equal the local unit of 64 bytes"}},
    {"TP sizes that do not divide", {{LOCAL_TP, 0, 2}, {TP_SIZE, 0, 3}}, {TP_2_3}},
    {"remote block size larger",
     {{BLOCK_SIZE, 0, 32}},
     {"block_size: local 16, remote 32: " WHOLE}},
    {"remote block size not a divisor",
     {{BLOCK_SIZE, 0, 6}},
     {"block_size: local 16, remote 6: " WHOLE}},
    {"remote blocks of half the size and half the length",
     {{BLOCK_SIZE, 0, 8}, {ALL_BLOCK_LEN_DIV, 0, 2}},
     {NULL}},
    {"a local block that does not split into bsr sub-blocks",
     {{LOCAL_BLOCK_SIZE, 0, 1024}, {ALL_BLOCK_LEN_DIV, 0, 64}, {REGION_BLOCK_LEN, 3, 1}},
     {"region 3 (layers.2.a): block_len: local 32 does not split into bsr 64 equal"
      " sub-blocks"}},
    {"every difference listed, in table order",
     {{LOCAL_TP, 0, 2}, {TP_SIZE, 0, 3}, {REGION_STRIDE, 0, 512}, {REGION_GROUP, 3, 2}},
     {TP_2_3, "region 0 (layers.0.attn): " STRIDE_512,
      "region 3 (layers.2.a): group: local -1, remote 2: " SAME_GROUP}},
};

static void remote_tables_are_checked_rule_by_rule(void **state)
{
    kvx_regions_t *local = table_load(ROUND_TRIP_LAYOUT);

    (void)state;
    for (size_t i = 0; i < sizeof(difference_cases) / sizeof(difference_cases[0]); i++) {
        const struct difference_case *c = &difference_cases[i];
        const struct peer p             = {c->changes, 4};
        kvx_peer_plan_params_t params   = {.field_mask = KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP |
                                                         KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE,
                                           .local_tp         = (uint32_t)pick(&p, LOCAL_TP, 0, 1),
                                           .local_block_size = pick(&p, LOCAL_BLOCK_SIZE, 0, 16)};
        size_t expected                 = 0;
        size_t count                    = 99;
        size_t size;
        uint8_t *bytes     = peer_encode(local, NULL, c->changes, 4, &size);
        kvx_metadata_t *md = unpack_ok(c->rule, bytes, size, local, KVX_MODE_PULL);
        kvx_status_t status;

        while (expected < 3 && c->differences[expected] != NULL)
            expected++;
        status = kvx_metadata_validate(md, local, &params, &count);
        if (count != expected || status != (expected == 0 ? KVX_OK : KVX_ERR_INVALID))
            fail_msg("%s: status %d, %zu differences, first \"%s\"", c->rule, status, count,
                     kvx_errmsg());
        for (size_t k = 0; k < expected; k++)
            if (strcmp(kvx_metadata_difference(md, k), c->differences[k]) != 0)
                fail_msg("%s: difference %zu: \"%s\"", c->rule, k, kvx_metadata_difference(md, k));
        assert_null(kvx_metadata_difference(md, expected));
        if (expected > 0 &&
            (strncmp(kvx_errmsg(), c->differences[0], strlen(c->differences[0])) != 0 ||
             strcmp(kvx_errmsg() + strlen(c->differences[0]),
                    expected > 1 ? " (and more differences)" : "") != 0))
            fail_msg("%s: message \"%s\"", c->rule, kvx_errmsg());
        /* Validating again starts over. */
        assert_int_equal(kvx_metadata_validate(md, local, &params, &count), status);
        assert_int_equal(count, expected);
        kvx_metadata_destroy(md);
        free(bytes);
    }
    kvx_regions_destroy(local);
}

static void validate_rejects_an_impossible_setting(void **state)
{
    kvx_regions_t *local          = table_load(ROUND_TRIP_LAYOUT);
    kvx_peer_plan_params_t params = {.field_mask = KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP |
                                                   KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK,
                                     .local_tp   = 2,
                                     .local_rank = 2};
    size_t count                  = 99;
    size_t size;
    uint8_t *bytes     = peer_encode(local, NULL, NULL, 0, &size);
    kvx_metadata_t *md = unpack_ok("impossible setting", bytes, size, local, KVX_MODE_PULL);

    (void)state;
    assert_int_equal(kvx_metadata_validate(md, local, &params, &count), KVX_ERR_INVALID);
    assert_string_equal(kvx_errmsg(), "validate: local_tp 2, local_rank 2, remote_tp 1 and block"
                                      " sizes 16/16 are not a valid setting");
    assert_int_equal(count, 99);
    kvx_metadata_destroy(md);
    free(bytes);
    kvx_regions_destroy(local);
}

/* KVX_MAX_DIFFERENCES lines are kept; the count goes on. */
static void differences_past_the_limit_are_counted_not_kept(void **state)
{
    enum { N = KVX_MAX_DIFFERENCES + 4 };
    kvx_storage_params_t storage = {.name = "kv", .size = (uint64_t)N * 64};
    kvx_layout_t *layout         = NULL;
    kvx_regions_t *local         = NULL;
    kvx_metadata_t *md;
    const struct peer_change all_groups_1 = {ALL_GROUPS, 0, 1};
    size_t count                          = 0;
    size_t size;
    uint8_t *bytes;
    char name[16];

    (void)state;
    assert_int_equal(kvx_layout_create(NULL, &layout), KVX_OK);
    assert_int_equal(kvx_layout_add_storage(layout, &storage), KVX_OK);
    for (size_t i = 0; i < N; i++) {
        kvx_view_params_t v = {.field_mask = KVX_VIEW_PARAM_FIELD_OFFSET,
                               .name       = name,
                               .kind       = KVX_VIEW_KIND_ATTN,
                               .storage    = "kv",
                               .page       = 64,
                               .stride     = 64,
                               .num_blocks = 1,
                               .offset     = i * 64};

        snprintf(name, sizeof(name), "l.%zu", i);
        assert_int_equal(kvx_layout_add_view(layout, &v), KVX_OK);
    }
    assert_int_equal(kvx_regions_register(layout, &local), KVX_OK);
    assert_int_equal(kvx_regions_count(local), N);
    bytes = peer_encode(local, NULL, &all_groups_1, 1, &size);
    md    = unpack_ok("many differences", bytes, size, local, KVX_MODE_PULL);
    assert_int_equal(kvx_metadata_validate(md, local, NULL, &count), KVX_ERR_INVALID);
    assert_int_equal(count, N);
    assert_non_null(kvx_metadata_difference(md, KVX_MAX_DIFFERENCES - 1));
    assert_null(kvx_metadata_difference(md, KVX_MAX_DIFFERENCES));
    assert_string_equal(kvx_metadata_difference(md, 0),
                        "region 0 (l.0): group: local 0, remote 1: a region takes the same"
                        " group's block ids on both sides");
    kvx_metadata_destroy(md);
    free(bytes);
    kvx_regions_destroy(local);
    kvx_layout_destroy(layout);
}

/* ---------------------------------------------------------------------------------------
 * TCP segments (issue 22 finding 8): UCX aborts a receiver on a segment larger than its rx,
 * so a peer is refused when what one side sends does not fit what the other receives.
 * ------------------------------------------------------------------------------------- */

#define K(n)     ((n)*1024u)
#define UNSTATED UINT64_MAX /* the peer sends no TcpSegments: an older kvx */

static const struct segments_case {
    const char *rule;
    uint64_t peer_tx; /* UNSTATED: none sent */
    uint64_t peer_rx;
    uint64_t local_tx;
    uint64_t local_rx;
    const char *msg; /* NULL: accepted */
} segments_cases[] = {
    {"equal sizes interoperate", K(256), K(256), K(256), K(256), NULL},
    {"UCX's defaults on both sides", K(8), K(64), K(8), K(64), NULL},
    {"a larger peer rx alone does not matter (measured on 1.13)", K(8), K(256), K(8), K(64), NULL},
    {"the peer sends more than we receive", K(256), K(256), K(8), K(64),
     "tcp segments: the peer sends up to 262144 bytes a segment (its UCX_TCP_TX_SEG_SIZE) and"
     " this side receives at most 65536 (UCX_TCP_RX_SEG_SIZE): UCX would abort the receiver; set"
     " UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE alike on both sides, or on neither"},
    {"we send more than the peer receives", K(8), K(8), K(256), K(256),
     "tcp segments: this side sends up to 262144 bytes a segment (UCX_TCP_TX_SEG_SIZE) and the"
     " peer receives at most 8192 (its UCX_TCP_RX_SEG_SIZE): UCX would abort the receiver; set"
     " UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE alike on both sides, or on neither"},
    {"an older peer is taken to use UCX's defaults", UNSTATED, 0, K(256), K(256),
     "tcp segments: this side sends up to 262144 bytes a segment (UCX_TCP_TX_SEG_SIZE) and the"
     " peer receives at most 65536 (its UCX_TCP_RX_SEG_SIZE, UCX's default: the peer is a kvx"
     " that states no sizes): UCX would abort the receiver; set UCX_TCP_TX_SEG_SIZE and"
     " UCX_TCP_RX_SEG_SIZE alike on both sides, or on neither"},
    {"an older peer and UCX's defaults here", UNSTATED, 0, K(8), K(64), NULL},
    {"a peer without tcp is not checked", 0, 0, K(256), K(256), NULL},
    {"without tcp here nothing is checked", K(8), K(8), 0, 0, NULL},
    {"the limit itself is a size", KVX_MAX_TCP_SEGMENT, KVX_MAX_TCP_SEGMENT, KVX_MAX_TCP_SEGMENT,
     KVX_MAX_TCP_SEGMENT, NULL},
};

static void tcp_segments_are_checked_both_ways(void **state)
{
    kvx_regions_t *local = table_load(ROUND_TRIP_LAYOUT);

    (void)state;
    for (size_t i = 0; i < sizeof(segments_cases) / sizeof(segments_cases[0]); i++) {
        const struct segments_case *c = &segments_cases[i];
        kvx_metadata_params_t params  = {.field_mask      = KVX_METADATA_PARAM_FIELD_TCP_SEGMENTS,
                                         .tcp_tx_seg_size = c->peer_tx,
                                         .tcp_rx_seg_size = c->peer_rx};
        void *buf                     = NULL;
        size_t size                   = 0;
        kvx_metadata_t *md;
        kvx_status_t status;

        assert_int_equal(
            kvx_metadata_pack(local, c->peer_tx == UNSTATED ? NULL : &params, &buf, &size), KVX_OK);
        md     = unpack_ok(c->rule, buf, size, local, KVX_MODE_PULL);
        status = wire_tcp_segments_agree(md, c->local_tx, c->local_rx);
        if (c->msg == NULL && status != KVX_OK)
            fail_msg("%s: refused: %s", c->rule, kvx_errmsg());
        if (c->msg != NULL && (status != KVX_ERR_INVALID || strcmp(kvx_errmsg(), c->msg) != 0))
            fail_msg("%s: status %d, message \"%s\"; expected \"%s\"", c->rule, status,
                     kvx_errmsg(), c->msg);
        kvx_metadata_destroy(md);
        kvx_free(buf);
    }
    kvx_regions_destroy(local);
}

/* ---------------------------------------------------------------------------------------
 * Hostile bytes (run under ASan in CI: a crash or overread here fails the suite)
 * ------------------------------------------------------------------------------------- */

static void every_truncation_is_rejected(void **state)
{
    kvx_regions_t *local = table_load(ROUND_TRIP_LAYOUT);
    void *buf            = NULL;
    size_t size          = 0;
    uint8_t *prefix;

    (void)state;
    assert_int_equal(kvx_metadata_pack(local, &all_params, &buf, &size), KVX_OK);
    for (size_t len = 0; len < size; len++) {
        char rule[48];

        prefix = malloc(len > 0 ? len : 1); /* exact size, so ASan sees any overread */
        assert_non_null(prefix);
        memcpy(prefix, buf, len);
        snprintf(rule, sizeof(rule), "prefix of %zu bytes", len);
        unpack_rejects(rule, prefix, len, local, KVX_MODE_PUSH, NULL);
        free(prefix);
    }
    kvx_metadata_destroy(unpack_ok("whole", buf, size, local, KVX_MODE_PUSH));
    kvx_free(buf);
    kvx_regions_destroy(local);
}

/* A valid message padded by an unknown envelope field (15, ignored by readers) to `total`. */
static uint8_t *padded_message(const void *buf, size_t size, size_t total)
{
    uint8_t *out = malloc(total);
    size_t pad   = total - size - 5; /* tag byte and a 4-byte length varint */
    size_t at    = size;

    assert_non_null(out);
    assert_true(pad >= (1u << 21) && pad < (1u << 28));
    memcpy(out, buf, size);
    out[at++] = 15 << 3 | 2;
    for (size_t k = 0; k < 4; k++)
        out[at++] = (uint8_t)(((pad >> (7 * k)) & 0x7f) | (k < 3 ? 0x80 : 0));
    memset(out + at, 'x', pad);
    return out;
}

static void oversized_messages_are_rejected_before_decoding(void **state)
{
    kvx_regions_t *local = table_load(ROUND_TRIP_LAYOUT);
    void *buf            = NULL;
    size_t size          = 0;
    uint8_t *big;

    (void)state;
    assert_int_equal(kvx_metadata_pack(local, NULL, &buf, &size), KVX_OK);
    big = padded_message(buf, size, KVX_MAX_METADATA_SIZE);
    kvx_metadata_destroy(
        unpack_ok("exactly the limit", big, KVX_MAX_METADATA_SIZE, local, KVX_MODE_PULL));
    free(big);
    big = padded_message(buf, size, KVX_MAX_METADATA_SIZE + 1);
    unpack_rejects("one byte over", big, KVX_MAX_METADATA_SIZE + 1, local, KVX_MODE_PULL,
                   "metadata: 16777217 bytes is more than the 16777216 accepted");
    free(big);
    /* A size no buffer has: rejected without a byte read (ASan would see an overread). */
    unpack_rejects("SIZE_MAX", buf, SIZE_MAX, local, KVX_MODE_PULL,
                   "metadata: 18446744073709551615 bytes is more than the 16777216 accepted");
    kvx_free(buf);
    kvx_regions_destroy(local);
}

/* Each single-bit flip decodes to a result that holds every invariant, or is rejected. */
static void every_bit_flip_decodes_valid_or_is_rejected(void **state)
{
    kvx_regions_t *local = table_load(ROUND_TRIP_LAYOUT);
    void *buf            = NULL;
    size_t size          = 0;
    size_t decoded       = 0;
    size_t rejected      = 0;
    uint8_t *copy;

    (void)state;
    assert_int_equal(kvx_metadata_pack(local, &all_params, &buf, &size), KVX_OK);
    copy = malloc(size);
    assert_non_null(copy);
    for (size_t bit = 0; bit < size * 8; bit++) {
        kvx_metadata_t *md = NULL;

        memcpy(copy, buf, size);
        copy[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (kvx_metadata_unpack(copy, size, local, KVX_MODE_PUSH, &md) == KVX_OK) {
            metadata_check(md, local);
            kvx_metadata_destroy(md);
            decoded++;
        } else {
            assert_null(md);
            assert_true(kvx_errmsg()[0] != '\0');
            rejected++;
        }
    }
    /* Both outcomes occur: flips in addresses and keys decode, flips in the hash do not. */
    assert_true(decoded > 0 && rejected > 0);
    free(copy);
    kvx_free(buf);
    kvx_regions_destroy(local);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_keeps_every_field),
        cmocka_unit_test(unset_params_take_their_defaults),
        cmocka_unit_test(a_hand_written_peer_packs_the_same_bytes),
        cmocka_unit_test(a_peer_states_the_done_version_it_reads),
        cmocka_unit_test(a_peer_states_whether_it_takes_push_messages),
        cmocka_unit_test(pack_rejects_bad_params_and_writes_nothing),
        cmocka_unit_test(compat_hash_is_pinned),
        cmocka_unit_test(compat_hash_ignores_key_order_and_non_factor_fields),
        cmocka_unit_test(compat_hash_changes_with_each_factor),
        cmocka_unit_test(compat_hash_treats_a_null_revision_as_empty),
        cmocka_unit_test(hash_mismatch_names_each_differing_factor),
        cmocka_unit_test(bad_peers_are_rejected_by_name),
        cmocka_unit_test(bytes_that_are_no_envelope_or_body_are_rejected),
        cmocka_unit_test(remote_tables_are_checked_rule_by_rule),
        cmocka_unit_test(validate_rejects_an_impossible_setting),
        cmocka_unit_test(tcp_segments_are_checked_both_ways),
        cmocka_unit_test(differences_past_the_limit_are_counted_not_kept),
        cmocka_unit_test(every_truncation_is_rejected),
        cmocka_unit_test(oversized_messages_are_rejected_before_decoding),
        cmocka_unit_test(every_bit_flip_decodes_valid_or_is_rejected),
    };

    memset(filler, 'x', sizeof(filler));
    return cmocka_run_group_tests(tests, NULL, NULL);
}

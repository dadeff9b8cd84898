/* fuzz_wire.c: libFuzzer target of the handshake decoder, the remote-table check and the TCP
 * segment check (kvx.h "Wire"): any bytes either fail with a message or decode to metadata
 * whose invariants hold; validation agrees with the planner, and a re-pack decodes the same. */
#include "fuzz_invariant.h"
#include "error.h"
#include "regions.h"
#include "wire.h" /* white-box: the peer's TCP segments, which kvx.h does not show */

#include "kvx.h"

#include <cjson/cJSON.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128; /* region ends of 63-bit fields never overflow it */

/* The local side, and the table the seeds of fuzz/corpus/wire were packed from (the same as
 * tests/test_wire.c's round-trip layout): its hash must match for the body to be read. */
static const char local_layout[] =
    "{\"kvx_layout\": 1, \"block_size\": 16,"
    " \"model\": {\"id\": \"org/model-a\", \"revision\": \"r1\", \"dtype\": \"bfloat16\","
    " \"cache_dtype\": \"fp8_e4m3\", \"kv_heads\": 8, \"head_size\": 128, \"layers\": 4,"
    " \"backend\": \"FLASH_ATTN\"},"
    " \"storages\": [{\"name\": \"kv\", \"size\": 65536, \"mem\": \"vram\", \"device\": 1},"
    " {\"name\": \"latent\", \"size\": 4096, \"mem\": \"vram\", \"device\": 3},"
    " {\"name\": \"shared\", \"size\": 256}, {\"name\": \"state\", \"size\": 8192}],"
    " \"views\": ["
    "{\"name\": \"layers.0.attn\", \"kind\": \"attn\", \"storage\": \"kv\", \"page\": 1024,"
    " \"stride\": 1024, \"num_blocks\": 32, \"heads\": 4},"
    "{\"name\": \"layers.0.swa\", \"kind\": \"swa\", \"storage\": \"kv\", \"offset\": 32768,"
    " \"page\": 512, \"stride\": 512, \"num_blocks\": 64, \"heads\": 2},"
    "{\"name\": \"layers.1.mla\", \"kind\": \"mla\", \"storage\": \"latent\", \"page\": 24,"
    " \"stride\": 64, \"num_blocks\": 64, \"dense\": false},"
    "{\"name\": \"layers.2.a\", \"kind\": \"mla\", \"group\": 0, \"storage\": \"shared\","
    " \"page\": 32, \"stride\": 64, \"num_blocks\": 4},"
    "{\"name\": \"layers.2.b\", \"kind\": \"mla\", \"group\": 1, \"storage\": \"shared\","
    " \"page\": 32, \"stride\": 64, \"num_blocks\": 4},"
    "{\"name\": \"layers.3.ple\", \"kind\": \"ple\", \"storage\": \"state\", \"page\": 256,"
    " \"stride\": 256, \"num_blocks\": 8, \"group\": 2},"
    "{\"name\": \"layers.3.compressor\", \"kind\": \"scratch\", \"storage\": \"state\","
    " \"offset\": 2048, \"page\": 128, \"stride\": 256, \"num_blocks\": 8, \"group\": 2},"
    "{\"name\": \"layers.3.mamba\", \"kind\": \"mamba\", \"storage\": \"state\", \"offset\": 4096,"
    " \"page\": 512, \"stride\": 512, \"num_blocks\": 8, \"group\": 3}]}";

static kvx_regions_t *local;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    kvx_layout_t *layout = NULL;

    (void)argc;
    (void)argv;
    if (kvx_layout_load_buffer(local_layout, sizeof(local_layout) - 1, &layout) != KVX_OK ||
        kvx_regions_register(layout, &local) != KVX_OK)
        fuzz_fail("the local layout does not register");
    kvx_layout_destroy(layout);
    return 0;
}

static bool text_is_name(const char *text, bool may_be_empty)
{
    size_t len = text != NULL ? strlen(text) : 0;

    return text != NULL && len <= KVX_MAX_NAME_LEN && (may_be_empty || len > 0);
}

/* The peer's table prints as JSON with all its regions (its names are the peer's bytes). */
static void check_json(const kvx_regions_t *t)
{
    char *json = NULL;
    cJSON *plan;

    if (kvx_regions_to_json(t, &json) != KVX_OK)
        fuzz_fail("kvx_regions_to_json failed on a decoded table");
    plan = cJSON_Parse(json);
    if (plan == NULL || cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(plan, "regions")) !=
                            (int)kvx_regions_count(t))
        fuzz_fail("the peer's table is not JSON with %zu regions", kvx_regions_count(t));
    cJSON_Delete(plan);
    kvx_free(json);
}

/* Limits of kvx.h, a table numbered region-major and every region inside its registration. */
static void check_decoded(const kvx_metadata_t *md)
{
    const kvx_regions_t *t = kvx_metadata_regions(md);
    size_t count           = kvx_regions_count(t);
    uint64_t sum           = 0;
    kvx_metadata_info_t info;
    kvx_registration_info_t reg;
    kvx_region_info_t r;
    kvx_descriptor_t d;

    kvx_metadata_get_info(md, &info);
    if (!text_is_name(info.engine_id, true) || !text_is_name(info.agent_name, true) ||
        info.tp_size < 1 || info.tp_size > KVX_MAX_TP || info.tp_rank >= info.tp_size ||
        info.block_size < 1 || info.block_size > (uint64_t)INT64_MAX ||
        info.transport_address.size > KVX_MAX_BLOB_SIZE ||
        (info.mode != KVX_MODE_PULL && info.mode != KVX_MODE_PUSH))
        fuzz_fail("info: tp %" PRIu32 "/%" PRIu32 ", block size %" PRIu64 ", address of %zu"
                  " bytes, mode %d",
                  info.tp_rank, info.tp_size, info.block_size, info.transport_address.size,
                  (int)info.mode);
    if (info.num_registrations < 1 || info.num_registrations > KVX_MAX_STORAGES ||
        info.num_registrations != kvx_regions_num_storages(t) ||
        kvx_metadata_registration(md, info.num_registrations, &reg) != KVX_ERR_OUT_OF_RANGE)
        fuzz_fail("%zu registrations, %zu storages in the table", info.num_registrations,
                  kvx_regions_num_storages(t));
    for (size_t s = 0; s < info.num_registrations; s++) {
        if (kvx_metadata_registration(md, s, &reg) != KVX_OK || !text_is_name(reg.storage, false) ||
            strcmp(reg.storage, kvx_regions_storage_name(t, s)) != 0 || reg.size < 1 ||
            reg.size > (uint64_t)INT64_MAX || reg.remote_key.size > KVX_MAX_BLOB_SIZE ||
            reg.device < 0)
            fuzz_fail("registration %zu is out of its limits", s);
    }
    if (count < 1 || count > KVX_MAX_VIEWS)
        fuzz_fail("%zu regions", count);
    for (size_t i = 0; i < count; i++) {
        if (kvx_regions_get(t, i, &r) != KVX_OK || !text_is_name(r.name, false) ||
            r.num_members != 1 || r.members[0] != i || r.first_descriptor != sum ||
            r.storage >= info.num_registrations || r.block_len < 1 || r.stride < 1 ||
            r.num_blocks < 1 || r.heads < 1 || r.group < -1)
            fuzz_fail("region %zu: storage %zu, %" PRIu64 " blocks of %" PRIu64 " bytes, first"
                      " descriptor %" PRIu64 " (expected %" PRIu64 ")",
                      i, r.storage, r.num_blocks, r.block_len, r.first_descriptor, sum);
        kvx_metadata_registration(md, r.storage, &reg);
        if ((u128)r.offset + (u128)(r.num_blocks - 1) * r.stride + r.block_len > reg.size)
            fuzz_fail("region %zu (%s) reaches past registration %zu of %" PRIu64 " bytes", i,
                      r.name, r.storage, reg.size);
        if (__builtin_add_overflow(sum, r.num_blocks, &sum) || sum > (uint64_t)INT64_MAX)
            fuzz_fail("the descriptor count overflows at region %zu", i);
    }
    if (kvx_regions_num_descriptors(t) != sum || kvx_regions_descriptor(t, sum - 1, &d) != KVX_OK ||
        d.offset != r.offset + (r.num_blocks - 1) * r.stride || d.len != r.block_len ||
        kvx_regions_descriptor(t, sum, &d) != KVX_ERR_OUT_OF_RANGE)
        fuzz_fail("%" PRIu64 " descriptors, the regions hold %" PRIu64 "; the last is not the"
                  " last block of the last region",
                  kvx_regions_num_descriptors(t), sum);
    check_json(t);
}

/* The peer's TCP segments: both 0, each in 1..KVX_MAX_TCP_SEGMENT, or UCX's defaults for a peer
 * that stated none; and the check against a few local settings refuses exactly a peer whose
 * sends exceed our receives or whose receives are below our sends, naming the variables. */
static void check_segments(const kvx_metadata_t *md)
{
    static const uint64_t locals[][2] = {{0, 0}, {8192, 65536}, {262144, 262144}, {1, 1}};
    uint64_t tx                       = md->tcp_tx_seg_size;
    uint64_t rx                       = md->tcp_rx_seg_size;

    if (md->tcp_segments_stated ? !((tx == 0 && rx == 0) || (tx >= 1 && tx <= KVX_MAX_TCP_SEGMENT &&
                                                             rx >= 1 && rx <= KVX_MAX_TCP_SEGMENT))
                                : (tx != WIRE_UCX_TCP_TX_DEFAULT || rx != WIRE_UCX_TCP_RX_DEFAULT))
        fuzz_fail("tcp segments: tx %" PRIu64 ", rx %" PRIu64 ", stated %d", tx, rx,
                  (int)md->tcp_segments_stated);
    for (size_t i = 0; i < sizeof(locals) / sizeof(locals[0]); i++) {
        bool tcp_both  = !(locals[i][0] == 0 && locals[i][1] == 0) && !(tx == 0 && rx == 0);
        bool fits      = !tcp_both || (tx <= locals[i][1] && locals[i][0] <= rx);
        kvx_status_t s = wire_tcp_segments_agree(md, locals[i][0], locals[i][1]);

        if (s != (fits ? KVX_OK : KVX_ERR_INVALID) ||
            (!fits && strstr(kvx_errmsg(), "UCX_TCP_RX_SEG_SIZE") == NULL))
            fuzz_fail("tcp segments: tx %" PRIu64 ", rx %" PRIu64 " against local %" PRIu64
                      "/%" PRIu64 ": %s (%s)",
                      tx, rx, locals[i][0], locals[i][1], kvx_status_str(s), kvx_errmsg());
    }
}

static int compare_local(const void *a, const void *b)
{
    const kvx_pair_t *x = a;
    const kvx_pair_t *y = b;

    if (x->local_storage != y->local_storage)
        return x->local_storage < y->local_storage ? -1 : 1;
    return (x->local_offset > y->local_offset) - (x->local_offset < y->local_offset);
}

/* docs/plan.md "Each byte once": no two pairs of any reads share a local byte. */
static void check_each_byte_once(const kvx_pairs_t *pairs)
{
    kvx_pair_t *all;
    size_t n = 0;
    kvx_pairs_stats_t stats;

    kvx_pairs_stats(pairs, &stats);
    all = calloc(stats.coalesced + 1, sizeof(*all));
    if (all == NULL)
        return;
    for (size_t read = 0; read < kvx_pairs_num_reads(pairs); read++) {
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, read, NULL, &count);

        for (size_t i = 0; i < count && n < stats.coalesced; i++)
            all[n++] = p[i];
    }
    qsort(all, n, sizeof(*all), compare_local);
    for (size_t i = 1; i < n; i++) {
        if (all[i].local_storage == all[i - 1].local_storage &&
            all[i].local_offset < all[i - 1].local_offset + all[i - 1].len)
            fuzz_fail("local byte %" PRIu64 " of storage %" PRIu32 " is written twice",
                      all[i].local_offset, all[i].local_storage);
    }
    free(all);
}

/* Block 0 of every local group, planned against the peer: each pair stays inside a local
 * storage and inside the registration of the remote rank it is read from, so a peer's table
 * can never make this side read or write out of bounds, and no local byte is written twice. */
static void check_request(const kvx_peer_plan_t *plan, const kvx_metadata_t *md)
{
    static const uint64_t zero = 0;
    kvx_group_ids_t groups[4]  = {{&zero, 1}, {&zero, 1}, {&zero, 1}, {&zero, 1}};
    kvx_request_t request      = {.local = groups, .num_local_groups = 4};
    kvx_pairs_t *pairs         = NULL;
    kvx_metadata_info_t info;
    kvx_status_t status;

    kvx_metadata_get_info(md, &info);
    if (local->max_group != 3 || kvx_pairs_create(&pairs) != KVX_OK)
        fuzz_fail("the harness's request does not fit the local table");
    status = kvx_peer_plan_request(plan, &request, pairs);
    if (status != KVX_OK && status != KVX_ERR_INVALID && status != KVX_ERR_OUT_OF_RANGE)
        fuzz_fail("a request of block 0 failed with %s", kvx_status_str(status));
    for (size_t read = 0; status == KVX_OK && read < kvx_pairs_num_reads(pairs); read++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, read, &rank, &count);

        for (size_t i = 0; i < count; i++) {
            kvx_registration_info_t reg;

            if (rank >= info.tp_size || p[i].local_storage >= local->num_storages ||
                kvx_metadata_registration(md, p[i].remote_storage, &reg) != KVX_OK ||
                (u128)p[i].local_offset + p[i].len > local->storage_sizes[p[i].local_storage] ||
                (u128)p[i].remote_offset + p[i].len > reg.size)
                fuzz_fail("pair %zu of read %zu (rank %" PRIu32 "): %" PRIu64 " bytes from %" PRIu32
                          "+%" PRIu64 " to %" PRIu32 "+%" PRIu64 " are out of bounds",
                          i, read, rank, p[i].len, p[i].remote_storage, p[i].remote_offset,
                          p[i].local_storage, p[i].local_offset);
        }
    }
    if (status == KVX_OK)
        check_each_byte_once(pairs);
    kvx_pairs_destroy(pairs);
}

/* Validation under one setting: its status agrees with its count and list, and a table it
 * accepts is one the planner accepts with the same setting. */
static void check_validate(kvx_metadata_t *md, uint32_t local_tp, uint32_t local_rank)
{
    kvx_metadata_info_t info;
    kvx_peer_plan_params_t params;
    kvx_peer_plan_t *plan = NULL;
    size_t count          = SIZE_MAX;
    size_t kept;
    kvx_status_t status;

    kvx_metadata_get_info(md, &info);
    params = (kvx_peer_plan_params_t){.field_mask = KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP |
                                                    KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK |
                                                    KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP,
                                      .local_tp   = local_tp,
                                      .local_rank = local_rank,
                                      .remote_tp  = info.tp_size};
    status = kvx_metadata_validate(md, local, &params, &count);
    kept   = count < KVX_MAX_DIFFERENCES ? count : KVX_MAX_DIFFERENCES;
    if (status != (count == 0 ? KVX_OK : KVX_ERR_INVALID) ||
        kvx_metadata_difference(md, kept) != NULL)
        fuzz_fail("validate (local tp %" PRIu32 "): status %d with %zu differences", local_tp,
                  (int)status, count);
    for (size_t i = 0; i < kept; i++) {
        if (kvx_metadata_difference(md, i) == NULL)
            fuzz_fail("difference %zu of %zu is missing", i, count);
    }
    if (count > 0 && strncmp(kvx_errmsg(), kvx_metadata_difference(md, 0),
                             strlen(kvx_metadata_difference(md, 0))) != 0)
        fuzz_fail("the message \"%s\" is not the first difference", kvx_errmsg());
    if (count == 0 &&
        kvx_peer_plan_create(local, kvx_metadata_regions(md), &params, &plan) != KVX_OK)
        fuzz_fail("validate accepts (local tp %" PRIu32 " rank %" PRIu32 ", remote tp %" PRIu32
                  ") what the planner rejects",
                  local_tp, local_rank, info.tp_size);
    if (plan != NULL)
        check_request(plan, md);
    kvx_peer_plan_destroy(plan);
}

/* The peer's table, packed again with its own info and decoded against itself, is the same. */
static void check_repack(const kvx_metadata_t *md)
{
    const kvx_regions_t *t = kvx_metadata_regions(md);
    size_t ns              = kvx_regions_num_storages(t);
    uint64_t *bases        = calloc(ns, sizeof(*bases));
    kvx_blob_t *keys       = calloc(ns, sizeof(*keys));
    kvx_metadata_info_t a;
    kvx_metadata_info_t b;
    kvx_metadata_params_t params;
    kvx_metadata_t *again = NULL;
    void *buf             = NULL;
    size_t size           = 0;

    if (bases == NULL || keys == NULL)
        fuzz_fail("out of memory in the harness");
    kvx_metadata_get_info(md, &a);
    for (size_t s = 0; s < ns; s++) {
        kvx_registration_info_t reg;

        kvx_metadata_registration(md, s, &reg);
        bases[s] = reg.base;
        keys[s]  = reg.remote_key;
    }
    params = (kvx_metadata_params_t){.field_mask        = md->tcp_segments_stated ? 0x1ff : 0xff,
                                     .engine_id         = a.engine_id,
                                     .agent_name        = a.agent_name,
                                     .tp_rank           = a.tp_rank,
                                     .tp_size           = a.tp_size,
                                     .mode              = a.mode,
                                     .storage_bases     = bases,
                                     .remote_keys       = keys,
                                     .transport_address = a.transport_address,
                                     .tcp_tx_seg_size   = md->tcp_tx_seg_size,
                                     .tcp_rx_seg_size   = md->tcp_rx_seg_size};
    if (kvx_metadata_pack(t, &params, &buf, &size) != KVX_OK ||
        kvx_metadata_unpack(buf, size, t, a.mode, &again) != KVX_OK)
        fuzz_fail("decoded metadata does not pack and decode again");
    kvx_metadata_get_info(again, &b);
    if (strcmp(a.engine_id, b.engine_id) != 0 || strcmp(a.agent_name, b.agent_name) != 0 ||
        a.tp_rank != b.tp_rank || a.tp_size != b.tp_size || a.block_size != b.block_size ||
        a.mode != b.mode || a.num_registrations != b.num_registrations ||
        a.transport_address.size != b.transport_address.size ||
        (a.transport_address.size > 0 &&
         memcmp(a.transport_address.data, b.transport_address.data, a.transport_address.size) != 0))
        fuzz_fail("a re-packed info decodes differently");
    if (again->tcp_segments_stated != md->tcp_segments_stated ||
        again->tcp_tx_seg_size != md->tcp_tx_seg_size ||
        again->tcp_rx_seg_size != md->tcp_rx_seg_size)
        fuzz_fail("re-packed tcp segments decode differently");
    for (size_t s = 0; s < ns; s++) {
        kvx_registration_info_t x;
        kvx_registration_info_t y;

        kvx_metadata_registration(md, s, &x);
        kvx_metadata_registration(again, s, &y);
        if (strcmp(x.storage, y.storage) != 0 || x.base != y.base || x.size != y.size ||
            x.mem != y.mem || x.device != y.device || x.remote_key.size != y.remote_key.size ||
            (x.remote_key.size > 0 &&
             memcmp(x.remote_key.data, y.remote_key.data, x.remote_key.size) != 0))
            fuzz_fail("re-packed registration %zu decodes differently", s);
    }
    for (size_t i = 0; i < kvx_regions_count(t); i++) {
        kvx_region_info_t x;
        kvx_region_info_t y;

        kvx_regions_get(t, i, &x);
        if (kvx_regions_get(kvx_metadata_regions(again), i, &y) != KVX_OK ||
            strcmp(x.name, y.name) != 0 || x.storage != y.storage || x.offset != y.offset ||
            x.block_len != y.block_len || x.stride != y.stride || x.num_blocks != y.num_blocks ||
            x.group != y.group || x.heads != y.heads || x.mla != y.mla ||
            x.packed_row != y.packed_row || x.scratch != y.scratch || x.ssm != y.ssm ||
            x.ple != y.ple)
            fuzz_fail("re-packed region %zu decodes differently", i);
    }
    kvx_metadata_destroy(again);
    kvx_free(buf);
    free(keys);
    free(bases);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvx_metadata_t *md = NULL;
    kvx_status_t status;

    error_set(KVX_OK, "%s", ""); /* so a failure below must write its own message */
    status = kvx_metadata_unpack(data, size, local, KVX_MODE_PULL, &md);
    if (status != KVX_OK) {
        if (md != NULL || kvx_errmsg()[0] == '\0' ||
            (status != KVX_ERR_INVALID && status != KVX_ERR_NO_MEMORY))
            fuzz_fail("a failed unpack returned %s, metadata %p and message \"%s\"",
                      kvx_status_str(status), (void *)md, kvx_errmsg());
        return 0;
    }
    if (md == NULL)
        fuzz_fail("unpack succeeded without a result");
    check_decoded(md);
    check_segments(md);
    check_validate(md, 1, 0);
    check_validate(md, 2, 1);
    check_validate(md, 4, 2);
    check_repack(md);
    kvx_metadata_destroy(md);
    return 0;
}

/* test_plan.c: the per-peer plan (kvx.h "Plan"), pull direction, with hand-computed numbers:
 * which remote rank each region is read from, at which offsets and lengths, under
 * heterogeneous TP and block-size ratios; the request rule of regions.md "Descriptors" on
 * both sides; plan and request errors; coalescing. Each expected number is worked out in a
 * comment above its row.
 *
 * Rows are text, so that a table stays one row per rule:
 * - A side (layout): "attn 64" is view 'a' of kind attn, page 64, in storage 0 ('kv');
 *   "stride N" its stride (default: the page); "mla 32" is MLA view 'b', page = stride = 32,
 *   in storage 1 ('lat'); "blocks N" (default 4), "bs N" (block size, default 16),
 *   "heads N" (of 'a'), "alias KIND" (an exact alias of 'a' of that kind, joining region a),
 *   "name X" and "group N" (of 'b'). Block n of 'a' is at n * stride, of 'b' at n * 32.
 *   "groups N", "one_group", "split_one", "split_two P" and "whole_row" name the fixed
 *   layouts below.
 * - Params: "tp L R T" (local_tp, local_rank, remote_tp), "bs L R" (block sizes),
 *   "max N" (max_pair_len), "bits N" (raw field_mask bits).
 * - Request ids, pairs and messages: as tests/support/plan_model.h "Pairs and requests as
 *   text" writes them, e.g. "1 | 2" (group 0: id 1, group 1: id 2) and "@0 a64<128/64"
 *   (from rank 0: 64 bytes at remote 128 of storage 0 into local 64 of storage 0). */
#include "layouts.h"
#include "plan_model.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------------------------
 * Fixed layouts
 * ------------------------------------------------------------------------------------- */

/* "groups N": three regions in storage 's', rows of 64 B, pages of 16 B: a (group 0,
 * offset 0, 4 blocks), b (group 1, offset 16, 3 blocks), and the exact aliases c.0 (group 0)
 * and c.1 (group 1) at offset 32: region c.0, shared (group -1), N blocks. Block n of a
 * region is at its offset + 64n. */
static const char groups_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 's', 'size': 256}], 'views': ["
    "{'name': 'a', 'kind': 'attn', 'group': 0, 'storage': 's', 'offset': 0, 'page': 16,"
    " 'stride': 64, 'num_blocks': 4},"
    "{'name': 'b', 'kind': 'attn', 'group': 1, 'storage': 's', 'offset': 16, 'page': 16,"
    " 'stride': 64, 'num_blocks': 3},"
    "{'name': 'c.0', 'kind': 'attn', 'group': 0, 'storage': 's', 'offset': 32, 'page': 16,"
    " 'stride': 64, 'num_blocks': %" PRIu64 "},"
    "{'name': 'c.1', 'kind': 'attn', 'group': 1, 'storage': 's', 'offset': 32, 'page': 16,"
    " 'stride': 64, 'num_blocks': %" PRIu64 "}]}";

/* "one_group": two regions of group 0 only (one distinct group id): a at 0 (4 blocks) and
 * b at 256 (8 blocks), 64 B blocks. */
static const char one_group_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 's', 'size': 768}], 'views': ["
    "{'name': 'a', 'kind': 'attn', 'storage': 's', 'page': 64, 'stride': 64, 'num_blocks': 4},"
    "{'name': 'b', 'kind': 'attn', 'storage': 's', 'offset': 256, 'page': 64, 'stride': 64,"
    " 'num_blocks': 8}]}";

/* "split_one": regions a (offset 0) and b (offset 64) of one 64 B block each, stride 128,
 * in storage 's' (0): a0 and b0 follow on. "split_two P": a in storage 'x' (1) at 0 and b
 * in storage 'y' (2) at 64, pages and strides of P, 64 / P blocks: the offsets of a's last
 * block and b's first still follow on, but the storages differ. */
static const char split_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 's', 'size': 128}, {'name': 'x', 'size': 128},"
    " {'name': 'y', 'size': 128}], 'views': ["
    "{'name': 'a', 'kind': 'attn', 'storage': '%s', 'page': %" PRIu64 ", 'stride': %" PRIu64
    ", 'num_blocks': %" PRIu64 "},"
    "{'name': 'b', 'kind': 'attn', 'storage': '%s', 'offset': 64, 'page': %" PRIu64
    ", 'stride': %" PRIu64 ", 'num_blocks': %" PRIu64 "}]}";

/* "whole_row": two padded MLA views packed in 64 B rows: one whole-row region (0, 64, 64,
 * 8). Block n is [64n, 64n + 64), so consecutive ids follow on. */
static const char whole_row_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 512}], 'views': ["
    "{'name': 'l.0', 'kind': 'mla', 'storage': 'kv', 'offset': 0, 'page': 32, 'stride': 64,"
    " 'num_blocks': 8, 'dense': false},"
    "{'name': 'l.1', 'kind': 'mla', 'storage': 'kv', 'offset': 32, 'page': 32, 'stride': 64,"
    " 'num_blocks': 8, 'dense': false}]}";

/* ---------------------------------------------------------------------------------------
 * Helpers: the row texts (see the top of the file)
 * ------------------------------------------------------------------------------------- */

static kvx_regions_t *table_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Registers the single-quoted layout printed from fmt; fails the test if it is rejected. */
static kvx_regions_t *table_printf(const char *fmt, ...)
{
    char json[2048];
    kvx_regions_t *regions = NULL;
    va_list args;
    int n;

    va_start(args, fmt);
    n = vsnprintf(json, sizeof(json), fmt, args);
    va_end(args);
    assert_true(n > 0 && (size_t)n < sizeof(json));
    if (regions_from_quoted(json, &regions) != KVX_OK)
        fail_msg("layout rejected: %s\n%s", kvx_errmsg(), json);
    return regions;
}

/* The next space-separated word of *text (at most 15 bytes); false at its end. */
static bool next_word(const char **text, char word[16])
{
    int used = 0;

    if (sscanf(*text, " %15s%n", word, &used) != 1)
        return false;
    *text += used;
    return true;
}

/* Registers the layout a side text describes. */
static kvx_regions_t *side_table(const char *text)
{
    char kind[16]   = "";
    char b_name[16] = "b";
    char alias[16]  = "";
    char word[16];
    char value[16];
    uint64_t len     = 0;
    uint64_t stride  = 0;
    uint64_t mla     = 0;
    uint64_t blocks  = 4;
    uint64_t bs      = 16;
    uint64_t heads   = 1;
    uint64_t group   = 0;
    char a_view[512] = "";
    char b_view[256] = "";

    while (next_word(&text, word)) {
        uint64_t v;

        if (strcmp(word, "one_group") == 0)
            return table_printf("%s", one_group_layout);
        if (strcmp(word, "whole_row") == 0)
            return table_printf("%s", whole_row_layout);
        if (strcmp(word, "split_one") == 0)
            return table_printf(split_layout, "s", (uint64_t)64, (uint64_t)128, (uint64_t)1, "s",
                                (uint64_t)64, (uint64_t)128, (uint64_t)1);
        assert_true(next_word(&text, value));
        v = strtoull(value, NULL, 10);
        if (strcmp(word, "groups") == 0)
            return table_printf(groups_layout, v, v);
        if (strcmp(word, "split_two") == 0)
            return table_printf(split_layout, "x", v, v, 64 / v, "y", v, v, 64 / v);
        if (strcmp(word, "stride") == 0)
            stride = v;
        else if (strcmp(word, "mla") == 0)
            mla = v;
        else if (strcmp(word, "blocks") == 0)
            blocks = v;
        else if (strcmp(word, "bs") == 0)
            bs = v;
        else if (strcmp(word, "heads") == 0)
            heads = v;
        else if (strcmp(word, "group") == 0)
            group = v;
        else if (strcmp(word, "name") == 0)
            memcpy(b_name, value, sizeof(b_name));
        else if (strcmp(word, "alias") == 0)
            memcpy(alias, value, sizeof(alias));
        else {
            memcpy(kind, word, sizeof(kind));
            len = v;
        }
    }
    stride = stride != 0 ? stride : len;
    if (kind[0] != '\0')
        snprintf(a_view, sizeof(a_view),
                 "{'name': 'a', 'kind': '%s', 'storage': 'kv', 'page': %" PRIu64
                 ", 'stride': %" PRIu64 ", 'num_blocks': %" PRIu64 ", 'heads': %" PRIu64 "}",
                 kind, len, stride, blocks, heads);
    if (alias[0] != '\0') /* an exact alias of 'a': it joins region a (regions.md 3.1) */
        snprintf(a_view + strlen(a_view), sizeof(a_view) - strlen(a_view),
                 ", {'name': 'a.x', 'kind': '%s', 'storage': 'kv', 'page': %" PRIu64
                 ", 'stride': %" PRIu64 ", 'num_blocks': %" PRIu64 "}",
                 alias, len, stride, blocks);
    if (mla != 0)
        snprintf(b_view, sizeof(b_view),
                 "%s{'name': '%s', 'kind': 'mla', 'group': %" PRIu64
                 ", 'storage': 'lat', 'page': %" PRIu64 ", 'stride': %" PRIu64
                 ", 'num_blocks': %" PRIu64 "}",
                 kind[0] != '\0' ? ", " : "", b_name, group, mla, mla, blocks);
    return table_printf("{'kvx_layout': 1, 'block_size': %" PRIu64 ", 'storages': ["
                        "{'name': 'kv', 'size': %" PRIu64 "}, {'name': 'lat', 'size': %" PRIu64
                        "}], 'views': [%s%s]}",
                        bs, kind[0] != '\0' ? blocks * stride : 64, mla != 0 ? blocks * mla : 64,
                        a_view, b_view);
}

/* The params a params text describes. */
static kvx_peer_plan_params_t params_of(const char *text)
{
    kvx_peer_plan_params_t params = {0};
    char word[16];
    int used;

    while (sscanf(text, " %15s%n", word, &used) == 1) {
        text += used;
        if (strcmp(word, "tp") == 0) {
            params.field_mask |= KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP |
                                 KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK |
                                 KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP;
            assert_int_equal(sscanf(text, " %" SCNu32 " %" SCNu32 " %" SCNu32 "%n",
                                    &params.local_tp, &params.local_rank, &params.remote_tp, &used),
                             3);
        } else if (strcmp(word, "bs") == 0) {
            params.field_mask |= KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE |
                                 KVX_PEER_PLAN_PARAM_FIELD_REMOTE_BLOCK_SIZE;
            assert_int_equal(sscanf(text, " %" SCNu64 " %" SCNu64 "%n", &params.local_block_size,
                                    &params.remote_block_size, &used),
                             2);
        } else if (strcmp(word, "max") == 0) {
            params.field_mask |= KVX_PEER_PLAN_PARAM_FIELD_MAX_PAIR_LEN;
            assert_int_equal(sscanf(text, " %" SCNu64 "%n", &params.max_pair_len, &used), 1);
        } else {
            uint64_t bits = 0;

            assert_string_equal(word, "bits");
            assert_int_equal(sscanf(text, " %" SCNu64 "%n", &bits, &used), 1);
            params.field_mask |= bits;
        }
        text += used;
    }
    return params;
}

/* Builds the request of `ids` and `remote_ids` (NULL: request.remote == NULL) in the
 * caller's storage. */
static kvx_request_t request_of(const char *ids, const char *remote_ids, struct text_groups *lg,
                                struct text_groups *rg)
{
    kvx_request_t req;

    text_parse_groups(ids, lg);
    req = (kvx_request_t){lg->count != 0 ? lg->g : NULL, lg->count, NULL, 0, NULL};
    if (remote_ids != NULL) {
        text_parse_groups(remote_ids, rg);
        req.remote            = rg->g;
        req.num_remote_groups = rg->count;
    }
    return req;
}

/* ---------------------------------------------------------------------------------------
 * Pair cases: a plan, one request, the exact pairs
 * ------------------------------------------------------------------------------------- */

struct pairs_case {
    const char *rule;
    const char *local;
    const char *remote; /* NULL: the local text */
    const char *params;
    const char *ids;
    const char *remote_ids; /* NULL: request.remote == NULL, then the default ids spelled out */
    const char *reads;
    uint64_t descriptors; /* pairs before coalescing; 0: as many as listed */
    const char *notifies; /* notify ranks, ascending; NULL: not checked */
};

/* Checks the plan's read ranks (those of `reads`, in order) and notify ranks. */
static void expect_ranks(const struct pairs_case *pc, const kvx_peer_plan_t *plan)
{
    struct text_read reads[TEXT_MAX_READS];
    size_t num_reads = text_parse_reads(pc->rule, pc->reads, reads);
    const char *text = pc->notifies;
    size_t n         = 0;

    if (kvx_peer_plan_num_reads(plan) != num_reads)
        fail_msg("%s: the plan has %zu reads", pc->rule, kvx_peer_plan_num_reads(plan));
    for (size_t r = 0; r < num_reads; r++) {
        if (kvx_peer_plan_read_rank(plan, r) != reads[r].rank)
            fail_msg("%s: plan read %zu is rank %" PRIu32, pc->rule, r,
                     kvx_peer_plan_read_rank(plan, r));
    }
    assert_int_equal(kvx_peer_plan_read_rank(plan, num_reads), UINT32_MAX);
    for (char *end; text != NULL && *text != '\0'; text = end, n++) {
        uint32_t rank = (uint32_t)strtoul(text, &end, 10);

        if (kvx_peer_plan_notify_rank(plan, n) != rank)
            fail_msg("%s: notify %zu is rank %" PRIu32 ", expected %" PRIu32, pc->rule, n,
                     kvx_peer_plan_notify_rank(plan, n), rank);
    }
    if (text != NULL && kvx_peer_plan_num_notifies(plan) != n)
        fail_msg("%s: %zu notify ranks, expected %zu", pc->rule, kvx_peer_plan_num_notifies(plan),
                 n);
    if (text != NULL)
        assert_int_equal(kvx_peer_plan_notify_rank(plan, n), UINT32_MAX);
}

static void run_pairs_cases(const struct pairs_case *cases, size_t count)
{
    kvx_pairs_t *pairs;

    assert_int_equal(kvx_pairs_create(&pairs), KVX_OK);
    for (size_t i = 0; i < count; i++) {
        const struct pairs_case *pc   = &cases[i];
        kvx_regions_t *local          = side_table(pc->local);
        kvx_regions_t *remote         = side_table(pc->remote != NULL ? pc->remote : pc->local);
        kvx_peer_plan_params_t params = params_of(pc->params);
        kvx_peer_plan_t *plan         = NULL;
        struct text_groups lg;
        struct text_groups rg;
        kvx_request_t req;

        if (kvx_peer_plan_create(local, remote, &params, &plan) != KVX_OK)
            fail_msg("%s: plan rejected: %s", pc->rule, kvx_errmsg());
        expect_ranks(pc, plan);
        for (int pass = 0; pass < (pc->remote_ids != NULL ? 1 : 2); pass++) {
            req = request_of(pc->ids, pc->remote_ids, &lg, &rg);
            if (pass == 1) {
                /* Without remote ids, naming the default ones (local id n as n*bsr + k,
                 * k < bsr) must plan the same pairs. */
                text_expand_default(&lg, text_bsr(local, remote, &params), &rg);
                req.remote            = rg.g;
                req.num_remote_groups = rg.count;
            }
            if (kvx_peer_plan_request(plan, &req, pairs) != KVX_OK)
                fail_msg("%s: request rejected: %s", pc->rule, kvx_errmsg());
            text_expect_pairs(pc->rule, pairs, pc->reads, pc->descriptors);
            if (kvx_peer_plan_num_reads(plan) != kvx_pairs_num_reads(pairs))
                fail_msg("%s: the request lists other reads than the plan", pc->rule);
        }
        kvx_peer_plan_destroy(plan);
        kvx_regions_destroy(local);
        kvx_regions_destroy(remote);
    }
    kvx_pairs_destroy(pairs);
}

#define RUN(cases) run_pairs_cases(cases, sizeof(cases) / sizeof(cases[0]))

/* ---------------------------------------------------------------------------------------
 * Heterogeneous TP: replicate vs split, ratios, notify ranks (docs/plan.md "Per region")
 * ------------------------------------------------------------------------------------- */

/* MLA view 'b' of 32 B blocks, blocks 1 and 3, whole, on both sides. */
#define B13 " b32<32/32 b96<96/32"

/* Every row requests ids "1 3" of 4 blocks: 'a' with page = stride (block n at n * len) and
 * maybe MLA 'b' (B13, from rank local_rank * remote_tp / local_tp). Head-split 'a':
 * ratio > 0: rank local_rank / ratio, remote offset n * remote_len + (local_rank % ratio) /
 * (ratio / slices) * local_len; ratio < 0: ranks local_rank * |ratio| + j * (|ratio| /
 * slices), local offset n * local_len + j * remote_len, remote offset n * remote_len.
 * Nothing coalesces here. */
static const struct pairs_case tp_cases[] = {
    /* rank 1 = local_rank; a: 1*64, 3*64 on both sides */
    {"equal TP: split and replicated regions both read whole blocks from the same rank",
     "attn 64 mla 32", NULL, "tp 2 1 2", "1 3", NULL, "@1 a64<64/64 a192<192/64" B13, 0, ""},
    /* remote block 1 at 128, +0; block 3 at 384, +0 */
    {"ratio 2: local rank 0 reads the first half of remote rank 0's block", "attn 64 mla 32",
     "attn 128 mla 32", "tp 2 0 1", "1 3", NULL, "@0 a64<128/64 a192<384/64" B13, 0, ""},
    /* (1 % 2) * 64 = 64: 128 + 64 = 192, 384 + 64 = 448; MLA from 1 * 1 / 2 = 0 */
    {"ratio 2: local rank 1 reads the second half of remote rank 0's block", "attn 64 mla 32",
     "attn 128 mla 32", "tp 2 1 1", "1 3", NULL, "@0 a64<192/64 a192<448/64" B13, 0, ""},
    /* rank 3 / 2 = 1, (3 % 2) * 64 = 64; MLA from 3 * 2 / 4 = 1 */
    {"ratio 2 (tp 4 -> 2): local rank 3 reads remote rank 1 at offset 64", "attn 64 mla 32",
     "attn 128 mla 32", "tp 4 3 2", "1 3", NULL, "@1 a64<192/64 a192<448/64" B13, 0, ""},
    /* (2 % 4) * 64 = 128: 256 + 128 = 384, 768 + 128 = 896 */
    {"ratio 4: local rank 2 reads the third quarter of remote rank 0's block", "attn 64 mla 32",
     "attn 256 mla 32", "tp 4 2 1", "1 3", NULL, "@0 a64<384/64 a192<896/64" B13, 0, ""},
    /* slice j from rank j: local n*64 + j*32, remote n*32; MLA from 0 * 2 / 1 = 0 */
    {"ratio -2: two remote ranks give half the block each, MLA comes from rank 0", "attn 64 mla 32",
     "attn 32 mla 32", "tp 1 0 2", "1 3", NULL,
     "@0 a64<32/32 a192<96/32" B13 " @1 a96<32/32 a224<96/32", 0, ""},
    /* rank 1*4 + j: local n*64 + j*16, remote n*16; MLA from 1 * 8 / 2 = 4 */
    {"ratio -4 (tp 2 -> 8): local rank 1 reads ranks 4..7, MLA from rank 4", "attn 64 mla 32",
     "attn 16 mla 32", "tp 2 1 8", "1 3", NULL,
     "@4 a64<16/16 a192<48/16" B13 " @5 a80<16/16 a208<48/16 @6 a96<16/16 a224<48/16"
     " @7 a112<16/16 a240<48/16",
     0, ""},
    /* remote ranks 4..7 hold local rank 1's share; 1 * 8 / 2 = 4 is read */
    {"ratio -4: replicated MLA is read from one rank, the other holders are notified", "mla 32",
     NULL, "tp 2 1 8", "1 3", NULL, "@4" B13, 0, "5 6 7"},
    {"ratio 4: replicated MLA is read from rank local_rank / 4, nobody else holds it", "mla 32",
     NULL, "tp 4 3 1", "1 3", NULL, "@0" B13, 0, ""},
    /* 32 * 2 = 64: 2 slices < 4; ranks 0 + j * (4 / 2) = 0, 2; local n*64 + j*32 */
    {"heads fewer than remote ranks (ratio -4, 2 slices): ranks 0 and 2 are read, 1 and 3"
     " notified",
     "attn 64 mla 32", "attn 32 mla 32", "tp 1 0 4", "1 3", NULL,
     "@0 a64<32/32 a192<96/32" B13 " @2 a96<32/32 a224<96/32", 0, "1 3"},
    /* ranks 1*4 + j*2 = 4, 6; 5 and 7 hold the same heads */
    {"heads fewer than remote ranks (tp 2 -> 8, 2 slices): local rank 1 reads 4 and 6", "attn 64",
     "attn 32", "tp 2 1 8", "1 3", NULL, "@4 a64<32/32 a192<96/32 @6 a96<32/32 a224<96/32", 0,
     "5 7"},
    {"heads fewer than remote ranks (ratio -4, 1 slice): the first rank gives the whole block",
     "attn 64", NULL, "tp 1 0 4", "1 3", NULL, "@0 a64<64/64 a192<192/64", 0, "1 2 3"},
    /* 128 / 64 = 2 slices; (1 % 4) / (4 / 2) = 0: remote 128, 384 */
    {"heads fewer than local ranks (ratio 4, 2 slices): local rank 1 reads slice 0", "attn 64",
     "attn 128", "tp 4 1 1", "1 3", NULL, "@0 a64<128/64 a192<384/64", 0, ""},
    /* (2 % 4) / 2 = 1: remote 128 + 64, 384 + 64 */
    {"heads fewer than local ranks (ratio 4, 2 slices): local rank 2 reads slice 1", "attn 64",
     "attn 128", "tp 4 2 1", "1 3", NULL, "@0 a64<192/64 a192<448/64", 0, ""},
    {"heads fewer than local ranks (ratio 4, 2 slices): local rank 3 reads slice 1", "attn 64",
     "attn 128", "tp 4 3 1", "1 3", NULL, "@0 a64<192/64 a192<448/64", 0, ""},
    /* 7 / 4 = 1; (7 % 4) / (4 / 2) = 1: +64 */
    {"heads fewer than local ranks (tp 8 -> 2, 2 slices): local rank 7 reads rank 1, slice 1",
     "attn 64", "attn 128", "tp 8 7 2", "1 3", NULL, "@1 a64<192/64 a192<448/64", 0, ""},
    {"heads fewer than local ranks (ratio 4, 1 slice): every local rank reads the whole block",
     "attn 64", NULL, "tp 4 3 1", "1 3", NULL, "@0 a64<64/64 a192<192/64", 0, ""},
    {"swa is head-split like attn (ratio -2)", "swa 64", "swa 32", "tp 1 0 2", "1 3", NULL,
     "@0 a64<32/32 a192<96/32 @1 a96<32/32 a224<96/32", 0, ""},
    {"mamba is head-split like attn (ratio 2)", "mamba 64", "mamba 128", "tp 2 1 1", "1 3", NULL,
     "@0 a64<192/64 a192<448/64", 0, ""},
    {"heads do not decide slicing: heads 8 on both sides, the lengths say ratio -2",
     "attn 64 heads 8", "attn 32 heads 8", "tp 1 0 2", "1 3", NULL,
     "@0 a64<32/32 a192<96/32 @1 a96<32/32 a224<96/32", 0, ""},
    /* blocks 1 and 3 of 48 B at 48 and 144 on both sides */
    {"ple is never split (ratio -2): the whole block from rank 0, rank 1 notified", "ple 48", NULL,
     "tp 1 0 2", "1 3", NULL, "@0 a48<48/48 a144<144/48", 0, "1"},
    {"ple is never split (ratio -4, tp 2 -> 8): local rank 1 reads rank 4 whole", "ple 48", NULL,
     "tp 2 1 8", "1 3", NULL, "@4 a48<48/48 a144<144/48", 0, "5 6 7"},
    {"ple is never split (ratio 2): the whole block from rank local_rank / 2", "ple 48", NULL,
     "tp 2 1 1", "1 3", NULL, "@0 a48<48/48 a144<144/48", 0, ""},
    {"a region of an attn and a ple member is never split (ratio -2)", "attn 48 alias ple", NULL,
     "tp 1 0 2", "1 3", NULL, "@0 a48<48/48 a144<144/48", 0, "1"},
    {"a region of an attn and an MLA member is replicated (ratio 2)", "attn 48 alias mla", NULL,
     "tp 2 1 1", "1 3", NULL, "@0 a48<48/48 a144<144/48", 0, ""},
    {"a scratch member does not stop an attn region's split (ratio -2)", "attn 64 alias scratch",
     "attn 32 alias scratch", "tp 1 0 2", "1 3", NULL,
     "@0 a64<32/32 a192<96/32 @1 a96<32/32 a224<96/32", 0, ""},
    {"scratch alone is never split (ratio -2)", "scratch 48", NULL, "tp 1 0 2", "1 3", NULL,
     "@0 a48<48/48 a144<144/48", 0, "1"},
    {"scratch alone is never split (ratio 4)", "scratch 48 mla 32", NULL, "tp 4 2 1", "1 3", NULL,
     "@0 a48<48/48 a144<144/48" B13, 0, ""},
};

static void tp_ratio_picks_ranks_offsets_lengths_and_notifies(void **state)
{
    (void)state;
    RUN(tp_cases);
}

/* ---------------------------------------------------------------------------------------
 * Block-size ratio (docs/plan.md "Block-size ratio")
 * ------------------------------------------------------------------------------------- */

/* Local block n of 'a' (len L) is bsr sub-blocks of L / bsr at n*L + k*L/bsr, each paired
 * with remote block n*bsr + k (default) or with the request's remote ids, bsr per local id,
 * in order. Remote block m is at m * remote stride. */
static const struct pairs_case bsr_cases[] = {
    /* n1: remote 2 at 96 and 3 at 144 into 64, 96; n3: remote 6 at 288, 7 at 336 */
    {"bsr 2, default remote ids: local block n reads remote blocks 2n and 2n+1", "attn 64 bs 32",
     "attn 32 stride 48 blocks 8", "", "1 3", NULL,
     "@0 a64<96/32 a96<144/32 a192<288/32 a224<336/32", 0, NULL},
    {"bsr 2, block sizes given in the params override the tables'", "attn 64",
     "attn 32 stride 48 blocks 8", "bs 32 16", "1 3", NULL,
     "@0 a64<96/32 a96<144/32 a192<288/32 a224<336/32", 0, NULL},
    /* 7*48 = 336, 0, 2*48 = 96, 5*48 = 240 */
    {"bsr 2, explicit remote ids: bsr per local id, in order", "attn 64 bs 32",
     "attn 32 stride 48 blocks 8", "", "1 3", "7 0 2 5",
     "@0 a64<336/32 a96<0/32 a192<96/32 a224<240/32", 0, NULL},
    /* remote 2, 3 at 64, 96 follow on as local 64, 96 do */
    {"bsr 2 with contiguous remote blocks: each local block coalesces into one pair",
     "attn 64 bs 32", "attn 32 blocks 8", "", "1 3", NULL, "@0 a64<64/64 a192<192/64", 4, NULL},
    /* local 128 + 16k <- remote (8 + k) * 32 */
    {"bsr 4, default remote ids: local block 2 reads remote blocks 8..11", "attn 64 bs 64",
     "attn 16 stride 32 blocks 16", "", "2", NULL,
     "@0 a128<256/16 a144<288/16 a160<320/16 a176<352/16", 0, NULL},
    {"bsr 4, explicit remote ids", "attn 64 bs 64", "attn 16 stride 32 blocks 16", "", "2",
     "3 2 1 0", "@0 a128<96/16 a144<64/16 a160<32/16 a176<0/16", 0, NULL},
    /* sub-block k at 64 + 32k reads remote block 2 + k at (2 + k) * 16; slice j from rank j
     * lands at + 16j */
    {"bsr 2 with ratio -2: each sub-block is split across two remote ranks", "attn 64 bs 32",
     "attn 16 blocks 8", "tp 1 0 2", "1", NULL, "@0 a64<32/16 a96<48/16 @1 a80<32/16 a112<48/16", 0,
     ""},
    /* 16 B sub-blocks: n1 <- 2, 3 at 32, 48; n3 <- 6, 7 at 96, 112 */
    {"bsr 2 with replicated MLA: remote blocks 2n, 2n+1 coalesce into one pair", "mla 32 bs 32",
     "mla 16 blocks 8", "", "1 3", NULL, "@0 b32<32/32 b96<96/32", 4, NULL},
};

static void block_size_ratio_pairs_sub_blocks_with_remote_blocks(void **state)
{
    (void)state;
    RUN(bsr_cases);
}

/* ---------------------------------------------------------------------------------------
 * Groups: regions.md "Descriptors" on both sides (docs/plan.md "The request")
 * ------------------------------------------------------------------------------------- */

static const struct pairs_case group_cases[] = {
    /* group 0: a n1 at 64, c n1 at 96; group 1: b n2 at 16 + 128, c n2 at 32 + 128 */
    {"a shared region takes every group's ids: group, then region, then block", "groups 4", NULL,
     "max 16", "1 | 2", NULL, "@0 a64<64/16 a96<96/16 a144<144/16 a160<160/16", 0, ""},
    /* b n2 ends at 160 where c n2 starts, on both sides */
    {"pairs of different regions coalesce when both ranges follow on", "groups 4", NULL, "",
     "1 | 2", NULL, "@0 a64<64/16 a96<96/16 a144<144/32", 4, ""},
    {"a request whose first group has no blocks still plans the other groups", "groups 4", NULL,
     "max 16", " | 2", NULL, "@0 a144<144/16 a160<160/16", 0, ""},
    /* a: 0, 64 -> one pair; b: 256, 320 -> one pair */
    {"one distinct group: every region takes the concatenation, region by region", "one_group",
     NULL, "", "0 | 1", NULL, "@0 a0<0/128 a256<256/128", 4, ""},
    /* a3 192, a1 64, b3 448, b1 320: no two follow on */
    {"one distinct group, empty first group: the second group's ids, in request order", "one_group",
     NULL, "", " | 3 1", NULL, "@0 a192<192/64 a64<64/64 a448<448/64 a320<320/64", 0, ""},
    {"groups that hold no ids: a notify-only request, no pairs", "groups 4", NULL, "", " | ", NULL,
     "@0", 0, ""},
};

static void request_rule_groups_on_both_sides(void **state)
{
    (void)state;
    RUN(group_cases);
}

/* ---------------------------------------------------------------------------------------
 * Coalescing (docs/plan.md "Coalescing")
 * ------------------------------------------------------------------------------------- */

static const struct pairs_case coalesce_cases[] = {
    /* whole_row: run 0..2: 3 x 64 = 192 at 0; run 5..6: 128 at 320 */
    {"consecutive ids of a whole-row region merge into one pair per run", "whole_row", NULL, "",
     "0 1 2 5 6", NULL, "@0 a0<0/192 a320<320/128", 5, NULL},
    /* 0..1 reach 128; block 2 starts a new pair */
    {"a merged pair never exceeds max_pair_len", "whole_row", NULL, "max 128", "0 1 2 5 6", NULL,
     "@0 a0<0/128 a128<128/64 a320<320/128", 5, NULL},
    {"max_pair_len below two descriptors forbids merging", "whole_row", NULL, "max 100",
     "0 1 2 5 6", NULL, "@0 a0<0/64 a64<64/64 a128<128/64 a320<320/64 a384<384/64", 0, NULL},
    {"a single descriptor longer than max_pair_len is never split", "whole_row", NULL, "max 1",
     "0 1 2 5 6", NULL, "@0 a0<0/64 a64<64/64 a128<128/64 a320<320/64 a384<384/64", 0, NULL},
    {"descending ids do not merge", "whole_row", NULL, "", "1 0", NULL, "@0 a64<64/64 a0<0/64", 0,
     NULL},
    /* 6, 3, 0 follow on nowhere; 1 and 2 continue 0: 3 x 64 = 192 at 0 */
    {"a run after scattered ids still merges", "whole_row", NULL, "", "6 3 0 1 2 5", NULL,
     "@0 a384<384/64 a192<192/64 a0<0/192 a320<320/64", 6, NULL},
    /* local 0 1 2, 6 7 and 3 4 follow on; remote 0 1 and 4 5 do, 1 3 and 6 0 do not */
    {"a run merges only as far as both sides follow on", "whole_row", NULL, "", "5 0 1 2 6 7 3 4",
     "5 0 1 3 6 0 4 5", "@0 a320<320/64 a0<0/128 a128<192/64 a384<384/64 a448<0/64 a192<256/128", 8,
     NULL},
    /* a0 [0, 64) and b0 [64, 128) follow on on both sides */
    {"blocks of different regions merge when both ranges follow on", "split_one", NULL, "", "0",
     NULL, "@0 a0<0/128", 2, NULL},
    /* remote a0 at x+0, b0 at y+64: the offsets follow on, the storages do not */
    {"pairs in different remote storages never merge", "split_one", "split_two 64", "", "0", NULL,
     "@0 a0<b0/64 a64<c64/64", 0, NULL},
    /* bsr 2: a0 <- x blocks 0, 1 (0, 32) merge; b0 <- y blocks 0, 1 (64, 96) merge; a's end
     * (x+64) and b's start (y+64) only look contiguous */
    {"sub-block pairs in different remote storages never merge", "split_one", "split_two 32",
     "bs 32 16", "0", NULL, "@0 a0<b0/64 a64<c64/64", 4, NULL},
    {"sub-block pairs merge within max_pair_len only", "split_one", "split_two 32",
     "bs 32 16 max 48", "0", NULL, "@0 a0<b0/32 a32<b32/32 a64<c64/32 a96<c96/32", 0, NULL},
    /* rank 0: a0 0 <- 0, a1 64 <- 128; MLA b0, b1 at 0, 32 merge into 64 B */
    {"ratio 2: local ranges follow on, remote ranges 128 B apart: no merge", "attn 64 mla 32",
     "attn 128 mla 32", "tp 2 0 1", "0 1", NULL, "@0 a0<0/64 a64<128/64 b0<0/64", 4, NULL},
    /* rank j: a0 32j <- 0, a1 64 + 32j <- 32 */
    {"ratio -2: remote ranges follow on, local ranges 64 B apart: no merge", "attn 64 mla 32",
     "attn 32 mla 32", "tp 1 0 2", "0 1", NULL,
     "@0 a0<0/32 a64<32/32 b0<0/64 @1 a32<0/32 a96<32/32", 6, NULL},
};

static void coalescing_merges_runs_within_max_pair_len(void **state)
{
    (void)state;
    RUN(coalesce_cases);
}

/* ---------------------------------------------------------------------------------------
 * Each byte once (docs/plan.md "Each byte once")
 * ------------------------------------------------------------------------------------- */

static const struct pairs_case once_cases[] = {
    /* group 0: a1 64, c1 96; group 1: b1 80, c1 96 again. Sorted: 64, 80, 96, 96: one run,
     * the second c1 dropped. Descriptors count what the request names: 4. */
    {"two groups naming one block of a shared region move it once, in local order", "groups 4",
     NULL, "", "1 | 1", NULL, "@0 a64<64/48", 4, ""},
    {"the sweep merges neighbours within max_pair_len only", "groups 4", NULL, "max 16", "1 | 1",
     NULL, "@0 a64<64/16 a80<80/16 a96<96/16", 4, ""},
    /* a2 128, c2 160; b1 80, b2 144, c1 96, c2 160: sorted 80 96 | 128 144 160 160 */
    {"ids out of order with a repeat across groups come sorted and merged", "groups 4", NULL, "",
     "2 | 1 2", NULL, "@0 a80<80/32 a128<128/48", 6, ""},
    {"one distinct group: an id in two groups moves once", "one_group", NULL, "", "0 | 0", NULL,
     "@0 a0<0/64 a256<256/64", 4, ""},
    /* requests that name no byte twice keep request order */
    {"groups naming different blocks keep request order", "groups 4", NULL, "", "2 | 1", NULL,
     "@0 a128<128/16 a160<160/16 a80<80/32", 4, ""},
};

static void each_byte_once_in_local_order(void **state)
{
    (void)state;
    RUN(once_cases);
}

/* ---------------------------------------------------------------------------------------
 * Plan errors: nothing is returned; the message names the region, field, values and rule
 * (docs/plan.md "Matching the two tables", "Per region", "Block-size ratio")
 * ------------------------------------------------------------------------------------- */

/* The fragments are short so that rewording the rest of a message does not break a row. */
static const struct plan_error_case {
    const char *rule;
    const char *local;
    const char *remote;
    const char *params;
    const char *msg;
} plan_error_cases[] = {
    {"local_tp and remote_tp must divide one another (3 and 2)", "attn 64", "attn 64", "tp 3 0 2",
     "local_tp 3|remote_tp 2|divide"},
    {"local_tp and remote_tp must divide one another (2 and 3)", "attn 64", "attn 64", "tp 2 0 3",
     "local_tp 2|remote_tp 3|divide"},
    {"local_rank must be below local_tp", "attn 64", "attn 64", "tp 2 2 2",
     "local_rank|2|local_tp"},
    {"local_tp 0 is rejected", "attn 64", "attn 64", "tp 0 0 1", "local_tp: 0"},
    {"remote_tp above KVX_MAX_TP is rejected", "attn 64", "attn 64", "tp 1 0 4097",
     "remote_tp: 4097"},
    {"unknown param bits are rejected", "attn 64", "attn 64", "bits 64", "0x40"},
    {"ratio 2: a split region's remote block must be 2 x local (or 1 x)", "attn 64", "attn 96",
     "tp 2 0 1", "region 0 (a)|block_len 96|64|ratio 2"},
    {"ratio 4: 3 slices do not divide the ratio", "attn 64", "attn 192", "tp 4 0 1",
     "region 0 (a)|block_len 192|64|ratio 4"},
    {"ratio 2: a remote block shorter than the local is wrong", "swa 64", "swa 32", "tp 2 1 1",
     "region 0 (a)|block_len 32|64|ratio 2"},
    {"ratio -2: the local block must be 2 x remote (or 1 x)", "attn 64", "attn 48", "tp 1 0 2",
     "region 0 (a)|block_len 48|64|ratio 2"},
    {"ratio -2: a remote block longer than the local is wrong", "mamba 64", "mamba 128", "tp 1 0 2",
     "region 0 (a)|block_len 128|64|ratio 2"},
    {"equal TP: split regions need equal lengths", "attn 64", "attn 128", "tp 1 0 1",
     "region 0 (a)|block_len 128|64|ratio 1"},
    {"replicated MLA lengths must agree", "attn 64 mla 32", "attn 32 mla 64", "tp 1 0 2",
     "region 1 (b)|block_len 64|32|MLA"},
    {"ple lengths must agree: ple is never split", "ple 48", "ple 24", "tp 1 0 2",
     "region 0 (a)|block_len 24|48|ple regions are never split"},
    {"ple lengths must agree at ratio 2 too", "ple 48", "ple 96", "tp 2 0 1",
     "region 0 (a)|block_len 96|48|ple regions are never split"},
    {"a region with a ple member is never split, even with an attn member", "attn 48 alias ple",
     "attn 96 alias ple", "tp 2 0 1", "region 0 (a)|block_len 96|48|ple"},
    {"a region with an MLA member is never split, even with an attn member", "attn 48 alias mla",
     "attn 96 alias mla", "tp 2 0 1", "region 0 (a)|block_len 96|48|MLA"},
    {"scratch-only lengths must agree", "scratch 48", "scratch 24", "tp 1 0 2",
     "region 0 (a)|block_len 24|48|never split"},
    {"a remote block size larger than the local one is rejected", "attn 64", "attn 64", "bs 16 32",
     "remote block (32 tokens) is larger than the local"},
    {"block sizes must divide", "attn 64", "attn 64", "bs 48 32", "local 48|remote 32|multiple"},
    {"a block must split into bsr equal sub-blocks", "attn 30", "attn 30", "bs 64 16",
     "region 0 (a)|block_len 30|bsr 4"},
    {"bsr 2: a sub-block must match the remote block", "attn 64", "attn 64", "bs 32 16",
     "region 0 (a)|block_len 64|32"},
    {"bsr 2: an MLA sub-block must match the remote block", "attn 64 mla 32", "attn 32 mla 32",
     "bs 32 16", "region 1 (b)|block_len 32|16|MLA"},
    {"region names must match", "attn 64 mla 32", "attn 64 mla 32 name c", "",
     "region 1|local name b|remote name c"},
    {"region groups must match", "attn 64 mla 32", "attn 64 mla 32 group 1", "",
     "region 1 (b)|local group 0|remote group 1"},
    {"region counts must match", "attn 64 mla 32", "attn 64", "",
     "local table has 2 regions|remote 1"},
};

static void plan_errors_name_region_field_and_values(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(plan_error_cases) / sizeof(plan_error_cases[0]); i++) {
        const struct plan_error_case *ec = &plan_error_cases[i];
        kvx_regions_t *local             = side_table(ec->local);
        kvx_regions_t *remote            = side_table(ec->remote);
        kvx_peer_plan_params_t params    = params_of(ec->params);
        kvx_peer_plan_t *plan            = NULL;
        kvx_status_t status              = kvx_peer_plan_create(local, remote, &params, &plan);

        if (status != KVX_ERR_INVALID)
            fail_msg("%s: status %d, expected KVX_ERR_INVALID", ec->rule, status);
        if (plan != NULL)
            fail_msg("%s: a failed create wrote its output", ec->rule);
        text_expect_message(ec->rule, ec->msg);
        kvx_regions_destroy(local);
        kvx_regions_destroy(remote);
    }
}

/* ---------------------------------------------------------------------------------------
 * Request errors: the whole request fails and leaves no pairs (docs/plan.md "The request")
 * ------------------------------------------------------------------------------------- */

/* "groups 4" against "groups 3": region c.0 has 4 local and 3 remote blocks; a has 4 and
 * b 3 on both sides. With bsr 2, 'a' has 4 local blocks and 7 remote ones: local block 3
 * would read remote blocks 6 and 7, and 7 is beyond. */
static const struct request_error_case {
    const char *rule;
    const char *local;
    const char *remote;
    kvx_status_t status;
    const char *ids;
    const char *remote_ids; /* NULL: request.remote == NULL */
    const char *msg;
} request_error_cases[] = {
    {"a request that names no groups is an error", "groups 4", "groups 3", KVX_ERR_INVALID, "-",
     NULL, "no groups"},
    {"a two-group table needs both groups, and the message says which", "groups 4", "groups 3",
     KVX_ERR_INVALID, "0", NULL, "names 1 group (0)|needs groups 0-1|of its groups 0 and 1"},
    {"local and remote group counts must match", "groups 4", "groups 3", KVX_ERR_INVALID, "0 | 0",
     "0 | 0 |", "2 local groups|3 remote groups"},
    {"a local id out of range names side, id, group and region", "groups 4", "groups 3",
     KVX_ERR_OUT_OF_RANGE, "0 | 3", NULL, "local block id 3|group 1|region 1 (b)"},
    {"a local id out of range late in group 0 fails the whole request", "groups 4", "groups 3",
     KVX_ERR_OUT_OF_RANGE, "1 9 | 0", NULL, "local block id 9|group 0|region 0 (a)"},
    {"an explicit remote id out of range names the remote side", "groups 4", "groups 3",
     KVX_ERR_OUT_OF_RANGE, "1 | 0", "3 | 0", "remote block id 3|group 0|region 2 (c.0)"},
    {"a default remote id out of range names the remote side", "groups 4", "groups 3",
     KVX_ERR_OUT_OF_RANGE, "3 | ", NULL, "remote block id 3|group 0|region 2 (c.0)"},
    {"a group the layout lacks is refused by name, though a shared region could take it",
     "groups 4", "groups 3", KVX_ERR_INVALID, " | | 3", NULL,
     "group 2 has block ids|no group 2|groups are 0 and 1"},
    {"a group the layout lacks is refused with remote ids only too", "groups 4", "groups 3",
     KVX_ERR_INVALID, "0 | 0 | ", "0 | 0 | 1", "group 2 has block ids|no group 2"},
    {"an id named twice in one group is refused by name", "groups 4", "groups 3",
     KVX_ERR_INVALID, "1 2 1 | 0", NULL, "group 0 names block id 1 twice"},
    {"an id named twice, ids ascending otherwise", "whole_row", "whole_row", KVX_ERR_INVALID,
     "0 1 1 2", NULL, "group 0 names block id 1 twice"},
    /* c1 from remote 1 (group 0, at 96) and from remote 2 (group 1, at 160); b1 and c1 of
     * group 1 merge into one run, which sorts first */
    {"one local byte from two places is refused naming both", "groups 4", "groups 3",
     KVX_ERR_INVALID, "1 | 1", "1 | 2",
     "local byte 96 of storage s|group 1 block 1 reads it from remote block 2 (region 2, c.0)|"
     "group 0 block 1 from remote block 1 (region 2, c.0)|nothing is transferred"},
    {"local and remote id counts must match per group", "groups 4", "groups 3", KVX_ERR_INVALID,
     "0 1 | 0", "0 | 0", "group 0|2 local|1 remote|region 0 (a)"},
    {"more remote ids than local ones are an error too", "groups 4", "groups 3", KVX_ERR_INVALID,
     "0 | 0", "0 1 | 0", "group 0|1 local|2 remote|region 0 (a)"},
    {"bsr 2: a default remote id beyond the remote table is out of range", "attn 64 bs 32",
     "attn 32 blocks 7", KVX_ERR_OUT_OF_RANGE, "3", NULL, "remote block id 7|group 0|region 0 (a)"},
    {"bsr 2: one local id needs two remote ids", "attn 64 bs 32", "attn 32 blocks 7",
     KVX_ERR_INVALID, "1", "2", "group 0|1 local|1 remote|region 0 (a)"},
};

static void request_errors_leave_no_pairs(void **state)
{
    kvx_pairs_t *pairs;

    (void)state;
    assert_int_equal(kvx_pairs_create(&pairs), KVX_OK);
    for (size_t i = 0; i < sizeof(request_error_cases) / sizeof(request_error_cases[0]); i++) {
        const struct request_error_case *ec = &request_error_cases[i];
        kvx_regions_t *local                = side_table(ec->local);
        kvx_regions_t *remote               = side_table(ec->remote);
        kvx_peer_plan_t *plan               = NULL;
        struct text_groups lg;
        struct text_groups rg;
        kvx_request_t req;
        kvx_status_t status;

        assert_int_equal(kvx_peer_plan_create(local, remote, NULL, &plan), KVX_OK);
        /* Something to clear: a good request first. */
        req = request_of(kvx_regions_count(local) == 1 ? "1" : "1 | 1", NULL, &lg, &rg);
        assert_int_equal(kvx_peer_plan_request(plan, &req, pairs), KVX_OK);
        req    = request_of(ec->ids, ec->remote_ids, &lg, &rg);
        status = kvx_peer_plan_request(plan, &req, pairs);
        if (status != ec->status)
            fail_msg("%s: status %d (%s), expected %d", ec->rule, status, kvx_errmsg(), ec->status);
        text_expect_message(ec->rule, ec->msg);
        plan_expect_empty(ec->rule, pairs);
        if (i == 0) {
            /* A group that counts ids but gives no array. */
            kvx_group_ids_t unset[2] = {{NULL, 1}, {NULL, 0}};
            kvx_request_t bad        = {unset, 2, NULL, 0, NULL};

            assert_int_equal(kvx_peer_plan_request(plan, &bad, pairs), KVX_ERR_INVALID);
            plan_expect_empty("ids counted but not given", pairs);
        }
        kvx_peer_plan_destroy(plan);
        kvx_regions_destroy(local);
        kvx_regions_destroy(remote);
    }
    kvx_pairs_destroy(pairs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tp_ratio_picks_ranks_offsets_lengths_and_notifies),
        cmocka_unit_test(block_size_ratio_pairs_sub_blocks_with_remote_blocks),
        cmocka_unit_test(request_rule_groups_on_both_sides),
        cmocka_unit_test(coalescing_merges_runs_within_max_pair_len),
        cmocka_unit_test(each_byte_once_in_local_order),
        cmocka_unit_test(plan_errors_name_region_field_and_values),
        cmocka_unit_test(request_errors_leave_no_pairs),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

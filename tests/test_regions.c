/* test_regions.c: every rule of regions.md steps 1-4 and each worked example with the
 * numbers given there. Layouts are written inline, one rule per case. */
#include "layouts.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#define MAX_REGIONS 4

struct expected_region {
    const char *name;
    uint64_t offset;
    uint64_t block_len;
    uint64_t stride;
    uint64_t num_blocks;
    int64_t group;
    const char *flags; /* the set flags, e.g. "mla,packed_row" or "" */
    uint64_t heads;
    size_t num_members;
};

static const struct table_case {
    const char *rule; /* regions.md section, shown in the report */
    const char *json;
    size_t num_regions;
    struct expected_region regions[MAX_REGIONS];
} table_cases[] = {
    /* Worked examples of regions.md, with the numbers given there. */
    {"example 1: packed MLA slab with padded pages",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 14976000}], 'views': ["
     "{'name': 'layers.0', 'kind': 'mla', 'storage': 'kv', 'offset': 0, 'page': 37440,"
     " 'stride': 149760, 'num_blocks': 100, 'dense': false},"
     "{'name': 'layers.1', 'kind': 'mla', 'storage': 'kv', 'offset': 37440, 'page': 37440,"
     " 'stride': 149760, 'num_blocks': 100, 'dense': false},"
     "{'name': 'layers.2', 'kind': 'mla', 'storage': 'kv', 'offset': 74880, 'page': 37440,"
     " 'stride': 149760, 'num_blocks': 100, 'dense': false},"
     "{'name': 'layers.3', 'kind': 'mla', 'storage': 'kv', 'offset': 112320, 'page': 37440,"
     " 'stride': 149760, 'num_blocks': 100, 'dense': false}]}",
     1,
     {{"layers.0", 0, 149760, 149760, 100, 0, "mla,packed_row", 1, 4}}},
    {"example 2: shared base, distinct lengths stay separate",
     "{'kvx_layout': 1, 'csa_linear': true, 'storages': [{'name': 'kv', 'size': 512}],"
     " 'views': [{'name': 'layers.0.swa', 'kind': 'mla', 'storage': 'kv', 'page': 256,"
     " 'stride': 256, 'num_blocks': 2, 'group': 0},"
     "{'name': 'layers.2.compressor', 'kind': 'scratch', 'storage': 'kv', 'page': 128,"
     " 'stride': 256, 'num_blocks': 2, 'group': 1}]}",
     2,
     {{"layers.0.swa", 0, 256, 256, 2, 0, "mla", 1, 1},
      {"layers.2.compressor", 0, 128, 256, 2, 1, "scratch", 1, 1}}},
    {"example 3: aliased groups in one packed row",
     "{'kvx_layout': 1, 'csa_linear': true, 'whole_row_regions': true,"
     " 'storages': [{'name': 'kv', 'size': 14976000}], 'views': ["
     "{'name': 'layers.0.attn.swa_cache', 'kind': 'mla', 'group': 0, 'storage': 'kv',"
     " 'page': 19008, 'stride': 149760, 'num_blocks': 100},"
     "{'name': 'layers.0.attn.compressor.state_cache', 'kind': 'scratch', 'group': 1,"
     " 'storage': 'kv', 'page': 32768, 'stride': 149760, 'num_blocks': 100}]}",
     1,
     {{"layers.0.attn.compressor.state_cache", 0, 149760, 149760, 100, -1, "mla,packed_row,scratch",
       1, 2}}},
    {"example 3 without whole_row_regions: the state is never truncated",
     "{'kvx_layout': 1, 'csa_linear': true,"
     " 'storages': [{'name': 'kv', 'size': 14976000}], 'views': ["
     "{'name': 'layers.0.attn.swa_cache', 'kind': 'mla', 'group': 0, 'storage': 'kv',"
     " 'page': 19008, 'stride': 149760, 'num_blocks': 100},"
     "{'name': 'layers.0.attn.compressor.state_cache', 'kind': 'scratch', 'group': 1,"
     " 'storage': 'kv', 'page': 32768, 'stride': 149760, 'num_blocks': 100}]}",
     2,
     {{"layers.0.attn.compressor.state_cache", 0, 32768, 149760, 100, 1, "scratch", 1, 1},
      {"layers.0.attn.swa_cache", 0, 19008, 149760, 100, 0, "mla", 1, 1}}},
    {"example 4: exact aliases across groups",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 256}], 'views': ["
     "{'name': 'layer.0', 'kind': 'mla', 'group': 0, 'storage': 'kv', 'page': 32,"
     " 'stride': 64, 'num_blocks': 4},"
     "{'name': 'layer.1', 'kind': 'mla', 'group': 1, 'storage': 'kv', 'page': 32,"
     " 'stride': 64, 'num_blocks': 4}]}",
     1,
     {{"layer.0", 0, 32, 64, 4, -1, "mla", 1, 2}}},
    {"example 5: narrow view becomes a whole row",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 256}], 'views': ["
     "{'name': 'l', 'kind': 'mla', 'storage': 'kv', 'page': 24, 'stride': 64,"
     " 'num_blocks': 4, 'dense': false}]}",
     1,
     {{"l", 0, 64, 64, 4, 0, "mla,packed_row", 1, 1}}},
    {"example 5: a padding tail changes nothing",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 264}], 'views': ["
     "{'name': 'l', 'kind': 'mla', 'storage': 'kv', 'page': 24, 'stride': 64,"
     " 'num_blocks': 4, 'dense': false}]}",
     1,
     {{"l", 0, 64, 64, 4, 0, "mla,packed_row", 1, 1}}},
    {"example 6: a wider view after a narrower one at the same base",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 32768}], 'views': ["
     "{'name': 'a', 'kind': 'attn', 'storage': 'kv', 'page': 1024, 'stride': 4096,"
     " 'num_blocks': 8},"
     "{'name': 'b', 'kind': 'attn', 'storage': 'kv', 'page': 2048, 'stride': 4096,"
     " 'num_blocks': 8}]}",
     2,
     {{"a", 0, 1024, 4096, 8, 0, "", 1, 1}, {"b", 0, 2048, 4096, 8, 0, "", 1, 1}}},

    /* Step 1: order. */
    {"step 1: regions follow natural order, not input order",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 4096}], 'views': ["
     "{'name': 'L3', 'kind': 'attn', 'storage': 'kv', 'offset': 0, 'page': 64, 'stride': 64,"
     " 'num_blocks': 4},"
     "{'name': 'L2.swa', 'kind': 'swa', 'storage': 'kv', 'offset': 256, 'page': 64,"
     " 'stride': 64, 'num_blocks': 4},"
     "{'name': 'L2', 'kind': 'attn', 'storage': 'kv', 'offset': 512, 'page': 64,"
     " 'stride': 64, 'num_blocks': 4},"
     "{'name': 'L10', 'kind': 'attn', 'storage': 'kv', 'offset': 768, 'page': 64,"
     " 'stride': 64, 'num_blocks': 4}]}",
     4,
     {{"L2", 512, 64, 64, 4, 0, "", 1, 1},
      {"L2.swa", 256, 64, 64, 4, 0, "", 1, 1},
      {"L3", 0, 64, 64, 4, 0, "", 1, 1},
      {"L10", 768, 64, 64, 4, 0, "", 1, 1}}},
    {"step 1: a01 sorts before a1",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 4096}], 'views': ["
     "{'name': 'a1', 'kind': 'attn', 'storage': 'kv', 'offset': 0, 'page': 64, 'stride': 64,"
     " 'num_blocks': 4},"
     "{'name': 'a01', 'kind': 'attn', 'storage': 'kv', 'offset': 256, 'page': 64,"
     " 'stride': 64, 'num_blocks': 4}]}",
     2,
     {{"a01", 256, 64, 64, 4, 0, "", 1, 1}, {"a1", 0, 64, 64, 4, 0, "", 1, 1}}},

    /* Step 2: whole-row derivation, one branch per case. */
    {"step 2: padded non-MLA page in a block-major storage is a whole row without csa",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'l', 'kind': 'attn', 'storage': 'kv', 'offset': 64, 'page': 100,"
     " 'stride': 256, 'num_blocks': 4, 'dense': false}]}",
     1,
     {{"l", 0, 256, 256, 4, 0, "packed_row", 1, 1}}},
    {"step 2: csa_linear keeps a padded MLA page narrow without whole_row_regions",
     "{'kvx_layout': 1, 'csa_linear': true, 'storages': [{'name': 'kv', 'size': 1024}],"
     " 'views': [{'name': 'l', 'kind': 'mla', 'storage': 'kv', 'offset': 64, 'page': 100,"
     " 'stride': 256, 'num_blocks': 4, 'dense': false}]}",
     1,
     {{"l", 64, 100, 256, 4, 0, "mla", 1, 1}}},
    {"step 2: whole_row_regions makes a dense MLA view a whole row",
     "{'kvx_layout': 1, 'whole_row_regions': true, 'storages': [{'name': 'kv', 'size': 1024}],"
     " 'views': [{'name': 'l', 'kind': 'swa_mla', 'storage': 'kv', 'offset': 64, 'page': 100,"
     " 'stride': 256, 'num_blocks': 4}]}",
     1,
     {{"l", 0, 256, 256, 4, 0, "mla,packed_row", 1, 1}}},
    {"step 2: whole_row_regions does not widen a dense non-MLA view",
     "{'kvx_layout': 1, 'whole_row_regions': true, 'storages': [{'name': 'kv', 'size': 1024}],"
     " 'views': [{'name': 'l', 'kind': 'attn', 'storage': 'kv', 'offset': 64, 'page': 100,"
     " 'stride': 256, 'num_blocks': 4}]}",
     1,
     {{"l", 64, 100, 256, 4, 0, "", 1, 1}}},
    {"step 2: scratch, mamba and ple pages are never whole rows",
     "{'kvx_layout': 1, 'storages': [{'name': 's', 'size': 1024}, {'name': 'm', 'size': 1024},"
     " {'name': 'p', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'scratch', 'storage': 's', 'page': 100, 'stride': 256,"
     " 'num_blocks': 4, 'dense': false},"
     "{'name': 'b', 'kind': 'mamba', 'storage': 'm', 'page': 100, 'stride': 256,"
     " 'num_blocks': 4, 'dense': false},"
     "{'name': 'c', 'kind': 'ple', 'storage': 'p', 'page': 100, 'stride': 256,"
     " 'num_blocks': 4, 'dense': false}]}",
     3,
     {{"a", 0, 100, 256, 4, 0, "scratch", 1, 1},
      {"b", 0, 100, 256, 4, 0, "ssm", 1, 1},
      {"c", 0, 100, 256, 4, 0, "ple", 1, 1}}},
    {"step 2: a storage a whole row longer than the view is not block-major",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1280}], 'views': ["
     "{'name': 'l', 'kind': 'mla', 'storage': 'kv', 'page': 100, 'stride': 256,"
     " 'num_blocks': 4, 'dense': false}]}",
     1,
     {{"l", 0, 100, 256, 4, 0, "mla", 1, 1}}},

    /* Step 3.1: exact-length aliases. */
    {"step 3.1: an MLA alias sets the canonical geometry",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 32, 'stride': 64,"
     " 'num_blocks': 4, 'heads': 2},"
     "{'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 32, 'stride': 64,"
     " 'num_blocks': 16, 'heads': 3}]}",
     1,
     {{"a", 0, 32, 64, 16, 0, "mla", 2, 2}}},
    {"step 3.1: a non-MLA alias keeps the geometry and sets heads",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'attn', 'storage': 'kv', 'page': 32, 'stride': 64,"
     " 'num_blocks': 16, 'heads': 2},"
     "{'name': 'b', 'kind': 'mamba', 'storage': 'kv', 'page': 32, 'stride': 64,"
     " 'num_blocks': 4, 'heads': 8},"
     "{'name': 'c', 'kind': 'ple', 'storage': 'kv', 'page': 32, 'stride': 64,"
     " 'num_blocks': 4, 'heads': 8}]}",
     1,
     {{"a", 0, 32, 64, 16, 0, "ssm,ple", 8, 3}}},

    /* Step 3.2: shorter non-MLA views inside a packed row, and what prevents it. */
    {"step 3.2: a shorter non-MLA alias joins a packed row, sorting before it or not",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'b.row', 'kind': 'mla', 'storage': 'kv', 'offset': 128, 'page': 128,"
     " 'stride': 256, 'num_blocks': 4, 'dense': false},"
     "{'name': 'a.state', 'kind': 'scratch', 'group': 1, 'storage': 'kv', 'page': 64,"
     " 'stride': 256, 'num_blocks': 4},"
     "{'name': 'c.state', 'kind': 'attn', 'storage': 'kv', 'page': 200,"
     " 'stride': 256, 'num_blocks': 4}]}",
     1,
     {{"a.state", 0, 256, 256, 4, -1, "mla,packed_row,scratch", 1, 3}}},
    {"step 3.2: not a packed row: the alias stays apart",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'attn', 'storage': 'kv', 'page': 128, 'stride': 256,"
     " 'num_blocks': 4},"
     "{'name': 'b', 'kind': 'scratch', 'storage': 'kv', 'page': 64, 'stride': 256,"
     " 'num_blocks': 4}]}",
     2,
     {{"a", 0, 128, 256, 4, 0, "", 1, 1}, {"b", 0, 64, 256, 4, 0, "scratch", 1, 1}}},
    {"step 3.2: another stride: the alias stays apart",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 128, 'stride': 256,"
     " 'num_blocks': 4, 'dense': false},"
     "{'name': 'b', 'kind': 'scratch', 'storage': 'kv', 'page': 64, 'stride': 128,"
     " 'num_blocks': 4}]}",
     2,
     {{"a", 0, 256, 256, 4, 0, "mla,packed_row", 1, 1}, {"b", 0, 64, 128, 4, 0, "scratch", 1, 1}}},
    {"step 3.2: other block counts: the alias stays apart",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 128, 'stride': 256,"
     " 'num_blocks': 4, 'dense': false},"
     "{'name': 'b', 'kind': 'scratch', 'storage': 'kv', 'page': 64, 'stride': 256,"
     " 'num_blocks': 2}]}",
     2,
     {{"a", 0, 256, 256, 4, 0, "mla,packed_row", 1, 1}, {"b", 0, 64, 256, 2, 0, "scratch", 1, 1}}},
    {"step 3.2: a shorter MLA view never joins",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'attn', 'storage': 'kv', 'page': 128, 'stride': 256,"
     " 'num_blocks': 4, 'dense': false},"
     "{'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 64, 'stride': 256,"
     " 'num_blocks': 4}]}",
     2,
     {{"a", 0, 256, 256, 4, 0, "packed_row", 1, 1}, {"b", 0, 64, 256, 4, 0, "mla", 1, 1}}},
    {"step 3.3: packed_row is never inferred from block_len == stride",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'attn', 'storage': 'kv', 'page': 256, 'stride': 256,"
     " 'num_blocks': 4},"
     "{'name': 'b', 'kind': 'scratch', 'storage': 'kv', 'page': 64, 'stride': 256,"
     " 'num_blocks': 4}]}",
     2,
     {{"a", 0, 256, 256, 4, 0, "", 1, 1}, {"b", 0, 64, 256, 4, 0, "scratch", 1, 1}}},
    {"step 3.1: a whole-row spec joining an exact-length region sets packed_row",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
     "{'name': 'a', 'kind': 'scratch', 'storage': 'kv', 'page': 256, 'stride': 256,"
     " 'num_blocks': 4},"
     "{'name': 'b', 'kind': 'mla', 'storage': 'kv', 'offset': 64, 'page': 64, 'stride': 256,"
     " 'num_blocks': 4, 'dense': false}]}",
     1,
     {{"a", 0, 256, 256, 4, 0, "mla,packed_row,scratch", 1, 2}}},
};

static void flags_to_text(const kvx_region_info_t *info, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s%s%s%s", info->mla ? "mla," : "",
             info->packed_row ? "packed_row," : "", info->scratch ? "scratch," : "",
             info->ssm ? "ssm," : "", info->ple ? "ple," : "");
    if (buf[0] != '\0')
        buf[strlen(buf) - 1] = '\0';
}

static void tables_match_the_rules(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(table_cases) / sizeof(table_cases[0]); i++) {
        const struct table_case *c = &table_cases[i];
        kvx_regions_t *regions;
        uint64_t descriptors = 0;

        if (regions_from_quoted(c->json, &regions) != KVX_OK)
            fail_msg("%s: registration failed: %s", c->rule, kvx_errmsg());
        if (kvx_regions_count(regions) != c->num_regions)
            fail_msg("%s: %zu regions, expected %zu", c->rule, kvx_regions_count(regions),
                     c->num_regions);
        for (size_t r = 0; r < c->num_regions; r++) {
            const struct expected_region *e = &c->regions[r];
            kvx_region_info_t info;
            char flags[64];

            assert_int_equal(kvx_regions_get(regions, r, &info), KVX_OK);
            flags_to_text(&info, flags, sizeof(flags));
            if (strcmp(info.name, e->name) != 0 || info.offset != e->offset ||
                info.block_len != e->block_len || info.stride != e->stride ||
                info.num_blocks != e->num_blocks || info.group != e->group ||
                strcmp(flags, e->flags) != 0 || info.heads != e->heads ||
                info.num_members != e->num_members || info.first_descriptor != descriptors)
                fail_msg("%s: region %zu is %s +%llu len %llu stride %llu blocks %llu group %lld"
                         " flags [%s] heads %llu members %zu",
                         c->rule, r, info.name, (unsigned long long)info.offset,
                         (unsigned long long)info.block_len, (unsigned long long)info.stride,
                         (unsigned long long)info.num_blocks, (long long)info.group, flags,
                         (unsigned long long)info.heads, info.num_members);
            descriptors += info.num_blocks;
        }
        assert_int_equal(kvx_regions_num_descriptors(regions), descriptors);
        kvx_regions_destroy(regions);
    }
}

/* Example 1 and 5: the descriptor addresses, from a base address of the storage. */
static void whole_row_descriptors_step_by_stride(void **state)
{
    const uint64_t base = 0x7f0000000000u;
    kvx_regions_t *regions;
    uint64_t addr;
    uint64_t len;

    (void)state;
    assert_int_equal(regions_from_quoted(table_cases[0].json, &regions), KVX_OK);
    for (uint64_t b = 0; b < 100; b++) {
        assert_int_equal(kvx_regions_descriptor_addr(regions, &base, b, &addr, &len), KVX_OK);
        assert_int_equal(addr, base + b * 149760);
        assert_int_equal(len, 149760);
    }
    assert_int_equal(kvx_regions_descriptor_addr(regions, &base, 100, &addr, &len),
                     KVX_ERR_OUT_OF_RANGE);
    kvx_regions_destroy(regions);

    for (size_t example = 6; example <= 7; example++) { /* 5 with and without the tail */
        assert_int_equal(regions_from_quoted(table_cases[example - 1].json, &regions), KVX_OK);
        for (uint64_t b = 0; b < 4; b++) {
            assert_int_equal(kvx_regions_descriptor_addr(regions, &base, b, &addr, &len), KVX_OK);
            assert_int_equal(addr, base + b * 64);
            assert_int_equal(len, 64);
        }
        kvx_regions_destroy(regions);
    }
}

/* Example 2: descriptors at B, B+256, B, B+256. */
static void shared_base_regions_give_separate_descriptors(void **state)
{
    const uint64_t expected[][2] = {{0, 256}, {256, 256}, {0, 128}, {256, 128}};
    const uint64_t base          = 4096;
    kvx_regions_t *regions;
    uint64_t addr;
    uint64_t len;

    (void)state;
    assert_int_equal(regions_from_quoted(table_cases[1].json, &regions), KVX_OK);
    assert_int_equal(kvx_regions_num_descriptors(regions), 4);
    for (uint64_t id = 0; id < 4; id++) {
        assert_int_equal(kvx_regions_descriptor_addr(regions, &base, id, &addr, &len), KVX_OK);
        assert_int_equal(addr, base + expected[id][0]);
        assert_int_equal(len, expected[id][1]);
    }
    kvx_regions_destroy(regions);
}

/* Example 7: two regions of capacities 2 and 3 at bases 100 and 1000. */
static void descriptors_are_numbered_region_major(void **state)
{
    const char *json =
        "{'kvx_layout': 1, 'storages': [{'name': 'a', 'size': 4096}, {'name': 'b', 'size': 4096}],"
        " 'views': [{'name': 'r0', 'kind': 'attn', 'storage': 'a', 'offset': 100, 'page': 16,"
        " 'stride': 16, 'num_blocks': 2},"
        "{'name': 'r1', 'kind': 'attn', 'storage': 'b', 'offset': 1000, 'page': 16, 'stride': 16,"
        " 'num_blocks': 3}]}";
    const uint64_t bases[2]    = {0, 0};
    const uint64_t expected[5] = {100, 116, 1000, 1016, 1032};
    kvx_regions_t *regions;
    kvx_descriptor_t d;
    uint64_t addr;
    uint64_t len;
    uint64_t id;

    (void)state;
    assert_int_equal(regions_from_quoted(json, &regions), KVX_OK);
    for (id = 0; id < 5; id++) {
        assert_int_equal(kvx_regions_descriptor_addr(regions, bases, id, &addr, &len), KVX_OK);
        assert_int_equal(addr, expected[id]);
        assert_int_equal(len, 16);
    }
    assert_int_equal(kvx_regions_descriptor_id(regions, 1, 2, &id), KVX_OK);
    assert_int_equal(id, 4);
    assert_int_equal(kvx_regions_descriptor(regions, 4, &d), KVX_OK);
    assert_int_equal(d.storage, 1);
    assert_int_equal(d.offset, 1032);
    assert_int_equal(kvx_regions_descriptor_id(regions, 0, 2, &id), KVX_ERR_OUT_OF_RANGE);
    assert_non_null(strstr(kvx_errmsg(), "block 2 of region 0 (r0): the region has 2 blocks"));
    assert_int_equal(kvx_regions_descriptor_id(regions, 2, 0, &id), KVX_ERR_OUT_OF_RANGE);
    kvx_regions_destroy(regions);
}

/* Step 4: an MLA alias that moves the stride away from an earlier member fails the proof,
 * naming both. */
static void coverage_proof_failure_names_view_and_region(void **state)
{
    const char *json = "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
                       "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 32, 'stride': 64,"
                       " 'num_blocks': 4},"
                       "{'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 32, 'stride': 128,"
                       " 'num_blocks': 4}]}";
    kvx_regions_t *regions = NULL;

    (void)state;
    assert_int_equal(regions_from_quoted(json, &regions), KVX_ERR_INVALID);
    assert_null(regions);
    assert_string_equal(kvx_errmsg(),
                        "views[0] (a) is not covered by region 0 (a): its block 1 at storage"
                        " offset 64 lies outside the region's 4 blocks of 32 bytes every 128"
                        " bytes from offset 0");
}

/* Step 4 through each branch of the proof: touching blocks, equal strides and the linear
 * walk. A member longer than its region's capacity fails; one inside passes. */
static void coverage_proof_checks_every_branch(void **state)
{
    static const struct {
        const char *rule;
        const char *json;
        bool covered;
    } cases[] = {
        {"equal strides, fewer blocks than the region",
         "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 2048}], 'views': ["
         "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 32, 'stride': 64,"
         " 'num_blocks': 4}, {'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 32,"
         " 'stride': 64, 'num_blocks': 8}]}",
         true},
        {"equal strides, more blocks than the region",
         "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 2048}], 'views': ["
         "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 32, 'stride': 64,"
         " 'num_blocks': 8}, {'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 32,"
         " 'stride': 64, 'num_blocks': 4}]}",
         false},
        {"linear walk: a member whose stride the MLA alias changed",
         "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 2048}], 'views': ["
         "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 64, 'stride': 64,"
         " 'num_blocks': 8}, {'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 64,"
         " 'stride': 128, 'num_blocks': 4}]}",
         false},
        {"touching blocks cover a member inside them",
         "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 2048}], 'views': ["
         "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 64, 'stride': 128,"
         " 'num_blocks': 4}, {'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 64,"
         " 'stride': 64, 'num_blocks': 16}]}",
         true},
        {"a member whose stride is a multiple of the region's, over 2^41 blocks",
         "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8796093022208}], 'views': ["
         "{'name': 'a', 'kind': 'attn', 'storage': 'kv', 'page': 1, 'stride': 8,"
         " 'num_blocks': 1099511627776}, {'name': 'b', 'kind': 'mla', 'storage': 'kv',"
         " 'page': 1, 'stride': 4, 'num_blocks': 2199023255552}]}",
         true},
        {"a whole row must hold a view that spills into the padding tail",
         "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1100}], 'views': ["
         "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'offset': 200, 'page': 100,"
         " 'stride': 256, 'num_blocks': 4, 'dense': false}]}",
         false},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvx_regions_t *regions = NULL;
        kvx_status_t status    = regions_from_quoted(cases[i].json, &regions);

        if ((status == KVX_OK) != cases[i].covered)
            fail_msg("%s: status %d (%s)", cases[i].rule, status, kvx_errmsg());
        if (!cases[i].covered && strstr(kvx_errmsg(), "is not covered by region") == NULL)
            fail_msg("%s: message \"%s\"", cases[i].rule, kvx_errmsg());
        kvx_regions_destroy(regions);
    }
}

/* Step 4 does bounded work on any input: a whole-row member whose residues creep down by
 * one byte a block against an MLA alias one byte wider would take 2^21 steps to settle, so
 * registration refuses it at once instead of walking (found by fuzzing). */
static void coverage_proof_work_is_bounded(void **state)
{
    const char *json =
        "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 17592186044416}], 'views': ["
        "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'offset': 2097152, 'page': 16,"
        " 'stride': 4194304, 'num_blocks': 4194304, 'dense': false},"
        "{'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 4194304, 'stride': 4194305,"
        " 'num_blocks': 4194303}]}";
    kvx_regions_t *regions = NULL;

    (void)state;
    assert_int_equal(regions_from_quoted(json, &regions), KVX_ERR_INVALID);
    assert_null(regions);
    assert_string_equal(kvx_errmsg(),
                        "views[0] (a): coverage by region 0 (a) is not settled within 1048576"
                        " steps (stride 4194304 against the region's 4194305); rejected rather"
                        " than risk an uncovered byte");
}

/* Members are listed in step-1 order and name views by layout index; equal names keep
 * input order. */
static void members_follow_step_one_order(void **state)
{
    const char *json = "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': ["
                       "{'name': 'x.2', 'kind': 'mla', 'storage': 'kv', 'page': 64, 'stride': 64,"
                       " 'num_blocks': 4, 'group': 2},"
                       "{'name': 'x.10', 'kind': 'mla', 'storage': 'kv', 'page': 64, 'stride': 64,"
                       " 'num_blocks': 4},"
                       "{'name': 'x.2', 'kind': 'mla', 'storage': 'kv', 'page': 64, 'stride': 64,"
                       " 'num_blocks': 4, 'group': 1}]}";
    kvx_regions_t *regions;
    kvx_region_info_t info;

    (void)state;
    assert_int_equal(regions_from_quoted(json, &regions), KVX_OK);
    assert_int_equal(kvx_regions_get(regions, 0, &info), KVX_OK);
    assert_int_equal(info.num_members, 3);
    assert_int_equal(info.members[0], 0);
    assert_int_equal(info.members[1], 2);
    assert_int_equal(info.members[2], 1);
    assert_string_equal(kvx_regions_view_name(regions, info.members[2]), "x.10");
    assert_null(kvx_regions_view_name(regions, 3));
    assert_int_equal(info.group, -1);
    assert_int_equal(kvx_regions_get(regions, 1, &info), KVX_ERR_OUT_OF_RANGE);
    kvx_regions_destroy(regions);
}

/* The JSON of formats.md: keys in order, exact values, registrations per used storage. */
static void json_output_has_the_formats_keys(void **state)
{
    const char *expected =
        "{\n"
        "  \"kvx_plan\": 1,\n"
        "  \"regions\": [\n"
        "    {\"index\": 0, \"name\": \"layers.0\", \"storage\": \"kv\", \"offset\": 0,"
        " \"block_len\": 149760, \"stride\": 149760, \"num_blocks\": 100, \"group\": 0,"
        " \"mla\": true, \"packed_row\": true, \"scratch\": false, \"ssm\": false,"
        " \"ple\": false, \"heads\": 1, \"members\": [\"layers.0\", \"layers.1\","
        " \"layers.2\", \"layers.3\"]}\n"
        "  ],\n"
        "  \"num_descriptors\": 100,\n"
        "  \"registrations\": [\n"
        "    {\"storage\": \"kv\", \"offset\": 0, \"size\": 14976000}\n"
        "  ]\n"
        "}";
    kvx_regions_t *regions;
    char *json;

    (void)state;
    assert_int_equal(regions_from_quoted(table_cases[0].json, &regions), KVX_OK);
    assert_int_equal(kvx_regions_to_json(regions, &json), KVX_OK);
    assert_string_equal(json, expected);
    kvx_free(json);
    kvx_regions_destroy(regions);
}

/* Names are escaped (quotes and backslashes; control bytes never get this far, test_layout)
 * and other UTF-8 is written as it is; only storages that regions use are registered. */
static void json_output_escapes_names_and_skips_unused_storages(void **state)
{
    const char *layout =
        "{'kvx_layout': 1, 'storages': [{'name': 'unused', 'size': 64},"
        " {'name': 'kv\\\\1', 'size': 64}], 'views': [{'name': 'a\\'b\\u00e9',"
        " 'kind': 'attn', 'storage': 'kv\\\\1', 'page': 64, 'stride': 64, 'num_blocks': 1}]}";
    kvx_regions_t *regions;
    char *json;

    (void)state;
    assert_int_equal(regions_from_quoted(layout, &regions), KVX_OK);
    assert_int_equal(kvx_regions_to_json(regions, &json), KVX_OK);
    assert_non_null(strstr(json, "\"name\": \"a\\\"b\xc3\xa9\", \"storage\": \"kv\\\\1\""));
    assert_null(strstr(json, "unused"));
    kvx_free(json);
    kvx_regions_destroy(regions);
}

/* The registration outlives its layout: it copies every name it reports. */
static void table_outlives_its_layout(void **state)
{
    kvx_layout_t *layout;
    kvx_regions_t *regions;
    kvx_region_info_t info;

    (void)state;
    assert_int_equal(layout_from_quoted(table_cases[2].json, &layout), KVX_OK);
    assert_int_equal(kvx_regions_register(layout, &regions), KVX_OK);
    kvx_layout_destroy(layout);
    assert_int_equal(kvx_regions_get(regions, 0, &info), KVX_OK);
    assert_string_equal(info.name, "layers.0.attn.compressor.state_cache");
    assert_string_equal(info.storage_name, "kv");
    kvx_regions_destroy(regions);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tables_match_the_rules),
        cmocka_unit_test(whole_row_descriptors_step_by_stride),
        cmocka_unit_test(shared_base_regions_give_separate_descriptors),
        cmocka_unit_test(descriptors_are_numbered_region_major),
        cmocka_unit_test(coverage_proof_failure_names_view_and_region),
        cmocka_unit_test(coverage_proof_checks_every_branch),
        cmocka_unit_test(coverage_proof_work_is_bounded),
        cmocka_unit_test(members_follow_step_one_order),
        cmocka_unit_test(json_output_has_the_formats_keys),
        cmocka_unit_test(json_output_escapes_names_and_skips_unused_storages),
        cmocka_unit_test(table_outlives_its_layout),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

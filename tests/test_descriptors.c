/* test_descriptors.c: the request rule of regions.md "Descriptors": block ids per group to
 * descriptor ids, in order, and the out-of-range error that fails the whole request. */
#include "layouts.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

/* Three regions: r0 group 0 (4 blocks), r1 group 1 (8 blocks), r2 shared by groups 0 and 1
 * through an exact alias (2 blocks). Descriptor ids: r0 0..3, r1 4..11, r2 12..13. */
static const char two_group_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 4096}], 'views': ["
    "{'name': 'r0', 'kind': 'attn', 'group': 0, 'storage': 'kv', 'offset': 0, 'page': 64,"
    " 'stride': 64, 'num_blocks': 4},"
    "{'name': 'r1', 'kind': 'swa', 'group': 1, 'storage': 'kv', 'offset': 256, 'page': 64,"
    " 'stride': 64, 'num_blocks': 8},"
    "{'name': 'r2.a', 'kind': 'mla', 'group': 0, 'storage': 'kv', 'offset': 1024, 'page': 64,"
    " 'stride': 64, 'num_blocks': 2},"
    "{'name': 'r2.b', 'kind': 'mla', 'group': 1, 'storage': 'kv', 'offset': 1024, 'page': 64,"
    " 'stride': 64, 'num_blocks': 2}]}";

/* Example 4 of regions.md: one region, group -1. */
static const char example4_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 256}], 'views': ["
    "{'name': 'layer.0', 'kind': 'mla', 'group': 0, 'storage': 'kv', 'page': 32,"
    " 'stride': 64, 'num_blocks': 4},"
    "{'name': 'layer.1', 'kind': 'mla', 'group': 1, 'storage': 'kv', 'page': 32,"
    " 'stride': 64, 'num_blocks': 4}]}";

/* Two regions in group 0 only: at most one distinct group id. */
static const char one_group_layout[] =
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 4096}], 'views': ["
    "{'name': 'a', 'kind': 'attn', 'storage': 'kv', 'page': 64, 'stride': 64,"
    " 'num_blocks': 4},"
    "{'name': 'b', 'kind': 'attn', 'storage': 'kv', 'offset': 256, 'page': 64, 'stride': 64,"
    " 'num_blocks': 8}]}";

static void request_expect(const char *layout, const kvx_group_ids_t *groups, size_t num_groups,
                           const uint64_t *expected, size_t num_expected)
{
    kvx_regions_t *regions;
    uint64_t ids[64];
    size_t count = 0;

    assert_int_equal(regions_from_quoted(layout, &regions), KVX_OK);
    assert_int_equal(kvx_regions_request_ids(regions, groups, num_groups, NULL, 0, &count), KVX_OK);
    assert_int_equal(count, num_expected);
    assert_int_equal(kvx_regions_request_ids(regions, groups, num_groups, ids, 64, &count), KVX_OK);
    assert_int_equal(count, num_expected);
    assert_memory_equal(ids, expected, num_expected * sizeof(ids[0]));
    kvx_regions_destroy(regions);
}

static void shared_region_reads_blocks_of_every_group(void **state)
{
    const uint64_t g0[]       = {0};
    const uint64_t g1[]       = {2};
    kvx_group_ids_t groups[2] = {{g0, 1}, {g1, 1}};
    const uint64_t expected[] = {0, 2}; /* blocks 0 and 2 of the one region */

    (void)state;
    request_expect(example4_layout, groups, 2, expected, 2);
}

static void ids_are_emitted_group_then_region_then_block(void **state)
{
    const uint64_t g0[]       = {1, 0};
    const uint64_t g1[]       = {0, 1};
    kvx_group_ids_t groups[2] = {{g0, 2}, {g1, 2}};
    /* group 0: r0 then shared r2; group 1: r1 then shared r2 */
    const uint64_t expected[] = {1, 0, 13, 12, 4, 5, 12, 13};

    (void)state;
    request_expect(two_group_layout, groups, 2, expected, 8);
}

/* The smallest region taking a group bounds its ids, even when another region of the group
 * would hold them. */
static void shared_region_capacity_bounds_every_group(void **state)
{
    const uint64_t g0[]       = {3};
    kvx_group_ids_t groups[2] = {{g0, 1}, {NULL, 0}};
    kvx_regions_t *regions;
    size_t count;

    (void)state;
    assert_int_equal(regions_from_quoted(two_group_layout, &regions), KVX_OK);
    assert_int_equal(kvx_regions_request_ids(regions, groups, 2, NULL, 0, &count),
                     KVX_ERR_OUT_OF_RANGE);
    assert_string_equal(kvx_errmsg(), "request: block id 3 of group 0 is out of range for"
                                      " region 2 (r2.a) of 2 blocks; nothing is transferred");
    kvx_regions_destroy(regions);
}

static void one_group_table_takes_every_group_concatenated(void **state)
{
    const uint64_t g0[]       = {2};
    const uint64_t g1[]       = {0, 3};
    kvx_group_ids_t groups[2] = {{g0, 1}, {g1, 2}};
    const uint64_t expected[] = {2, 0, 3, 4 + 2, 4 + 0, 4 + 3};

    (void)state;
    request_expect(one_group_layout, groups, 2, expected, 6);
}

static void block_id_out_of_range_fails_whole_request(void **state)
{
    const uint64_t g0[]      = {0, 1, 4};
    kvx_group_ids_t group    = {g0, 3};
    uint64_t ids[16]         = {0};
    const uint64_t zeros[16] = {0};
    kvx_regions_t *regions;
    size_t count = 99;

    (void)state;
    assert_int_equal(regions_from_quoted(one_group_layout, &regions), KVX_OK);
    assert_int_equal(kvx_regions_request_ids(regions, &group, 1, ids, 16, &count),
                     KVX_ERR_OUT_OF_RANGE);
    assert_string_equal(kvx_errmsg(), "request: block id 4 of group 0 is out of range for"
                                      " region 0 (a) of 4 blocks; nothing is transferred");
    assert_int_equal(count, 99);
    assert_memory_equal(ids, zeros, sizeof(ids));
    kvx_regions_destroy(regions);
}

static void request_must_cover_the_table_groups(void **state)
{
    const uint64_t g0[]   = {0};
    kvx_group_ids_t group = {g0, 1};
    kvx_regions_t *regions;
    size_t count;

    (void)state;
    assert_int_equal(regions_from_quoted(two_group_layout, &regions), KVX_OK);
    assert_int_equal(kvx_regions_request_ids(regions, &group, 1, NULL, 0, &count), KVX_ERR_INVALID);
    assert_string_equal(kvx_errmsg(),
                        "request: names 1 group (0), but the layout needs groups 0-1 (of its"
                        " groups 0 and 1): name each, empty when none of its blocks move");
    kvx_regions_destroy(regions);
}

/* docs/plan.md "The request": in a table of several groups, a group no view of the layout
 * is in is refused by name, though its shared region could take it. */
static void unknown_groups_are_refused(void **state)
{
    const uint64_t g0[]       = {1, 0};
    kvx_group_ids_t groups[3] = {{g0, 2}, {g0, 2}, {g0, 1}};
    kvx_regions_t *regions;
    size_t count;

    (void)state;
    assert_int_equal(regions_from_quoted(two_group_layout, &regions), KVX_OK);
    assert_int_equal(kvx_regions_request_ids(regions, groups, 3, NULL, 0, &count), KVX_ERR_INVALID);
    assert_string_equal(kvx_errmsg(), "request: group 2 has block ids, but the layout has no"
                                      " group 2 (its groups are 0 and 1); nothing is transferred");
    groups[2].count = 0; /* an empty group the layout lacks moves nothing: accepted */
    assert_int_equal(kvx_regions_request_ids(regions, groups, 3, NULL, 0, &count), KVX_OK);
    assert_int_equal(count, 8);
    kvx_regions_destroy(regions);
}

static void small_output_buffer_is_rejected_before_writing(void **state)
{
    const uint64_t g0[]   = {0, 1};
    kvx_group_ids_t group = {g0, 2};
    uint64_t ids[3]       = {7, 7, 7};
    kvx_regions_t *regions;
    size_t count;

    (void)state;
    assert_int_equal(regions_from_quoted(one_group_layout, &regions), KVX_OK);
    assert_int_equal(kvx_regions_request_ids(regions, &group, 1, ids, 3, &count), KVX_ERR_INVALID);
    assert_string_equal(kvx_errmsg(), "request: room for 3 ids, the request yields 4");
    assert_int_equal(ids[0], 7);
    kvx_regions_destroy(regions);
}

static void empty_request_yields_no_ids(void **state)
{
    kvx_group_ids_t group = {NULL, 0};
    kvx_regions_t *regions;
    size_t count = 5;

    (void)state;
    assert_int_equal(regions_from_quoted(one_group_layout, &regions), KVX_OK);
    assert_int_equal(kvx_regions_request_ids(regions, &group, 1, NULL, 0, &count), KVX_OK);
    assert_int_equal(count, 0);
    assert_int_equal(kvx_regions_request_ids(regions, NULL, 0, NULL, 0, &count), KVX_OK);
    assert_int_equal(count, 0);
    group.count = 2; /* ids promised but no array */
    assert_int_equal(kvx_regions_request_ids(regions, &group, 1, NULL, 0, &count), KVX_ERR_INVALID);
    kvx_regions_destroy(regions);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shared_region_reads_blocks_of_every_group),
        cmocka_unit_test(ids_are_emitted_group_then_region_then_block),
        cmocka_unit_test(shared_region_capacity_bounds_every_group),
        cmocka_unit_test(one_group_table_takes_every_group_concatenated),
        cmocka_unit_test(block_id_out_of_range_fails_whole_request),
        cmocka_unit_test(request_must_cover_the_table_groups),
        cmocka_unit_test(unknown_groups_are_refused),
        cmocka_unit_test(small_output_buffer_is_rejected_before_writing),
        cmocka_unit_test(empty_request_yields_no_ids),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

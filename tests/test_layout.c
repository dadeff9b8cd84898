/* test_layout.c: every validation rule of regions.md "View fields" and formats.md, through
 * layout files and through the API: each failure names the path, field and value, and
 * nothing is registered or changed. */
#include "error.h"
#include "layouts.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

/* A layout with one storage of 1024 B and one view; %s is replaced by the view's fields. */
#define ONE_VIEW(view_fields)                                                                      \
    "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 1024}], 'views': [{" view_fields "}]}"
#define VIEW_OK "'name': 'l.0', 'kind': 'attn', 'storage': 'kv', 'page': 64, 'stride': 128"

static const struct bad_layout_case {
    const char *rule;     /* shown in the report */
    const char *json;     /* single-quoted layout carrying the fault */
    const char *msg_part; /* must appear in kvx_errmsg() */
} bad_layout_cases[] = {
    {"duplicate_view_key", ONE_VIEW(VIEW_OK ", 'num_blocks': 2, 'page': 0"),
     "key \"page\" appears twice"},
    {"page_below_one",
     ONE_VIEW("'name': 'l', 'kind': 'attn', 'storage': 'kv', 'page': 0, 'stride': 8,"
              " 'num_blocks': 1"),
     "views[0].page: 0 is less than 1"},
    {"stride_below_page",
     ONE_VIEW("'name': 'l', 'kind': 'attn', 'storage': 'kv', 'page': 2048, 'stride': 1024,"
              " 'num_blocks': 1"),
     "views[0].stride: 1024 is smaller than page 2048"},
    {"zero_blocks", ONE_VIEW(VIEW_OK ", 'num_blocks': 0"), "views[0].num_blocks: 0 is less than 1"},
    {"view_past_storage_end", ONE_VIEW(VIEW_OK ", 'num_blocks': 9"),
     "views[0] (l.0): ends at byte 1088, beyond storage kv of 1024 bytes"},
    {"offset_pushes_view_out", ONE_VIEW(VIEW_OK ", 'num_blocks': 8, 'offset': 65"),
     "views[0] (l.0): ends at byte 1025"},
    {"storage_missing",
     ONE_VIEW("'name': 'l', 'kind': 'attn', 'storage': 'nope', 'page': 8, 'stride': 8,"
              " 'num_blocks': 1"),
     "views[0].storage: no storage named \"nope\""},
    {"empty_view_name",
     ONE_VIEW("'name': '', 'kind': 'attn', 'storage': 'kv', 'page': 8, 'stride': 8,"
              " 'num_blocks': 1"),
     "views[0].name: is empty"},
    {"negative_group", ONE_VIEW(VIEW_OK ", 'num_blocks': 1, 'group': -1"),
     "views[0].group: -1 is negative"},
    {"fractional_count", ONE_VIEW(VIEW_OK ", 'num_blocks': 1.5"),
     "views[0].num_blocks: 1.5 is not an integer"},
    {"negative_offset", ONE_VIEW(VIEW_OK ", 'num_blocks': 1, 'offset': -8"),
     "views[0].offset: -8 is negative"},
    {"integer_beyond_json_exact", ONE_VIEW(VIEW_OK ", 'num_blocks': 1e300"),
     "views[0].num_blocks: 1e300 is larger than 2^53"},
    /* A double would round these into range: the reader weighs each number's text. */
    {"integer_just_above_2_53", ONE_VIEW(VIEW_OK ", 'num_blocks': 1, 'offset': 9007199254740993"),
     "views[0].offset: 9007199254740993 is larger than 2^53"},
    {"storage_size_above_2_53",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 9007199254740993}], 'views': []}",
     "storages[0].size: 9007199254740993 is larger than 2^53"},
    {"exponent_above_2_53", ONE_VIEW(VIEW_OK ", 'num_blocks': 9.007199254740993e15"),
     "views[0].num_blocks: 9.007199254740993e15 is larger than 2^53"},
    {"many_digits_above_2_53", ONE_VIEW(VIEW_OK ", 'num_blocks': 123456789012345678901234567890"),
     "views[0].num_blocks: 123456789012345678901234567890 is larger than 2^53"},
    {"fraction_below_double_precision", ONE_VIEW(VIEW_OK ", 'num_blocks': 1.0000000000000001"),
     "views[0].num_blocks: 1.0000000000000001 is not an integer"},
    {"leading_zero", ONE_VIEW(VIEW_OK ", 'num_blocks': 0123"),
     "views[0].num_blocks: 0123 has a leading zero"},
    {"leading_zero_top_level", "{'kvx_layout': 01, 'storages': [], 'views': []}",
     "kvx_layout: 01 has a leading zero"},
    {"leading_zero_negative", ONE_VIEW(VIEW_OK ", 'num_blocks': 1, 'group': -07"),
     "views[0].group: -07 has a leading zero"},
    {"leading_zero_in_model",
     "{'kvx_layout': 1, 'model': {'id': 'm', 'kv_heads': 008}, 'storages': [], 'views': []}",
     "model.kv_heads: 008 has a leading zero"},
    {"leading_zero_in_second_storage",
     "{'kvx_layout': 1, 'storages': [{'name': 'a', 'size': 8}, {'name': 'b', 'size': 00}],"
     " 'views': []}",
     "storages[1].size: 00 has a leading zero"},
    {"zero_heads", ONE_VIEW(VIEW_OK ", 'num_blocks': 1, 'heads': 0"),
     "views[0].heads: 0 is less than 1"},
    {"unknown_view_key", ONE_VIEW(VIEW_OK ", 'num_blocks': 1, 'strid': 4"),
     "views[0]: unknown key \"strid\""},
    {"missing_view_stride",
     ONE_VIEW("'name': 'l', 'kind': 'attn', 'storage': 'kv', 'page': 8, 'num_blocks': 1"),
     "views[0].stride: missing (required)"},
    {"missing_view_kind",
     ONE_VIEW("'name': 'l', 'storage': 'kv', 'page': 8, 'stride': 8, 'num_blocks': 1"),
     "views[0].kind: missing (required)"},
    {"duplicate_kind_key", ONE_VIEW(VIEW_OK ", 'num_blocks': 1, 'kind': 'gqa'"),
     "key \"kind\" appears twice"},
    {"kind_not_in_list",
     ONE_VIEW("'name': 'l', 'kind': 'gqa', 'storage': 'kv', 'page': 8, 'stride': 8,"
              " 'num_blocks': 1"),
     "views[0].kind: \"gqa\" is not one of attn, swa, mla, swa_mla, scratch, mamba, ple"},
    {"string_for_integer", ONE_VIEW(VIEW_OK ", 'num_blocks': '4'"),
     "views[0].num_blocks: expected an integer"},
    {"integer_for_bool", ONE_VIEW(VIEW_OK ", 'num_blocks': 1, 'dense': 1"),
     "views[0].dense: expected true or false"},
    {"view_not_object",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8}],"
     " 'views': [3]}",
     "views[0]: expected an object"},
    {"later_view_index_named",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 64}], 'views': ["
     "{'name': 'a', 'kind': 'mla', 'storage': 'kv', 'page': 8, 'stride': 8, 'num_blocks': 1},"
     "{'name': 'b', 'kind': 'mla', 'storage': 'kv', 'page': 16, 'stride': 8, 'num_blocks': 1}]}",
     "views[1].stride: 8 is smaller than page 16"},
    {"storage_size_zero", "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 0}], 'views': []}",
     "storages[0].size: 0 is not in 1..2^63-1"},
    {"storage_name_repeated",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8}, {'name': 'kv', 'size': 8}],"
     " 'views': []}",
     "storages[1].name: \"kv\" is already a storage"},
    {"storage_missing_size", "{'kvx_layout': 1, 'storages': [{'name': 'kv'}], 'views': []}",
     "storages[0].size: missing (required)"},
    {"bad_mem",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8, 'mem': 'hbm'}],"
     " 'views': []}",
     "storages[0].mem: \"hbm\" is not dram or vram"},
    {"negative_device",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8, 'device': -1}], 'views': []}",
     "storages[0].device: -1 is negative"},
    {"unknown_storage_key",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8, 'base': 0}], 'views': []}",
     "storages[0]: unknown key \"base\""},
    {"no_storages", "{'kvx_layout': 1, 'storages': [], 'views': []}", "storages: is empty"},
    {"no_views", "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8}], 'views': []}",
     "views: is empty"},
    {"missing_views", "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8}]}",
     "views: missing (required)"},
    {"views_not_array", "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8}], 'views': {}}",
     "views: expected an array"},
    {"missing_version", "{'storages': [], 'views': []}", "kvx_layout: missing (required)"},
    {"future_version", "{'kvx_layout': 2, 'storages': [], 'views': []}",
     "kvx_layout: version 2 is not supported"},
    {"unknown_top_key", "{'kvx_layout': 1, 'tp': 2, 'storages': [], 'views': []}",
     "layout: unknown key \"tp\""},
    {"duplicate_top_key", "{'kvx_layout': 1, 'kvx_layout': 1, 'storages': [], 'views': []}",
     "layout: key \"kvx_layout\" appears twice"},
    {"block_size_zero", "{'kvx_layout': 1, 'block_size': 0, 'storages': [], 'views': []}",
     "block_size: 0 is not in 1..2^63-1"},
    {"csa_linear_not_bool",
     "{'kvx_layout': 1, 'csa_linear': 'yes', 'storages': [],"
     " 'views': []}",
     "csa_linear: expected true or false"},
    {"storage_name_with_escape",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv\\u001b[2J', 'size': 8}], 'views': []}",
     "storages[0].name: byte 2 (0x1b) is a control character, in \"kv\\x1b[2J\""},
    {"view_name_with_newline",
     ONE_VIEW("'name': 'l\\n0', 'kind': 'attn', 'storage': 'kv',"
              " 'page': 8, 'stride': 8, 'num_blocks': 1"),
     "views[0].name: byte 1 (0x0a) is a control character, in \"l\\x0a0\""},
    {"view_name_with_lone_ff",
     ONE_VIEW("'name': 'l\xff', 'kind': 'attn', 'storage': 'kv', 'page': 8, 'stride': 8,"
              " 'num_blocks': 1"),
     "views[0].name: byte 1 (0xff) is not valid UTF-8, in \"l\\xff\""},
    {"model_id_with_escape",
     "{'kvx_layout': 1, 'model': {'id': 'm\\u001b]0;x\\u0007'}, 'storages': [], 'views': []}",
     "model.id: byte 1 (0x1b) is a control character, in \"m\\x1b]0;x\\x07\""},
    {"storage_reference_escaped",
     ONE_VIEW("'name': 'l', 'kind': 'attn', 'storage': 'k\\u001bv', 'page': 8, 'stride': 8,"
              " 'num_blocks': 1"),
     "views[0].storage: no storage named \"k\\x1bv\""},
    {"mem_escaped",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8, 'mem': '\\u001b'}], 'views': []}",
     "storages[0].mem: \"\\x1b\" is not dram or vram"},
    {"unknown_key_escaped",
     "{'kvx_layout': 1, 'storages': [{'name': 'kv', 'size': 8, 'b\\u001b': 0}], 'views': []}",
     "storages[0]: unknown key \"b\\x1b\""},
    {"not_an_object", "[1, 2]", "layout: expected a JSON object"},
    {"not_json", "{'kvx_layout': 1,", "layout: not valid JSON at line 1, column"},
    {"trailing_data", "{'kvx_layout': 1, 'storages': [], 'views': []} x",
     "unexpected data after the JSON object"},
};

static void bad_layouts_fail_with_their_path(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad_layout_cases) / sizeof(bad_layout_cases[0]); i++) {
        const struct bad_layout_case *c = &bad_layout_cases[i];
        kvx_layout_t *layout            = (kvx_layout_t *)&layout; /* must stay untouched */
        kvx_status_t status             = layout_from_quoted(c->json, &layout);

        if (status != KVX_ERR_INVALID)
            fail_msg("%s: status %d, expected KVX_ERR_INVALID", c->rule, status);
        if (strstr(kvx_errmsg(), c->msg_part) == NULL)
            fail_msg("%s: message \"%s\" lacks \"%s\"", c->rule, kvx_errmsg(), c->msg_part);
        if (layout != (kvx_layout_t *)&layout)
            fail_msg("%s: the output was written on failure", c->rule);
    }
}

static void good_layout_takes_defaults(void **state)
{
    kvx_layout_t *layout;

    (void)state;
    assert_int_equal(layout_from_quoted(ONE_VIEW(VIEW_OK ", 'num_blocks': 8"), &layout), KVX_OK);
    assert_int_equal(kvx_layout_block_size(layout), 16);
    assert_int_equal(kvx_layout_num_storages(layout), 1);
    assert_int_equal(kvx_layout_num_views(layout), 1);
    kvx_layout_destroy(layout);
}

/* Integers up to 2^53 are read exactly however they are written: with an exponent, a zero
 * fraction or trailing zeros. */
static void exact_integers_up_to_2_53_are_read(void **state)
{
    kvx_layout_t *layout;

    (void)state;
    assert_int_equal(layout_from_quoted("{'kvx_layout': 1, 'block_size': 1.6e1, 'storages': ["
                                        "{'name': 'a', 'size': 9007199254740992},"
                                        " {'name': 'b', 'size': 900719925474099.2e1},"
                                        " {'name': 'c', 'size': 0.25e3}], 'views': [{'name': 'l',"
                                        " 'kind': 'attn', 'storage': 'a', 'page': 64.000,"
                                        " 'stride': 6400e-2, 'num_blocks': 10, 'group': 0,"
                                        " 'offset': -0}]}",
                                        &layout),
                     KVX_OK);
    assert_int_equal(kvx_layout_block_size(layout), 16);
    assert_int_equal(kvx_layout_storage_size(layout, 0), 9007199254740992ull);
    assert_int_equal(kvx_layout_storage_size(layout, 1), 9007199254740992ull);
    assert_int_equal(kvx_layout_storage_size(layout, 2), 250);
    kvx_layout_destroy(layout);
}

/* The API checks what JSON cannot express (values above 2^63, sums that overflow) and leaves
 * the layout as it was on every failure. */
/* A message may prefix the one before it (error_set's arguments include kvx_errmsg()): the
 * result is the prefix and the old message, not the new text overwriting its own source. */
static void an_error_can_prefix_the_one_before_it(void **state)
{
    (void)state;
    error_set(KVX_ERR_INVALID, "inner reason %d", 42);
    assert_int_equal(error_set(KVX_ERR_IO, "peer %s: %s", "127.0.0.1:7000", kvx_errmsg()),
                     KVX_ERR_IO);
    assert_string_equal(kvx_errmsg(), "peer 127.0.0.1:7000: inner reason 42");
}

static void api_failures_change_nothing(void **state)
{
    kvx_storage_params_t storage = {.name = "kv", .size = 4096};
    kvx_view_params_t view       = {.name       = "l",
                                    .kind       = KVX_VIEW_KIND_ATTN,
                                    .storage    = "kv",
                                    .page       = 64,
                                    .stride     = 64,
                                    .num_blocks = 64};
    kvx_layout_t *layout;

    (void)state;
    assert_int_equal(kvx_layout_create(NULL, &layout), KVX_OK);
    assert_int_equal(kvx_layout_validate(layout), KVX_ERR_INVALID);
    assert_int_equal(kvx_layout_add_storage(layout, &storage), KVX_OK);
    assert_int_equal(kvx_layout_add_view(layout, &view), KVX_OK);

    view.page = view.stride = (uint64_t)1 << 63;
    assert_int_equal(kvx_layout_add_view(layout, &view), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "views[1].page: 9223372036854775808 does not fit in 63"
                                         " bits"));
    view.page       = 64;
    view.stride     = (uint64_t)1 << 62;
    view.num_blocks = 4;
    assert_int_equal(kvx_layout_add_view(layout, &view), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "overflows 63 bits"));
    view.stride     = 64;
    view.num_blocks = 64;
    view.field_mask = 1u << 30;
    assert_int_equal(kvx_layout_add_view(layout, &view), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "views[1]: unknown field bits 0x40000000"));
    view.field_mask = KVX_VIEW_PARAM_FIELD_GROUP;
    view.group      = -3;
    assert_int_equal(kvx_layout_add_view(layout, &view), KVX_ERR_INVALID);
    view.field_mask = 0;
    view.kind       = (kvx_view_kind_t)99;
    assert_int_equal(kvx_layout_add_view(layout, &view), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "views[1].kind: 99 is not a view kind"));
    assert_int_equal(kvx_layout_add_storage(layout, &storage), KVX_ERR_INVALID);
    assert_int_equal(kvx_layout_num_views(layout), 1);
    assert_int_equal(kvx_layout_num_storages(layout), 1);
    assert_int_equal(kvx_layout_validate(layout), KVX_OK);
    kvx_layout_destroy(layout);
}

static void unknown_param_bits_are_rejected(void **state)
{
    kvx_layout_params_t params = {.field_mask = 1u << 7};
    kvx_layout_t *layout       = NULL;

    (void)state;
    assert_int_equal(kvx_layout_create(&params, &layout), KVX_ERR_INVALID);
    assert_null(layout);
    assert_non_null(strstr(kvx_errmsg(), "unknown field bits 0x80"));
}

static void missing_file_is_an_io_error(void **state)
{
    kvx_layout_t *layout = NULL;

    (void)state;
    assert_int_equal(kvx_layout_load_file("/nonexistent/kvx.json", &layout), KVX_ERR_IO);
    assert_non_null(strstr(kvx_errmsg(), "/nonexistent/kvx.json: No such file"));
    assert_null(layout);
}

/* A layout file with a syntax error names the file, and the line and column where cJSON
 * stopped, as an editor counts them (issue 24 item 9: a byte offset alone made the reader
 * count lines); data after the object is placed the same way. */
static void a_json_error_names_the_file_line_and_column(void **state)
{
    static const struct {
        const char *text;
        const char *message; /* after the path */
    } cases[] = {
        {"{\n  \"kvx_layout\": 1,\n  \"storages\": [,]\n}\n",
         ": layout: not valid JSON at line 3, column 16 (near byte 36)"},
        {"{\"kvx_layout\": 1, \"storages\": [], \"views\": []}\n\n  x\n",
         ": layout: unexpected data after the JSON object at line 3, column 3 (byte 50)"},
    };
    char path[] = "/tmp/kvx-test-layout-XXXXXX";
    char expected[256];
    kvx_layout_t *layout = NULL;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, cases[i].text, strlen(cases[i].text)),
                         (ssize_t)strlen(cases[i].text));
        close(fd);
        assert_int_equal(kvx_layout_load_file(path, &layout), KVX_ERR_INVALID);
        assert_null(layout);
        snprintf(expected, sizeof(expected), "%s%s", path, cases[i].message);
        assert_string_equal(kvx_errmsg(), expected);
        unlink(path);
        memcpy(path + strlen(path) - 6, "XXXXXX", 6);
    }
}

/* True when every byte of `text` is printable ASCII: what a message made of ASCII fields
 * and escaped names must be. */
static bool is_printable_ascii(const char *text)
{
    for (; *text != '\0'; text++) {
        if ((unsigned char)*text < 0x20 || (unsigned char)*text >= 0x7f)
            return false;
    }
    return true;
}

/* Names and model strings must be printable UTF-8: no control byte (C0, DEL, C1) and no
 * byte outside a well-formed sequence. The message names the field and the byte offset and
 * quotes the value escaped, never raw. */
static const struct bad_name_case {
    const char *rule;
    const char *name;
    const char *msg_part; /* after the field's path */
} bad_name_cases[] = {
    {"escape", "kv\x1b[31m", ": byte 2 (0x1b) is a control character, in \"kv\\x1b[31m\""},
    {"newline", "kv\nx", ": byte 2 (0x0a) is a control character, in \"kv\\x0ax\""},
    {"tab_first", "\tkv", ": byte 0 (0x09) is a control character, in \"\\x09kv\""},
    {"delete", "a\x7f", ": byte 1 (0x7f) is a control character, in \"a\\x7f\""},
    {"c1_csi", "a\xc2\x9b", ": byte 1 (0xc2) is a control character, in \"a\\xc2\\x9b\""},
    {"lone_ff", "a\xff", ": byte 1 (0xff) is not valid UTF-8, in \"a\\xff\""},
    {"stray_continuation", "\x80z", ": byte 0 (0x80) is not valid UTF-8, in \"\\x80z\""},
    {"overlong_two_bytes", "a\xc0\xaf", ": byte 1 (0xc0) is not valid UTF-8"},
    {"overlong_three_bytes", "\xe0\x80\xaf", ": byte 0 (0xe0) is not valid UTF-8"},
    {"surrogate", "x\xed\xa0\x80", ": byte 1 (0xed) is not valid UTF-8"},
    {"above_u10ffff", "\xf4\x90\x80\x80", ": byte 0 (0xf4) is not valid UTF-8"},
    {"truncated_sequence", "ab\xe5\xb1", ": byte 2 (0xe5) is not valid UTF-8, in \"ab\\xe5\\xb1\""},
};

static void check_bad_name(const char *rule, const char *what, kvx_status_t status,
                           const char *field, const char *msg_part)
{
    if (status != KVX_ERR_INVALID)
        fail_msg("%s as %s: status %d, expected KVX_ERR_INVALID", rule, what, status);
    if (strncmp(kvx_errmsg(), field, strlen(field)) != 0 || strstr(kvx_errmsg(), msg_part) == NULL)
        fail_msg("%s as %s: message \"%s\" lacks \"%s%s\"", rule, what, kvx_errmsg(), field,
                 msg_part);
    if (!is_printable_ascii(kvx_errmsg()))
        fail_msg("%s as %s: the message carries raw bytes", rule, what);
}

static void unprintable_names_are_rejected_escaped(void **state)
{
    kvx_storage_params_t storage = {.name = "kv", .size = 4096};
    kvx_view_params_t view       = {
              .kind = KVX_VIEW_KIND_ATTN, .storage = "kv", .page = 64, .stride = 64, .num_blocks = 1};
    kvx_layout_t *layout;

    (void)state;
    assert_int_equal(kvx_layout_create(NULL, &layout), KVX_OK);
    assert_int_equal(kvx_layout_add_storage(layout, &storage), KVX_OK);
    for (size_t i = 0; i < sizeof(bad_name_cases) / sizeof(bad_name_cases[0]); i++) {
        const struct bad_name_case *c = &bad_name_cases[i];
        kvx_storage_params_t s        = {.name = c->name, .size = 64};
        kvx_model_t model             = {.id = c->name};
        kvx_model_t backend           = {.id = "m", .backend = c->name};

        view.name = c->name;
        check_bad_name(c->rule, "a storage name", kvx_layout_add_storage(layout, &s),
                       "storages[1].name", c->msg_part);
        check_bad_name(c->rule, "a view name", kvx_layout_add_view(layout, &view), "views[0].name",
                       c->msg_part);
        check_bad_name(c->rule, "a model id", kvx_layout_set_model(layout, &model), "model.id",
                       c->msg_part);
        check_bad_name(c->rule, "a backend", kvx_layout_set_model(layout, &backend),
                       "model.backend", c->msg_part);
    }
    assert_int_equal(kvx_layout_num_storages(layout), 1);
    assert_int_equal(kvx_layout_num_views(layout), 0);
    kvx_layout_destroy(layout);
}

/* Multi-byte UTF-8 is a name like any other, through the API and through a file. */
static void utf8_names_are_accepted(void **state)
{
    static const char *const names[] = {"\xc3\xa9", "\xe5\xb1\x82.0", "kv\xf0\x9f\x98\x80",
                                        "a\"b\\c", "\xef\xbf\xbd"};
    kvx_layout_t *layout;

    (void)state;
    assert_int_equal(kvx_layout_create(NULL, &layout), KVX_OK);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        kvx_storage_params_t s = {.name = names[i], .size = 64};
        kvx_view_params_t v    = {.name       = names[i],
                                  .kind       = KVX_VIEW_KIND_ATTN,
                                  .storage    = names[i],
                                  .page       = 64,
                                  .stride     = 64,
                                  .num_blocks = 1};
        kvx_model_t model      = {.id = names[i], .backend = names[i]};

        if (kvx_layout_add_storage(layout, &s) != KVX_OK ||
            kvx_layout_add_view(layout, &v) != KVX_OK ||
            kvx_layout_set_model(layout, &model) != KVX_OK)
            fail_msg("name %zu: %s", i, kvx_errmsg());
    }
    kvx_layout_destroy(layout);
    assert_int_equal(layout_from_quoted("{'kvx_layout': 1, 'model': {'id': '\xe5\xb1\x82'},"
                                        " 'storages': [{'name': '\\u00e9', 'size': 64}],"
                                        " 'views': [{'name': '\xe5\xb1\x82.0', 'kind': 'attn',"
                                        " 'storage': '\xc3\xa9', 'page': 64, 'stride': 64,"
                                        " 'num_blocks': 1}]}",
                                        &layout),
                     KVX_OK);
    kvx_layout_destroy(layout);
}

/* A FIFO without a writer, a directory or a device is refused by its type before any read,
 * so loading one never blocks (alarm: a hang fails the test instead of stalling it). */
static void non_regular_files_fail_without_blocking(void **state)
{
    char dir[]           = "/tmp/kvx_test_layout_XXXXXX";
    const char *paths[]  = {NULL, dir, "/dev/null"};
    const char *types[]  = {"is a FIFO", "is a directory", "is a character device"};
    kvx_layout_t *layout = NULL;
    char fifo[64];

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/layout.json", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    paths[0] = fifo;
    alarm(10);
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        assert_int_equal(kvx_layout_load_file(paths[i], &layout), KVX_ERR_IO);
        assert_null(layout);
        if (strstr(kvx_errmsg(), paths[i]) == NULL || strstr(kvx_errmsg(), types[i]) == NULL)
            fail_msg("%s: message \"%s\" lacks the path or \"%s\"", paths[i], kvx_errmsg(),
                     types[i]);
    }
    alarm(0);
    unlink(fifo);
    rmdir(dir);
}

/* Many storages and views exercise the name index's growth. */
static void many_storages_are_found_by_name(void **state)
{
    kvx_layout_t *layout;
    char name[32];

    (void)state;
    assert_int_equal(kvx_layout_create(NULL, &layout), KVX_OK);
    for (int i = 0; i < 1000; i++) {
        kvx_storage_params_t s = {.name = name, .size = 64};

        snprintf(name, sizeof(name), "layers.%d", i);
        assert_int_equal(kvx_layout_add_storage(layout, &s), KVX_OK);
    }
    for (int i = 999; i >= 0; i--) {
        kvx_view_params_t v = {.name       = name,
                               .kind       = KVX_VIEW_KIND_MLA,
                               .storage    = name,
                               .page       = 32,
                               .stride     = 32,
                               .num_blocks = 2};

        snprintf(name, sizeof(name), "layers.%d", i);
        assert_int_equal(kvx_layout_add_view(layout, &v), KVX_OK);
    }
    assert_int_equal(kvx_layout_num_views(layout), 1000);
    kvx_layout_destroy(layout);
}

/* Bytes the strict reader must refuse that a C string cannot carry: a NUL followed by more
 * data, and a name that \u0000 would cut short (two names could then collide). One final
 * terminator, as strlen() + 1 gives, is accepted. */
static void nul_bytes_are_rejected(void **state)
{
    static const char good[]      = "{\"kvx_layout\": 1, \"storages\": [{\"name\": \"kv\", "
                                    "\"size\": 64}], \"views\": [{\"name\": \"a\", \"kind\": "
                                    "\"attn\", \"storage\": \"kv\", \"page\": 64, \"stride\": 64, "
                                    "\"num_blocks\": 1}]}";
    static const char escaped[]   = "{\"kvx_layout\": 1, \"storages\": [{\"name\": \"k\\u0000v\", "
                                    "\"size\": 64}], \"views\": []}";
    static const char backslash[] = "{\"kvx_layout\": 1, \"storages\": [{\"name\": "
                                    "\"k\\\\u0000v\", \"size\": 64}], \"views\": [{\"name\": "
                                    "\"a\", \"kind\": \"attn\", \"storage\": \"k\\\\u0000v\", "
                                    "\"page\": 64, \"stride\": 64, \"num_blocks\": 1}]}";
    char with_tail[sizeof(good) + 4];
    kvx_layout_t *layout = NULL;

    (void)state;
    assert_int_equal(kvx_layout_load_buffer(good, sizeof(good), &layout), KVX_OK);
    kvx_layout_destroy(layout);
    memcpy(with_tail, good, sizeof(good));
    memcpy(with_tail + sizeof(good), "{}", 2);
    assert_int_equal(kvx_layout_load_buffer(with_tail, sizeof(good) + 2, &layout), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "NUL byte"));
    assert_int_equal(kvx_layout_load_buffer(escaped, strlen(escaped), &layout), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "\\u0000"));
    /* An escaped backslash followed by u0000 is text, not a NUL. */
    assert_int_equal(kvx_layout_load_buffer(backslash, strlen(backslash), &layout), KVX_OK);
    kvx_layout_destroy(layout);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_layouts_fail_with_their_path),
        cmocka_unit_test(good_layout_takes_defaults),
        cmocka_unit_test(exact_integers_up_to_2_53_are_read),
        cmocka_unit_test(api_failures_change_nothing),
        cmocka_unit_test(an_error_can_prefix_the_one_before_it),
        cmocka_unit_test(unknown_param_bits_are_rejected),
        cmocka_unit_test(missing_file_is_an_io_error),
        cmocka_unit_test(a_json_error_names_the_file_line_and_column),
        cmocka_unit_test(non_regular_files_fail_without_blocking),
        cmocka_unit_test(many_storages_are_found_by_name),
        cmocka_unit_test(nul_bytes_are_rejected),
        cmocka_unit_test(unprintable_names_are_rejected_escaped),
        cmocka_unit_test(utf8_names_are_accepted),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

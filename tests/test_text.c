/* test_text.c: kvx_json_quote, the one JSON string writer (issue 24): what it escapes, that
 * it cuts like snprintf, and that a JSON parser reads back every byte string it quoted. */
#include "kvx.h"
#include "prng.h"

#include <cjson/cJSON.h>

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static void json_quote_escapes_quotes_backslashes_and_control_bytes(void **state)
{
    static const struct quote_case {
        const char *rule;
        const char *text;
        const char *json;
    } cases[] = {
        {"empty_is_two_quotes", "", "\"\""},
        {"plain_as_is", "kv_cache.0", "\"kv_cache.0\""},
        {"quote_escaped", "a\"b", "\"a\\\"b\""},
        {"backslash_escaped", "a\\b", "\"a\\\\b\""},
        {"newline_as_u000a", "a\nb", "\"a\\u000ab\""},
        {"unit_separator_as_u001f", "\x1f", "\"\\u001f\""},
        {"del_as_is", "\x7f", "\"\x7f\""},
        {"utf8_as_is", "\xe5\xb1\x82", "\"\xe5\xb1\x82\""},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[64];
        size_t len = kvx_json_quote(out, sizeof(out), cases[i].text);

        if (strcmp(out, cases[i].json) != 0 || len != strlen(cases[i].json))
            fail_msg("%s: got %s (%zu), expected %s", cases[i].rule, out, len, cases[i].json);
    }
}

/* snprintf's contract: the whole length always, at most size bytes written, NUL-terminated. */
static void json_quote_cuts_like_snprintf(void **state)
{
    char out[8];

    (void)state;
    assert_int_equal(kvx_json_quote(NULL, 0, "a\"b"), 6);
    memset(out, 'x', sizeof(out));
    assert_int_equal(kvx_json_quote(out, 4, "a\"b"), 6);
    assert_string_equal(out, "\"a\\");
    assert_int_equal(out[4], 'x'); /* nothing past size */
    assert_int_equal(kvx_json_quote(out, 1, "abc"), 5);
    assert_string_equal(out, "");
    assert_int_equal(kvx_json_quote(out, 7, "abcde"), 7);
    assert_string_equal(out, "\"abcde"); /* one short: cut */
    assert_int_equal(kvx_json_quote(out, 8, "abcde"), 7);
    assert_string_equal(out, "\"abcde\"");
}

/* Any bytes but NUL, quoted, parse back to themselves: the quote is valid JSON. */
static void json_quote_round_trips_through_a_json_parser(void **state)
{
    uint64_t seed = prng_seed_from_env(24);
    struct prng prng;

    (void)state;
    prng_init(&prng, seed);
    for (int round = 0; round < 2000; round++) {
        char text[64];
        char json[6 * sizeof(text) + 3];
        size_t n = (size_t)prng_range(&prng, 0, sizeof(text) - 1);
        cJSON *parsed;

        for (size_t i = 0; i < n; i++)
            text[i] = (char)prng_range(&prng, 1, 255);
        text[n] = '\0';
        assert_true(kvx_json_quote(json, sizeof(json), text) < sizeof(json));
        parsed = cJSON_Parse(json);
        if (parsed == NULL || !cJSON_IsString(parsed) || strcmp(parsed->valuestring, text) != 0)
            fail_msg("seed %" PRIu64 " round %d: %s does not parse back", seed, round, json);
        cJSON_Delete(parsed);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_quote_escapes_quotes_backslashes_and_control_bytes),
        cmocka_unit_test(json_quote_cuts_like_snprintf),
        cmocka_unit_test(json_quote_round_trips_through_a_json_parser),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_natural_order.c: the name order of regions.md step 1, case by case. */
#include "natural_order.h"

#include "prng.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static const struct order_case {
    const char *rule;
    const char *before; /* must sort strictly before `after` */
    const char *after;
} order_cases[] = {
    {"digits_compare_by_value", "layers.2", "layers.10"},
    {"digits_compare_by_value_deep", "layers.9.attn", "layers.10.attn"},
    {"shorter_name_is_prefix_first", "L2", "L2.swa"},
    {"prefix_run_then_next_layer", "L2.swa", "L3"},
    {"equal_keys_fall_back_to_bytes", "a01", "a1"},
    {"leading_zeros_equal_value_bytewise", "layer.007", "layer.7"},
    {"digit_run_before_text_run", "a1", "a.x"},
    {"digit_run_before_text_run_at_start", "9z", "a"},
    {"text_runs_bytewise", "layers.1.attn", "layers.1.mla"},
    {"text_run_prefix_first", "ab1", "abc"},
    {"digit_runs_longer_than_64_bits", "x18446744073709551615", "x18446744073709551616"},
    {"digit_runs_of_100_digits",
     "n10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "00000000",
     "n20000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
     "00000000"},
    {"empty_sorts_first", "", "a"},
    {"high_bytes_after_ascii", "layer", "layer\xc3\xa9"},
};

static void ordered_pairs_compare_both_ways(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(order_cases) / sizeof(order_cases[0]); i++) {
        const struct order_case *c = &order_cases[i];

        if (!(natural_order_compare(c->before, c->after) < 0 &&
              natural_order_compare(c->after, c->before) > 0))
            fail_msg("%s: expected \"%s\" < \"%s\"", c->rule, c->before, c->after);
    }
}

static void equal_only_for_identical_names(void **state)
{
    (void)state;
    assert_int_equal(natural_order_compare("layers.10.attn", "layers.10.attn"), 0);
    assert_int_equal(natural_order_compare("", ""), 0);
    assert_int_not_equal(natural_order_compare("a01", "a1"), 0);
}

/* Sorting a shuffled list must give one order: the comparison is a total order. */
static int compare_strings(const void *a, const void *b)
{
    return natural_order_compare(*(const char *const *)a, *(const char *const *)b);
}

static void sort_of_layer_names_is_natural(void **state)
{
    const char *names[] = {"layers.10", "L3", "layers.2", "L2.swa", "a1", "layers.1", "L2", "a01"};
    const char *expected[] = {"L2", "L2.swa",   "L3",       "a01",
                              "a1", "layers.1", "layers.2", "layers.10"};

    (void)state;
    qsort(names, 8, sizeof(names[0]), compare_strings);
    for (size_t i = 0; i < 8; i++)
        assert_string_equal(names[i], expected[i]);
}

/* memcmp order of natural_order_key(), with equal keys falling back to strcmp. */
static int compare_by_key(const char *a, const char *b)
{
    unsigned char ka[NATURAL_ORDER_KEY_MAX(32)];
    unsigned char kb[NATURAL_ORDER_KEY_MAX(32)];
    size_t la = natural_order_key(a, ka);
    size_t lb = natural_order_key(b, kb);
    int ret   = memcmp(ka, kb, la < lb ? la : lb);

    if (ret == 0 && la != lb)
        ret = la < lb ? -1 : 1;
    return ret != 0 ? ret : strcmp(a, b);
}

static int sign(int x)
{
    return (x > 0) - (x < 0);
}

/* Registration sorts by keys; the keys must agree with the comparison on every pair. Names
 * are drawn from a small alphabet of digits, zeros, dots and letters so runs collide often. */
static void keys_order_names_as_the_comparison_does(void **state)
{
    static const char alphabet[] = "00123.a.bL";
    uint64_t seed                = prng_seed_from_env(20261129);
    struct prng prng;
    char a[32];
    char b[32];

    (void)state;
    prng_init(&prng, seed);
    for (int i = 0; i < 200000; i++) {
        size_t la = prng_range(&prng, 0, 12);
        size_t lb = prng_range(&prng, 0, 12);

        for (size_t k = 0; k < la; k++)
            a[k] = alphabet[prng_range(&prng, 0, sizeof(alphabet) - 2)];
        for (size_t k = 0; k < lb; k++)
            b[k] =
                prng_range(&prng, 0, 3) == 0 && k < la ? a[k] : alphabet[prng_range(&prng, 0, 9)];
        a[la] = '\0';
        b[lb] = '\0';
        if (sign(compare_by_key(a, b)) != sign(natural_order_compare(a, b)))
            fail_msg("seed %llu: keys order \"%s\" and \"%s\" differently",
                     (unsigned long long)seed, a, b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ordered_pairs_compare_both_ways),
        cmocka_unit_test(equal_only_for_identical_names),
        cmocka_unit_test(sort_of_layer_names_is_natural),
        cmocka_unit_test(keys_order_names_as_the_comparison_does),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

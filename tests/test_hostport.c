/* test_hostport.c: "HOST:PORT" to a numeric ZeroMQ endpoint (hostport.c, issue 24 item 8): a
 * name resolves to its first IPv4 address (localhost is 127.0.0.1), an IPv6 address goes in
 * brackets, the port is 0..65535 in decimal, and what is refused names the address and the
 * rule and leaves the output as it was. Names resolved here come from /etc/hosts only. */
#include "hostport.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

static const struct good_case {
    const char *rule;     /* shown in the report */
    const char *address;  /* as --listen or --peer takes it */
    const char *endpoint; /* what ZeroMQ gets */
    bool ipv6;
    bool loopback;
} good_cases[] = {
    {"ipv4_loopback", "127.0.0.1:5555", "tcp://127.0.0.1:5555", false, true},
    {"all_of_127_slash_8", "127.1.2.3:0", "tcp://127.1.2.3:0", false, true},
    {"localhost_is_ipv4_first", "localhost:0", "tcp://127.0.0.1:0", false, true},
    {"every_interface", "0.0.0.0:80", "tcp://0.0.0.0:80", false, false},
    {"zeromq_wildcard", "*:0", "tcp://*:0", false, false},
    {"ipv6_loopback_in_brackets", "[::1]:65535", "tcp://[::1]:65535", true, true},
    {"ipv6_mapped_ipv4_loopback", "[::ffff:127.0.0.1]:1", "tcp://[::ffff:127.0.0.1]:1", true, true},
    {"ipv6_other", "[fd00::2]:7", "tcp://[fd00::2]:7", true, false},
    {"other_ipv4", "10.0.0.1:9", "tcp://10.0.0.1:9", false, false},
};

static void each_good_address_gives_its_endpoint(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(good_cases) / sizeof(good_cases[0]); i++) {
        const struct good_case *c = &good_cases[i];
        struct hostport hp        = {0};
        kvx_status_t status       = hostport_resolve(c->address, "listen", &hp);

        printf("%s\n", c->rule);
        assert_int_equal(status, KVX_OK);
        assert_string_equal(hp.endpoint, c->endpoint);
        assert_int_equal(hp.ipv6, c->ipv6);
        assert_int_equal(hp.loopback, c->loopback);
    }
}

static const struct bad_case {
    const char *rule;
    const char *address;
    const char *msg_part; /* must appear in kvx_errmsg() */
} bad_cases[] = {
    {"no_port", "127.0.0.1", "listen: \"127.0.0.1\" is not HOST:PORT"},
    {"no_host", ":5555", "listen: \":5555\" is not HOST:PORT"},
    {"empty_brackets", "[]:5555", "is not HOST:PORT"},
    {"port_too_large", "127.0.0.1:65536", "the port must be 0..65535"},
    {"port_leading_zero", "127.0.0.1:080", "the port must be 0..65535"},
    {"port_not_decimal", "127.0.0.1:0x50", "the port must be 0..65535"},
    {"port_six_digits", "127.0.0.1:000001", "the port must be 0..65535"},
    {"ipv6_without_brackets", "::1:5555", "an IPv6 address goes in brackets: [ADDRESS]:PORT"},
    {"ipv4_in_brackets", "[127.0.0.1]:1", "not an IPv6 address: \"127.0.0.1\""},
    {"name_in_brackets", "[localhost]:1", "not an IPv6 address: \"localhost\""},
    {"unresolvable_name", "nosuchhost.invalid:1", "cannot resolve host \"nosuchhost.invalid\""},
};

static void each_bad_address_is_named_and_changes_nothing(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const struct bad_case *c = &bad_cases[i];
        struct hostport hp       = {.endpoint = "untouched", .ipv6 = true, .loopback = true};
        kvx_status_t status      = hostport_resolve(c->address, "listen", &hp);

        printf("%s: %s\n", c->rule, kvx_errmsg());
        assert_int_equal(status, KVX_ERR_INVALID);
        assert_non_null(strstr(kvx_errmsg(), c->msg_part));
        assert_string_equal(hp.endpoint, "untouched");
        assert_true(hp.ipv6 && hp.loopback);
    }
}

static void a_host_longer_than_a_name_may_be_is_refused(void **state)
{
    char address[400];
    struct hostport hp;

    (void)state;
    memset(address, 'a', 300);
    snprintf(address + 300, sizeof(address) - 300, ":1");
    assert_int_equal(hostport_resolve(address, "address", &hp), KVX_ERR_INVALID);
    assert_non_null(strstr(kvx_errmsg(), "is longer than 255 bytes"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(each_good_address_gives_its_endpoint),
        cmocka_unit_test(each_bad_address_is_named_and_changes_nothing),
        cmocka_unit_test(a_host_longer_than_a_name_may_be_is_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

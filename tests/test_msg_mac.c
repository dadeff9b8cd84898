/* test_msg_mac.c: the tags of messages on the data plane (msg_mac.h): SipHash-2-4 gives the
 * paper's test vectors (key 00..0f, message 00..n-1; 64- and 128-bit outputs), and a tag
 * verifies only the bytes and the key it was made with. */
#include "msg_mac.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

static void the_paper_s_test_vectors(void **state)
{
    static const uint8_t out64_0[8]   = {0x31, 0x0e, 0x0e, 0xdd, 0x47, 0xdb, 0x6f, 0x72};
    static const uint8_t out64_1[8]   = {0xfd, 0x67, 0xdc, 0x93, 0xc5, 0x39, 0xf8, 0x74};
    static const uint8_t out64_15[8]  = {0xe5, 0x45, 0xbe, 0x49, 0x61, 0xca, 0x29, 0xa1};
    static const uint8_t out128_0[16] = {0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6,
                                         0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02, 0x93};
    uint8_t key[MSG_MAC_KEY_LEN];
    uint8_t message[64];
    uint8_t out[16];

    (void)state;
    for (size_t i = 0; i < sizeof(key); i++)
        key[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof(message); i++)
        message[i] = (uint8_t)i;
    msg_mac_siphash(key, message, 0, out, 8);
    assert_memory_equal(out, out64_0, 8);
    msg_mac_siphash(key, message, 1, out, 8);
    assert_memory_equal(out, out64_1, 8);
    msg_mac_siphash(key, message, 15, out, 8);
    assert_memory_equal(out, out64_15, 8);
    msg_mac_siphash(key, message, 0, out, 16);
    assert_memory_equal(out, out128_0, 16);
}

static void a_tag_verifies_only_its_bytes_under_its_key(void **state)
{
    uint8_t key[MSG_MAC_KEY_LEN];
    uint8_t other_key[MSG_MAC_KEY_LEN];
    uint8_t done[48];
    uint8_t tag[MSG_MAC_LEN];
    struct msg_mac *mac;
    struct msg_mac *same;
    struct msg_mac *other;

    (void)state;
    for (size_t i = 0; i < sizeof(done); i++)
        done[i] = (uint8_t)(3 * i);
    assert_int_equal(msg_mac_new_key(key, &mac), KVX_OK);
    assert_int_equal(msg_mac_create(key, &same), KVX_OK);
    assert_int_equal(msg_mac_new_key(other_key, &other), KVX_OK);
    assert_memory_not_equal(key, other_key, sizeof(key));
    assert_int_equal(msg_mac_tag(mac, done, sizeof(done), tag), KVX_OK);
    assert_true(msg_mac_verify(same, done, sizeof(done), tag)); /* the key, as sent */
    assert_false(msg_mac_verify(other, done, sizeof(done), tag));
    assert_false(msg_mac_verify(mac, done, sizeof(done) - 1, tag));
    for (size_t i = 0; i < sizeof(done); i++) { /* any one bit of the message */
        done[i] ^= 0x10;
        assert_false(msg_mac_verify(mac, done, sizeof(done), tag));
        done[i] ^= 0x10;
    }
    tag[MSG_MAC_LEN - 1] ^= 1;
    assert_false(msg_mac_verify(mac, done, sizeof(done), tag));
    msg_mac_destroy(mac);
    msg_mac_destroy(same);
    msg_mac_destroy(other);
    msg_mac_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_paper_s_test_vectors),
        cmocka_unit_test(a_tag_verifies_only_its_bytes_under_its_key),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

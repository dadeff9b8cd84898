/* msg_mac.c: HMAC-SHA256 tags under per-capability keys (msg_mac.h), on OpenSSL 3's EVP_MAC:
 * the context keeps the key's state, and a tag re-initialises it with the same key. */
#include "msg_mac.h"

#include "auth.h"
#include "error.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

struct msg_mac {
    EVP_MAC_CTX *ctx;
};

kvx_status_t msg_mac_create(const uint8_t key[MSG_MAC_KEY_LEN], struct msg_mac **mac_p)
{
    char digest[]         = "SHA256";
    OSSL_PARAM params[]   = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                             OSSL_PARAM_construct_end()};
    EVP_MAC *hmac         = EVP_MAC_fetch(NULL, "HMAC", NULL);
    struct msg_mac *mac   = calloc(1, sizeof(*mac));
    bool ok;

    if (mac == NULL) {
        EVP_MAC_free(hmac);
        return error_no_memory("a message key");
    }
    mac->ctx = hmac != NULL ? EVP_MAC_CTX_new(hmac) : NULL;
    ok       = mac->ctx != NULL && EVP_MAC_init(mac->ctx, key, MSG_MAC_KEY_LEN, params) == 1;
    EVP_MAC_free(hmac); /* the context holds its own reference */
    if (!ok) {
        msg_mac_destroy(mac);
        return error_set(KVX_ERR_INTERNAL, "message key: OpenSSL's HMAC-SHA256 is unavailable");
    }
    *mac_p = mac;
    return KVX_OK;
}

kvx_status_t msg_mac_new_key(uint8_t key[MSG_MAC_KEY_LEN], struct msg_mac **mac_p)
{
    if (RAND_bytes(key, MSG_MAC_KEY_LEN) != 1)
        return error_set(KVX_ERR_INTERNAL, "message key: the system's random source failed");
    return msg_mac_create(key, mac_p);
}

void msg_mac_destroy(struct msg_mac *mac)
{
    if (mac == NULL)
        return;
    EVP_MAC_CTX_free(mac->ctx);
    free(mac);
}

kvx_status_t msg_mac_tag(struct msg_mac *mac, const void *data, size_t size,
                         uint8_t tag[MSG_MAC_LEN])
{
    unsigned char full[EVP_MAX_MD_SIZE];
    size_t length = 0;

    /* a NULL key re-initialises with the key already set */
    if (EVP_MAC_init(mac->ctx, NULL, 0, NULL) != 1 || EVP_MAC_update(mac->ctx, data, size) != 1 ||
        EVP_MAC_final(mac->ctx, full, &length, sizeof(full)) != 1 || length < MSG_MAC_LEN)
        return error_set(KVX_ERR_INTERNAL, "message key: HMAC-SHA256 failed");
    memcpy(tag, full, MSG_MAC_LEN);
    return KVX_OK;
}

bool msg_mac_verify(struct msg_mac *mac, const void *data, size_t size,
                    const uint8_t tag[MSG_MAC_LEN])
{
    uint8_t expected[MSG_MAC_LEN];

    return msg_mac_tag(mac, data, size, expected) == KVX_OK &&
           auth_equal(expected, tag, MSG_MAC_LEN);
}

/* auth.h: the deployment's shared secret (a key file) and the ZeroMQ CURVE keys derived from
 * it: one server key pair and one client key pair, the same in every process that read the
 * same file, so that one file on both sides is all an operator handles. A listener proves it
 * holds the secret by completing CURVE's handshake with the server secret key; a connecting
 * peer by the client secret key, which the listener's ZAP handler (gate.h) checks. */
#ifndef KVX_SRC_AUTH_H
#define KVX_SRC_AUTH_H

#include "kvx.h"

#define AUTH_Z85_SIZE 41 /* a CURVE key in Z85: 40 characters and the terminator */

struct auth_keys {
    bool curve; /* false: insecure (ZeroMQ's NULL mechanism, loopback only) */
    char server_public[AUTH_Z85_SIZE];
    char server_secret[AUTH_Z85_SIZE];
    char client_public[AUTH_Z85_SIZE];
    char client_secret[AUTH_Z85_SIZE];
    uint8_t client_public_raw[32]; /* what the ZAP handler compares a peer's key with */
};

/* Derives both key pairs from the secret (HMAC-SHA256 with a label per pair). */
kvx_status_t auth_keys_derive(const uint8_t secret[KVX_AUTH_KEY_LEN], struct auth_keys *keys);

/* Secure by default: the keys derived from `secret`, or none (plain ZeroMQ) when `insecure`;
 * an agent's params must give exactly one of the two (KVX_ERR_INVALID otherwise). */
kvx_status_t auth_keys_choose(const uint8_t *secret, bool insecure, struct auth_keys *keys);

/* Sets a socket up as a CURVE server (before bind) or client (before connect); nothing for
 * insecure keys. */
kvx_status_t auth_server_socket(void *socket, const struct auth_keys *keys);
kvx_status_t auth_client_socket(void *socket, const struct auth_keys *keys);

/* Constant-time equality of two byte strings of `size` bytes (tokens, keys). */
bool auth_equal(const void *a, const void *b, size_t size);

#endif

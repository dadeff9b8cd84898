/* msg_mac.h: tags for kvx's messages on the data plane, which travels in the clear. A
 * capability handed out on the encrypted side channel is a public handle and a secret key;
 * a message sent with it carries the handle and a tag of its bytes under the key, so that a
 * third party who saw earlier messages can neither change one (another rank, another token,
 * other blocks) nor make its own (issue 36 finding 4). The tag is SipHash-2-4's 128-bit
 * output under a 128-bit key (msg_mac.c says why not HMAC). */
#ifndef KVX_SRC_MSG_MAC_H
#define KVX_SRC_MSG_MAC_H

#include "kvx.h"

#define MSG_MAC_KEY_LEN 16
#define MSG_MAC_LEN     16

struct msg_mac;

/* A new random key (RAND_bytes) into `key`, and its state; or the state of a given key. */
kvx_status_t msg_mac_new_key(uint8_t key[MSG_MAC_KEY_LEN], struct msg_mac **mac_p);
kvx_status_t msg_mac_create(const uint8_t key[MSG_MAC_KEY_LEN], struct msg_mac **mac_p);
void msg_mac_destroy(struct msg_mac *mac); /* NULL-safe */

/* The tag of `size` bytes at `data`. */
kvx_status_t msg_mac_tag(struct msg_mac *mac, const void *data, size_t size,
                         uint8_t tag[MSG_MAC_LEN]);
/* Whether `tag` is theirs, compared in constant time. */
bool msg_mac_verify(struct msg_mac *mac, const void *data, size_t size,
                    const uint8_t tag[MSG_MAC_LEN]);

/* SipHash-2-4 of `size` bytes at `data` under `key`, its 64-bit output (`out_size` 8) or its
 * 128-bit one (16), little-endian as the paper's test vectors. */
void msg_mac_siphash(const uint8_t key[MSG_MAC_KEY_LEN], const void *data, size_t size,
                     uint8_t *out, size_t out_size);

#endif

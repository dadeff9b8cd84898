/* auth.c: the key file, the CURVE keys derived from it and the socket options that use them.
 * The file holds 32 random bytes as hex after a versioned first word; it must be a regular
 * file that only its owner can read, as ssh asks of a private key. */
#include "auth.h"

#include "error.h"

#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <zmq.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define AUTH_FILE_HEADER "kvx-auth-key 1 "
#define AUTH_FILE_SIZE   (sizeof(AUTH_FILE_HEADER) - 1 + 2 * KVX_AUTH_KEY_LEN + 1)

kvx_status_t kvx_auth_key_generate(uint8_t key[KVX_AUTH_KEY_LEN])
{
    if (key == NULL)
        return error_set(KVX_ERR_INVALID, "auth key: no buffer");
    if (RAND_bytes(key, KVX_AUTH_KEY_LEN) != 1)
        return error_set(KVX_ERR_INTERNAL, "auth key: the system's random source failed");
    return KVX_OK;
}

kvx_status_t kvx_auth_key_create(const char *path)
{
    static const char hex[] = "0123456789abcdef";
    uint8_t key[KVX_AUTH_KEY_LEN];
    char text[AUTH_FILE_SIZE + 1];
    size_t n = sizeof(AUTH_FILE_HEADER) - 1;
    kvx_status_t status;
    int fd;
    bool written;

    if (path == NULL)
        return error_set(KVX_ERR_INVALID, "auth key: no path");
    if ((status = kvx_auth_key_generate(key)) != KVX_OK)
        return status;
    memcpy(text, AUTH_FILE_HEADER, n);
    for (size_t i = 0; i < KVX_AUTH_KEY_LEN; i++) {
        text[n++] = hex[key[i] >> 4];
        text[n++] = hex[key[i] & 15];
    }
    text[n++] = '\n';
    /* O_EXCL: never replace a deployment's key by accident; 0600 before a byte is written */
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return error_set(KVX_ERR_IO, "auth key %s: %s", path, strerror(errno));
    written = fchmod(fd, 0600) == 0 && write(fd, text, n) == (ssize_t)n && fsync(fd) == 0;
    if (close(fd) != 0 || !written) {
        status = error_set(KVX_ERR_IO, "auth key %s: writing: %s", path, strerror(errno));
        unlink(path);
        return status;
    }
    return KVX_OK;
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

const char *kvx_auth_file(const char *file)
{
    if (file == NULL || file[0] == '\0')
        file = getenv(KVX_AUTH_FILE_ENV);
    return file != NULL && file[0] != '\0' ? file : NULL;
}

kvx_status_t kvx_auth_key_load(const char *path, uint8_t key[KVX_AUTH_KEY_LEN])
{
    char text[AUTH_FILE_SIZE + 2];
    uint8_t parsed[KVX_AUTH_KEY_LEN];
    struct stat st;
    ssize_t size;
    size_t n = sizeof(AUTH_FILE_HEADER) - 1;
    int fd;

    if (path == NULL || key == NULL)
        return error_set(KVX_ERR_INVALID, "auth key: no path or buffer");
    /* O_NONBLOCK: a FIFO given as the key file must not hang the open */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return error_set(KVX_ERR_IO, "auth key %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return error_set(KVX_ERR_INVALID, "auth key %s: not a regular file", path);
    }
    if ((st.st_mode & 077) != 0) {
        close(fd);
        return error_set(KVX_ERR_INVALID,
                         "auth key %s: mode %04o lets others read it; chmod 600 it (or make a "
                         "new one with kvx auth-key)",
                         path, (unsigned)(st.st_mode & 07777));
    }
    size = read(fd, text, sizeof(text));
    close(fd);
    if (size != (ssize_t)AUTH_FILE_SIZE || memcmp(text, AUTH_FILE_HEADER, n) != 0 ||
        text[AUTH_FILE_SIZE - 1] != '\n')
        return error_set(KVX_ERR_INVALID,
                         "auth key %s: not a kvx auth key (\"%s\" and %d hex digits; kvx "
                         "auth-key writes one)",
                         path, AUTH_FILE_HEADER, 2 * KVX_AUTH_KEY_LEN);
    for (size_t i = 0; i < KVX_AUTH_KEY_LEN; i++) {
        int high = hex_value(text[n + 2 * i]);
        int low  = hex_value(text[n + 2 * i + 1]);

        if (high < 0 || low < 0)
            return error_set(KVX_ERR_INVALID, "auth key %s: byte %zu is not lowercase hex", path,
                             n + 2 * i);
        parsed[i] = (uint8_t)(high << 4 | low);
    }
    memcpy(key, parsed, sizeof(parsed));
    return KVX_OK;
}

/* One key pair: the secret key is HMAC-SHA256(secret, label), the public key follows. */
static bool pair_derive(const uint8_t secret[KVX_AUTH_KEY_LEN], const char *label,
                        char public_z85[AUTH_Z85_SIZE], char secret_z85[AUTH_Z85_SIZE],
                        uint8_t *public_raw)
{
    uint8_t derived[32];
    unsigned int length = sizeof(derived);

    if (HMAC(EVP_sha256(), secret, KVX_AUTH_KEY_LEN, (const uint8_t *)label, strlen(label), derived,
             &length) == NULL ||
        length != sizeof(derived) || zmq_z85_encode(secret_z85, derived, sizeof(derived)) == NULL ||
        zmq_curve_public(public_z85, secret_z85) != 0)
        return false;
    return public_raw == NULL || zmq_z85_decode(public_raw, public_z85) != NULL;
}

kvx_status_t auth_keys_derive(const uint8_t secret[KVX_AUTH_KEY_LEN], struct auth_keys *keys)
{
    *keys = (struct auth_keys){.curve = true};
    if (!zmq_has("curve"))
        return error_set(KVX_ERR_INTERNAL, "auth: this libzmq was built without CURVE");
    if (!pair_derive(secret, "kvx side channel server 1", keys->server_public, keys->server_secret,
                     NULL) ||
        !pair_derive(secret, "kvx side channel client 1", keys->client_public, keys->client_secret,
                     keys->client_public_raw))
        return error_set(KVX_ERR_INTERNAL, "auth: deriving the CURVE keys failed");
    return KVX_OK;
}

kvx_status_t auth_keys_choose(const uint8_t *secret, bool insecure, struct auth_keys *keys)
{
    if (secret != NULL && insecure)
        return error_set(KVX_ERR_INVALID, "agent: an auth key and insecure: choose one");
    if (secret == NULL && !insecure)
        return error_set(KVX_ERR_INVALID,
                         "agent: no auth key: give the deployment's secret (auth_key; kvx "
                         "auth-key makes one), or set insecure for loopback-only use");
    if (insecure) {
        *keys = (struct auth_keys){.curve = false};
        return KVX_OK;
    }
    return auth_keys_derive(secret, keys);
}

kvx_status_t auth_server_socket(void *socket, const struct auth_keys *keys)
{
    int on = 1;

    if (!keys->curve)
        return KVX_OK;
    if (zmq_setsockopt(socket, ZMQ_CURVE_SERVER, &on, sizeof(on)) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, keys->server_secret, AUTH_Z85_SIZE - 1) != 0)
        return error_set(KVX_ERR_INTERNAL, "auth: CURVE server: %s", zmq_strerror(zmq_errno()));
    return KVX_OK;
}

kvx_status_t auth_client_socket(void *socket, const struct auth_keys *keys)
{
    if (!keys->curve)
        return KVX_OK;
    if (zmq_setsockopt(socket, ZMQ_CURVE_SERVERKEY, keys->server_public, AUTH_Z85_SIZE - 1) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_PUBLICKEY, keys->client_public, AUTH_Z85_SIZE - 1) != 0 ||
        zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, keys->client_secret, AUTH_Z85_SIZE - 1) != 0)
        return error_set(KVX_ERR_INTERNAL, "auth: CURVE client: %s", zmq_strerror(zmq_errno()));
    return KVX_OK;
}

bool auth_equal(const void *a, const void *b, size_t size)
{
    const uint8_t *x = a;
    const uint8_t *y = b;
    uint8_t diff     = 0;

    for (size_t i = 0; i < size; i++)
        diff |= x[i] ^ y[i];
    return diff == 0;
}

/* fuzz_notify.c: libFuzzer target for the small messages agents exchange (notify.c): the
 * done notification and its answer, a heartbeat's id list and its answer, an error answer's
 * code, and the done handle a done message carries (done_handles.c: found only when it is one
 * the table issued), each parsed from the same bytes.
 * What parses must re-encode to the same bytes; aborts on a broken invariant. */
#include "done_handles.h"
#include "fuzz_invariant.h"
#include "notify.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char engine_id[ALIVE_ENGINE_ID_SIZE];
    char text[ALIVE_ENGINE_ID_SIZE + 64];
    uint64_t request_id;
    uint32_t rank;
    uint64_t instance;
    size_t count;

    kvx_token_t token;
    uint64_t bytes;
    bool bytes_stated;

    if (size >= DONE_HANDLE_LEN) { /* two connections' handles, then the input's first bytes */
        static struct done_handles *handles;
        static uint8_t issued[2][DONE_HANDLE_LEN];
        static uint8_t keys[2][MSG_MAC_KEY_LEN];
        static struct msg_mac *second;
        const struct done_conn_mark open_for_ever = {.fd = -1, .cookie = 0};
        const uint8_t *done = data + DONE_HANDLE_LEN;
        size_t done_size    = size - DONE_HANDLE_LEN;
        uint8_t tag[MSG_MAC_LEN];
        uint64_t conn = 0;

        if (handles == NULL &&
            (done_handle_issue(&handles, 7, &open_for_ever, issued[0], keys[0]) != KVX_OK ||
             done_handle_issue(&handles, 9, &open_for_ever, issued[1], keys[1]) != KVX_OK ||
             msg_mac_create(keys[1], &second) != KVX_OK))
            fuzz_fail("no done handles");
        /* the input as handle and done, with a tag of its own second half: it never passes
         * (the fuzzer cannot find a key), unless the handle is one issued */
        memset(tag, 0, sizeof(tag));
        if (size >= DONE_HANDLE_LEN + MSG_MAC_LEN)
            memcpy(tag, data + size - MSG_MAC_LEN, MSG_MAC_LEN);
        invariant(done_handle_conn(handles, data, tag, done, done_size, &conn) !=
                          DONE_HANDLE_OK ||
                      memcmp(data, issued[0], DONE_HANDLE_LEN) == 0 ||
                      memcmp(data, issued[1], DONE_HANDLE_LEN) == 0,
                  "only an issued handle names a connection");
        /* the input's bytes as a done with the second handle: its true tag passes, naming
         * that connection; any other tag does not */
        if (msg_mac_tag(second, done, done_size, tag) != KVX_OK)
            fuzz_fail("no tag");
        invariant(done_handle_conn(handles, issued[1], tag, done, done_size, &conn) ==
                          DONE_HANDLE_OK &&
                      conn == 9,
                  "a done tagged under its handle's key names the connection it was issued to");
        tag[data[0] % MSG_MAC_LEN] ^= (uint8_t)(1u << (data[1] % 8));
        invariant(done_handle_conn(handles, issued[1], tag, done, done_size, &conn) ==
                      DONE_HANDLE_FORGED,
                  "a done whose tag is not its own names no connection");
    }
    if (notify_done_parse(data, size, &request_id, &rank, &token, &bytes, &bytes_stated)) {
        struct notify_read n = notify_done_read(request_id, rank, &token, bytes);

        invariant(rank < KVX_MAX_TP, "a done is of a rank");
        invariant(size == (bytes_stated ? sizeof(n) : sizeof(n.done)),
                  "a done is version 2 or 3 by its size");
        invariant(bytes_stated || bytes == 0, "a version-2 done states no bytes");
        if (!bytes_stated)
            n.done = notify_done(request_id, rank, &token);
        invariant(memcmp(&n, data, size) == 0, "a done re-encodes to its bytes");
    }
    if (heartbeat_ids_parse(data, size, &count)) {
        invariant(count * sizeof(struct heartbeat_entry) == size && count <= HEARTBEAT_MAX_IDS,
                  "entries fill the frame, within the limit");
        if (count > 0) {
            struct heartbeat_entry last = heartbeat_entry(data, count - 1);

            invariant(memcmp(&last, (const uint8_t *)data + size - sizeof(last), sizeof(last)) == 0,
                      "the last entry is readable");
        }
    }
    {
        char reason[DONE_REASON_SIZE];
        char again[DONE_REASON_SIZE + 32];
        bool counted = false;

        if (done_answer_parse(data, size, &counted, reason)) {
            size_t length = done_answer_format(again, sizeof(again), counted, reason);

            invariant(strlen(reason) > 0 && strlen(reason) < DONE_REASON_SIZE,
                      "a done's answer carries a bounded text");
            invariant(length == size && memcmp(again, data, size) == 0,
                      "a done's answer re-encodes to its bytes");
        }
    }
    {
        enum error_code code = ERROR_CODE_NONE;
        size_t at            = 0;

        if (error_answer_parse(data, size, &code, &at)) {
            invariant(at <= size, "an error's message lies within it");
            /* a coded answer re-encodes to its bytes (a message with a NUL cannot be given) */
            if (code != ERROR_CODE_NONE && memchr(data + at, 0, size - at) == NULL) {
                char *message = malloc(size - at + 1);
                char *again   = malloc(size + 1);

                invariant(message != NULL && again != NULL, "memory");
                memcpy(message, data + at, size - at);
                message[size - at] = '\0';
                invariant(error_answer_format(again, size + 1, code, message) == size &&
                              memcmp(again, data, size) == 0,
                          "a coded error answer re-encodes to its bytes");
                free(message);
                free(again);
            }
        }
    }
    if (alive_answer_parse(data, size, &instance, engine_id)) {
        size_t length = alive_answer_format(text, sizeof(text), instance, engine_id);

        invariant(instance != 0 && strlen(engine_id) < ALIVE_ENGINE_ID_SIZE,
                  "an answer names an instance and a bounded engine id");
        invariant(length == size && memcmp(text, data, size) == 0,
                  "an answer re-encodes to its bytes");
    }
    return 0;
}

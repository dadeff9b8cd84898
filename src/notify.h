/* notify.h: the small messages between a decode and a prefill agent, as bytes, all on the
 * authenticated side channel: the `done` notification (sent once the data is here), the
 * heartbeat's list of request ids with their hold tokens, and its answer. Pure: parsing outside
 * bytes, fuzzed by fuzz/fuzz_notify.c. */
#ifndef KVX_SRC_NOTIFY_H
#define KVX_SRC_NOTIFY_H

#include "kvx.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NOTIFY_MAGIC         0x4b565844u /* "KVXD" */
#define NOTIFY_VERSION       2           /* a done without the bytes read (every kvx reads it) */
#define NOTIFY_VERSION_READ  3 /* a done carrying the bytes read: to a peer that states it */
#define NOTIFY_DONE          1
#define HEARTBEAT_MAX_IDS    16384       /* request ids in one heartbeat: 384 KiB */
#define ALIVE_ANSWER         "kvx-alive" /* then " INSTANCE ENGINE_ID" */
#define ALIVE_ENGINE_ID_SIZE 256

/* The answer to a done: "kvx-counted WHAT" (it counted: "counted", "released", or "nothing
 * held" for a done without a token for a request never held), or the side channel's error
 * reply "kvx-error REASON" (refused). WHAT and REASON are printable, shorter than
 * DONE_REASON_SIZE. */
#define DONE_ANSWER_COUNTED "kvx-counted"
#define DONE_ANSWER_REFUSED "kvx-error"
#define DONE_REASON_SIZE    256
/* A done sent as a message that the prefill will not judge there (it came before its hold,
 * or with a handle it does not know): send it again on the side channel. */
#define DONE_ANSWER_RESEND "kvx-resend-on-side-channel"

/* An error answer to any request is "kvx-error MESSAGE" (REPLY_ERROR); one that asks the
 * requester to act, not only to report, carries a code first: "kvx-error [CODE] MESSAGE".
 * Control flow follows the code, never the message's words (issue 22). A peer that knows no
 * code reads the whole as text, and the message still says what to do. */
enum error_code {
    ERROR_CODE_NONE,         /* no code, or one this version does not know: report it */
    ERROR_CODE_UNREGISTERED, /* "[unregistered]": a push named a writer this connection does
                                not have (evicted, or never registered): register again */
    ERROR_CODE_WRITER_FAILED, /* "[writer-failed]": a push job failed once it may have
                                 written; bytes of its writer may still be on their way:
                                 close the connection they come by (docs/agent.md, "Write") */
};
/* "kvx-error [CODE] MESSAGE" (or without a code for ERROR_CODE_NONE) into `text`; returns
 * its length, 0 when it does not fit. */
size_t error_answer_format(char *text, size_t size, enum error_code code, const char *message);

/* True when `data` is an error answer: its code and the offset of its message in `data`
 * (ERROR_CODE_NONE and the whole text after "kvx-error " when it has no code this version
 * knows). False for any other answer. */
bool error_answer_parse(const void *data, size_t size, enum error_code *code_p,
                        size_t *message_at_p);

/* A notification on the wire: fixed size, little-endian like every kvx host. */
struct notify {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint64_t request_id;
    uint32_t tp_rank; /* of the sender */
    uint32_t reserved;
    kvx_token_t token; /* the hold's (zero when the sender has none) */
};

/* A version-3 done: the version-2 one, then the bytes the sender read from the receiving
 * rank for the request (0: it only notified). A prefill agent states in its metadata
 * (done_version, docs/wire.md) that it reads these; an older one reads only version 2. */
struct notify_read {
    struct notify done; /* version NOTIFY_VERSION_READ */
    uint64_t bytes;
};

/* One wanted request in a heartbeat. */
struct heartbeat_entry {
    uint64_t request_id;
    kvx_token_t token;
};

/* `token` may be NULL: none. */
struct notify notify_done(uint64_t request_id, uint32_t tp_rank, const kvx_token_t *token);

struct notify_read notify_done_read(uint64_t request_id, uint32_t tp_rank, const kvx_token_t *token,
                                    uint64_t bytes);

/* True when `data` is exactly a `done` notification of version 2, or of version 3 with its
 * size, from a rank below KVX_MAX_TP; its request id, the sender's rank, the token it presents
 * and the bytes it read (*bytes_stated_p false and *bytes_p 0 for version 2). */
bool notify_done_parse(const void *data, size_t size, uint64_t *request_id_p, uint32_t *rank_p,
                       kvx_token_t *token_p, uint64_t *bytes_p, bool *bytes_stated_p);

/* The answer's text into `text`; returns its length, 0 when it does not fit or `what` is
 * not printable or too long. */
size_t done_answer_format(char *text, size_t size, bool counted, const char *what);

/* True when `data` is an answer of either kind: *counted_p says which, `reason` receives
 * WHAT or REASON, NUL-terminated. Anything else (malformed, unprintable) is false. */
bool done_answer_parse(const void *data, size_t size, bool *counted_p,
                       char reason[DONE_REASON_SIZE]);

/* True when `data` is a list of at most HEARTBEAT_MAX_IDS entries; *count_p of them, read
 * with heartbeat_entry (the bytes need not be aligned). */
bool heartbeat_ids_parse(const void *data, size_t size, size_t *count_p);
struct heartbeat_entry heartbeat_entry(const void *data, size_t index);

/* The answer to a heartbeat: "kvx-alive " 16 hex digits of a non-zero instance, a space and
 * the engine id ("-" when it has none; printable, no spaces, shorter than
 * ALIVE_ENGINE_ID_SIZE). alive_answer_format returns the length written, 0 if it does not
 * fit. */
size_t alive_answer_format(char *text, size_t size, uint64_t instance, const char *engine_id);
bool alive_answer_parse(const void *data, size_t size, uint64_t *instance_p,
                        char engine_id[ALIVE_ENGINE_ID_SIZE]);

#endif

/* push_request.h: the push request the decode side sends to a prefill rank: its encoding and
 * its checked decoding. Pure. */
#ifndef KVX_SRC_PUSH_REQUEST_H
#define KVX_SRC_PUSH_REQUEST_H

#include "kvx.h"
#define PUSH_MAX_GROUPS 1024
#define PUSH_MAX_IDS    (1u << 20) /* block ids in one request: 64 Mi tokens of 64-token blocks */
/* Bytes of a push request: the handle and up to PUSH_MAX_IDS ids of 10 bytes or fewer (the
 * listener's max_message bounds it further). */
#define PUSH_MAX_REQUEST_SIZE (11u * PUSH_MAX_IDS + 65536u)
#define PUSH_HANDLE_LEN       16
#define PUSH_NONCE_LEN        16
#define PUSH_PROOF_MAGIC      0x5058564bu /* "KVXP" */

/* The active message a writer sends to the worker a registration named. */
struct push_proof {
    uint32_t magic;
    uint32_t reserved;
    uint64_t instance; /* the prefill agent's: the registrant answers that peer */
    uint8_t nonce[PUSH_NONCE_LEN];
};

struct push_proof push_proof_make(uint64_t instance, const uint8_t nonce[PUSH_NONCE_LEN]);
bool push_proof_parse(const void *data, size_t size, struct push_proof *proof);

/* A push on the data plane (docs/agent.md, "Write"): the decode side sends its request as an
 * active message on its connection to the prefill's main worker, `[PUSH_AM_REQUEST_MAGIC:
 * 4][0: 4][id: 8]` then a push request's tag under its writer's key (msg_mac.h) and its bytes
 * (whose handle and tag authorise it), or a done's handle, tag and bytes; the prefill's
 * writer answers `[PUSH_AM_ANSWER_MAGIC: 4][0: 4][id: 8][handle: 16]` then the answer's text
 * (a side-channel reply's), after the data. `id` is the requester's, as a side-channel
 * request's id. Both fit one eager message; a larger request goes on the side channel. */
#define PUSH_AM_REQUEST_MAGIC  0x5158564bu /* "KVXQ" */
#define PUSH_AM_ANSWER_MAGIC   0x4158564bu /* "KVXA" */
#define PUSH_AM_MAX            8192        /* bytes of either message */
#define PUSH_AM_REQUEST_HEADER 16
#define PUSH_AM_ANSWER_HEADER  (16 + PUSH_HANDLE_LEN)

/* A small push answered with its bytes (docs/agent.md "Write"): when the request came as a
 * message and asked for it (bytes_max), a writer whose share is at most PUSH_BYTES_MAX bytes
 * of host memory sends no puts: its answer is `[PUSH_AM_BYTES_MAGIC: 4][bytes: 4][id: 8]
 * [handle: 16]`, then the share's bytes in the order of the decode side's plan, then the
 * answer's text; the decode side copies them into its own planned blocks. */
#define PUSH_AM_BYTES_MAGIC 0x4258564bu /* "KVXB" */
#define PUSH_BYTES_MAX      65536
#define PUSH_AM_TEXT_MAX    256 /* of a bytes answer's text */
#define PUSH_AM_BYTES_SIZE  (PUSH_AM_ANSWER_HEADER + PUSH_BYTES_MAX + PUSH_AM_TEXT_MAX)

/* Frames `body` as request `id` into `out` (PUSH_AM_MAX bytes); returns the size, or 0 when it
 * does not fit (send it on the side channel). */
size_t push_am_request_frame(uint64_t id, const void *body, size_t size, uint8_t out[PUSH_AM_MAX]);
/* A request's id and body (inside `data`), or false for bytes that are not one. */
bool push_am_request_parse(const void *data, size_t size, uint64_t *id_p, const void **body_p,
                           size_t *body_size_p);

/* An answer: the request it answers, the handle of the writer that answers, its text, and
 * in a bytes answer the share's bytes. */
struct push_am_answer {
    uint64_t id;
    uint8_t handle[PUSH_HANDLE_LEN];
    const char *text; /* inside the parsed bytes, not terminated */
    size_t text_size;
    const uint8_t *bytes; /* inside the parsed bytes; NULL: not a bytes answer */
    size_t bytes_size;
};

/* Frames an answer into `out` (PUSH_AM_MAX bytes), its text cut to fit; returns the size. */
size_t push_am_answer_frame(const struct push_am_answer *answer, uint8_t out[PUSH_AM_MAX]);
/* False for bytes that are not an answer: a wrong magic, no text or text that is not printable
 * (an answer's text is a side-channel reply's: notify.h), a bytes answer larger than
 * PUSH_AM_BYTES_SIZE, or whose bytes leave no text or more than PUSH_AM_TEXT_MAX of it. */
bool push_am_answer_parse(const void *data, size_t size, struct push_am_answer *answer);

/* A bytes answer into `out` (PUSH_AM_BYTES_SIZE bytes): the header for answer->id and
 * answer->handle and `bytes_size` (at most PUSH_BYTES_MAX) bytes, whose place is returned for
 * the caller to fill; then push_am_bytes_end adds the text (cut to PUSH_AM_TEXT_MAX) and
 * returns the message's size. */
uint8_t *push_am_bytes_begin(const struct push_am_answer *answer, size_t bytes_size,
                             uint8_t out[PUSH_AM_BYTES_SIZE]);
size_t push_am_bytes_end(const char *text, size_t text_size, size_t bytes_size,
                         uint8_t out[PUSH_AM_BYTES_SIZE]);

/* A decoded push request: the writer handle, the hold token when it carries one, the
 * deadline its requester waits for, and block ids, all owned. groups holds num_groups local
 * groups, then, when has_remote, num_groups remote ones. */
struct push_request {
    uint64_t request_id;
    uint8_t handle[PUSH_HANDLE_LEN];
    bool has_token;
    kvx_token_t token;
    uint32_t deadline_ms; /* the requester's timeout (ms); 0: not given (an older requester) */
    uint32_t bytes_max;   /* a share of at most this many bytes goes in the answer; 0: puts */
    kvx_group_ids_t *groups;
    size_t num_groups;
    bool has_remote;
};

/* Encodes request->token too, when it is set, `deadline_ms`, how long the requester
 * waits for the answer (0: not sent), and `bytes_max` (0: not sent). */
kvx_status_t push_request_encode(uint64_t request_id, const uint8_t handle[PUSH_HANDLE_LEN],
                                 uint32_t deadline_ms, uint32_t bytes_max,
                                 const kvx_request_t *request, void **buf_p, size_t *size_p);

/* Decodes untrusted bytes; on success the caller frees with push_request_free. */
kvx_status_t push_request_decode(const void *buf, size_t size, struct push_request *req);
void push_request_free(struct push_request *req);

#endif

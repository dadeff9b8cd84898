/* push_request.c: the push request the decode side sends on the side channel (proto/kvx.proto
 * PushRequest) and the proof a writer sends to a registrant's worker: their encodings, and
 * their decodings, which treats the bytes as hostile and checks
 * every count before use. Pure: no I/O; fuzzed by fuzz/fuzz_push.c. */
#include "push_request.h"

#include "error.h"

#include "kvx.pb-c.h"

#include <stdlib.h>
#include <string.h>

void push_request_free(struct push_request *req)
{
    for (size_t g = 0; req->groups != NULL && g < req->num_groups; g++) {
        free((void *)req->groups[g].ids);
        if (req->has_remote)
            free((void *)req->groups[req->num_groups + g].ids);
    }
    free(req->groups);
    *req = (struct push_request){0};
}

/* Copies `n` protobuf groups into `out` (owned copies), counting ids into *total_p. */
static kvx_status_t groups_copy(Kvx__Group *const *in, size_t n, kvx_group_ids_t *out,
                                size_t *total_p)
{
    for (size_t g = 0; g < n; g++) {
        uint64_t *ids;

        if (__builtin_add_overflow(*total_p, in[g]->n_ids, total_p) || *total_p > PUSH_MAX_IDS)
            return error_set(KVX_ERR_INVALID, "push request: more than %u block ids", PUSH_MAX_IDS);
        ids = malloc((in[g]->n_ids > 0 ? in[g]->n_ids : 1) * sizeof(*ids));
        if (ids == NULL)
            return error_no_memory("push request ids");
        if (in[g]->n_ids > 0)
            memcpy(ids, in[g]->ids, in[g]->n_ids * sizeof(*ids));
        out[g] = (kvx_group_ids_t){ids, in[g]->n_ids};
    }
    return KVX_OK;
}

kvx_status_t push_request_decode(const void *buf, size_t size, struct push_request *req)
{
    Kvx__PushRequest *msg;
    kvx_status_t status = KVX_OK;
    size_t total        = 0;

    *req = (struct push_request){0};
    if (size > PUSH_MAX_REQUEST_SIZE)
        return error_set(KVX_ERR_INVALID, "push request: %zu bytes is more than %u", size,
                         PUSH_MAX_REQUEST_SIZE);
    msg = kvx__push_request__unpack(NULL, size, buf);
    if (msg == NULL)
        return error_set(KVX_ERR_INVALID, "push request: %zu bytes are not a push request", size);
    if (msg->n_local < 1 || msg->n_local > PUSH_MAX_GROUPS ||
        (msg->n_remote != 0 && msg->n_remote != msg->n_local))
        status = error_set(KVX_ERR_INVALID,
                           "push request: %zu local and %zu remote groups"
                           " (1..%d local; remote none or as many)",
                           msg->n_local, msg->n_remote, PUSH_MAX_GROUPS);
    if (status == KVX_OK && msg->handle.len != PUSH_HANDLE_LEN)
        status = error_set(KVX_ERR_INVALID, "push request: a writer handle of %zu bytes (%d)",
                           msg->handle.len, PUSH_HANDLE_LEN);
    if (status == KVX_OK && msg->token.len != 0 && msg->token.len != KVX_TOKEN_LEN)
        status = error_set(KVX_ERR_INVALID, "push request: a hold token of %zu bytes (0 or %d)",
                           msg->token.len, KVX_TOKEN_LEN);
    if (status == KVX_OK) {
        req->request_id  = msg->request_id;
        req->deadline_ms = msg->deadline_ms; /* any value: the server caps it (max_push_ms) */
        req->bytes_max   = msg->bytes_max;   /* any value: the server takes at most its own */
        req->num_groups  = msg->n_local;
        req->has_remote  = msg->n_remote > 0;
        req->groups      = calloc(2 * msg->n_local, sizeof(*req->groups));
        if (req->groups == NULL)
            status = error_no_memory("a push request");
    }
    if (status == KVX_OK) {
        memcpy(req->handle, msg->handle.data, PUSH_HANDLE_LEN);
        req->has_token = msg->token.len == KVX_TOKEN_LEN;
        if (req->has_token)
            memcpy(req->token.bytes, msg->token.data, KVX_TOKEN_LEN);
        status = groups_copy(msg->local, msg->n_local, req->groups, &total);
    }
    if (status == KVX_OK && req->has_remote)
        status = groups_copy(msg->remote, msg->n_remote, req->groups + req->num_groups, &total);
    kvx__push_request__free_unpacked(msg, NULL);
    if (status != KVX_OK)
        push_request_free(req);
    return status;
}

kvx_status_t push_request_encode(uint64_t request_id, const uint8_t handle[PUSH_HANDLE_LEN],
                                 uint32_t deadline_ms, uint32_t bytes_max,
                                 const kvx_request_t *request, void **buf_p, size_t *size_p)
{
    size_t n             = request->num_local_groups;
    size_t nr            = request->remote != NULL ? request->num_remote_groups : 0;
    Kvx__PushRequest msg = KVX__PUSH_REQUEST__INIT;
    Kvx__Group *groups   = calloc(n + nr, sizeof(*groups));
    Kvx__Group **local   = calloc(n, sizeof(*local));
    Kvx__Group **remote  = calloc(nr > 0 ? nr : 1, sizeof(*remote));
    kvx_status_t status  = KVX_OK;
    void *buf            = NULL;
    size_t size;

    if (groups == NULL || local == NULL || remote == NULL) {
        status = error_no_memory("a push request");
        goto out;
    }
    for (size_t g = 0; g < n + nr; g++) {
        const kvx_group_ids_t *ids = g < n ? &request->local[g] : &request->remote[g - n];

        kvx__group__init(&groups[g]);
        groups[g].n_ids = ids->count;
        groups[g].ids   = (uint64_t *)ids->ids;
        if (g < n)
            local[g] = &groups[g];
        else
            remote[g - n] = &groups[g];
    }
    msg.request_id  = request_id;
    msg.deadline_ms = deadline_ms;
    msg.bytes_max   = bytes_max;
    msg.handle      = (ProtobufCBinaryData){PUSH_HANDLE_LEN, (uint8_t *)handle};
    if (request->token != NULL)
        msg.token = (ProtobufCBinaryData){KVX_TOKEN_LEN, (uint8_t *)request->token->bytes};
    msg.n_local  = n;
    msg.local    = local;
    msg.n_remote = nr;
    msg.remote   = remote;
    size         = kvx__push_request__get_packed_size(&msg);
    if (size > PUSH_MAX_REQUEST_SIZE) {
        status = error_set(KVX_ERR_INVALID, "push request: %zu bytes is more than %u", size,
                           PUSH_MAX_REQUEST_SIZE);
        goto out;
    }
    buf = malloc(size > 0 ? size : 1);
    if (buf == NULL) {
        status = error_no_memory("a push request");
        goto out;
    }
    kvx__push_request__pack(&msg, buf);
    *buf_p  = buf;
    *size_p = size;

out:
    free(groups);
    free(local);
    free(remote);
    return status;
}

struct push_proof push_proof_make(uint64_t instance, const uint8_t nonce[PUSH_NONCE_LEN])
{
    struct push_proof proof = {.magic = PUSH_PROOF_MAGIC, .instance = instance};

    memcpy(proof.nonce, nonce, PUSH_NONCE_LEN);
    return proof;
}

bool push_proof_parse(const void *data, size_t size, struct push_proof *proof)
{
    if (size != sizeof(*proof))
        return false;
    memcpy(proof, data, sizeof(*proof));
    return proof->magic == PUSH_PROOF_MAGIC && proof->reserved == 0 && proof->instance != 0;
}

/* The headers as they travel: in the host's byte order, as the proof is (both ends of a
 * deployment share one architecture; a wrong magic says otherwise). */
struct am_request_header {
    uint32_t magic;
    uint32_t reserved;
    uint64_t id;
};

struct am_answer_header {
    uint32_t magic;
    uint32_t bytes; /* KVXA: 0; KVXB: the bytes before the text */
    uint64_t id;
    uint8_t handle[PUSH_HANDLE_LEN];
};

_Static_assert(sizeof(struct am_request_header) == PUSH_AM_REQUEST_HEADER, "request header");
_Static_assert(sizeof(struct am_answer_header) == PUSH_AM_ANSWER_HEADER, "answer header");

size_t push_am_request_frame(uint64_t id, const void *body, size_t size, uint8_t out[PUSH_AM_MAX])
{
    struct am_request_header h = {.magic = PUSH_AM_REQUEST_MAGIC, .id = id};

    if (size > PUSH_AM_MAX - sizeof(h))
        return 0;
    memcpy(out, &h, sizeof(h));
    memcpy(out + sizeof(h), body, size);
    return sizeof(h) + size;
}

bool push_am_request_parse(const void *data, size_t size, uint64_t *id_p, const void **body_p,
                           size_t *body_size_p)
{
    struct am_request_header h;

    if (size <= sizeof(h) || size > PUSH_AM_MAX)
        return false;
    memcpy(&h, data, sizeof(h));
    if (h.magic != PUSH_AM_REQUEST_MAGIC || h.reserved != 0)
        return false;
    *id_p        = h.id;
    *body_p      = (const uint8_t *)data + sizeof(h);
    *body_size_p = size - sizeof(h);
    return true;
}

size_t push_am_answer_frame(const struct push_am_answer *answer, uint8_t out[PUSH_AM_MAX])
{
    struct am_answer_header h = {.magic = PUSH_AM_ANSWER_MAGIC, .id = answer->id};
    size_t text =
        answer->text_size < PUSH_AM_MAX - sizeof(h) ? answer->text_size : PUSH_AM_MAX - sizeof(h);

    memcpy(h.handle, answer->handle, PUSH_HANDLE_LEN);
    memcpy(out, &h, sizeof(h));
    memcpy(out + sizeof(h), answer->text, text);
    return sizeof(h) + text;
}

bool push_am_answer_parse(const void *data, size_t size, struct push_am_answer *answer)
{
    const uint8_t *bytes = data;
    struct am_answer_header h;
    size_t text;

    if (size <= sizeof(h) || size > PUSH_AM_BYTES_SIZE)
        return false;
    memcpy(&h, data, sizeof(h));
    if (h.magic == PUSH_AM_ANSWER_MAGIC && h.bytes == 0 && size <= PUSH_AM_MAX)
        text = sizeof(h);
    else if (h.magic == PUSH_AM_BYTES_MAGIC && h.bytes <= PUSH_BYTES_MAX &&
             size > sizeof(h) + h.bytes && size - sizeof(h) - h.bytes <= PUSH_AM_TEXT_MAX)
        text = sizeof(h) + h.bytes;
    else
        return false;
    for (size_t i = text; i < size; i++) {
        if (bytes[i] < 0x20 || bytes[i] > 0x7e)
            return false;
    }
    answer->id = h.id;
    memcpy(answer->handle, h.handle, PUSH_HANDLE_LEN);
    answer->text       = (const char *)bytes + text;
    answer->text_size  = size - text;
    answer->bytes      = h.magic == PUSH_AM_BYTES_MAGIC ? bytes + sizeof(h) : NULL;
    answer->bytes_size = h.magic == PUSH_AM_BYTES_MAGIC ? h.bytes : 0;
    return true;
}

uint8_t *push_am_bytes_begin(const struct push_am_answer *answer, size_t bytes_size,
                             uint8_t out[PUSH_AM_BYTES_SIZE])
{
    struct am_answer_header h = {
        .magic = PUSH_AM_BYTES_MAGIC, .bytes = (uint32_t)bytes_size, .id = answer->id};

    memcpy(h.handle, answer->handle, PUSH_HANDLE_LEN);
    memcpy(out, &h, sizeof(h));
    return out + sizeof(h);
}

size_t push_am_bytes_end(const char *text, size_t text_size, size_t bytes_size,
                         uint8_t out[PUSH_AM_BYTES_SIZE])
{
    size_t at   = sizeof(struct am_answer_header) + bytes_size;
    size_t size = text_size < PUSH_AM_TEXT_MAX ? text_size : PUSH_AM_TEXT_MAX;

    memcpy(out + at, text, size);
    return at + size;
}

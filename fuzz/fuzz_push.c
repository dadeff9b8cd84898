/* fuzz_push.c: libFuzzer target for the push request decoder and the writer's proof
 * (push_request.c), bytes a decode agent sends a prefill agent's side channel and bytes any
 * UCX peer can send a worker, and the framing of a push request and its answer as messages on
 * the data plane. A decoded request must respect every limit; a rejected one must leave a
 * message; a token and a deadline survive a round trip; a parsed proof, request message or
 * answer re-encodes to its bytes, and what it points at lies inside them.
 * Aborts on a broken invariant. */
#include "fuzz_invariant.h"
#include "push_request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct push_request req;
    struct push_proof proof;
    size_t ids = 0;

    if (push_proof_parse(data, size, &proof)) {
        struct push_proof again = push_proof_make(proof.instance, proof.nonce);

        invariant(size == sizeof(again) && memcmp(&again, data, size) == 0,
                  "a proof re-encodes to its bytes");
    }
    {
        struct push_am_answer answer;
        const void *body;
        size_t body_size;
        uint64_t id;

        if (push_am_request_parse(data, size, &id, &body, &body_size)) {
            uint8_t again[PUSH_AM_MAX];

            invariant(body_size > 0 && (const uint8_t *)body + body_size == data + size,
                      "a request message's body lies inside it");
            invariant(push_am_request_frame(id, body, body_size, again) == size &&
                          memcmp(again, data, size) == 0,
                      "a request message re-frames to its bytes");
        }
        if (push_am_answer_parse(data, size, &answer)) {
            static uint8_t again[PUSH_AM_BYTES_SIZE];

            invariant(answer.text_size > 0 &&
                          (const uint8_t *)answer.text + answer.text_size == data + size,
                      "an answer's text lies inside it");
            for (size_t i = 0; i < answer.text_size; i++)
                invariant(answer.text[i] >= 0x20 && answer.text[i] <= 0x7e, "printable text");
            if (answer.bytes == NULL) {
                invariant(push_am_answer_frame(&answer, again) == size &&
                              memcmp(again, data, size) == 0,
                          "an answer re-frames to its bytes");
            } else {
                invariant(answer.bytes_size <= PUSH_BYTES_MAX &&
                              answer.bytes + answer.bytes_size == (const uint8_t *)answer.text,
                          "a bytes answer's bytes lie inside it, before its text");
                memcpy(push_am_bytes_begin(&answer, answer.bytes_size, again), answer.bytes,
                       answer.bytes_size);
                invariant(push_am_bytes_end(answer.text, answer.text_size, answer.bytes_size,
                                            again) == size &&
                              memcmp(again, data, size) == 0,
                          "a bytes answer re-frames to its bytes");
            }
        }
    }
    if (push_request_decode(data, size, &req) != KVX_OK) {
        invariant(kvx_errmsg()[0] != '\0', "a rejected request leaves a message");
        return 0;
    }
    invariant(req.num_groups >= 1 && req.num_groups <= PUSH_MAX_GROUPS, "group count in range");
    if (req.has_token || req.deadline_ms != 0 || req.bytes_max != 0) { /* re-encoded: carried on */
        kvx_group_ids_t *local = req.groups;
        kvx_request_t request  = {
             local, req.num_groups, req.has_remote ? req.groups + req.num_groups : NULL,
            req.has_remote ? req.num_groups : 0, req.has_token ? &req.token : NULL};
        struct push_request back;
        void *buf   = NULL;
        size_t blen = 0;

        invariant(push_request_encode(req.request_id, req.handle, req.deadline_ms, req.bytes_max,
                                      &request, &buf, &blen) == KVX_OK,
                  "a decoded request encodes");
        invariant(push_request_decode(buf, blen, &back) == KVX_OK, "it decodes again");
        invariant(back.has_token == req.has_token &&
                      (!req.has_token || memcmp(&back.token, &req.token, sizeof(back.token)) == 0),
                  "its token survives a round trip");
        invariant(back.deadline_ms == req.deadline_ms, "its deadline survives a round trip");
        invariant(back.bytes_max == req.bytes_max, "its bytes_max survives a round trip");
        push_request_free(&back);
        free(buf);
    }
    for (size_t g = 0; g < req.num_groups * (req.has_remote ? 2 : 1); g++) {
        invariant(req.groups[g].count == 0 || req.groups[g].ids != NULL, "ids present");
        ids += req.groups[g].count;
        for (size_t i = 0; i < req.groups[g].count; i++)
            (void)*(volatile const uint64_t *)&req.groups[g].ids[i]; /* readable */
    }
    invariant(ids <= PUSH_MAX_IDS, "id count in range");
    push_request_free(&req);
    return 0;
}

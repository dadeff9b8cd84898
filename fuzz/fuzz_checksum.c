/* fuzz_checksum.c: libFuzzer target for the checksum request a prefill agent decodes from any
 * authenticated peer, and the answer a decode agent decodes (checksum.c). A decoded request
 * must respect every bound and re-encode to its bytes; a rejected one must leave a message; a
 * decoded answer re-encodes to its bytes. Aborts on a broken invariant. */
#include "checksum.h"
#include "fuzz_invariant.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct checksum_range ranges[CHECKSUM_MAX_RANGES];
    static uint64_t sums[CHECKSUM_MAX_RANGES];
    static uint8_t again[CHECKSUM_MAX_ANSWER_SIZE > CHECKSUM_MAX_REQUEST_SIZE
                             ? CHECKSUM_MAX_ANSWER_SIZE
                             : CHECKSUM_MAX_REQUEST_SIZE];
    size_t count   = 0;
    uint64_t total = 0;

    if (checksum_request_decode(data, size, ranges, &count) != KVX_OK) {
        invariant(kvx_errmsg()[0] != '\0', "a rejected request leaves a message");
    } else {
        invariant(count >= 1 && count <= CHECKSUM_MAX_RANGES, "range count in range");
        for (size_t i = 0; i < count; i++) {
            invariant(ranges[i].len >= 1, "no empty range");
            invariant(ranges[i].offset + ranges[i].len >= ranges[i].offset, "no overflow");
            total += ranges[i].len;
        }
        invariant(total <= CHECKSUM_MAX_BYTES, "bytes in range");
        invariant(checksum_request_encode(ranges, count, again) == size &&
                      memcmp(again, data, size) == 0,
                  "a request re-encodes to its bytes");
    }
    for (size_t n = 0; n <= CHECKSUM_MAX_RANGES; n += n < 4 ? 1 : 63) {
        if (checksum_answer_decode(data, size, n, sums))
            invariant(checksum_answer_encode(sums, n, again) == size &&
                          memcmp(again, data, size) == 0,
                      "an answer re-encodes to its bytes");
    }
    return 0;
}

/* checksum_serve.c: hashing our own storages for verification, on either side: the answer a
 * prefill agent gives to VERB_CHECKSUM, and the decode side's checksums of what it received.
 * Reads memory only inside our own storages; knows nothing of transfers. */
#include "checksum_serve.h"

#include "error.h"
#include "regions.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

kvx_status_t checksum_range_check(const struct core *core, const struct checksum_range *range,
                                  const char *side)
{
    const kvx_regions_t *t = core->regions;
    uint64_t end;

    /* Every storage is host memory today: kvx maps a storage the layout calls "vram" in host
     * memory too. Where device memory is mapped as such, this is where its storages must be
     * refused (or hashed on the device): a CPU hash of device memory faults. */
    if (range->storage >= core->num_storages)
        return error_set(KVX_ERR_OUT_OF_RANGE,
                         "%s range of %" PRIu64 " bytes at %" PRIu64 " names storage %" PRIu32
                         ", which is not registered (%zu storages)",
                         side, range->len, range->offset, range->storage, core->num_storages);
    if (__builtin_add_overflow(range->offset, range->len, &end) ||
        end > t->storage_sizes[range->storage])
        return error_set(KVX_ERR_OUT_OF_RANGE,
                         "%s range of %" PRIu64 " bytes at %" PRIu64
                         " lies outside storage %s of %" PRIu64 " bytes",
                         side, range->len, range->offset, t->storage_names[range->storage],
                         t->storage_sizes[range->storage]);
    return KVX_OK;
}

void checksum_local(struct core *core, const struct checksum_range *ranges, size_t count,
                    uint64_t *sums)
{
    uint64_t start = now_ns();

    for (size_t i = 0; i < count; i++) {
        const uint8_t *base = core->bases[ranges[i].storage];

        sums[i] = checksum_of(base + ranges[i].offset, ranges[i].len);
        core->stats.verify_bytes_hashed += ranges[i].len;
    }
    core->stats.verify_ns += now_ns() - start;
}

static void refuse(struct core *core, struct sidechan_server *side,
                   const struct sidechan_request *request)
{
    char reply[600];

    core->stats.verify_refused++;
    snprintf(reply, sizeof(reply), "%s%s", REPLY_ERROR, kvx_errmsg());
    sidechan_reply(side, &request->origin, reply, strlen(reply));
}

void checksum_serve(struct core *core, struct sidechan_server *side,
                    const struct sidechan_request *request)
{
    struct checksum_range ranges[CHECKSUM_MAX_RANGES];
    uint64_t sums[CHECKSUM_MAX_RANGES];
    uint8_t answer[CHECKSUM_MAX_ANSWER_SIZE];
    size_t count;

    if (checksum_request_decode(request->body, request->body_size, ranges, &count) != KVX_OK) {
        refuse(core, side, request);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        if (checksum_range_check(core, &ranges[i], "prefill") != KVX_OK) {
            error_set(KVX_ERR_OUT_OF_RANGE, "checksum request: ranges[%zu]: %s", i, kvx_errmsg());
            refuse(core, side, request);
            return;
        }
    }
    checksum_local(core, ranges, count, sums);
    core->stats.verify_served++;
    sidechan_reply(side, &request->origin, answer, checksum_answer_encode(sums, count, answer));
}

/* checksum_serve.c: hashing our own storages for verification, on either side: the answer a
 * prefill agent gives to VERB_CHECKSUM, and the decode side's checksums of what it received.
 * Reads memory only inside our own storages; knows nothing of transfers. */
#include "checksum_serve.h"

#include "error.h"
#include "gpu.h"
#include "regions.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Bytes of GPU memory staged at a time: a host buffer of this size per hashing call. */
#define CHECKSUM_STAGE_BYTES (4u << 20)

/* Where a GPU storage's range is, for checksum_of_staged. */
struct device_range {
    struct gpu *gpu;
    const uint8_t *at;
};

static kvx_status_t device_read(void *arg, uint64_t offset, void *dst, size_t len)
{
    const struct device_range *d = arg;

    return gpu_copy(d->gpu, dst, d->at + offset, len);
}

kvx_status_t checksum_local(struct core *core, const struct checksum_range *ranges, size_t count,
                            uint64_t *sums)
{
    uint64_t start      = now_ns();
    uint8_t *stage      = NULL;
    kvx_status_t status = KVX_OK;

    for (size_t i = 0; i < count && status == KVX_OK; i++) {
        const uint8_t *at = (const uint8_t *)core->bases[ranges[i].storage] + ranges[i].offset;
        struct gpu *gpu   = core->gpus != NULL ? core->gpus[ranges[i].storage] : NULL;
        struct device_range device = {gpu, at};

        if (gpu == NULL)
            sums[i] = checksum_of(at, ranges[i].len);
        else if (stage == NULL && (stage = malloc(CHECKSUM_STAGE_BYTES)) == NULL)
            status = error_no_memory("staging GPU memory to hash");
        else
            status = checksum_of_staged(device_read, &device, ranges[i].len, stage,
                                        CHECKSUM_STAGE_BYTES, &sums[i]);
        if (status == KVX_OK)
            core->stats.verify_bytes_hashed += ranges[i].len;
    }
    free(stage);
    core->stats.verify_ns += now_ns() - start;
    return status;
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
    if (checksum_local(core, ranges, count, sums) != KVX_OK) {
        refuse(core, side, request);
        return;
    }
    core->stats.verify_served++;
    sidechan_reply(side, &request->origin, answer, checksum_answer_encode(sums, count, answer));
}

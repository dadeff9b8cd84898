/* checksum.c: XXH3-64 over byte ranges, and the checksum request and answer of the side
 * channel as bytes: little-endian, fixed-size fields, every count and length checked before
 * use. Pure: the caller owns every buffer. */
#include "checksum.h"

#include "error.h"

#include <xxhash.h>

#include <inttypes.h>
#include <string.h>

/* XXH3's own state, allocated by the library: its size is not part of its ABI. */
struct checksum_stream *checksum_stream_create(void)
{
    return (struct checksum_stream *)XXH3_createState();
}

void checksum_stream_reset(struct checksum_stream *stream)
{
    XXH3_64bits_reset((XXH3_state_t *)stream);
}

void checksum_stream_update(struct checksum_stream *stream, const void *data, size_t len)
{
    XXH3_64bits_update((XXH3_state_t *)stream, data, len);
}

uint64_t checksum_stream_digest(const struct checksum_stream *stream)
{
    return XXH3_64bits_digest((const XXH3_state_t *)stream);
}

void checksum_stream_destroy(struct checksum_stream *stream)
{
    if (stream != NULL)
        XXH3_freeState((XXH3_state_t *)stream);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

size_t checksum_request_encode(const struct checksum_range *ranges, size_t count, uint8_t *buf)
{
    uint8_t *p = buf + CHECKSUM_HEADER_SIZE;

    put_u32(buf, CHECKSUM_MAGIC);
    put_u32(buf + 4, (uint32_t)count);
    for (size_t i = 0; i < count; i++, p += CHECKSUM_RANGE_SIZE) {
        put_u32(p, ranges[i].storage);
        put_u64(p + 4, ranges[i].offset);
        put_u64(p + 12, ranges[i].len);
    }
    return (size_t)(p - buf);
}

kvx_status_t checksum_request_decode(const void *buf, size_t size, struct checksum_range *ranges,
                                     size_t *count_p)
{
    const uint8_t *bytes = buf;
    uint64_t total       = 0;
    uint32_t count;

    if (size < CHECKSUM_HEADER_SIZE || get_u32(bytes) != CHECKSUM_MAGIC)
        return error_set(KVX_ERR_INVALID, "checksum request: %zu bytes are not one", size);
    count = get_u32(bytes + 4);
    if (count < 1 || count > CHECKSUM_MAX_RANGES)
        return error_set(KVX_ERR_INVALID, "checksum request: %" PRIu32 " ranges (1..%d)", count,
                         CHECKSUM_MAX_RANGES);
    if (size != CHECKSUM_HEADER_SIZE + (size_t)count * CHECKSUM_RANGE_SIZE)
        return error_set(KVX_ERR_INVALID,
                         "checksum request: %zu bytes for %" PRIu32 " ranges of %d bytes", size,
                         count, CHECKSUM_RANGE_SIZE);
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *p        = bytes + CHECKSUM_HEADER_SIZE + (size_t)i * CHECKSUM_RANGE_SIZE;
        struct checksum_range r = {get_u32(p), get_u64(p + 4), get_u64(p + 12)};
        uint64_t end;

        if (r.len == 0 || __builtin_add_overflow(r.offset, r.len, &end) ||
            __builtin_add_overflow(total, r.len, &total) || total > CHECKSUM_MAX_BYTES)
            return error_set(KVX_ERR_INVALID,
                             "checksum request: ranges[%" PRIu32 "]: %" PRIu64 " bytes at %" PRIu64
                             " (each >= 1, at most %u bytes in all)",
                             i, r.len, r.offset, CHECKSUM_MAX_BYTES);
        ranges[i] = r;
    }
    *count_p = count;
    return KVX_OK;
}

size_t checksum_answer_encode(const uint64_t *sums, size_t count, uint8_t *buf)
{
    memcpy(buf, CHECKSUM_ANSWER, CHECKSUM_ANSWER_LEN);
    put_u32(buf + CHECKSUM_ANSWER_LEN, (uint32_t)count);
    for (size_t i = 0; i < count; i++)
        put_u64(buf + CHECKSUM_ANSWER_LEN + 4 + 8 * i, sums[i]);
    return CHECKSUM_ANSWER_LEN + 4 + 8 * count;
}

bool checksum_answer_decode(const void *buf, size_t size, size_t count, uint64_t *sums)
{
    const uint8_t *bytes = buf;

    if (count > CHECKSUM_MAX_RANGES || size != CHECKSUM_ANSWER_LEN + 4 + 8 * count ||
        memcmp(bytes, CHECKSUM_ANSWER, CHECKSUM_ANSWER_LEN) != 0 ||
        get_u32(bytes + CHECKSUM_ANSWER_LEN) != count)
        return false;
    for (size_t i = 0; i < count; i++)
        sums[i] = get_u64(bytes + CHECKSUM_ANSWER_LEN + 4 + 8 * i);
    return true;
}

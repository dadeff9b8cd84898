/* pattern.c: the deterministic bytes of `kvx serve` and `kvx fetch --verify`: byte o of a
 * rank's storage is byte o % 8 of a splitmix64 word of (seed, rank, storage, o / 8), so any
 * range can be checked without the rest. */
#include "pattern.h"

#include <string.h>

static uint64_t pattern_word(uint64_t seed, uint32_t rank, size_t storage, uint64_t word)
{
    uint64_t z = seed ^ ((uint64_t)rank * 0xa0761d6478bd642fu) ^
                 ((uint64_t)storage * 0xd1b54a32d192ed03u) ^ (word * 0x9e3779b97f4a7c15u);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

uint8_t pattern_byte(uint64_t seed, uint32_t rank, size_t storage, uint64_t offset)
{
    return (uint8_t)(pattern_word(seed, rank, storage, offset / 8) >> (8 * (offset % 8)));
}

void pattern_fill(void *base, uint64_t size, uint64_t seed, uint32_t rank, size_t storage,
                  uint64_t offset)
{
    uint8_t *p = base;
    uint64_t i = 0;

    /* Byte by byte to the next word boundary, then word by word, then the tail. */
    for (; i < size && (offset + i) % 8 != 0; i++)
        p[i] = pattern_byte(seed, rank, storage, offset + i);
    for (; i + 8 <= size; i += 8) {
        uint64_t w = pattern_word(seed, rank, storage, (offset + i) / 8);

        memcpy(p + i, &w, 8); /* little-endian hosts: byte j of w is byte offset + i + j */
    }
    for (; i < size; i++)
        p[i] = pattern_byte(seed, rank, storage, offset + i);
}

uint64_t pattern_check(const void *actual, uint64_t len, uint64_t seed, uint32_t rank,
                       size_t storage, uint64_t offset)
{
    const uint8_t *p = actual;
    uint64_t i       = 0;

    /* Byte by byte to the next word boundary, then word by word, then the tail. */
    for (; i < len && (offset + i) % 8 != 0; i++) {
        if (p[i] != pattern_byte(seed, rank, storage, offset + i))
            return i;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pattern_word(seed, rank, storage, (offset + i) / 8);

        if (memcmp(p + i, &w, 8) != 0)
            break;
    }
    for (; i < len; i++) {
        if (p[i] != pattern_byte(seed, rank, storage, offset + i))
            return i;
    }
    return len;
}

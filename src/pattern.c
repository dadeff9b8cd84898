/* pattern.c: see pattern.h. Byte o of a rank's storage is byte o % 8 of a splitmix64 word of
 * (seed, rank, storage, o / 8). Host storages are filled and read in place; a GPU storage
 * is filled through a staging buffer and read back whole into host memory for a check
 * (docs/gpu.md). */
#include "pattern.h"

#include "error.h"
#include "gpu.h"
#include "regions.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static uint64_t pattern_word(uint64_t seed, uint32_t rank, size_t storage, uint64_t word)
{
    uint64_t z = seed ^ ((uint64_t)rank * 0xa0761d6478bd642fu) ^
                 ((uint64_t)storage * 0xd1b54a32d192ed03u) ^ (word * 0x9e3779b97f4a7c15u);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* The pattern's byte at `offset` of rank `rank`'s storage `storage`. */
static uint8_t pattern_byte(uint64_t seed, uint32_t rank, size_t storage, uint64_t offset)
{
    return (uint8_t)(pattern_word(seed, rank, storage, offset / 8) >> (8 * (offset % 8)));
}

static void pattern_fill(void *base, uint64_t size, uint64_t seed, uint32_t rank, size_t storage,
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

static uint64_t pattern_check(const void *actual, uint64_t len, uint64_t seed, uint32_t rank,
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

/* Bytes staged per device copy: large enough that the copy, not the call, is the cost. */
#define STAGE_BYTES (64u << 20)

kvx_status_t pattern_fill_range(struct core *core, size_t s, uint64_t offset, uint64_t len,
                                uint64_t seed, bool zero)
{
    uint8_t *base   = core->bases[s];
    struct gpu *gpu = core->gpus != NULL ? core->gpus[s] : NULL;
    uint8_t *stage;
    kvx_status_t status = KVX_OK;

    if (len == 0)
        return KVX_OK;
    if (gpu == NULL) {
        if (zero)
            memset(base + offset, 0, len);
        else
            pattern_fill(base + offset, len, seed, core->tp_rank, s, offset);
        return KVX_OK;
    }
    stage = malloc(len < STAGE_BYTES ? (size_t)len : STAGE_BYTES);
    if (stage == NULL)
        return error_no_memory("a buffer to stage GPU storages");
    for (uint64_t at = offset; at < offset + len && status == KVX_OK; at += STAGE_BYTES) {
        size_t chunk = offset + len - at < STAGE_BYTES ? (size_t)(offset + len - at) : STAGE_BYTES;

        if (zero)
            memset(stage, 0, chunk);
        else
            pattern_fill(stage, chunk, seed, core->tp_rank, s, at);
        status = gpu_copy(gpu, base + at, stage, chunk);
    }
    free(stage);
    return status;
}

kvx_status_t pattern_fill_storages(struct core *core, uint64_t seed, bool zero)
{
    kvx_status_t status = KVX_OK;

    for (size_t s = 0; s < core->num_storages && status == KVX_OK; s++)
        status = pattern_fill_range(core, s, 0, core->regions->storage_sizes[s], seed, zero);
    return status;
}

/* Host copies of the storages for the checks: a host storage is its own, a GPU one is read
 * into host memory whole (one copy of the storage, docs/gpu.md). */
struct host_images {
    const uint8_t **bases; /* by storage */
    uint8_t **copies;      /* by storage: what was read from a GPU storage, or NULL */
    size_t count;
};

static void host_images_free(struct host_images *im)
{
    for (size_t s = 0; im->copies != NULL && s < im->count; s++)
        free(im->copies[s]);
    free(im->copies);
    free(im->bases);
    *im = (struct host_images){0}; /* freed once, whoever frees it again */
}

static kvx_status_t host_images_read(const struct core *core, struct host_images *im)
{
    kvx_status_t status = KVX_OK;

    *im        = (struct host_images){.count = core->num_storages};
    im->bases  = calloc(im->count + 1, sizeof(*im->bases));
    im->copies = calloc(im->count + 1, sizeof(*im->copies));
    if (im->bases == NULL || im->copies == NULL)
        status = error_no_memory("the storages' host images");
    for (size_t s = 0; status == KVX_OK && s < im->count; s++) {
        uint64_t size   = core->regions->storage_sizes[s];
        struct gpu *gpu = core->gpus != NULL ? core->gpus[s] : NULL;

        im->bases[s] = core->bases[s];
        if (gpu == NULL)
            continue;
        im->copies[s] = size <= SIZE_MAX ? malloc((size_t)size) : NULL;
        status = im->copies[s] != NULL ? gpu_copy(gpu, im->copies[s], core->bases[s], (size_t)size)
                                       : error_no_memory("a GPU storage's host copy");
        im->bases[s] = im->copies[s];
    }
    if (status != KVX_OK)
        host_images_free(im);
    return status;
}

struct local_range {
    uint32_t storage;
    uint64_t offset;
    uint64_t len;
};

static int local_range_compare(const void *a, const void *b)
{
    const struct local_range *x = a;
    const struct local_range *y = b;

    if (x->storage != y->storage)
        return x->storage < y->storage ? -1 : 1;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* The first non-zero byte of `len` bytes at `p`, or len. */
static uint64_t first_nonzero(const uint8_t *p, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++) {
        if (p[i] != 0)
            return i;
    }
    return len;
}

/* Every byte the request did not name must still be zero (fetch zeroed the storages first):
 * a transfer that wrote outside its blocks is caught. */
static kvx_status_t check_untouched(const struct core *core, const kvx_pairs_t *pairs,
                                    const struct host_images *im)
{
    kvx_status_t status = KVX_OK;
    struct local_range *ranges;
    size_t n = 0;

    for (size_t r = 0; r < kvx_pairs_num_reads(pairs); r++) {
        size_t count;

        kvx_pairs_read(pairs, r, NULL, &count);
        n += count;
    }
    ranges = calloc(n + 1, sizeof(*ranges));
    if (ranges == NULL)
        return error_no_memory("the pattern check's ranges");
    n = 0;
    for (size_t r = 0; r < kvx_pairs_num_reads(pairs); r++) {
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, r, NULL, &count);

        for (size_t i = 0; i < count; i++)
            ranges[n++] = (struct local_range){p[i].local_storage, p[i].local_offset, p[i].len};
    }
    qsort(ranges, n, sizeof(*ranges), local_range_compare);
    for (uint32_t s = 0; status == KVX_OK && s < im->count; s++) {
        uint64_t storage_size = core->regions->storage_sizes[s];
        const uint8_t *base   = im->bases[s];
        uint64_t at           = 0; /* first byte not yet checked */
        size_t i              = 0;

        while (i < n && ranges[i].storage < s)
            i++;
        for (;; i++) {
            uint64_t end = i < n && ranges[i].storage == s ? ranges[i].offset : storage_size;
            uint64_t bad = end > at ? first_nonzero(base + at, end - at) : 0;

            if (end > at && bad < end - at) {
                status = error_set(KVX_ERR_MISMATCH,
                                   "local storage %" PRIu32 " byte %" PRIu64
                                   " was written but is outside the request",
                                   s, at + bad);
                break;
            }
            if (!(i < n && ranges[i].storage == s))
                break;
            if (ranges[i].offset + ranges[i].len > at)
                at = ranges[i].offset + ranges[i].len;
        }
    }
    free(ranges);
    return status;
}

/* The error for pair `p` from `rank`, whose local bytes `local` first differ from the
 * pattern of `seed` at index `bad`: where (local and remote storage and offset), the byte
 * expected and the byte found, and how many of the pair's bytes differ. Nearly all of them
 * differing is what a wrong seed looks like, so the message then says so. */
static kvx_status_t mismatch_describe(const kvx_pair_t *p, uint32_t rank, uint64_t seed,
                                      const uint8_t *local, uint64_t bad)
{
    uint64_t differ = 0;

    for (uint64_t i = bad; i < p->len; i++)
        differ += local[i] != pattern_byte(seed, rank, p->remote_storage, p->remote_offset + i);
    return error_set(KVX_ERR_MISMATCH,
                     "local storage %" PRIu32 " byte %" PRIu64 ": expected 0x%02x (seed %" PRIu64
                     ", remote rank %" PRIu32 " storage %" PRIu32 " byte %" PRIu64
                     "), found 0x%02x;"
                     " %" PRIu64 " of the pair's %" PRIu64 " bytes differ%s",
                     p->local_storage, p->local_offset + bad,
                     pattern_byte(seed, rank, p->remote_storage, p->remote_offset + bad), seed,
                     rank, p->remote_storage, p->remote_offset + bad, local[bad], differ, p->len,
                     differ > p->len / 2 ? ": is the seed the one kvx serve --fill used?" : "");
}

kvx_status_t pattern_check_pairs(const struct core *core, const kvx_pairs_t *pairs, uint64_t seed)
{
    struct host_images im;
    kvx_status_t status = host_images_read(core, &im);

    for (size_t r = 0; status == KVX_OK && r < kvx_pairs_num_reads(pairs); r++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, r, &rank, &count);

        for (size_t i = 0; status == KVX_OK && i < count; i++) {
            const uint8_t *local = im.bases[p[i].local_storage] + p[i].local_offset;
            uint64_t bad =
                pattern_check(local, p[i].len, seed, rank, p[i].remote_storage, p[i].remote_offset);

            if (bad < p[i].len)
                status = mismatch_describe(&p[i], rank, seed, local, bad);
        }
    }
    if (status == KVX_OK)
        status = check_untouched(core, pairs, &im);
    host_images_free(&im);
    return status;
}

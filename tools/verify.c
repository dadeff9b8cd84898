/* verify.c: checks a finished transfer the way `kvx fetch --verify` and `kvx demo` do: every
 * transferred byte against the prefill rank's pattern, and every other byte still zero. */
#include "verify.h"

#include "cli.h"
#include "pattern.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes staged per device copy: large enough that the copy, not the call, is the cost. */
#define STAGE_BYTES (64u << 20)

/* Writes the pattern (`zero`: zeroes) over `size` bytes of host storage `s` at `base`, or
 * through `stage` into GPU storage `s`. */
static kvx_status_t storage_fill(kvx_agent_t *agent, size_t s, uint8_t *base, uint64_t size,
                                 uint8_t *stage, uint64_t seed, uint32_t rank, bool zero)
{
    if (kvx_agent_storage_mem(agent, s) != KVX_MEM_VRAM) {
        if (zero)
            memset(base, 0, size);
        else
            pattern_fill(base, size, seed, rank, s, 0);
        return KVX_OK;
    }
    for (uint64_t at = 0; at < size; at += STAGE_BYTES) {
        size_t len = size - at < STAGE_BYTES ? (size_t)(size - at) : STAGE_BYTES;
        kvx_status_t status;

        if (zero)
            memset(stage, 0, len);
        else
            pattern_fill(stage, len, seed, rank, s, at);
        status = kvx_agent_storage_write(agent, s, at, stage, len);
        if (status != KVX_OK)
            return status;
    }
    return KVX_OK;
}

static kvx_status_t storages_write(kvx_agent_t *agent, uint64_t seed, uint32_t rank, bool zero)
{
    uint8_t *stage      = NULL;
    kvx_status_t status = KVX_OK;

    for (size_t s = 0; status == KVX_OK; s++) {
        uint64_t size;
        uint8_t *base = kvx_agent_storage(agent, s, &size);

        if (base == NULL)
            break;
        if (kvx_agent_storage_mem(agent, s) == KVX_MEM_VRAM && stage == NULL &&
            (stage = malloc(STAGE_BYTES)) == NULL) {
            fprintf(stderr, "kvx: error: out of memory staging GPU storages\n");
            status = KVX_ERR_NO_MEMORY;
            break;
        }
        status = storage_fill(agent, s, base, size, stage, seed, rank, zero);
        if (status != KVX_OK)
            cli_fail(status);
    }
    free(stage);
    return status;
}

kvx_status_t storages_fill(kvx_agent_t *agent, uint64_t seed, uint32_t rank)
{
    return storages_write(agent, seed, rank, false);
}

kvx_status_t storages_zero(kvx_agent_t *agent)
{
    return storages_write(agent, 0, 0, true);
}

/* Host copies of the agent's storages for the checks: a host storage is its own, a GPU one
 * is read into host memory whole (one copy of the storage, docs/gpu.md). */
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
}

static bool host_images_read(const kvx_agent_t *agent, struct host_images *im, char *verdict,
                             size_t size)
{
    uint64_t bytes;

    *im = (struct host_images){0};
    while (kvx_agent_storage(agent, im->count, NULL) != NULL)
        im->count++;
    im->bases  = calloc(im->count + 1, sizeof(*im->bases));
    im->copies = calloc(im->count + 1, sizeof(*im->copies));
    for (size_t s = 0; im->bases != NULL && im->copies != NULL && s < im->count; s++) {
        im->bases[s] = kvx_agent_storage(agent, s, &bytes);
        if (kvx_agent_storage_mem(agent, s) != KVX_MEM_VRAM)
            continue;
        im->copies[s] = bytes <= SIZE_MAX ? malloc((size_t)bytes) : NULL;
        if (im->copies[s] == NULL) {
            snprintf(verdict, size, "not verified: out of memory for storage %zu's host copy", s);
            host_images_free(im);
            return false;
        }
        if (kvx_agent_storage_read(agent, s, 0, im->copies[s], (size_t)bytes) != KVX_OK) {
            snprintf(verdict, size, "not verified: %s", kvx_errmsg());
            host_images_free(im);
            return false;
        }
        im->bases[s] = im->copies[s];
    }
    if (im->bases == NULL || im->copies == NULL) {
        snprintf(verdict, size, "not verified: out of memory");
        host_images_free(im);
        return false;
    }
    return true;
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
static bool verify_untouched(const kvx_agent_t *agent, const struct host_images *im, char *verdict,
                             size_t size)
{
    const kvx_pairs_t *pairs = kvx_agent_last_pairs(agent);
    struct local_range *ranges;
    size_t n = 0;
    bool ok  = true;

    for (size_t r = 0; r < kvx_pairs_num_reads(pairs); r++) {
        size_t count;

        kvx_pairs_read(pairs, r, NULL, &count);
        n += count;
    }
    ranges = calloc(n + 1, sizeof(*ranges));
    if (ranges == NULL) {
        snprintf(verdict, size, "not verified: out of memory");
        return false;
    }
    n = 0;
    for (size_t r = 0; r < kvx_pairs_num_reads(pairs); r++) {
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, r, NULL, &count);

        for (size_t i = 0; i < count; i++)
            ranges[n++] = (struct local_range){p[i].local_storage, p[i].local_offset, p[i].len};
    }
    qsort(ranges, n, sizeof(*ranges), local_range_compare);
    for (uint32_t s = 0; ok && s < im->count; s++) {
        uint64_t storage_size;
        const uint8_t *base = im->bases[s];
        uint64_t at         = 0; /* first byte not yet checked */
        size_t i            = 0;

        (void)kvx_agent_storage(agent, s, &storage_size);
        while (i < n && ranges[i].storage < s)
            i++;
        for (;; i++) {
            uint64_t end = i < n && ranges[i].storage == s ? ranges[i].offset : storage_size;
            uint64_t bad = end > at ? first_nonzero(base + at, end - at) : 0;

            if (end > at && bad < end - at) {
                snprintf(verdict, size,
                         "MISMATCH: local storage %" PRIu32 " byte %" PRIu64
                         " was written but is outside the request",
                         s, at + bad);
                ok = false;
                break;
            }
            if (!(i < n && ranges[i].storage == s))
                break;
            if (ranges[i].offset + ranges[i].len > at)
                at = ranges[i].offset + ranges[i].len;
        }
    }
    free(ranges);
    if (ok)
        snprintf(verdict, size, "verified");
    return ok;
}

/* The verdict for pair `p` from `rank`, whose local bytes `local` first differ from the
 * pattern of `seed` at index `bad`: where (local and remote storage and offset), the byte
 * expected and the byte found, and how many of the pair's bytes differ. Nearly all of them
 * differing is what a wrong seed looks like, so the verdict then says so. */
static void mismatch_describe(const kvx_pair_t *p, uint32_t rank, uint64_t seed,
                              const uint8_t *local, uint64_t bad, char *verdict, size_t size)
{
    uint64_t differ = 0;

    for (uint64_t i = bad; i < p->len; i++)
        differ += local[i] != pattern_byte(seed, rank, p->remote_storage, p->remote_offset + i);
    snprintf(verdict, size,
             "MISMATCH: local storage %" PRIu32 " byte %" PRIu64 ": expected 0x%02x (seed %" PRIu64
             ", remote rank %" PRIu32 " storage %" PRIu32 " byte %" PRIu64 "), found 0x%02x;"
             " %" PRIu64 " of the pair's %" PRIu64 " bytes differ%s",
             p->local_storage, p->local_offset + bad,
             pattern_byte(seed, rank, p->remote_storage, p->remote_offset + bad), seed, rank,
             p->remote_storage, p->remote_offset + bad, local[bad], differ, p->len,
             differ > p->len / 2 ? ": is the seed the one kvx serve --fill used?" : "");
}

/* Checks every transferred byte against the pattern of the prefill side's storage, then
 * that nothing else was written. */
bool verify_last_transfer(const kvx_agent_t *agent, uint64_t seed, char *verdict, size_t size)
{
    const kvx_pairs_t *pairs = kvx_agent_last_pairs(agent);
    struct host_images im;
    bool ok = true;

    if (!host_images_read(agent, &im, verdict, size))
        return false;

    for (size_t r = 0; ok && r < kvx_pairs_num_reads(pairs); r++) {
        uint32_t rank;
        size_t count;
        const kvx_pair_t *p = kvx_pairs_read(pairs, r, &rank, &count);

        for (size_t i = 0; ok && i < count; i++) {
            const uint8_t *local = im.bases[p[i].local_storage] + p[i].local_offset;
            uint64_t bad =
                pattern_check(local, p[i].len, seed, rank, p[i].remote_storage, p[i].remote_offset);

            if (bad < p[i].len) {
                mismatch_describe(&p[i], rank, seed, local, bad, verdict, size);
                ok = false;
            }
        }
    }
    ok = ok && verify_untouched(agent, &im, verdict, size);
    host_images_free(&im);
    return ok;
}

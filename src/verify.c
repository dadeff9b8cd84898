/* verify.c: a transfer's verification on the decode side. The pairs are split back into one
 * segment per (local region, block) they touch (a coalesced pair spans blocks, a sliced one is
 * part of a block); the prefill rank of each segment is asked for the checksum of its source
 * range, at most CHECKSUM_MAX_RANGES and CHECKSUM_MAX_BYTES per request and VERIFY_WINDOW
 * requests at once, and each answer is compared with our own checksum of the destination.
 * Deadlines are the owner's; this file only counts, compares and reports. */
#include "verify.h"

#include "checksum.h"
#include "checksum_serve.h"
#include "clock.h"
#include "conn.h"
#include "error.h"
#include "peer.h"
#include "regions.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_REGION UINT32_MAX

/* A piece of one pair inside one local block: the unit a mismatch names. */
struct segment {
    uint32_t leg;
    uint32_t region; /* local table index, or NO_REGION */
    uint64_t block;
    uint64_t remote_block;
    struct checksum_range local;
    struct checksum_range remote;
};

/* The segments of one peer, requested in order. */
struct leg {
    kvx_peer_t *peer;
    uint32_t rank;
    size_t first;
    size_t end;
    size_t next; /* the first segment not requested yet */
};

/* A request awaiting its answer: segments [first, first + count) of one leg; once answered,
 * its remote checksums wait here while the loop hashes our side (`hashing`). */
struct slot {
    struct verify *v;
    size_t leg;
    size_t first;
    size_t count;
    uint64_t id;
    bool pending;
    bool hashing;
    uint64_t remote[CHECKSUM_MAX_RANGES];
};

struct verify {
    struct core *core;
    verify_done_cb_t done;
    void *arg;
    uint32_t *by_storage;  /* local region indices grouped by storage */
    size_t *storage_start; /* by_storage[storage_start[s] .. storage_start[s + 1]) */
    struct segment *segments;
    size_t num_segments;
    size_t segments_capacity;
    struct leg *legs;
    size_t num_legs;
    size_t legs_capacity;
    struct slot slots[VERIFY_WINDOW];
    size_t compared;
    uint64_t bytes;
    uint64_t mismatches;
    kvx_verify_mismatch_t reported[KVX_VERIFY_MAX_REPORTED];
    size_t num_reported;
    bool requested;
    bool started;
    kvx_status_t status;
    double start;
    double seconds;
    char error[768];
};

/* The local regions by storage, once: the table never changes. */
static kvx_status_t regions_index(struct verify *v)
{
    const kvx_regions_t *t = v->core->regions;
    size_t *fill;

    v->by_storage    = calloc(t->num_regions + 1, sizeof(*v->by_storage));
    v->storage_start = calloc(t->num_storages + 1, sizeof(*v->storage_start));
    fill             = calloc(t->num_storages + 1, sizeof(*fill));
    if (v->by_storage == NULL || v->storage_start == NULL || fill == NULL) {
        free(fill);
        return error_no_memory("a verification");
    }
    for (size_t r = 0; r < t->num_regions; r++)
        v->storage_start[t->regions[r].storage + 1]++;
    for (size_t s = 0; s < t->num_storages; s++)
        v->storage_start[s + 1] += v->storage_start[s];
    for (size_t r = 0; r < t->num_regions; r++) {
        uint32_t s = t->regions[r].storage;

        v->by_storage[v->storage_start[s] + fill[s]++] = (uint32_t)r;
    }
    free(fill);
    return KVX_OK;
}

kvx_status_t verify_create(struct core *core, verify_done_cb_t done, void *arg,
                           struct verify **verify_p)
{
    struct verify *v = calloc(1, sizeof(*v));
    kvx_status_t status;

    if (v == NULL)
        return error_no_memory("a verification");
    *v     = (struct verify){.core = core, .done = done, .arg = arg, .status = KVX_INPROGRESS};
    status = regions_index(v);
    if (status != KVX_OK) {
        verify_destroy(v);
        return status;
    }
    for (size_t i = 0; i < VERIFY_WINDOW; i++)
        v->slots[i].v = v;
    *verify_p = v;
    return KVX_OK;
}

static void slots_forget(struct verify *v)
{
    for (size_t i = 0; i < VERIFY_WINDOW; i++) {
        if (v->slots[i].pending)
            peer_request_forget(v->legs[v->slots[i].leg].peer, v->slots[i].id);
        if (v->slots[i].hashing)
            checksum_jobs_cancel(v->core->checksums, &v->slots[i]);
        v->slots[i].pending = false;
        v->slots[i].hashing = false;
    }
}

void verify_destroy(struct verify *v)
{
    if (v == NULL)
        return;
    slots_forget(v);
    free(v->by_storage);
    free(v->storage_start);
    free(v->segments);
    free(v->legs);
    free(v);
}

void verify_reset(struct verify *v)
{
    slots_forget(v);
    v->num_segments = 0;
    v->num_legs     = 0;
    v->compared     = 0;
    v->bytes        = 0;
    v->mismatches   = 0;
    v->num_reported = 0;
    v->requested    = true;
    v->started      = false;
    v->status       = KVX_INPROGRESS;
    v->seconds      = 0;
    v->error[0]     = '\0';
}

static kvx_status_t segment_push(struct verify *v, const struct segment *s)
{
    if (v->num_segments == v->segments_capacity) {
        size_t capacity       = v->segments_capacity > 0 ? 2 * v->segments_capacity : 256;
        struct segment *grown = realloc(v->segments, capacity * sizeof(*grown));

        if (grown == NULL)
            return error_no_memory("verification segments");
        v->segments          = grown;
        v->segments_capacity = capacity;
    }
    v->segments[v->num_segments++] = *s;
    return KVX_OK;
}

/* The remote rank's block of region r that holds `offset`, or UINT64_MAX. */
static uint64_t remote_block_of(const kvx_regions_t *remote, uint32_t r, uint64_t offset)
{
    const struct region *rr;

    if (r == NO_REGION || r >= remote->num_regions)
        return UINT64_MAX;
    rr = &remote->regions[r];
    if (offset < rr->offset || rr->stride == 0 ||
        (offset - rr->offset) / rr->stride >= rr->num_blocks)
        return UINT64_MAX;
    return (offset - rr->offset) / rr->stride;
}

/* Segments of [lo, hi) of one local storage, from the source at remote_lo, as pieces of at
 * most CHECKSUM_MAX_BYTES labelled region r, block b. */
static kvx_status_t segments_emit(struct verify *v, const kvx_regions_t *remote,
                                  const kvx_pair_t *p, uint32_t r, uint64_t b, uint64_t lo,
                                  uint64_t hi)
{
    kvx_status_t status = KVX_OK;

    for (uint64_t at = lo; at < hi && status == KVX_OK; at += CHECKSUM_MAX_BYTES) {
        uint64_t len       = hi - at < CHECKSUM_MAX_BYTES ? hi - at : CHECKSUM_MAX_BYTES;
        uint64_t remote_at = p->remote_offset + (at - p->local_offset);
        struct segment s   = {.leg          = (uint32_t)v->num_legs,
                              .region       = r,
                              .block        = b,
                              .remote_block = remote_block_of(remote, r, remote_at),
                              .local        = {p->local_storage, at, len},
                              .remote       = {p->remote_storage, remote_at, len}};

        status = checksum_range_check(v->core, &s.local, "local");
        if (status == KVX_OK)
            status = segment_push(v, &s);
    }
    return status;
}

/* The segments of pair `p` inside region r's blocks; *covered_p gets their bytes. */
static kvx_status_t region_split(struct verify *v, const kvx_regions_t *remote, const kvx_pair_t *p,
                                 uint32_t r, uint64_t *covered_p)
{
    const struct region *R = &v->core->regions->regions[r];
    uint64_t lo            = p->local_offset;
    uint64_t hi            = lo + p->len;
    uint64_t b             = lo > R->offset ? (lo - R->offset) / R->stride : 0;
    kvx_status_t status    = KVX_OK;

    *covered_p = 0;
    for (; b < R->num_blocks && status == KVX_OK; b++) {
        uint64_t start = R->offset + b * R->stride;
        uint64_t s     = start > lo ? start : lo;
        uint64_t e     = start + R->block_len < hi ? start + R->block_len : hi;

        if (start >= hi)
            break;
        if (s < e) {
            status = segments_emit(v, remote, p, r, b, s, e);
            *covered_p += e - s;
        }
    }
    return status;
}

/* Splits one pair by the first region whose blocks hold all of it: the region the previous
 * pair was in (the plan emits a region's blocks in a row), else each region of its storage in
 * table order (regions whose blocks share bytes, as example 2's do, name the first). A pair
 * that no one region holds (coalesced across regions) is split by all of them; bytes that no
 * block holds exactly once (never, for pairs a plan made) are compared as one segment of no
 * region. */
static kvx_status_t pair_split(struct verify *v, const kvx_regions_t *remote, const kvx_pair_t *p,
                               uint32_t *last_p)
{
    const kvx_regions_t *t = v->core->regions;
    size_t mark            = v->num_segments;
    size_t first           = 0;
    size_t end             = 0;
    uint64_t covered       = 0;
    uint64_t part          = 0;
    kvx_status_t status    = KVX_OK;

    if (p->local_storage >= t->num_storages)
        return error_set(KVX_ERR_INTERNAL, "verify: a pair names local storage %" PRIu32,
                         p->local_storage);
    first = v->storage_start[p->local_storage];
    end   = v->storage_start[p->local_storage + 1];
    if (*last_p != NO_REGION && t->regions[*last_p].storage == p->local_storage)
        status = region_split(v, remote, p, *last_p, &covered);
    for (size_t i = first; i < end && status == KVX_OK && covered != p->len; i++) {
        v->num_segments = mark;
        status          = region_split(v, remote, p, v->by_storage[i], &covered);
        if (covered == p->len)
            *last_p = v->by_storage[i];
    }
    if (status == KVX_OK && covered != p->len) {
        v->num_segments = mark;
        covered         = 0;
        for (size_t i = first; i < end && status == KVX_OK; i++) {
            status = region_split(v, remote, p, v->by_storage[i], &part);
            covered += part;
        }
    }
    if (status == KVX_OK && covered != p->len) {
        v->num_segments = mark;
        status          = segments_emit(v, remote, p, NO_REGION, UINT64_MAX, p->local_offset,
                                        p->local_offset + p->len);
    }
    return status;
}

kvx_status_t verify_add(struct verify *v, kvx_peer_t *peer, const kvx_pair_t *pairs, size_t count)
{
    struct conn *conn = peer_conn(peer);
    uint32_t last     = NO_REGION;
    size_t first      = v->num_segments;
    const kvx_regions_t *remote;
    kvx_status_t status = KVX_OK;

    if (conn == NULL)
        return error_set(peer_down_status(peer), "verify: peer %s is down (%s)", peer_address(peer),
                         kvx_peer_down_reason(peer));
    if (v->num_legs == v->legs_capacity) {
        size_t capacity   = v->legs_capacity > 0 ? 2 * v->legs_capacity : 8;
        struct leg *grown = realloc(v->legs, capacity * sizeof(*grown));

        if (grown == NULL)
            return error_no_memory("a verification");
        v->legs          = grown;
        v->legs_capacity = capacity;
    }
    remote = kvx_metadata_regions(conn->metadata);
    for (size_t i = 0; i < count && status == KVX_OK; i++)
        status = pair_split(v, remote, &pairs[i], &last);
    if (status != KVX_OK) {
        v->num_segments = first;
        return status;
    }
    v->legs[v->num_legs++] = (struct leg){peer, conn->tp_rank, first, v->num_segments, first};
    return KVX_OK;
}

static void verify_end(struct verify *v, kvx_status_t status)
{
    struct core *core = v->core;

    slots_forget(v);
    v->status  = status;
    v->seconds = clock_seconds() - v->start;
    if (status == KVX_OK || status == KVX_ERR_MISMATCH) {
        core->stats.transfers_verified++;
        core->stats.verify_mismatches += v->mismatches;
    } else {
        core->stats.verify_failed++;
    }
}

void verify_fail(struct verify *v, kvx_status_t status, const char *format, ...)
{
    va_list args;

    if (v->status != KVX_INPROGRESS)
        return;
    va_start(args, format);
    vsnprintf(v->error, sizeof(v->error), format, args);
    va_end(args);
    verify_end(v, status);
}

/* "region 3 (layers.0.k) block 5 (descriptor 53), views layers.0.k layers.0.v: ..." */
static void mismatch_describe(const struct verify *v, const kvx_verify_mismatch_t *m, char *text,
                              size_t size)
{
    const kvx_regions_t *t = v->core->regions;
    int n;

    if (m->region == SIZE_MAX)
        n = snprintf(text, size, "bytes in no region");
    else
        n = snprintf(text, size,
                     "region %zu (%s) block %" PRIu64 " (descriptor %" PRIu64 "), views", m->region,
                     m->region_name, m->block, m->descriptor);
    for (size_t i = 0; i < m->num_views && n > 0 && (size_t)n < size; i++)
        n += snprintf(text + n, size - (size_t)n, " %s", t->view_names[m->views[i]]);
    if (n > 0 && (size_t)n < size)
        snprintf(text + n, size - (size_t)n,
                 ": local storage %s offset %" PRIu64 " len %" PRIu64 " checksum %016" PRIx64
                 ", remote rank %" PRIu32 " storage %" PRIu32 " offset %" PRIu64 " block %" PRId64
                 " checksum %016" PRIx64,
                 t->storage_names[m->range.local_storage], m->range.local_offset, m->range.len,
                 m->local_checksum, m->remote_rank, m->range.remote_storage, m->range.remote_offset,
                 m->remote_block == UINT64_MAX ? -1 : (int64_t)m->remote_block, m->remote_checksum);
}

static void mismatch_record(struct verify *v, const struct segment *s, uint64_t local,
                            uint64_t remote)
{
    const kvx_regions_t *t = v->core->regions;
    kvx_verify_mismatch_t *m;

    if (v->mismatches++ >= KVX_VERIFY_MAX_REPORTED)
        return;
    m  = &v->reported[v->num_reported++];
    *m = (kvx_verify_mismatch_t){
        .region      = s->region == NO_REGION ? SIZE_MAX : s->region,
        .region_name = s->region == NO_REGION ? "" : regions_region_name(t, &t->regions[s->region]),
        .block       = s->block,
        .descriptor =
            s->region == NO_REGION ? UINT64_MAX : t->regions[s->region].first_descriptor + s->block,
        .remote_rank     = v->legs[s->leg].rank,
        .remote_block    = s->remote_block,
        .range           = {s->local.storage, s->remote.storage, s->local.offset, s->remote.offset,
                            s->local.len},
        .local_checksum  = local,
        .remote_checksum = remote};
    if (s->region != NO_REGION) {
        m->num_views = t->regions[s->region].num_members;
        m->views     = &t->members[t->regions[s->region].first_member];
    }
}

static void verify_pump(struct verify *v);

/* Our side of one answered request is hashed (checksum_jobs_run, a slice a turn): compare,
 * then ask for more or end. */
static void slot_hashed(void *arg, kvx_status_t status, const uint64_t *sums)
{
    struct slot *slot = arg;
    struct verify *v  = slot->v;

    slot->hashing = false;
    if (v->status != KVX_INPROGRESS) /* cancelled with it: never called */
        return;
    if (status != KVX_OK) {
        verify_fail(v, KVX_ERR_IO, "verify: hashing our own memory: %s", kvx_errmsg());
        v->done(v->arg);
        return;
    }
    for (size_t i = 0; i < slot->count; i++) {
        const struct segment *s = &v->segments[slot->first + i];

        v->bytes += s->local.len;
        if (sums[i] != slot->remote[i])
            mismatch_record(v, s, sums[i], slot->remote[i]);
    }
    v->compared += slot->count;
    verify_pump(v);
    if (v->status != KVX_INPROGRESS)
        v->done(v->arg);
}

/* A prefill rank's answer to one request: keep its checksums and queue ours of the same
 * segments (the loop hashes them in slices: a turn never hashes 8 answers of 64 MiB). */
static void slot_reply(void *arg, const char *reply, size_t size)
{
    struct slot *slot = arg;
    struct verify *v  = slot->v;
    struct leg *leg   = &v->legs[slot->leg];
    struct checksum_range local[CHECKSUM_MAX_RANGES];

    slot->pending = false;
    if (v->status != KVX_INPROGRESS)
        return;
    if (size >= strlen(REPLY_ERROR) && memcmp(reply, REPLY_ERROR, strlen(REPLY_ERROR)) == 0) {
        verify_fail(v, KVX_ERR_PEER_REFUSED, "verify: remote rank %" PRIu32 " (%s) refused: %.500s",
                    leg->rank, peer_address(leg->peer), reply + strlen(REPLY_ERROR));
        v->done(v->arg);
        return;
    }
    if (!checksum_answer_decode(reply, size, slot->count, slot->remote)) {
        verify_fail(v, KVX_ERR_IO,
                    "verify: remote rank %" PRIu32 " (%s) answered %zu bytes that are not %zu "
                    "checksums",
                    leg->rank, peer_address(leg->peer), size, slot->count);
        v->done(v->arg);
        return;
    }
    for (size_t i = 0; i < slot->count; i++)
        local[i] = v->segments[slot->first + i].local;
    if (checksum_jobs_add(v->core->checksums, local, slot->count, slot_hashed, slot) != KVX_OK) {
        verify_fail(v, KVX_ERR_NO_MEMORY, "verify: %s", kvx_errmsg());
        v->done(v->arg);
        return;
    }
    slot->hashing = true;
}

/* Sends one request of leg l's next segments into `slot`. */
static kvx_status_t slot_send(struct verify *v, struct slot *slot, size_t l)
{
    struct leg *leg = &v->legs[l];
    struct checksum_range ranges[CHECKSUM_MAX_RANGES];
    uint8_t body[CHECKSUM_MAX_REQUEST_SIZE];
    uint64_t bytes = 0;
    size_t count   = 0;
    kvx_status_t status;

    while (leg->next + count < leg->end && count < CHECKSUM_MAX_RANGES &&
           bytes + v->segments[leg->next + count].remote.len <= CHECKSUM_MAX_BYTES) {
        ranges[count] = v->segments[leg->next + count].remote;
        bytes += ranges[count++].len;
    }
    status = peer_request_send(leg->peer, VERB_CHECKSUM, body,
                               checksum_request_encode(ranges, count, body), slot_reply, slot,
                               &slot->id);
    if (status != KVX_OK)
        return status;
    slot->v       = v;
    slot->leg     = l;
    slot->first   = leg->next;
    slot->count   = count;
    slot->pending = true;
    slot->hashing = false;
    leg->next += count;
    return KVX_OK;
}

/* Fills the free slots with the next requests, leg after leg; ends the verification once
 * every segment was compared, or when a request cannot be sent. */
static void verify_pump(struct verify *v)
{
    size_t l = 0;

    for (size_t i = 0; i < VERIFY_WINDOW && v->status == KVX_INPROGRESS; i++) {
        if (v->slots[i].pending || v->slots[i].hashing)
            continue;
        while (l < v->num_legs && v->legs[l].next == v->legs[l].end)
            l++;
        if (l == v->num_legs)
            break;
        kvx_status_t status = slot_send(v, &v->slots[i], l);

        if (status != KVX_OK)
            verify_fail(v, status, "verify: %s", kvx_errmsg());
    }
    if (v->status == KVX_INPROGRESS && v->compared == v->num_segments) {
        if (v->mismatches > 0) {
            char first[600];
            int n;

            mismatch_describe(v, &v->reported[0], first, sizeof(first));
            n = snprintf(v->error, sizeof(v->error),
                         "verify: %" PRIu64 " of %zu segments differ; the first: ", v->mismatches,
                         v->num_segments);
            snprintf(v->error + n, sizeof(v->error) - (size_t)n, "%s", first);
        }
        verify_end(v, v->mismatches > 0 ? KVX_ERR_MISMATCH : KVX_OK);
    }
}

kvx_status_t verify_start(struct verify *v)
{
    v->started = true;
    v->start   = clock_seconds();
    verify_pump(v);
    if (v->status != KVX_INPROGRESS && v->status != KVX_OK && v->status != KVX_ERR_MISMATCH)
        return error_set(v->status, "%s", v->error);
    return KVX_OK;
}

bool verify_ended(const struct verify *v)
{
    return v->status != KVX_INPROGRESS;
}

bool verify_started(const struct verify *v)
{
    return v->started;
}

kvx_status_t verify_status(const struct verify *v)
{
    return v->status;
}

const char *verify_error(const struct verify *v)
{
    return v->error;
}

bool verify_uses(const struct verify *v, const kvx_peer_t *peer)
{
    for (size_t l = 0; l < v->num_legs; l++) {
        if (v->legs[l].peer == peer)
            return true;
    }
    return false;
}

size_t verify_unanswered(const struct verify *v)
{
    return v->num_segments - v->compared;
}

size_t verify_num_segments(const struct verify *v)
{
    return v->num_segments;
}

void verify_result(const struct verify *v, kvx_verify_result_t *result_p)
{
    *result_p = (kvx_verify_result_t){.requested    = v->requested,
                                      .status       = v->status,
                                      .segments     = v->compared,
                                      .bytes        = v->bytes,
                                      .mismatches   = v->mismatches,
                                      .pending      = verify_unanswered(v),
                                      .seconds      = v->seconds,
                                      .num_reported = v->num_reported,
                                      .reported     = v->reported};
}

/* hold.c: requests a prefill agent holds for its consumers. Open addressing with
 * backward-shift deletion keeps lookups O(1) and the table free of tombstones; the table
 * grows by doubling up to KVX_MAX_HELD requests. Leases sit in a min-heap with lazy
 * deletion: a released or extended hold leaves a stale entry, skipped when it surfaces. */
#include "hold.h"

#include "auth.h"
#include "error.h"
#include "invariant.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

struct hold {
    bool used;
    uint64_t request_id;
    kvx_token_t token;           /* what a done or heartbeat must present */
    uint32_t consumers;          /* ranks that must report done */
    uint32_t reported;           /* distinct ranks that did */
    uint64_t expiry_ms;          /* lease end; the heap entry with this expiry is the live one */
    struct hold_report *reports; /* the ranks that reported, `reported` of them, grown on demand */
    size_t reports_capacity;
    struct hold_release *released; /* the ids, handed over on release */
};

/* A rank that reported, and the connection it is bound to. */
struct hold_report {
    uint32_t rank;
    uint64_t conn;
};

static size_t hold_hash(uint64_t id, size_t size)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdu;
    id ^= id >> 33;
    return (size_t)id & (size - 1);
}

static struct hold *hold_find(struct hold_table *t, uint64_t id)
{
    if (t->size == 0)
        return NULL;
    for (size_t i = hold_hash(id, t->size);; i = (i + 1) & (t->size - 1)) {
        if (!t->slots[i].used)
            return NULL;
        if (t->slots[i].request_id == id)
            return &t->slots[i];
    }
}

static void hold_insert(struct hold *slots, size_t size, const struct hold *h)
{
    size_t i = hold_hash(h->request_id, size);

    while (slots[i].used)
        i = (i + 1) & (size - 1);
    slots[i] = *h;
}

/* Keeps the table at most half full. */
static kvx_status_t hold_table_grow(struct hold_table *t)
{
    size_t size = t->size == 0 ? 64 : t->size * 2;
    struct hold *slots;

    if ((t->count + 1) * 2 <= t->size)
        return KVX_OK;
    slots = calloc(size, sizeof(*slots));
    if (slots == NULL)
        return error_no_memory("the hold table");
    for (size_t i = 0; i < t->size; i++) {
        if (t->slots[i].used)
            hold_insert(slots, size, &t->slots[i]);
    }
    free(t->slots);
    t->slots = slots;
    t->size  = size;
    return KVX_OK;
}

static bool lease_before(const struct lease *a, const struct lease *b)
{
    return a->expiry_ms < b->expiry_ms;
}

static void heap_swap(struct lease *a, struct lease *b)
{
    struct lease t = *a;

    *a = *b;
    *b = t;
}

static void heap_pop(struct hold_table *t)
{
    size_t i = 0;

    t->heap[0] = t->heap[--t->heap_count];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;

        if (l < t->heap_count && lease_before(&t->heap[l], &t->heap[m]))
            m = l;
        if (r < t->heap_count && lease_before(&t->heap[r], &t->heap[m]))
            m = r;
        if (m == i)
            break;
        heap_swap(&t->heap[i], &t->heap[m]);
        i = m;
    }
}

static kvx_status_t heap_push(struct hold_table *t, uint64_t request_id, uint64_t expiry_ms)
{
    size_t i;

    if (t->heap_count == t->heap_max) {
        size_t max          = t->heap_max == 0 ? 64 : t->heap_max * 2;
        struct lease *grown = realloc(t->heap, max * sizeof(*grown));

        if (grown == NULL)
            return error_no_memory("the lease heap");
        t->heap     = grown;
        t->heap_max = max;
    }
    i          = t->heap_count++;
    t->heap[i] = (struct lease){expiry_ms, request_id};
    while (i > 0 && lease_before(&t->heap[i], &t->heap[(i - 1) / 2])) {
        heap_swap(&t->heap[i], &t->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    return KVX_OK;
}

static void groups_free(kvx_group_ids_t *groups, size_t n)
{
    for (size_t g = 0; groups != NULL && g < n; g++)
        free((void *)groups[g].ids);
    free(groups);
}

void hold_release_free(struct hold_release *release)
{
    if (release == NULL)
        return;
    groups_free(release->groups, release->num_groups);
    free(release);
}

kvx_status_t hold_table_add(struct hold_table *t, uint64_t request_id, const kvx_token_t *token,
                            const kvx_group_ids_t *groups, size_t num_groups, uint32_t consumers,
                            uint64_t now_ms)
{
    struct hold h = {.used       = true,
                     .request_id = request_id,
                     .token      = *token,
                     .consumers  = consumers,
                     .expiry_ms  = now_ms + t->lease_ms};
    struct hold_release *r;
    kvx_status_t status;

    if (consumers == 0 || consumers > KVX_MAX_TP)
        return error_set(KVX_ERR_INVALID, "hold %" PRIu64 ": %" PRIu32 " consumers (1..%d)",
                         request_id, consumers, KVX_MAX_TP);
    if (hold_find(t, request_id) != NULL)
        return error_set(KVX_ERR_INVALID, "hold %" PRIu64 ": already held", request_id);
    if (t->count >= KVX_MAX_HELD)
        return error_set(KVX_ERR_INVALID, "hold %" PRIu64 ": %d requests are held already",
                         request_id, KVX_MAX_HELD);
    if (num_groups > 0 && groups == NULL)
        return error_set(KVX_ERR_INVALID, "hold %" PRIu64 ": groups missing", request_id);
    r = calloc(1, sizeof(*r));
    if (r == NULL ||
        (r->groups = calloc(num_groups > 0 ? num_groups : 1, sizeof(*r->groups))) == NULL) {
        free(r);
        return error_no_memory("a hold");
    }
    r->request_id = request_id;
    for (size_t g = 0; g < num_groups; g++) {
        uint64_t *ids = malloc((groups[g].count > 0 ? groups[g].count : 1) * sizeof(*ids));

        if (ids == NULL || (groups[g].count > 0 && groups[g].ids == NULL)) {
            free(ids);
            hold_release_free(r);
            return ids == NULL ? error_no_memory("a hold")
                               : error_set(KVX_ERR_INVALID, "hold: group %zu has no ids", g);
        }
        if (groups[g].count > 0)
            memcpy(ids, groups[g].ids, groups[g].count * sizeof(*ids));
        r->groups[g] = (kvx_group_ids_t){ids, groups[g].count};
        r->num_groups++;
    }
    status = hold_table_grow(t);
    if (status == KVX_OK)
        status = heap_push(t, request_id, h.expiry_ms);
    if (status != KVX_OK) {
        hold_release_free(r);
        return status;
    }
    h.released = r;
    hold_insert(t->slots, t->size, &h);
    t->count++;
    return KVX_OK;
}

/* Removes slot i, shifting later members of its probe run back so lookups stay correct. */
static void hold_remove(struct hold_table *t, size_t i)
{
    size_t mask = t->size - 1;

    t->slots[i].used = false;
    for (size_t j = (i + 1) & mask; t->slots[j].used; j = (j + 1) & mask) {
        size_t home = hold_hash(t->slots[j].request_id, t->size);

        /* Move j into the hole when its home is not between the hole and j (cyclically). */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->slots[i]      = t->slots[j];
            t->slots[j].used = false;
            i                = j;
        }
    }
    t->count--;
}

/* Remembers that request_id's hold ended, and how, overwriting the oldest entry. */
static void ended_add(struct hold_table *t, uint64_t request_id, bool expired)
{
    t->ended[t->ended_next] = (struct hold_ended){request_id, expired};
    t->ended_next           = (t->ended_next + 1) % HOLD_ENDED_MAX;
    if (t->ended_count < HOLD_ENDED_MAX)
        t->ended_count++;
}

/* The newest ring entry of request_id (a request held again and ended twice has two), or
 * NULL. A linear scan: only a done or push for a request not held pays it, and it is
 * bounded by the ring, 64 KiB. */
static const struct hold_ended *ended_find(const struct hold_table *t, uint64_t request_id)
{
    for (size_t k = 1; k <= t->ended_count; k++) {
        const struct hold_ended *e =
            &t->ended[(t->ended_next + HOLD_ENDED_MAX - k) % HOLD_ENDED_MAX];

        if (e->request_id == request_id)
            return e;
    }
    return NULL;
}

enum hold_state hold_table_state(const struct hold_table *t, uint64_t request_id)
{
    const struct hold_ended *e;

    if (hold_find((struct hold_table *)t, request_id) != NULL)
        return HOLD_HELD;
    e = ended_find(t, request_id);
    if (e == NULL)
        return HOLD_NONE;
    return e->expired ? HOLD_ENDED_EXPIRED : HOLD_ENDED_RELEASED;
}

bool hold_token_given(const kvx_token_t *token)
{
    for (size_t i = 0; i < KVX_TOKEN_LEN; i++) {
        if (token->bytes[i] != 0)
            return true;
    }
    return false;
}

const char *hold_done_reason(enum hold_done done)
{
    switch (done) {
    case HOLD_DONE_COUNTED:
    case HOLD_DONE_RELEASED:
        return "";
    case HOLD_DONE_REPEATED:
        return "repeated done: this rank reported the request already";
    case HOLD_DONE_UNKNOWN:
        return "no such request: it is not held here";
    case HOLD_DONE_FORGED:
        return "wrong token: the request is held with another";
    case HOLD_DONE_ENDED:
        return "hold released already: the blocks may have been reused";
    case HOLD_DONE_EXPIRED:
        return "hold's lease expired: the blocks may have been reused";
    case HOLD_DONE_OUTSIDE:
        return "not a consumer rank of this hold: it cannot have read this rank's share";
    case HOLD_DONE_TAKEN:
        return "this rank reported the request already, over another connection";
    case HOLD_DONE_SWITCHED:
        return "this connection reported the request for another rank already";
    }
    return "refused";
}

/* Removes hold h and hands its blocks to the release hook. */
static void hold_release(struct hold_table *t, struct hold *h, bool expired)
{
    struct hold_release *released = h->released;

    ended_add(t, h->request_id, expired);
    free(h->reports);
    hold_remove(t, (size_t)(h - t->slots));
    released->expired = expired;
    t->release(t->arg, released);
}

/* Whether a done or heartbeat may act on `h`: its token must be the hold's (counted if not). */
static bool hold_token_ok(struct hold_table *t, const struct hold *h, const kvx_token_t *token)
{
    if (auth_equal(h->token.bytes, token->bytes, KVX_TOKEN_LEN))
        return true;
    t->forged++;
    return false;
}

/* Whether decode rank `rank` can be a consumer of hold h on this prefill rank k of N, by
 * the plan's rules (docs/plan.md, "Per region": a decode rank reads, or only notifies, the
 * prefill ranks of its own share). With more decode ranks than prefill ranks (M = consumers
 * * N), the ranks k * consumers .. k * consumers + consumers - 1 share rank k; with one
 * consumer (M <= N, one dividing the other), it is rank k / (N / M), at most k. */
static bool hold_rank_possible(const struct hold_table *t, const struct hold *h, uint32_t rank)
{
    uint64_t first = (uint64_t)t->tp_rank * h->consumers;

    if (h->consumers == 1)
        return rank <= t->tp_rank;
    return rank >= first && rank - first < h->consumers;
}

/* What a done of `rank` over `conn` for request_id would do, with the hold it acts on in *h_p
 * (NULL unless COUNTED or RELEASED). Counts a wrong token; changes nothing else. The token
 * is checked first, so a done without it learns nothing of the hold's ranks. */
static enum hold_done hold_judge(struct hold_table *t, uint64_t request_id, uint32_t rank,
                                 uint64_t conn, const kvx_token_t *token, struct hold **h_p)
{
    struct hold *h = hold_find(t, request_id);

    *h_p = NULL;
    if (h == NULL) {
        switch (hold_table_state(t, request_id)) {
        case HOLD_ENDED_RELEASED:
            return HOLD_DONE_ENDED;
        case HOLD_ENDED_EXPIRED:
            return HOLD_DONE_EXPIRED;
        default:
            return HOLD_DONE_UNKNOWN;
        }
    }
    if (!hold_token_ok(t, h, token))
        return HOLD_DONE_FORGED;
    if (!hold_rank_possible(t, h, rank))
        return HOLD_DONE_OUTSIDE;
    for (uint32_t i = 0; i < h->reported; i++) { /* ranks first: the answer is order-free */
        if (h->reports[i].rank == rank)
            return h->reports[i].conn == conn ? HOLD_DONE_REPEATED : HOLD_DONE_TAKEN;
    }
    for (uint32_t i = 0; i < h->reported; i++) {
        if (h->reports[i].conn == conn)
            return HOLD_DONE_SWITCHED;
    }
    *h_p = h;
    return h->reported + 1 < h->consumers ? HOLD_DONE_COUNTED : HOLD_DONE_RELEASED;
}

enum hold_done hold_table_check(struct hold_table *t, uint64_t request_id, uint32_t rank,
                                uint64_t conn, const kvx_token_t *token)
{
    struct hold *h;

    return hold_judge(t, request_id, rank, conn, token, &h);
}

enum hold_done hold_table_done(struct hold_table *t, uint64_t request_id, uint32_t rank,
                               uint64_t conn, const kvx_token_t *token)
{
    struct hold *h;
    enum hold_done done = hold_judge(t, request_id, rank, conn, token, &h);

    KVX_ASSERT(conn != 0);
    if (done == HOLD_DONE_UNKNOWN || done == HOLD_DONE_ENDED || done == HOLD_DONE_EXPIRED)
        t->unknown++;
    if (done == HOLD_DONE_REPEATED)
        t->repeated++;
    if (done == HOLD_DONE_OUTSIDE || done == HOLD_DONE_TAKEN || done == HOLD_DONE_SWITCHED)
        t->ranks_refused++;
    if (h == NULL)
        return done;
    if (done == HOLD_DONE_RELEASED) { /* the last one: nothing to remember it for */
        t->released++;
        hold_release(t, h, false);
        return HOLD_DONE_RELEASED;
    }
    if (h->reported == h->reports_capacity) {
        size_t capacity           = h->reports_capacity > 0 ? 2 * h->reports_capacity : 4;
        struct hold_report *grown = realloc(h->reports, capacity * sizeof(*grown));

        if (grown == NULL) /* no room to remember the rank: treat it as not reported */
            return HOLD_DONE_REPEATED;
        h->reports          = grown;
        h->reports_capacity = capacity;
    }
    h->reports[h->reported++] = (struct hold_report){rank, conn};
    KVX_ASSERT(h->reported < h->consumers);
    return HOLD_DONE_COUNTED;
}

/* Rebuilds the heap from the live holds once stale entries outnumber them, so the heap
 * stays within a constant factor of the holds however often leases are extended. */
static void heap_compact(struct hold_table *t)
{
    if (t->heap_count < 2 * t->count + 64)
        return;
    t->heap_count = 0;
    for (size_t i = 0; i < t->size; i++) {
        if (t->slots[i].used)
            heap_push(t, t->slots[i].request_id, t->slots[i].expiry_ms); /* fits: no growth */
    }
}

void hold_table_extend(struct hold_table *t, uint64_t request_id, const kvx_token_t *token,
                       uint64_t now_ms)
{
    struct hold *h  = hold_find(t, request_id);
    uint64_t expiry = now_ms + t->lease_ms * 2 / 3;

    if (h == NULL || !hold_token_ok(t, h, token) || expiry <= h->expiry_ms)
        return;
    heap_compact(t);
    if (heap_push(t, request_id, expiry) == KVX_OK) /* else the old lease stands */
        h->expiry_ms = expiry;
}

size_t hold_table_expire(struct hold_table *t, uint64_t now_ms)
{
    size_t expired = 0;

    while (t->heap_count > 0 && t->heap[0].expiry_ms <= now_ms) {
        struct lease top = t->heap[0];
        struct hold *h   = hold_find(t, top.request_id);

        heap_pop(t);
        if (h != NULL && h->expiry_ms == top.expiry_ms) { /* the live lease, not a stale one */
            t->expired++;
            expired++;
            hold_release(t, h, true);
        }
    }
    return expired;
}

uint64_t hold_table_next_expiry(const struct hold_table *t)
{
    return t->heap_count > 0 ? t->heap[0].expiry_ms : UINT64_MAX;
}

void hold_table_free(struct hold_table *t)
{
    for (size_t i = 0; i < t->size; i++) {
        if (t->slots[i].used) {
            hold_release_free(t->slots[i].released);
            free(t->slots[i].reports);
        }
    }
    free(t->slots);
    free(t->heap);
    t->slots      = NULL;
    t->heap       = NULL;
    t->size       = 0;
    t->count      = 0;
    t->heap_count = 0;
    t->heap_max   = 0;
}

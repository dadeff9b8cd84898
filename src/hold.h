/* hold.h: the prefill side's held requests: a table keyed by request id, released when
 * every consumer rank's `done` arrived or when its lease expires, leases kept in a min-heap so
 * an expiry scan looks only at what expires. Times are milliseconds of clock_ms(). */
#ifndef KVX_SRC_HOLD_H
#define KVX_SRC_HOLD_H

#include "kvx.h"
#include "loop.h"

struct hold;

/* A released request, handed to the table's `release` hook, which owns it from then on (the
 * agent queues it and runs the user's callback from the completion phase). Allocated with
 * the hold, so releasing allocates nothing. */
struct hold_release {
    struct loop_event event;
    void *owner; /* the hook's, to find its way back when the event runs */
    uint64_t request_id;
    bool expired;
    size_t num_groups;
    kvx_group_ids_t *groups; /* copies of the held ids */
};

void hold_release_free(struct hold_release *release);

/* What a `done` did. */
enum hold_done {
    HOLD_DONE_COUNTED,  /* a consumer rank reported for the first time */
    HOLD_DONE_RELEASED, /* ... and it was the last one: the request is released */
    HOLD_DONE_REPEATED, /* this rank reported already: ignored */
    HOLD_DONE_UNKNOWN,  /* no such request is held (never, or released already) */
    HOLD_DONE_FORGED,   /* held, but the done carried another token: ignored */
};

/* A lease in the expiry heap; stale once its hold was released or extended. */
struct lease {
    uint64_t expiry_ms;
    uint64_t request_id;
};

struct hold_table {
    uint64_t lease_ms;  /* a hold's lease from kvx_hold */
    struct lease *heap; /* min-heap by expiry */
    size_t heap_count;
    size_t heap_max;
    uint64_t expired;
    struct hold *slots; /* open addressing by request id; a power of two */
    size_t size;
    size_t count; /* held now */
    uint64_t released;
    uint64_t unknown;
    uint64_t repeated;
    uint64_t forged; /* dones and heartbeats with a wrong token */
    void (*release)(void *arg, struct hold_release *release); /* required */
    void *arg;
};

/* Holds request_id until its consumers report; dones and heartbeats must present `token`. */
kvx_status_t hold_table_add(struct hold_table *t, uint64_t request_id, const kvx_token_t *token,
                            const kvx_group_ids_t *groups, size_t num_groups, uint32_t consumers,
                            uint64_t now_ms);

/* A consumer still wants request_id: its lease becomes max(old, now + 2/3 lease). Unknown
 * ids are ignored; a wrong token is counted in `forged` and changes nothing. */
void hold_table_extend(struct hold_table *t, uint64_t request_id, const kvx_token_t *token,
                       uint64_t now_ms);

/* Releases every hold whose lease expired by now_ms; returns how many. */
size_t hold_table_expire(struct hold_table *t, uint64_t now_ms);

/* The earliest lease end in the heap (perhaps a stale one: then expiring finds nothing), or
 * UINT64_MAX when nothing is held. */
uint64_t hold_table_next_expiry(const struct hold_table *t);

/* The `done` of consumer rank `rank` (< KVX_MAX_TP) for request_id: each rank counts once (a
 * bitmap per hold), and the request is released once `consumers` distinct ranks reported.
 * A done whose token is not the hold's changes nothing. Counts unknown, forged and repeated
 * dones. */
enum hold_done hold_table_done(struct hold_table *t, uint64_t request_id, uint32_t rank,
                               const kvx_token_t *token);

void hold_table_free(struct hold_table *t);

#endif

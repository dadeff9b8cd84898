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
    HOLD_DONE_UNKNOWN,  /* not held, and not among the holds that ended lately */
    HOLD_DONE_FORGED,   /* held, but the done carried another token: ignored */
    HOLD_DONE_ENDED,    /* not held: it was released after its consumers reported */
    HOLD_DONE_EXPIRED,  /* not held: its lease expired */
    HOLD_DONE_OUTSIDE,  /* held, but this rank cannot be one of its consumers: ignored */
    HOLD_DONE_TAKEN,    /* held, and this rank reported over another connection: ignored */
    HOLD_DONE_SWITCHED, /* held, and this connection reported another rank: ignored */
};

/* Why a done that did not count was refused, as the answer says it ("" for one that
 * counted). Fixed text. */
const char *hold_done_reason(enum hold_done done);

/* True when `token` is one: a done or push without a token carries zeros. */
bool hold_token_given(const kvx_token_t *token);

/* Where a request stands: held now, ended lately (how), or not known (never held, or ended
 * longer ago than the ring of ended holds remembers). */
enum hold_state { HOLD_NONE, HOLD_HELD, HOLD_ENDED_RELEASED, HOLD_ENDED_EXPIRED };

/* Holds that ended, the last HOLD_ENDED_MAX of them: a done or push that comes after its
 * hold ended (a reference used twice, or a stale one) is refused at once by name, where the
 * blocks may have been reused already. 4096 entries of 16 bytes. */
#define HOLD_ENDED_MAX 4096
struct hold_ended {
    uint64_t request_id;
    bool expired;
};

/* A lease in the expiry heap; stale once its hold was released or extended. */
struct lease {
    uint64_t expiry_ms;
    uint64_t request_id;
};

struct hold_table {
    uint64_t lease_ms;  /* a hold's lease from kvx_hold */
    uint32_t tp_rank;   /* this prefill rank, and its TP size (0 reads as 1): which decode */
    uint32_t tp_size;   /* ranks a hold's consumers can be (hold.c, hold_rank_possible) */
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
    uint64_t forged;                         /* dones and heartbeats with a wrong token */
    uint64_t ranks_refused;                  /* dones refused OUTSIDE, TAKEN or SWITCHED */
    struct hold_ended ended[HOLD_ENDED_MAX]; /* a ring: the newest at ended_next - 1 */
    size_t ended_next;
    size_t ended_count;
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

/* The `done` of consumer rank `rank` (< KVX_MAX_TP) for request_id, over connection `conn`
 * (sidechan_origin_key: never 0). Each rank counts once, and the request is released once
 * `consumers` distinct ranks reported. Issue 22 finding 5, the ranks are bound:
 * - a rank that cannot have read this prefill rank's share (hold_rank_possible) is OUTSIDE;
 * - a rank counts for the connection that first reported it: the same connection again is
 *   REPEATED, another one is TAKEN;
 * - a connection reports one rank of a hold (a decode agent is one rank and sends every done
 *   over its one kept socket): a second rank from it is SWITCHED.
 * A done whose token is not the hold's changes nothing. A done for a request not held says
 * whether the ring remembers its end (ENDED, EXPIRED) or not (UNKNOWN), and changes nothing.
 * Counts unknown (every one not held), forged, repeated and ranks refused. */
enum hold_done hold_table_done(struct hold_table *t, uint64_t request_id, uint32_t rank,
                               uint64_t conn, const kvx_token_t *token);

/* What hold_table_done would answer now, without counting or changing anything except
 * `forged` (a push checks before it writes; a wrong token is refused there and counted). */
enum hold_done hold_table_check(struct hold_table *t, uint64_t request_id, uint32_t rank,
                                uint64_t conn, const kvx_token_t *token);

/* Held, ended lately, or not known. O(1) when held; a scan of the ring otherwise. */
enum hold_state hold_table_state(const struct hold_table *t, uint64_t request_id);

void hold_table_free(struct hold_table *t);

#endif

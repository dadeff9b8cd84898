/* early.h: what came before its hold, on the prefill side: dones and pushes that carry a
 * token for a request not held yet (in an engine the hold follows the request's output by
 * an engine step, and a fast decode side can be quicker). Each waits, in arrival order and
 * bounded, until kvx_hold makes its request or its owner's deadline takes it out. A done
 * takes a share of the side-channel connection it came by: 4,096 dones of an insider's 8
 * connections filled the one bound there was, and an honest done before its hold was refused
 * (issue 36 finding 5); now a connection crowds out only itself. */
#ifndef KVX_SRC_EARLY_H
#define KVX_SRC_EARLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Entries of one connection waiting at once; more from it are refused. Enough for an engine's
 * dones that beat their holds by a step, and KVX_DEFAULT_MAX_PEERS connections at their share
 * fill half of EARLY_MAX. */
#define EARLY_PER_CONN 64
/* Entries waiting at once, a backstop: the default max_peers' shares (4,096) and every push
 * job (PUSH_MAX_JOBS, 256) fill little more than half; the rest holds what closed connections
 * left until their owner frees it (done_serve.c frees a closed connection's dones when this
 * is reached). */
#define EARLY_MAX 8192

/* Embedded in what waits (a parked done, a push job). `held` runs once its request is held,
 * after the entry left the list; it may answer and free its owner. */
struct early_entry {
    uint64_t request_id;
    uint64_t conn; /* the side-channel connection whose share it takes (sidechan_origin_key);
                      0: none, its owner bounds it (a push job: push_limits.h's shares) */
    void (*held)(struct early_entry *entry);
    struct early_entry *prev;
    struct early_entry *next;
    bool parked;
};

struct early_conn;

struct early_list {
    struct early_entry *head; /* the oldest */
    struct early_entry *tail;
    size_t count;
    uint64_t parked;          /* ever parked: kvx_agent_stats' dones_early */
    uint64_t swept;           /* `parked` when the owner last freed closed connections' */
    struct early_conn *conns; /* entries waiting per connection: EARLY_CONN_SLOTS, made at
                                 the first park of an entry with a connection */
};

/* Appends `entry` (request_id, conn and held set); false, and nothing changed, when EARLY_MAX
 * wait already, or EARLY_PER_CONN of its connection (or the counts could not be made). */
bool early_park(struct early_list *list, struct early_entry *entry);

/* Takes `entry` out (its deadline passed, or its owner goes); a no-op when not parked. */
void early_unpark(struct early_list *list, struct early_entry *entry);

/* request_id is held now: every entry of it leaves the list and has `held` run, oldest
 * first. Returns how many. Scans the list, which holds only what came early, bounded. */
size_t early_release(struct early_list *list, uint64_t request_id);

/* Entries of connection `conn` waiting now (0 for conn 0). O(1). */
size_t early_conn_count(const struct early_list *list, uint64_t conn);

/* Frees the per-connection counts; the list must be empty (the agent is going). */
void early_list_free(struct early_list *list);

#endif

/* early.h: what came before its hold, on the prefill side: dones and pushes that carry a
 * token for a request not held yet (in an engine the hold follows the request's output by
 * an engine step, and a fast decode side can be quicker). Each waits, in arrival order and
 * bounded, until kvx_hold makes its request or its owner's deadline takes it out. */
#ifndef KVX_SRC_EARLY_H
#define KVX_SRC_EARLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EARLY_MAX 4096 /* dones and pushes waiting at once; more are refused */

/* Embedded in what waits (a parked done, a push job). `held` runs once its request is held,
 * after the entry left the list; it may answer and free its owner. */
struct early_entry {
    uint64_t request_id;
    void (*held)(struct early_entry *entry);
    struct early_entry *prev;
    struct early_entry *next;
    bool parked;
};

struct early_list {
    struct early_entry *head; /* the oldest */
    struct early_entry *tail;
    size_t count;
    uint64_t parked; /* ever parked: kvx_agent_stats' dones_early */
};

/* Appends `entry` (request_id and held set); false, and nothing changed, when EARLY_MAX wait
 * already. */
bool early_park(struct early_list *list, struct early_entry *entry);

/* Takes `entry` out (its deadline passed, or its owner goes); a no-op when not parked. */
void early_unpark(struct early_list *list, struct early_entry *entry);

/* request_id is held now: every entry of it leaves the list and has `held` run, oldest
 * first. Returns how many. Scans the list, which holds only what came early, bounded. */
size_t early_release(struct early_list *list, uint64_t request_id);

#endif

/* agent_hold.h: the prefill side's held requests: a table keyed by request id, released when
 * every consumer's `done` arrived or when its lease expires, leases kept in a min-heap so an
 * expiry scan looks only at what expires. Times are milliseconds of a monotonic clock. */
#ifndef KVX_SRC_AGENT_HOLD_H
#define KVX_SRC_AGENT_HOLD_H

#include "kvx.h"

struct hold;

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
    kvx_release_cb_t callback;
    void *arg;
    void (*on_expired)(void *arg, uint64_t request_id); /* before the release; may be NULL */
    void *expired_arg;
};

kvx_status_t hold_table_add(struct hold_table *t, uint64_t request_id,
                            const kvx_group_ids_t *groups, size_t num_groups, uint32_t consumers,
                            uint64_t now_ms);

/* A consumer still wants request_id: its lease becomes max(old, now + 2/3 lease). Unknown
 * ids are ignored. */
void hold_table_extend(struct hold_table *t, uint64_t request_id, uint64_t now_ms);

/* Releases every hold whose lease expired by now_ms; returns how many. */
size_t hold_table_expire(struct hold_table *t, uint64_t now_ms);

/* One consumer's `done` for request_id: releases the request after its last consumer;
 * counts a done for a request not held as unknown. */
void hold_table_done(struct hold_table *t, uint64_t request_id);

void hold_table_free(struct hold_table *t);

#endif

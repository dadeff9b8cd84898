/* agent_hold.h: the prefill side's held requests: a table keyed by request id, released when
 * every consumer's `done` arrived. Used by agent.c's notification handler. */
#ifndef KVX_SRC_AGENT_HOLD_H
#define KVX_SRC_AGENT_HOLD_H

#include "kvx.h"

struct hold;

struct hold_table {
    struct hold *slots; /* open addressing by request id; a power of two */
    size_t size;
    size_t count; /* held now */
    uint64_t released;
    uint64_t unknown;
    kvx_release_cb_t callback;
    void *arg;
};

kvx_status_t hold_table_add(struct hold_table *t, uint64_t request_id,
                            const kvx_group_ids_t *groups, size_t num_groups, uint32_t consumers);

/* One consumer's `done` for request_id: releases the request after its last consumer;
 * counts a done for a request not held as unknown. */
void hold_table_done(struct hold_table *t, uint64_t request_id);

void hold_table_free(struct hold_table *t);

#endif

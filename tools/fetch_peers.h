/* fetch_peers.h: kvx fetch's prefill ranks, checked before its memory and then connected
 * (fetch_peers.c), and a failed transfer's blocks kept for its --json outcome. */
#ifndef KVX_TOOLS_FETCH_PEERS_H
#define KVX_TOOLS_FETCH_PEERS_H

#include "block_ids.h"
#include "kvx.h"

/* Checks the handshake of every address of `list` ("HOST:PORT,HOST:PORT") against `layout`'s
 * table with `params`' side channel, allocating no storage; a rank where nothing listens
 * fails at once, or with `wait_ms` > 0 is tried again until wait_ms passed. -1 to go on,
 * else the exit status (the error printed). */
int fetch_probe(const kvx_layout_t *layout, const kvx_agent_params_t *params, const char *list,
                uint64_t wait_ms);

/* Connects `agent` to every address of `list`, at most KVX_MAX_TP, into peers[] and
 * *num_peers_p; -1 to go on, else the exit status (the error printed). */
int fetch_connect(kvx_agent_t *agent, const char *list, kvx_peer_t **peers, size_t *num_peers_p);

/* Copies `groups` into *out (block_ids_free frees it); false, *out empty, without memory. */
bool fetch_blocks_copy(const kvx_group_ids_t *groups, size_t num_groups, struct block_ids *out);

#endif

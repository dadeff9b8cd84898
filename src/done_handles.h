/* done_handles.h: the prefill side's capabilities for dones on the data plane. A decode
 * agent's side-channel connection asks for one (VERB_DONE_HANDLE) and then sends its dones as
 * messages to the prefill's main worker, each carrying the handle; a done so sent counts as
 * one of that connection (hold.h binds each consumer rank to one connection). A handle is 128
 * bits: its slot's number and 96 random bits that only the side channel carried. A full table
 * hands out its oldest slot again: a done with a handle no longer there is sent back to the
 * side channel, so eviction costs a round trip, never a done. */
#ifndef KVX_SRC_DONE_HANDLES_H
#define KVX_SRC_DONE_HANDLES_H

#include "kvx.h"

#include <stdbool.h>
#include <stdint.h>

#define DONE_HANDLE_LEN  16
#define DONE_HANDLES_MAX 1024 /* slots: connections with a handle at once */

struct done_handles;

/* The handle of connection `conn` (sidechan_origin_key): its own again if it has one, else a
 * new one (the table made on first use). */
kvx_status_t done_handle_issue(struct done_handles **table, uint64_t conn,
                               uint8_t handle[DONE_HANDLE_LEN]);
/* The connection a handle was issued to; false for one never issued or evicted since. */
bool done_handle_conn(const struct done_handles *table, const uint8_t handle[DONE_HANDLE_LEN],
                      uint64_t *conn_p);
void done_handles_free(struct done_handles *table);

#endif

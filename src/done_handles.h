/* done_handles.h: the prefill side's capabilities for dones on the data plane. A decode
 * agent's side-channel connection asks for one (VERB_DONE_HANDLE) and then sends its dones as
 * messages to the prefill's main worker, each carrying the handle; a done so sent counts as
 * one of that connection (hold.h binds each consumer rank to one connection). A handle is 128
 * bits: its slot's number and 96 random bits that only the side channel carried. A slot is
 * free again once its connection closed (issue 36 finding 6: kept for ever, 1,024 connections
 * of churn took a live decode agent's), which the table learns when it needs a slot; only a
 * table full of open connections hands out its oldest slot again. A done with a handle no
 * longer there is sent back to the side channel, whose decode side then asks again, so
 * eviction costs a round trip, never a done. */
#ifndef KVX_SRC_DONE_HANDLES_H
#define KVX_SRC_DONE_HANDLES_H

#include "kvx.h"

#include <stdbool.h>
#include <stdint.h>

#define DONE_HANDLE_LEN  16
#define DONE_HANDLES_MAX 1024 /* slots: connections with a handle at once */

/* A side-channel connection as the kernel knows it: the descriptor a request came by
 * (sidechan_request.fd) and that socket's cookie then (gate_monitor_cookie). ZeroMQ tells its
 * user nothing when a connection closes; the descriptor does, and the cookie keeps a later
 * connection that reuses the descriptor from passing for it. */
struct done_conn_mark {
    int fd;          /* -1: not known, taken as open for ever */
    uint64_t cookie; /* 0: it had closed already when its request was read */
};

/* The mark of the connection a request came by on descriptor `fd` (-1: none known). */
struct done_conn_mark done_conn_mark(int fd);

/* Whether that connection has closed: its descriptor holds no socket, or another one now. */
bool done_conn_closed(const struct done_conn_mark *mark);

struct done_handles;

/* The handle of connection `conn` (sidechan_origin_key), whose mark is `mark`: its own again if
 * it has one, else a new one (the table made on first use) in a free slot. With none free, the
 * slots of connections closed since are freed first: a look at every slot, at most once per
 * DONE_HANDLES_MAX / 2 handles handed out, so at most two looks a handle (fewer than half the
 * slots are open connections: max_peers). Only when none had closed does a slot of an open
 * connection go, each in turn. */
kvx_status_t done_handle_issue(struct done_handles **table, uint64_t conn,
                               const struct done_conn_mark *mark, uint8_t handle[DONE_HANDLE_LEN]);
/* The connection a handle was issued to; false for one never issued, or freed since. */
bool done_handle_conn(const struct done_handles *table, const uint8_t handle[DONE_HANDLE_LEN],
                      uint64_t *conn_p);
void done_handles_free(struct done_handles *table);

#endif

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
#include "msg_mac.h"

#include <stdbool.h>
#include <stdint.h>

#define DONE_HANDLE_LEN  16
#define DONE_HANDLES_MAX 1024 /* slots: connections with a handle at once */
/* A done message's body: the handle, the tag of the done under the handle's key, then the
 * done (notify.h). */
#define DONE_MESSAGE_HEAD (DONE_HANDLE_LEN + MSG_MAC_LEN)

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

/* The handle of connection `conn` (sidechan_origin_key), whose mark is `mark`, and the key its
 * dones are tagged with (msg_mac.h; both go to the connection on the side channel, and only
 * the handle ever travels on the data plane): its own again if it has one, else new ones (the
 * table made on first use) in a free slot. With none free, the
 * slots of connections closed since are freed first: a look at every slot, at most once per
 * DONE_HANDLES_MAX / 2 handles handed out, so at most two looks a handle (fewer than half the
 * slots are open connections: max_peers). Only when none had closed does a slot of an open
 * connection go, each in turn. */
kvx_status_t done_handle_issue(struct done_handles **table, uint64_t conn,
                               const struct done_conn_mark *mark, uint8_t handle[DONE_HANDLE_LEN],
                               uint8_t key[MSG_MAC_KEY_LEN]);
enum done_handle_check {
    DONE_HANDLE_OK,      /* issued, and the tag is the done's under its key */
    DONE_HANDLE_UNKNOWN, /* never issued, or freed since: the sender should ask again */
    DONE_HANDLE_FORGED,  /* issued, and the tag is not the done's: changed or made by a third
                            party who saw the handle on the data plane */
};
/* Checks a done that came with `handle` and `tag` (the `size` bytes at `done`); where it is
 * DONE_HANDLE_OK, the connection the handle was issued to. */
enum done_handle_check done_handle_conn(const struct done_handles *table,
                                        const uint8_t handle[DONE_HANDLE_LEN],
                                        const uint8_t tag[MSG_MAC_LEN], const void *done,
                                        size_t size, uint64_t *conn_p);
void done_handles_free(struct done_handles *table);

#endif

/* conn.h: a connection to one peer agent as both pull peers and push writers use it: the
 * peer's checked metadata, the plan between the two tables, the transport connection with the
 * peer's remote keys and storage bases, and a digest of the peer's table. */
#ifndef KVX_SRC_CONN_H
#define KVX_SRC_CONN_H

#include "kvx.h"
#include "transport.h"

#define CONN_DIGEST_LEN 32 /* SHA-256 */

struct conn {
    kvx_metadata_t *metadata;
    kvx_peer_plan_t *plan; /* pull: our table to the peer's; push: the peer's to ours */
    struct transport_conn *transport;
    uint64_t *remote_bases; /* by the peer's storage index */
    uint32_t tp_rank;       /* the peer's */
    uint32_t tp_size;
    uint8_t table_digest[CONN_DIGEST_LEN]; /* equal digests: the same table, the same pairs */
    char transports[256];                  /* what UCX chose, once described */
    enum { CONN_HOST_UNKNOWN, CONN_HOST_THIS, CONN_HOST_OTHER } one_host; /* conn_one_host */
    void *push_metadata; /* ours as registered with this peer (conn_push_metadata), or NULL */
    size_t push_metadata_size;
};

/* Decodes and checks a peer's metadata for `mode` and connects to it. Pull (we read, the
 * peer is a prefill rank): the table is validated against ours with our TP, and the plan
 * goes from our table to the peer's. Push (we write into the peer, a decode rank): the plan
 * goes from the peer's table to ours, with the peer's TP as the local one. `host` is where the
 * peer's side channel was reached (its links listen there), or NULL (a push writer's). */
kvx_status_t conn_open(struct transport *t, const char *host, const kvx_regions_t *local,
                       uint32_t local_tp,
                       uint32_t local_rank, kvx_transfer_mode_t mode, const void *metadata,
                       size_t size, struct conn **conn_p);

/* Closes the transport connection (bounded: transport_conn_destroy) and frees the rest.
 * NULL-safe. */
void conn_close(struct conn *conn);

/* Our push metadata for this peer: `own` (the agent's) naming this connection's worker, so
 * that the peer's writer connects there and closing the connection ends its writes
 * (transport_conn_address). Made once per connection; owned by it. */
kvx_status_t conn_push_metadata(struct conn *conn, const void *own, size_t own_size,
                                const void **buf_p, size_t *size_p);

/* The transports UCX really chose, described once the endpoint was wired up. */
const char *conn_transports(struct conn *conn);

/* Whether the peer is a process of this host: one of the connection's lanes is shared memory
 * or cross-memory attach, or some of its storages are mapped here. UCX sets an endpoint's
 * lanes when it is made (wire-up connects TCP's later), so this is decided once, then. */
bool conn_one_host(struct conn *conn);

#endif

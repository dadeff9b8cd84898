/* wire.h: decoded peer metadata as wire_decode.c builds it and wire_validate.c checks it.
 * Every field here has passed the KVX_MAX_* limits; nothing points into the peer's bytes. */
#ifndef KVX_SRC_WIRE_H
#define KVX_SRC_WIRE_H

#include "regions.h"

struct registration_copy {
    uint64_t base; /* address in the peer's process */
    uint64_t size; /* bytes */
    kvx_mem_type_t mem;
    int64_t device;
    uint8_t *remote_key;
    size_t remote_key_size;
};

struct kvx_metadata {
    char *engine_id;
    char *agent_name;
    uint32_t tp_rank;
    uint32_t tp_size;
    uint64_t block_size; /* tokens */
    kvx_transfer_mode_t mode;
    struct registration_copy *registrations; /* by storage index */
    size_t num_registrations;
    uint8_t *transport_address;
    size_t transport_address_size;
    uint64_t tcp_tx_seg_size; /* bytes of the peer's UCX TCP segments; both 0: it has no tcp */
    uint64_t tcp_rx_seg_size; /* (docs/wire.md "TCP segments") */
    bool tcp_segments_stated; /* false: an older kvx that sent none; UCX's defaults assumed */
    uint32_t done_version;    /* the newest done it reads (notify.h); 2 for an older kvx */
    bool push_messages;       /* takes push requests as data-plane messages; false: older kvx */
    bool done_messages;       /* takes dones as data-plane messages (done_handles.h); false:
                                 an older kvx */
    kvx_regions_t *regions;   /* the peer's table; storage names are the registrations' */
    char **differences;       /* of the last kvx_metadata_validate, at most KVX_MAX_DIFFERENCES */
    size_t num_differences;   /* found, possibly more than kept */
    size_t max_differences;   /* allocated entries of differences */
};

/* The done version this kvx reads and states (notify.h's NOTIFY_VERSION_READ; wire stays
 * pure and apart from notify, so the number is repeated here and checked where both meet). */
#define WIRE_DONE_VERSION 3

/* The compatibility factors of a table and mode, and their hash (docs/wire.md). The
 * factors' strings point into the table. Declared with the generated type's tag so this
 * header does not need the generated header. */
struct Kvx__CompatFactors;
void wire_factors_fill(const kvx_regions_t *regions, kvx_transfer_mode_t mode,
                       struct Kvx__CompatFactors *factors);
kvx_status_t wire_factors_hash(const struct Kvx__CompatFactors *factors,
                               uint8_t hash[KVX_COMPAT_HASH_LEN]);

/* Our own packed metadata (kvx_metadata_pack's bytes) with another transport address, into
 * a malloc'd *buf_p: the push metadata registered with one peer names the worker of our
 * connection to it (transport_conn_address). */
kvx_status_t wire_metadata_readdress(const void *buf, size_t size, const void *address,
                                     size_t address_size, void **buf_p, size_t *size_p);

/* UCX's own TCP segment sizes, bytes (uct/tcp/tcp_iface.c, the same from 1.13 to 1.22): what
 * a process uses that sets neither, and what a peer that states none is taken to use. */
#define WIRE_UCX_TCP_TX_DEFAULT (8u << 10)
#define WIRE_UCX_TCP_RX_DEFAULT (64u << 10)

/* Checks a pair of TCP segment sizes as the wire carries them: both 0 (no tcp), or each in
 * 1..KVX_MAX_TCP_SEGMENT; `what` starts the message. */
kvx_status_t wire_tcp_segments_check(uint64_t tx, uint64_t rx, const char *what);

/* Refuses, with both sizes and the UCX_TCP_* variables named, a peer whose TCP segments cannot
 * interoperate with ours (`tx`, `rx`; both 0: we have no tcp): one whose sends are larger
 * than what we receive, or whose receives are smaller than what we send, since UCX aborts a
 * receiver on a segment larger than its rx (issue 22 finding 8). */
kvx_status_t wire_tcp_segments_agree(const kvx_metadata_t *md, uint64_t tx, uint64_t rx);

#endif

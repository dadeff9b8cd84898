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
    kvx_regions_t *regions; /* the peer's table; storage names are the registrations' */
    char **differences;     /* of the last kvx_metadata_validate, at most KVX_MAX_DIFFERENCES */
    size_t num_differences; /* found, possibly more than kept */
    size_t max_differences; /* allocated entries of differences */
};

/* The compatibility factors of a table and mode, and their hash (docs/wire.md). The
 * factors' strings point into the table. Declared with the generated type's tag so this
 * header does not need the generated header. */
struct Kvx__CompatFactors;
void wire_factors_fill(const kvx_regions_t *regions, kvx_transfer_mode_t mode,
                       struct Kvx__CompatFactors *factors);
kvx_status_t wire_factors_hash(const struct Kvx__CompatFactors *factors,
                               uint8_t hash[KVX_COMPAT_HASH_LEN]);

#endif

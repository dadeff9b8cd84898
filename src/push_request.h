/* push_request.h: the push request the decode side sends to a prefill rank: its encoding and
 * its checked decoding. Pure. */
#ifndef KVX_SRC_PUSH_REQUEST_H
#define KVX_SRC_PUSH_REQUEST_H

#include "kvx.h"
#define PUSH_MAX_GROUPS 1024
#define PUSH_MAX_IDS    (1u << 20) /* block ids in one request: 64 Mi tokens of 64-token blocks */
/* Bytes of a push request: the metadata and up to PUSH_MAX_IDS ids of 10 bytes or fewer. */
#define PUSH_MAX_REQUEST_SIZE (KVX_MAX_METADATA_SIZE + 11u * PUSH_MAX_IDS + 65536u)

/* A decoded push request: the decode side's metadata and block ids, all owned. groups holds
 * num_groups local groups, then, when has_remote, num_groups remote ones. */
struct push_request {
    uint64_t request_id;
    void *metadata;
    size_t metadata_size;
    kvx_group_ids_t *groups;
    size_t num_groups;
    bool has_remote;
};

kvx_status_t push_request_encode(uint64_t request_id, const void *metadata, size_t metadata_size,
                                 const kvx_request_t *request, void **buf_p, size_t *size_p);

/* Decodes untrusted bytes; on success the caller frees with push_request_free. */
kvx_status_t push_request_decode(const void *buf, size_t size, struct push_request *req);
void push_request_free(struct push_request *req);

#endif

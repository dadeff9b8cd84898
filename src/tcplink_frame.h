/* tcplink_frame.h: the frames of kvx's TCP data plane (tcplink.h), as they travel: a fixed header
 * of TCPLINK_HEADER_SIZE bytes, little-endian, then `length` bytes of body. Pure: no socket, no
 * memory but the caller's. Every header a peer sends is checked here before its body is read.
 *
 *   READ     reader -> owner   count ranges (storage, offset, length) and an attachment
 *   DATA     owner -> reader   the ranges' bytes one after the other, or nothing (refused)
 *   WRITE    writer -> owner   the write token, storage and offset; the bytes
 *   WRITTEN  owner -> writer   the bytes are in memory (or refused)
 *   MSG, AM  either way        kvx's small messages, by handler id
 *
 * A reader's answers come in the order of its requests (one TCP stream, served in order), so a
 * cookie only confirms that an answer is the one expected. */
#ifndef KVX_SRC_TCPLINK_FRAME_H
#define KVX_SRC_TCPLINK_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TCPLINK_HEADER_SIZE 64
#define TCPLINK_TOKEN_SIZE  16

enum tcplink_kind {
    TCPLINK_READ = 1,
    TCPLINK_DATA,
    TCPLINK_WRITE,
    TCPLINK_WRITTEN,
    TCPLINK_MSG,
    TCPLINK_AM
};
enum tcplink_answer { TCPLINK_OK = 0, TCPLINK_REFUSED = 1 };

/* Ranges one READ asks for at most, and the attachment's bytes at most (TRANSPORT_ATTACH_MAX). */
#define TCPLINK_READ_RANGES 4096
#define TCPLINK_ATTACH_MAX  128
#define TCPLINK_RANGE_SIZE  24 /* storage u32, zero u32, offset u64, length u64 */
/* One WRITE's bytes at most (the writer sends pieces of 1 MiB), a message's (TRANSPORT_MSG_MAX),
 * and handler ids (TRANSPORT_AM_IDS). */
#define TCPLINK_WRITE_MAX ((uint64_t)16 << 20)
#define TCPLINK_MSG_MAX   73728
#define TCPLINK_IDS       16

struct tcplink_header {
    uint8_t kind;
    uint8_t status; /* DATA, WRITTEN: enum tcplink_answer */
    uint8_t id;     /* MSG, AM */
    uint8_t flags;  /* zero */
    uint32_t count; /* READ: ranges */
    uint64_t cookie;
    uint64_t length;                   /* of the body */
    uint32_t storage;                  /* WRITE */
    uint32_t attach;                   /* READ: bytes of attachment at the end of the body */
    uint64_t offset;                   /* WRITE */
    uint8_t token[TCPLINK_TOKEN_SIZE]; /* WRITE */
};

struct tcplink_range {
    uint32_t storage;
    uint64_t offset;
    uint64_t length;
};

void tcplink_header_encode(const struct tcplink_header *h, uint8_t out[TCPLINK_HEADER_SIZE]);
/* Decodes and checks a header: false for an unknown kind, a field its kind does not use set,
 * or a body longer than its kind allows (a DATA body is checked by the reader, who knows what
 * it asked for). */
bool tcplink_header_decode(const uint8_t in[TCPLINK_HEADER_SIZE], struct tcplink_header *h);

/* A READ's body: range `i` of it (i < h->count; the body was checked by its header's length). */
void tcplink_range_encode(const struct tcplink_range *r, uint8_t out[TCPLINK_RANGE_SIZE]);
/* False when its reserved field is not zero. */
bool tcplink_range_decode(const uint8_t *body, uint32_t i, struct tcplink_range *r);

#endif

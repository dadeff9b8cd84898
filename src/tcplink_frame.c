/* tcplink_frame.c: encoding and checking the frames of kvx's TCP data plane (tcplink_frame.h). */
#include "tcplink_frame.h"

#include <string.h>

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;

    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void tcplink_header_encode(const struct tcplink_header *h, uint8_t out[TCPLINK_HEADER_SIZE])
{
    memset(out, 0, TCPLINK_HEADER_SIZE);
    out[0] = h->kind;
    out[1] = h->status;
    out[2] = h->id;
    out[3] = h->flags;
    put32(out + 4, h->count);
    put64(out + 8, h->cookie);
    put64(out + 16, h->length);
    put32(out + 24, h->storage);
    put32(out + 28, h->attach);
    put64(out + 32, h->offset);
    memcpy(out + 40, h->token, TCPLINK_TOKEN_SIZE);
}

static bool zero(const uint8_t *p, size_t n)
{
    uint8_t any = 0;

    for (size_t i = 0; i < n; i++)
        any |= p[i];
    return any == 0;
}

bool tcplink_header_decode(const uint8_t in[TCPLINK_HEADER_SIZE], struct tcplink_header *h)
{
    *h = (struct tcplink_header){
        .kind    = in[0],
        .status  = in[1],
        .id      = in[2],
        .flags   = in[3],
        .count   = get32(in + 4),
        .cookie  = get64(in + 8),
        .length  = get64(in + 16),
        .storage = get32(in + 24),
        .attach  = get32(in + 28),
        .offset  = get64(in + 32),
    };
    memcpy(h->token, in + 40, TCPLINK_TOKEN_SIZE);
    if (h->flags != 0 || !zero(in + 56, TCPLINK_HEADER_SIZE - 56))
        return false;
    /* What each kind does not use is zero, so that nothing rides along unchecked. */
    bool no_write  = h->storage == 0 && h->offset == 0 && zero(h->token, TCPLINK_TOKEN_SIZE);
    bool no_read   = h->count == 0 && h->attach == 0;
    bool no_answer = h->status == TCPLINK_OK;

    switch (h->kind) {
    case TCPLINK_READ:
        return h->id == 0 && no_write && no_answer && h->count >= 1 &&
               h->count <= TCPLINK_READ_RANGES && h->attach <= TCPLINK_ATTACH_MAX &&
               h->length == (uint64_t)h->count * TCPLINK_RANGE_SIZE + h->attach;
    case TCPLINK_DATA:
        return h->id == 0 && no_write && no_read && h->status <= TCPLINK_REFUSED &&
               (h->status == TCPLINK_OK || h->length == 0);
    case TCPLINK_WRITE:
        return h->id == 0 && no_read && no_answer && h->length >= 1 &&
               h->length <= TCPLINK_WRITE_MAX;
    case TCPLINK_WRITTEN:
        return h->id == 0 && no_write && no_read && h->status <= TCPLINK_REFUSED && h->length == 0;
    case TCPLINK_MSG:
    case TCPLINK_AM:
        return h->id < TCPLINK_IDS && no_write && no_read && no_answer && h->cookie == 0 &&
               h->length <= TCPLINK_MSG_MAX;
    default:
        return false;
    }
}

void tcplink_range_encode(const struct tcplink_range *r, uint8_t out[TCPLINK_RANGE_SIZE])
{
    put32(out, r->storage);
    put32(out + 4, 0);
    put64(out + 8, r->offset);
    put64(out + 16, r->length);
}

bool tcplink_range_decode(const uint8_t *body, uint32_t i, struct tcplink_range *r)
{
    const uint8_t *p = body + (size_t)i * TCPLINK_RANGE_SIZE;

    *r = (struct tcplink_range){get32(p), get64(p + 8), get64(p + 16)};
    return get32(p + 4) == 0;
}

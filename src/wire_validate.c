/* wire_validate.c: a peer's region table checked against ours, the way a pull plan will use
 * it: every difference by region, field, both values and the rule; and its TCP segment sizes
 * against ours. Reads decoded metadata only; the length rules are the planner's own
 * (plan_lengths_agree). */
#include "wire.h"

#include "error.h"
#include "plan.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void difference_add(kvx_metadata_t *md, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Records one difference; past KVX_MAX_DIFFERENCES only the count grows. */
static void difference_add(kvx_metadata_t *md, const char *fmt, ...)
{
    char line[768];
    va_list ap;

    md->num_differences++;
    if (md->num_differences > KVX_MAX_DIFFERENCES)
        return;
    if (md->num_differences > md->max_differences) {
        size_t max   = md->max_differences == 0 ? 16 : md->max_differences * 2;
        char **lines = realloc(md->differences, max * sizeof(*lines));

        if (lines == NULL)
            return; /* counted, not kept: the first line is what callers report */
        memset(lines + md->max_differences, 0, (max - md->max_differences) * sizeof(*lines));
        md->differences     = lines;
        md->max_differences = max;
    }
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    free(md->differences[md->num_differences - 1]);
    md->differences[md->num_differences - 1] = strdup(line);
}

static void differences_clear(kvx_metadata_t *md)
{
    for (size_t i = 0; i < md->max_differences; i++) {
        free(md->differences[i]);
        md->differences[i] = NULL;
    }
    md->num_differences = 0;
}

/* The kind flags of a region, for messages. */
static const char *region_kind(const struct region *r, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s%s%s%s", r->mla ? "mla " : "", r->ple ? "ple " : "",
             r->scratch ? "scratch " : "", r->ssm ? "ssm " : "",
             r->head_split ? "head-split " : "");
    if (buf[0] == '\0')
        snprintf(buf, size, "none ");
    buf[strlen(buf) - 1] = '\0';
    return buf;
}

static void region_compare(kvx_metadata_t *md, const kvx_regions_t *local, size_t i,
                           uint32_t local_tp, uint32_t remote_tp, uint64_t bsr)
{
    const kvx_regions_t *remote = md->regions;
    const struct region *l      = &local->regions[i];
    const struct region *r      = &remote->regions[i];
    const char *name            = regions_region_name(local, l);
    char a[64];
    char b[64];
    char rule[256];

    if (strcmp(name, regions_region_name(remote, r)) != 0)
        difference_add(md,
                       "region %zu: name: local \"%s\", remote \"%s\": both sides register"
                       " the same names in the same order",
                       i, name, regions_region_name(remote, r));
    if (l->group != r->group)
        difference_add(md,
                       "region %zu (%s): group: local %" PRId64 ", remote %" PRId64
                       ": a region takes the same group's block ids on both sides",
                       i, name, l->group, r->group);
    region_kind(l, a, sizeof(a));
    region_kind(r, b, sizeof(b));
    if (strcmp(a, b) != 0)
        difference_add(md,
                       "region %zu (%s): kind: local %s, remote %s: the same kind of region"
                       " on both sides",
                       i, name, a, b);
    if (r->stride < r->block_len)
        difference_add(md,
                       "region %zu (%s): stride: remote %" PRIu64 " is smaller than its"
                       " block_len %" PRIu64 ": stride >= block_len",
                       i, name, r->stride, r->block_len);
    if (bsr == 0)
        return; /* TP or block sizes already reported: lengths cannot be judged */
    if (l->block_len % bsr != 0)
        difference_add(md,
                       "region %zu (%s): block_len: local %" PRIu64 " does not split into"
                       " bsr %" PRIu64 " equal sub-blocks",
                       i, name, l->block_len, bsr);
    else if (!plan_lengths_agree(l, l->block_len / bsr, r->block_len, local_tp, remote_tp, rule,
                                 sizeof(rule)))
        difference_add(md, "region %zu (%s): block_len: local %" PRIu64 ", remote %" PRIu64 ": %s",
                       i, name, l->block_len, r->block_len, rule);
}

kvx_status_t kvx_metadata_validate(kvx_metadata_t *md, const kvx_regions_t *local,
                                   const kvx_peer_plan_params_t *params, size_t *num_differences_p)
{
    uint64_t mask       = params != NULL ? params->field_mask : 0;
    uint32_t local_tp   = (mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_TP) ? params->local_tp : 1;
    uint32_t local_rank = (mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_RANK) ? params->local_rank : 0;
    uint32_t remote_tp =
        (mask & KVX_PEER_PLAN_PARAM_FIELD_REMOTE_TP) ? params->remote_tp : md->tp_size;
    uint64_t local_bs  = (mask & KVX_PEER_PLAN_PARAM_FIELD_LOCAL_BLOCK_SIZE)
                             ? params->local_block_size
                             : local->block_size;
    uint64_t remote_bs = (mask & KVX_PEER_PLAN_PARAM_FIELD_REMOTE_BLOCK_SIZE)
                             ? params->remote_block_size
                             : md->block_size;
    size_t shared;
    uint64_t bsr = 0; /* 0 while TP or block sizes rule the lengths out */

    if (local_tp < 1 || local_tp > KVX_MAX_TP || local_rank >= local_tp || remote_tp < 1 ||
        remote_tp > KVX_MAX_TP || local_bs < 1 || remote_bs < 1)
        return error_set(KVX_ERR_INVALID,
                         "validate: local_tp %" PRIu32 ", local_rank %" PRIu32
                         ", remote_tp %" PRIu32 " and block sizes %" PRIu64 "/%" PRIu64
                         " are not a valid setting",
                         local_tp, local_rank, remote_tp, local_bs, remote_bs);
    differences_clear(md);
    if (local_tp % remote_tp != 0 && remote_tp % local_tp != 0)
        difference_add(md,
                       "tp: local %" PRIu32 ", remote %" PRIu32 ": one TP size must divide"
                       " the other",
                       local_tp, remote_tp);
    else if (remote_bs > local_bs || local_bs % remote_bs != 0)
        difference_add(md,
                       "block_size: local %" PRIu64 ", remote %" PRIu64 ": the local block"
                       " must hold a whole number of remote blocks",
                       local_bs, remote_bs);
    else
        bsr = local_bs / remote_bs;
    if (local->num_regions != md->regions->num_regions)
        difference_add(md,
                       "regions: local %zu, remote %zu: both sides register the same"
                       " regions",
                       local->num_regions, md->regions->num_regions);
    shared = local->num_regions < md->regions->num_regions ? local->num_regions
                                                           : md->regions->num_regions;
    for (size_t i = 0; i < shared; i++)
        region_compare(md, local, i, local_tp, remote_tp, bsr);

    if (num_differences_p != NULL)
        *num_differences_p = md->num_differences;
    if (md->num_differences == 0)
        return KVX_OK;
    return error_set(KVX_ERR_INVALID, "%s%s",
                     md->differences[0] != NULL ? md->differences[0] : "tables differ",
                     md->num_differences > 1 ? " (and more differences)" : "");
}

const char *kvx_metadata_difference(const kvx_metadata_t *md, size_t index)
{
    size_t kept =
        md->num_differences < KVX_MAX_DIFFERENCES ? md->num_differences : KVX_MAX_DIFFERENCES;

    return index < kept ? md->differences[index] : NULL;
}

kvx_status_t wire_tcp_segments_check(uint64_t tx, uint64_t rx, const char *what)
{
    if (tx == 0 && rx == 0)
        return KVX_OK;
    if (tx < 1 || tx > KVX_MAX_TCP_SEGMENT || rx < 1 || rx > KVX_MAX_TCP_SEGMENT)
        return error_set(KVX_ERR_INVALID,
                         "%s: tx %" PRIu64 ", rx %" PRIu64 ": each must be 1..%u bytes, or both"
                         " 0 (no tcp)",
                         what, tx, rx, KVX_MAX_TCP_SEGMENT);
    return KVX_OK;
}

/* UCX's TCP receiver holds one segment of rx bytes and asserts that a message fits it
 * (tcp_ep.c, "hdr->length <= rx_seg_size"); a sender fills segments up to its tx. So what one
 * side sends must fit what the other receives, both ways: pulls carry data one way and
 * requests the other, pushes the reverse. Measured on UCX 1.13: a sender's rx does not
 * matter, only its tx (docs/performance.md "UCX's TCP segments"). */
kvx_status_t wire_tcp_segments_agree(const kvx_metadata_t *md, uint64_t tx, uint64_t rx)
{
    const char *assumed =
        md->tcp_segments_stated ? "" : ", UCX's default: the peer is a kvx that states no sizes";

    if ((tx == 0 && rx == 0) || (md->tcp_tx_seg_size == 0 && md->tcp_rx_seg_size == 0))
        return KVX_OK; /* one side has no tcp: UCX connects them over none */
    if (md->tcp_tx_seg_size > rx)
        return error_set(KVX_ERR_INVALID,
                         "tcp segments: the peer sends up to %" PRIu64 " bytes a segment (its"
                         " UCX_TCP_TX_SEG_SIZE%s) and this side receives at most %" PRIu64
                         " (UCX_TCP_RX_SEG_SIZE): UCX would abort the receiver; set"
                         " UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE alike on both sides, or"
                         " on neither",
                         md->tcp_tx_seg_size, assumed, rx);
    if (tx > md->tcp_rx_seg_size)
        return error_set(KVX_ERR_INVALID,
                         "tcp segments: this side sends up to %" PRIu64 " bytes a segment"
                         " (UCX_TCP_TX_SEG_SIZE) and the peer receives at most %" PRIu64 " (its"
                         " UCX_TCP_RX_SEG_SIZE%s): UCX would abort the receiver; set"
                         " UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE alike on both sides, or"
                         " on neither",
                         tx, md->tcp_rx_seg_size, assumed);
    return KVX_OK;
}

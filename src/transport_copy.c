/* transport_copy.c: reads from a peer storage mapped into this process (transport_conn.mapped)
 * beyond what a post copies itself: queued on their op and copied by the loop a budget at a
 * time (transport_copies_run), so that no post makes a large copy (issue 23). No UCX calls. */
#include "transport_private.h"

#include "error.h"
#include "invariant.h"

#include <stdlib.h>
#include <string.h>

/* Takes `op` off the transport's list of ops with copies left. */
static void copying_unlink(struct transport_op *op)
{
    struct transport *t         = op->conn->t;
    struct transport_op **link  = &t->copying;
    struct transport_op *before = NULL;

    while (*link != op) {
        before = *link;
        link   = &(*link)->copy_next;
    }
    *link = op->copy_next;
    if (t->copying_tail == op)
        t->copying_tail = before;
    op->copying   = false;
    op->copy_next = NULL;
}

void copy_queue_drop(struct transport_op *op)
{
    if (!op->copying)
        return;
    copying_unlink(op);
    op->num_copies = op->next_copy = op->copy_done = 0;
    op->completed++;
    if (!op->conn->parked)
        op->conn->t->pending--;
    if (op->first_error == 0)
        op->first_error = UCS_ERR_CANCELED;
}

kvx_status_t copy_queue_add(struct transport_op *op, void *dst, const void *src, size_t len)
{
    struct transport *t = op->conn->t;

    KVX_ASSERT(!op->armed && !op->released); /* copies come with the op's posts */
    if (op->num_copies == op->max_copies) {
        size_t max            = op->max_copies == 0 ? 16 : 2 * op->max_copies;
        struct op_copy *grown = realloc(op->copies, max * sizeof(*grown));

        if (grown == NULL)
            return error_no_memory("a transfer's copies");
        op->copies     = grown;
        op->max_copies = max;
    }
    op->copies[op->num_copies++] = (struct op_copy){dst, src, len};
    if (op->copying)
        return KVX_OK;
    op->copying = true;
    transport_op_posted_one(op);
    if (t->copying_tail != NULL)
        t->copying_tail->copy_next = op;
    else
        t->copying = op;
    t->copying_tail = op;
    return KVX_OK;
}

size_t transport_copies_run(struct transport *t, size_t budget)
{
    size_t worked = 0;

    while (t->copying != NULL && budget > 0) {
        struct transport_op *op = t->copying;
        struct op_copy *c       = &op->copies[op->next_copy];
        size_t n                = c->len - op->copy_done < budget ? c->len - op->copy_done : budget;

        memcpy((char *)c->dst + op->copy_done, (const char *)c->src + op->copy_done, n);
        budget -= n;
        op->copy_done += n;
        worked++;
        if (op->copy_done < c->len)
            continue;
        op->copy_done = 0;
        if (++op->next_copy < op->num_copies)
            continue;
        copying_unlink(op);
        op->num_copies = op->next_copy = 0;
        t->progressing++; /* its owner hears of it as of any completion: it only records */
        transport_op_complete(op, UCS_OK);
        t->progressing--;
    }
    return worked;
}

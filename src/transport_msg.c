/* transport_msg.c: kvx's own small messages beside the data (a push request and its answer):
 * sent on a connection's endpoint, or from inside a handler back to the message's sender, and
 * handled on the main worker and every connection's worker. Eager only and copied, so a
 * sender never waits; what a message means is its handler's business, never this file's. */
#include "error.h"
#include "transport_private.h"

#include <stdlib.h>
#include <string.h>

/* A message UCX has not sent yet: linked where a destroyed worker frees it. */
struct msg_out {
    struct am_record record; /* first: the list's pointer is the message's */
    size_t size;
    uint8_t bytes[];
};

static void msg_sent(void *request, ucs_status_t status, void *user_data)
{
    struct msg_out *m = user_data;

    (void)status; /* a peer gone: the message is lost, as it would be on the wire */
    ucp_request_free(request);
    am_record_unlink(&m->record);
    free(m);
}

/* Sends a copy of `data` on `ep`; while UCX holds it, it is on `list`. `reply` lets the
 * receiver answer (UCX then gives it our endpoint). */
static kvx_status_t msg_send(ucp_ep_h ep, struct am_record **list, unsigned id, const void *data,
                             size_t size, bool reply)
{
    struct msg_out *m = size <= TRANSPORT_MSG_MAX ? malloc(sizeof(*m) + size) : NULL;
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send   = msg_sent,
        .flags     = UCP_AM_SEND_FLAG_EAGER | (reply ? UCP_AM_SEND_FLAG_REPLY : 0),
    };
    ucs_status_ptr_t sp;

    if (m == NULL)
        return size > TRANSPORT_MSG_MAX
                   ? error_set(KVX_ERR_INTERNAL, "transport: a message of %zu bytes", size)
                   : error_no_memory("a message");
    m->size = size;
    memcpy(m->bytes, data, size);
    param.user_data = m;
    sp              = ucp_am_send_nbx(ep, id, NULL, 0, m->bytes, size, &param);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        free(m);
        return sp == NULL ? KVX_OK : transport_ucs_error("sending a message", UCS_PTR_STATUS(sp));
    }
    am_record_link(&m->record, list);
    return KVX_OK;
}

kvx_status_t transport_msg_send(struct transport_conn *conn, unsigned id, const void *data,
                                size_t size)
{
    if (conn->linked)
        return link_msg_send(conn->link, id, data, size);
    return msg_send(conn->ep, &conn->requests, id, data, size, true);
}

bool transport_msg_reply(const struct transport_msg_from *from, unsigned id, const void *data,
                         size_t size)
{
    if (from->link != NULL)
        return link_msg_send(from->link, id, data, size) == KVX_OK;
    return from->ep != NULL &&
           msg_send(from->ep, &from->t->replies, id, data, size, false) == KVX_OK;
}

static ucs_status_t msg_received(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    struct msg_slot *slot          = arg;
    struct transport_msg_from from = {slot->t, NULL, NULL};

    (void)header;
    (void)header_length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
        from.ep = param->reply_ep;
    /* Sent eager, so the data is here; a rendezvous message is not one of ours: dropped. */
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && slot->handler != NULL)
        slot->handler(slot->arg, data, length, &from);
    return UCS_OK;
}

kvx_status_t transport_msg_set_handler(struct transport *t, unsigned id, bool conns,
                                       transport_msg_handler_t handler, void *arg)
{
    if (id >= TRANSPORT_AM_IDS)
        return error_set(KVX_ERR_INVALID, "transport: message id %u is not below %d", id,
                         TRANSPORT_AM_IDS);
    t->msg[id] = (struct msg_slot){t, handler, arg, conns};
    return transport_worker_set_handler(t->worker, id, msg_received, &t->msg[id]);
}

kvx_status_t msg_conn_set(struct transport_conn *conn)
{
    kvx_status_t status = KVX_OK;

    for (unsigned id = 0; id < TRANSPORT_AM_IDS && status == KVX_OK; id++) {
        if (conn->t->msg[id].handler != NULL && conn->t->msg[id].conns)
            status = transport_worker_set_handler(conn->worker, id, msg_received,
                                                  &conn->t->msg[id]);
    }
    return status;
}

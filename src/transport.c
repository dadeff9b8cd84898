/* transport.c: UCX under kvx: context and worker, whole-storage memory maps, remote keys,
 * endpoints, batches of gets or puts with completion counting, and active messages. Knows
 * nothing of requests, leases or layouts. */
#include "transport.h"

#include "clock.h"
#include "error.h"

#include <ucp/api/ucp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Active-message ids a transport accepts handlers for; kvx uses a handful. */
#define TRANSPORT_AM_IDS 16

struct am_slot {
    transport_am_handler_t handler;
    void *arg;
};

struct transport {
    ucp_context_h context;
    ucp_worker_h worker;
    struct am_slot am[TRANSPORT_AM_IDS];
    void **orphans; /* memory a late completion may still write: freed after the worker */
    size_t num_orphans;
    size_t max_orphans;
};

struct transport_mem {
    ucp_mem_h memh;
    void *address;
    size_t size; /* bytes */
};

/* Completion counting lives in the endpoint, not on a caller's stack, because a request
 * that outlives a timed-out batch still calls back; an endpoint that timed out is failed
 * for good and its requests are cancelled when it is destroyed. */
struct transport_ep {
    struct transport *t;
    ucp_ep_h ep;
    struct transport_op op; /* the blocking batch of transport_rma */
    bool failed;            /* a batch timed out or failed: no further operations */
};

struct transport_rkey {
    ucp_rkey_h rkey;
};

static kvx_status_t ucs_error(const char *what, ucs_status_t status)
{
    return error_set(KVX_ERR_IO, "transport: %s: %s", what, ucs_status_string(status));
}

kvx_status_t transport_create(const char *tls, struct transport **transport_p)
{
    ucp_params_t params         = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                                   .features   = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
    ucp_worker_params_t wparams = {.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                   .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct transport *t         = calloc(1, sizeof(*t));
    ucp_config_t *config;
    ucs_status_t st;

    if (t == NULL)
        return error_no_memory("a transport");
    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        free(t);
        return ucs_error("reading the UCX configuration", st);
    }
    /* The transport list is explicit: never whatever UCX would pick on its own. */
    st = ucp_config_modify(config, "TLS", tls != NULL ? tls : TRANSPORT_DEFAULT_TLS);
    if (st == UCS_OK)
        st = ucp_init(&params, config, &t->context);
    ucp_config_release(config);
    if (st != UCS_OK) {
        free(t);
        return ucs_error("creating the context", st);
    }
    st = ucp_worker_create(t->context, &wparams, &t->worker);
    if (st != UCS_OK) {
        ucp_cleanup(t->context);
        free(t);
        return ucs_error("creating the worker", st);
    }
    *transport_p = t;
    return KVX_OK;
}

void transport_destroy(struct transport *t)
{
    if (t == NULL)
        return;
    ucp_worker_destroy(t->worker); /* after this, no completion callback can run */
    for (size_t i = 0; i < t->num_orphans; i++)
        free(t->orphans[i]);
    free(t->orphans);
    ucp_cleanup(t->context);
    free(t);
}

/* Frees `memory` now, or, when operations that complete into it are still pending (a peer
 * that stopped answering), keeps it until the worker is destroyed. */
static void transport_free_later(struct transport *t, void *memory, bool pending)
{
    if (!pending) {
        free(memory);
        return;
    }
    if (t->num_orphans == t->max_orphans) {
        size_t max   = t->max_orphans == 0 ? 8 : t->max_orphans * 2;
        void **grown = realloc(t->orphans, max * sizeof(*grown));

        if (grown == NULL)
            return; /* leaked rather than freed under a pending completion */
        t->orphans     = grown;
        t->max_orphans = max;
    }
    t->orphans[t->num_orphans++] = memory;
}

void transport_op_release(struct transport *t, struct transport_op *op)
{
    if (op != NULL)
        transport_free_later(t, op, transport_op_pending(op));
}

unsigned transport_progress(struct transport *t)
{
    return ucp_worker_progress(t->worker);
}

int transport_event_fd(struct transport *t)
{
    int fd = -1;

    return ucp_worker_get_efd(t->worker, &fd) == UCS_OK ? fd : -1;
}

bool transport_arm(struct transport *t)
{
    return ucp_worker_arm(t->worker) == UCS_OK;
}

/* Waits for a request without a callback; cancels it after `timeout_ms`. */
static kvx_status_t request_wait(struct transport *t, ucs_status_ptr_t request, const char *what,
                                 int timeout_ms)
{
    uint64_t deadline = clock_ms() + (uint64_t)timeout_ms;
    ucs_status_t st;

    if (request == NULL)
        return KVX_OK;
    if (UCS_PTR_IS_ERR(request))
        return ucs_error(what, UCS_PTR_STATUS(request));
    while ((st = ucp_request_check_status(request)) == UCS_INPROGRESS) {
        if (ucp_worker_progress(t->worker) == 0 && clock_ms() > deadline) {
            ucp_request_cancel(t->worker, request);
            while (ucp_request_check_status(request) == UCS_INPROGRESS)
                ucp_worker_progress(t->worker);
            st = UCS_ERR_TIMED_OUT;
            break;
        }
    }
    ucp_request_free(request);
    return st == UCS_OK ? KVX_OK : ucs_error(what, st);
}

kvx_status_t transport_mem_map(struct transport *t, void *address, size_t size,
                               struct transport_mem **mem_p)
{
    ucp_mem_map_params_t params = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = address,
        .length  = size,
        .flags   = address == NULL ? UCP_MEM_MAP_ALLOCATE : 0,
    };
    ucp_mem_attr_t attr       = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    struct transport_mem *mem = calloc(1, sizeof(*mem));
    ucs_status_t st;

    if (mem == NULL)
        return error_no_memory("a memory map");
    st = ucp_mem_map(t->context, &params, &mem->memh);
    if (st == UCS_OK && address == NULL && (st = ucp_mem_query(mem->memh, &attr)) != UCS_OK)
        ucp_mem_unmap(t->context, mem->memh);
    if (st != UCS_OK) {
        free(mem);
        return ucs_error("mapping memory", st);
    }
    mem->address = address != NULL ? address : attr.address;
    mem->size    = size;
    *mem_p       = mem;
    return KVX_OK;
}

void transport_mem_unmap(struct transport *t, struct transport_mem *mem)
{
    if (mem == NULL)
        return;
    ucp_mem_unmap(t->context, mem->memh);
    free(mem);
}

void *transport_mem_address(const struct transport_mem *mem)
{
    return mem->address;
}

/* A malloc'd copy of `size` bytes at `data`. */
static kvx_status_t bytes_copy(const void *data, size_t size, void **buf_p, size_t *size_p)
{
    void *copy = malloc(size > 0 ? size : 1);

    if (copy == NULL)
        return error_no_memory("a transport buffer");
    memcpy(copy, data, size);
    *buf_p  = copy;
    *size_p = size;
    return KVX_OK;
}

kvx_status_t transport_mem_pack_rkey(struct transport *t, struct transport_mem *mem, void **buf_p,
                                     size_t *size_p)
{
    void *packed;
    size_t size;
    ucs_status_t st = ucp_rkey_pack(t->context, mem->memh, &packed, &size);
    kvx_status_t status;

    if (st != UCS_OK)
        return ucs_error("packing a remote key", st);
    status = bytes_copy(packed, size, buf_p, size_p);
    ucp_rkey_buffer_release(packed);
    return status;
}

kvx_status_t transport_worker_address(struct transport *t, void **buf_p, size_t *size_p)
{
    ucp_address_t *address;
    size_t size;
    ucs_status_t st = ucp_worker_get_address(t->worker, &address, &size);
    kvx_status_t status;

    if (st != UCS_OK)
        return ucs_error("reading the worker address", st);
    status = bytes_copy(address, size, buf_p, size_p);
    ucp_worker_release_address(t->worker, address);
    return status;
}

kvx_status_t transport_ep_create(struct transport *t, const void *address, size_t size,
                                 struct transport_ep **ep_p)
{
    /* No peer-failure error mode: on UCX 1.13 it moves one-sided operations on user memory
     * from CMA to TCP at a twentieth of the speed; liveness comes from kvx's own deadlines. */
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address    = address,
        .err_mode   = UCP_ERR_HANDLING_MODE_NONE,
    };
    struct transport_ep *ep = calloc(1, sizeof(*ep));
    ucs_status_t st;

    if (ep == NULL)
        return error_no_memory("an endpoint");
    if (size == 0) {
        free(ep);
        return error_set(KVX_ERR_INVALID, "transport: empty worker address");
    }
    st = ucp_ep_create(t->worker, &params, &ep->ep);
    if (st != UCS_OK) {
        free(ep);
        return ucs_error("connecting to the peer's worker", st);
    }
    ep->t = t;
    *ep_p = ep;
    return KVX_OK;
}

void transport_ep_destroy(struct transport *t, struct transport_ep *ep)
{
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags        = UCP_EP_CLOSE_FLAG_FORCE};

    if (ep == NULL)
        return;
    /* A forced close cancels what is outstanding; what a dead peer leaves pending anyway
     * keeps its completion counter (in ep) alive until the worker goes. The wait is short:
     * it blocks the caller, and a dead peer's close never completes. */
    request_wait(t, ucp_ep_close_nbx(ep->ep, &param), "closing an endpoint", 100);
    transport_free_later(t, ep, transport_op_pending(&ep->op));
}

kvx_status_t transport_rkey_unpack(struct transport_ep *ep, const void *buf, size_t size,
                                   struct transport_rkey **rkey_p)
{
    struct transport_rkey *rkey = calloc(1, sizeof(*rkey));
    ucs_status_t st;

    if (rkey == NULL)
        return error_no_memory("a remote key");
    if (size == 0) {
        free(rkey);
        return error_set(KVX_ERR_INVALID, "transport: empty remote key");
    }
    st = ucp_ep_rkey_unpack(ep->ep, buf, &rkey->rkey);
    if (st != UCS_OK) {
        free(rkey);
        return ucs_error("unpacking a remote key", st);
    }
    *rkey_p = rkey;
    return KVX_OK;
}

void transport_rkey_destroy(struct transport_rkey *rkey)
{
    if (rkey == NULL)
        return;
    ucp_rkey_destroy(rkey->rkey);
    free(rkey);
}

static void rma_completed(void *request, ucs_status_t status, void *user_data)
{
    struct transport_op *op = user_data;

    op->completed++;
    if (status != UCS_OK && op->first_error == 0)
        op->first_error = status;
    ucp_request_free(request);
}

kvx_status_t transport_rma_post(struct transport_ep *ep, bool put, const kvx_pair_t *pairs,
                                size_t count, const struct transport_targets *targets,
                                struct transport_op *op)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send      = rma_completed,
        .user_data    = op,
    };

    if (ep->failed)
        return error_set(KVX_ERR_IO, "transport: the endpoint failed earlier");
    for (size_t i = 0; i < count; i++) {
        const kvx_pair_t *p = &pairs[i];
        uint32_t ls         = targets->mirrored ? p->remote_storage : p->local_storage;
        uint32_t rs         = targets->mirrored ? p->local_storage : p->remote_storage;
        void *local         = (char *)targets->local_bases[ls] +
                      (targets->mirrored ? p->remote_offset : p->local_offset);
        uint64_t remote =
            targets->remote_bases[rs] + (targets->mirrored ? p->local_offset : p->remote_offset);
        ucp_rkey_h rkey     = targets->rkeys[rs]->rkey;
        ucs_status_ptr_t sp = put ? ucp_put_nbx(ep->ep, local, p->len, remote, rkey, &param)
                                  : ucp_get_nbx(ep->ep, local, p->len, remote, rkey, &param);

        if (UCS_PTR_IS_ERR(sp)) {
            ep->failed = true;
            return ucs_error(put ? "posting a put" : "posting a get", UCS_PTR_STATUS(sp));
        }
        if (sp != NULL)
            op->posted++; /* NULL: completed in place, no callback comes */
    }
    return KVX_OK;
}

kvx_status_t transport_op_status(const struct transport_op *op, const char *what)
{
    return op->first_error == 0 ? KVX_OK : ucs_error(what, (ucs_status_t)op->first_error);
}

kvx_status_t transport_rma(struct transport *t, struct transport_ep *ep, bool put,
                           const kvx_pair_t *pairs, size_t count,
                           const struct transport_targets *targets, int timeout_ms)
{
    uint64_t deadline = clock_ms() + (uint64_t)timeout_ms;
    kvx_status_t status;

    if (ep->failed)
        return error_set(KVX_ERR_IO, "transport: the endpoint failed earlier");
    ep->op = (struct transport_op){0};
    status = transport_rma_post(ep, put, pairs, count, targets, &ep->op);
    while (transport_op_pending(&ep->op)) {
        if (ucp_worker_progress(t->worker) == 0 && clock_ms() > deadline) {
            ep->failed = true;
            return error_set(KVX_ERR_IO,
                             "transport: %zu of %zu operations still pending after"
                             " %d ms",
                             ep->op.posted - ep->op.completed, ep->op.posted, timeout_ms);
        }
    }
    if (status == KVX_OK)
        status = transport_op_status(&ep->op, put ? "put" : "get");
    if (status != KVX_OK) {
        ep->failed = true;
        return status;
    }
    /* Gets are complete once their callbacks ran; puts are visible at the target only after
     * a flush, which is what lets a notification follow the data. */
    if (put) {
        ucp_request_param_t flush = {.op_attr_mask = 0};

        status = request_wait(t, ucp_ep_flush_nbx(ep->ep, &flush), "flushing puts", timeout_ms);
        if (status != KVX_OK)
            ep->failed = true;
    }
    return status;
}

static ucs_status_t am_received(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
    struct am_slot *slot = arg;

    (void)header;
    (void)header_length;
    /* Sent eager, so the data is here; a rendezvous message is not ours: drop it. */
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && slot->handler != NULL)
        slot->handler(slot->arg, data, length);
    return UCS_OK;
}

kvx_status_t transport_am_set_handler(struct transport *t, unsigned id,
                                      transport_am_handler_t handler, void *arg)
{
    ucp_am_handler_param_t param = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id  = id,
        .cb  = am_received,
        .arg = &t->am[id],
    };
    ucs_status_t st;

    if (id >= TRANSPORT_AM_IDS)
        return error_set(KVX_ERR_INVALID, "transport: active-message id %u is not below %d", id,
                         TRANSPORT_AM_IDS);
    t->am[id] = (struct am_slot){handler, arg};
    st        = ucp_worker_set_am_recv_handler(t->worker, &param);
    return st == UCS_OK ? KVX_OK : ucs_error("setting an active-message handler", st);
}

kvx_status_t transport_am_send(struct transport *t, struct transport_ep *ep, unsigned id,
                               const void *data, size_t size, int timeout_ms)
{
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags        = UCP_AM_SEND_FLAG_EAGER};

    if (ep->failed)
        return error_set(KVX_ERR_IO, "transport: the endpoint failed earlier");
    return request_wait(t, ucp_am_send_nbx(ep->ep, id, NULL, 0, data, size, &param),
                        "sending an active message", timeout_ms);
}

/* Parses ucp_ep_print_info's lane lines, "lane[0]:  3:cma/memory.0 md[3] -> md[3]/cma/...
 * rma_bw#0 am", into "cma(rma_bw,am)": UCX 1.13 has no query for an endpoint's transports. */
void transport_ep_describe(struct transport_ep *ep, char *buf, size_t size)
{
    char *text   = NULL;
    size_t len   = 0;
    size_t used  = 0;
    FILE *stream = open_memstream(&text, &len);
    char *line;
    char *save;

    buf[0] = '\0';
    if (stream == NULL)
        return;
    ucp_ep_print_info(ep->ep, stream);
    fclose(stream);
    for (line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane[");
        char *tl;
        char *slash;
        char *arrow;
        char roles[128] = "";

        if (lane == NULL || (tl = strchr(lane, ':')) == NULL ||
            (tl = strchr(tl + 1, ':')) == NULL || (slash = strchr(tl, '/')) == NULL)
            continue;
        tl++;
        *slash = '\0';
        if ((arrow = strstr(slash + 1, "-> ")) != NULL &&
            (arrow = strchr(arrow + 3, ' ')) != NULL) {
            for (char *w = strtok_r(arrow, " ", &arrow); w != NULL;
                 w       = strtok_r(NULL, " ", &arrow)) {
                char *hash = strchr(w, '#');
                size_t r   = strlen(roles);

                if (hash != NULL)
                    *hash = '\0';
                snprintf(roles + r, sizeof(roles) - r, "%s%s", r > 0 ? "," : "", w);
            }
        }
        used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s%s%s%s%s",
                                 used > 0 ? " " : "", tl, roles[0] != '\0' ? "(" : "", roles,
                                 roles[0] != '\0' ? ")" : "");
        if (used >= size)
            break;
    }
    free(text);
}

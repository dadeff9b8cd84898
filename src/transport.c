/* transport.c: UCX under kvx: the context and its main worker, whole-storage memory maps,
 * remote keys, connections on workers of their own, posted gets, puts, flushes and active
 * messages with completion counting. Knows nothing of requests, leases or layouts. */
#include "transport.h"

#include "clock.h"
#include "error.h"
#include "invariant.h"
#include "tcplink_frame.h"
#include "transport_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void conn_free(struct transport_conn *conn);
static void conn_settle_now(struct transport_conn *conn);
static void conn_park(struct transport_conn *conn);

kvx_status_t transport_ucs_error(const char *what, ucs_status_t status)
{
    return error_set(KVX_ERR_IO, "transport: %s: %s", what, ucs_status_string(status));
}

static kvx_status_t worker_create(ucp_context_h context, ucp_worker_h *worker_p)
{
    ucp_worker_params_t params = {.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                  .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucs_status_t st            = ucp_worker_create(context, &params, worker_p);

    return st == UCS_OK ? KVX_OK : transport_ucs_error("creating a worker", st);
}

/* True when the UCX_TLS list names TCP: UCX emulates gets and puts over it in software, and
 * its target writes and reads wherever the message says, key or no key. */
static bool tls_without_keys(const char *tls)
{
    char list[256];
    char *save;

    snprintf(list, sizeof(list), "%s", tls);
    for (char *name = strtok_r(list, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
        if (strcmp(name, "tcp") == 0 || strcmp(name, "all") == 0)
            return true;
    }
    return false;
}

static int worker_event_fd(ucp_worker_h worker)
{
    int fd = -1;

    return ucp_worker_get_efd(worker, &fd) == UCS_OK ? fd : -1;
}

/* The list UCX is given: the caller's without tcp (transport_link.c says why), "self" where
 * nothing else is left; and whether what is left reaches other processes of this host, or of
 * other hosts, at all. */
static void tls_for_ucx(const char *tls, char *out, size_t size, bool *host_p, bool *net_p)
{
    static const char *const host[] = {"sm",   "posix", "sysv",     "cma",
                                       "xpmem", "knem", "cuda_ipc", "rocm_ipc"};
    char list[256];
    char *save;
    size_t used = 0;

    *host_p = *net_p = false;
    out[0]           = '\0';
    snprintf(list, sizeof(list), "%s", tls);
    for (char *name = strtok_r(list, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
        if (strcmp(name, "tcp") == 0)
            continue;
        if (strcmp(name, "all") == 0) {
            snprintf(out, size, "^tcp");
            *host_p = *net_p = true;
            return;
        }
        for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
            *host_p = *host_p || strcmp(name, host[i]) == 0;
        *net_p = *net_p || strncmp(name, "rc", 2) == 0 || strncmp(name, "dc", 2) == 0 ||
                 strncmp(name, "ud", 2) == 0 || strncmp(name, "ib", 2) == 0;
        used += (size_t)snprintf(out + used, used < size ? size - used : 0, "%s%s",
                                 used > 0 ? "," : "", name);
    }
    if (used == 0)
        snprintf(out, size, "self");
}

/* The grants a serving transport hands out, random per transport. */
static kvx_status_t tokens_make(struct transport *t)
{
    kvx_token_t read;
    kvx_token_t write;
    kvx_status_t status = kvx_token_generate(&read);

    if (status == KVX_OK)
        status = kvx_token_generate(&write);
    if (status != KVX_OK)
        return status;
    memcpy(t->read_token, read.bytes, TRANSPORT_TOKEN_SIZE);
    memcpy(t->write_token, write.bytes, TRANSPORT_TOKEN_SIZE);
    return KVX_OK;
}

kvx_status_t transport_create(const char *tls, bool one_rail, struct transport **transport_p)
{
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                           .features   = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
    struct transport *t = calloc(1, sizeof(*t));
    ucp_config_t *config;
    ucs_status_t st;
    kvx_status_t status;
    char ucx_tls[256];
    bool ucx_net;

    if (t == NULL)
        return error_no_memory("a transport");
    if (tls == NULL)
        tls = KVX_DEFAULT_TRANSPORTS;
    t->listen_fd  = -1;
    t->link_epoll = -1;
    transport_log_attach(t); /* first: UCX logs from ucp_init on */
    /* Without RMA a context registers none of UCX's software get and put handlers, which
     * serve any address to whoever reaches the worker: kvx serves its own (transport_am.c). */
    t->served = tls_without_keys(tls);
    t->links  = t->served;
    tls_for_ucx(tls, ucx_tls, sizeof(ucx_tls), &t->ucx_host, &ucx_net);
    t->ucx_net = ucx_net;
    if (!t->served)
        params.features |= UCP_FEATURE_RMA;
    if (t->served && (status = tokens_make(t)) != KVX_OK) {
        transport_log_detach(t);
        free(t);
        return status;
    }
    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        transport_log_detach(t);
        free(t);
        return transport_ucs_error("reading the UCX configuration", st);
    }
    /* The transport list is explicit: never whatever UCX would pick on its own. */
    st = ucp_config_modify(config, "TLS", t->links ? ucx_tls : tls);
    if (st == UCS_OK && one_rail)
        st = ucp_config_modify(config, "MAX_RNDV_RAILS", "1");
    status = st == UCS_OK ? transport_settings_apply(config, false, &t->tcp_segments)
                          : transport_ucs_error("configuring the context", st);
    if (status == KVX_OK && (st = ucp_init(&params, config, &t->context)) != UCS_OK)
        status = transport_ucs_error("creating the context", st);
    ucp_config_release(config);
    if (status != KVX_OK) {
        transport_log_detach(t);
        free(t);
        return status;
    }
    status = worker_create(t->context, &t->worker);
    if (status == KVX_OK && ((status = am_serve_set(t)) != KVX_OK ||
                             (t->links && (status = link_plane_create(
                                               t, worker_event_fd(t->worker))) != KVX_OK)))
        ucp_worker_destroy(t->worker);
    if (status != KVX_OK) {
        ucp_cleanup(t->context);
        transport_log_detach(t);
        free(t);
        return status;
    }
    *transport_p = t;
    return KVX_OK;
}

struct transport_segments transport_tcp_segments(const struct transport *t)
{
    return t->tcp_segments;
}

const struct transport_data_counters *transport_data_counters(const struct transport *t)
{
    return &t->counters;
}

const char *kvx_ucx_version(void)
{
    return ucp_get_version_string();
}

void transport_destroy(struct transport *t)
{
    if (t == NULL)
        return;
    transport_log_close_begin(t, true);
    /* The transport's end may wait out the settling connections: there is no later turn. */
    while (t->settling != NULL) {
        struct transport_conn *conn = t->settling;

        t->settling = conn->next_settling;
        t->num_settling--;
        conn_settle_now(conn);
        conn_free(conn);
    }
    while (t->unmapping != NULL) {
        struct transport_conn *conn = t->unmapping;

        t->unmapping = conn->next_settling;
        conn_free(conn);
    }
    while (t->parked != NULL) {
        struct transport_conn *conn = t->parked;

        t->parked = conn->next_parked;
        conn_free(conn);
    }
    if (t->links)
        link_plane_destroy(t);
    transport_log_close_begin(t, true); /* conn_free ended the window */
    ucp_worker_destroy(t->worker);
    am_records_free(&t->replies);
    am_serve_free(t);
    ucp_cleanup(t->context);
    transport_log_close_end();
    transport_log_detach(t);
    free(t->mems);
    free(t);
}

unsigned transport_progress(struct transport *t)
{
    unsigned events;

    t->progressing++;
    events = ucp_worker_progress(t->worker);
    t->progressing--;
    if (t->queued != NULL)
        am_writes_receive(t);
    if (t->links)
        events += (unsigned)link_plane_progress(t);
    return events;
}

unsigned transport_conn_progress(struct transport_conn *conn)
{
    unsigned events;

    if (conn->linked)
        return (unsigned)link_conn_progress(conn);
    conn->t->progressing++;
    events = ucp_worker_progress(conn->worker);
    conn->t->progressing--;
    if (conn->receives != NULL)
        am_receives_start(conn);
    if (conn->waiting != NULL)
        am_waiting_send(conn);
    if (conn->t->queued != NULL) /* writes to our storages, from the writer it serves */
        am_writes_receive(conn->t);
    if (conn->link != NULL) /* the link its peer's push writer writes over */
        events += (unsigned)link_conn_progress(conn);
    return events;
}

bool transport_progressing(const struct transport *t)
{
    return t->progressing > 0;
}


int transport_event_fd(struct transport *t)
{
    return t->links ? t->link_epoll : worker_event_fd(t->worker);
}

int transport_conn_event_fd(struct transport_conn *conn)
{
    return conn->link != NULL ? conn->link_epoll : worker_event_fd(conn->worker);
}

bool transport_arm(struct transport *t)
{
    if (t->copying != NULL || t->settling != NULL || (t->links && link_plane_busy(t)))
        return false;
    return ucp_worker_arm(t->worker) == UCS_OK;
}

bool transport_conn_arm(struct transport_conn *conn)
{
    if (conn->link != NULL && link_conn_busy(conn))
        return false;
    return conn->linked || ucp_worker_arm(conn->worker) == UCS_OK;
}

size_t transport_ops_orphaned(const struct transport *t)
{
    return t->orphaned;
}

size_t transport_ops_pending(const struct transport *t)
{
    return t->pending + t->serving;
}

/* Peers may read what kvx maps; writing takes a mapping of its own (made when push metadata
 * is first packed). Where the hardware checks keys (RDMA) it enforces this; shared memory and
 * CMA cannot (they are the OS user boundary's), and TCP gets no keys at all (t->served). */
#define MEM_PROT_READ                                                                              \
    (UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_READ)
#define MEM_PROT_WRITE (MEM_PROT_READ | UCP_MEM_MAP_PROT_REMOTE_WRITE)

static ucs_status_t memh_map(struct transport *t, void *address, size_t size, bool gpu,
                             unsigned prot, ucp_mem_h *memh_p)
{
    ucp_mem_map_params_t params = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_PROT |
                      (gpu ? UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE : 0),
        .address     = address,
        .length      = size,
        .flags       = address == NULL ? UCP_MEM_MAP_ALLOCATE : 0,
        .prot        = prot,
        .memory_type = gpu ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST,
    };

    return ucp_mem_map(t->context, &params, memh_p);
}

static kvx_status_t mem_map(struct transport *t, void *address, size_t size, bool gpu,
                            struct transport_mem **mem_p)
{
    ucp_mem_attr_t attr         = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    struct transport_mem *mem   = calloc(1, sizeof(*mem));
    struct transport_mem **mems = realloc(t->mems, (t->num_mems + 1) * sizeof(*t->mems));
    ucs_status_t st;

    if (mems != NULL)
        t->mems = mems;
    if (mem == NULL || mems == NULL) {
        free(mem);
        return error_no_memory("a memory map");
    }
    st = memh_map(t, address, size, gpu, MEM_PROT_READ, &mem->memh);
    if (st == UCS_OK && address == NULL && (st = ucp_mem_query(mem->memh, &attr)) != UCS_OK)
        ucp_mem_unmap(t->context, mem->memh);
    if (st != UCS_OK) {
        free(mem);
        return transport_ucs_error("mapping memory", st);
    }
    mem->t                 = t;
    mem->address           = address != NULL ? address : attr.address;
    mem->size              = size;
    mem->device            = gpu;
    mem->index             = t->num_mems;
    t->mems[t->num_mems++] = mem; /* its storage index: peers name it so (transport_am.c) */
    *mem_p                 = mem;
    return KVX_OK;
}

kvx_status_t transport_mem_map(struct transport *t, void *address, size_t size,
                               struct transport_mem **mem_p)
{
    return mem_map(t, address, size, false, mem_p);
}

kvx_status_t transport_mem_map_gpu(struct transport *t, void *address, size_t size,
                                   struct transport_mem **mem_p)
{
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    ucs_status_t st         = ucp_context_query(t->context, &attr);

    if (st != UCS_OK)
        return transport_ucs_error("querying the context's memory types", st);
    /* Without it UCX would treat device pointers as host memory and fault in a copy. */
    if (!(attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
        return error_set(KVX_ERR_INVALID,
                         "UCX %s moves no CUDA memory here: it needs UCX built with CUDA (make "
                         "UCX=wheel) and " TRANSPORT_GPU_TLS " in the transports",
                         ucp_get_version_string());
    return mem_map(t, address, size, true, mem_p);
}

void transport_mem_unmap(struct transport *t, struct transport_mem *mem)
{
    if (mem == NULL)
        return;
    t->mems[mem->index] = NULL; /* peers' requests naming it are refused from now on */
    if (mem->write_memh != NULL)
        ucp_mem_unmap(t->context, mem->write_memh);
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

/* A grant: a prefix no UCX key starts with, then the token; the peer's connection tells the
 * two apart (conn_unpack_keys). A read grant of host memory also carries the mapping's UCX
 * key, for one use only: a peer on this host that can attach the memory UCX allocated (shared
 * memory segments: the OS user's boundary, as a ptrace is) copies from it directly
 * (mapped_offset). The context has no RMA, so the key serves no get or put over any lane. */
#define GRANT_MAGIC  "kvxgrnt1"
#define GRANT_PREFIX (sizeof(GRANT_MAGIC) - 1)
#define GRANT_SIZE   (GRANT_PREFIX + TRANSPORT_TOKEN_SIZE)

static kvx_status_t grant_pack(struct transport *t, struct transport_mem *mem, bool writable,
                               void **buf_p, size_t *size_p)
{
    void *packed    = NULL;
    size_t key_size = 0;
    bool with_key   = !writable && !mem->device &&
                    ucp_rkey_pack(t->context, mem->memh, &packed, &key_size) == UCS_OK;
    uint8_t *grant = malloc(GRANT_SIZE + (with_key ? key_size : 0));

    if (grant != NULL) {
        memcpy(grant, GRANT_MAGIC, GRANT_PREFIX);
        memcpy(grant + GRANT_PREFIX, writable ? t->write_token : t->read_token,
               TRANSPORT_TOKEN_SIZE);
        if (with_key)
            memcpy(grant + GRANT_SIZE, packed, key_size);
        *buf_p  = grant;
        *size_p = GRANT_SIZE + (with_key ? key_size : 0);
    }
    if (with_key)
        ucp_rkey_buffer_release(packed);
    return grant != NULL ? KVX_OK : error_no_memory("a grant");
}

kvx_status_t transport_mem_pack_rkey(struct transport *t, struct transport_mem *mem, bool writable,
                                     void **buf_p, size_t *size_p)
{
    void *packed;
    size_t size;
    ucs_status_t st;
    kvx_status_t status;

    if (t->served)
        return grant_pack(t, mem, writable, buf_p, size_p);
    if (writable && mem->write_memh == NULL &&
        (st = memh_map(t, mem->address, mem->size, mem->device, MEM_PROT_WRITE,
                       &mem->write_memh)) != UCS_OK)
        return transport_ucs_error("mapping memory for peers' writes", st);
    st = ucp_rkey_pack(t->context, writable ? mem->write_memh : mem->memh, &packed, &size);
    if (st != UCS_OK)
        return transport_ucs_error("packing a remote key", st);
    status = bytes_copy(packed, size, buf_p, size_p);
    ucp_rkey_buffer_release(packed);
    return status;
}

static kvx_status_t worker_address(ucp_worker_h worker, void **buf_p, size_t *size_p)
{
    ucp_address_t *address;
    size_t size;
    ucs_status_t st = ucp_worker_get_address(worker, &address, &size);
    kvx_status_t status;

    if (st != UCS_OK)
        return transport_ucs_error("reading the worker address", st);
    status = bytes_copy(address, size, buf_p, size_p);
    ucp_worker_release_address(worker, address);
    return status;
}

kvx_status_t transport_worker_address(struct transport *t, void **buf_p, size_t *size_p)
{
    size_t trailer      = link_trailer_size(t);
    kvx_status_t status = worker_address(t->worker, buf_p, size_p);
    uint8_t *longer;

    if (status != KVX_OK || trailer == 0)
        return status;
    if ((longer = realloc(*buf_p, *size_p + trailer)) == NULL) {
        free(*buf_p);
        return error_no_memory("a worker address");
    }
    link_trailer_write(t, longer + *size_p);
    *buf_p = longer;
    *size_p += trailer;
    return KVX_OK;
}

kvx_status_t transport_conn_address(struct transport_conn *conn, void **buf_p, size_t *size_p)
{
    conn->push_target = true;
    if (conn->link != NULL)
        return link_conn_address(conn, buf_p, size_p);
    return worker_address(conn->worker, buf_p, size_p);
}

/* Where UCX mapped a peer's storage into this process (ucp_rkey_ptr: shared memory the peer
 * allocated through UCX), as an offset to add to the peer's addresses; 0 when it did not.
 * The peer's metadata says how large the storage is, and a peer may lie: msync fails with
 * ENOMEM unless every page of the range is mapped, so a copy from it can never fault. What
 * else of this process a lying size could reach is only ever copied into our own blocks. */
static uintptr_t mapped_offset(ucp_rkey_h rkey, uint64_t base, uint64_t size,
                               struct prefault_range *range)
{
    long page = sysconf(_SC_PAGESIZE);
    void *first;
    void *last;
    uintptr_t start;

    if (size == 0 || page <= 0 || ucp_rkey_ptr(rkey, base, &first) != UCS_OK ||
        ucp_rkey_ptr(rkey, base + size - 1, &last) != UCS_OK ||
        (uintptr_t)last - (uintptr_t)first != size - 1)
        return 0;
    start  = (uintptr_t)first & ~((uintptr_t)page - 1);
    *range = (struct prefault_range){start, (uintptr_t)last + 1 - start};
    if (msync((void *)range->start, range->size, MS_ASYNC) != 0)
        return 0;
    return (uintptr_t)first - (uintptr_t)base;
}

/* Frees a connection's record and arrays: all that is left once its worker is gone, or
 * before it had one. */
static void conn_unalloc(struct transport_conn *conn)
{
    free(conn->rkeys);
    free(conn->storages);
    free(conn->mapped);
    free(conn->ranges);
    free(conn);
}

/* A connection record with room for `num_mems` keys, not connected yet. */
static struct transport_conn *conn_alloc(struct transport *t, size_t num_mems)
{
    struct transport_conn *conn = calloc(1, sizeof(*conn));

    if (conn == NULL)
        return NULL;
    conn->t           = t;
    conn->link_epoll  = -1;
    conn->waiting_end = &conn->waiting;
    conn->rkeys       = calloc(num_mems + 1, sizeof(*conn->rkeys));
    conn->mapped      = calloc(num_mems + 1, sizeof(*conn->mapped));
    conn->storages    = calloc(num_mems + 1, sizeof(*conn->storages));
    conn->ranges      = calloc(num_mems + 1, sizeof(*conn->ranges));
    if (conn->rkeys == NULL || conn->mapped == NULL || conn->storages == NULL ||
        conn->ranges == NULL) {
        conn_unalloc(conn);
        return NULL;
    }
    return conn;
}

/* Takes a storage's grant (the peer serves it: transport_am.c); false when `key` is a UCX
 * key. */
static bool conn_take_grant(struct transport_conn *conn, size_t s,
                            const struct transport_remote_mem *mem)
{
    struct conn_storage *storage = &conn->storages[s];

    if (mem->rkey.size < GRANT_SIZE || memcmp(mem->rkey.data, GRANT_MAGIC, GRANT_PREFIX) != 0)
        return false;
    storage->served = true;
    memcpy(storage->token, (const uint8_t *)mem->rkey.data + GRANT_PREFIX, TRANSPORT_TOKEN_SIZE);
    return true;
}

/* Unpacks the peer's keys, or takes its grants; notes the storages mapped here and starts
 * populating them. */
static kvx_status_t conn_unpack_keys(struct transport_conn *conn,
                                     const struct transport_remote_mem *mems, size_t num_mems)
{
    for (; conn->num_rkeys < num_mems; conn->num_rkeys++) {
        const struct transport_remote_mem *mem = &mems[conn->num_rkeys];
        ucp_rkey_h *rkey                       = &conn->rkeys[conn->num_rkeys];
        bool served                            = conn_take_grant(conn, conn->num_rkeys, mem);
        const uint8_t *key                     = (const uint8_t *)mem->rkey.data;
        size_t key_size                        = mem->rkey.size;
        struct prefault_range range;
        ucs_status_t st;

        conn->storages[conn->num_rkeys].size   = mem->size;
        conn->storages[conn->num_rkeys].device = mem->device;
        if (served) { /* the key after the grant, if any, is only ever used for a mapping */
            key += GRANT_SIZE;
            key_size -= GRANT_SIZE;
            if (key_size == 0 || mem->device || ucp_ep_rkey_unpack(conn->ep, key, rkey) != UCS_OK)
                continue;             /* kvx's reads only */
        } else if (conn->t->served) { /* no RMA in this context: a key is of no use */
            return error_set(KVX_ERR_INVALID,
                             "transport: the peer hands out UCX keys (its transports have no "
                             "tcp) and this agent's transports include tcp: give both the "
                             "same transports");
        } else if ((st = key_size > 0 ? ucp_ep_rkey_unpack(conn->ep, key, rkey)
                                      : UCS_ERR_INVALID_PARAM) != UCS_OK) {
            return transport_ucs_error("unpacking a remote key", st);
        }
        conn->mapped[conn->num_rkeys] =
            mem->device ? 0 : mapped_offset(*rkey, mem->base, mem->size, &range);
        if (conn->mapped[conn->num_rkeys] != 0)
            conn->ranges[conn->num_mapped++] = range;
        if (served && conn->mapped[conn->num_rkeys] == 0) {
            ucp_rkey_destroy(*rkey); /* not mapped here: of no use */
            *rkey = NULL;
        }
    }
    conn->prefault = prefault_start(conn->ranges, conn->num_mapped);
    return KVX_OK;
}

static kvx_status_t am_slots_conn_set(struct transport_conn *conn);

/* A connection over a kvx link: the peer's grants (its UCX keys are of no use there), then its
 * own link to the peer's listener, or (`ref`) a push writer's on the link the peer opened. */
static kvx_status_t conn_create_linked(struct transport *t, const char *host,
                                       const struct link_address *at, const uint8_t *ref, const struct transport_remote_mem *mems,
                                       size_t num_mems, struct transport_conn **conn_p)
{
    struct transport_conn *conn = conn_alloc(t, num_mems);
    kvx_status_t status         = KVX_OK;

    if (conn == NULL)
        return error_no_memory("a connection");
    for (; status == KVX_OK && conn->num_rkeys < num_mems; conn->num_rkeys++) {
        const struct transport_remote_mem *mem = &mems[conn->num_rkeys];

        conn->storages[conn->num_rkeys].size   = mem->size;
        conn->storages[conn->num_rkeys].device = mem->device;
        if (!conn_take_grant(conn, conn->num_rkeys, mem))
            status = error_set(KVX_ERR_INVALID,
                               "transport: the peer hands out UCX keys (its transports have no "
                               "tcp) and is on another host or network namespace: give both the "
                               "same transports");
    }
    conn->linked = true;
    if (status == KVX_OK)
        status = ref != NULL ? link_conn_borrow(conn, ref) : link_conn_open(conn, host, at);
    if (status != KVX_OK) {
        link_conn_close(conn);
        conn_unalloc(conn);
        return status;
    }
    *conn_p = conn;
    return KVX_OK;
}

kvx_status_t transport_conn_create(struct transport *t, const void *address, size_t size,
                                   const char *host, const struct transport_remote_mem *mems,
                                   size_t num_mems, struct transport_conn **conn_p)
{
    /* No peer-failure error mode: on UCX 1.13 it moves every operation onto TCP, ten to
     * thirty times slower (docs/agent.md "Closing" has the figures); liveness comes from
     * kvx's own deadlines and heartbeats, and closing is transport_conn_destroy's. */
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address    = address,
        .err_mode   = UCP_ERR_HANDLING_MODE_NONE,
    };
    struct transport_conn *conn;
    kvx_status_t status;
    ucs_status_t st;

    struct link_address la;
    uint8_t ref[16];
    bool has_link;

    if (size == 0)
        return error_set(KVX_ERR_INVALID, "transport: empty worker address");
    if (link_ref_read(address, size, ref))
        return t->links ? conn_create_linked(t, NULL, NULL, ref, mems, num_mems, conn_p)
                        : error_set(KVX_ERR_INVALID, "transport: the peer's writer address is a "
                                                     "link's, and this agent's transports have "
                                                     "no tcp");
    /* Another host or network namespace, or one UCX reaches nothing on: over a link. */
    has_link = link_trailer_read(address, &size, &la);
    if (has_link && t->links && host == NULL) /* a push writer: it writes over a link only */
        return error_set(KVX_ERR_INVALID, "transport: the address names a worker, not a link "
                                          "its peer opened to this agent");
    if (has_link && t->links &&
        (memcmp(la.host_id, t->host_id, TRANSPORT_HOST_ID_SIZE) == 0 ? !t->ucx_host
                                                                      : !t->ucx_net))
        return conn_create_linked(t, host, &la, NULL, mems, num_mems, conn_p);
    params.address = address;
    if ((conn = conn_alloc(t, num_mems)) == NULL)
        return error_no_memory("a connection");
    status = worker_create(t->context, &conn->worker);
    if (status == KVX_OK && ((status = am_conn_set(conn)) != KVX_OK ||
                             (status = msg_conn_set(conn)) != KVX_OK ||
                             (status = am_slots_conn_set(conn)) != KVX_OK))
        ucp_worker_destroy(conn->worker);
    if (status != KVX_OK) {
        conn_unalloc(conn);
        return status;
    }
    st = ucp_ep_create(conn->worker, &params, &conn->ep);
    if (st != UCS_OK) {
        conn->ep = NULL;
        transport_conn_destroy(conn);
        return transport_ucs_error("connecting to the peer's worker", st);
    }
    status = conn_unpack_keys(conn, mems, num_mems);
    /* A push writer of the peer (on its push transports, tcp by default: one lane that reaches
     * only this process) writes over a link this connection opens. */
    if (status == KVX_OK && has_link && t->links && host != NULL)
        status = link_conn_open(conn, host, &la);
    if (status != KVX_OK) {
        transport_conn_destroy(conn);
        return status;
    }
    *conn_p = conn;
    return KVX_OK;
}

static void op_unlink(struct transport_op *op)
{
    struct transport_conn *conn = op->conn;

    if (op->prev != NULL)
        op->prev->next = op->next;
    else
        conn->ops = op->next;
    if (op->next != NULL)
        op->next->prev = op->prev;
}

static void op_free(struct transport_op *op)
{
    if (op->released) /* set only while something was pending */
        op->conn->t->orphaned--;
    op_unlink(op);
    free(op->copies);
    free(op);
}

static bool conn_has_pending(const struct transport_conn *conn)
{
    for (const struct transport_op *op = conn->ops; op != NULL; op = op->next) {
        if (op->completed < op->posted)
            return true;
    }
    return false;
}

/* Lets a closing connection finish the operations that need nothing of the peer: UCX 1.22
 * queues CMA gets and puts in the transport and runs them in progress, and asserts when a
 * worker is destroyed with that queue not empty. They are local copies, so they end in
 * bounded time, even towards a stopped peer; what waits on the peer (TCP, active messages)
 * makes no progress, and TRANSPORT_SETTLE_IDLE idle calls in a row end the wait (tens of
 * microseconds: a connection with nothing local queued goes in the call that closed it). One
 * round progresses it until `until` (seconds, clock_seconds()); true while it should be given
 * more (something pending, fewer idle calls in a row, its deadline not passed). Owners are
 * not told (conn->settling). */
/* Whether a closing connection still wants progress at `now`: operations pending and not
 * idle for long, or a worker a peer's push writer was connected to, for its first
 * TRANSPORT_SETTLE_WRITER seconds: a writer's wire-up under way (a new prefill instance
 * that took our registration as we closed) then completes before the worker goes, since
 * UCX 1.13 aborts purging a pending wire-up reply (ucp_request_send_state_ff: "got REP
 * message"). Writes are refused meanwhile (conn->settling). */
static bool conn_settle_wanted(const struct transport_conn *conn, double now)
{
    double started = conn->settle_deadline - TRANSPORT_SETTLE_SECONDS;

    if (now >= conn->settle_deadline)
        return false;
    return (conn_has_pending(conn) && conn->settle_idle < TRANSPORT_SETTLE_IDLE) ||
           (conn->push_target && now < started + TRANSPORT_SETTLE_WRITER);
}

static bool conn_settle_round(struct transport_conn *conn, double until, size_t *worked_p)
{
    double now = clock_seconds();

    if (conn->writes_receiving > 0)
        return false; /* parked at once (conn_settled): progress would land those bytes */
    while (conn_settle_wanted(conn, now) && now < until) {
        conn->t->progressing++;
        conn->settle_idle = ucp_worker_progress(conn->worker) > 0 ? 0 : conn->settle_idle + 1;
        conn->t->progressing--;
        *worked_p += conn->settle_idle == 0;
        now = clock_seconds();
    }
    return conn_settle_wanted(conn, now);
}

/* The whole settle at once, for the transport's own end: nothing turns after it. */
static void conn_settle_now(struct transport_conn *conn)
{
    size_t worked = 0;

    while (conn_settle_round(conn, conn->settle_deadline, &worked))
        ;
}

/* A settled connection goes: freed, or parked when the peer still owes it something; first,
 * in the loop, the mappings of its peer's storages leave our page tables (unmap_slices.h), so
 * that freeing it unmaps nothing populated. */
static void conn_settled(struct transport_conn *conn)
{
    struct transport *t = conn->t;

    if (conn->prefault != NULL || unmap_slices_run(&conn->unmap, &(size_t){0})) {
        conn->next_settling = t->unmapping;
        t->unmapping        = conn;
        return;
    }
    conn->settling = false;
    if (!conn_has_pending(conn) && conn->writes_receiving == 0)
        conn_free(conn);
    else
        conn_park(conn);
}

size_t transport_settle_run(struct transport *t)
{
    struct transport_conn **link = &t->settling;
    size_t budget                = UNMAP_SLICE;          /* all unmapping connections' together */
    size_t worked                = am_replies_expire(t); /* answers nobody took */
    double until;

    KVX_ASSERT(t->progressing == 0); /* it frees connections */
    if (t->links)
        worked += link_plane_reap(t);
    if (t->settling == NULL && t->unmapping == NULL)
        return worked; /* before the clock: this runs every turn of the loop */
    until = clock_seconds() + TRANSPORT_SETTLE_SLICE;
    while (*link != NULL) {
        struct transport_conn *conn = *link;

        if (conn_settle_round(conn, until, &worked)) {
            link = &conn->next_settling;
            continue;
        }
        *link = conn->next_settling;
        t->num_settling--;
        worked++;
        conn_settled(conn);
    }
    for (link = &t->unmapping; *link != NULL && budget > 0;) {
        struct transport_conn *conn = *link;

        worked++; /* the loop turns on until the list is empty: a millisecond or a few */
        if (!prefault_ended(conn->prefault)) { /* its last chunk, a millisecond at most */
            link = &conn->next_settling;
            continue;
        }
        prefault_stop(conn->prefault); /* it ended: joined at once */
        conn->prefault = NULL;
        if (unmap_slices_run(&conn->unmap, &budget)) {
            link = &conn->next_settling;
            continue;
        }
        *link = conn->next_settling;
        conn_settled(conn);
    }
    return worked;
}

size_t transport_settling(const struct transport *t)
{
    return t->num_settling;
}

/* Destroys the worker, and with it the endpoint and whatever UCX still had pending. */
static void conn_free(struct transport_conn *conn)
{
    prefault_stop(conn->prefault); /* before the keys, which unmap what it populates */
    for (size_t s = 0; s < conn->num_rkeys; s++) {
        if (conn->rkeys[s] != NULL)
            ucp_rkey_destroy(conn->rkeys[s]); /* UCX's order: keys before their endpoint */
    }
    for (struct transport_op *op = conn->ops; op != NULL; op = op->next)
        op->finished = NULL; /* whatever completes during the destroy tells no owner */
    transport_log_close_begin(conn->t, conn->t->log_destroying);
    ucp_worker_destroy(conn->worker);
    transport_log_close_end();
    am_records_free(&conn->requests);
    am_conn_free(conn);
    while (conn->ops != NULL)
        op_free(conn->ops);
    conn_unalloc(conn);
}

/* Parks a closed connection whose peer still owes it completions. */
static void conn_park(struct transport_conn *conn)
{
    struct transport *t = conn->t;

    /* Parked, not destroyed: UCX 1.13 aborts a peer whose reply to a get finds the
     * connection gone (ucp_get_req_handler: "Fatal: unexpected error"), which a stopped
     * prefill process that resumes would do. A parked worker is never progressed again, so
     * nothing it still receives reaches our memory; it goes when the transport does, or
     * when more than TRANSPORT_MAX_PARKED are parked (the oldest first). */
    conn->next_parked = t->parked;
    conn->parked      = true;
    t->parked         = conn;
    for (struct transport_op *op = conn->ops; op != NULL; op = op->next)
        t->pending -= op->posted - op->completed; /* they will never complete */
    if (++t->num_parked > TRANSPORT_MAX_PARKED) {
        struct transport_conn **oldest = &t->parked;

        while ((*oldest)->next_parked != NULL)
            oldest = &(*oldest)->next_parked;
        conn_free(*oldest);
        *oldest = NULL;
        t->num_parked--;
    }
}

void transport_conn_destroy(struct transport_conn *conn)
{
    struct transport *t;
    size_t worked = 0;

    if (conn == NULL)
        return;
    t = conn->t;
    KVX_ASSERT(t->progressing == 0); /* a completion callback closing its own connection */
    if (conn->linked) { /* closing its socket ends it: nothing of it lands after */
        conn->settling = true;   /* its ops complete as it closes, telling no owner */
        link_conn_close(conn);
        while (conn->ops != NULL)
            op_free(conn->ops);
        conn_unalloc(conn);
        return;
    }
    link_conn_close(conn); /* a push writer's link: nothing it sends lands after this */
    for (struct transport_op *op = conn->ops; op != NULL; op = op->next)
        copy_queue_drop(op); /* copies not made yet never are: the transfer is over */
    /* Its populating thread only ever reads ahead, and is never needed again (a closing
     * connection is not read from): asked to stop here, and joined once it ended, before
     * any of its ranges leaves our page tables or any key goes (conn_settled). */
    prefault_stop_begin(conn->prefault);
    conn->settling        = true;
    conn->settle_idle     = 0;
    conn->settle_deadline = clock_seconds() + TRANSPORT_SETTLE_SECONDS;
    unmap_slices_start(&conn->unmap, conn->ranges, conn->num_mapped);
    /* A slice here ends what needs no more (nothing queued in UCX: the usual case), so the
     * connection goes at once; the rest settles in the loop, a slice a turn. */
    if (conn_settle_round(conn, clock_seconds() + TRANSPORT_SETTLE_SLICE, &worked)) {
        conn->next_settling = t->settling;
        t->settling         = conn;
        t->num_settling++;
        return;
    }
    conn_settled(conn);
}

kvx_status_t transport_op_create(struct transport_conn *conn, transport_op_finished_t finished,
                                 void *arg, struct transport_op **op_p)
{
    struct transport_op *op = calloc(1, sizeof(*op));

    if (op == NULL)
        return error_no_memory("an operation record");
    op->conn     = conn;
    op->finished = finished;
    op->arg      = arg;
    op->next     = conn->ops;
    if (conn->ops != NULL)
        conn->ops->prev = op;
    conn->ops = op;
    *op_p     = op;
    return KVX_OK;
}

void transport_op_release(struct transport_op *op)
{
    if (op == NULL)
        return;
    op->finished = NULL;
    copy_queue_drop(op); /* nobody wants them any more */
    if (op->completed == op->posted) {
        op_free(op);
        return;
    }
    op->released = true;
    op->finished = NULL;
    op->conn->t->orphaned++;
}

static void op_check_finished(struct transport_op *op)
{
    if (op->completed < op->posted)
        return;
    if (op->released)
        op_free(op);
    else if (op->armed && op->finished != NULL && !op->conn->settling)
        op->finished(op->arg, op);
}

void transport_op_complete(struct transport_op *op, ucs_status_t status)
{
    op->completed++;
    if (!op->conn->parked)
        op->conn->t->pending--;
    if (status != UCS_OK && op->first_error == 0)
        op->first_error = status;
    op_check_finished(op);
}

void transport_op_posted_one(struct transport_op *op)
{
    op->posted++;
    op->conn->t->pending++;
}

static void op_completed(void *request, ucs_status_t status, void *user_data)
{
    ucp_request_free(request);
    transport_op_complete(user_data, status);
}

/* Counts what ucp_*_nbx returned: a request whose callback will come, a completion in place,
 * or an error (the op's first error, and the call's). */
static kvx_status_t op_count(struct transport_op *op, ucs_status_ptr_t sp, const char *what)
{
    KVX_ASSERT(!op->armed); /* transport_op_arm: nothing more is posted on it */
    if (UCS_PTR_IS_ERR(sp)) {
        if (op->first_error == 0)
            op->first_error = UCS_PTR_STATUS(sp);
        return transport_ucs_error(what, UCS_PTR_STATUS(sp));
    }
    if (sp != NULL) /* NULL: completed in place, no callback comes */
        transport_op_posted_one(op);
    return KVX_OK;
}

void transport_op_attach(struct transport_op *op, const void *data, size_t size)
{
    KVX_ASSERT(size <= TRANSPORT_ATTACH_MAX);
    memcpy(op->attach, data, size);
    op->attach_size = size;
}

bool transport_op_attached(const struct transport_op *op)
{
    return op->attached;
}

/* Gathers the reads of `pairs` into `reads` when all of them can travel as one served read
 * message (transport_op_attach): every storage served by the peer's kvx (not mapped here, not
 * its device memory), host memory here, and one read of any size or up to AM_READV_MAX small
 * ones under one token. False when they cannot (reads holds some of them then). */
static bool reads_one_message(const struct transport_op *op, const kvx_pair_t *pairs, size_t count,
                              const struct transport_targets *targets, struct am_reads *reads)
{
    const struct transport_conn *conn = op->conn;
    uint64_t bytes                    = 0;

    if (count == 0 || count > AM_READV_MAX || targets->mirrored)
        return false;
    for (size_t i = 0; i < count; i++) {
        const kvx_pair_t *p = &pairs[i];
        uint32_t rs         = p->remote_storage;

        if (rs >= conn->num_rkeys || !conn->storages[rs].served || conn->mapped[rs] != 0 ||
            conn->storages[rs].device || targets->local_mems[p->local_storage] == KVX_MEM_VRAM ||
            (count > 1 && (p->len == 0 || p->len > AM_READV_RANGE ||
                           memcmp(conn->storages[rs].token,
                                  conn->storages[pairs[0].remote_storage].token,
                                  TRANSPORT_TOKEN_SIZE) != 0)))
            return false;
        bytes += p->len;
        reads->ranges[i] =
            (struct am_range){.storage = rs, .offset = p->remote_offset, .length = p->len};
        reads->locals[i] = (char *)targets->local_bases[p->local_storage] + p->local_offset;
    }
    reads->count = (uint32_t)count;
    reads->bytes = bytes;
    return count == 1 || bytes <= AM_READV_BYTES;
}

/* A write goes in pieces of at most this many bytes, each an operation that completes on its
 * own: a push writer's stall check (push_serve.c) judges progress by completed operations,
 * and one put of a coalesced 64 MiB run through a 40 Mbit/s link completed nothing for 13 s,
 * so P closed an honest writer (issue 36 finding 8). 1 MiB completes within the default
 * timeout (10 s) on a link of 1 Mbit/s; a piece costs a few microseconds against 1 MiB's
 * copy. Reads are not split: a pull is judged by its own deadline, not by a stall check. */
#define TRANSPORT_PUT_PIECE ((uint64_t)1 << 20)

/* Posts the write of `len` bytes at `local` to storage `rs` of the peer, at `remote` (its
 * address there) or `offset` (from the storage's start, for a served write), in pieces. */
static kvx_status_t puts_post(struct transport_op *op, uint32_t rs, const char *local,
                              uint64_t remote, uint64_t offset, uint64_t len,
                              const ucp_request_param_t *param)
{
    struct transport_conn *conn = op->conn;

    for (uint64_t at = 0; at < len; at += TRANSPORT_PUT_PIECE) {
        uint64_t piece = len - at < TRANSPORT_PUT_PIECE ? len - at : TRANSPORT_PUT_PIECE;
        kvx_status_t status =
            conn->storages[rs].served
                ? am_write_post(op, rs, offset + at, local + at, piece)
                : op_count(op,
                           ucp_put_nbx(conn->ep, local + at, piece, remote + at, conn->rkeys[rs],
                                       param),
                           "posting a put");

        if (status != KVX_OK)
            return status;
    }
    return KVX_OK;
}

/* transport_rma_post over a link: reads gathered into as few READs as they fit, writes in
 * pieces; host memory only on both sides. */
static kvx_status_t link_rma_post(struct transport_op *op, bool put, const kvx_pair_t *pairs,
                                  size_t count, const struct transport_targets *targets)
{
    struct transport_conn *conn  = op->conn;
    struct tcplink_range *ranges = put ? NULL : malloc((count + 1) * sizeof(*ranges));
    void **locals                = put ? NULL : malloc((count + 1) * sizeof(*locals));
    kvx_status_t status          = KVX_OK;
    size_t n                     = 0;

    if (!put && (ranges == NULL || locals == NULL))
        status = error_no_memory("a read's ranges");
    for (size_t i = 0; i < count && status == KVX_OK; i++) {
        const kvx_pair_t *p = &pairs[i];
        uint32_t ls         = targets->mirrored ? p->remote_storage : p->local_storage;
        uint32_t rs         = targets->mirrored ? p->local_storage : p->remote_storage;
        char *local         = (char *)targets->local_bases[ls] +
                      (targets->mirrored ? p->remote_offset : p->local_offset);
        uint64_t offset = targets->mirrored ? p->local_offset : p->remote_offset;

        if (rs >= conn->num_rkeys || !conn->storages[rs].served)
            status = error_set(KVX_ERR_INVALID, "transport: storage %u of the peer", rs);
        else if ((targets->local_mems != NULL && targets->local_mems[ls] == KVX_MEM_VRAM) ||
                 conn->storages[rs].device)
            status = error_set(KVX_ERR_INVALID,
                               "transport: kvx's TCP links move host memory only: GPU memory on "
                               "another host needs an RDMA transport (rc, dc) in the list");
        for (uint64_t at = 0; status == KVX_OK && put && at < p->len; at += TRANSPORT_PUT_PIECE)
            status = link_write_post(op, rs, offset + at, local + at,
                                     p->len - at < TRANSPORT_PUT_PIECE ? p->len - at
                                                                       : TRANSPORT_PUT_PIECE);
        if (status == KVX_OK && !put && p->len > 0) {
            ranges[n]   = (struct tcplink_range){rs, offset, p->len};
            locals[n++] = local;
        }
    }
    if (status == KVX_OK && n > 0)
        status = link_reads_post(op, ranges, locals, n);
    free(ranges);
    free(locals);
    return status;
}

kvx_status_t transport_rma_post(struct transport_op *op, bool put, const kvx_pair_t *pairs,
                                size_t count, const struct transport_targets *targets)
{
    struct transport_conn *conn = op->conn;
    size_t inline_left          = TRANSPORT_COPY_INLINE; /* bytes this post may still copy */
    struct am_reads reads       = {0};                   /* served reads gathered */
    ucp_request_param_t param   = {
          .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
          .cb.send      = op_completed,
          .user_data    = op,
    };

    if (conn->linked)
        return link_rma_post(op, put, pairs, count, targets);
    if (op->attach_size > 0 && !put && reads_one_message(op, pairs, count, targets, &reads))
        return am_reads_post_attached(op, &reads);
    reads = (struct am_reads){0};
    for (size_t i = 0; i < count; i++) {
        const kvx_pair_t *p = &pairs[i];
        uint32_t ls         = targets->mirrored ? p->remote_storage : p->local_storage;
        uint32_t rs         = targets->mirrored ? p->local_storage : p->remote_storage;
        void *local         = (char *)targets->local_bases[ls] +
                      (targets->mirrored ? p->remote_offset : p->local_offset);
        uint64_t remote =
            targets->remote_bases[rs] + (targets->mirrored ? p->local_offset : p->remote_offset);
        kvx_status_t status;

        if (put) {
            status = puts_post(op, rs, local, remote, remote - targets->remote_bases[rs], p->len,
                               &param);
            if (status != KVX_OK)
                return status;
            continue;
        }
        /* Reads from a storage mapped here are copies: made here up to a small budget (a
         * request of a few blocks completes as fast as before), else queued for the loop, a
         * slice a turn, so that a large request's post returns at once. Writes (above) never
         * are: a peer's mapping proves nothing about whose memory it is (docs/security.md). */
        if (conn->mapped[rs] != 0 && targets->local_mems[ls] != KVX_MEM_VRAM) {
            const void *src = (const void *)(uintptr_t)(conn->mapped[rs] + remote);

            if (p->len <= inline_left && !op->copying) {
                memcpy(local, src, p->len);
                inline_left -= p->len;
                continue;
            }
            status = copy_queue_add(op, local, src, p->len);
            if (status != KVX_OK)
                return status;
            continue;
        }
        if (conn->storages[rs].served) { /* the peer's kvx checks and serves it */
            uint64_t offset = remote - targets->remote_bases[rs];

            if (targets->local_mems[ls] == KVX_MEM_VRAM) /* received by rendezvous */
                status = am_read_post(op, rs, offset, local, p->len, true);
            else
                status = am_reads_add(op, &reads, rs, offset, local, p->len);
            if (status != KVX_OK)
                return status;
            continue;
        }
        status = op_count(op, ucp_get_nbx(conn->ep, local, p->len, remote, conn->rkeys[rs], &param),
                          "posting a get");
        if (status != KVX_OK)
            return status;
    }
    return am_reads_flush(op, &reads);
}

kvx_status_t transport_flush_post(struct transport_op *op)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send      = op_completed,
        .user_data    = op,
    };
    bool keyed = false;

    if (op->conn->linked)
        return KVX_OK; /* a write over a link completes when its owner answered */
    for (size_t s = 0; s < op->conn->num_rkeys; s++)
        keyed = keyed || !op->conn->storages[s].served;
    /* A served write completes when its owner answered that the bytes are in memory: a flush
     * would wait for nothing more. */
    if (!keyed)
        return KVX_OK;
    return op_count(op, ucp_ep_flush_nbx(op->conn->ep, &param), "flushing puts");
}

kvx_status_t transport_am_post(struct transport_op *op, unsigned id, const void *data, size_t size)
{
    ucp_request_param_t param = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send   = op_completed,
        .user_data = op,
        .flags     = UCP_AM_SEND_FLAG_EAGER,
    };

    if (size > sizeof(op->am))
        return error_set(KVX_ERR_INTERNAL, "transport: an active message of %zu bytes", size);
    if (op->conn->linked)
        return link_am_post(op, id, data, size);
    memcpy(op->am, data, size);
    return op_count(op, ucp_am_send_nbx(op->conn->ep, id, NULL, 0, op->am, size, &param),
                    "sending an active message");
}

void transport_op_arm(struct transport_op *op)
{
    KVX_ASSERT(!op->armed && !op->released); /* armed once, before it is let go */
    op->armed = true;
    op_check_finished(op);
}

size_t transport_op_pending(const struct transport_op *op)
{
    return op->posted - op->completed;
}

size_t transport_op_posted(const struct transport_op *op)
{
    return op->posted;
}

kvx_status_t transport_op_status(const struct transport_op *op, const char *what)
{
    if (op->first_error != 0 && op->conn->linked && op->conn->link_down[0] != '\0')
        return error_set(KVX_ERR_IO, "transport: %s: its data link (%s) closed: %s", what,
                         op->conn->link_to, op->conn->link_down);
    return op->first_error == 0 ? KVX_OK : transport_ucs_error(what, (ucs_status_t)op->first_error);
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

kvx_status_t transport_worker_set_handler(ucp_worker_h worker, unsigned id,
                                          ucp_am_recv_callback_t cb, void *arg)
{
    ucp_am_handler_param_t param = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id  = id,
        .cb  = cb,
        .arg = arg,
    };
    ucs_status_t st = ucp_worker_set_am_recv_handler(worker, &param);

    return st == UCS_OK ? KVX_OK : transport_ucs_error("setting an active-message handler", st);
}

kvx_status_t transport_am_set_handler(struct transport *t, unsigned id,
                                      transport_am_handler_t handler, void *arg)
{
    if (id >= TRANSPORT_AM_IDS)
        return error_set(KVX_ERR_INVALID, "transport: active-message id %u is not below %d", id,
                         TRANSPORT_AM_IDS);
    t->am[id] = (struct am_slot){handler, arg};
    return transport_worker_set_handler(t->worker, id, am_received, &t->am[id]);
}

/* A connection's worker takes the active messages the main one does: a peer's push writer
 * is connected to it (transport_conn_address) and sends its proof there. */
static kvx_status_t am_slots_conn_set(struct transport_conn *conn)
{
    kvx_status_t status = KVX_OK;

    for (unsigned id = 0; id < TRANSPORT_AM_IDS && status == KVX_OK; id++) {
        if (conn->t->am[id].handler != NULL)
            status = transport_worker_set_handler(conn->worker, id, am_received, &conn->t->am[id]);
    }
    return status;
}

/* Parses ucp_ep_print_info's lane lines, "lane[0]:  3:cma/memory.0 md[3] -> md[3]/cma/...
 * rma_bw#0 am" (1.22 adds "seg N" before the roles), into "cma(rma_bw,am)": UCX 1.13 has no
 * query for an endpoint's transports. */
void transport_conn_describe(struct transport_conn *conn, char *buf, size_t size)
{
    char *text    = NULL;
    size_t len    = 0;
    size_t used   = 0;
    size_t served = 0;
    FILE *stream  = open_memstream(&text, &len);
    char *line;
    char *save;

    buf[0] = '\0';
    if (conn->linked) {
        if (stream != NULL)
            fclose(stream);
        free(text);
        link_conn_describe(conn, buf, size);
        return;
    }
    if (stream == NULL)
        return;
    ucp_ep_print_info(conn->ep, stream);
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

                if (strcmp(w, "seg") == 0) { /* UCX 1.22's "seg <segment id>": not a role */
                    strtok_r(NULL, " ", &arrow);
                    continue;
                }
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
    for (size_t s = 0; s < conn->num_rkeys; s++)
        served += conn->storages[s].served;
    if (served > 0 && used < size) /* the peer's kvx checks and serves them (transport_am.c) */
        used += (size_t)snprintf(buf + used, size - used, "%skvx-served(%zu of %zu storages)",
                                 used > 0 ? " " : "", served, conn->num_rkeys);
    if (conn->num_mapped > 0 && used < size) /* reads of those bypass the lanes */
        snprintf(buf + used, size - used, "%smemcpy(%zu of %zu storages mapped)",
                 used > 0 ? " " : "", conn->num_mapped, conn->num_rkeys);
}

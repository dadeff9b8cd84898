/* _kvx.c: the CPython extension under the `kvx` package: thin types over include/kvx.h. The
 * pure-Python layer (kvx/__init__.py) gives them their public names and conveniences.
 *
 * Rules kept here, for every call:
 * - A buffer the engine hands in (agent memory) is held with PyObject_GetBuffer for as long
 *   as the C agent lives, so it cannot be freed or resized under a registration. A storage()
 *   view keeps the C agent alive too: close() destroys it once the last view is released.
 * - Any Python thread may use an agent, its peers and transfers at any time: a lock per agent
 *   (a pthread mutex) is held around every kvx call on them, waited for only with the GIL
 *   released, and never held while taking the GIL ("Threading" below). progress() and wait()
 *   sleep on the agent's descriptor without it and take it one turn at a time.
 * - close() works from any thread: calls in progress elsewhere wake and raise InvalidError
 *   ("the agent is closed"), and so does every later call on the agent, its peers and
 *   transfers.
 * - Callbacks never call Python: the release and log callbacks this layer registers run
 *   inside kvx_agent_progress (lock held, no GIL) and only queue ids and lines in C, which
 *   released() and logs() drain. No transfer callback is registered.
 * - Errors become kvx.Error subclasses carrying kvx's status and message. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kvx.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* ---- errors --------------------------------------------------------------------------- */

static PyObject *error_base;
static struct {
    kvx_status_t status;
    const char *name;
    PyObject *type;
} error_types[] = {
    {KVX_ERR_INVALID, "InvalidError", NULL},
    {KVX_ERR_OUT_OF_RANGE, "OutOfRangeError", NULL},
    {KVX_ERR_IO, "IOFailure", NULL},
    {KVX_ERR_CANCELED, "CanceledError", NULL},
    {KVX_ERR_BUSY, "BusyError", NULL},
    {KVX_ERR_MISMATCH, "MismatchError", NULL},
    {KVX_ERR_PEER_DOWN, "PeerDownError", NULL},
    {KVX_ERR_PEER_TIMEOUT, "PeerTimeoutError", NULL},
    {KVX_ERR_PEER_REFUSED, "PeerRefusedError", NULL},
    {KVX_ERR_NO_MEMORY, "NoMemoryError", NULL},
    {KVX_ERR_INTERNAL, "InternalError", NULL},
};

/* Raises the kvx.Error subclass of `status` with `message` (kvx_errmsg() when NULL). */
static PyObject *raise_status(kvx_status_t status, const char *message)
{
    PyObject *type = error_base;
    PyObject *args;

    for (size_t i = 0; i < sizeof(error_types) / sizeof(error_types[0]); i++) {
        if (error_types[i].status == status)
            type = error_types[i].type;
    }
    args = Py_BuildValue("(si)", message != NULL ? message : kvx_errmsg(), (int)status);
    if (args != NULL) {
        PyErr_SetObject(type, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* ---- block ids ------------------------------------------------------------------------ */

/* Block ids of a request, owned: groups[g] for each group given, and the arrays behind them
 * (numpy uint64 arrays are borrowed through their buffer, without a copy). */
struct ids {
    kvx_group_ids_t *groups;
    size_t num_groups;
    uint64_t **owned;   /* copies made from sequences, by group */
    Py_buffer *buffers; /* views held, by group (obj NULL when none) */
};

static void ids_free(struct ids *ids)
{
    for (size_t g = 0; g < ids->num_groups; g++) {
        if (ids->owned != NULL)
            PyMem_Free(ids->owned[g]);
        if (ids->buffers != NULL && ids->buffers[g].obj != NULL)
            PyBuffer_Release(&ids->buffers[g]);
    }
    PyMem_Free(ids->groups);
    PyMem_Free(ids->owned);
    PyMem_Free(ids->buffers);
    memset(ids, 0, sizeof(*ids));
}

/* One group's ids from `seq`: a C-contiguous buffer of unsigned 64-bit integers as is, any
 * other sequence of non-negative integers copied. */
static int group_convert(PyObject *seq, struct ids *ids, size_t g)
{
    Py_ssize_t n;

    if (PyObject_CheckBuffer(seq) &&
        PyObject_GetBuffer(seq, &ids->buffers[g], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
        Py_buffer *b = &ids->buffers[g];

        if (b->itemsize == 8 && b->format != NULL &&
            (strcmp(b->format, "Q") == 0 || strcmp(b->format, "L") == 0 ||
             strcmp(b->format, "<Q") == 0 || strcmp(b->format, "=Q") == 0)) {
            ids->groups[g] = (kvx_group_ids_t){b->buf, (size_t)(b->len / 8)};
            return 0;
        }
        PyBuffer_Release(b);
        b->obj = NULL; /* another dtype: read its values one by one below */
    }
    PyErr_Clear();
    seq = PySequence_Fast(seq, "block ids: each group must be a sequence of integers");
    if (seq == NULL)
        return -1;
    n             = PySequence_Fast_GET_SIZE(seq);
    ids->owned[g] = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(uint64_t));
    if (ids->owned[g] == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        unsigned long long v;

        if (!PyIndex_Check(item)) {
            PyErr_Format(PyExc_TypeError, "block ids: group %zu item %zd is not an integer", g, i);
            Py_DECREF(seq);
            return -1;
        }
        v = PyLong_AsUnsignedLongLong(item);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "block ids: group %zu item %zd is negative or above 2^64-1", g, i);
            Py_DECREF(seq);
            return -1;
        }
        ids->owned[g][i] = v;
    }
    ids->groups[g] = (kvx_group_ids_t){ids->owned[g], (size_t)n};
    Py_DECREF(seq);
    return 0;
}

/* "O&" converters for integer arguments: PyArg's "K" and "I" wrap out-of-range values
 * silently (hold(2**64) held request 0, consumers=2**40 became 0); these refuse them. */
static int integer_convert(PyObject *obj, unsigned long long max, unsigned long long *out)
{
    unsigned long long v;

    if (!PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%R is not an integer", obj);
        return 0;
    }
    v = PyLong_AsUnsignedLongLong(obj);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > max) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%R is not an integer of 0..%llu", obj, max);
        return 0;
    }
    *out = v;
    return 1;
}

static int uint64_convert(PyObject *obj, void *out)
{
    return integer_convert(obj, UINT64_MAX, out);
}

static int uint32_convert(PyObject *obj, void *out)
{
    unsigned long long v;

    if (!integer_convert(obj, UINT32_MAX, &v))
        return 0;
    *(unsigned int *)out = (unsigned int)v;
    return 1;
}

/* `blocks`: a sequence of groups (group g at index g), each a sequence of block ids. */
static int ids_convert(PyObject *blocks, struct ids *ids)
{
    PyObject *seq = PySequence_Fast(blocks, "blocks: a sequence of groups of block ids");
    Py_ssize_t n;

    memset(ids, 0, sizeof(*ids));
    if (seq == NULL)
        return -1;
    n            = PySequence_Fast_GET_SIZE(seq);
    ids->groups  = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(*ids->groups));
    ids->owned   = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(*ids->owned));
    ids->buffers = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(*ids->buffers));
    if (ids->groups == NULL || ids->owned == NULL || ids->buffers == NULL) {
        Py_DECREF(seq);
        ids_free(ids);
        PyErr_NoMemory();
        return -1;
    }
    ids->num_groups = (size_t)n;
    for (Py_ssize_t g = 0; g < n; g++) {
        if (group_convert(PySequence_Fast_GET_ITEM(seq, g), ids, (size_t)g) != 0) {
            Py_DECREF(seq);
            ids_free(ids);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* ---- Layout and Regions ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD kvx_layout_t *layout;
} LayoutObject;

typedef struct {
    PyObject_HEAD kvx_regions_t *regions;
} RegionsObject;

static PyTypeObject LayoutType;
static PyTypeObject RegionsType;

static void layout_dealloc(LayoutObject *self)
{
    kvx_layout_destroy(self->layout);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *layout_wrap(kvx_layout_t *layout)
{
    LayoutObject *self = PyObject_New(LayoutObject, &LayoutType);

    if (self == NULL) {
        kvx_layout_destroy(layout);
        return NULL;
    }
    self->layout = layout;
    return (PyObject *)self;
}

static PyObject *mod_layout_load(PyObject *module, PyObject *arg)
{
    PyObject *path = NULL;
    kvx_layout_t *layout;
    kvx_status_t status;

    (void)module;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = kvx_layout_load_file(PyBytes_AS_STRING(path), &layout);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    return status == KVX_OK ? layout_wrap(layout) : raise_status(status, NULL);
}

static PyObject *mod_layout_from_json(PyObject *module, PyObject *arg)
{
    Py_buffer text;
    kvx_layout_t *layout;
    kvx_status_t status;

    (void)module;
    if (PyUnicode_Check(arg)) {
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(arg, &size);

        if (utf8 == NULL)
            return NULL;
        status = kvx_layout_load_buffer(utf8, (size_t)size, &layout);
    } else {
        if (PyObject_GetBuffer(arg, &text, PyBUF_SIMPLE) != 0)
            return NULL;
        status = kvx_layout_load_buffer(text.buf, (size_t)text.len, &layout);
        PyBuffer_Release(&text);
    }
    return status == KVX_OK ? layout_wrap(layout) : raise_status(status, NULL);
}

static PyObject *layout_regions(LayoutObject *self, PyObject *unused)
{
    RegionsObject *r;
    kvx_regions_t *regions;
    kvx_status_t status;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    status = kvx_regions_register(self->layout, &regions);
    Py_END_ALLOW_THREADS
    if (status != KVX_OK)
        return raise_status(status, NULL);
    r = PyObject_New(RegionsObject, &RegionsType);
    if (r == NULL) {
        kvx_regions_destroy(regions);
        return NULL;
    }
    r->regions = regions;
    return (PyObject *)r;
}

static PyObject *layout_storages(LayoutObject *self, PyObject *unused)
{
    size_t n        = kvx_layout_num_storages(self->layout);
    PyObject *sizes = PyList_New((Py_ssize_t)n);

    (void)unused;
    for (size_t s = 0; sizes != NULL && s < n; s++)
        PyList_SET_ITEM(sizes, (Py_ssize_t)s,
                        PyLong_FromUnsignedLongLong(kvx_layout_storage_size(self->layout, s)));
    return sizes;
}

/* Every "vram" storage, or only storage `index` when one is given, becomes host memory: the
 * count changed. */
static PyObject *layout_in_host_memory(LayoutObject *self, PyObject *args)
{
    Py_ssize_t only = -1;
    size_t moved    = 0;

    if (!PyArg_ParseTuple(args, "|n", &only))
        return NULL;
    for (size_t s = 0; s < kvx_layout_num_storages(self->layout); s++) {
        if ((only < 0 || (size_t)only == s) &&
            kvx_layout_storage_mem(self->layout, s) == KVX_MEM_VRAM &&
            kvx_layout_set_storage_mem(self->layout, s, KVX_MEM_DRAM, 0) == KVX_OK)
            moved++;
    }
    return PyLong_FromSize_t(moved);
}

/* Each storage's memory kind, as the layout format spells it ("dram", "vram"). */
static PyObject *layout_storage_mems(LayoutObject *self, PyObject *unused)
{
    size_t n       = kvx_layout_num_storages(self->layout);
    PyObject *mems = PyList_New((Py_ssize_t)n);

    (void)unused;
    for (size_t s = 0; mems != NULL && s < n; s++)
        PyList_SET_ITEM(
            mems, (Py_ssize_t)s,
            PyUnicode_FromString(kvx_mem_type_str(kvx_layout_storage_mem(self->layout, s))));
    return mems;
}

static PyMethodDef layout_methods[] = {
    {"regions", (PyCFunction)layout_regions, METH_NOARGS, "register: the region table"},
    {"storage_sizes", (PyCFunction)layout_storages, METH_NOARGS, "bytes of each storage"},
    {"storage_mems", (PyCFunction)layout_storage_mems, METH_NOARGS, "memory kind of each storage"},
    {"in_host_memory", (PyCFunction)layout_in_host_memory, METH_VARARGS,
     "vram storages (or storage INDEX) become host memory; how many"},
    {NULL, NULL, 0, NULL},
};

static void regions_dealloc(RegionsObject *self)
{
    kvx_regions_destroy(self->regions);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t regions_len(RegionsObject *self)
{
    return (Py_ssize_t)kvx_regions_count(self->regions);
}

/* Region `index` as a tuple in kvx_region_info_t's order, members as view names. */
static PyObject *regions_get(RegionsObject *self, PyObject *arg)
{
    Py_ssize_t index = PyLong_AsSsize_t(arg);
    kvx_region_info_t info;
    PyObject *members;

    if (index == -1 && PyErr_Occurred())
        return NULL;
    if (index < 0 || kvx_regions_get(self->regions, (size_t)index, &info) != KVX_OK) {
        PyErr_SetString(PyExc_IndexError, "region index out of range");
        return NULL;
    }
    members = PyTuple_New((Py_ssize_t)info.num_members);
    for (size_t m = 0; members != NULL && m < info.num_members; m++)
        PyTuple_SET_ITEM(
            members, (Py_ssize_t)m,
            PyUnicode_FromString(kvx_regions_view_name(self->regions, info.members[m])));
    if (members == NULL)
        return NULL;
    return Py_BuildValue("(nssKKKKKLKOOOOON)", index, info.name, info.storage_name,
                         (unsigned long long)info.offset, (unsigned long long)info.block_len,
                         (unsigned long long)info.stride, (unsigned long long)info.num_blocks,
                         (unsigned long long)info.first_descriptor, (long long)info.group,
                         (unsigned long long)info.heads, info.mla ? Py_True : Py_False,
                         info.packed_row ? Py_True : Py_False, info.scratch ? Py_True : Py_False,
                         info.ssm ? Py_True : Py_False, info.ple ? Py_True : Py_False, members);
}

static PyObject *regions_to_json(RegionsObject *self, PyObject *unused)
{
    char *json;
    PyObject *text;
    kvx_status_t status = kvx_regions_to_json(self->regions, &json);

    (void)unused;
    if (status != KVX_OK)
        return raise_status(status, NULL);
    text = PyUnicode_FromString(json);
    kvx_free(json);
    return text;
}

static PyObject *regions_compat_hash(RegionsObject *self, PyObject *args)
{
    int push = 0;
    uint8_t hash[KVX_COMPAT_HASH_LEN];
    kvx_status_t status;

    if (!PyArg_ParseTuple(args, "|p", &push))
        return NULL;
    status = kvx_compat_hash(self->regions, push ? KVX_MODE_PUSH : KVX_MODE_PULL, hash);
    if (status != KVX_OK)
        return raise_status(status, NULL);
    return PyBytes_FromStringAndSize((const char *)hash, sizeof(hash));
}

static PyObject *regions_max_group(RegionsObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLongLong(kvx_regions_max_group(self->regions));
}

static PyObject *regions_storage_names(RegionsObject *self, PyObject *unused)
{
    size_t n        = kvx_regions_num_storages(self->regions);
    PyObject *names = PyList_New((Py_ssize_t)n);

    (void)unused;
    for (size_t s = 0; names != NULL && s < n; s++) {
        PyObject *name = PyUnicode_FromString(kvx_regions_storage_name(self->regions, s));

        if (name == NULL)
            Py_CLEAR(names);
        else
            PyList_SET_ITEM(names, (Py_ssize_t)s, name);
    }
    return names;
}

static PySequenceMethods regions_sequence = {.sq_length = (lenfunc)regions_len};

/* probe(address, auth_key, insecure, timeout_ms, tp_rank, tp_size): kvx_peer_probe against
 * this table, with the GIL released and no agent involved: a caller can learn whether a peer
 * answers, and whether it is compatible, on a thread of its own while its agent works on. An
 * auth_key of None with insecure false is kvx's refusal to run without a secret. */
static PyObject *regions_probe(RegionsObject *self, PyObject *args)
{
    const char *address;
    PyObject *auth_key;
    int insecure;
    unsigned int timeout_ms, tp_rank, tp_size;
    Py_buffer key        = {0};
    kvx_agent_params_t p = {0};
    kvx_status_t status;

    if (!PyArg_ParseTuple(args, "sOpO&O&O&", &address, &auth_key, &insecure, uint32_convert,
                          &timeout_ms, uint32_convert, &tp_rank, uint32_convert, &tp_size))
        return NULL;
    if (auth_key != Py_None) {
        if (PyObject_GetBuffer(auth_key, &key, PyBUF_SIMPLE) != 0)
            return NULL;
        if (key.len != KVX_AUTH_KEY_LEN) {
            PyBuffer_Release(&key);
            return PyErr_Format(PyExc_ValueError, "auth key: %zd bytes, not %d", key.len,
                                KVX_AUTH_KEY_LEN);
        }
        p.field_mask |= KVX_AGENT_PARAM_FIELD_AUTH_KEY;
        p.auth_key = key.buf;
    }
    if (insecure) {
        p.field_mask |= KVX_AGENT_PARAM_FIELD_INSECURE;
        p.insecure = true;
    }
    p.field_mask |= KVX_AGENT_PARAM_FIELD_TIMEOUT_MS | KVX_AGENT_PARAM_FIELD_TP_RANK |
                    KVX_AGENT_PARAM_FIELD_TP_SIZE;
    p.timeout_ms = timeout_ms;
    p.tp_rank    = tp_rank;
    p.tp_size    = tp_size;
    Py_BEGIN_ALLOW_THREADS
    status = kvx_peer_probe(self->regions, &p, address);
    Py_END_ALLOW_THREADS
    if (key.obj != NULL)
        PyBuffer_Release(&key);
    if (status != KVX_OK)
        return raise_status(status, NULL);
    Py_RETURN_NONE;
}

static PyMethodDef regions_methods[] = {
    {"probe", (PyCFunction)regions_probe, METH_VARARGS,
     "probe(address, auth_key, insecure, timeout_ms, tp_rank, tp_size)"},
    {"get", (PyCFunction)regions_get, METH_O, "region INDEX as a tuple"},
    {"to_json", (PyCFunction)regions_to_json, METH_NOARGS, "the kvx_plan document"},
    {"storage_names", (PyCFunction)regions_storage_names, METH_NOARGS, "storages, by index"},
    {"compat_hash", (PyCFunction)regions_compat_hash, METH_VARARGS, "compat_hash(push=False)"},
    {"max_group", (PyCFunction)regions_max_group, METH_NOARGS,
     "the highest group a request may give ids"},
    {NULL, NULL, 0, NULL},
};

/* ---- Agent, Peer and Transfer ----------------------------------------------------------- */

/* Threading. Each Agent has one lock, a pthread mutex, held around every call into kvx on the
 * agent, its peers and its transfers: kvx allows one thread at a time, and an engine uses an
 * agent from two (its model runner posts and polls, a progress thread drives the loop).
 * - The lock is only ever waited for with the GIL released, and the GIL is never taken while
 *   the lock is held: a section under the lock is plain C (it makes, frees and reads no Python
 *   object, so no finalizer can run in it and call back into the agent), and copies out into C
 *   memory whatever Python needs afterwards. Neither lock waits for the other.
 * - The lock protects the C handles and whatever says whether they still exist: the agent
 *   pointer, the lists of live peers and transfers (the Python objects' C pointers), and the
 *   queues the release and log callbacks fill. `closed` is atomic: close() sets it before its
 *   teardown takes the lock, and every section checks it first, so no handle is used after
 *   close() destroyed it. The GIL protects the engine buffers held and `exports`.
 * - progress() and wait() sleep on the agent's descriptor without the lock and take it for one
 *   kvx_agent_progress(agent, 0) turn at a time, so the other threads get the agent between
 *   turns (agent_loop). */

/* A circular doubly linked list through the objects themselves, headed in the agent. */
struct link {
    struct link *prev;
    struct link *next; /* NULL: not in a list */
};

#define LINK_OWNER(node, type) ((type *)(void *)((char *)(node)-offsetof(type, link)))

static void link_init(struct link *head)
{
    head->prev = head;
    head->next = head;
}

static void link_insert(struct link *head, struct link *node)
{
    node->prev       = head->prev;
    node->next       = head;
    head->prev->next = node;
    head->prev       = node;
}

static void link_remove(struct link *node)
{
    if (node->next == NULL)
        return;
    node->prev->next = node->next;
    node->next->prev = node->prev;
    node->prev       = NULL;
    node->next       = NULL;
}

/* What the release and log callbacks report, queued until Python drains it. Bounded: an agent
 * whose owner never asks must not grow without end; what does not fit is counted. */
#define RELEASED_MAX (1u << 20) /* request ids queued: 8 MiB */
#define LOGS_MAX     1024       /* log lines queued */

struct released_queue {
    uint64_t *ids;
    size_t count;
    size_t capacity;
    uint64_t dropped;
};

struct log_queue {
    char **lines; /* LOGS_MAX slots, allocated with the first line */
    size_t count;
    uint64_t dropped;
};

typedef struct {
    PyObject_HEAD pthread_mutex_t lock;
    kvx_agent_t *agent;             /* lock: NULL before init and once destroyed */
    atomic_bool closed;             /* set once, by close() or dealloc */
    int fd;                         /* kvx_agent_fd(agent): polled without the lock (agent_loop) */
    int wake_fd;                    /* an eventfd that wakes the threads asleep in agent_loop */
    struct link peers;              /* lock: PeerObjects whose C peers are alive */
    struct link xfers;              /* lock: XferObjects whose C transfer is alive */
    uint64_t busy_until;            /* lock: agent_loop sleeps at most 1 ms at a time until then */
    struct released_queue released; /* lock */
    struct log_queue logs;          /* lock */
    Py_buffer *memory;              /* GIL: views held by storage (obj NULL: kvx allocated it) */
    size_t num_storages;
    Py_ssize_t exports;         /* GIL: storage() views alive: the C agent outlives them */
    pthread_t progress_thread;  /* GIL: start_progress_thread()'s, joined by close() */
    bool progress_thread_alive; /* GIL */
} AgentObject;

/* One request's prefill ranks (one for TP 1): the C peers a transfer reads from together. */
typedef struct {
    PyObject_HEAD AgentObject *agent; /* a strong reference: the agent outlives its peers */
    struct link link;                 /* lock: in agent->peers while num_peers > 0 */
    kvx_peer_t **peers;               /* malloc'd, KVX_MAX_TP slots at most */
    size_t num_peers;                 /* lock: 0 once destroyed */
    size_t xfers;                     /* lock: transfers alive: the peers outlive them */
} PeerObject;

/* A posted transfer: completed by the agent's progress, waited for with the GIL released. */
typedef struct {
    PyObject_HEAD PeerObject *peer; /* a strong reference */
    struct link link;               /* lock: in agent->xfers while xfer is not NULL */
    kvx_xfer_t *xfer;               /* lock: NULL once released or destroyed by close() */
} XferObject;

/* The exporter behind a storage() memoryview: through it a view holds the agent, and through
 * agent->exports the C agent and its memory, until the view is released. */
typedef struct {
    PyObject_HEAD AgentObject *agent; /* a strong reference */
    void *base;
    Py_ssize_t size;
} StorageObject;

static PyTypeObject AgentType;
static PyTypeObject PeerType;
static PyTypeObject XferType;
static PyTypeObject StorageType;

/* Why a call found nothing to work on, raised once the GIL is back (raise_gone). */
enum gone {
    GONE_NOT,
    GONE_AGENT, /* the agent is closed (or was never made) */
    GONE_PEER,  /* peer.close() */
    GONE_XFER,  /* transfer.release() */
};

static PyObject *raise_gone(enum gone gone)
{
    if (gone == GONE_PEER)
        PyErr_SetString(PyExc_ValueError, "the peer is closed");
    else if (gone == GONE_XFER)
        PyErr_SetString(PyExc_ValueError, "the transfer was released");
    else
        raise_status(KVX_ERR_INVALID, "the agent is closed");
    return NULL;
}

static uint64_t monotonic_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void wake_pollers(AgentObject *self)
{
    uint64_t one = 1;

    (void)!write(self->wake_fd, &one, sizeof(one));
}

static void wake_clear(AgentObject *self)
{
    uint64_t count;

    (void)!read(self->wake_fd, &count, sizeof(count));
}

/* Takes the agent's lock; call with the GIL released. Returns the C agent, or NULL when it is
 * closed: then nothing of it may be touched. agent_leave either way. */
static kvx_agent_t *agent_enter(AgentObject *self)
{
    pthread_mutex_lock(&self->lock);
    return atomic_load(&self->closed) ? NULL : self->agent;
}

static void agent_leave(AgentObject *self)
{
    pthread_mutex_unlock(&self->lock);
}

/* The lock taken (GIL released): the peer's agent, or NULL with *gone set. */
static kvx_agent_t *peer_enter(PeerObject *self, enum gone *gone)
{
    kvx_agent_t *agent = agent_enter(self->agent);

    *gone = agent == NULL ? GONE_AGENT : self->num_peers == 0 ? GONE_PEER : GONE_NOT;
    return *gone == GONE_NOT ? agent : NULL;
}

/* The lock taken (GIL released): the C transfer, or NULL with *gone set. */
static kvx_xfer_t *xfer_enter(XferObject *self, enum gone *gone)
{
    kvx_agent_t *agent = agent_enter(self->peer->agent);

    *gone = agent == NULL ? GONE_AGENT : self->xfer == NULL ? GONE_XFER : GONE_NOT;
    return *gone == GONE_NOT ? self->xfer : NULL;
}

/* ---- the callbacks: they run inside kvx_agent_progress, with the lock held and no GIL ---- */

static void on_release(void *arg, uint64_t request_id, const kvx_group_ids_t *groups,
                       size_t num_groups)
{
    struct released_queue *q = &((AgentObject *)arg)->released;

    (void)groups;
    (void)num_groups;
    if (q->count == q->capacity) {
        size_t capacity = q->capacity > 0 ? 2 * q->capacity : 64;
        uint64_t *ids = capacity <= RELEASED_MAX ? realloc(q->ids, capacity * sizeof(*ids)) : NULL;

        if (ids == NULL) {
            q->dropped++;
            return;
        }
        q->ids      = ids;
        q->capacity = capacity;
    }
    q->ids[q->count++] = request_id;
}

static void on_log(void *arg, const char *line)
{
    struct log_queue *q = &((AgentObject *)arg)->logs;
    char *copy;

    if (q->lines == NULL)
        q->lines = calloc(LOGS_MAX, sizeof(*q->lines));
    if (q->lines == NULL || q->count == LOGS_MAX || (copy = strdup(line)) == NULL) {
        q->dropped++;
        return;
    }
    q->lines[q->count++] = copy;
}

/* ---- teardown ----------------------------------------------------------------------------- */

/* Destroys a Peer's C peers (lock held): transfers still using them fail as cancelled. */
static void peer_destroy_locked(PeerObject *self)
{
    for (size_t i = 0; i < self->num_peers; i++)
        kvx_peer_destroy(self->peers[i]);
    self->num_peers = 0;
    link_remove(&self->link);
}

static void xfer_destroy_locked(XferObject *self)
{
    kvx_xfer_destroy(self->xfer); /* one in progress is cancelled */
    self->xfer = NULL;
    self->peer->xfers--;
    link_remove(&self->link);
}

/* Destroys every C transfer and peer still alive (lock held), as close() does: their Python
 * objects find the agent closed and never touch the handles again. */
static void agent_teardown_locked(AgentObject *self)
{
    while (self->xfers.next != &self->xfers)
        xfer_destroy_locked(LINK_OWNER(self->xfers.next, XferObject));
    while (self->peers.next != &self->peers)
        peer_destroy_locked(LINK_OWNER(self->peers.next, PeerObject));
}

/* Progress turns kvx_agent_destroy may wait for: a transfer cancelled by its destroy settles
 * in the next progress (its callback runs), and until then destroy says KVX_ERR_BUSY. */
#define SETTLE_TURNS 1000

/* Destroys the C agent (lock held), progressing it until cancelled transfers settled. */
static kvx_status_t agent_destroy_locked(AgentObject *self)
{
    kvx_status_t status = kvx_agent_destroy(self->agent);

    for (int turn = 0; status == KVX_ERR_BUSY && turn < SETTLE_TURNS; turn++) {
        kvx_agent_progress(self->agent, 1);
        status = kvx_agent_destroy(self->agent);
    }
    if (status == KVX_OK)
        self->agent = NULL;
    return status;
}

/* Lets the engine's buffers go (GIL held): only once the C agent that registered them is gone. */
static void agent_release_memory(AgentObject *self)
{
    for (size_t s = 0; s < self->num_storages; s++) {
        if (self->memory[s].obj != NULL)
            PyBuffer_Release(&self->memory[s]);
    }
    PyMem_Free(self->memory);
    self->memory       = NULL;
    self->num_storages = 0;
}

/* Destroys the agent's transfers and peers, then, if `destroy`, the C agent itself (GIL held,
 * released while waiting for the lock). The engine's buffers go with the C agent. */
static kvx_status_t agent_shutdown(AgentObject *self, bool destroy)
{
    kvx_status_t status = KVX_OK;
    bool destroyed;

    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    agent_teardown_locked(self);
    if (destroy && self->agent != NULL)
        status = agent_destroy_locked(self);
    destroyed = self->agent == NULL;
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    if (destroyed)
        agent_release_memory(self);
    return status;
}

/* Joins the progress thread, if one runs (GIL held, released while joining): the caller set
 * `closed` and woke the pollers first, so it leaves after its turn. */
static void progress_thread_join(AgentObject *self)
{
    pthread_t thread = self->progress_thread;

    if (!self->progress_thread_alive)
        return;
    self->progress_thread_alive = false; /* before the GIL goes: one close() joins it */
    Py_BEGIN_ALLOW_THREADS
    pthread_join(thread, NULL);
    Py_END_ALLOW_THREADS
}

/* close(): closes the agent for every thread at once. A thread in progress() or wait() wakes
 * and raises InvalidError, and so does every later call on the agent, its peers and transfers
 * (but peer.close() and transfer.release(), which have nothing left to do). Transfers in
 * flight are cancelled and peers closed; the C agent is destroyed now, or, while storage()
 * views are alive, when the last of them is released. Idempotent. */
static PyObject *agent_close(AgentObject *self, PyObject *unused)
{
    kvx_status_t status;

    (void)unused;
    atomic_store(&self->closed, true); /* before `exports` is read: no view is made after */
    wake_pollers(self);
    progress_thread_join(self);
    status = agent_shutdown(self, self->exports == 0);
    if (status != KVX_OK)
        return raise_status(status, NULL);
    Py_RETURN_NONE;
}

static PyObject *agent_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    AgentObject *self = (AgentObject *)type->tp_alloc(type, 0);

    (void)args;
    (void)kwargs;
    if (self == NULL)
        return NULL;
    self->fd      = -1;
    self->wake_fd = -1;
    link_init(&self->peers);
    link_init(&self->xfers);
    atomic_init(&self->closed, false);
    if (pthread_mutex_init(&self->lock, NULL) != 0) {
        Py_TYPE(self)->tp_free((PyObject *)self);
        return PyErr_NoMemory();
    }
    self->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (self->wake_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void agent_dealloc(AgentObject *self)
{
    static bool told; /* about a leak, once per process */

    /* Peers and views hold references to the agent: none is left. */
    atomic_store(&self->closed, true);
    wake_pollers(self);
    progress_thread_join(self);
    if (agent_shutdown(self, true) != KVX_OK && !told) {
        told = true;
        fprintf(stderr, "kvx: an agent could not be destroyed, left allocated: %s\n", kvx_errmsg());
    }
    if (self->agent != NULL) { /* left allocated: it must never call into freed memory */
        kvx_agent_set_release_callback(self->agent, NULL, NULL);
        kvx_agent_set_log_callback(self->agent, NULL, NULL);
    }
    free(self->released.ids);
    for (size_t i = 0; i < self->logs.count; i++)
        free(self->logs.lines[i]);
    free(self->logs.lines);
    if (self->wake_fd >= 0)
        close(self->wake_fd);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The names agent_init takes from its params dict: kvx_agent_params_t's fields. */
static const char *const agent_param_names[] = {
    "name",        "transports", "listen",      "engine_id",  "push_transports",
    "tp_rank",     "tp_size",    "timeout_ms",  "lease_ms",   "heartbeat_ms",
    "peer_ttl_ms", "max_peers",  "max_message", "max_pushes", "verify_one_in",
    "insecure",    "auth_key",   "max_push_ms", "log_level",
};

/* 0, or -1 with a ValueError naming the first key of `params` that is not a parameter: a
 * misspelt one would otherwise be ignored without a word. */
static int agent_params_check(PyObject *params)
{
    PyObject *key;
    PyObject *value;
    Py_ssize_t at = 0;

    while (PyDict_Next(params, &at, &key, &value)) {
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        bool known       = false;

        for (size_t i = 0;
             name != NULL && !known && i < sizeof(agent_param_names) / sizeof(agent_param_names[0]);
             i++)
            known = strcmp(name, agent_param_names[i]) == 0;
        if (!known) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "agent params: %R is not a parameter", key);
            return -1;
        }
    }
    return 0;
}

/* Agent(layout, memory, params): memory is a sequence with one entry per storage, None or a

 * writable C-contiguous buffer of at least the storage's size; params a dict of
 * kvx_agent_params_t's fields by name. */
static int agent_init(AgentObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"layout", "memory", "params", NULL};
    LayoutObject *layout;
    PyObject *memory;
    PyObject *params;
    kvx_agent_params_t p = {0};
    kvx_agent_t *agent   = NULL;
    void **bases         = NULL;
    size_t n;
    kvx_status_t status;
    PyObject *value;
    Py_buffer key         = {0};
    kvx_log_level_t level = KVX_LOG_INFO;
    bool any_memory       = false;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OO!", keywords, &LayoutType, &layout, &memory,
                                     &PyDict_Type, &params))
        return -1;
    if (self->agent != NULL || self->memory != NULL || atomic_load(&self->closed)) {
        PyErr_SetString(PyExc_RuntimeError, "Agent.__init__ called twice");
        return -1;
    }
    if (agent_params_check(params) != 0)
        return -1;
    n            = kvx_layout_num_storages(layout->layout);
    self->memory = PyMem_Calloc(n > 0 ? n : 1, sizeof(*self->memory));
    bases        = PyMem_Calloc(n > 0 ? n : 1, sizeof(*bases));
    if (self->memory == NULL || bases == NULL) {
        PyMem_Free(bases);
        PyErr_NoMemory();
        return -1;
    }
    self->num_storages = n;
    if (memory != Py_None) {
        PyObject *seq = PySequence_Fast(memory, "memory: one buffer (or None) per storage");

        if (seq == NULL)
            goto fail;
        if ((size_t)PySequence_Fast_GET_SIZE(seq) != n) {
            PyErr_Format(PyExc_ValueError, "memory: %zd entries for %zu storages",
                         PySequence_Fast_GET_SIZE(seq), n);
            Py_DECREF(seq);
            goto fail;
        }
        for (size_t s = 0; s < n; s++) {
            PyObject *item = PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)s);
            uint64_t size  = kvx_layout_storage_size(layout->layout, s);

            unsigned long long address;
            unsigned long long bytes;

            if (item == Py_None)
                continue;
            /* (address, bytes): memory the package found through __cuda_array_interface__
             * or DLPack (python/kvx/__init__.py keeps its owner alive). */
            if (PyTuple_Check(item)) {
                if (!PyArg_ParseTuple(item, "O&O&", uint64_convert, &address, uint64_convert,
                                      &bytes)) {
                    Py_DECREF(seq);
                    goto fail;
                }
            } else if (PyObject_GetBuffer(item, &self->memory[s],
                                          PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) == 0) {
                address = (uintptr_t)self->memory[s].buf;
                bytes   = (unsigned long long)self->memory[s].len;
            } else {
                Py_DECREF(seq);
                goto fail;
            }
            if (bytes < size || address == 0) {
                PyErr_Format(PyExc_ValueError,
                             "memory: storage %zu needs %llu bytes, its memory has %llu", s,
                             (unsigned long long)size, bytes);
                Py_DECREF(seq);
                goto fail;
            }
            bases[s]   = (void *)(uintptr_t)address;
            any_memory = true;
        }
        Py_DECREF(seq);
        if (any_memory) {
            for (size_t s = 0; s < n; s++) {
                if (bases[s] == NULL) {
                    PyErr_Format(PyExc_ValueError,
                                 "memory: storage %zu has no buffer: give every storage one, or "
                                 "none (kvx allocates them all)",
                                 s);
                    goto fail;
                }
            }
            p.field_mask |= KVX_AGENT_PARAM_FIELD_STORAGE_BASES;
            p.storage_bases = bases;
        }
    }
#define STRING_PARAM(name, bit)                                                                    \
    if ((value = PyDict_GetItemString(params, #name)) != NULL && value != Py_None) {               \
        if ((p.name = PyUnicode_AsUTF8(value)) == NULL)                                            \
            goto fail;                                                                             \
        p.field_mask |= bit;                                                                       \
    }
#define NUMBER_PARAM(name, bit)                                                                    \
    if ((value = PyDict_GetItemString(params, #name)) != NULL && value != Py_None) {               \
        unsigned long v = PyLong_AsUnsignedLong(value);                                            \
        if (PyErr_Occurred() || v > UINT32_MAX) {                                                  \
            PyErr_Clear();                                                                         \
            PyErr_Format(PyExc_ValueError, "%s: %R is not a number of 0..2^32-1", #name, value);   \
            goto fail;                                                                             \
        }                                                                                          \
        p.name = (uint32_t)v;                                                                      \
        p.field_mask |= bit;                                                                       \
    }
    STRING_PARAM(name, KVX_AGENT_PARAM_FIELD_NAME)
    STRING_PARAM(transports, KVX_AGENT_PARAM_FIELD_TRANSPORTS)
    STRING_PARAM(listen, KVX_AGENT_PARAM_FIELD_LISTEN)
    STRING_PARAM(engine_id, KVX_AGENT_PARAM_FIELD_ENGINE_ID)
    STRING_PARAM(push_transports, KVX_AGENT_PARAM_FIELD_PUSH_TRANSPORTS)
    NUMBER_PARAM(tp_rank, KVX_AGENT_PARAM_FIELD_TP_RANK)
    NUMBER_PARAM(tp_size, KVX_AGENT_PARAM_FIELD_TP_SIZE)
    NUMBER_PARAM(timeout_ms, KVX_AGENT_PARAM_FIELD_TIMEOUT_MS)
    NUMBER_PARAM(lease_ms, KVX_AGENT_PARAM_FIELD_LEASE_MS)
    NUMBER_PARAM(heartbeat_ms, KVX_AGENT_PARAM_FIELD_HEARTBEAT_MS)
    NUMBER_PARAM(peer_ttl_ms, KVX_AGENT_PARAM_FIELD_PEER_TTL_MS)
    NUMBER_PARAM(max_peers, KVX_AGENT_PARAM_FIELD_MAX_PEERS)
    NUMBER_PARAM(max_message, KVX_AGENT_PARAM_FIELD_MAX_MESSAGE)
    NUMBER_PARAM(max_pushes, KVX_AGENT_PARAM_FIELD_MAX_PUSHES)
    NUMBER_PARAM(verify_one_in, KVX_AGENT_PARAM_FIELD_VERIFY_ONE_IN)
    NUMBER_PARAM(max_push_ms, KVX_AGENT_PARAM_FIELD_MAX_PUSH_MS)
#undef STRING_PARAM
#undef NUMBER_PARAM
    if ((value = PyDict_GetItemString(params, "insecure")) != NULL && PyObject_IsTrue(value)) {
        p.field_mask |= KVX_AGENT_PARAM_FIELD_INSECURE;
        p.insecure = true;
    }
    /* kvx_agent_set_log_level's: "info" (the default) or "warn", checked before any agent */
    if ((value = PyDict_GetItemString(params, "log_level")) != NULL && value != Py_None) {
        const char *text = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;

        if (text != NULL && strcmp(text, "warn") == 0) {
            level = KVX_LOG_WARN;
        } else if (text == NULL || strcmp(text, "info") != 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "log_level: %R is not \"info\" or \"warn\"", value);
            goto fail;
        }
    }
    if ((value = PyDict_GetItemString(params, "auth_key")) != NULL && value != Py_None) {
        if (PyObject_GetBuffer(value, &key, PyBUF_SIMPLE) != 0)
            goto fail;
        if (key.len != KVX_AUTH_KEY_LEN) {
            PyErr_Format(PyExc_ValueError, "auth key: %zd bytes, not %d", key.len,
                         KVX_AUTH_KEY_LEN);
            goto fail;
        }
        p.field_mask |= KVX_AGENT_PARAM_FIELD_AUTH_KEY;
        p.auth_key = key.buf;
    }
    Py_BEGIN_ALLOW_THREADS
    status = kvx_agent_create(layout->layout, &p, &agent);
    Py_END_ALLOW_THREADS
    if (key.obj != NULL)
        PyBuffer_Release(&key);
    key.obj = NULL;
    PyMem_Free(bases);
    bases = NULL;
    if (status != KVX_OK) {
        raise_status(status, NULL);
        goto fail;
    }
    /* The object is not shared yet: no other thread can call it before this returns. */
    kvx_agent_set_release_callback(agent, on_release, self);
    kvx_agent_set_log_callback(agent, on_log, self);
    kvx_agent_set_log_level(agent, level);
    self->fd    = kvx_agent_fd(agent);
    self->agent = agent;
    return 0;

fail:
    if (key.obj != NULL)
        PyBuffer_Release(&key);
    PyMem_Free(bases);
    agent_release_memory(self);
    return -1;
}

static PyObject *agent_listen_address(AgentObject *self, PyObject *unused)
{
    kvx_agent_t *agent;
    char *address = NULL;
    bool copied   = true;
    PyObject *result;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    if (agent != NULL && kvx_agent_listen_address(agent) != NULL)
        copied = (address = strdup(kvx_agent_listen_address(agent))) != NULL;
    agent_leave(self);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(GONE_AGENT);
    if (!copied)
        return PyErr_NoMemory();
    if (address == NULL)
        Py_RETURN_NONE;
    result = PyUnicode_FromString(address);
    free(address);
    return result;
}

/* agent_loop sleeps at most this long at a time while UCX operations of ours may be in flight,
 * as kvx_agent_progress does: UCX's wakeup descriptor signals what arrives, not every local
 * completion (a put or flush that finishes). */
#define PENDING_SLEEP_MS 1
/* ... and for this long after the last one was seen: a pull's done notifications leave once
 * its gets completed, through UCX too. */
#define BUSY_LINGER_MS 10

/* Whether UCX operations of ours may be in flight (lock held): a transfer in progress, a push
 * being served, an operation UCX still owes a completion, or any of them less than
 * BUSY_LINGER_MS ago. */
static bool agent_busy(AgentObject *self, kvx_agent_t *agent, uint64_t now)
{
    bool busy = false;
    kvx_agent_stats_t stats;

    for (struct link *l = self->xfers.next; !busy && l != &self->xfers; l = l->next)
        busy = kvx_xfer_status(LINK_OWNER(l, XferObject)->xfer) == KVX_INPROGRESS;
    if (!busy) {
        kvx_agent_stats(agent, &stats, sizeof(stats));
        busy = stats.pushes_serving > 0 || stats.ops_orphaned > 0;
    }
    if (busy)
        self->busy_until = now + BUSY_LINGER_MS;
    return now < self->busy_until;
}

/* The loop behind progress() and wait(), run with the GIL released. Each round takes the lock
 * for one kvx_agent_progress(agent, 0) turn, then sleeps on the agent's descriptor and the wake
 * eventfd without it (at most PENDING_SLEEP_MS while agent_busy), so other threads get the
 * agent between turns and close() wakes the sleeper. It ends, with KVX_OK:
 * - for wait (`xfer` given): once the transfer completed or failed, its status in *xfer_status_p;
 * - for progress: after the turn that followed an event on the descriptor, or at `timeout_ms`.
 * KVX_ERR_INVALID with *gone set: the agent was closed or the transfer released meanwhile. */
static kvx_status_t agent_loop(AgentObject *self, XferObject *xfer, uint64_t timeout_ms,
                               kvx_status_t *xfer_status_p, enum gone *gone)
{
    uint64_t start = monotonic_ms();
    bool event     = false;
    bool busy      = false;

    for (;;) {
        kvx_agent_t *agent;
        uint64_t now = start;
        uint64_t sleep;
        bool done = false;
        struct pollfd fds[2];

        pthread_mutex_lock(&self->lock);
        /* cleared before `closed` is read: close() sets it before it wakes us */
        wake_clear(self);
        agent = atomic_load(&self->closed) ? NULL : self->agent;
        if (agent == NULL)
            *gone = GONE_AGENT;
        else
            *gone = xfer != NULL && xfer->xfer == NULL ? GONE_XFER : GONE_NOT;
        if (*gone == GONE_NOT) {
            kvx_agent_progress(agent, 0);
            now  = monotonic_ms();
            busy = agent_busy(self, agent, now);
            if (xfer != NULL)
                done = (*xfer_status_p = kvx_xfer_status(xfer->xfer)) != KVX_INPROGRESS;
            else
                done = event;
        }
        pthread_mutex_unlock(&self->lock);
        if (*gone != GONE_NOT)
            return KVX_ERR_INVALID;
        if (done || now - start >= timeout_ms)
            break;
        sleep = timeout_ms - (now - start);
        if (busy && sleep > PENDING_SLEEP_MS)
            sleep = PENDING_SLEEP_MS;
        fds[0] = (struct pollfd){.fd = self->fd, .events = POLLIN};
        fds[1] = (struct pollfd){.fd = self->wake_fd, .events = POLLIN};
        event  = poll(fds, 2, sleep > INT_MAX ? INT_MAX : (int)sleep) > 0 && fds[0].revents != 0;
    }
    /* Another thread asleep here may have planned its sleep before the work in flight now was
     * posted, and this thread, which saw it, leaves: wake it to look again. */
    if (busy)
        wake_pollers(self);
    return KVX_OK;
}

/* The progress thread's longest sleep between turns with nothing due: a bound only (events
 * and the agent's own deadlines wake it sooner), so that close() is never kept waiting long
 * by a poll that missed its wake. */
#define PROGRESS_THREAD_SLEEP_MS 100

/* The progress thread: agent_loop over and over, without the GIL ever, until close(). */
static void *progress_thread_run(void *arg)
{
    AgentObject *self = arg;
    enum gone gone;

    while (agent_loop(self, NULL, PROGRESS_THREAD_SLEEP_MS, NULL, &gone) == KVX_OK)
        ;
    return NULL;
}

/* start_progress_thread(): a native thread that runs the agent's loop until close(), taking
 * the lock one turn at a time as progress() does, and never the GIL. An engine's Python
 * threads may be starved of the GIL for seconds (a busy model runner, a loaded machine),
 * and whatever the agent answers for its peers (a side-channel handshake's ZAP answer,
 * heartbeats, dones, served reads) must not wait for them. The release and log callbacks
 * set with set_*_callback are not called from it: released() and logs() collect instead,
 * or a progress() call of the caller's. Idempotent; the agent is made now if it was not. */
static PyObject *agent_start_progress_thread(AgentObject *self, PyObject *unused)
{
    kvx_agent_t *agent;
    int ret;

    (void)unused;
    if (self->progress_thread_alive)
        Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    agent_leave(self);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(GONE_AGENT);
    ret = pthread_create(&self->progress_thread, NULL, progress_thread_run, self);
    if (ret != 0) {
        errno = ret;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->progress_thread_alive = true;
    Py_RETURN_NONE;
}

/* progress(timeout_ms): runs the agent's loop until the turn after an event, or the timeout;
 * 0 turns once. Other threads use the agent between its turns. */
static PyObject *agent_progress(AgentObject *self, PyObject *arg)
{
    long timeout_ms = PyLong_AsLong(arg);
    enum gone gone;
    kvx_status_t status;

    if (timeout_ms == -1 && PyErr_Occurred())
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = agent_loop(self, NULL, timeout_ms > 0 ? (uint64_t)timeout_ms : 0, NULL, &gone);
    Py_END_ALLOW_THREADS
    if (status != KVX_OK)
        return raise_gone(gone);
    Py_RETURN_NONE;
}

static PyObject *agent_fileno(AgentObject *self, PyObject *unused)
{
    kvx_agent_t *agent;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    agent_leave(self);
    Py_END_ALLOW_THREADS
    return agent != NULL ? PyLong_FromLong(self->fd) : raise_gone(GONE_AGENT);
}

/* dict[key] = value; -1 with the Python error set when that failed. */
static int dict_set_u64(PyObject *dict, const char *key, uint64_t value)
{
    PyObject *v = PyLong_FromUnsignedLongLong(value);
    int ret     = v != NULL ? PyDict_SetItemString(dict, key, v) : -1;

    Py_XDECREF(v);
    return ret;
}

/* Every field of the library's list (kvx_agent_stats_fields) under its name; a histogram as
 * NAME_count and NAME_sum (truncated to an integer, in the field's unit). */
static int stats_dict_fill(PyObject *dict, const kvx_agent_stats_t *s)
{
    size_t count;
    const kvx_stat_field_t *fields = kvx_agent_stats_fields(&count);

    for (size_t i = 0; i < count; i++) {
        const char *at = (const char *)s + fields[i].offset;
        char key[128];
        uint64_t value;

        if (fields[i].kind == KVX_STAT_KIND_HISTOGRAM) {
            const kvx_histogram_t *h = (const kvx_histogram_t *)at;

            snprintf(key, sizeof(key), "%s_count", fields[i].name);
            if (dict_set_u64(dict, key, h->count) != 0)
                return -1;
            snprintf(key, sizeof(key), "%s_sum", fields[i].name);
            if (dict_set_u64(dict, key, (uint64_t)h->sum) != 0)
                return -1;
            continue;
        }
        memcpy(&value, at, sizeof(value));
        if (dict_set_u64(dict, fields[i].name, value) != 0)
            return -1;
    }
    return 0;
}

static PyObject *agent_stats(AgentObject *self, PyObject *unused)
{
    kvx_agent_t *agent;
    kvx_agent_stats_t s       = {0};
    uint64_t released_dropped = 0;
    uint64_t logs_dropped     = 0;
    PyObject *dict;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    if (agent != NULL) {
        kvx_agent_stats(agent, &s, sizeof(s));
        released_dropped = self->released.dropped;
        logs_dropped     = self->logs.dropped;
    }
    agent_leave(self);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(GONE_AGENT);
    /* the library's fields, then this binding's own: what released() and logs() could not
     * keep */
    dict = PyDict_New();
    if (dict != NULL && (stats_dict_fill(dict, &s) != 0 ||
                         dict_set_u64(dict, "released_dropped", released_dropped) != 0 ||
                         dict_set_u64(dict, "logs_dropped", logs_dropped) != 0))
        Py_CLEAR(dict);
    return dict;
}

/* released(): the request ids whose holds were released (every consumer's done, or the lease)
 * since the last call, in release order; the queue is emptied. */
static PyObject *agent_released(AgentObject *self, PyObject *unused)
{
    kvx_agent_t *agent;
    struct released_queue taken = {0};
    PyObject *list;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    if (agent != NULL) {
        taken                   = self->released;
        self->released.ids      = NULL;
        self->released.count    = 0;
        self->released.capacity = 0;
    }
    agent_leave(self);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(GONE_AGENT);
    list = PyList_New((Py_ssize_t)taken.count);
    for (size_t i = 0; list != NULL && i < taken.count; i++) {
        PyObject *id = PyLong_FromUnsignedLongLong(taken.ids[i]);

        if (id == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, id);
    }
    free(taken.ids);
    return list;
}

/* logs(): the agent's log lines since the last call (kvx_agent_set_log_callback), emptied. */
static PyObject *agent_logs(AgentObject *self, PyObject *unused)
{
    kvx_agent_t *agent;
    struct log_queue taken = {0};
    PyObject *list;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    if (agent != NULL) {
        taken            = self->logs;
        self->logs.lines = NULL;
        self->logs.count = 0;
    }
    agent_leave(self);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(GONE_AGENT);
    list = PyList_New((Py_ssize_t)taken.count);
    for (size_t i = 0; i < taken.count; i++) {
        PyObject *line = list != NULL
                             ? PyUnicode_DecodeUTF8(taken.lines[i],
                                                    (Py_ssize_t)strlen(taken.lines[i]), "replace")
                             : NULL;

        if (line == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, line);
        free(taken.lines[i]);
    }
    free(taken.lines);
    return list;
}

static int storage_getbuffer(StorageObject *self, Py_buffer *view, int flags)
{
    if (atomic_load(&self->agent->closed)) {
        view->obj = NULL;
        raise_gone(GONE_AGENT);
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->base, self->size, 0, flags) != 0)
        return -1;
    self->agent->exports++;
    return 0;
}

static void storage_releasebuffer(StorageObject *self, Py_buffer *view)
{
    AgentObject *agent = self->agent;

    (void)view;
    /* close() left the C agent to the last view: destroy it now. A failure is told by the
     * agent's dealloc, which tries again. */
    if (--agent->exports == 0 && atomic_load(&agent->closed))
        (void)agent_shutdown(agent, true);
}

static void storage_dealloc(StorageObject *self)
{
    Py_XDECREF(self->agent);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* storage(index): a writable memoryview of a host storage's bytes. The view keeps the memory:
 * close() destroys the C agent (and lets the engine's buffers go) only once every view of its
 * storages is released; after close() no new view is made. */
static PyObject *agent_storage(AgentObject *self, PyObject *arg)
{
    Py_ssize_t index = PyLong_AsSsize_t(arg);
    kvx_agent_t *agent;
    uint64_t size      = 0;
    void *base         = NULL;
    kvx_mem_type_t mem = KVX_MEM_DRAM;
    StorageObject *storage;
    PyObject *view;

    if (index == -1 && PyErr_Occurred())
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    if (agent != NULL && index >= 0) {
        base = kvx_agent_storage(agent, (size_t)index, &size);
        mem  = kvx_agent_storage_mem(agent, (size_t)index);
    }
    agent_leave(self);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(GONE_AGENT);
    if (base == NULL) {
        PyErr_SetString(PyExc_IndexError, "storage index out of range");
        return NULL;
    }
    if (mem == KVX_MEM_VRAM) {
        PyErr_Format(PyExc_ValueError,
                     "storage %zd is GPU memory, which the host cannot address: copy with "
                     "read_storage and write_storage",
                     index);
        return NULL;
    }
    storage = PyObject_New(StorageObject, &StorageType);
    if (storage == NULL)
        return NULL;
    Py_INCREF(self);
    storage->agent = self;
    storage->base  = base;
    storage->size  = (Py_ssize_t)size;
    view           = PyMemoryView_FromObject((PyObject *)storage); /* fails once closed */
    Py_DECREF(storage);
    return view;
}

/* read_storage(index, offset, nbytes) -> bytes, whatever the storage's memory kind. */
static PyObject *agent_read_storage(AgentObject *self, PyObject *args)
{
    kvx_agent_t *agent;
    Py_ssize_t index;
    unsigned long long offset;
    Py_ssize_t nbytes;
    PyObject *out;
    kvx_status_t status = KVX_OK;

    if (!PyArg_ParseTuple(args, "nO&n", &index, uint64_convert, &offset, &nbytes))
        return NULL;
    if (index < 0 || nbytes < 0) {
        PyErr_SetString(PyExc_ValueError, "read_storage: a negative index or size");
        return NULL;
    }
    out = PyBytes_FromStringAndSize(NULL, nbytes);
    if (out == NULL)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    if (agent != NULL)
        status = kvx_agent_storage_read(agent, (size_t)index, offset, PyBytes_AS_STRING(out),
                                        (size_t)nbytes);
    agent_leave(self);
    Py_END_ALLOW_THREADS
    if (agent == NULL || status != KVX_OK) {
        Py_DECREF(out);
        return agent == NULL ? raise_gone(GONE_AGENT) : raise_status(status, NULL);
    }
    return out;
}

/* write_storage(index, offset, data): data is any buffer of host memory. */
static PyObject *agent_write_storage(AgentObject *self, PyObject *args)
{
    kvx_agent_t *agent;
    Py_ssize_t index;
    unsigned long long offset;
    Py_buffer data;
    kvx_status_t status = KVX_OK;

    if (!PyArg_ParseTuple(args, "nO&y*", &index, uint64_convert, &offset, &data))
        return NULL;
    if (index < 0) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "write_storage: a negative index");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    if (agent != NULL)
        status = kvx_agent_storage_write(agent, (size_t)index, offset, data.buf, (size_t)data.len);
    agent_leave(self);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (agent == NULL)
        return raise_gone(GONE_AGENT);
    if (status != KVX_OK)
        return raise_status(status, NULL);
    Py_RETURN_NONE;
}

/* token bytes (KVX_TOKEN_LEN) into *token; -1 with an exception otherwise. */
static int token_convert(PyObject *obj, kvx_token_t *token)
{
    Py_buffer b;

    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) != 0)
        return -1;
    if (b.len != KVX_TOKEN_LEN) {
        PyErr_Format(PyExc_ValueError, "token: %zd bytes, not %d", b.len, KVX_TOKEN_LEN);
        PyBuffer_Release(&b);
        return -1;
    }
    memcpy(token->bytes, b.buf, KVX_TOKEN_LEN);
    PyBuffer_Release(&b);
    return 0;
}

static PyObject *agent_hold(AgentObject *self, PyObject *args)
{
    kvx_agent_t *agent;
    unsigned long long request_id;
    PyObject *blocks;
    PyObject *token_obj;
    unsigned int consumers;
    struct ids ids;
    kvx_token_t token;
    kvx_status_t status = KVX_OK;

    if (!PyArg_ParseTuple(args, "O&OO&O", uint64_convert, &request_id, &blocks,
                          uint32_convert, &consumers, &token_obj) ||
        token_convert(token_obj, &token) != 0 || ids_convert(blocks, &ids) != 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    if (agent != NULL)
        status = kvx_hold(agent, request_id, ids.groups, ids.num_groups, consumers, &token);
    agent_leave(self);
    Py_END_ALLOW_THREADS
    ids_free(&ids);
    if (agent == NULL)
        return raise_gone(GONE_AGENT);
    if (status != KVX_OK)
        return raise_status(status, NULL);
    Py_RETURN_NONE;
}

/* connect(addresses): a Peer of every prefill rank in the sequence, connected in order under
 * one hold of the lock (other threads wait for the handshakes); none is kept when one fails. */
static PyObject *agent_connect(AgentObject *self, PyObject *arg)
{
    kvx_agent_t *agent;
    PyObject *seq;
    PeerObject *peer;
    const char *addresses[KVX_MAX_TP];
    Py_ssize_t n;
    kvx_status_t status = KVX_OK;

    if ((seq = PySequence_Fast(arg, "connect: a sequence of addresses")) == NULL)
        return NULL;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > KVX_MAX_TP) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "connect: %zd addresses (1..%d)", n, KVX_MAX_TP);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* UTF-8 kept by the strings, which `seq` holds */
        if ((addresses[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i))) == NULL) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    peer = PyObject_New(PeerObject, &PeerType);
    if (peer == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_INCREF(self);
    peer->agent     = self;
    peer->link      = (struct link){NULL, NULL};
    peer->num_peers = 0;
    peer->xfers     = 0;
    peer->peers     = calloc((size_t)n, sizeof(*peer->peers));
    if (peer->peers == NULL) {
        Py_DECREF(seq);
        Py_DECREF(peer);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self);
    for (Py_ssize_t i = 0; agent != NULL && i < n && status == KVX_OK; i++) {
        status = kvx_agent_connect(agent, addresses[i], &peer->peers[i]);
        if (status == KVX_OK)
            peer->num_peers++;
    }
    if (agent != NULL && status == KVX_OK)
        link_insert(&self->peers, &peer->link); /* close() destroys it from now on */
    else
        peer_destroy_locked(peer); /* the ranks connected so far */
    agent_leave(self);
    Py_END_ALLOW_THREADS
    Py_DECREF(seq);
    if (agent == NULL || status != KVX_OK) {
        agent == NULL ? raise_gone(GONE_AGENT) : raise_status(status, NULL);
        Py_DECREF(peer);
        return NULL;
    }
    return (PyObject *)peer;
}

static PyMethodDef agent_methods[] = {
    {"close", (PyCFunction)agent_close, METH_NOARGS,
     "close the agent for every thread; idempotent"},
    {"listen_address", (PyCFunction)agent_listen_address, METH_NOARGS, "HOST:PORT bound"},
    {"progress", (PyCFunction)agent_progress, METH_O, "run the loop up to TIMEOUT_MS"},
    {"fileno", (PyCFunction)agent_fileno, METH_NOARGS, "the descriptor to wait on"},
    {"start_progress_thread", (PyCFunction)agent_start_progress_thread, METH_NOARGS,
     "run the agent's loop on a native thread until close()"},
    {"stats", (PyCFunction)agent_stats, METH_NOARGS, "the counters, as a dict"},
    {"released", (PyCFunction)agent_released, METH_NOARGS,
     "request ids released since the last call"},
    {"logs", (PyCFunction)agent_logs, METH_NOARGS, "log lines since the last call"},
    {"storage", (PyCFunction)agent_storage, METH_O, "storage INDEX as a writable memoryview"},
    {"read_storage", (PyCFunction)agent_read_storage, METH_VARARGS,
     "read_storage(index, offset, nbytes) -> bytes"},
    {"write_storage", (PyCFunction)agent_write_storage, METH_VARARGS,
     "write_storage(index, offset, data)"},
    {"hold", (PyCFunction)agent_hold, METH_VARARGS, "hold(request_id, blocks, consumers, token)"},
    {"connect", (PyCFunction)agent_connect, METH_O, "connect to a prefill agent at HOST:PORT"},
    {NULL, NULL, 0, NULL},
};

/* close(): destroys the peer's connections; refused while a Transfer of it exists. Nothing to
 * do once the agent is closed. */
static PyObject *peer_close(PeerObject *self, PyObject *unused)
{
    kvx_agent_t *agent;
    bool refused = false;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    agent = agent_enter(self->agent);
    if (agent != NULL && self->xfers > 0)
        refused = true;
    else if (agent != NULL)
        peer_destroy_locked(self);
    agent_leave(self->agent);
    Py_END_ALLOW_THREADS
    if (refused) {
        PyErr_SetString(PyExc_RuntimeError, "the peer has transfers: let them go first");
        return NULL;
    }
    Py_RETURN_NONE;
}

static void peer_dealloc(PeerObject *self)
{
    /* transfers hold a reference: none is left */
    if (self->agent != NULL) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->agent->lock);
        /* alive until close()'s teardown, even once `closed` is set: it must not be freed
         * listed */
        if (self->link.next != NULL)
            peer_destroy_locked(self);
        agent_leave(self->agent);
        Py_END_ALLOW_THREADS
    }
    free(self->peers);
    Py_XDECREF(self->agent);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* post(push, blocks, remote_blocks, request_id, token): a Transfer of one request from every
 * rank of the peer, posted (kvx_read_post or kvx_write_post; a push's first registration
 * waits, with the GIL released). The ids are copied by kvx. */
static PyObject *peer_post(PeerObject *self, PyObject *args)
{
    int push;
    PyObject *blocks;
    PyObject *remote_blocks;
    unsigned long long request_id;
    PyObject *token_obj;
    struct ids local;
    struct ids remote = {0};
    kvx_token_t token;
    kvx_request_t request;
    kvx_xfer_t *handle = NULL;
    XferObject *xfer;
    kvx_status_t status = KVX_OK;
    kvx_agent_t *agent;
    enum gone gone;

    if (!PyArg_ParseTuple(args, "pOOO&O", &push, &blocks, &remote_blocks, uint64_convert,
                          &request_id, &token_obj))
        return NULL;
    if (token_obj != Py_None && token_convert(token_obj, &token) != 0)
        return NULL;
    if (ids_convert(blocks, &local) != 0)
        return NULL;
    if (remote_blocks != Py_None && ids_convert(remote_blocks, &remote) != 0) {
        ids_free(&local);
        return NULL;
    }
    xfer = PyObject_New(XferObject, &XferType);
    if (xfer == NULL) {
        ids_free(&local);
        ids_free(&remote);
        return NULL;
    }
    Py_INCREF(self);
    xfer->peer = self;
    xfer->xfer = NULL;
    xfer->link = (struct link){NULL, NULL};
    request    = (kvx_request_t){local.groups, local.num_groups,
                              remote_blocks != Py_None ? remote.groups : NULL, remote.num_groups,
                              token_obj != Py_None ? &token : NULL};
    Py_BEGIN_ALLOW_THREADS
    agent = peer_enter(self, &gone);
    if (agent != NULL) {
        status = push ? kvx_write_post(agent, self->peers, self->num_peers, request_id, &request,
                                       NULL, NULL, &handle)
                      : kvx_read_post(agent, self->peers, self->num_peers, request_id, &request,
                                      NULL, NULL, &handle);
        if (status == KVX_OK) {
            xfer->xfer = handle;
            self->xfers++;
            link_insert(&self->agent->xfers, &xfer->link);
        }
    }
    agent_leave(self->agent);
    if (agent != NULL && status == KVX_OK)
        wake_pollers(self->agent); /* a sleeper keeps its sleeps short now (agent_busy) */
    Py_END_ALLOW_THREADS
    ids_free(&local);
    ids_free(&remote);
    if (agent == NULL || status != KVX_OK) {
        Py_DECREF(xfer);
        return agent == NULL ? raise_gone(gone) : raise_status(status, NULL);
    }
    return (PyObject *)xfer;
}

/* One rank's transports and down reason, copied out under the lock. */
struct rank_info {
    char *transports;
    char *down; /* NULL while up */
};

/* info(): [(transports, down reason or None)] by rank. */
static PyObject *peer_info(PeerObject *self, PyObject *unused)
{
    struct rank_info info[KVX_MAX_TP] = {{0}};
    size_t n                          = 0;
    bool copied                       = true;
    PyObject *list                    = NULL;
    kvx_agent_t *agent;
    enum gone gone;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    agent = peer_enter(self, &gone);
    for (; agent != NULL && n < self->num_peers; n++) {
        const char *down = kvx_peer_down_reason(self->peers[n]);

        info[n].transports = strdup(kvx_peer_transports(self->peers[n]));
        info[n].down       = down != NULL ? strdup(down) : NULL;
        copied &= info[n].transports != NULL && (down == NULL || info[n].down != NULL);
    }
    agent_leave(self->agent);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        raise_gone(gone);
    else if (!copied)
        PyErr_NoMemory();
    else
        list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        PyObject *item = Py_BuildValue("(sz)", info[i].transports, info[i].down);

        if (item == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    for (size_t i = 0; i < n; i++) {
        free(info[i].transports);
        free(info[i].down);
    }
    return list;
}

/* reconnect(): every rank that is down handshakes again. */
static PyObject *peer_reconnect(PeerObject *self, PyObject *unused)
{
    kvx_status_t status = KVX_OK;
    kvx_agent_t *agent;
    enum gone gone;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    agent = peer_enter(self, &gone);
    for (size_t i = 0; agent != NULL && i < self->num_peers && status == KVX_OK; i++) {
        if (kvx_peer_down_reason(self->peers[i]) != NULL)
            status = kvx_peer_reconnect(self->peers[i]);
    }
    agent_leave(self->agent);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(gone);
    if (status != KVX_OK)
        return raise_status(status, NULL);
    Py_RETURN_NONE;
}

/* want(request_id, token): the request is still wanted from these prefill ranks: the agent's
 * heartbeats keep its holds' leases alive until a transfer of it completes or unwant(). */
static PyObject *peer_want(PeerObject *self, PyObject *args)
{
    unsigned long long request_id;
    PyObject *token_obj;
    kvx_token_t token;
    kvx_status_t status = KVX_OK;
    kvx_agent_t *agent;
    enum gone gone;

    if (!PyArg_ParseTuple(args, "O&O", uint64_convert, &request_id, &token_obj) ||
        token_convert(token_obj, &token) != 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    agent = peer_enter(self, &gone);
    if (agent != NULL)
        status = kvx_want(agent, self->peers, self->num_peers, request_id, &token);
    agent_leave(self->agent);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(gone);
    if (status != KVX_OK)
        return raise_status(status, NULL);
    Py_RETURN_NONE;
}

/* unwant(request_id): no more heartbeats for it (an abort); its holds end at their leases. */
static PyObject *peer_unwant(PeerObject *self, PyObject *arg)
{
    unsigned long long request_id = PyLong_AsUnsignedLongLong(arg);
    kvx_agent_t *agent;
    enum gone gone;

    if (PyErr_Occurred())
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    agent = peer_enter(self, &gone);
    if (agent != NULL)
        kvx_unwant(agent, self->peers, self->num_peers, request_id);
    agent_leave(self->agent);
    Py_END_ALLOW_THREADS
    if (agent == NULL)
        return raise_gone(gone);
    Py_RETURN_NONE;
}

static PyMethodDef peer_methods[] = {
    {"close", (PyCFunction)peer_close, METH_NOARGS, "destroy the peer's connections"},
    {"post", (PyCFunction)peer_post, METH_VARARGS, "post a pull or push: a Transfer"},
    {"info", (PyCFunction)peer_info, METH_NOARGS, "[(transports, down reason)] by rank"},
    {"reconnect", (PyCFunction)peer_reconnect, METH_NOARGS, "handshake again where down"},
    {"want", (PyCFunction)peer_want, METH_VARARGS, "want(request_id, token): heartbeat it"},
    {"unwant", (PyCFunction)peer_unwant, METH_O, "unwant(request_id): heartbeat it no more"},
    {NULL, NULL, 0, NULL},
};

/* release(): lets the C transfer go now (one in progress is cancelled, its peers'
 * connections closed before this returns); later calls but release raise. Nothing to do once
 * the agent is closed. */
static PyObject *xfer_release(XferObject *self, PyObject *unused)
{
    AgentObject *agent = self->peer->agent;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&agent->lock);
    /* alive until close()'s teardown, even once `closed` is set: it must not be freed listed */
    if (self->xfer != NULL)
        xfer_destroy_locked(self);
    agent_leave(agent);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void xfer_dealloc(XferObject *self)
{
    Py_XDECREF(xfer_release(self, NULL));
    Py_XDECREF(self->peer);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* status(): (status, message): KVX_INPROGRESS (1), 0, or the failure. */
static PyObject *xfer_status(XferObject *self, PyObject *unused)
{
    kvx_xfer_t *xfer;
    kvx_status_t status = KVX_OK;
    char *message       = NULL;
    enum gone gone;
    PyObject *result;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    xfer = xfer_enter(self, &gone);
    if (xfer != NULL && (status = kvx_xfer_status(xfer)) < 0)
        message = strdup(kvx_xfer_error(xfer));
    agent_leave(self->peer->agent);
    Py_END_ALLOW_THREADS
    if (xfer == NULL)
        return raise_gone(gone);
    if (status < 0 && message == NULL)
        return PyErr_NoMemory();
    result = Py_BuildValue("(is)", (int)status, message != NULL ? message : "");
    free(message);
    return result;
}

/* wait(): progresses the agent until the transfer settles (GIL released, and the lock between
 * turns, as progress()); its status. */
static PyObject *xfer_wait(XferObject *self, PyObject *unused)
{
    kvx_status_t status = KVX_INPROGRESS;
    kvx_status_t looped;
    enum gone gone;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    /* the transfer's deadline ends it: UINT64_MAX is never reached */
    looped = agent_loop(self->peer->agent, self, UINT64_MAX, &status, &gone);
    Py_END_ALLOW_THREADS
    if (looped != KVX_OK)
        return raise_gone(gone);
    return PyLong_FromLong((long)status);
}

static PyObject *xfer_stats(XferObject *self, PyObject *unused)
{
    kvx_read_stats_t stats;
    kvx_xfer_t *xfer;
    enum gone gone;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    xfer = xfer_enter(self, &gone);
    if (xfer != NULL)
        kvx_xfer_stats(xfer, &stats);
    agent_leave(self->peer->agent);
    Py_END_ALLOW_THREADS
    if (xfer == NULL)
        return raise_gone(gone);
    return Py_BuildValue("(KKKd)", (unsigned long long)stats.descriptors,
                         (unsigned long long)stats.posted, (unsigned long long)stats.bytes,
                         stats.seconds);
}

/* verify(): kvx_xfer_verify, with the GIL released (a completed transfer is verified now, the
 * lock held meanwhile): (status, message); verify_result() has the details. */
static PyObject *xfer_verify(XferObject *self, PyObject *unused)
{
    kvx_status_t status = KVX_OK;
    kvx_xfer_t *xfer;
    enum gone gone;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    xfer = xfer_enter(self, &gone);
    if (xfer != NULL)
        status = kvx_xfer_verify(xfer);
    agent_leave(self->peer->agent);
    Py_END_ALLOW_THREADS
    if (xfer == NULL)
        return raise_gone(gone);
    if (status == KVX_ERR_INVALID) /* not a verifiable transfer: a mistake of the caller's */
        return raise_status(status, NULL);
    return Py_BuildValue("(is)", (int)status, status == KVX_OK ? "" : kvx_errmsg());
}

/* A transfer's verification result, copied out under the lock with the names it points to:
 * the transfer, and the agent's region table, may be gone before Python reads them. */
struct mismatch_copy {
    kvx_verify_mismatch_t m; /* its region_name and views are not to be read: */
    char *region_name;
    char **view_names; /* m.num_views */
};

struct verify_copy {
    kvx_verify_result_t r;          /* its reported is not to be read: */
    struct mismatch_copy *reported; /* r.num_reported */
};

static void verify_copy_free(struct verify_copy *c)
{
    for (size_t i = 0; c->reported != NULL && i < c->r.num_reported; i++) {
        struct mismatch_copy *m = &c->reported[i];

        free(m->region_name);
        for (size_t v = 0; m->view_names != NULL && v < m->m.num_views; v++)
            free(m->view_names[v]);
        free(m->view_names);
    }
    free(c->reported);
    c->reported = NULL;
}

static char *strdup_or_empty(const char *s)
{
    return strdup(s != NULL ? s : "");
}

/* Lock held; false when out of memory (verify_copy_free frees what was copied). */
static bool verify_copy(const kvx_agent_t *agent, const kvx_xfer_t *xfer, struct verify_copy *c)
{
    const kvx_regions_t *regions = kvx_agent_regions(agent);
    bool copied;

    kvx_xfer_verify_result(xfer, &c->r);
    c->reported = calloc(c->r.num_reported > 0 ? c->r.num_reported : 1, sizeof(*c->reported));
    copied      = c->reported != NULL;
    for (size_t i = 0; copied && i < c->r.num_reported; i++) {
        const kvx_verify_mismatch_t *from = &c->r.reported[i];
        struct mismatch_copy *to          = &c->reported[i];

        to->m           = *from;
        to->region_name = strdup_or_empty(from->region_name);
        to->view_names  = calloc(from->num_views > 0 ? from->num_views : 1, sizeof(char *));
        copied          = to->region_name != NULL && to->view_names != NULL;
        for (size_t v = 0; copied && v < from->num_views; v++)
            copied = (to->view_names[v] =
                          strdup_or_empty(kvx_regions_view_name(regions, from->views[v]))) != NULL;
    }
    if (c->reported == NULL)
        c->r.num_reported = 0;
    c->r.reported = NULL;
    return copied;
}

/* One reported mismatch as a dict, its views by name. */
static PyObject *mismatch_dict(const struct mismatch_copy *copy)
{
    const kvx_verify_mismatch_t *m = &copy->m;
    PyObject *views                = PyList_New((Py_ssize_t)m->num_views);

    for (size_t v = 0; views != NULL && v < m->num_views; v++) {
        PyObject *name = PyUnicode_FromString(copy->view_names[v]);

        if (name == NULL)
            Py_CLEAR(views);
        else
            PyList_SET_ITEM(views, (Py_ssize_t)v, name);
    }
    if (views == NULL)
        return NULL;
    return Py_BuildValue(
        "{s:n,s:s,s:N,s:K,s:K,s:I,s:K,s:(IK),s:(IK),s:K,s:K,s:K}", "region",
        m->region == SIZE_MAX ? (Py_ssize_t)-1 : (Py_ssize_t)m->region, "region_name",
        copy->region_name, "views", views, "block", (unsigned long long)m->block, "descriptor",
        (unsigned long long)m->descriptor, "remote_rank", (unsigned)m->remote_rank, "remote_block",
        (unsigned long long)m->remote_block, "local", (unsigned)m->range.local_storage,
        (unsigned long long)m->range.local_offset, "remote", (unsigned)m->range.remote_storage,
        (unsigned long long)m->range.remote_offset, "len", (unsigned long long)m->range.len,
        "local_checksum", (unsigned long long)m->local_checksum, "remote_checksum",
        (unsigned long long)m->remote_checksum);
}

/* verify_result(): None without a verification, else (status, segments, bytes, mismatches,
 * seconds, [the reported mismatches as dicts]). */
static PyObject *xfer_verify_result(XferObject *self, PyObject *unused)
{
    struct verify_copy c = {0};
    bool copied          = false;
    kvx_xfer_t *xfer;
    enum gone gone;
    PyObject *reported = NULL;
    PyObject *result   = NULL;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    xfer = xfer_enter(self, &gone);
    if (xfer != NULL)
        copied = verify_copy(self->peer->agent->agent, xfer, &c);
    agent_leave(self->peer->agent);
    Py_END_ALLOW_THREADS
    if (xfer == NULL)
        return raise_gone(gone);
    if (!copied) {
        PyErr_NoMemory();
        goto cleanup;
    }
    if (!c.r.requested) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto cleanup;
    }
    reported = PyList_New((Py_ssize_t)c.r.num_reported);
    for (size_t i = 0; reported != NULL && i < c.r.num_reported; i++) {
        PyObject *m = mismatch_dict(&c.reported[i]);

        if (m == NULL)
            Py_CLEAR(reported);
        else
            PyList_SET_ITEM(reported, (Py_ssize_t)i, m);
    }
    if (reported != NULL)
        result = Py_BuildValue("(iKKKdN)", (int)c.r.status, (unsigned long long)c.r.segments,
                               (unsigned long long)c.r.bytes, (unsigned long long)c.r.mismatches,
                               c.r.seconds, reported);

cleanup:
    verify_copy_free(&c);
    return result;
}

/* A failed transfer's block ids, copied out under the lock. */
struct groups_copy {
    kvx_group_ids_t *groups;
    size_t num_groups;
};

static void groups_copy_free(struct groups_copy *c)
{
    for (size_t g = 0; c->groups != NULL && g < c->num_groups; g++)
        free((void *)c->groups[g].ids);
    free(c->groups);
    c->groups = NULL;
}

/* Lock held; false when out of memory (groups_copy_free frees what was copied). */
static bool groups_copy(const kvx_xfer_t *xfer, struct groups_copy *c)
{
    const kvx_group_ids_t *groups;
    bool copied;

    kvx_xfer_failed_blocks(xfer, &groups, &c->num_groups);
    c->groups = calloc(c->num_groups > 0 ? c->num_groups : 1, sizeof(*c->groups));
    copied    = c->groups != NULL;
    for (size_t g = 0; copied && g < c->num_groups; g++) {
        uint64_t *ids = malloc((groups[g].count > 0 ? groups[g].count : 1) * sizeof(*ids));

        if ((copied = ids != NULL)) {
            memcpy(ids, groups[g].ids, groups[g].count * sizeof(*ids));
            c->groups[g] = (kvx_group_ids_t){ids, groups[g].count};
        }
    }
    return copied;
}

/* failed_blocks(): {group: [ids]} that a failed transfer did not load ({} unless failed). */
static PyObject *xfer_failed_blocks(XferObject *self, PyObject *unused)
{
    struct groups_copy c = {0};
    bool copied          = false;
    kvx_xfer_t *xfer;
    enum gone gone;
    PyObject *dict = NULL;

    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    xfer = xfer_enter(self, &gone);
    if (xfer != NULL)
        copied = groups_copy(xfer, &c);
    agent_leave(self->peer->agent);
    Py_END_ALLOW_THREADS
    if (xfer == NULL)
        return raise_gone(gone);
    if (copied)
        dict = PyDict_New();
    else
        PyErr_NoMemory();
    for (size_t g = 0; dict != NULL && g < c.num_groups; g++) {
        const kvx_group_ids_t *group = &c.groups[g];
        PyObject *ids                = PyList_New((Py_ssize_t)group->count);
        PyObject *key                = PyLong_FromSize_t(g);

        for (size_t i = 0; ids != NULL && i < group->count; i++) {
            PyObject *id = PyLong_FromUnsignedLongLong(group->ids[i]);

            if (id == NULL)
                Py_CLEAR(ids);
            else
                PyList_SET_ITEM(ids, (Py_ssize_t)i, id);
        }
        if (ids == NULL || key == NULL || (group->count > 0 && PyDict_SetItem(dict, key, ids)))
            Py_CLEAR(dict);
        Py_XDECREF(ids);
        Py_XDECREF(key);
    }
    groups_copy_free(&c);
    return dict;
}

static PyMethodDef xfer_methods[] = {
    {"status", (PyCFunction)xfer_status, METH_NOARGS, "(status, message)"},
    {"wait", (PyCFunction)xfer_wait, METH_NOARGS, "progress until settled; the status"},
    {"stats", (PyCFunction)xfer_stats, METH_NOARGS, "(descriptors, posted, bytes, seconds)"},
    {"failed_blocks", (PyCFunction)xfer_failed_blocks, METH_NOARGS, "{group: [ids]}"},
    {"verify", (PyCFunction)xfer_verify, METH_NOARGS, "kvx_xfer_verify: (status, message)"},
    {"verify_result", (PyCFunction)xfer_verify_result, METH_NOARGS,
     "None, or (status, segments, bytes, mismatches, seconds, [mismatches])"},
    {"release", (PyCFunction)xfer_release, METH_NOARGS, "let the C transfer go now"},
    {NULL, NULL, 0, NULL},
};

/* ---- the module ------------------------------------------------------------------------ */

static PyTypeObject LayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvx._kvx.Layout",
    .tp_basicsize                          = sizeof(LayoutObject),
    .tp_dealloc                            = (destructor)layout_dealloc,
    .tp_flags                              = Py_TPFLAGS_DEFAULT,
    .tp_methods                            = layout_methods,
};

static PyTypeObject RegionsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvx._kvx.Regions",
    .tp_basicsize                          = sizeof(RegionsObject),
    .tp_dealloc                            = (destructor)regions_dealloc,
    .tp_flags                              = Py_TPFLAGS_DEFAULT,
    .tp_as_sequence                        = &regions_sequence,
    .tp_methods                            = regions_methods,
};

static PyTypeObject AgentType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvx._kvx.Agent",
    .tp_basicsize                          = sizeof(AgentObject),
    .tp_dealloc                            = (destructor)agent_dealloc,
    .tp_flags                              = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_methods                            = agent_methods,
    .tp_init                               = (initproc)agent_init,
    .tp_new                                = agent_new,
};

static PyBufferProcs storage_buffer = {
    .bf_getbuffer     = (getbufferproc)storage_getbuffer,
    .bf_releasebuffer = (releasebufferproc)storage_releasebuffer,
};

static PyTypeObject StorageType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvx._kvx.Storage",
    .tp_basicsize                          = sizeof(StorageObject),
    .tp_dealloc                            = (destructor)storage_dealloc,
    .tp_flags                              = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer                          = &storage_buffer,
};

static PyTypeObject PeerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvx._kvx.Peer",
    .tp_basicsize                          = sizeof(PeerObject),
    .tp_dealloc                            = (destructor)peer_dealloc,
    .tp_flags                              = Py_TPFLAGS_DEFAULT,
    .tp_methods                            = peer_methods,
};

static PyTypeObject XferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvx._kvx.Transfer",
    .tp_basicsize                          = sizeof(XferObject),
    .tp_dealloc                            = (destructor)xfer_dealloc,
    .tp_flags                              = Py_TPFLAGS_DEFAULT,
    .tp_methods                            = xfer_methods,
};

static PyObject *mod_token_generate(PyObject *module, PyObject *unused)
{
    kvx_token_t token;
    kvx_status_t status = kvx_token_generate(&token);

    (void)module;
    (void)unused;
    if (status != KVX_OK)
        return raise_status(status, NULL);
    return PyBytes_FromStringAndSize((const char *)token.bytes, KVX_TOKEN_LEN);
}

static PyObject *mod_auth_key_load(PyObject *module, PyObject *arg)
{
    PyObject *path = NULL;
    uint8_t key[KVX_AUTH_KEY_LEN];
    kvx_status_t status;

    (void)module;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    status = kvx_auth_key_load(PyBytes_AS_STRING(path), key);
    Py_DECREF(path);
    if (status != KVX_OK)
        return raise_status(status, NULL);
    return PyBytes_FromStringAndSize((const char *)key, sizeof(key));
}

/* auth_file(file=None): kvx_auth_file's answer: `file` when given, else the file
 * KVX_AUTH_FILE names, else None. */
static PyObject *mod_auth_file(PyObject *module, PyObject *args)
{
    PyObject *given = Py_None;
    PyObject *path  = NULL;
    const char *file;
    PyObject *result;

    (void)module;
    if (!PyArg_ParseTuple(args, "|O:auth_file", &given))
        return NULL;
    if (given != Py_None && !PyUnicode_FSConverter(given, &path))
        return NULL;
    file = kvx_auth_file(path != NULL ? PyBytes_AS_STRING(path) : NULL);
    if (file == NULL) {
        Py_XDECREF(path);
        Py_RETURN_NONE;
    }
    result = PyUnicode_DecodeFSDefault(file);
    Py_XDECREF(path);
    return result;
}

static PyObject *mod_auth_key_generate(PyObject *module, PyObject *unused)
{
    uint8_t key[KVX_AUTH_KEY_LEN];
    kvx_status_t status = kvx_auth_key_generate(key);

    (void)module;
    (void)unused;
    if (status != KVX_OK)
        return raise_status(status, NULL);
    return PyBytes_FromStringAndSize((const char *)key, sizeof(key));
}

static PyObject *mod_ucx_version(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyUnicode_FromString(kvx_ucx_version());
}

/* DLPack's tensor (dlpack.h, its ABI stable since v0.6), spelled out here: the first member of
 * the DLManagedTensor a "dltensor" capsule holds. */
struct dlpack_tensor {
    void *data;
    int32_t device_type; /* kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3, ... */
    int32_t device_id;
    int32_t ndim;
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL: C-contiguous */
    uint64_t byte_offset;
};

/* dlpack_memory(capsule) -> (address, bytes, device_type, device_id) of a C-contiguous
 * tensor, read from the capsule in place: the capsule and its producer stay the owners. */
static PyObject *mod_dlpack_memory(PyObject *module, PyObject *capsule)
{
    const struct dlpack_tensor *t = PyCapsule_GetPointer(capsule, "dltensor");
    uint64_t bytes;
    uint64_t expected = 1; /* the stride of dimension d if C-contiguous, in elements */

    (void)module;
    if (t == NULL)
        return NULL;
    if (t->bits == 0 || t->bits % 8 != 0 || t->lanes != 1 || t->ndim < 0 ||
        (t->ndim > 0 && t->shape == NULL)) {
        PyErr_SetString(PyExc_ValueError, "DLPack: elements of whole bytes and one lane only");
        return NULL;
    }
    bytes = t->bits / 8;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)t->shape[d], &bytes)) {
            PyErr_SetString(PyExc_ValueError, "DLPack: a shape out of range");
            return NULL;
        }
        if (t->strides != NULL && t->shape[d] > 1 && (uint64_t)t->strides[d] != expected) {
            PyErr_SetString(PyExc_ValueError, "DLPack: the tensor is not C-contiguous");
            return NULL;
        }
        expected *= (uint64_t)t->shape[d];
    }
    return Py_BuildValue("KKii", (unsigned long long)((uintptr_t)t->data + t->byte_offset),
                         (unsigned long long)bytes, (int)t->device_type, (int)t->device_id);
}

static PyMethodDef module_methods[] = {
    {"dlpack_memory", mod_dlpack_memory, METH_O, "(address, bytes, device_type, device_id)"},
    {"layout_load", mod_layout_load, METH_O, "a layout file"},
    {"layout_from_json", mod_layout_from_json, METH_O, "a layout from JSON text or bytes"},
    {"token_generate", mod_token_generate, METH_NOARGS, "a new random hold token"},
    {"auth_key_load", mod_auth_key_load, METH_O, "the secret of a key file"},
    {"auth_file", mod_auth_file, METH_VARARGS,
     "auth_file(file=None): file if given, else the file KVX_AUTH_FILE names, else None"},
    {"auth_key_generate", mod_auth_key_generate, METH_NOARGS, "a new random secret"},
    {"ucx_version", mod_ucx_version, METH_NOARGS, "the version of the UCX library loaded"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_kvx",
    "kvx's C extension: use the kvx package",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__kvx(void);

PyMODINIT_FUNC PyInit__kvx(void)
{
    PyTypeObject *types[] = {&LayoutType, &RegionsType, &AgentType, &PeerType, &XferType};
    PyObject *m;

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i]) != 0)
            return NULL;
    }
    if (PyType_Ready(&StorageType) != 0) /* made by Agent.storage only */
        return NULL;
    m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    error_base = PyErr_NewExceptionWithDoc(
        "kvx.Error", "A kvx call failed: args are (message, status)", NULL, NULL);
    if (error_base == NULL || PyModule_AddObject(m, "Error", error_base) != 0)
        return NULL;
    Py_INCREF(error_base);
    if (PyModule_AddStringConstant(m, "AUTH_FILE_ENV", KVX_AUTH_FILE_ENV) != 0 ||
        PyModule_AddIntConstant(m, "DEFAULT_TIMEOUT_MS", KVX_DEFAULT_TIMEOUT_MS) != 0)
        return NULL;
    for (size_t i = 0; i < sizeof(error_types) / sizeof(error_types[0]); i++) {
        char name[64];

        snprintf(name, sizeof(name), "kvx.%s", error_types[i].name);
        error_types[i].type = PyErr_NewException(name, error_base, NULL);
        if (error_types[i].type == NULL ||
            PyModule_AddObject(m, error_types[i].name, error_types[i].type) != 0)
            return NULL;
        Py_INCREF(error_types[i].type);
    }
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, types[i]->tp_name + strlen("kvx._kvx."), (PyObject *)types[i]) !=
            0)
            return NULL;
    }
    return m;
}

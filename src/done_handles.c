/* done_handles.c: the table of done handles (done_handles.h). A handle's first 4 bytes name
 * its slot, so a done finds its connection with one comparison, in constant time. */
#include "done_handles.h"

#include "auth.h"
#include "error.h"
#include "gate_monitor.h"

#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

struct done_slot {
    uint64_t conn; /* 0: free */
    struct done_conn_mark mark;
    uint8_t handle[DONE_HANDLE_LEN];
};

struct done_handles {
    struct done_slot slots[DONE_HANDLES_MAX];
    uint32_t next;   /* the slot handed out next when none is free and none closed */
    uint32_t issued; /* new handles since the last look for closed connections */
};

struct done_conn_mark done_conn_mark(int fd)
{
    return (struct done_conn_mark){.fd = fd, .cookie = fd >= 0 ? gate_monitor_cookie(fd) : 0};
}

bool done_conn_closed(const struct done_conn_mark *mark)
{
    return mark->fd >= 0 && (mark->cookie == 0 || gate_monitor_cookie(mark->fd) != mark->cookie);
}

/* Frees the slot of every connection that closed since its handle was issued; returns the
 * first slot free then, or NULL when every connection is open still. */
static struct done_slot *done_handles_sweep(struct done_handles *t)
{
    struct done_slot *free_slot = NULL;

    t->issued = 0;
    for (uint32_t index = 0; index < DONE_HANDLES_MAX; index++) {
        struct done_slot *slot = &t->slots[index];

        if (done_conn_closed(&slot->mark)) {
            slot->conn = 0;
            if (free_slot == NULL)
                free_slot = slot;
        }
    }
    return free_slot;
}

kvx_status_t done_handle_issue(struct done_handles **table, uint64_t conn,
                               const struct done_conn_mark *mark, uint8_t handle[DONE_HANDLE_LEN])
{
    struct done_handles *t = *table;
    struct done_slot *slot = NULL;
    uint32_t index;

    if (t == NULL && (t = *table = calloc(1, sizeof(*t))) == NULL)
        return error_no_memory("done handles");
    for (index = 0; index < DONE_HANDLES_MAX; index++) {
        if (t->slots[index].conn == conn) { /* asked again: the same */
            memcpy(handle, t->slots[index].handle, DONE_HANDLE_LEN);
            return KVX_OK;
        }
        if (slot == NULL && t->slots[index].conn == 0)
            slot = &t->slots[index];
    }
    if (slot == NULL && t->issued >= DONE_HANDLES_MAX / 2)
        slot = done_handles_sweep(t);
    if (slot == NULL) {
        slot    = &t->slots[t->next];
        t->next = (t->next + 1) % DONE_HANDLES_MAX;
    }
    index = (uint32_t)(slot - t->slots);
    memcpy(slot->handle, &index, sizeof(index));
    if (RAND_bytes(slot->handle + sizeof(index), DONE_HANDLE_LEN - (int)sizeof(index)) != 1) {
        slot->conn = 0;
        return error_set(KVX_ERR_INTERNAL, "done handle: the system's random source failed");
    }
    slot->conn = conn;
    slot->mark = *mark;
    t->issued++;
    memcpy(handle, slot->handle, DONE_HANDLE_LEN);
    return KVX_OK;
}

bool done_handle_conn(const struct done_handles *table, const uint8_t handle[DONE_HANDLE_LEN],
                      uint64_t *conn_p)
{
    const struct done_slot *slot;
    uint32_t index;

    memcpy(&index, handle, sizeof(index));
    if (table == NULL || index >= DONE_HANDLES_MAX)
        return false;
    slot = &table->slots[index];
    if (slot->conn == 0 || !auth_equal(slot->handle, handle, DONE_HANDLE_LEN))
        return false;
    *conn_p = slot->conn;
    return true;
}

void done_handles_free(struct done_handles *table)
{
    free(table);
}

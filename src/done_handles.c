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
    uint8_t key[MSG_MAC_KEY_LEN];
    struct msg_mac *mac; /* the key's state, kept while the slot is */
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
                               const struct done_conn_mark *mark, uint8_t handle[DONE_HANDLE_LEN],
                               uint8_t key[MSG_MAC_KEY_LEN])
{
    struct done_handles *t = *table;
    struct done_slot *slot = NULL;
    uint32_t index;

    if (t == NULL && (t = *table = calloc(1, sizeof(*t))) == NULL)
        return error_no_memory("done handles");
    for (index = 0; index < DONE_HANDLES_MAX; index++) {
        if (t->slots[index].conn == conn) { /* asked again: the same */
            memcpy(handle, t->slots[index].handle, DONE_HANDLE_LEN);
            memcpy(key, t->slots[index].key, MSG_MAC_KEY_LEN);
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
    index      = (uint32_t)(slot - t->slots);
    slot->conn = 0;
    msg_mac_destroy(slot->mac);
    slot->mac = NULL;
    memcpy(slot->handle, &index, sizeof(index));
    if (RAND_bytes(slot->handle + sizeof(index), DONE_HANDLE_LEN - (int)sizeof(index)) != 1)
        return error_set(KVX_ERR_INTERNAL, "done handle: the system's random source failed");
    if (msg_mac_new_key(slot->key, &slot->mac) != KVX_OK)
        return KVX_ERR_INTERNAL;
    slot->conn = conn;
    slot->mark = *mark;
    t->issued++;
    memcpy(handle, slot->handle, DONE_HANDLE_LEN);
    memcpy(key, slot->key, MSG_MAC_KEY_LEN);
    return KVX_OK;
}

enum done_handle_check done_handle_conn(const struct done_handles *table,
                                        const uint8_t handle[DONE_HANDLE_LEN],
                                        const uint8_t tag[MSG_MAC_LEN], const void *done,
                                        size_t size, uint64_t *conn_p)
{
    const struct done_slot *slot;
    uint32_t index;

    memcpy(&index, handle, sizeof(index));
    if (table == NULL || index >= DONE_HANDLES_MAX)
        return DONE_HANDLE_UNKNOWN;
    slot = &table->slots[index];
    if (slot->conn == 0 || !auth_equal(slot->handle, handle, DONE_HANDLE_LEN))
        return DONE_HANDLE_UNKNOWN;
    if (!msg_mac_verify(slot->mac, done, size, tag))
        return DONE_HANDLE_FORGED;
    *conn_p = slot->conn;
    return DONE_HANDLE_OK;
}

void done_handles_free(struct done_handles *table)
{
    for (size_t i = 0; table != NULL && i < DONE_HANDLES_MAX; i++)
        msg_mac_destroy(table->slots[i].mac);
    free(table);
}

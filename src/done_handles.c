/* done_handles.c: the table of done handles (done_handles.h). A handle's first 4 bytes name
 * its slot, so a done finds its connection with one comparison, in constant time. */
#include "done_handles.h"

#include "auth.h"
#include "error.h"

#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

struct done_slot {
    uint64_t conn; /* 0: free */
    uint8_t handle[DONE_HANDLE_LEN];
};

struct done_handles {
    struct done_slot slots[DONE_HANDLES_MAX];
    uint32_t next; /* the slot handed out next when none is free: the oldest */
};

kvx_status_t done_handle_issue(struct done_handles **table, uint64_t conn,
                               uint8_t handle[DONE_HANDLE_LEN])
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

/* early.c: the list of dones and pushes waiting for their hold: a doubly linked list in
 * arrival order, so taking one out (its deadline) is O(1) and a hold finds its own in one
 * bounded scan; and how many wait per connection, a hash by connection with backward-shift
 * deletion, so a share is checked in O(1). Owns no entry: they live in what waits. */
#include "early.h"

#include <stdlib.h>

/* Slots of the per-connection counts: every entry could be of another connection, and a
 * table at most half full keeps probes short. */
#define EARLY_CONN_SLOTS (2 * EARLY_MAX)

struct early_conn {
    uint64_t conn; /* 0: free */
    uint32_t count;
};

/* Where conn's probe starts: Fibonacci hashing, as connection keys are small counters. */
static size_t early_conn_home(uint64_t conn)
{
    _Static_assert((EARLY_CONN_SLOTS & (EARLY_CONN_SLOTS - 1)) == 0, "a power of two");
    return (size_t)((conn * 0x9e3779b97f4a7c15u) >> 32) & (EARLY_CONN_SLOTS - 1);
}

/* conn's slot, or the free one its probe ends at. */
static struct early_conn *early_conn_find(const struct early_list *list, uint64_t conn)
{
    size_t i = early_conn_home(conn);

    while (list->conns[i].conn != 0 && list->conns[i].conn != conn)
        i = (i + 1) & (EARLY_CONN_SLOTS - 1);
    return &list->conns[i];
}

/* One entry of conn fewer; its slot is freed at none, and the slots after it shift back so
 * that every probe still finds its key (no tombstones to fill the table). */
static void early_conn_put(struct early_list *list, uint64_t conn)
{
    struct early_conn *c = early_conn_find(list, conn);
    size_t hole          = (size_t)(c - list->conns);

    if (c->conn == 0 || --c->count > 0)
        return;
    for (size_t i = (hole + 1) & (EARLY_CONN_SLOTS - 1); list->conns[i].conn != 0;
         i        = (i + 1) & (EARLY_CONN_SLOTS - 1)) {
        size_t home = early_conn_home(list->conns[i].conn);

        /* slot i may move to the hole when its home is not in (hole, i], cyclically */
        if (((i - home) & (EARLY_CONN_SLOTS - 1)) >= ((i - hole) & (EARLY_CONN_SLOTS - 1))) {
            list->conns[hole] = list->conns[i];
            hole              = i;
        }
    }
    list->conns[hole] = (struct early_conn){0};
}

size_t early_conn_count(const struct early_list *list, uint64_t conn)
{
    if (conn == 0 || list->conns == NULL)
        return 0;
    return early_conn_find(list, conn)->count;
}

bool early_park(struct early_list *list, struct early_entry *entry)
{
    struct early_conn *c = NULL;

    if (list->count >= EARLY_MAX)
        return false;
    if (entry->conn != 0) {
        if (list->conns == NULL &&
            (list->conns = calloc(EARLY_CONN_SLOTS, sizeof(*list->conns))) == NULL)
            return false;
        c = early_conn_find(list, entry->conn);
        if (c->count >= EARLY_PER_CONN)
            return false;
        c->conn = entry->conn;
        c->count++;
    }
    entry->prev = list->tail;
    entry->next = NULL;
    if (list->tail != NULL)
        list->tail->next = entry;
    else
        list->head = entry;
    list->tail    = entry;
    entry->parked = true;
    list->count++;
    list->parked++;
    return true;
}

void early_unpark(struct early_list *list, struct early_entry *entry)
{
    if (!entry->parked)
        return;
    if (entry->prev != NULL)
        entry->prev->next = entry->next;
    else
        list->head = entry->next;
    if (entry->next != NULL)
        entry->next->prev = entry->prev;
    else
        list->tail = entry->prev;
    entry->prev = entry->next = NULL;
    entry->parked             = false;
    list->count--;
    if (entry->conn != 0)
        early_conn_put(list, entry->conn);
}

/* The oldest entry of request_id, or NULL. */
static struct early_entry *early_find(const struct early_list *list, uint64_t request_id)
{
    for (struct early_entry *entry = list->head; entry != NULL; entry = entry->next) {
        if (entry->request_id == request_id)
            return entry;
    }
    return NULL;
}

size_t early_release(struct early_list *list, uint64_t request_id)
{
    struct early_entry *entry;
    size_t released = 0;

    /* From the head again after each: `held` may take other entries out (a push that fails
     * fails the other pushes of its writer), so no pointer into the list survives it. A
     * request has few entries (one per consumer rank), so this stays one scan or a few. */
    while ((entry = early_find(list, request_id)) != NULL) {
        early_unpark(list, entry);
        entry->held(entry);
        released++;
    }
    return released;
}

void early_list_free(struct early_list *list)
{
    free(list->conns);
    list->conns = NULL;
}

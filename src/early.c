/* early.c: the list of dones and pushes waiting for their hold: a doubly linked list in
 * arrival order, so taking one out (its deadline) is O(1) and a hold finds its own in one
 * bounded scan. Owns no memory: entries live in what waits. */
#include "early.h"

bool early_park(struct early_list *list, struct early_entry *entry)
{
    if (list->count >= EARLY_MAX)
        return false;
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

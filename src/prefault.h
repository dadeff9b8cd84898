/* prefault.h: fills in this process's page tables for memory a peer shares with it, on a
 * thread of its own, so that the first copy from a freshly mapped peer storage runs at the
 * speed of later ones instead of taking a page fault every 4 KiB. */
#ifndef KVX_SRC_PREFAULT_H
#define KVX_SRC_PREFAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct prefault;

struct prefault_range {
    uintptr_t start; /* page-aligned */
    size_t size;     /* bytes */
};

/* Starts populating `ranges` (copied) for reading, in chunks, first range first. Returns
 * NULL, and nothing runs, when there is nothing to do or no thread could be started; on a
 * kernel that cannot (Linux before 5.14 has no MADV_POPULATE_READ) the thread ends at its
 * first call. Copies then fault as before. */
struct prefault *prefault_start(const struct prefault_range *ranges, size_t num_ranges);

/* Stops after the chunk in progress (at most PREFAULT_CHUNK bytes, 4 MiB: well under a
 * millisecond) and joins the thread: the ranges may be unmapped once this returns.
 * NULL-safe. */
void prefault_stop(struct prefault *p);

/* The same without waiting, for a closing connection (a public call must not wait for a
 * chunk while other threads populate): asks the thread to stop after its chunk; once
 * prefault_ended says it did, prefault_stop joins it at once. NULL-safe (NULL has ended). */
void prefault_stop_begin(struct prefault *p);
bool prefault_ended(const struct prefault *p);

#endif

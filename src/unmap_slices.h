/* unmap_slices.h: takes a peer's shared memory segment out of this process's page tables a
 * slice at a time, once the connection that mapped it closes, so that the unmapping that
 * follows (UCX's, when the connection's keys go) has nothing left to tear down. Unmapping a
 * populated GiB took 25-85 ms here, inside kvx_xfer_destroy (issue 23: no public call but the
 * waits may block). No UCX calls. */
#ifndef KVX_SRC_UNMAP_SLICES_H
#define KVX_SRC_UNMAP_SLICES_H

#include "prefault.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes of page tables dropped in one turn: about 1.5 ms of the kernel's work here. */
#define UNMAP_SLICE ((size_t)64 << 20)

struct unmap_slices {
    const struct prefault_range *ranges; /* the mapped storages' ranges (not owned) */
    size_t num_ranges;
    size_t next;     /* the range being dropped */
    uintptr_t at;    /* where in it; 0: not started (its mapping not checked yet) */
    uintptr_t until; /* the end of the part of it that may be dropped */
};

/* Nothing dropped yet. */
void unmap_slices_start(struct unmap_slices *u, const struct prefault_range *ranges, size_t num);

/* Drops up to *budget bytes, taken off it; true while some are left. Only ever a shared memory
 * segment's mapping (SysV or POSIX, as /proc/self/maps names them): a range that a lying peer's
 * size stretched over other mappings of ours is cut at the segment's end, and a range that is no
 * segment's is left alone, since dropping a private mapping's pages would lose its data. What
 * is dropped is refaulted from the segment if it is touched again: nothing is lost. */
bool unmap_slices_run(struct unmap_slices *u, size_t *budget);

#endif

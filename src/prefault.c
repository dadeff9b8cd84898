/* prefault.c: see prefault.h. Populating is only ever an optimisation: every failure leaves
 * the pages to fault in on first touch, as they would without it. */
#define _DEFAULT_SOURCE /* madvise and MADV_POPULATE_READ */
#include "prefault.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Bytes populated per madvise call: prefault_stop waits for at most one, and closing a
 * connection (which stops it) is done from the loop, so it must be short: a fraction of a
 * millisecond here (issue 23: 64 MiB chunks held a close for their whole populate). The
 * system call per chunk costs nothing next to populating it. */
#define PREFAULT_CHUNK ((size_t)4 << 20)

/* The thread's stack: its loop needs little, and glibc keeps up to 40 MiB of stacks of ended
 * threads for reuse, beyond which a join unmaps one: 16 threads of the default 8 MiB made each
 * join wait for the process's memory map while the others populated (7 ms here). */
#define PREFAULT_STACK ((size_t)256 << 10)

struct prefault {
    pthread_t thread;
    atomic_bool stop;
    atomic_bool ended;
    size_t num_ranges;
    struct prefault_range ranges[];
};

static void prefault_ranges(const struct prefault *p)
{
#ifdef MADV_POPULATE_READ
    for (size_t r = 0; r < p->num_ranges; r++) {
        for (size_t done = 0; done < p->ranges[r].size; done += PREFAULT_CHUNK) {
            size_t size = p->ranges[r].size - done;

            if (atomic_load(&p->stop))
                return;
            if (madvise((void *)(p->ranges[r].start + done),
                        size < PREFAULT_CHUNK ? size : PREFAULT_CHUNK, MADV_POPULATE_READ) != 0)
                return; /* EINVAL on an older kernel, or the range changed: stop */
        }
    }
#else
    (void)p;
#endif
}

static void *prefault_run(void *arg)
{
    struct prefault *p = arg;

    prefault_ranges(p);
    atomic_store(&p->ended, true);
    return NULL;
}

struct prefault *prefault_start(const struct prefault_range *ranges, size_t num_ranges)
{
    struct prefault *p;
    pthread_attr_t attr;
    bool started;

    if (num_ranges == 0 || (p = malloc(sizeof(*p) + num_ranges * sizeof(*ranges))) == NULL)
        return NULL;
    atomic_init(&p->stop, false);
    atomic_init(&p->ended, false);
    p->num_ranges = num_ranges;
    memcpy(p->ranges, ranges, num_ranges * sizeof(*ranges));
    if (pthread_attr_init(&attr) != 0) {
        free(p);
        return NULL;
    }
    started = pthread_attr_setstacksize(&attr, PREFAULT_STACK) == 0 &&
              pthread_create(&p->thread, &attr, prefault_run, p) == 0;
    pthread_attr_destroy(&attr);
    if (!started) {
        free(p);
        return NULL;
    }
    return p;
}

void prefault_stop_begin(struct prefault *p)
{
    if (p != NULL)
        atomic_store(&p->stop, true);
}

bool prefault_ended(const struct prefault *p)
{
    return p == NULL || atomic_load(&p->ended);
}

void prefault_stop(struct prefault *p)
{
    if (p == NULL)
        return;
    atomic_store(&p->stop, true);
    pthread_join(p->thread, NULL);
    free(p);
}

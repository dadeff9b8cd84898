/* clock.h: the one monotonic clock of deadlines, leases and heartbeats, so every module
 * measures time the same way, and tests can move it forward instead of sleeping. */
#ifndef KVX_SRC_CLOCK_H
#define KVX_SRC_CLOCK_H

#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC plus whatever clock_advance_ms() added: what deadlines,
 * leases, heartbeats and idle times are measured on. */
uint64_t clock_ms(void);

/* Moves clock_ms() forward in this process (tests: a lease expires without a wall-clock
 * wait). Never backwards. Any thread. */
void clock_advance_ms(uint64_t ms);

/* Seconds of CLOCK_MONOTONIC, never advanced: what transfer timings are measured on. */
double clock_seconds(void);

/* Both of the above from one reading. A reading costs tens of nanoseconds (60 ns on a VM's
 * TSC), and the agent's loop, spinning while a transfer is in flight, read the clock six times
 * a turn: most of what a spinning prefill spent its core on. */
struct clock_now {
    uint64_t ms;    /* clock_ms() */
    double seconds; /* clock_seconds() */
};
struct clock_now clock_now(void);

#endif

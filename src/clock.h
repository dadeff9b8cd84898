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

#endif

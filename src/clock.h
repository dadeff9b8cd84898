/* clock.h: the one monotonic clock of deadlines, leases and transfer timings, so every module
 * measures time the same way. */
#ifndef KVX_SRC_CLOCK_H
#define KVX_SRC_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline double clock_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif

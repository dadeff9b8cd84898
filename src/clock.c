/* clock.c: the monotonic clock of clock.h and the offset tests add to it. The offset is
 * atomic because a test may advance it from another thread than the agent's. */
#include "clock.h"

#include <stdatomic.h>
#include <time.h>

static _Atomic uint64_t clock_offset_ms;

static uint64_t ms_of(const struct timespec *ts)
{
    return (uint64_t)ts->tv_sec * 1000u + (uint64_t)ts->tv_nsec / 1000000u +
           atomic_load(&clock_offset_ms);
}

static double seconds_of(const struct timespec *ts)
{
    return (double)ts->tv_sec + (double)ts->tv_nsec * 1e-9;
}

uint64_t clock_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ms_of(&ts);
}

void clock_advance_ms(uint64_t ms)
{
    atomic_fetch_add(&clock_offset_ms, ms);
}

double clock_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return seconds_of(&ts);
}

struct clock_now clock_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (struct clock_now){.ms = ms_of(&ts), .seconds = seconds_of(&ts)};
}

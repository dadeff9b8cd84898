/* progress.c: a long fill said while it runs (progress.h). Issue 24: kvx serve sat silent for
 * about 20 s while it filled 3.3 GB. The bytes are the library's to write; this file only
 * cuts the work into steps and counts them. */
#include "progress.h"

#include <inttypes.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define PROGRESS_STEP (UINT64_C(128) << 20) /* bytes between two updates: well under 1 s */

static double seconds_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

kvx_status_t progress_fill(kvx_agent_t *agent, bool zero, uint64_t seed, const char *what,
                           const char *how, bool always)
{
    bool terminal       = isatty(STDERR_FILENO) == 1;
    bool said           = terminal || always;
    double start        = seconds_now();
    uint64_t total      = 0;
    uint64_t done       = 0;
    kvx_status_t status = KVX_OK;
    uint64_t size;

    for (size_t s = 0; kvx_agent_storage(agent, s, &size) != NULL; s++)
        total += size;
    if (said)
        fprintf(stderr, "%s %" PRIu64 " bytes (%.2f GiB) %s%s", what, total,
                (double)total / (1024.0 * 1024.0 * 1024.0), how, terminal ? ": 0%" : "\n");
    for (size_t s = 0; status == KVX_OK && kvx_agent_storage(agent, s, &size) != NULL; s++) {
        for (uint64_t at = 0; status == KVX_OK && at < size; at += PROGRESS_STEP) {
            uint64_t len = size - at < PROGRESS_STEP ? size - at : PROGRESS_STEP;

            status = zero ? kvx_agent_zero_range(agent, s, at, len)
                          : kvx_agent_fill_pattern_range(agent, seed, s, at, len);
            done += len;
            if (terminal && status == KVX_OK)
                fprintf(stderr, "\r%s %" PRIu64 " bytes (%.2f GiB) %s: %3d%%", what, total,
                        (double)total / (1024.0 * 1024.0 * 1024.0), how,
                        (int)(total > 0 ? done * 100 / total : 100));
        }
    }
    if (terminal && status == KVX_OK)
        fprintf(stderr, ", done in %.1f s\n", seconds_now() - start);
    else if (terminal)
        fprintf(stderr, ", failed\n");
    return status;
}

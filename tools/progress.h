/* progress.h: what kvx serve and kvx fetch say while they fill or zero a cache of gigabytes:
 * a line on stderr, and on a terminal the share done, rewritten in place. */
#ifndef KVX_TOOLS_PROGRESS_H
#define KVX_TOOLS_PROGRESS_H

#include "kvx.h"

/* Fills every storage of `agent` with its rank's pattern of `seed`, or zeroes every storage
 * when `zero`, in steps, with the library's ranged calls: the same bytes as
 * kvx_agent_fill_pattern and kvx_agent_zero. `what` ("kvx serve: filling", then the size,
 * then `how`: "with seed 1") is said on stderr when `always` or stderr is a terminal; on a
 * terminal each step rewrites the share done and the line ends with the time taken. Returns
 * the first failure, its message in kvx_errmsg(); a line begun is ended either way. */
kvx_status_t progress_fill(kvx_agent_t *agent, bool zero, uint64_t seed, const char *what,
                           const char *how, bool always);

#endif

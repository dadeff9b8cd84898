/* bench_workload.h: `kvx bench --workload`, KV-shaped requests (shuffled block ids, the same
 * in every group) on the built-in model layouts, rescaled to the blocks the requests need. */
#ifndef KVX_TOOLS_BENCH_WORKLOAD_H
#define KVX_TOOLS_BENCH_WORKLOAD_H

#include "bench.h"

/* The built-in layout `name` with as many blocks per view (*capacity_p) as the largest of
 * a->sizes' token counts needs. Prints the `kvx: error:` line and sets nothing on failure. */
kvx_status_t workload_layout_create(const struct bench_args *a, const char *name,
                                    kvx_layout_t **layout_p, uint64_t *capacity_p);

/* One point per token count of a->sizes on a connected client whose layout came from
 * workload_layout_create with `capacity` blocks; `ids` holds `capacity` entries. The table's
 * header is printed first when `header`. */
kvx_status_t workload_run(struct bench_client *c, struct bench_samples *s, uint64_t *ids,
                          const char *name, uint64_t capacity, bool header);

#endif

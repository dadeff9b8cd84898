/* bench_common.h: what the benchmarks share: a monotonic clock, sample sorting, the CPU's
 * name for the machine note, and JSON strings. Bench-only. */
#ifndef KVX_BENCH_BENCH_COMMON_H
#define KVX_BENCH_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Nanoseconds of CLOCK_MONOTONIC. */
uint64_t clock_ns(void);

/* qsort comparison of uint64_t samples. */
int stats_compare(const void *a, const void *b);

/* The "model name" of /proc/cpuinfo, or "unknown". */
void cpu_model_read(char *buf, size_t size);

/* Prints s as a JSON string: quotes, backslashes and control bytes escaped. */
void json_string_print(const char *s);

#endif

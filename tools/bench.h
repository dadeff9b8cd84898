/* bench.h: `kvx bench`, transfer bandwidth and latency between a prefill and a decode process
 * (docs/performance.md "Transfers"). Measurement and output only; the agent does the work. */
#ifndef KVX_TOOLS_BENCH_H
#define KVX_TOOLS_BENCH_H

/* Runs `kvx bench` with the arguments after the subcommand; returns the exit status. */
int bench_main(int argc, char **argv);

#endif

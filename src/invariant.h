/* invariant.h: KVX_ASSERT, for kvx's own invariants: what the comments say holds on entry to a
 * function or at a point of the loop. Never for input from a file, a caller or a peer: bad
 * input gets a status and a message (STYLE.md 4). */
#ifndef KVX_SRC_INVARIANT_H
#define KVX_SRC_INVARIANT_H

/* KVX_ASSERTIONS is defined by the build (CMake option KVX_ASSERTIONS): on in the builds the
 * tests run (the default build and the sanitizer build), off in a Release build, where the
 * condition is not evaluated, so it must have no side effects. A failed one prints the
 * condition and where, then aborts: the process is past the point where kvx can reason. */
#ifdef KVX_ASSERTIONS
#define KVX_ASSERT(cond) ((cond) ? (void)0 : invariant_failed(#cond, __FILE__, __LINE__, __func__))
#else
#define KVX_ASSERT(cond) ((void)sizeof(!(cond)))
#endif

__attribute__((noreturn, cold)) void invariant_failed(const char *cond, const char *file, int line,
                                                      const char *func);

#endif

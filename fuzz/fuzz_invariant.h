/* fuzz_invariant.h: how every fuzz target reports a broken invariant: say which, with kvx's
 * last message, then abort so that libFuzzer keeps the input as a crash (scripts/fuzz looks
 * for "invariant broken"). */
#ifndef KVX_FUZZ_INVARIANT_H
#define KVX_FUZZ_INVARIANT_H

#include <stdbool.h>

void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static inline void invariant(bool holds, const char *what)
{
    if (!holds)
        fuzz_fail("%s", what);
}

#endif

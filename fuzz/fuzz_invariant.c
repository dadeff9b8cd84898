/* fuzz_invariant.c: the failure report of fuzz_invariant.h. */
#include "fuzz_invariant.h"

#include "kvx.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void fuzz_fail(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "invariant broken: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  last kvx message: %s\n", kvx_errmsg());
    abort();
}

/* error.c: status names, the per-thread error message of kvx_errmsg(), and the report of a
 * broken invariant (invariant.h). Holds no other state; a message lives until the same
 * thread's next failure. */
#include "error.h"

#include "invariant.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Long enough for a path, two names of KVX_MAX_NAME_LEN and a few numbers. */
#define ERROR_MSG_MAX 1024

static _Thread_local char error_msg[ERROR_MSG_MAX];

kvx_status_t error_set(kvx_status_t status, const char *fmt, ...)
{
    char text[ERROR_MSG_MAX]; /* the arguments may include kvx_errmsg() itself: a prefix */
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    memcpy(error_msg, text, sizeof(error_msg));
    return status;
}

kvx_status_t error_no_memory(const char *what)
{
    return error_set(KVX_ERR_NO_MEMORY, "out of memory allocating %s", what);
}

const char *kvx_errmsg(void)
{
    return error_msg;
}

const char *kvx_status_str(kvx_status_t status)
{
    switch (status) {
    case KVX_OK:
        return "success";
    case KVX_INPROGRESS:
        return "in progress";
    case KVX_ERR_INVALID:
        return "invalid input";
    case KVX_ERR_OUT_OF_RANGE:
        return "out of range";
    case KVX_ERR_IO:
        return "input/output error";
    case KVX_ERR_CANCELED:
        return "canceled";
    case KVX_ERR_BUSY:
        return "busy: still in use";
    case KVX_ERR_MISMATCH:
        return "verification mismatch";
    case KVX_ERR_PEER_DOWN:
        return "peer down";
    case KVX_ERR_PEER_TIMEOUT:
        return "peer timed out";
    case KVX_ERR_PEER_REFUSED:
        return "peer refused";
    case KVX_ERR_NO_MEMORY:
        return "out of memory";
    case KVX_ERR_INTERNAL:
        return "internal error";
    }
    return "unknown status";
}

void kvx_free(void *ptr)
{
    free(ptr);
}

void invariant_failed(const char *cond, const char *file, int line, const char *func)
{
    fprintf(stderr, "kvx: %s:%d: %s: invariant broken: %s\n", file, line, func, cond);
    fflush(stderr);
    abort();
}

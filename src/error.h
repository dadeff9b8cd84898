/* error.h: the thread's last error message and the helpers that set it. Every module reports
 * failures through error_set so that kvx_errmsg() always names the first place that failed. */
#ifndef KVX_SRC_ERROR_H
#define KVX_SRC_ERROR_H

#include "kvx.h"

/* Formats this thread's message and returns `status`, so callers write
 * `return error_set(KVX_ERR_INVALID, "...")`. */
kvx_status_t error_set(kvx_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Returns KVX_ERR_NO_MEMORY with a message naming what could not be allocated. */
kvx_status_t error_no_memory(const char *what);

#endif

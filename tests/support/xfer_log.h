/* xfer_log.h: a transfer callback that records how often it fired and with what, so tests
 * check "exactly once" and the status it reported. */
#ifndef KVX_TESTS_XFER_LOG_H
#define KVX_TESTS_XFER_LOG_H

#include "kvx.h"

struct callback_log {
    int calls;
    kvx_status_t status;
};

/* A kvx_xfer_cb_t whose `arg` is a struct callback_log. */
void on_xfer(void *arg, kvx_xfer_t *xfer, kvx_status_t status);

#endif

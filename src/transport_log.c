/* transport_log.c: UCX's own log under kvx. UCX logs per process, to stdout, from any thread,
 * so this is process-wide: while an agent has a log callback, UCX's warnings and errors become
 * lines of that agent's log instead; the warnings a worker prints when it is destroyed with
 * what a dead or stopped peer left pending (operations never flushed, requests never returned
 * to their pool: dozens after one peer died, issue 24 item 10) are counted and summed in one
 * line, since kvx knows already why they were left. Everything here is under one mutex. */
#include "transport_private.h"

/* UCX 1.22's log header reaches ucs/arch/bitops.h, which spells inline assembly `asm`, a GNU
 * keyword strict C11 lacks: every build of this file (CMake's, the Python package's) is C11. */
#ifndef asm
#define asm __asm__
#endif
#include <ucs/debug/log_def.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_once  = PTHREAD_ONCE_INIT;
static struct transport *log_transports; /* log_lock: every live transport, newest first */

/* The transport whose worker this thread is destroying (transport_log_close_begin), so a
 * warning printed from inside ucp_worker_destroy is known to be about that close. */
static _Thread_local struct transport *log_closing;

/* The warnings of a worker destroyed with work pending, by their format (the same text from
 * UCX 1.13 to 1.22: ucp_worker.c, ucs/datastruct/mpool.c). */
static bool is_close_warning(const char *format)
{
    return strstr(format, "pending operations were not flushed") != NULL ||
           strstr(format, "was not returned to mpool") != NULL;
}

/* Appends one line to `t`'s queue (log_lock held); a full queue counts it. */
__attribute__((format(printf, 3, 0))) static void
line_queue(struct transport *t, ucs_log_level_t level, const char *format, va_list ap)
{
    const char *name = level == UCS_LOG_LEVEL_WARN ? "WARN" : "ERROR";
    char *line;
    int n;

    if (t->num_log_lines == TRANSPORT_LOG_LINES) {
        t->log_dropped++;
        return;
    }
    line = t->log_lines[t->num_log_lines++];
    n    = snprintf(line, TRANSPORT_LOG_LINE, "UCX %s: ", name);
    vsnprintf(line + n, TRANSPORT_LOG_LINE - (size_t)n, format, ap);
}

/* UCX calls its handlers newest first and stops at the first that says STOP: a line taken
 * here is not printed by UCX's own handler. Anything below a warning, and any line while no
 * agent takes them, continues to UCX's handler, which prints it as it would without kvx. */
__attribute__((format(printf, 6, 0))) static ucs_log_func_rc_t
log_handler(const char *file, unsigned line, const char *function, ucs_log_level_t level,
            const ucs_log_component_config_t *comp_conf, const char *format, va_list ap)
{
    struct transport *closing = log_closing;
    struct transport *target  = NULL;

    (void)file;
    (void)line;
    (void)function;
    (void)comp_conf;
    if (level > UCS_LOG_LEVEL_WARN || format == NULL)
        return UCS_LOG_FUNC_RC_CONTINUE;
    pthread_mutex_lock(&log_lock);
    /* the closing transport's own agent if it has a callback, else any agent's that has one
     * (a push writer's transport has none: its agent's main one takes its lines); while a
     * transport is destroyed nothing more is delivered to it */
    if (closing != NULL && closing->log_routed && !closing->log_destroying)
        target = closing;
    for (struct transport *t = log_transports; target == NULL && t != NULL; t = t->log_next) {
        if (t->log_routed && !t->log_destroying)
            target = t;
    }
    if (closing != NULL && level == UCS_LOG_LEVEL_WARN && is_close_warning(format)) {
        (target != NULL ? target : closing)->log_quieted++;
        pthread_mutex_unlock(&log_lock);
        return UCS_LOG_FUNC_RC_STOP;
    }
    if (closing != NULL && closing->log_destroying)
        target = NULL; /* the agent is going: its errors print as UCX's */
    if (target != NULL)
        line_queue(target, level, format, ap);
    pthread_mutex_unlock(&log_lock);
    return target != NULL ? UCS_LOG_FUNC_RC_STOP : UCS_LOG_FUNC_RC_CONTINUE;
}

static void handler_push(void)
{
    ucs_log_push_handler(log_handler); /* for the process's life: UCX pops by position only */
}

void transport_log_attach(struct transport *t)
{
    pthread_once(&log_once, handler_push);
    pthread_mutex_lock(&log_lock);
    t->log_next    = log_transports;
    log_transports = t;
    pthread_mutex_unlock(&log_lock);
}

void transport_log_detach(struct transport *t)
{
    pthread_mutex_lock(&log_lock);
    for (struct transport **link = &log_transports; *link != NULL; link = &(*link)->log_next) {
        if (*link == t) {
            *link = t->log_next;
            break;
        }
    }
    pthread_mutex_unlock(&log_lock);
}

void transport_log_close_begin(struct transport *t, bool destroying)
{
    pthread_mutex_lock(&log_lock);
    t->log_destroying = destroying;
    pthread_mutex_unlock(&log_lock);
    log_closing = t;
}

void transport_log_close_end(void)
{
    log_closing = NULL;
}

void transport_log_route(struct transport *t, bool routed)
{
    pthread_mutex_lock(&log_lock);
    t->log_routed = routed;
    pthread_mutex_unlock(&log_lock);
}

bool transport_log_next(struct transport *t, char *line, size_t size)
{
    bool found = true;

    pthread_mutex_lock(&log_lock);
    if (t->num_log_lines > 0) {
        snprintf(line, size, "%s", t->log_lines[0]);
        memmove(t->log_lines[0], t->log_lines[1], --t->num_log_lines * sizeof(t->log_lines[0]));
    } else if (t->log_dropped > 0) {
        snprintf(line, size, "UCX: %" PRIu64 " more lines not kept (more than %d at once)",
                 t->log_dropped, TRANSPORT_LOG_LINES);
        t->log_dropped = 0;
    } else if (t->log_quieted > 0) {
        snprintf(line, size,
                 "UCX: %" PRIu64 " warnings not shown, of closed connections' workers about "
                 "what their peer left pending (operations not flushed, requests not returned)",
                 t->log_quieted);
        t->log_quieted = 0;
    } else {
        found = false;
    }
    pthread_mutex_unlock(&log_lock);
    return found;
}

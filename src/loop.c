/* loop.c: the deadline heap (a binary heap whose timers know their index, so stopping or
 * moving one is O(log n) and no stale entries pile up), the completion and log queues, and
 * the epoll set with its wake and timer descriptors. Calls no other kvx module. */
#include "loop.h"

#include "clock.h"
#include "error.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

kvx_status_t loop_init(struct loop *loop)
{
    *loop          = (struct loop){.epoll_fd = -1, .side_fd = -1, .wake_fd = -1, .timer_fd = -1};
    loop->lines    = calloc(LOOP_LOG_LINES, sizeof(*loop->lines));
    loop->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    loop->side_fd  = epoll_create1(EPOLL_CLOEXEC);
    loop->wake_fd  = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    loop->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (loop->lines == NULL)
        return error_no_memory("the log queue");
    if (loop->epoll_fd < 0 || loop->side_fd < 0 || loop->wake_fd < 0 || loop->timer_fd < 0 ||
        loop_watch_fd(loop, loop->wake_fd, false) != KVX_OK ||
        loop_watch_fd(loop, loop->timer_fd, false) != KVX_OK)
        return error_set(KVX_ERR_NO_MEMORY, "loop: descriptors: %s", strerror(errno));
    return KVX_OK;
}

void loop_fini(struct loop *loop)
{
    if (loop->epoll_fd >= 0)
        close(loop->epoll_fd);
    if (loop->side_fd >= 0)
        close(loop->side_fd);
    if (loop->wake_fd >= 0)
        close(loop->wake_fd);
    if (loop->timer_fd >= 0)
        close(loop->timer_fd);
    free(loop->heap);
    free(loop->lines);
    *loop = (struct loop){.epoll_fd = -1, .side_fd = -1, .wake_fd = -1, .timer_fd = -1};
}

static void heap_set(struct loop *loop, size_t i, struct loop_timer *timer)
{
    loop->heap[i] = timer;
    timer->index  = i;
}

static void heap_up(struct loop *loop, size_t i)
{
    struct loop_timer *timer = loop->heap[i];

    while (i > 0 && loop->heap[(i - 1) / 2]->deadline_ms > timer->deadline_ms) {
        heap_set(loop, i, loop->heap[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    heap_set(loop, i, timer);
}

static void heap_down(struct loop *loop, size_t i)
{
    struct loop_timer *timer = loop->heap[i];

    for (;;) {
        size_t child = 2 * i + 1;

        if (child >= loop->num_timers)
            break;
        if (child + 1 < loop->num_timers &&
            loop->heap[child + 1]->deadline_ms < loop->heap[child]->deadline_ms)
            child++;
        if (loop->heap[child]->deadline_ms >= timer->deadline_ms)
            break;
        heap_set(loop, i, loop->heap[child]);
        i = child;
    }
    heap_set(loop, i, timer);
}

void loop_timer_stop(struct loop *loop, struct loop_timer *timer)
{
    size_t i = timer->index;
    struct loop_timer *last;

    if (i == LOOP_TIMER_IDLE)
        return;
    timer->index = LOOP_TIMER_IDLE;
    last         = loop->heap[--loop->num_timers];
    if (last == timer)
        return;
    heap_set(loop, i, last);
    heap_up(loop, i);
    heap_down(loop, last->index);
}

kvx_status_t loop_timer_start(struct loop *loop, struct loop_timer *timer, uint64_t deadline_ms)
{
    loop_timer_stop(loop, timer);
    if (loop->num_timers == loop->max_timers) {
        size_t max                = loop->max_timers == 0 ? 64 : 2 * loop->max_timers;
        struct loop_timer **grown = realloc(loop->heap, max * sizeof(*grown));

        if (grown == NULL)
            return error_no_memory("a timer");
        loop->heap       = grown;
        loop->max_timers = max;
    }
    timer->deadline_ms = deadline_ms;
    heap_set(loop, loop->num_timers++, timer);
    heap_up(loop, timer->index);
    return KVX_OK;
}

size_t loop_timers_run(struct loop *loop, uint64_t now_ms)
{
    size_t fired = 0;

    while (loop->num_timers > 0 && loop->heap[0]->deadline_ms <= now_ms) {
        struct loop_timer *timer = loop->heap[0];

        loop_timer_stop(loop, timer);
        timer->fire(timer); /* may start it again, or others */
        fired++;
    }
    return fired;
}

uint64_t loop_next_deadline(const struct loop *loop)
{
    return loop->num_timers > 0 ? loop->heap[0]->deadline_ms : UINT64_MAX;
}

void loop_queue(struct loop *loop, struct loop_event *event)
{
    if (event->queued)
        return;
    event->queued = true;
    event->next   = NULL;
    if (loop->tail != NULL)
        loop->tail->next = event;
    else
        loop->head = event;
    loop->tail = event;
}

void loop_unqueue(struct loop *loop, struct loop_event *event)
{
    struct loop_event **link = &loop->head;
    struct loop_event *prev  = NULL;

    if (!event->queued)
        return;
    while (*link != event) {
        prev = *link;
        link = &(*link)->next;
    }
    *link = event->next;
    if (loop->tail == event)
        loop->tail = prev;
    event->queued = false;
}

bool loop_queue_empty(const struct loop *loop)
{
    return loop->head == NULL && loop->num_lines == 0 && loop->lines_dropped == 0;
}

/* Hands the queued log lines to the callback. */
static void log_flush(struct loop *loop)
{
    size_t n = loop->num_lines;

    loop->num_lines = 0;
    for (size_t i = 0; i < n && loop->log != NULL; i++)
        loop->log(loop->log_arg, loop->lines[i]);
    if (loop->lines_dropped > 0 && loop->log != NULL) {
        char line[96];

        snprintf(line, sizeof(line), "%llu log lines dropped: more than %d in one turn",
                 (unsigned long long)loop->lines_dropped, LOOP_LOG_LINES);
        loop->log(loop->log_arg, line);
    }
    loop->lines_dropped = 0;
}

size_t loop_queue_run(struct loop *loop)
{
    struct loop_event *last = loop->tail;
    size_t ran              = 0;

    log_flush(loop);
    /* Only what was queued before: a callback that queues more (a post that fails at once)
     * is served next turn, so one turn's work is bounded. */
    while (last != NULL && loop->head != NULL) {
        struct loop_event *event = loop->head;

        loop->head = event->next;
        if (loop->head == NULL)
            loop->tail = NULL;
        event->queued = false;
        ran++;
        event->run(event); /* may free the event */
        if (event == last)
            break;
    }
    log_flush(loop);
    return ran;
}

__attribute__((format(printf, 2, 0))) static bool log_queue(struct loop *loop, const char *format,
                                                            va_list args)
{
    if (loop->log == NULL)
        return false;
    if (loop->num_lines == LOOP_LOG_LINES) {
        loop->lines_dropped++;
        return false;
    }
    vsnprintf(loop->lines[loop->num_lines++], LOOP_LOG_LINE, format, args);
    return true;
}

bool loop_log(struct loop *loop, const char *format, ...)
{
    va_list args;
    bool queued;

    va_start(args, format);
    queued = log_queue(loop, format, args);
    va_end(args);
    return queued;
}

void loop_info(struct loop *loop, const char *format, ...)
{
    va_list args;

    if (loop->log_quiet)
        return;
    va_start(args, format);
    log_queue(loop, format, args);
    va_end(args);
}

void loop_log_limited(struct loop *loop, struct loop_limit *limit, uint64_t now_ms,
                      const char *what, const char *format, ...)
{
    va_list args;

    if (limit->window_ms == 0 || now_ms - limit->window_ms >= LOOP_LIMIT_MS) {
        if (limit->skipped > 0)
            loop_log(loop, "%" PRIu64 " more %s not logged in %d s (at most %d lines each)",
                     limit->skipped, what, LOOP_LIMIT_MS / 1000, LOOP_LIMIT_LINES);
        *limit = (struct loop_limit){.window_ms = now_ms != 0 ? now_ms : 1};
    }
    if (limit->lines == LOOP_LIMIT_LINES) {
        limit->skipped++;
        return;
    }
    limit->lines++;
    va_start(args, format);
    log_queue(loop, format, args);
    va_end(args);
}

kvx_status_t loop_watch_fd(struct loop *loop, int fd, bool side)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};

    if (fd < 0)
        return KVX_OK;
    if ((epoll_ctl(loop->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0 && errno != EEXIST) ||
        (side && epoll_ctl(loop->side_fd, EPOLL_CTL_ADD, fd, &ev) != 0 && errno != EEXIST))
        return error_set(KVX_ERR_NO_MEMORY, "loop: watching descriptor %d: %s", fd,
                         strerror(errno));
    return KVX_OK;
}

void loop_unwatch_fd(struct loop *loop, int fd)
{
    if (fd >= 0) {
        epoll_ctl(loop->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
        epoll_ctl(loop->side_fd, EPOLL_CTL_DEL, fd, NULL); /* ENOENT unless it was a side one */
    }
}

bool loop_side_ready(struct loop *loop)
{
    struct epoll_event ev;

    return epoll_wait(loop->side_fd, &ev, 1, 0) > 0;
}

void loop_wake(struct loop *loop)
{
    uint64_t one = 1;

    if (loop->woken)
        return;
    loop->woken = true;
    (void)!write(loop->wake_fd, &one, sizeof(one));
}

void loop_prepare_sleep(struct loop *loop, bool busy)
{
    uint64_t deadline = loop_next_deadline(loop);
    uint64_t now      = clock_ms();
    uint64_t count;

    if (loop->woken) {
        (void)!read(loop->wake_fd, &count, sizeof(count));
        loop->woken = false;
    }
    if (busy || !loop_queue_empty(loop) || deadline <= now) {
        loop_wake(loop);
        deadline = UINT64_MAX; /* the wake covers it */
    }
    if (deadline == UINT64_MAX ? loop->timer_set_for != 0 : deadline != loop->timer_set_for) {
        struct itimerspec expires = {0}; /* zero disarms */
        uint64_t ms               = deadline != UINT64_MAX ? deadline - now : 0;

        expires.it_value.tv_sec  = (time_t)(ms / 1000);
        expires.it_value.tv_nsec = (long)(ms % 1000) * 1000000;
        timerfd_settime(loop->timer_fd, 0, &expires, NULL);
        loop->timer_set_for = deadline != UINT64_MAX ? deadline : 0;
    }
}

bool loop_sleep_prepared(const struct loop *loop)
{
    uint64_t deadline = loop_next_deadline(loop);

    return !loop->woken && loop_queue_empty(loop) &&
           (deadline == UINT64_MAX ? loop->timer_set_for == 0 : deadline == loop->timer_set_for);
}

void loop_wait_done(struct loop *loop)
{
    uint64_t expirations;

    if (read(loop->timer_fd, &expirations, sizeof(expirations)) > 0)
        loop->timer_set_for = 0; /* it fired: nothing is set any more */
}

/* loop.h: what an agent's loop is made of, below every file that queues work on it: timers in
 * one deadline heap, the queue of completions that runs user callbacks, the queue of log lines,
 * and the one pollable descriptor (epoll) that every source of events is watched through. */
#ifndef KVX_SRC_LOOP_H
#define KVX_SRC_LOOP_H

#include "kvx.h"

/* A timer: `fire` runs from loop_timers_run once clock_ms() reached `deadline_ms`. It may
 * change state and queue events, never run user code. */
struct loop_timer {
    uint64_t deadline_ms;
    size_t index; /* in the heap, or LOOP_TIMER_IDLE */
    void (*fire)(struct loop_timer *timer);
};
#define LOOP_TIMER_IDLE ((size_t)-1)

/* A queued completion: `run` is the only place user callbacks are called from. */
struct loop_event {
    struct loop_event *next;
    void (*run)(struct loop_event *event);
    bool queued;
};

#define LOOP_LOG_LINES 64  /* log lines queued between two completion phases; more are counted */
#define LOOP_LOG_LINE  512 /* bytes of one line */

struct loop {
    struct loop_timer **heap; /* min-heap by deadline */
    size_t num_timers;
    size_t max_timers;
    struct loop_event *head; /* completions, first queued first */
    struct loop_event *tail;
    int epoll_fd; /* the agent's descriptor: every source below is in it */
    int side_fd;  /* an epoll set of the side channel's descriptors (ZMQ_FD) alone */
    int wake_fd;  /* an eventfd: readable when progress has work without waiting */
    int timer_fd; /* a timerfd: readable at the next deadline */
    bool woken;   /* wake_fd was written and not read since: writing again changes nothing */
    uint64_t timer_set_for; /* the deadline timer_fd is set to; 0: disarmed */
    kvx_log_cb_t log;
    void *log_arg;
    bool log_quiet; /* kvx_agent_set_log_level(KVX_LOG_WARN): loop_info lines are not kept */
    char (*lines)[LOOP_LOG_LINE];
    size_t num_lines;
    uint64_t lines_dropped;
};

kvx_status_t loop_init(struct loop *loop);
void loop_fini(struct loop *loop);

/* Arms `timer` for `deadline_ms` (again, if it was armed); stopping an idle one is a no-op. */
kvx_status_t loop_timer_start(struct loop *loop, struct loop_timer *timer, uint64_t deadline_ms);
void loop_timer_stop(struct loop *loop, struct loop_timer *timer);

static inline void loop_timer_init(struct loop_timer *timer, void (*fire)(struct loop_timer *))
{
    *timer = (struct loop_timer){0, LOOP_TIMER_IDLE, fire};
}

/* Fires every timer due by `now_ms`; returns how many. The earliest deadline, or UINT64_MAX. */
size_t loop_timers_run(struct loop *loop, uint64_t now_ms);
uint64_t loop_next_deadline(const struct loop *loop);

/* Queues `event` once (queuing a queued event does nothing) and runs the events that were
 * queued when the call began, in order; returns how many ran. */
void loop_queue(struct loop *loop, struct loop_event *event);
size_t loop_queue_run(struct loop *loop);
bool loop_queue_empty(const struct loop *loop);

/* Takes `event` out of the queue if it is there (its object goes away without running). */
void loop_unqueue(struct loop *loop, struct loop_event *event);

/* A line for the log callback, delivered by loop_queue_run (the completion phase).
 * loop_log's lines say something went wrong or was refused (KVX_LOG_WARN): they are always
 * kept; loop_info's say a state changed as it should (KVX_LOG_INFO): kept unless the level
 * is KVX_LOG_WARN. loop_log says whether its line was queued (not when no callback is set, or
 * LOOP_LOG_LINES wait already: then it is only counted), for callers that log a thing once. */
__attribute__((format(printf, 2, 3))) bool loop_log(struct loop *loop, const char *format, ...);
__attribute__((format(printf, 2, 3))) void loop_info(struct loop *loop, const char *format, ...);

/* A bound on one kind of warning a peer can cause at will (a refused done): at most
 * LOOP_LIMIT_LINES lines a LOOP_LIMIT_MS window, and one line counting the rest when the next
 * window opens, so the log is never the peer's to fill. */
#define LOOP_LIMIT_LINES 5
#define LOOP_LIMIT_MS    10000
struct loop_limit {
    uint64_t window_ms; /* when the window opened (clock_ms) */
    uint32_t lines;     /* logged in it */
    uint64_t skipped;   /* not logged in it */
};

/* loop_log under `limit`, at `now_ms`; `what` names the kind in the line counting skips. */
__attribute__((format(printf, 5, 6))) void loop_log_limited(struct loop *loop,
                                                            struct loop_limit *limit,
                                                            uint64_t now_ms, const char *what,
                                                            const char *format, ...);

/* Watching descriptors: UCX's wakeup descriptors; ZeroMQ's ZMQ_FD (`side`), also in a set of
 * their own, so that a turn can ask whether any of them is readable in one system call, where
 * asking each socket costs two (loop_side_ready). */
kvx_status_t loop_watch_fd(struct loop *loop, int fd, bool side);
void loop_unwatch_fd(struct loop *loop, int fd);

/* Whether a side-channel descriptor is readable now (never sleeps). ZeroMQ's ZMQ_FD is edge
 * triggered: it becomes readable when something comes after a receive found the socket empty,
 * but a send on the socket may take that edge, so a caller also looks at the sockets
 * themselves now and then (AGENT_SIDE_CHECK_US). */
bool loop_side_ready(struct loop *loop);

/* Before sleeping (or returning to an event loop that waits on epoll_fd) after a turn that
 * found nothing to do: clears the wake descriptor, then makes it readable again when `busy`
 * says some source has work already (or a completion or deadline is due), and sets the timer
 * descriptor to the next deadline. A turn that did work leaves the wake descriptor readable
 * instead (loop_wake), so a busy loop makes no system call for it. */
void loop_prepare_sleep(struct loop *loop, bool busy);

/* Makes the descriptor readable: there is work without waiting (a post, a busy turn). */
void loop_wake(struct loop *loop);

/* Whether the descriptor is still as loop_prepare_sleep(loop, false) left it: not woken since,
 * nothing queued, and the timer descriptor set to the earliest deadline (a timer started since
 * moves it). */
bool loop_sleep_prepared(const struct loop *loop);

/* After a wait on the descriptor (the caller's own poll of epoll_fd): takes the timer's
 * expiry, so the descriptor is not readable for it again. */
void loop_wait_done(struct loop *loop);

#endif

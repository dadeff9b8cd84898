/* test_loop.c: the agent loop's parts: the deadline heap against a model, timers re-armed from
 * fire, the completion and log queues' order and bounds, and the epoll descriptor's wakeups. */
#include "clock.h"
#include "loop.h"
#include "prng.h"

#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#define NUM_TIMERS   200
#define MODEL_STEPS  20000
#define DEFAULT_SEED 0x6c6f6f70u /* "loop" */
#define WAKE_MS      2000        /* a bound on a missed wakeup, not a timing */

/* Each test gets a fresh loop as its state. */
static int loop_setup(void **state)
{
    static struct loop loop;

    if (loop_init(&loop) != KVX_OK)
        return -1;
    *state = &loop;
    return 0;
}

static int loop_teardown(void **state)
{
    loop_fini(*state);
    return 0;
}

/* ----------------------------------------------------------------------------------------
 * Timers against a model: which are armed, for when.
 * -------------------------------------------------------------------------------------- */

struct model_timer {
    struct loop_timer timer;
    size_t id;
    bool armed; /* what the model says */
    uint64_t deadline;
};

static struct model {
    struct model_timer timers[NUM_TIMERS];
    uint64_t seed;
    size_t step;
    uint64_t now;
    uint64_t last_deadline; /* of the timer fired last in this run */
    size_t fired;           /* in this run */
} model;

static struct model_timer *model_timer_of(struct loop_timer *timer)
{
    return (struct model_timer *)(void *)((char *)timer - offsetof(struct model_timer, timer));
}

static void model_fire(struct loop_timer *timer)
{
    struct model_timer *mt = model_timer_of(timer);

    if (!mt->armed)
        fail_msg("seed %llu step %zu: timer %zu fired while stopped (or twice)",
                 (unsigned long long)model.seed, model.step, mt->id);
    if (mt->deadline > model.now)
        fail_msg("seed %llu step %zu: timer %zu due at %llu fired at %llu",
                 (unsigned long long)model.seed, model.step, mt->id,
                 (unsigned long long)mt->deadline, (unsigned long long)model.now);
    if (mt->deadline < model.last_deadline)
        fail_msg("seed %llu step %zu: timer %zu due at %llu fired after one due at %llu",
                 (unsigned long long)model.seed, model.step, mt->id,
                 (unsigned long long)mt->deadline, (unsigned long long)model.last_deadline);
    if (timer->index != LOOP_TIMER_IDLE)
        fail_msg("seed %llu step %zu: timer %zu fired while still in the heap",
                 (unsigned long long)model.seed, model.step, mt->id);
    model.last_deadline = mt->deadline;
    mt->armed           = false;
    model.fired++;
}

/* The loop agrees with the model: what is armed, and the earliest deadline. */
static void model_compare(const struct loop *loop)
{
    uint64_t earliest = UINT64_MAX;
    size_t armed      = 0;

    for (size_t i = 0; i < NUM_TIMERS; i++) {
        const struct model_timer *mt = &model.timers[i];

        if (mt->armed != (mt->timer.index != LOOP_TIMER_IDLE))
            fail_msg("seed %llu step %zu: timer %zu is %s, the model says %s",
                     (unsigned long long)model.seed, model.step, mt->id,
                     mt->timer.index != LOOP_TIMER_IDLE ? "armed" : "idle",
                     mt->armed ? "armed" : "idle");
        if (mt->armed) {
            armed++;
            earliest = mt->deadline < earliest ? mt->deadline : earliest;
        }
    }
    if (loop->num_timers != armed || loop_next_deadline(loop) != earliest)
        fail_msg("seed %llu step %zu: %zu timers next at %llu, the model has %zu next at %llu",
                 (unsigned long long)model.seed, model.step, loop->num_timers,
                 (unsigned long long)loop_next_deadline(loop), armed, (unsigned long long)earliest);
}

/* Runs the due timers at model.now: exactly the model's due ones fire. */
static void model_run(struct loop *loop)
{
    size_t due = 0;
    size_t ran;

    for (size_t i = 0; i < NUM_TIMERS; i++)
        due += model.timers[i].armed && model.timers[i].deadline <= model.now;
    model.last_deadline = 0;
    model.fired         = 0;
    ran                 = loop_timers_run(loop, model.now);
    if (ran != due || model.fired != due)
        fail_msg("seed %llu step %zu: %zu timers due at %llu, %zu fired, %zu counted",
                 (unsigned long long)model.seed, model.step, due, (unsigned long long)model.now,
                 model.fired, ran);
}

static void timers_fire_once_in_deadline_order_only_when_due_and_stopped_ones_never(void **state)
{
    struct loop *loop = *state;
    struct prng prng;

    model.seed = prng_seed_from_env(DEFAULT_SEED);
    model.now  = 1000;
    prng_init(&prng, model.seed);
    for (size_t i = 0; i < NUM_TIMERS; i++) {
        model.timers[i] = (struct model_timer){.id = i};
        loop_timer_init(&model.timers[i].timer, model_fire);
    }
    for (model.step = 0; model.step < MODEL_STEPS; model.step++) {
        struct model_timer *mt = &model.timers[prng_range(&prng, 0, NUM_TIMERS - 1)];
        uint64_t action        = prng_range(&prng, 0, 9);

        if (action <= 3 || action == 9) {
            /* Start or restart; now and then already due (in the past or right now). */
            uint64_t deadline = action == 9 ? model.now - prng_range(&prng, 0, 50)
                                            : model.now + prng_range(&prng, 0, 200);

            assert_int_equal(loop_timer_start(loop, &mt->timer, deadline), KVX_OK);
            mt->armed    = true;
            mt->deadline = deadline;
        } else if (action <= 5) {
            loop_timer_stop(loop, &mt->timer); /* idle ones too: a no-op */
            mt->armed = false;
        } else {
            model.now += action == 8 ? 0 : prng_range(&prng, 0, 30);
            model_run(loop);
        }
        model_compare(loop);
    }
    for (size_t i = 0; i < NUM_TIMERS; i++) {
        loop_timer_stop(loop, &model.timers[i].timer);
        model.timers[i].armed = false;
    }
    model_compare(loop);
    assert_int_equal(loop_next_deadline(loop), UINT64_MAX);
    assert_int_equal(loop_timers_run(loop, UINT64_MAX - 1), 0);
}

/* ----------------------------------------------------------------------------------------
 * Timers that act from fire: re-arming themselves, starting and stopping others.
 * -------------------------------------------------------------------------------------- */

static struct loop *fire_loop; /* the loop a fire callback acts on */

struct periodic {
    struct loop_timer timer;
    uint64_t period;
    size_t max_fires;
    size_t fires;
    uint64_t fired_for[8]; /* deadlines fired for */
};

static void periodic_fire(struct loop_timer *timer)
{
    struct periodic *p = (struct periodic *)(void *)timer;

    assert_true(p->fires < 8);
    p->fired_for[p->fires++] = timer->deadline_ms;
    if (p->fires < p->max_fires)
        assert_int_equal(loop_timer_start(fire_loop, timer, timer->deadline_ms + p->period),
                         KVX_OK);
}

static void timer_rearmed_from_fire_fires_again_at_each_new_deadline(void **state)
{
    struct loop *loop                = *state;
    struct periodic p                = {.period = 10, .max_fires = 5};
    static const uint64_t expected[] = {10, 20, 30, 40, 50};

    fire_loop = loop;
    loop_timer_init(&p.timer, periodic_fire);
    assert_int_equal(loop_timer_start(loop, &p.timer, 10), KVX_OK);
    assert_int_equal(loop_timers_run(loop, 9), 0);
    assert_int_equal(loop_timers_run(loop, 10), 1);
    assert_int_equal(loop_next_deadline(loop), 20);
    /* Already due again when it re-arms: it fires again within the same run. */
    assert_int_equal(loop_timers_run(loop, 35), 2);
    assert_int_equal(loop_next_deadline(loop), 40);
    /* The last fire does not re-arm: the heap is empty after it. */
    assert_int_equal(loop_timers_run(loop, 1000), 2);
    assert_int_equal(p.fires, 5);
    assert_memory_equal(p.fired_for, expected, sizeof(expected));
    assert_int_equal(p.timer.index, LOOP_TIMER_IDLE);
    assert_int_equal(loop_next_deadline(loop), UINT64_MAX);
}

struct actor {
    struct loop_timer timer;
    struct loop_timer *start; /* started from fire, due at 15 */
    struct loop_timer *stop;  /* stopped from fire */
    size_t fires;
};

static void actor_fire(struct loop_timer *timer)
{
    struct actor *a = (struct actor *)(void *)timer;

    a->fires++;
    if (a->start != NULL)
        assert_int_equal(loop_timer_start(fire_loop, a->start, 15), KVX_OK);
    if (a->stop != NULL)
        loop_timer_stop(fire_loop, a->stop);
}

static void timers_started_from_fire_run_in_the_same_run_and_stopped_ones_never(void **state)
{
    struct loop *loop    = *state;
    struct actor started = {0};
    struct actor stopped = {0};
    struct actor first   = {.start = &started.timer, .stop = &stopped.timer};

    fire_loop = loop;
    loop_timer_init(&first.timer, actor_fire);
    loop_timer_init(&started.timer, actor_fire);
    loop_timer_init(&stopped.timer, actor_fire);
    assert_int_equal(loop_timer_start(loop, &first.timer, 10), KVX_OK);
    assert_int_equal(loop_timer_start(loop, &stopped.timer, 20), KVX_OK);
    assert_int_equal(loop_timers_run(loop, 30), 2);
    assert_int_equal(first.fires, 1);
    assert_int_equal(started.fires, 1);
    assert_int_equal(stopped.fires, 0);
    assert_int_equal(stopped.timer.index, LOOP_TIMER_IDLE);
    assert_int_equal(loop_next_deadline(loop), UINT64_MAX);
}

/* ----------------------------------------------------------------------------------------
 * The completion queue.
 * -------------------------------------------------------------------------------------- */

#define NUM_EVENTS 10

static struct {
    size_t order[4 * NUM_EVENTS]; /* ids, as run */
    size_t count;
} ran;

struct test_event {
    struct loop_event event;
    size_t id;
    struct loop *loop;
    struct test_event *then; /* queued from run */
    const char *log;         /* logged from run */
};

static void event_run(struct loop_event *event)
{
    struct test_event *e = (struct test_event *)(void *)event;

    assert_false(event->queued);
    assert_true(ran.count < 4 * NUM_EVENTS);
    ran.order[ran.count++] = e->id;
    if (e->then != NULL)
        loop_queue(e->loop, &e->then->event);
    if (e->log != NULL)
        loop_log(e->loop, "%s", e->log);
}

static void events_init(struct test_event *events, size_t count, struct loop *loop)
{
    ran.count = 0;
    for (size_t i = 0; i < count; i++)
        events[i] = (struct test_event){.event = {.run = event_run}, .id = i, .loop = loop};
}

static void ran_expect(const size_t *ids, size_t count)
{
    if (ran.count != count)
        fail_msg("%zu events ran, expected %zu", ran.count, count);
    for (size_t i = 0; i < count; i++) {
        if (ran.order[i] != ids[i])
            fail_msg("event %zu ran as number %zu, expected event %zu", ran.order[i], i, ids[i]);
    }
    ran.count = 0;
}

static void events_run_in_queue_order_and_queuing_twice_runs_once(void **state)
{
    struct loop *loop = *state;
    struct test_event events[NUM_EVENTS];
    static const size_t order[NUM_EVENTS] = {3, 1, 4, 0, 5, 9, 2, 6, 8, 7};

    events_init(events, NUM_EVENTS, loop);
    assert_true(loop_queue_empty(loop));
    for (size_t i = 0; i < NUM_EVENTS; i++) {
        loop_queue(loop, &events[order[i]].event);
        loop_queue(loop, &events[order[i]].event); /* already queued: nothing */
    }
    loop_queue(loop, &events[3].event);
    assert_false(loop_queue_empty(loop));
    assert_int_equal(loop_queue_run(loop), NUM_EVENTS);
    ran_expect(order, NUM_EVENTS);
    assert_true(loop_queue_empty(loop));
    assert_int_equal(loop_queue_run(loop), 0);
}

static void event_queued_while_the_queue_runs_waits_for_the_next_run(void **state)
{
    struct loop *loop = *state;
    struct test_event events[3];
    static const size_t first[]  = {0, 1};
    static const size_t second[] = {2, 0};

    events_init(events, 3, loop);
    events[0].then = &events[2]; /* a new event */
    events[1].then = &events[0]; /* the one that just ran */
    loop_queue(loop, &events[0].event);
    loop_queue(loop, &events[1].event);
    assert_int_equal(loop_queue_run(loop), 2);
    ran_expect(first, 2);
    assert_false(loop_queue_empty(loop));
    events[0].then = NULL;
    assert_int_equal(loop_queue_run(loop), 2);
    ran_expect(second, 2);
    assert_true(loop_queue_empty(loop));
}

static void unqueued_event_never_runs_and_the_queue_stays_whole(void **state)
{
    struct loop *loop = *state;
    struct test_event events[5];
    static const size_t rest[]  = {1, 3};
    static const size_t after[] = {4, 0};

    events_init(events, 5, loop);
    for (size_t i = 0; i < 4; i++)
        loop_queue(loop, &events[i].event);
    loop_unqueue(loop, &events[0].event); /* the head */
    loop_unqueue(loop, &events[2].event); /* the middle */
    loop_unqueue(loop, &events[2].event); /* not queued any more: nothing */
    loop_unqueue(loop, &events[4].event); /* never queued: nothing */
    assert_false(events[0].event.queued);
    assert_int_equal(loop_queue_run(loop), 2);
    ran_expect(rest, 2);

    /* Taking the tail out leaves a queue that still appends. */
    loop_queue(loop, &events[4].event);
    loop_queue(loop, &events[1].event);
    loop_unqueue(loop, &events[1].event);
    loop_queue(loop, &events[0].event);
    assert_int_equal(loop_queue_run(loop), 2);
    ran_expect(after, 2);

    /* The only event out: the queue is empty. */
    loop_queue(loop, &events[3].event);
    loop_unqueue(loop, &events[3].event);
    assert_true(loop_queue_empty(loop));
    assert_int_equal(loop_queue_run(loop), 0);
    assert_int_equal(ran.count, 0);
}

/* ----------------------------------------------------------------------------------------
 * Log lines.
 * -------------------------------------------------------------------------------------- */

static struct {
    char lines[2 * LOOP_LOG_LINES][LOOP_LOG_LINE];
    size_t count;
} logged;

static void log_collect(void *arg, const char *line)
{
    (void)arg;
    assert_true(logged.count < 2 * LOOP_LOG_LINES);
    snprintf(logged.lines[logged.count++], LOOP_LOG_LINE, "%s", line);
}

static void log_lines_arrive_in_order_when_the_queue_runs(void **state)
{
    struct loop *loop = *state;
    struct test_event events[1];

    loop->log    = log_collect;
    logged.count = 0;
    loop_log(loop, "line %d", 1);
    loop_log(loop, "line %d", 2);
    assert_int_equal(logged.count, 0);
    assert_false(loop_queue_empty(loop));
    loop_log(loop, "line %d", 3);
    assert_int_equal(loop_queue_run(loop), 0);
    assert_int_equal(logged.count, 3);
    assert_string_equal(logged.lines[0], "line 1");
    assert_string_equal(logged.lines[1], "line 2");
    assert_string_equal(logged.lines[2], "line 3");
    assert_true(loop_queue_empty(loop));

    /* A line logged by a completion arrives in the same run, after the earlier lines. */
    logged.count = 0;
    events_init(events, 1, loop);
    events[0].log = "from the completion";
    loop_log(loop, "before");
    loop_queue(loop, &events[0].event);
    assert_int_equal(loop_queue_run(loop), 1);
    assert_int_equal(logged.count, 2);
    assert_string_equal(logged.lines[0], "before");
    assert_string_equal(logged.lines[1], "from the completion");
    ran.count = 0;
}

static void more_log_lines_than_fit_in_one_turn_give_one_dropped_line(void **state)
{
    struct loop *loop = *state;
    char expected[LOOP_LOG_LINE];

    loop->log    = log_collect;
    logged.count = 0;
    /* each says whether its line was queued: a caller that logs a thing once needs to know */
    for (int i = 0; i < LOOP_LOG_LINES + 5; i++)
        assert_int_equal(loop_log(loop, "line %d", i), i < LOOP_LOG_LINES);
    assert_int_equal(loop_queue_run(loop), 0);
    assert_int_equal(logged.count, LOOP_LOG_LINES + 1);
    for (int i = 0; i < LOOP_LOG_LINES; i++) {
        snprintf(expected, sizeof(expected), "line %d", i);
        assert_string_equal(logged.lines[i], expected);
    }
    assert_non_null(strstr(logged.lines[LOOP_LOG_LINES], "5 log lines dropped"));
    assert_true(loop_queue_empty(loop));

    /* The next turn starts from nothing dropped. */
    logged.count = 0;
    loop_log(loop, "next turn");
    assert_int_equal(loop_queue_run(loop), 0);
    assert_int_equal(logged.count, 1);
    assert_string_equal(logged.lines[0], "next turn");
}

/* Issue 24: at KVX_LOG_WARN (log_quiet) info lines are not kept, warnings are. */
static void info_lines_are_kept_only_at_the_info_level(void **state)
{
    struct loop *loop = *state;

    loop->log       = log_collect;
    logged.count    = 0;
    loop->log_quiet = true;
    loop_info(loop, "info %d", 1);
    loop_log(loop, "warning %d", 1);
    loop->log_quiet = false;
    loop_info(loop, "info %d", 2);
    assert_int_equal(loop_queue_run(loop), 0);
    assert_int_equal(logged.count, 2);
    assert_string_equal(logged.lines[0], "warning 1");
    assert_string_equal(logged.lines[1], "info 2");
}

/* A warning a peer can repeat at will: at most LOOP_LIMIT_LINES a window, the rest counted
 * in one line when the next window opens (on the clock given, never the wall's). */
static void limited_lines_keep_five_a_window_and_count_the_rest(void **state)
{
    struct loop *loop       = *state;
    struct loop_limit limit = {0};
    const uint64_t start_ms = 5000;

    loop->log    = log_collect;
    logged.count = 0;
    for (int i = 0; i < LOOP_LIMIT_LINES + 3; i++)
        loop_log_limited(loop, &limit, start_ms + (uint64_t)i, "refusals", "refused %d", i);
    loop_log_limited(loop, &limit, start_ms + LOOP_LIMIT_MS - 1, "refusals", "refused late");
    assert_int_equal(loop_queue_run(loop), 0);
    assert_int_equal(logged.count, LOOP_LIMIT_LINES);
    assert_string_equal(logged.lines[LOOP_LIMIT_LINES - 1], "refused 4");

    logged.count = 0;
    loop_log_limited(loop, &limit, start_ms + LOOP_LIMIT_MS, "refusals", "refused next");
    assert_int_equal(loop_queue_run(loop), 0);
    assert_int_equal(logged.count, 2);
    assert_string_equal(logged.lines[0],
                        "4 more refusals not logged in 10 s (at most 5 lines each)");
    assert_string_equal(logged.lines[1], "refused next");
}

/* ----------------------------------------------------------------------------------------
 * The descriptor.
 * -------------------------------------------------------------------------------------- */

static bool readable_within(const struct loop *loop, int timeout_ms)
{
    struct pollfd pfd = {.fd = loop->epoll_fd, .events = POLLIN};
    int n             = poll(&pfd, 1, timeout_ms);

    assert_true(n >= 0);
    return n > 0 && (pfd.revents & POLLIN) != 0;
}

static void noop_fire(struct loop_timer *timer)
{
    (void)timer;
}

static void descriptor_is_readable_when_busy_woken_or_due_and_not_before(void **state)
{
    struct loop *loop = *state;
    struct loop_timer timer;
    struct test_event events[1];
    uint64_t deadline;

    /* Busy: readable at once, until a turn that found nothing prepares to sleep. */
    loop_prepare_sleep(loop, true);
    assert_true(readable_within(loop, 0));
    loop_prepare_sleep(loop, false);
    assert_false(readable_within(loop, 0));

    /* Woken from outside the loop (twice: one write): the same. */
    loop_wake(loop);
    loop_wake(loop);
    assert_true(readable_within(loop, 0));
    loop_prepare_sleep(loop, false);
    assert_false(readable_within(loop, 0));

    /* A queued completion is work too. */
    events_init(events, 1, loop);
    loop_queue(loop, &events[0].event);
    loop_prepare_sleep(loop, false);
    assert_true(readable_within(loop, 0));
    loop_queue_run(loop);
    loop_prepare_sleep(loop, false);
    assert_false(readable_within(loop, 0));

    /* A timer ahead: readable once it is due, never before. */
    loop_timer_init(&timer, noop_fire);
    deadline = clock_ms() + 50;
    assert_int_equal(loop_timer_start(loop, &timer, deadline), KVX_OK);
    loop_prepare_sleep(loop, false);
    assert_true(readable_within(loop, WAKE_MS));
    assert_true(clock_ms() >= deadline);
    loop_wait_done(loop); /* consumes the expiry */
    assert_int_equal(loop_timers_run(loop, clock_ms()), 1);
    loop_prepare_sleep(loop, false);
    assert_false(readable_within(loop, 0));

    /* A timer that the advanced clock made due: readable at once. */
    assert_int_equal(loop_timer_start(loop, &timer, clock_ms() + 60000), KVX_OK);
    loop_prepare_sleep(loop, false);
    assert_false(readable_within(loop, 0));
    clock_advance_ms(60000);
    loop_prepare_sleep(loop, false);
    assert_true(readable_within(loop, 0));
    loop_timer_stop(loop, &timer);
    loop_prepare_sleep(loop, false);
    assert_false(readable_within(loop, 0));
}

static void watched_descriptor_makes_the_loop_readable_until_unwatched(void **state)
{
    struct loop *loop = *state;
    int fds[2];

    assert_int_equal(pipe(fds), 0);
    assert_int_equal(loop_watch_fd(loop, fds[0], false), KVX_OK);
    assert_int_equal(loop_watch_fd(loop, fds[0], false), KVX_OK); /* twice: still fine */
    assert_int_equal(loop_watch_fd(loop, -1, false), KVX_OK);     /* no descriptor: nothing */
    loop_prepare_sleep(loop, false);
    assert_false(readable_within(loop, 0));
    assert_int_equal(write(fds[1], "x", 1), 1);
    assert_true(readable_within(loop, WAKE_MS));
    assert_false(loop_side_ready(loop)); /* not a side-channel descriptor */
    loop_unwatch_fd(loop, fds[0]);
    assert_false(readable_within(loop, 0));
    close(fds[0]);
    close(fds[1]);
}

/* What loop_prepare_sleep left holds until a wake, a queued completion or a timer that moves
 * the earliest deadline: then the loop must prepare again (the agent then arms again). */
static void a_prepared_sleep_holds_until_woken_queued_or_a_new_earliest_timer(void **state)
{
    struct loop *loop = *state;
    struct loop_timer early;
    struct loop_timer late;
    struct test_event events[1];

    loop_timer_init(&early, noop_fire);
    loop_timer_init(&late, noop_fire);
    loop_prepare_sleep(loop, false);
    assert_true(loop_sleep_prepared(loop));
    loop_wake(loop);
    assert_false(loop_sleep_prepared(loop));
    loop_prepare_sleep(loop, false);
    assert_true(loop_sleep_prepared(loop));

    assert_int_equal(loop_timer_start(loop, &late, clock_ms() + 60000), KVX_OK);
    assert_false(loop_sleep_prepared(loop)); /* the timer descriptor is not set for it */
    loop_prepare_sleep(loop, false);
    assert_true(loop_sleep_prepared(loop));
    assert_int_equal(loop_timer_start(loop, &early, clock_ms() + 30000), KVX_OK);
    assert_false(loop_sleep_prepared(loop));
    loop_prepare_sleep(loop, false);
    loop_timer_stop(loop, &late); /* not the earliest: nothing to set again */
    assert_true(loop_sleep_prepared(loop));
    loop_timer_stop(loop, &early);
    assert_false(loop_sleep_prepared(loop));
    loop_prepare_sleep(loop, false);
    assert_true(loop_sleep_prepared(loop));

    events_init(events, 1, loop);
    loop_queue(loop, &events[0].event);
    assert_false(loop_sleep_prepared(loop));
    loop_queue_run(loop);
    loop_prepare_sleep(loop, false);
    assert_true(loop_sleep_prepared(loop));
}

/* A side-channel descriptor wakes the loop as any other, and loop_side_ready says so too. */
static void a_side_descriptor_is_also_seen_by_loop_side_ready(void **state)
{
    struct loop *loop = *state;
    int fds[2];
    char c;

    assert_int_equal(pipe(fds), 0);
    assert_int_equal(loop_watch_fd(loop, fds[0], true), KVX_OK);
    loop_prepare_sleep(loop, false);
    assert_false(loop_side_ready(loop));
    assert_int_equal(write(fds[1], "x", 1), 1);
    assert_true(loop_side_ready(loop));
    assert_true(readable_within(loop, WAKE_MS));
    assert_int_equal(read(fds[0], &c, 1), 1);
    assert_false(loop_side_ready(loop));
    assert_int_equal(write(fds[1], "x", 1), 1);
    loop_unwatch_fd(loop, fds[0]);
    assert_false(loop_side_ready(loop));
    close(fds[0]);
    close(fds[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define LOOP_TEST(name) cmocka_unit_test_setup_teardown(name, loop_setup, loop_teardown)
        LOOP_TEST(timers_fire_once_in_deadline_order_only_when_due_and_stopped_ones_never),
        LOOP_TEST(timer_rearmed_from_fire_fires_again_at_each_new_deadline),
        LOOP_TEST(timers_started_from_fire_run_in_the_same_run_and_stopped_ones_never),
        LOOP_TEST(events_run_in_queue_order_and_queuing_twice_runs_once),
        LOOP_TEST(event_queued_while_the_queue_runs_waits_for_the_next_run),
        LOOP_TEST(unqueued_event_never_runs_and_the_queue_stays_whole),
        LOOP_TEST(log_lines_arrive_in_order_when_the_queue_runs),
        LOOP_TEST(more_log_lines_than_fit_in_one_turn_give_one_dropped_line),
        LOOP_TEST(info_lines_are_kept_only_at_the_info_level),
        LOOP_TEST(limited_lines_keep_five_a_window_and_count_the_rest),
        LOOP_TEST(descriptor_is_readable_when_busy_woken_or_due_and_not_before),
        LOOP_TEST(watched_descriptor_makes_the_loop_readable_until_unwatched),
        LOOP_TEST(a_prepared_sleep_holds_until_woken_queued_or_a_new_earliest_timer),
        LOOP_TEST(a_side_descriptor_is_also_seen_by_loop_side_ready),
#undef LOOP_TEST
    };

    setenv("UCX_NET_DEVICES", "lo", 1); /* never another interface */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

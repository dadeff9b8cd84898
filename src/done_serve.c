/* done_serve.c: answering dones on the prefill side. A done is counted (or refused) by the
 * hold table and answered at once; one that carries a token for a request neither held nor
 * remembered as ended came before its hold and waits for it (early.h), with a timer of its
 * own on the agent's clock. Nothing here releases a hold other than through the table. */
#include "done_serve.h"

#include "clock.h"
#include "hold.h"
#include "notify.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* A done waiting for its hold. */
struct parked_done {
    struct early_entry entry; /* first: the list's entry is the done */
    struct core *core;
    struct sidechan_server *side;
    uint32_t rank;
    kvx_token_t token;
    struct sidechan_origin origin;
    struct loop_timer deadline;
};

static void answer(struct sidechan_server *side, const struct sidechan_origin *origin, bool counted,
                   const char *what)
{
    char text[DONE_REASON_SIZE + 32];
    size_t length = done_answer_format(text, sizeof(text), counted, what);

    sidechan_reply(side, origin, text, length);
}

/* Counts the done in the hold table, for the rank it names over the connection it came by
 * (hold.h: a rank is bound to one connection, a connection to one rank), and answers what it
 * did. A done without a token for a request not held now (kvx fetch against kvx serve
 * without holds, whose request ids are labels that may repeat) involves no hold and is
 * answered "nothing held"; with a token, one for a request not held is refused by what the
 * ring knows of it. */
static void done_apply(struct core *core, struct sidechan_server *side,
                       const struct sidechan_origin *origin, uint64_t request_id, uint32_t rank,
                       const kvx_token_t *token)
{
    enum hold_done done =
        hold_table_done(core->holds, request_id, rank, sidechan_origin_key(origin), token);
    char reason[DONE_REASON_SIZE];

    if (done == HOLD_DONE_COUNTED || done == HOLD_DONE_RELEASED) {
        loop_info(&core->loop, "request %" PRIu64 ": done of rank %" PRIu32 " counted%s",
                  request_id, rank, done == HOLD_DONE_RELEASED ? ", the last one" : "");
        answer(side, origin, true, done == HOLD_DONE_RELEASED ? "released" : "counted");
        return;
    }
    if ((done == HOLD_DONE_UNKNOWN || done == HOLD_DONE_ENDED || done == HOLD_DONE_EXPIRED) &&
        !hold_token_given(token)) {
        loop_info(&core->loop, "request %" PRIu64 ": done of rank %" PRIu32 ": nothing held",
                  request_id, rank);
        answer(side, origin, true, "nothing held");
        return;
    }
    if (done == HOLD_DONE_UNKNOWN)
        snprintf(reason, sizeof(reason), "no such request: not held within %" PRIu32 " ms",
                 core->timeout_ms);
    else if (done == HOLD_DONE_OUTSIDE || done == HOLD_DONE_TAKEN || done == HOLD_DONE_SWITCHED)
        snprintf(reason, sizeof(reason), "rank %" PRIu32 ": %s", rank, hold_done_reason(done));
    else
        snprintf(reason, sizeof(reason), "%s", hold_done_reason(done));
    /* always logged, as the decode side is told: a peer may repeat it at will, so limited */
    loop_log_limited(&core->loop, &core->dones_refused_log, clock_ms(), "refused dones",
                     "request %" PRIu64 ": done refused: %s", request_id, reason);
    answer(side, origin, false, reason);
}

static void parked_free(struct parked_done *p)
{
    loop_timer_stop(&p->core->loop, &p->deadline);
    early_unpark(&p->core->early, &p->entry);
    free(p);
}

/* Its hold was made (kvx_hold): applied as if it had just arrived, token check included. */
static void parked_held(struct early_entry *entry)
{
    struct parked_done *p = (struct parked_done *)entry;

    done_apply(p->core, p->side, &p->origin, entry->request_id, p->rank, &p->token);
    parked_free(p);
}

/* No hold within the agent's timeout: "no such request". */
static void parked_expired(struct loop_timer *timer)
{
    struct parked_done *p =
        (struct parked_done *)((char *)timer - offsetof(struct parked_done, deadline));

    done_apply(p->core, p->side, &p->origin, p->entry.request_id, p->rank, &p->token);
    parked_free(p);
}

/* Parks a done that came before its hold; refuses it when too many wait already. */
static void done_park(struct core *core, struct sidechan_server *side,
                      const struct sidechan_request *request, uint64_t request_id, uint32_t rank,
                      const kvx_token_t *token)
{
    struct parked_done *p = calloc(1, sizeof(*p));
    char reason[DONE_REASON_SIZE];

    if (p != NULL) {
        *p = (struct parked_done){.entry  = {.request_id = request_id, .held = parked_held},
                                  .core   = core,
                                  .side   = side,
                                  .rank   = rank,
                                  .token  = *token,
                                  .origin = request->origin};
        loop_timer_init(&p->deadline, parked_expired);
    }
    if (p != NULL && early_park(&core->early, &p->entry) &&
        loop_timer_start(&core->loop, &p->deadline, clock_ms() + core->timeout_ms) == KVX_OK)
        return;
    if (p != NULL)
        parked_free(p);
    snprintf(reason, sizeof(reason), "too many early dones: %d wait for their hold already",
             EARLY_MAX);
    loop_log_limited(&core->loop, &core->dones_refused_log, clock_ms(), "refused dones",
                     "request %" PRIu64 ": done refused: %s", request_id, reason);
    answer(side, &request->origin, false, reason);
}

void done_serve(struct core *core, struct sidechan_server *side,
                const struct sidechan_request *request)
{
    uint64_t request_id;
    uint32_t rank;
    kvx_token_t token;
    uint64_t bytes;
    bool bytes_stated;
    char reason[DONE_REASON_SIZE];

    if (!notify_done_parse(request->body, request->body_size, &request_id, &rank, &token, &bytes,
                           &bytes_stated)) {
        core->stats.notifications_dropped++;
        snprintf(reason, sizeof(reason), "malformed done: %zu bytes", request->body_size);
        loop_log_limited(&core->loop, &core->dones_refused_log, clock_ms(), "refused dones",
                         "a done refused: %s", reason);
        answer(side, &request->origin, false, reason);
        return;
    }
    core->stats.notifications++;
    /* The read is over whatever the hold says of it: its bytes were served (an older decode
     * agent's done says nothing of them, and counts nothing here). */
    if (bytes_stated && bytes > 0) {
        core->stats.served_transfers++;
        core->stats.served_bytes += bytes;
    }
    if (hold_token_given(&token) && hold_table_state(core->holds, request_id) == HOLD_NONE)
        done_park(core, side, request, request_id, rank, &token);
    else
        done_apply(core, side, &request->origin, request_id, rank, &token);
}

void dones_drop(struct core *core)
{
    for (struct early_entry *entry = core->early.head, *next; entry != NULL; entry = next) {
        next = entry->next;
        if (entry->held == parked_held)
            parked_free((struct parked_done *)entry);
    }
}

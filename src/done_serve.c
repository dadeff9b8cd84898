/* done_serve.c: answering dones on the prefill side. A done is counted (or refused) by the
 * hold table and answered at once; one that carries a token for a request neither held nor
 * remembered as ended came before its hold and waits for it (early.h), with a timer of its
 * own on the agent's clock, within its connection's share. Nothing here releases a hold
 * other than through the table.
 * A done that came as a message on the data plane is answered the same way, to its sender
 * at once; one that would wait (early), or whose handle is not known, is answered "resend it
 * on the side channel", whose connection a parked done answers later. */
#include "done_serve.h"

#include "clock.h"
#include "done_handles.h"
#include "hold.h"
#include "notify.h"
#include "push_request.h"
#include "transport.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A done waiting for its hold. */
struct parked_done {
    struct early_entry entry; /* first: the list's entry is the done */
    struct core *core;
    struct sidechan_server *side;
    uint32_t rank;
    kvx_token_t token;
    struct sidechan_origin origin;
    struct done_conn_mark mark; /* its connection's, to tell when nobody waits for the answer */
    struct loop_timer deadline;
};

/* The answer's text into text[DONE_ANSWER_SIZE]; its length. */
#define DONE_ANSWER_SIZE (DONE_REASON_SIZE + 32)

static void answer(struct sidechan_server *side, const struct sidechan_origin *origin, bool counted,
                   const char *what)
{
    char text[DONE_ANSWER_SIZE];
    size_t length = done_answer_format(text, sizeof(text), counted, what);

    sidechan_reply(side, origin, text, length);
}

/* Counts the done in the hold table, for the rank it names over the connection `conn` it came
 * by (hold.h: a rank is bound to one connection, a connection to one rank), and writes the
 * answer that says what it did into text[DONE_ANSWER_SIZE]; returns its length. A done
 * without a token for a request not held now (kvx fetch against kvx serve without holds,
 * whose request ids are labels that may repeat) involves no hold and is answered "nothing
 * held"; with a token, one for a request not held is refused by what the ring knows of it. */
static size_t done_judge(struct core *core, uint64_t conn, uint64_t request_id, uint32_t rank,
                         const kvx_token_t *token, char *text)
{
    enum hold_done done = hold_table_done(core->holds, request_id, rank, conn, token);
    char reason[DONE_REASON_SIZE];

    if (done == HOLD_DONE_COUNTED || done == HOLD_DONE_RELEASED) {
        loop_info(&core->loop, "request %" PRIu64 ": done of rank %" PRIu32 " counted%s",
                  request_id, rank, done == HOLD_DONE_RELEASED ? ", the last one" : "");
        return done_answer_format(text, DONE_ANSWER_SIZE, true,
                                  done == HOLD_DONE_RELEASED ? "released" : "counted");
    }
    if ((done == HOLD_DONE_UNKNOWN || done == HOLD_DONE_ENDED || done == HOLD_DONE_EXPIRED) &&
        !hold_token_given(token)) {
        loop_info(&core->loop, "request %" PRIu64 ": done of rank %" PRIu32 ": nothing held",
                  request_id, rank);
        return done_answer_format(text, DONE_ANSWER_SIZE, true, "nothing held");
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
    return done_answer_format(text, DONE_ANSWER_SIZE, false, reason);
}

/* Judges a done that came on the side channel and answers it there. */
static void done_apply(struct core *core, struct sidechan_server *side,
                       const struct sidechan_origin *origin, uint64_t request_id, uint32_t rank,
                       const kvx_token_t *token)
{
    char text[DONE_ANSWER_SIZE];
    size_t length =
        done_judge(core, sidechan_origin_key(origin), request_id, rank, token, text);

    sidechan_reply(side, origin, text, length);
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

/* Frees every parked done whose connection closed: nobody waits for its answer, and a hold
 * made later waits for the rank's done again (or its lease), as if the done had never come.
 * Only when the list is full, and at most once per EARLY_MAX / 4 parked, so the look at each
 * (a system call) costs at most four a park. Connections open at once fill little more than
 * half of it (early.h), so after a look at least 3,840 must park to fill it again: the bound
 * on looks never keeps a full list of closed connections' dones. */
static void dones_sweep(struct core *core)
{
    struct early_list *list = &core->early;

    if (list->count < EARLY_MAX || list->parked - list->swept < EARLY_MAX / 4)
        return;
    list->swept = list->parked;
    for (struct early_entry *entry = list->head, *next; entry != NULL; entry = next) {
        next = entry->next;
        if (entry->held == parked_held && done_conn_closed(&((struct parked_done *)entry)->mark))
            parked_free((struct parked_done *)entry);
    }
}

/* Parks a done that came before its hold; refuses it when its connection's share is taken
 * (early.h: a connection crowds out only itself), or when the list is full even of what
 * closed connections left. */
static void done_park(struct core *core, struct sidechan_server *side,
                      const struct sidechan_request *request, uint64_t request_id, uint32_t rank,
                      const kvx_token_t *token)
{
    uint64_t conn         = sidechan_origin_key(&request->origin);
    struct parked_done *p = NULL;
    char reason[DONE_REASON_SIZE];

    if (early_conn_count(&core->early, conn) >= EARLY_PER_CONN) {
        snprintf(reason, sizeof(reason),
                 "too many early dones: %d wait for their hold over this connection already",
                 EARLY_PER_CONN);
        goto refuse;
    }
    dones_sweep(core);
    p = calloc(1, sizeof(*p));
    if (p != NULL) {
        *p = (struct parked_done){
            .entry  = {.request_id = request_id, .conn = conn, .held = parked_held},
            .core   = core,
            .side   = side,
            .rank   = rank,
            .token  = *token,
            .origin = request->origin,
            .mark   = done_conn_mark(request->fd)};
        loop_timer_init(&p->deadline, parked_expired);
    }
    if (p != NULL && early_park(&core->early, &p->entry) &&
        loop_timer_start(&core->loop, &p->deadline, clock_ms() + core->timeout_ms) == KVX_OK)
        return;
    if (p != NULL)
        parked_free(p);
    snprintf(reason, sizeof(reason), "too many early dones: %d wait for their hold already",
             EARLY_MAX);
refuse:
    loop_log_limited(&core->loop, &core->dones_refused_log, clock_ms(), "refused dones",
                     "request %" PRIu64 ": done refused: %s", request_id, reason);
    answer(side, &request->origin, false, reason);
}

/* A done's fields. */
struct done_fields {
    uint64_t request_id;
    uint32_t rank;
    kvx_token_t token;
    uint64_t bytes;
    bool bytes_stated;
};

/* Parses a done, or writes the answer that refuses malformed bytes (its length in
 * *refused_p). */
static bool done_read(struct core *core, const void *body, size_t size, struct done_fields *d,
                      char *text, size_t *refused_p)
{
    char reason[DONE_REASON_SIZE];

    if (!notify_done_parse(body, size, &d->request_id, &d->rank, &d->token, &d->bytes,
                           &d->bytes_stated)) {
        core->stats.notifications_dropped++;
        snprintf(reason, sizeof(reason), "malformed done: %zu bytes", size);
        loop_log_limited(&core->loop, &core->dones_refused_log, clock_ms(), "refused dones",
                         "a done refused: %s", reason);
        *refused_p = done_answer_format(text, DONE_ANSWER_SIZE, false, reason);
        return false;
    }
    return true;
}

/* Counts a done taken (a resent one counts where it is taken). The read is over whatever the
 * hold says of it: its bytes were served (an older decode agent's done says nothing of them,
 * and counts nothing here). */
static void done_count(struct core *core, const struct done_fields *d)
{
    core->stats.notifications++;
    if (d->bytes_stated && d->bytes > 0) {
        core->stats.served_transfers++;
        core->stats.served_bytes += d->bytes;
    }
}

/* Whether the done came before its hold, and must wait for it (early.h). */
static bool done_early(struct core *core, const struct done_fields *d)
{
    return hold_token_given(&d->token) && hold_table_state(core->holds, d->request_id) == HOLD_NONE;
}

void done_serve(struct core *core, struct sidechan_server *side,
                const struct sidechan_request *request)
{
    struct done_fields d;
    char text[DONE_ANSWER_SIZE];
    size_t refused;

    if (!done_read(core, request->body, request->body_size, &d, text, &refused)) {
        sidechan_reply(side, &request->origin, text, refused);
        return;
    }
    done_count(core, &d);
    if (done_early(core, &d))
        done_park(core, side, request, d.request_id, d.rank, &d.token);
    else
        done_apply(core, side, &request->origin, d.request_id, d.rank, &d.token);
}

void done_serve_handle(struct core *core, struct sidechan_server *side,
                       const struct sidechan_request *request)
{
    uint8_t handle[DONE_HANDLE_LEN];
    uint8_t key[MSG_MAC_KEY_LEN];
    char text[sizeof(REPLY_DONE_HANDLE) + 2 * (DONE_HANDLE_LEN + MSG_MAC_KEY_LEN) + 2];
    struct done_conn_mark mark = done_conn_mark(request->fd);
    size_t n;

    if (done_handle_issue(&core->done_handles, sidechan_origin_key(&request->origin), &mark,
                          handle, key) != KVX_OK) {
        n = (size_t)snprintf(text, sizeof(text), "%s%s", REPLY_ERROR, "no done handle");
        sidechan_reply(side, &request->origin, text, n);
        return;
    }
    n = (size_t)snprintf(text, sizeof(text), "%s ", REPLY_DONE_HANDLE);
    for (size_t i = 0; i < DONE_HANDLE_LEN; i++)
        n += (size_t)snprintf(text + n, sizeof(text) - n, "%02x", handle[i]);
    n += (size_t)snprintf(text + n, sizeof(text) - n, " ");
    for (size_t i = 0; i < MSG_MAC_KEY_LEN; i++)
        n += (size_t)snprintf(text + n, sizeof(text) - n, "%02x", key[i]);
    sidechan_reply(side, &request->origin, text, n);
}

void done_serve_message(struct core *core, const void *data, size_t size, bool with_read,
                        bool sent, const struct transport_msg_from *from)
{
    struct push_am_answer answer = {0};
    uint8_t framed[PUSH_AM_MAX];
    char text[DONE_ANSWER_SIZE];
    struct done_fields d;
    const void *body;
    size_t body_size;
    const uint8_t *done;
    size_t done_size;
    enum done_handle_check check;
    uint64_t conn = 0;

    /* Not one of ours, or no handle to answer with: dropped, its sender's deadline answers. */
    if (!push_am_request_parse(data, size, &answer.id, &body, &body_size) ||
        body_size <= DONE_MESSAGE_HEAD) {
        core->stats.notifications_dropped++;
        return;
    }
    memcpy(answer.handle, body, DONE_HANDLE_LEN);
    done      = (const uint8_t *)body + DONE_MESSAGE_HEAD;
    done_size = body_size - DONE_MESSAGE_HEAD;
    check = done_handle_conn(core->done_handles, answer.handle,
                             (const uint8_t *)body + DONE_HANDLE_LEN, done, done_size, &conn);
    /* Changed or made by a third party who saw the handle on the data plane (issue 36 finding
     * 4): dropped unanswered; the real sender's done is still to come. */
    if (sent && check == DONE_HANDLE_FORGED) {
        core->stats.notifications_dropped++;
        return;
    }
    /* Evicted or never ours; or with a read that was refused or whose answer could not be
     * sent (transport.h, the read hook): sent back, to come again on the side channel. */
    if (!sent || check != DONE_HANDLE_OK) {
        answer.text_size = strlen(DONE_ANSWER_RESEND);
        memcpy(text, DONE_ANSWER_RESEND, answer.text_size);
    } else if (done_read(core, done, done_size, &d, text, &answer.text_size)) {
        if (done_early(core, &d)) { /* parked on the side channel, whose answer can wait */
            answer.text_size = strlen(DONE_ANSWER_RESEND);
            memcpy(text, DONE_ANSWER_RESEND, answer.text_size);
        } else {
            done_count(core, &d);
            core->stats.dones_by_message++;
            core->stats.dones_with_reads += with_read;
            answer.text_size = done_judge(core, conn, d.request_id, d.rank, &d.token, text);
        }
    }
    answer.text = text;
    transport_msg_reply(from, CORE_AM_DONE_ANSWER, framed, push_am_answer_frame(&answer, framed));
}

void dones_drop(struct core *core)
{
    for (struct early_entry *entry = core->early.head, *next; entry != NULL; entry = next) {
        next = entry->next;
        if (entry->held == parked_held)
            parked_free((struct parked_done *)entry);
    }
    early_list_free(&core->early); /* after the pushes (agent_free): nothing waits now */
}

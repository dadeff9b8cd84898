/* stats.c: power-of-two histograms, and an agent's counters in Prometheus's text format so a
 * scrape needs no translation. */
#include "stats.h"

#include "error.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void histogram_add(kvx_histogram_t *histogram, double value)
{
    int bucket = 0;

    if (value > 1) {
        frexp(value, &bucket); /* value = m * 2^bucket with m in [0.5, 1) */
        if (ldexp(1, bucket - 1) == value)
            bucket--; /* an exact power of two belongs to its own bucket */
    }
    if (bucket >= KVX_HISTOGRAM_BUCKETS)
        bucket = KVX_HISTOGRAM_BUCKETS - 1;
    histogram->count++;
    histogram->sum += value;
    histogram->buckets[bucket]++;
}

/* A growing text buffer; `failed` sticks once an allocation failed. */
struct text {
    char *data;
    size_t length;
    size_t capacity;
    bool failed;
};

__attribute__((format(printf, 2, 3))) static void text_printf(struct text *t, const char *format,
                                                              ...)
{
    va_list args;
    int n;

    for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
        va_start(args, format);
        n = vsnprintf(t->data + t->length, t->capacity - t->length, format, args);
        va_end(args);
        if (n < 0) {
            t->failed = true;
        } else if ((size_t)n < t->capacity - t->length) {
            t->length += (size_t)n;
            return;
        } else {
            size_t capacity = 2 * t->capacity + (size_t)n + 1;
            char *data      = realloc(t->data, capacity);

            t->failed   = data == NULL;
            t->data     = data != NULL ? data : t->data;
            t->capacity = data != NULL ? capacity : t->capacity;
        }
    }
}

static void counter(struct text *t, const char *labels, const char *name, const char *help,
                    uint64_t value)
{
    text_printf(t, "# HELP kvx_%s %s\n# TYPE kvx_%s counter\nkvx_%s{%s} %" PRIu64 "\n", name, help,
                name, name, labels, value);
}

/* A histogram whose observations are in units of `scale` of the exposed unit (1e-6 for
 * microseconds exposed as seconds); buckets are cumulative, as Prometheus wants. */
static void histogram(struct text *t, const char *labels, const char *name, const char *help,
                      const kvx_histogram_t *h, double scale)
{
    uint64_t cumulative = 0;

    text_printf(t, "# HELP kvx_%s %s\n# TYPE kvx_%s histogram\n", name, help, name);
    for (int i = 0; i < KVX_HISTOGRAM_BUCKETS - 1; i++) {
        cumulative += h->buckets[i];
        text_printf(t, "kvx_%s_bucket{%s,le=\"%.9g\"} %" PRIu64 "\n", name, labels,
                    ldexp(1, i) * scale, cumulative);
    }
    text_printf(t, "kvx_%s_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", name, labels, h->count);
    text_printf(t, "kvx_%s_sum{%s} %.17g\nkvx_%s_count{%s} %" PRIu64 "\n", name, labels,
                h->sum * scale, name, labels, h->count);
}

/* agent="NAME" with the name escaped as label values must be. */
static void label_agent(struct text *t, const char *name)
{
    text_printf(t, "agent=\"");
    for (const char *c = name; *c != '\0'; c++) {
        if (*c == '\\' || *c == '"')
            text_printf(t, "\\%c", *c);
        else if (*c == '\n')
            text_printf(t, "\\n");
        else
            text_printf(t, "%c", *c);
    }
    text_printf(t, "\"");
}

kvx_status_t kvx_agent_stats_prometheus(const kvx_agent_stats_t *s, const char *agent_name,
                                        char **text_p)
{
    struct text labels = {0};
    struct text t      = {0};
    const char *l;

    if (s == NULL || text_p == NULL)
        return error_set(KVX_ERR_INVALID, "stats: stats and result are required");
    label_agent(&labels, agent_name != NULL ? agent_name : "kvx");
    l = labels.data != NULL ? labels.data : "";
    counter(&t, l, "transfers_total", "Transfers completed.", s->transfers);
    counter(&t, l, "transfers_failed_total", "Transfers failed, cancelled or past their deadline.",
            s->transfers_failed);
    counter(&t, l, "transfer_bytes_total", "Bytes of completed transfers.", s->bytes);
    counter(&t, l, "notifications_failed_total", "Done notifications that could not be sent.",
            s->notifications_failed);
    counter(&t, l, "heartbeats_sent_total", "Heartbeats sent to prefill peers.",
            s->heartbeats_sent);
    counter(&t, l, "heartbeats_missed_total", "Heartbeats a peer did not answer in time.",
            s->heartbeats_missed);
    counter(&t, l, "peers_dead_total", "Peers declared dead: transport error, silence or restart.",
            s->peers_dead);
    counter(&t, l, "peers_idle_total", "Peers dropped after the idle TTL.", s->peers_idle);
    histogram(&t, l, "transfer_duration_seconds", "Transfer time, post to completion.",
              &s->transfer_us, 1e-6);
    histogram(&t, l, "post_duration_seconds", "Planning and posting time per transfer.",
              &s->post_us, 1e-6);
    histogram(&t, l, "transfer_size_bytes", "Bytes per transfer.", &s->transfer_bytes, 1);
    histogram(&t, l, "transfer_descriptors", "Descriptors posted per transfer.",
              &s->transfer_descriptors, 1);
    counter(&t, l, "notifications_received_total", "Done and heartbeat notifications received.",
            s->notifications);
    counter(&t, l, "notifications_dropped_total", "Malformed notifications, counted and ignored.",
            s->notifications_dropped);
    text_printf(&t,
                "# HELP kvx_held_requests Requests held for their consumers now.\n"
                "# TYPE kvx_held_requests gauge\nkvx_held_requests{%s} %" PRIu64 "\n",
                l, s->held);
    counter(&t, l, "released_total", "Held requests released after every consumer's done.",
            s->released);
    counter(&t, l, "done_unknown_total", "Done for a request not held: never, or released.",
            s->done_unknown);
    counter(&t, l, "leases_expired_total", "Held requests released when their lease expired.",
            s->leases_expired);
    counter(&t, l, "done_repeated_total", "Done from a rank that reported that request already.",
            s->done_repeated);
    counter(&t, l, "pushes_refused_total", "Push requests answered with an error.",
            s->pushes_refused);
    counter(&t, l, "auth_refused_total",
            "Side-channel handshakes refused: no auth key, or another one.", s->auth_refused);
    counter(&t, l, "peers_refused_total", "Side-channel connections refused past max_peers.",
            s->peers_refused);
    counter(&t, l, "handshakes_refused_total",
            "Side-channel connections closed in their handshake: past the bound of handshakes, "
            "or of one address's.",
            s->handshakes_refused);
    counter(&t, l, "tokens_refused_total", "Dones and heartbeats with a wrong hold token.",
            s->tokens_refused);
    counter(&t, l, "transfers_verified_total",
            "Transfers whose checksums were compared with the prefill side's.",
            s->transfers_verified);
    counter(&t, l, "verify_mismatches_total",
            "Verified (region, block) segments whose checksums differed.", s->verify_mismatches);
    counter(&t, l, "verify_failed_total",
            "Verifications that could not finish: refused, timed out, peer down.",
            s->verify_failed);
    counter(&t, l, "verify_hashed_bytes_total", "Bytes this agent hashed for verification.",
            s->verify_bytes_hashed);
    text_printf(&t,
                "# HELP kvx_verify_hash_seconds_total Time this agent spent hashing for "
                "verification.\n# TYPE kvx_verify_hash_seconds_total counter\n"
                "kvx_verify_hash_seconds_total{%s} %.9f\n",
                l, (double)s->verify_ns * 1e-9);
    counter(&t, l, "verify_served_total", "Checksum requests answered (prefill side).",
            s->verify_served);
    counter(&t, l, "verify_refused_total",
            "Checksum requests refused: malformed, or a range outside the storages.",
            s->verify_refused);
    counter(&t, l, "dones_refused_total",
            "Dones a prefill rank refused: wrong token, hold ended, repeated, no such request.",
            s->dones_refused);
    counter(&t, l, "dones_early_total",
            "Dones and pushes that came before their hold and waited for it (prefill side).",
            s->dones_early);
    counter(&t, l, "data_reads_served_total", "Peers' reads of our storages served by kvx (TCP).",
            s->data_reads_served);
    counter(&t, l, "data_writes_served_total",
            "Peers' writes into our storages served by kvx (TCP, push).", s->data_writes_served);
    counter(&t, l, "data_refused_total",
            "Peers' reads and writes refused: wrong grant, outside the storages, malformed.",
            s->data_refused);
    counter(&t, l, "pushes_by_message_total",
            "Push requests that came on the data plane with a writer's handle (prefill side).",
            s->pushes_by_message);
    counter(&t, l, "push_messages_refused_total",
            "Push request messages refused: no writer of their handle, or malformed (prefill "
            "side).",
            s->push_messages_refused);
    counter(&t, l, "dones_rank_refused_total",
            "Dones refused for their rank: not the hold's consumer, or bound to another "
            "connection (prefill side).",
            s->dones_rank_refused);
    text_printf(&t,
                "# HELP kvx_ops_orphaned Operation records closed connections are still owed.\n"
                "# TYPE kvx_ops_orphaned gauge\nkvx_ops_orphaned{%s} %" PRIu64 "\n"
                "# HELP kvx_pushes_serving Pushes being written by this prefill agent now.\n"
                "# TYPE kvx_pushes_serving gauge\nkvx_pushes_serving{%s} %" PRIu64 "\n"
                "# HELP kvx_peers_connected Authenticated side-channel connections open now.\n"
                "# TYPE kvx_peers_connected gauge\nkvx_peers_connected{%s} %" PRIu64 "\n"
                "# HELP kvx_handshakes Side-channel connections open and not authenticated yet.\n"
                "# TYPE kvx_handshakes gauge\nkvx_handshakes{%s} %" PRIu64 "\n",
                l, s->ops_orphaned, l, s->pushes_serving, l, s->peers_connected, l,
                s->handshakes);
    free(labels.data);
    if (t.failed || labels.failed || t.data == NULL) {
        free(t.data);
        return error_no_memory("the metrics text");
    }
    *text_p = t.data;
    return KVX_OK;
}

/* stats_json.c: JSON of an agent's stats. Histograms are summarised (count, sum and the
 * bucket bounds of p50 and p99) rather than dumped: a script wants the figures, Prometheus
 * gets the buckets. */
#include "stats_json.h"

#include <inttypes.h>
#include <math.h>

void json_string_print(FILE *out, const char *text)
{
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)text; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(out, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(out, "\\u%04x", *c);
        else
            fputc(*c, out);
    }
    fputc('"', out);
}

/* The upper bound of the bucket holding quantile `q`: the figure is at most this. */
static double histogram_quantile(const kvx_histogram_t *h, double q)
{
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    uint64_t seen = 0;

    for (int i = 0; i < KVX_HISTOGRAM_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank && seen > 0)
            return ldexp(1, i);
    }
    return 0;
}

static void histogram_print(FILE *out, const char *name, const kvx_histogram_t *h)
{
    fprintf(out,
            "\"%s\": {\"count\": %" PRIu64
            ", \"sum\": %.17g, \"p50_le\": %.17g, \"p99_le\": %.17g}",
            name, h->count, h->sum, histogram_quantile(h, 0.5), histogram_quantile(h, 0.99));
}

void stats_json_print(FILE *out, const kvx_agent_stats_t *s)
{
    fprintf(out,
            "{\"transfers\": %" PRIu64 ", \"transfers_failed\": %" PRIu64 ", \"bytes\": %" PRIu64
            ", \"notifications_failed\": %" PRIu64 ", \"heartbeats_sent\": %" PRIu64
            ", \"heartbeats_missed\": %" PRIu64 ", \"peers_dead\": %" PRIu64
            ", \"peers_idle\": %" PRIu64 ", ",
            s->transfers, s->transfers_failed, s->bytes, s->notifications_failed,
            s->heartbeats_sent, s->heartbeats_missed, s->peers_dead, s->peers_idle);
    histogram_print(out, "transfer_us", &s->transfer_us);
    fputs(", ", out);
    histogram_print(out, "post_us", &s->post_us);
    fputs(", ", out);
    histogram_print(out, "transfer_bytes", &s->transfer_bytes);
    fputs(", ", out);
    histogram_print(out, "transfer_descriptors", &s->transfer_descriptors);
    fprintf(out,
            ", \"notifications\": %" PRIu64 ", \"notifications_dropped\": %" PRIu64
            ", \"held\": %" PRIu64 ", \"released\": %" PRIu64 ", \"done_unknown\": %" PRIu64
            ", \"leases_expired\": %" PRIu64 ", \"auth_refused\": %" PRIu64
            ", \"peers_refused\": %" PRIu64 ", \"handshakes_refused\": %" PRIu64
            ", \"tokens_refused\": %" PRIu64 ", ",
            s->notifications, s->notifications_dropped, s->held, s->released, s->done_unknown,
            s->leases_expired, s->auth_refused, s->peers_refused, s->handshakes_refused,
            s->tokens_refused);
    fprintf(out,
            "\"transfers_verified\": %" PRIu64 ", \"verify_mismatches\": %" PRIu64
            ", \"verify_failed\": %" PRIu64 ", \"verify_bytes_hashed\": %" PRIu64
            ", \"verify_ns\": %" PRIu64 ", \"verify_served\": %" PRIu64
            ", \"verify_refused\": %" PRIu64 ", ",
            s->transfers_verified, s->verify_mismatches, s->verify_failed, s->verify_bytes_hashed,
            s->verify_ns, s->verify_served, s->verify_refused);
    fprintf(out,
            "\"data_reads_served\": %" PRIu64 ", \"data_writes_served\": %" PRIu64
            ", \"data_refused\": %" PRIu64 ", \"served_transfers\": %" PRIu64
            ", \"served_bytes\": %" PRIu64 "}",
            s->data_reads_served, s->data_writes_served, s->data_refused, s->served_transfers,
            s->served_bytes);
}

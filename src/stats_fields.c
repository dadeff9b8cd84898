/* stats_fields.c: the one list of kvx_agent_stats_t's fields (name, Prometheus name, help,
 * kind), which Prometheus, kvx fetch --json and Python's stats dict all walk. Prints nothing.
 * A new field of the struct is one line here; test_stats fails until it is there. */
#include "kvx.h"

#include <stddef.h>

#define FIELD(field, kind_, metric_, scale_, help_)                                                \
    {                                                                                              \
        .name = #field, .metric = metric_, .help = help_, .kind = KVX_STAT_KIND_##kind_,           \
        .offset = offsetof(kvx_agent_stats_t, field), .scale = scale_                              \
    }
#define COUNTER(field, metric, help)          FIELD(field, COUNTER, metric, 1, help)
#define GAUGE(field, metric, help)            FIELD(field, GAUGE, metric, 1, help)
#define HISTOGRAM(field, metric, scale, help) FIELD(field, HISTOGRAM, metric, scale, help)

/* In the struct's order: test_stats checks that the entries tile the struct. */
static const kvx_stat_field_t stats_fields[] = {
    COUNTER(transfers, "transfers_total", "Transfers completed."),
    COUNTER(transfers_failed, "transfers_failed_total",
            "Transfers failed, cancelled or past their deadline."),
    COUNTER(bytes, "transfer_bytes_total", "Bytes of completed transfers."),
    COUNTER(notifications_failed, "notifications_failed_total",
            "Done notifications that could not be sent."),
    COUNTER(heartbeats_sent, "heartbeats_sent_total", "Heartbeats sent to prefill peers."),
    COUNTER(heartbeats_missed, "heartbeats_missed_total",
            "Heartbeats a peer did not answer in time."),
    COUNTER(peers_dead, "peers_dead_total",
            "Peers declared dead: transport error, silence or restart."),
    COUNTER(peers_idle, "peers_idle_total", "Peers dropped after the idle TTL."),
    HISTOGRAM(transfer_us, "transfer_duration_seconds", 1e-6, "Transfer time, post to completion."),
    HISTOGRAM(post_us, "post_duration_seconds", 1e-6, "Planning and posting time per transfer."),
    HISTOGRAM(transfer_bytes, "transfer_size_bytes", 1, "Bytes per transfer."),
    HISTOGRAM(transfer_descriptors, "transfer_descriptors", 1, "Descriptors posted per transfer."),
    COUNTER(notifications, "notifications_received_total",
            "Done and heartbeat notifications received."),
    COUNTER(notifications_dropped, "notifications_dropped_total",
            "Malformed notifications, counted and ignored."),
    GAUGE(held, "held_requests", "Requests held for their consumers now."),
    COUNTER(released, "released_total", "Held requests released after every consumer's done."),
    COUNTER(done_unknown, "done_unknown_total", "Done for a request not held: never, or released."),
    COUNTER(leases_expired, "leases_expired_total",
            "Held requests released when their lease expired."),
    COUNTER(done_repeated, "done_repeated_total",
            "Done from a rank that reported that request already."),
    GAUGE(ops_orphaned, "ops_orphaned", "Operation records closed connections are still owed."),
    GAUGE(pushes_serving, "pushes_serving", "Pushes being written by this prefill agent now."),
    COUNTER(pushes_refused, "pushes_refused_total", "Push requests answered with an error."),
    COUNTER(auth_refused, "auth_refused_total",
            "Side-channel handshakes refused: no auth key, or another one."),
    COUNTER(peers_refused, "peers_refused_total",
            "Side-channel connections refused past max_peers."),
    COUNTER(tokens_refused, "tokens_refused_total",
            "Dones and heartbeats with a wrong hold token."),
    GAUGE(peers_connected, "peers_connected", "Authenticated side-channel connections open now."),
    COUNTER(transfers_verified, "transfers_verified_total",
            "Transfers whose checksums were compared with the prefill side's."),
    COUNTER(verify_mismatches, "verify_mismatches_total",
            "Verified (region, block) segments whose checksums differed."),
    COUNTER(verify_failed, "verify_failed_total",
            "Verifications that could not finish: refused, timed out, peer down."),
    COUNTER(verify_bytes_hashed, "verify_hashed_bytes_total",
            "Bytes this agent hashed for verification."),
    FIELD(verify_ns, COUNTER, "verify_hash_seconds_total", 1e-9,
          "Time this agent spent hashing for verification."),
    COUNTER(verify_served, "verify_served_total", "Checksum requests answered (prefill side)."),
    COUNTER(verify_refused, "verify_refused_total",
            "Checksum requests refused: malformed, or a range outside the storages."),
    COUNTER(dones_refused, "dones_refused_total",
            "Dones a prefill rank refused: wrong token, hold ended, repeated, no such request."),
    COUNTER(dones_early, "dones_early_total",
            "Dones and pushes that came before their hold and waited for it (prefill side)."),
    COUNTER(data_reads_served, "data_reads_served_total",
            "Peers' reads of our storages served by kvx (TCP)."),
    COUNTER(data_writes_served, "data_writes_served_total",
            "Peers' writes into our storages served by kvx (TCP, push)."),
    COUNTER(data_refused, "data_refused_total",
            "Peers' reads and writes refused: wrong grant, outside the storages, malformed."),
    COUNTER(dones_rank_refused, "dones_rank_refused_total",
            "Dones refused for their rank: not the hold's consumer, or bound to another "
            "connection (prefill side)."),
    GAUGE(handshakes, "handshakes", "Side-channel connections open and not authenticated yet."),
    COUNTER(handshakes_refused, "handshakes_refused_total",
            "Side-channel connections closed in their handshake: past the bound of handshakes, "
            "or of one address's."),
    COUNTER(served_transfers, "served_transfers_total",
            "Reads of this prefill agent's blocks, from the decode ranks' dones."),
    COUNTER(served_bytes, "served_bytes_total", "Bytes decode ranks read from this prefill agent."),
    COUNTER(pushes_by_message, "pushes_by_message_total",
            "Push requests that came as data-plane messages with a registered writer's handle."),
    COUNTER(push_messages_refused, "push_messages_refused_total",
            "Push request messages refused: unknown handle, malformed, or past the queue."),
    COUNTER(dones_by_message, "dones_by_message_total",
            "Dones that came as data-plane messages with a connection's done handle (prefill "
            "side)."),
    COUNTER(dones_resent, "dones_resent_total",
            "Dones sent as messages that the prefill sent back: before their hold, an unknown "
            "handle, or with a read whose answer was not out yet (decode side)."),
    COUNTER(dones_with_reads, "dones_with_reads_total",
            "Dones judged as they came with their read, one message for a small pull (prefill "
            "side)."),
    COUNTER(pushes_as_reads, "pushes_as_reads_total",
            "Pushes to a prefill of this host carried as reads (decode side)."),
    COUNTER(pushes_with_bytes, "pushes_with_bytes_total",
            "Pushes answered with their bytes in one message, without puts (prefill side)."),
    COUNTER(peers_evicted, "peers_evicted_total",
            "Side-channel connections closed at max_peers to admit one from an address that "
            "held fewer."),
};

const kvx_stat_field_t *kvx_agent_stats_fields(size_t *count_p)
{
    *count_p = sizeof(stats_fields) / sizeof(stats_fields[0]);
    return stats_fields;
}

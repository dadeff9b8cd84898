/* fetch_peers.c: kvx fetch's prefill ranks: the --peer list, each rank's handshake checked
 * before any memory is allocated (kvx_peer_probe), then each connected; and the blocks a
 * failed transfer did not load, kept past the transfer for --json. */
#include "fetch_peers.h"

#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FETCH_RETRY_MS 100 /* between tries at a rank not listening yet (--wait-for-peers) */

/* The next address of a --peer list ("HOST:PORT,HOST:PORT") into `address`; false at its end. */
static bool peer_address_next(const char **list, char *address, size_t size)
{
    size_t len = strcspn(*list, ",");

    if (**list == '\0')
        return false;
    snprintf(address, size, "%.*s", (int)(len < size - 1 ? len : size - 1), *list);
    *list += len + ((*list)[len] == ',');
    return true;
}

static uint64_t monotonic_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Probes `address`; with `wait_ms` > 0 a rank where nothing listens yet (KVX_ERR_PEER_DOWN,
 * connection refused) is tried again every FETCH_RETRY_MS until wait_ms have passed, for a
 * decode process started before its prefill ranks. Every other failure ends it at once. */
static kvx_status_t peer_probe_waiting(const kvx_regions_t *regions,
                                       const kvx_agent_params_t *params, const char *address,
                                       uint64_t wait_ms)
{
    uint64_t deadline   = monotonic_ms() + wait_ms;
    kvx_status_t status = kvx_peer_probe(regions, params, address);

    while (status == KVX_ERR_PEER_DOWN && monotonic_ms() + FETCH_RETRY_MS <= deadline) {
        struct timespec pause = {0, FETCH_RETRY_MS * 1000000L};

        nanosleep(&pause, NULL);
        status = kvx_peer_probe(regions, params, address);
    }
    return status;
}

/* Before any memory: each --peer's handshake checked on the side channel alone, so that
 * nothing listening, a wrong key or an incompatible layout is said in a moment, not after a
 * cache of gigabytes was allocated and zeroed (issue 24). The agent cannot connect before its
 * storages are mapped (its transport and metadata are made of them), so the connect after
 * repeats these checks: one more metadata fetch, milliseconds. -1 to go on, else the exit
 * status (the error printed). */
int fetch_probe(const kvx_layout_t *layout, const kvx_agent_params_t *params, const char *list,
                uint64_t wait_ms)
{
    kvx_regions_t *regions = NULL;
    kvx_status_t status    = kvx_regions_register(layout, &regions);
    char address[256];

    while (status == KVX_OK && peer_address_next(&list, address, sizeof(address)))
        status = peer_probe_waiting(regions, params, address, wait_ms);
    kvx_regions_destroy(regions);
    return status == KVX_OK ? -1 : cli_fail(status);
}

/* Connects to every --peer, at most KVX_MAX_TP; -1 to go on, else the exit status. */
int fetch_connect(kvx_agent_t *agent, const char *list, kvx_peer_t **peers, size_t *num_peers_p)
{
    char address[256];

    while (*num_peers_p < KVX_MAX_TP && peer_address_next(&list, address, sizeof(address))) {
        kvx_status_t status = kvx_agent_connect(agent, address, &peers[*num_peers_p]);

        if (status != KVX_OK)
            return cli_fail(status);
        (*num_peers_p)++;
    }
    return -1;
}

/* A copy of `groups` in *out (block_ids_free frees it): a failed transfer's blocks outlive it
 * in the --json outcome. False, *out empty, when memory ran out. */
bool fetch_blocks_copy(const kvx_group_ids_t *groups, size_t num_groups, struct block_ids *out)
{
    *out = (struct block_ids){calloc(num_groups + 1, sizeof(*out->groups)), 0};
    for (size_t g = 0; out->groups != NULL && g < num_groups; g++) {
        uint64_t *ids = malloc((groups[g].count + 1) * sizeof(*ids));

        if (ids == NULL) {
            block_ids_free(out);
            return false;
        }
        if (groups[g].count > 0)
            memcpy(ids, groups[g].ids, groups[g].count * sizeof(*ids));
        out->groups[g]  = (kvx_group_ids_t){ids, groups[g].count};
        out->num_groups = g + 1;
    }
    return out->groups != NULL;
}

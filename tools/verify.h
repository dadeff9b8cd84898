/* verify.h: the command line's fill and checks of a finished transfer, shared by `kvx serve`,
 * `kvx fetch --verify`, `kvx demo` and `kvx bench`: the bytes against the pattern `kvx serve`
 * filled, and nothing written outside the request. GPU storages are filled and checked
 * through host memory (kvx_agent_storage_write/read), never dereferenced. */
#ifndef KVX_TOOLS_VERIFY_H
#define KVX_TOOLS_VERIFY_H

#include "kvx.h"

/* Fills every storage of the agent with the pattern of (seed, rank), or zeroes every one
 * (touching every page, so a check that the bytes outside a request are still zero means
 * something). Host storages are written in place, GPU ones through a staging buffer. Prints
 * the error and returns it when a device copy fails. */
kvx_status_t storages_fill(kvx_agent_t *agent, uint64_t seed, uint32_t rank);
kvx_status_t storages_zero(kvx_agent_t *agent);

/* Checks the agent's last transfer: every byte of every pair against the pattern of
 * (seed, remote rank, remote storage, offset), then that every byte outside the pairs is
 * still zero. Writes "verified" or the first wrong byte to `verdict`. */
bool verify_last_transfer(const kvx_agent_t *agent, uint64_t seed, char *verdict, size_t size);

#endif

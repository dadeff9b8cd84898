/* verify.h: checks of a finished transfer shared by `kvx fetch --verify` and `kvx demo`:
 * the bytes against the pattern `kvx serve` filled, and nothing written outside the request. */
#ifndef KVX_TOOLS_VERIFY_H
#define KVX_TOOLS_VERIFY_H

#include "kvx.h"

/* Zeroes every storage of the agent (and touches every page), so a check that the bytes
 * outside a request are still zero means something. */
void storages_zero(kvx_agent_t *agent);

/* Checks the agent's last transfer: every byte of every pair against the pattern of
 * (seed, remote rank, remote storage, offset), then that every byte outside the pairs is
 * still zero. Writes "verified" or the first wrong byte to `verdict`. */
bool verify_last_transfer(const kvx_agent_t *agent, uint64_t seed, char *verdict, size_t size);

#endif

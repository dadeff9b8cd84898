/* prefill.h: the prefill processes of the two-process tests: a forked child that creates its
 * agent, listens on a free port and reports where, so the parent (the decode side) connects
 * to it. Nothing here knows what the child serves. */
#ifndef KVX_TESTS_PREFILL_H
#define KVX_TESTS_PREFILL_H

#include "kvx.h"

#include <sys/types.h>

/* Bytes of the address a child reports: "HOST:PORT", NUL-padded. */
#define ADDRESS_SIZE 64

/* The secret every test agent shares unless its params name another (or insecure). */
extern const uint8_t test_auth_key[KVX_AUTH_KEY_LEN];

/* Creates an agent on the layout `quoted` (JSON with ' for "), with test_auth_key when
 * `params` set neither an auth key nor insecure; returns the status. */
kvx_status_t agent_from_quoted(const char *quoted, const kvx_agent_params_t *params,
                               kvx_agent_t **agent_p);

/* The same on a loaded `layout` (destroyed here), given the status of loading it: an error
 * status is returned as it is. */
kvx_status_t agent_from_layout(kvx_status_t status, kvx_layout_t *layout,
                               const kvx_agent_params_t *params, kvx_agent_t **agent_p);

/* A child prefill process reports that it serves by writing the address it listens on (a
 * free port the kernel picked) as ADDRESS_SIZE bytes on `ready`. */
void report_serving(int ready, const kvx_agent_t *agent);

/* kvx_hold with a new token, returned in *token_p. */
kvx_status_t hold_new(kvx_agent_t *agent, uint64_t request_id, const kvx_group_ids_t *groups,
                      size_t num_groups, uint32_t consumers, kvx_token_t *token_p);

/* A child tells its parent the token of a hold it took (after report_serving), and the
 * parent reads it, as an engine carries it in a request's transfer parameters. */
void report_token(int ready, const kvx_token_t *token);
kvx_token_t read_token(int ready);

/* Forks a prefill process running `serve(ready, go)`, whose return value is its exit
 * status, and waits until it serves; `address` receives where. The parent closes its end of
 * `ready` so that a child that fails to start ends the wait with an error instead of a hang.
 * `go` may be -1; `ready_p` may be NULL, else it receives the parent's end of `ready`.
 * Fork before this process creates an agent: UCX does not survive a fork, so a child forked
 * while its parent has an agent cannot use UCX. */
pid_t start_prefill(int (*serve)(int ready, int go), int go, char address[ADDRESS_SIZE],
                    int *ready_p);

/* start_prefill in two steps, for a process forked now that serves later (after its parent
 * created an agent): the fork, which returns the parent's end of `ready` in *ready_p, and
 * the wait until it serves. */
pid_t prefill_fork(int (*serve)(int ready, int go), int go, int *ready_p);
void prefill_wait_serving(int ready, char address[ADDRESS_SIZE]);

#endif

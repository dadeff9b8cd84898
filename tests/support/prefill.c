/* prefill.c: forking the prefill process of a two-process test and learning where it
 * listens. The child's behaviour is the caller's. */
#include "prefill.h"

#include "layouts.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <cmocka.h>

const uint8_t test_auth_key[KVX_AUTH_KEY_LEN] = "the tests' own deployment secret";

kvx_status_t agent_from_layout(kvx_status_t status, kvx_layout_t *layout,
                               const kvx_agent_params_t *params, kvx_agent_t **agent_p)
{
    const uint64_t auth  = KVX_AGENT_PARAM_FIELD_AUTH_KEY | KVX_AGENT_PARAM_FIELD_INSECURE;
    kvx_agent_params_t p = params != NULL ? *params : (kvx_agent_params_t){0};

    if ((p.field_mask & auth) == 0) {
        p.field_mask |= KVX_AGENT_PARAM_FIELD_AUTH_KEY;
        p.auth_key = test_auth_key;
    }
    if (status == KVX_OK)
        status = kvx_agent_create(layout, &p, agent_p);
    kvx_layout_destroy(layout);
    return status;
}

kvx_status_t agent_from_quoted(const char *quoted, const kvx_agent_params_t *params,
                               kvx_agent_t **agent_p)
{
    kvx_layout_t *layout = NULL;
    kvx_status_t status  = layout_from_quoted(quoted, &layout);

    return agent_from_layout(status, layout, params, agent_p);
}

void report_serving(int ready, const kvx_agent_t *agent)
{
    char address[ADDRESS_SIZE] = {0};

    snprintf(address, sizeof(address), "%s", kvx_agent_listen_address(agent));
    (void)!write(ready, address, sizeof(address));
}

pid_t prefill_fork(int (*serve)(int ready, int go), int go, int *ready_p)
{
    int ready[2];
    pid_t pid;

    assert_int_equal(pipe(ready), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        _exit(serve(ready[1], go));
    }
    close(ready[1]); /* so that a child that dies gives EOF */
    *ready_p = ready[0];
    return pid;
}

void prefill_wait_serving(int ready, char address[ADDRESS_SIZE])
{
    assert_int_equal(read(ready, address, ADDRESS_SIZE), ADDRESS_SIZE);
    address[ADDRESS_SIZE - 1] = '\0';
}

pid_t start_prefill(int (*serve)(int ready, int go), int go, char address[ADDRESS_SIZE],
                    int *ready_p)
{
    int ready;
    pid_t pid = prefill_fork(serve, go, &ready);

    prefill_wait_serving(ready, address);
    if (ready_p != NULL)
        *ready_p = ready; /* the child says more on it */
    else
        close(ready);
    return pid;
}

void report_token(int ready, const kvx_token_t *token)
{
    (void)!write(ready, token, sizeof(*token));
}

kvx_token_t read_token(int ready)
{
    kvx_token_t token;

    assert_int_equal(read(ready, &token, sizeof(token)), sizeof(token));
    return token;
}

kvx_status_t hold_new(kvx_agent_t *agent, uint64_t request_id, const kvx_group_ids_t *groups,
                      size_t num_groups, uint32_t consumers, kvx_token_t *token_p)
{
    kvx_status_t status = kvx_token_generate(token_p);

    return status == KVX_OK
               ? kvx_hold(agent, request_id, groups, num_groups, consumers, token_p)
               : status;
}

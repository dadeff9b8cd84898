/* cli_auth.c: the side channel's security on the command line: `kvx auth-key FILE`, and the
 * --auth FILE / KVX_AUTH_FILE / --insecure choice every subcommand that makes an agent takes.
 * Hold tokens travel as 32 hex digits. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_auth_key[] =
    "usage: kvx auth-key FILE\n"
    "\n"
    "Writes a new random secret for a deployment to FILE (a new file, mode 0600). Give the\n"
    "same file to every kvx process that must talk to the others (--auth FILE, or the\n"
    "environment variable KVX_AUTH_FILE): their side channel is then authenticated and\n"
    "encrypted with keys derived from it, and a peer without it is answered nothing\n"
    "(docs/security.md).\n";

int command_auth_key(int argc, char **argv)
{
    kvx_status_t status;

    if (argc == 1 && cli_is_help(argv[0])) {
        fputs(usage_auth_key, stdout);
        return 0;
    }
    if (argc != 1 || argv[0][0] == '-')
        return cli_usage_error("auth-key: one FILE is required", usage_auth_key);
    status = kvx_auth_key_create(argv[0]);
    if (status != KVX_OK)
        return cli_fail(status);
    printf("wrote a new auth key to %s (mode 0600)\n", argv[0]);
    return 0;
}

bool cli_auth(const char *file, bool insecure, uint8_t key[KVX_AUTH_KEY_LEN],
              kvx_agent_params_t *params)
{
    kvx_status_t status;

    if (insecure && file != NULL) {
        cli_errorf("--auth and --insecure: choose one");
        return false;
    }
    if (insecure) {
        params->field_mask |= KVX_AGENT_PARAM_FIELD_INSECURE;
        params->insecure = true;
        return true;
    }
    file = kvx_auth_file(file);
    if (file == NULL) {
        cli_errorf("no auth key: give --auth FILE or " KVX_AUTH_FILE_ENV " (kvx auth-key FILE "
                   "makes one), or --insecure on loopback only");
        return false;
    }
    status = kvx_auth_key_load(file, key);
    if (status != KVX_OK) {
        cli_fail(status);
        return false;
    }
    params->field_mask |= KVX_AGENT_PARAM_FIELD_AUTH_KEY;
    params->auth_key = key;
    return true;
}

void cli_token_format(const kvx_token_t *token, char text[2 * KVX_TOKEN_LEN + 1])
{
    for (size_t i = 0; i < KVX_TOKEN_LEN; i++)
        snprintf(text + 2 * i, 3, "%02x", token->bytes[i]);
}

bool cli_token_parse(const char *option, const char *text, kvx_token_t *token)
{
    if (strlen(text) != 2 * KVX_TOKEN_LEN ||
        strspn(text, "0123456789abcdef") != 2 * KVX_TOKEN_LEN) {
        cli_errorf("%s: expected %d lowercase hex digits", option, 2 * KVX_TOKEN_LEN);
        return false;
    }
    for (size_t i = 0; i < KVX_TOKEN_LEN; i++) {
        unsigned byte;

        sscanf(text + 2 * i, "%2x", &byte);
        token->bytes[i] = (uint8_t)byte;
    }
    return true;
}

/* cli.h: what the kvx subcommands share: exit statuses, the one-line error, usage errors and
 * number options (cli.c), and each command's entry point (the files named beside them). */
#ifndef KVX_TOOLS_CLI_H
#define KVX_TOOLS_CLI_H

#include "kvx.h"

#define EXIT_BAD_INPUT 2
#define EXIT_INTERNAL  1

/* The exit status for a failed call's `status`: EXIT_INTERNAL for memory and internal
 * errors, EXIT_BAD_INPUT for the rest. */
int cli_exit_status(kvx_status_t status);

/* Prints `kvx: error: MESSAGE` (kvx_errmsg()) and returns the exit status for `status`. */
int cli_fail(kvx_status_t status);

/* Prints `kvx: error: MESSAGE`, formatted, and keeps MESSAGE: cli_last_error() returns the
 * message of the last error line any cli_ function printed ("" before any), which kvx fetch
 * --json repeats. */
void cli_errorf(const char *format, ...) __attribute__((format(printf, 1, 2)));
const char *cli_last_error(void);

/* Prints `kvx: error: MESSAGE` and one line naming `kvx help CMD`, CMD read from `usage`
 * ("usage: kvx CMD ..."); returns EXIT_BAD_INPUT. The _f form formats the message. */
int cli_usage_error(const char *message, const char *usage);
int cli_usage_errorf(const char *usage, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

bool cli_is_help(const char *arg);

/* Parses a decimal option value up to `max`; prints the error and returns false otherwise. */
bool cli_parse_number(const char *option, const char *text, uint64_t max, uint64_t *value_p);

/* The side channel's security (cli_auth.c): --auth FILE, else KVX_AUTH_FILE, or --insecure
 * (loopback only); fills params' auth fields with `key`, which must outlive the agent's
 * creation. Prints the error and returns false. */
bool cli_auth(const char *file, bool insecure, uint8_t key[KVX_AUTH_KEY_LEN],
              kvx_agent_params_t *params);
int command_auth_key(int argc, char **argv);

/* --memory host|cuda (cli_memory.c): every storage of the layout in host memory, saying on
 * stderr how many were written for a GPU, or every storage in GPU memory (a "vram" storage on
 * its device, a host one on device 0). The commands' own memory; --malloc takes host memory. */
enum cli_memory { CLI_MEMORY_HOST, CLI_MEMORY_CUDA };
bool cli_memory_parse(const char *text, enum cli_memory *memory);
void cli_layout_memory(kvx_layout_t *layout, enum cli_memory memory, const char *command);

/* A hold token as 32 lowercase hex digits, and back (printing the error). */
void cli_token_format(const kvx_token_t *token, char text[2 * KVX_TOKEN_LEN + 1]);
bool cli_token_parse(const char *option, const char *text, kvx_token_t *token);

/* kvx demo's transfer run (demo.c): NULL for the built-in layout; the auth key file (NULL:
 * KVX_AUTH_FILE's, else a secret of its own); TP sizes of the prefill and decode sides, 1..8
 * each; `verbose`: the whole region table, not only its totals. */
int demo_run(const char *layout_path, const char *auth_file, enum cli_memory memory, uint32_t p_tp,
             uint32_t d_tp, bool verbose);

/* kvx serve and kvx fetch (serve_fetch.c). */
int command_serve(int argc, char **argv);
int command_fetch(int argc, char **argv);

#endif

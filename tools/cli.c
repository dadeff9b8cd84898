/* cli.c: what every kvx subcommand shares, below all of them: exit statuses, the one-line
 * error, usage errors and number options. Calls only the library, so no command file and
 * main.c, which dispatches to them, ever call each other in a circle. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Memory and internal errors are kvx's own failures (1); the rest are the input's (2). */
int cli_exit_status(kvx_status_t status)
{
    return status == KVX_ERR_NO_MEMORY || status == KVX_ERR_INTERNAL ? EXIT_INTERNAL
                                                                     : EXIT_BAD_INPUT;
}

/* The message of the last `kvx: error:` line: kvx fetch --json repeats it in its "error". */
static char last_error[1024];

const char *cli_last_error(void)
{
    return last_error;
}

void cli_errorf(const char *format, ...)
{
    va_list args;

    va_start(args, format);
    vsnprintf(last_error, sizeof(last_error), format, args);
    va_end(args);
    fprintf(stderr, "kvx: error: %s\n", last_error);
}

/* Prints `kvx: error: MESSAGE` and returns the exit status for `status`. */
int cli_fail(kvx_status_t status)
{
    cli_errorf("%s", kvx_errmsg());
    return cli_exit_status(status);
}

/* The line after a usage error: where the command's usage is, not the usage itself (issue
 * 24: forty lines of help buried the one that mattered). The command is the word after
 * "usage: kvx " in its usage text; the general usage names COMMAND there. */
static void usage_hint(const char *usage)
{
    static const char prefix[] = "usage: kvx ";
    size_t len                 = 0;

    if (strncmp(usage, prefix, sizeof(prefix) - 1) == 0) {
        usage += sizeof(prefix) - 1;
        len = strcspn(usage, " \n");
    }
    if (len == 0 || strncmp(usage, "COMMAND", len) == 0)
        fprintf(stderr, "kvx: see 'kvx help' for the commands\n");
    else
        fprintf(stderr, "kvx: see 'kvx help %.*s' for its usage\n", (int)len, usage);
}

int cli_usage_error(const char *message, const char *usage)
{
    cli_errorf("%s", message);
    usage_hint(usage);
    return EXIT_BAD_INPUT;
}

int cli_usage_errorf(const char *usage, const char *format, ...)
{
    va_list args;

    va_start(args, format);
    vsnprintf(last_error, sizeof(last_error), format, args);
    va_end(args);
    fprintf(stderr, "kvx: error: %s\n", last_error);
    usage_hint(usage);
    return EXIT_BAD_INPUT;
}

bool cli_is_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

/* Parses the value of a numeric option into *value_p (at most `max`). */
bool cli_parse_number(const char *option, const char *text, uint64_t max, uint64_t *value_p)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v     = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 || v > max) {
        cli_errorf("%s: \"%s\" is not a number up to %llu", option, text, (unsigned long long)max);
        return false;
    }
    *value_p = v;
    return true;
}

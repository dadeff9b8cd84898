/* notify.c: encoding and strict parsing of the done notification, the heartbeat's id list
 * and its answer. Every length is checked before a byte is read; anything else is rejected
 * whole, so a hostile peer can only have its message counted and dropped. */
#include "notify.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* what travels: a peer of another build reads the same sizes */
_Static_assert(sizeof(struct notify) == 40, "a version-2 done is 40 bytes");
_Static_assert(sizeof(struct notify_read) == 48, "a version-3 done is 48 bytes");

struct notify notify_done(uint64_t request_id, uint32_t tp_rank, const kvx_token_t *token)
{
    struct notify n = {NOTIFY_MAGIC, NOTIFY_VERSION, NOTIFY_DONE, request_id, tp_rank, 0, {{0}}};

    if (token != NULL)
        n.token = *token;
    return n;
}

struct notify_read notify_done_read(uint64_t request_id, uint32_t tp_rank, const kvx_token_t *token,
                                    uint64_t bytes)
{
    struct notify_read n = {notify_done(request_id, tp_rank, token), bytes};

    n.done.version = NOTIFY_VERSION_READ;
    return n;
}

bool notify_done_parse(const void *data, size_t size, uint64_t *request_id_p, uint32_t *rank_p,
                       kvx_token_t *token_p, uint64_t *bytes_p, bool *bytes_stated_p)
{
    struct notify_read n = {0};

    /* the size and the version agree, so neither form reads as the other */
    if (size != sizeof(n.done) && size != sizeof(n))
        return false;
    memcpy(&n, data, size);
    if (n.done.magic != NOTIFY_MAGIC || n.done.kind != NOTIFY_DONE ||
        n.done.version != (size == sizeof(n) ? NOTIFY_VERSION_READ : NOTIFY_VERSION) ||
        n.done.tp_rank >= KVX_MAX_TP || n.done.reserved != 0)
        return false;
    *request_id_p   = n.done.request_id;
    *rank_p         = n.done.tp_rank;
    *token_p        = n.done.token;
    *bytes_p        = n.bytes;
    *bytes_stated_p = size == sizeof(n);
    return true;
}

/* Text an answer may carry: printable ASCII, spaces included, not empty. */
static bool reason_valid(const char *text, size_t length)
{
    if (length == 0 || length >= DONE_REASON_SIZE)
        return false;
    for (size_t i = 0; i < length; i++) {
        if (text[i] < ' ' || text[i] > '~')
            return false;
    }
    return true;
}

size_t done_answer_format(char *text, size_t size, bool counted, const char *what)
{
    int n;

    if (what == NULL || !reason_valid(what, strlen(what)))
        return 0;
    n = snprintf(text, size, "%s %s", counted ? DONE_ANSWER_COUNTED : DONE_ANSWER_REFUSED, what);
    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

bool done_answer_parse(const void *data, size_t size, bool *counted_p,
                       char reason[DONE_REASON_SIZE])
{
    static const char *const kinds[2] = {DONE_ANSWER_REFUSED " ", DONE_ANSWER_COUNTED " "};
    const char *text                  = data;

    if (data == NULL)
        return false;
    for (int counted = 0; counted < 2; counted++) {
        size_t prefix = strlen(kinds[counted]);

        if (size <= prefix || memcmp(text, kinds[counted], prefix) != 0 ||
            !reason_valid(text + prefix, size - prefix))
            continue;
        memcpy(reason, text + prefix, size - prefix);
        reason[size - prefix] = '\0';
        *counted_p            = counted == 1;
        return true;
    }
    return false;
}

bool heartbeat_ids_parse(const void *data, size_t size, size_t *count_p)
{
    if ((data == NULL && size > 0) || size % sizeof(struct heartbeat_entry) != 0 ||
        size / sizeof(struct heartbeat_entry) > HEARTBEAT_MAX_IDS)
        return false;
    *count_p = size / sizeof(struct heartbeat_entry);
    return true;
}

struct heartbeat_entry heartbeat_entry(const void *data, size_t index)
{
    struct heartbeat_entry entry;

    memcpy(&entry, (const char *)data + index * sizeof(entry), sizeof(entry));
    return entry;
}

/* An engine id as it may appear in an answer: printable, no spaces, not empty. */
static bool engine_id_valid(const char *id, size_t length)
{
    if (length == 0 || length >= ALIVE_ENGINE_ID_SIZE)
        return false;
    for (size_t i = 0; i < length; i++) {
        if (id[i] <= ' ' || id[i] > '~')
            return false;
    }
    return true;
}

size_t alive_answer_format(char *text, size_t size, uint64_t instance, const char *engine_id)
{
    const char *id =
        engine_id != NULL && engine_id_valid(engine_id, strlen(engine_id)) ? engine_id : "-";
    int n = snprintf(text, size, "%s %016" PRIx64 " %s", ALIVE_ANSWER, instance, id);

    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

bool alive_answer_parse(const void *data, size_t size, uint64_t *instance_p,
                        char engine_id[ALIVE_ENGINE_ID_SIZE])
{
    const char *text  = data;
    size_t prefix     = strlen(ALIVE_ANSWER " ");
    size_t id_at      = prefix + 16 + 1;
    uint64_t instance = 0;

    if (size <= id_at || memcmp(text, ALIVE_ANSWER " ", prefix) != 0 || text[id_at - 1] != ' ' ||
        !engine_id_valid(text + id_at, size - id_at))
        return false;
    for (size_t i = prefix; i < prefix + 16; i++) {
        int digit = hex_digit(text[i]);

        if (digit < 0)
            return false;
        instance = instance << 4 | (uint64_t)digit;
    }
    if (instance == 0)
        return false;
    *instance_p = instance;
    memcpy(engine_id, text + id_at, size - id_at);
    engine_id[size - id_at] = '\0';
    return true;
}

/* The codes' words on the wire, by enum error_code. */
static const char *const error_code_words[] = {
    [ERROR_CODE_NONE]         = NULL,
    [ERROR_CODE_UNREGISTERED]  = "unregistered",
    [ERROR_CODE_WRITER_FAILED] = "writer-failed",
};

size_t error_answer_format(char *text, size_t size, enum error_code code, const char *message)
{
    const char *word = (size_t)code < sizeof(error_code_words) / sizeof(error_code_words[0])
                           ? error_code_words[code]
                           : NULL;
    int n = word != NULL ? snprintf(text, size, "%s [%s] %s", DONE_ANSWER_REFUSED, word, message)
                         : snprintf(text, size, "%s %s", DONE_ANSWER_REFUSED, message);

    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

bool error_answer_parse(const void *data, size_t size, enum error_code *code_p,
                        size_t *message_at_p)
{
    const char *text = data;
    size_t prefix    = strlen(DONE_ANSWER_REFUSED " ");

    if (size < prefix || memcmp(text, DONE_ANSWER_REFUSED " ", prefix) != 0)
        return false;
    *code_p       = ERROR_CODE_NONE;
    *message_at_p = prefix;
    for (size_t c = 0; c < sizeof(error_code_words) / sizeof(error_code_words[0]); c++) {
        const char *word = error_code_words[c];
        size_t length    = word != NULL ? strlen(word) : 0;

        /* "[WORD] ": anything else, an unknown word too, is part of the message */
        if (word != NULL && size >= prefix + length + 3 && text[prefix] == '[' &&
            memcmp(text + prefix + 1, word, length) == 0 && text[prefix + 1 + length] == ']' &&
            text[prefix + 2 + length] == ' ') {
            *code_p       = (enum error_code)c;
            *message_at_p = prefix + length + 3;
        }
    }
    return true;
}

/* test_notify.c: the bytes of the messages between agents (notify.c): a done parses only at
 * its exact size, magic, version, kind, a rank below KVX_MAX_TP and a zero reserved word, and
 * carries its token; heartbeat lists are whole (id, token) entries within the limit; an answer
 * names a non-zero instance in 16 lowercase hex digits and a printable engine id, and formats back
 * to the same bytes. */
#include "notify.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

static void done_parses_only_its_exact_form(void **state)
{
    const kvx_token_t sent = {{9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6}};
    struct notify note     = notify_done(42, 3, &sent);
    unsigned char bytes[sizeof(note) + 1];
    uint64_t id   = 0;
    uint32_t rank = 0;
    uint64_t read = 1;
    bool stated   = true;
    kvx_token_t token;

    (void)state;
    memcpy(bytes, &note, sizeof(note));
    assert_true(notify_done_parse(bytes, sizeof(note), &id, &rank, &token, &read, &stated));
    assert_int_equal(id, 42);
    assert_int_equal(rank, 3);
    assert_memory_equal(token.bytes, sent.bytes, KVX_TOKEN_LEN);
    assert_false(stated); /* version 2: no bytes */
    assert_int_equal(read, 0);
    assert_false(
        notify_done_parse(bytes, sizeof(note) - 1, &id, &rank, &token, &read, &stated)); /* short */
    assert_false(
        notify_done_parse(bytes, sizeof(note) + 1, &id, &rank, &token, &read, &stated)); /* extra */
    assert_false(notify_done_parse(bytes, 0, &id, &rank, &token, &read, &stated));
    note = notify_done(42, 3, NULL); /* no token: all zero, as a hold never issues */
    assert_true(notify_done_parse(&note, sizeof(note), &id, &rank, &token, &read, &stated));
    assert_memory_equal(token.bytes, (kvx_token_t){{0}}.bytes, KVX_TOKEN_LEN);
    for (size_t field = 0; field < 5; field++) { /* magic, version, kind, rank, reserved */
        struct notify bad = note;

        if (field == 0)
            bad.magic ^= 1;
        else if (field == 1)
            bad.version++;
        else if (field == 2)
            bad.kind++;
        else if (field == 3)
            bad.tp_rank = KVX_MAX_TP;
        else
            bad.reserved = 1;
        assert_false(notify_done_parse(&bad, sizeof(bad), &id, &rank, &token, &read, &stated));
    }
}

/* Version 3 carries the bytes read (issue 24 item 9), at its own size only: a version-3 header
 * at version 2's size, or a version-2 header at version 3's, parses as neither. */
static void a_version_3_done_carries_the_bytes_read_at_its_size_only(void **state)
{
    const kvx_token_t sent  = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
    struct notify_read note = notify_done_read(43, 2, &sent, 123456789012ull);
    struct notify_read bad;
    uint64_t id   = 0;
    uint32_t rank = 0;
    uint64_t read = 0;
    bool stated   = false;
    kvx_token_t token;

    (void)state;
    assert_int_equal(sizeof(note), 48);
    assert_true(notify_done_parse(&note, sizeof(note), &id, &rank, &token, &read, &stated));
    assert_int_equal(id, 43);
    assert_int_equal(rank, 2);
    assert_true(stated);
    assert_int_equal(read, 123456789012ull);
    assert_memory_equal(token.bytes, sent.bytes, KVX_TOKEN_LEN);
    assert_false(notify_done_parse(&note, sizeof(note.done), &id, &rank, &token, &read, &stated));
    bad              = note;
    bad.done.version = NOTIFY_VERSION;
    assert_false(notify_done_parse(&bad, sizeof(bad), &id, &rank, &token, &read, &stated));
    bad.done.version = NOTIFY_VERSION_READ + 1;
    assert_false(notify_done_parse(&bad, sizeof(bad), &id, &rank, &token, &read, &stated));
    bad               = note;
    bad.done.reserved = 1;
    assert_false(notify_done_parse(&bad, sizeof(bad), &id, &rank, &token, &read, &stated));
}

static void heartbeat_ids_are_whole_and_bounded(void **state)
{
    static struct heartbeat_entry entries[HEARTBEAT_MAX_IDS + 1];
    const size_t size = sizeof(entries[0]);
    size_t count      = 99;

    (void)state;
    entries[2].request_id     = 0x0102030405060708u;
    entries[2].token.bytes[5] = 0xa5;
    assert_true(heartbeat_ids_parse(NULL, 0, &count));
    assert_int_equal(count, 0);
    assert_true(heartbeat_ids_parse(entries, 3 * size, &count));
    assert_int_equal(count, 3);
    assert_int_equal(heartbeat_entry(entries, 2).request_id, 0x0102030405060708u);
    assert_int_equal(heartbeat_entry(entries, 2).token.bytes[5], 0xa5);
    assert_false(heartbeat_ids_parse(entries, 8, &count)); /* an id without its token */
    assert_false(heartbeat_ids_parse(entries, size + 7, &count));
    assert_true(heartbeat_ids_parse(entries, HEARTBEAT_MAX_IDS * size, &count));
    assert_false(heartbeat_ids_parse(entries, (HEARTBEAT_MAX_IDS + 1) * size, &count));
}

static void answers_round_trip(void **state)
{
    char text[ALIVE_ENGINE_ID_SIZE + 64];
    char engine[ALIVE_ENGINE_ID_SIZE];
    uint64_t instance = 0;
    size_t length     = alive_answer_format(text, sizeof(text), 0xdeadbeef, "prefill-7");

    (void)state;
    assert_string_equal(text, "kvx-alive 00000000deadbeef prefill-7");
    assert_true(alive_answer_parse(text, length, &instance, engine));
    assert_int_equal(instance, 0xdeadbeef);
    assert_string_equal(engine, "prefill-7");
    /* No engine id, or one an answer cannot carry (a space), is sent as "-". */
    alive_answer_format(text, sizeof(text), 1, "");
    assert_string_equal(text, "kvx-alive 0000000000000001 -");
    alive_answer_format(text, sizeof(text), 1, "two words");
    assert_string_equal(text, "kvx-alive 0000000000000001 -");
    assert_int_equal(alive_answer_format(text, 20, 1, "x"), 0); /* does not fit */
}

static void answers_reject_anything_else(void **state)
{
    static const char *const bad[] = {
        "",
        "kvx-alive",
        "kvx-alive 00000000deadbeef",     /* no engine id */
        "kvx-alive 00000000deadbeef ",    /* empty engine id */
        "kvx-alive 0000000000000000 x",   /* instance 0 means "unknown" */
        "kvx-alive 00000000DEADBEEF x",   /* uppercase */
        "kvx-alive 00000000deadbee x",    /* 15 digits */
        "kvx-alive 00000000deadbeef0 x",  /* 17 digits */
        "kvx-alive  00000000deadbeef x",  /* two spaces */
        "kvx-alive 00000000deadbeef x y", /* a space in the engine id */
        "kvx-alive 00000000deadbeef x\n", /* a control character */
        "kvx-error heartbeat of 7 bytes is not a list of ids",
    };
    char long_answer[ALIVE_ENGINE_ID_SIZE + 64];
    char engine[ALIVE_ENGINE_ID_SIZE];
    uint64_t instance;

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_false(alive_answer_parse(bad[i], strlen(bad[i]), &instance, engine));
    memset(long_answer, 'e', sizeof(long_answer));
    memcpy(long_answer, "kvx-alive 0000000000000001 ", 27);
    assert_false(alive_answer_parse(long_answer, 27 + ALIVE_ENGINE_ID_SIZE, &instance, engine));
    assert_true(alive_answer_parse(long_answer, 27 + ALIVE_ENGINE_ID_SIZE - 1, &instance, engine));
    assert_int_equal(strlen(engine), ALIVE_ENGINE_ID_SIZE - 1);
}

/* Issue 21: a done's answer is "kvx-counted WHAT" or "kvx-error REASON" with a printable,
 * bounded text, and round-trips; anything else is malformed. */
static void done_answers_round_trip_and_reject_the_rest(void **state)
{
    char text[DONE_REASON_SIZE + 32];
    char reason[DONE_REASON_SIZE];
    char long_reason[DONE_REASON_SIZE + 1];
    bool counted = false;
    size_t n;

    (void)state;
    n = done_answer_format(text, sizeof(text), true, "released");
    assert_string_equal(text, "kvx-counted released");
    assert_true(done_answer_parse(text, n, &counted, reason));
    assert_true(counted);
    assert_string_equal(reason, "released");
    n = done_answer_format(text, sizeof(text), false,
                           "wrong token: the request is held with another");
    assert_true(done_answer_parse(text, n, &counted, reason));
    assert_false(counted);
    assert_string_equal(reason, "wrong token: the request is held with another");
    memset(long_reason, 'x', DONE_REASON_SIZE);
    long_reason[DONE_REASON_SIZE] = '\0';
    assert_int_equal(done_answer_format(text, sizeof(text), false, long_reason), 0);
    assert_int_equal(done_answer_format(text, sizeof(text), false, "tab\there"), 0);
    assert_false(done_answer_parse("kvx-counted", 11, &counted, reason)); /* no text */
    assert_false(done_answer_parse("kvx-counted ", 12, &counted, reason));
    assert_false(done_answer_parse("kvx-done", 8, &counted, reason));
    assert_false(done_answer_parse("kvx-error a\nb", 13, &counted, reason));
    assert_false(done_answer_parse("kvx-errorx", 10, &counted, reason));
    assert_false(done_answer_parse(NULL, 0, &counted, reason));
}

/* Issue 22: what a requester does about an error answer follows its code, never its words:
 * "kvx-error [unregistered] ..." round-trips to its code and message; a plain error, an
 * unknown word and a message that only looks like one carry no code. */
static const struct error_answer_case {
    const char *rule;
    const char *text;
    bool parses;
    enum error_code code;
    const char *message;
} error_answer_cases[] = {
    {"a coded answer", "kvx-error [unregistered] push: register again", true,
     ERROR_CODE_UNREGISTERED, "push: register again"},
    {"a coded answer with an empty message", "kvx-error [unregistered] ", true,
     ERROR_CODE_UNREGISTERED, ""},
    {"a writer that failed", "kvx-error [writer-failed] push 3: its writer failed", true,
     ERROR_CODE_WRITER_FAILED, "push 3: its writer failed"},
    {"a plain one, as older peers send", "kvx-error push: register again", true, ERROR_CODE_NONE,
     "push: register again"},
    {"an unknown word is message", "kvx-error [later] go", true, ERROR_CODE_NONE, "[later] go"},
    {"no space after the word", "kvx-error [unregistered]x", true, ERROR_CODE_NONE,
     "[unregistered]x"},
    {"cut inside the word", "kvx-error [unregist", true, ERROR_CODE_NONE, "[unregist"},
    {"the words without brackets", "kvx-error unregistered go", true, ERROR_CODE_NONE,
     "unregistered go"},
    {"not an error", "kvx-done", false, ERROR_CODE_NONE, NULL},
    {"no space after kvx-error", "kvx-error[unregistered] x", false, ERROR_CODE_NONE, NULL},
};

static void error_answers_carry_their_code(void **state)
{
    char text[128];

    (void)state;
    for (size_t i = 0; i < sizeof(error_answer_cases) / sizeof(error_answer_cases[0]); i++) {
        const struct error_answer_case *c = &error_answer_cases[i];
        enum error_code code              = ERROR_CODE_NONE;
        size_t at                         = 0;
        bool parses = error_answer_parse(c->text, strlen(c->text), &code, &at);

        if (parses != c->parses ||
            (parses && (code != c->code || strcmp(c->text + at, c->message))))
            fail_msg("%s: parsed %d, code %d, message \"%s\"", c->rule, parses, code,
                     parses ? c->text + at : "");
    }
    assert_int_equal(error_answer_format(text, sizeof(text), ERROR_CODE_UNREGISTERED, "go"),
                     strlen("kvx-error [unregistered] go"));
    assert_string_equal(text, "kvx-error [unregistered] go");
    error_answer_format(text, sizeof(text), ERROR_CODE_NONE, "go");
    assert_string_equal(text, "kvx-error go");
    assert_int_equal(error_answer_format(text, 8, ERROR_CODE_NONE, "go"), 0);
    assert_false(error_answer_parse(NULL, 0, &(enum error_code){0}, &(size_t){0}));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(done_parses_only_its_exact_form),
        cmocka_unit_test(a_version_3_done_carries_the_bytes_read_at_its_size_only),
        cmocka_unit_test(heartbeat_ids_are_whole_and_bounded),
        cmocka_unit_test(answers_round_trip),
        cmocka_unit_test(answers_reject_anything_else),
        cmocka_unit_test(done_answers_round_trip_and_reject_the_rest),
        cmocka_unit_test(error_answers_carry_their_code),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* text.c: which bytes a name may hold (printable UTF-8), how a message quotes one that
 * breaks the rule, and how JSON output quotes any. Pure: no allocation, no state, no
 * knowledge of layouts. */
#include "text.h"

#include "kvx.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The length of the well-formed UTF-8 sequence at `s` (RFC 3629 table 3-7: no overlong
 * forms, no surrogates, nothing above U+10FFFF), or 0. *code_point_p is its value. */
static size_t utf8_sequence(const unsigned char *s, size_t len, uint32_t *code_point_p)
{
    unsigned char lo = 0x80; /* range of the second byte, which rules out the bad forms */
    unsigned char hi = 0xbf;
    size_t n;
    uint32_t cp;

    if (s[0] < 0x80) {
        *code_point_p = s[0];
        return 1;
    }
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        n  = 2;
        cp = s[0] & 0x1fu;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        n  = 3;
        cp = s[0] & 0x0fu;
        lo = s[0] == 0xe0 ? 0xa0 : 0x80; /* below: overlong */
        hi = s[0] == 0xed ? 0x9f : 0xbf; /* above: surrogates */
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        n  = 4;
        cp = s[0] & 0x07u;
        lo = s[0] == 0xf0 ? 0x90 : 0x80; /* below: overlong */
        hi = s[0] == 0xf4 ? 0x8f : 0xbf; /* above: beyond U+10FFFF */
    } else {
        return 0; /* a continuation byte, 0xc0, 0xc1 (overlong) or 0xf5-0xff */
    }
    if (len < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    *code_point_p = cp;
    return n;
}

static bool is_control(uint32_t code_point)
{
    return code_point < 0x20 || (code_point >= 0x7f && code_point <= 0x9f);
}

size_t text_find_unprintable(const char *text, size_t len, const char **why_p)
{
    const unsigned char *s = (const unsigned char *)text;

    for (size_t i = 0; i < len;) {
        uint32_t code_point;
        size_t n = utf8_sequence(s + i, len - i, &code_point);

        if (n == 0 || is_control(code_point)) {
            *why_p = n == 0 ? "not valid UTF-8" : "a control character";
            return i;
        }
        i += n;
    }
    return len;
}

void text_escape(char *out, size_t size, const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t at              = 0;

    if (size == 0)
        return;
    for (size_t i = 0; i < len;) {
        uint32_t code_point;
        size_t n = utf8_sequence(s + i, len - i, &code_point);
        char piece[8];
        size_t piece_len;

        if (n == 0 || is_control(code_point)) {
            n         = 1; /* each byte of a bad sequence on its own */
            piece_len = (size_t)snprintf(piece, sizeof(piece), "\\x%02x", s[i]);
        } else if (s[i] == '"' || s[i] == '\\') {
            piece_len = (size_t)snprintf(piece, sizeof(piece), "\\%c", s[i]);
        } else {
            memcpy(piece, s + i, n);
            piece_len = n;
        }
        /* A piece fits with room for the NUL, and for "..." unless it is the last one. */
        if (at + piece_len + (i + n < len ? 4 : 1) > size) {
            if (at + 4 <= size) {
                memcpy(out + at, "...", 3);
                at += 3;
            }
            break;
        }
        memcpy(out + at, piece, piece_len);
        at += piece_len;
        i += n;
    }
    out[at] = '\0';
}

/* Appends `len` bytes of `piece` to what still fits of out[size]; *at_p counts them all. */
static void quote_put(char *out, size_t size, size_t *at_p, const char *piece, size_t len)
{
    if (*at_p < size)
        memcpy(out + *at_p, piece, len < size - *at_p ? len : size - *at_p);
    *at_p += len;
}

size_t kvx_json_quote(char *out, size_t size, const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t at              = 0; /* bytes of the whole result so far */

    quote_put(out, size, &at, "\"", 1);
    for (; *s != '\0'; s++) {
        char piece[8];
        size_t len = 1;

        if (*s == '"' || *s == '\\')
            len = (size_t)snprintf(piece, sizeof(piece), "\\%c", *s);
        else if (*s < 0x20)
            len = (size_t)snprintf(piece, sizeof(piece), "\\u%04x", *s);
        else
            piece[0] = (char)*s;
        quote_put(out, size, &at, piece, len);
    }
    quote_put(out, size, &at, "\"", 1);
    if (size > 0)
        out[at < size ? at : size - 1] = '\0';
    return at;
}

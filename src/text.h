/* text.h: the rule for strings kvx takes from outside and prints (storage, view and model
 * names): UTF-8 without control characters, and the escaped form a message quotes them in. */
#ifndef KVX_SRC_TEXT_H
#define KVX_SRC_TEXT_H

#include <stddef.h>

/* Room for text_escape's output of any string a message quotes (it cuts longer ones). */
#define TEXT_ESCAPED_MAX 160

/* The offset of the first byte of `len` bytes at `text` that is not part of a printable UTF-8
 * character, or len when there is none. A control character (U+0000-U+001F, U+007F-U+009F)
 * is one; so is a byte outside a well-formed sequence: a stray continuation byte, a lone lead
 * byte, an overlong form, a surrogate or a code point above U+10FFFF. *why_p, when the result
 * is below len, says which: "a control character" or "not valid UTF-8". */
size_t text_find_unprintable(const char *text, size_t len, const char **why_p);

/* Writes `text` into `out` (size bytes, NUL-terminated) with quotes and backslashes escaped
 * and every byte text_find_unprintable would stop at as \xNN, so a message never carries a
 * raw control byte or broken UTF-8. Output that does not fit ends in "...". */
void text_escape(char *out, size_t size, const char *text, size_t len);

#endif

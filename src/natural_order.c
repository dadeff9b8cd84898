/* natural_order.c: compares layer names run by run, digits by value (regions.md step 1), so
 * that `layers.2` < `layers.10` on every worker whatever order its engine allocated in. */
#include "natural_order.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Length of the run starting at s: maximal digits or maximal non-digits. */
static size_t run_length(const char *s)
{
    bool digits = is_digit(*s);
    size_t n    = 0;

    while (s[n] != '\0' && is_digit(s[n]) == digits)
        n++;
    return n;
}

/* Compares two digit runs by integer value without converting them, so runs longer than
 * any integer type still compare right: skip leading zeros, then the longer is larger, then
 * the first differing digit decides. */
static int compare_digit_runs(const char *a, size_t a_len, const char *b, size_t b_len)
{
    while (a_len > 0 && *a == '0') {
        a++;
        a_len--;
    }
    while (b_len > 0 && *b == '0') {
        b++;
        b_len--;
    }
    if (a_len != b_len)
        return a_len < b_len ? -1 : 1;
    return memcmp(a, b, a_len);
}

/* Bytewise, a run that is a prefix of the other first. */
static int compare_text_runs(const char *a, size_t a_len, const char *b, size_t b_len)
{
    int ret = memcmp(a, b, a_len < b_len ? a_len : b_len);

    if (ret != 0)
        return ret;
    if (a_len != b_len)
        return a_len < b_len ? -1 : 1;
    return 0;
}

int natural_order_compare(const char *a, const char *b)
{
    const char *pa = a;
    const char *pb = b;

    while (*pa != '\0' && *pb != '\0') {
        size_t a_len  = run_length(pa);
        size_t b_len  = run_length(pb);
        bool a_digits = is_digit(*pa);
        bool b_digits = is_digit(*pb);
        int ret;

        if (a_digits != b_digits)
            return a_digits ? -1 : 1; /* a digit run sorts before text at the same place */
        ret = a_digits ? compare_digit_runs(pa, a_len, pb, b_len)
                       : compare_text_runs(pa, a_len, pb, b_len);
        if (ret != 0)
            return ret;
        pa += a_len;
        pb += b_len;
    }
    if (*pa != *pb)
        return *pa == '\0' ? -1 : 1; /* a name that is a prefix, run by run, sorts first */
    return strcmp(a, b);             /* equal keys (a01, a1) fall back to bytewise order */
}

/* Key layout, run by run: a digit run is 0x01, its length without leading zeros, then those
 * digits (value order: length, then digits); a text run is 0x02, its bytes, then 0x00 (so a
 * shorter run that is a prefix sorts first: names hold no NUL). The name ends with 0x00,
 * below both run markers, so a name that is a prefix run by run sorts first, and 0x01 < 0x02
 * puts digits before text at the same position. */
size_t natural_order_key(const char *name, unsigned char *key)
{
    size_t n = 0;

    while (*name != '\0') {
        size_t len = run_length(name);

        if (is_digit(*name)) {
            size_t skip = 0;

            while (skip < len && name[skip] == '0')
                skip++;
            key[n++] = 0x01;
            key[n++] = (unsigned char)(len - skip);
            memcpy(key + n, name + skip, len - skip);
            n += len - skip;
        } else {
            key[n++] = 0x02;
            memcpy(key + n, name, len);
            n += len;
            key[n++] = 0x00;
        }
        name += len;
    }
    key[n++] = 0x00;
    return n;
}

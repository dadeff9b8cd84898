/* size_list.c: the size lists of size_list.h. */
#include "size_list.h"

#include <errno.h>
#include <stdlib.h>

bool size_list_parse(const char *text, uint64_t max_value, uint64_t *sizes, size_t max_count,
                     size_t *count_p)
{
    size_t n = 0;

    for (const char *p = text;;) {
        char *end;
        uint64_t value;
        int shift = 0;

        if (*p < '0' || *p > '9' || n == max_count)
            return false;
        errno = 0;
        value = strtoull(p, &end, 10);
        if (*end == 'K' || *end == 'k')
            shift = 10;
        else if (*end == 'M' || *end == 'm')
            shift = 20;
        else if (*end == 'G' || *end == 'g')
            shift = 30;
        end += shift != 0;
        if (errno != 0 || value == 0 || value > max_value >> shift || (*end != '\0' && *end != ','))
            return false;
        sizes[n++] = value << shift;
        if (*end == '\0')
            break;
        p = end + 1;
    }
    *count_p = n;
    return true;
}

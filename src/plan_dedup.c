/* plan_dedup.c: each destination byte once (docs/plan.md "Each byte once"): pair lists sorted
 * by local storage and offset, overlaps found, repeats dropped and two sources for one byte
 * reported. Works on pair arrays only; what a request or a plan is stays in plan_request.c. */
#include "plan.h"

#include <string.h>

/* The order of a sorted list: local storage, local offset, then the longer pair first (so a
 * repeat always follows the pair that holds it), then the source; identical pairs are equal. */
static inline bool pair_before(const kvx_pair_t *x, const kvx_pair_t *y)
{
    if (x->local_storage != y->local_storage)
        return x->local_storage < y->local_storage;
    if (x->local_offset != y->local_offset)
        return x->local_offset < y->local_offset;
    if (x->len != y->len)
        return x->len > y->len;
    if (x->remote_storage != y->remote_storage)
        return x->remote_storage < y->remote_storage;
    return x->remote_offset < y->remote_offset;
}

/* Whether two overlapping pairs read their common bytes from the same place: same remote
 * storage and the same local-to-remote offset (compared as sums, so nothing wraps). */
static inline bool pair_same_source(const kvx_pair_t *x, const kvx_pair_t *y)
{
    return x->remote_storage == y->remote_storage &&
           (unsigned __int128)x->local_offset + y->remote_offset ==
               (unsigned __int128)y->local_offset + x->remote_offset;
}

bool plan_pairs_ordered(const kvx_pair_t *pairs, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        const kvx_pair_t *a = &pairs[i - 1];
        const kvx_pair_t *b = &pairs[i];

        if (b->local_storage < a->local_storage ||
            (b->local_storage == a->local_storage && b->local_offset < a->local_offset + a->len))
            return false;
    }
    return true;
}

/* The end of the ascending run of `a` that starts at i. */
static size_t run_end(const kvx_pair_t *a, size_t i, size_t n)
{
    while (i + 1 < n && !pair_before(&a[i + 1], &a[i]))
        i++;
    return i + 1;
}

static void runs_merge(const kvx_pair_t *x, size_t nx, const kvx_pair_t *y, size_t ny,
                       kvx_pair_t *out)
{
    size_t i = 0;
    size_t j = 0;

    while (i < nx && j < ny)
        *out++ = pair_before(&y[j], &x[i]) ? y[j++] : x[i++];
    memcpy(out, x + i, (nx - i) * sizeof(*out));
    memcpy(out + (nx - i), y + j, (ny - j) * sizeof(*out));
}

/* Natural merge sort: a request's list is a few ascending runs (one per group and region
 * when its ids ascend), so it takes log2(runs) passes, not log2(n). */
kvx_pair_t *plan_pairs_sort(kvx_pair_t *pairs, kvx_pair_t *tmp, size_t n)
{
    kvx_pair_t *src = pairs;
    kvx_pair_t *dst = tmp;

    if (n < 2)
        return pairs;
    for (;;) {
        size_t runs = 0;

        for (size_t i = 0; i < n;) {
            size_t mid = run_end(src, i, n);
            size_t end = mid < n ? run_end(src, mid, n) : n;

            runs_merge(src + i, mid - i, src + mid, end - mid, dst + i);
            i = end;
            runs++;
        }
        if (runs == 1)
            return dst;
        src = dst;
        dst = src == pairs ? tmp : pairs;
    }
}

bool plan_pairs_overlap(const kvx_pair_t *sorted, size_t n, struct plan_conflict *conflict_p)
{
    size_t widest = 0; /* the pair reaching furthest so far in this storage */

    for (size_t i = 1; i < n; i++) {
        const kvx_pair_t *w = &sorted[widest];
        const kvx_pair_t *p = &sorted[i];

        if (p->local_storage != w->local_storage) {
            widest = i;
            continue;
        }
        if (p->local_offset < w->local_offset + w->len) {
            if (conflict_p != NULL)
                *conflict_p = (struct plan_conflict){*w, *p, p->local_offset};
            return true;
        }
        if (p->local_offset + p->len > w->local_offset + w->len)
            widest = i;
    }
    return false;
}

size_t plan_pairs_sweep(const kvx_pair_t *sorted, size_t n, uint64_t max_len, kvx_pair_t *out,
                        struct plan_conflict *conflict_p)
{
    kvx_pair_t cur;
    size_t m = 0;

    if (n == 0)
        return 0;
    cur = sorted[0];
    for (size_t i = 1; i < n; i++) {
        const kvx_pair_t p = sorted[i]; /* read before out[m] may overwrite it */
        uint64_t cur_end   = cur.local_offset + cur.len;
        uint64_t p_end     = p.local_offset + p.len;

        /* Bytes before cur's start were written by runs cut off at max_len, with cur's
         * source: p may reach back into them, and is compared with cur all the same. */
        if (p.local_storage == cur.local_storage && p.local_offset < cur_end) {
            if (!pair_same_source(&cur, &p)) {
                *conflict_p = (struct plan_conflict){cur, p, p.local_offset};
                return SIZE_MAX;
            }
            if (p_end <= cur_end)
                continue; /* a repeat: every byte is already in */
            if (max_len == 0 || cur.len + (p_end - cur_end) <= max_len) {
                cur.len += p_end - cur_end;
                continue;
            }
            out[m++] = cur; /* only p's new bytes go on, as a run of their own */
            cur      = (kvx_pair_t){p.local_storage, p.remote_storage, cur_end,
                                    p.remote_offset + (cur_end - p.local_offset), p_end - cur_end};
            continue;
        }
        if (p.local_storage == cur.local_storage && p.remote_storage == cur.remote_storage &&
            p.local_offset == cur_end && p.remote_offset == cur.remote_offset + cur.len &&
            (max_len == 0 || cur.len + p.len <= max_len)) {
            cur.len += p.len;
            continue;
        }
        out[m++] = cur;
        cur      = p;
    }
    out[m++] = cur;
    return m;
}

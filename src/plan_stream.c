/* plan_stream.c: the streaming phase of a request's emission (plan_request.c emit_single_ids)
 * four block ids at a time, with AVX2 where the CPU has it. A scattered request writes one
 * 32-byte pair per id; as four 8-byte stores each, the pairs cost more than everything else
 * the planner does (docs/performance.md "Planning"). Here each pair is one 32-byte store.
 * Everything exact stays in the scalar loop: a group of four with an id over its limit, or
 * with a pair that continues the one before it, is left to it whole. */
#include "plan.h"

#include <stddef.h>
#include <string.h>

static bool stream_disabled; /* plan_stream_disable: tests run the scalar loop alone */

void plan_stream_disable(bool disabled)
{
    stream_disabled = disabled;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* A pair as four 64-bit lanes: storages, local offset, remote offset, length. */
_Static_assert(sizeof(kvx_pair_t) == 32 && offsetof(kvx_pair_t, local_storage) == 0 &&
                   offsetof(kvx_pair_t, remote_storage) == 4 &&
                   offsetof(kvx_pair_t, local_offset) == 8 &&
                   offsetof(kvx_pair_t, remote_offset) == 16 && offsetof(kvx_pair_t, len) == 24,
               "kvx_pair_t is not four 64-bit lanes");

bool plan_stream_usable(const struct single_run *sr)
{
    /* The products are 32 x 32 bits (vpmuludq): ids under their limits, and strides, must
     * fit in 32 bits. */
    return !stream_disabled && sr->local_stride <= UINT32_MAX && sr->remote_stride <= UINT32_MAX &&
           sr->local_limit - 1 <= UINT32_MAX && sr->remote_limit - 1 <= UINT32_MAX &&
           __builtin_cpu_supports("avx2");
}

/* Whether a lane of `ids` is at or over its lane of limit - 1 (`last_ok`), unsigned. */
__attribute__((target("avx2"))) static inline bool over(__m256i ids, __m256i last_ok)
{
    const __m256i sign = _mm256_set1_epi64x(INT64_MIN);
    __m256i bad        = _mm256_cmpgt_epi64(_mm256_xor_si256(ids, sign), last_ok);

    return !_mm256_testz_si256(bad, bad);
}

__attribute__((target("avx2"))) size_t plan_stream(const struct single_run *sr,
                                                   const uint64_t *local_ids,
                                                   const uint64_t *remote_ids, size_t n,
                                                   uint64_t last_lo, kvx_pair_t *out)
{
    const __m256i sign    = _mm256_set1_epi64x(INT64_MIN);
    const __m256i lbase   = _mm256_set1_epi64x((long long)sr->local_base);
    const __m256i rbase   = _mm256_set1_epi64x((long long)sr->remote_base);
    const __m256i lstride = _mm256_set1_epi64x((long long)sr->local_stride);
    const __m256i rstride = _mm256_set1_epi64x((long long)sr->remote_stride);
    const __m256i len     = _mm256_set1_epi64x((long long)sr->len);
    const __m256i lok     = _mm256_xor_si256(_mm256_set1_epi64x((long long)(sr->local_limit - 1)),
                                             sign); /* for the signed compare in over() */
    const __m256i rok =
        _mm256_xor_si256(_mm256_set1_epi64x((long long)(sr->remote_limit - 1)), sign);
    const __m256i storages =
        _mm256_set1_epi64x((long long)((uint64_t)sr->remote_storage << 32 | sr->local_storage));
    __m256i last = _mm256_set1_epi64x((long long)last_lo); /* lane 3: the last local offset */
    size_t i     = 0;

    for (; i + 4 <= n; i += 4) {
        __m256i ids = _mm256_loadu_si256((const __m256i *)(local_ids + i));
        __m256i rids =
            remote_ids != NULL ? _mm256_loadu_si256((const __m256i *)(remote_ids + i)) : ids;
        __m256i lo;
        __m256i ro;
        __m256i before; /* each lane's previous local offset */
        __m256i a;
        __m256i b;
        __m256i c;
        __m256i d;

        if (over(ids, lok) || (remote_ids != NULL && over(rids, rok)))
            break;
        lo     = _mm256_add_epi64(lbase, _mm256_mul_epu32(ids, lstride));
        ro     = _mm256_add_epi64(rbase, _mm256_mul_epu32(rids, rstride));
        before = _mm256_blend_epi32(_mm256_permute4x64_epi64(lo, _MM_SHUFFLE(2, 1, 0, 3)),
                                    _mm256_permute4x64_epi64(last, _MM_SHUFFLE(3, 3, 3, 3)), 0x03);
        if (_mm256_movemask_pd(
                _mm256_castsi256_pd(_mm256_cmpeq_epi64(lo, _mm256_add_epi64(before, len)))) != 0)
            break;
        last = lo;
        a    = _mm256_unpacklo_epi64(storages, lo); /* pairs 0 and 2, first halves */
        b    = _mm256_unpackhi_epi64(storages, lo); /* pairs 1 and 3 */
        c    = _mm256_unpacklo_epi64(ro, len);      /* pairs 0 and 2, second halves */
        d    = _mm256_unpackhi_epi64(ro, len);
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_permute2x128_si256(a, c, 0x20));
        _mm256_storeu_si256((__m256i *)(out + i + 1), _mm256_permute2x128_si256(b, d, 0x20));
        _mm256_storeu_si256((__m256i *)(out + i + 2), _mm256_permute2x128_si256(a, c, 0x31));
        _mm256_storeu_si256((__m256i *)(out + i + 3), _mm256_permute2x128_si256(b, d, 0x31));
    }
    return i;
}

#else

bool plan_stream_usable(const struct single_run *sr)
{
    (void)sr;
    return false;
}

size_t plan_stream(const struct single_run *sr, const uint64_t *local_ids,
                   const uint64_t *remote_ids, size_t n, uint64_t last_lo, kvx_pair_t *out)
{
    (void)sr, (void)local_ids, (void)remote_ids, (void)n, (void)last_lo, (void)out;
    return 0;
}

#endif

/* prng.c: splitmix64, small and good enough to spread generated layouts; not for anything
 * secret. */
#include "prng.h"

#include <stdlib.h>

uint64_t prng_seed_from_env(uint64_t fallback)
{
    const char *text = getenv("KVX_TEST_SEED");

    return text != NULL && *text != '\0' ? strtoull(text, NULL, 0) : fallback;
}

void prng_init(struct prng *p, uint64_t seed)
{
    p->state = seed;
}

uint64_t prng_next(struct prng *p)
{
    uint64_t z = (p->state += 0x9e3779b97f4a7c15u);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

uint64_t prng_range(struct prng *p, uint64_t lo, uint64_t hi)
{
    uint64_t span = hi - lo + 1;

    return span == 0 ? prng_next(p) : lo + prng_next(p) % span;
}

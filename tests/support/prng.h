/* prng.h: the seeded generator of the property tests. Seeded from KVX_TEST_SEED or a fixed
 * default so every run is reproducible and a failure can print its seed. */
#ifndef KVX_TESTS_PRNG_H
#define KVX_TESTS_PRNG_H

#include <stdint.h>

struct prng {
    uint64_t state;
};

/* The seed of this run: KVX_TEST_SEED if set, else `fallback`. */
uint64_t prng_seed_from_env(uint64_t fallback);

void prng_init(struct prng *p, uint64_t seed);

/* Uniform 64-bit value (splitmix64). */
uint64_t prng_next(struct prng *p);

/* Uniform in [lo, hi], hi >= lo. */
uint64_t prng_range(struct prng *p, uint64_t lo, uint64_t hi);

#endif

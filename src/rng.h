/*
 * The PRNG behind weight initialisation and shuffling: xoshiro256**
 * (Blackman & Vigna), seeded by running splitmix64 over the 64-bit seed.
 * Documented because results are reproducible from a seed across machines:
 * the same seed gives the same weights and the same data order everywhere.
 *
 * Streams: weights are drawn from castor__rng_seed(seed, CASTOR_RNG_INIT, 0),
 * layer by layer, kernel in row-major order; epoch e's shuffle from
 * castor__rng_seed(seed, CASTOR_RNG_SHUFFLE, e). A stream is a pure function
 * of (seed, purpose, index), so resuming at epoch e needs no saved RNG state
 * beyond the seed.
 */
#ifndef CASTOR_RNG_H
#define CASTOR_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct castor__rng {
    uint64_t s[4];
} castor__rng;

enum { CASTOR_RNG_INIT = 1, CASTOR_RNG_SHUFFLE = 2 };

void castor__rng_seed(castor__rng *rng, uint64_t seed, uint64_t purpose, uint64_t index);
uint64_t castor__rng_next(castor__rng *rng);
/* Uniform in [0, 1) with 24 random bits (every value exactly a float). */
float castor__rng_uniform(castor__rng *rng);
/* Uniform integer in [0, bound), bound > 0, without modulo bias. */
uint64_t castor__rng_below(castor__rng *rng, uint64_t bound);
/* perm[0..n) = a Fisher-Yates shuffle of 0..n-1. */
void castor__rng_permutation(castor__rng *rng, uint32_t *perm, size_t n);

#endif

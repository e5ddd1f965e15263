#include "rng.h"

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void castor__rng_seed(castor__rng *rng, uint64_t seed, uint64_t purpose, uint64_t index)
{
    /* Mix the three words through splitmix so nearby seeds and indices give
     * unrelated streams. */
    uint64_t st = seed;
    uint64_t a = splitmix64(&st);
    st = a ^ (purpose * 0xD1B54A32D192ED03ULL);
    uint64_t b = splitmix64(&st);
    st = b ^ (index * 0xABC98388FB8FAC03ULL);
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&st);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t castor__rng_next(castor__rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float castor__rng_uniform(castor__rng *rng)
{
    return (float)(castor__rng_next(rng) >> 40) * (1.0f / 16777216.0f);
}

uint64_t castor__rng_below(castor__rng *rng, uint64_t bound)
{
    /* Rejection on the top of the range keeps every value equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do {
        x = castor__rng_next(rng);
    } while (x >= limit);
    return x % bound;
}

void castor__rng_permutation(castor__rng *rng, uint32_t *perm, size_t n)
{
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)castor__rng_below(rng, i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

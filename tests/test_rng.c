/*
 * src/rng.c: xoshiro256** against its authors' output, and what the
 * trainer relies on from it: shuffles that draw every order alike,
 * uniform floats over all of [0, 1), and streams of their own for every
 * purpose and index (rng.h).
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "src/rng.h"

/* The first outputs of xoshiro256** from the state {1, 2, 3, 4}, as the
 * reference implementation (prng.di.unimi.it) gives them. */
Test(rng, xoshiro256starstar_matches_the_reference)
{
    static const uint64_t want[6] = {11520u, 0u, 1509978240u, 1215971899390074240u,
                                     1216172134540287360u, 607988272756665600u};
    castor__rng rng = {{1, 2, 3, 4}};
    for (int i = 0; i < 6; i++) {
        uint64_t got = castor__rng_next(&rng);
        cr_assert_eq(got, want[i], "output %d: %llu, want %llu", i, (unsigned long long)got,
                     (unsigned long long)want[i]);
    }
}

/* Over 6000 seeds each of the 6 orders of 3 samples comes about 1000 times
 * (a standard deviation of 29). A Fisher-Yates that stopped one swap early
 * never swapped the first two samples; one that drew j below i - 1 (Sattolo's
 * algorithm) gave only the two cyclic orders. */
Test(rng, shuffles_draw_every_order_alike)
{
    int count[3][3][3] = {{{0}}};
    for (uint64_t seed = 0; seed < 6000; seed++) {
        castor__rng rng;
        castor__rng_seed(&rng, seed, CASTOR_RNG_SHUFFLE, 0);
        uint32_t perm[3];
        castor__rng_permutation(&rng, perm, 3);
        cr_assert(perm[0] < 3 && perm[1] < 3 && perm[2] < 3);
        count[perm[0]][perm[1]][perm[2]]++;
    }
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 3; c++)
                if (a != b && b != c && a != c)
                    cr_assert(count[a][b][c] > 850 && count[a][b][c] < 1150,
                              "order %d %d %d drawn %d times of 6000", a, b, c, count[a][b][c]);
}

/* Uniform in [0, 1) over all of it: weights are drawn from it. */
Test(rng, uniform_covers_zero_to_one)
{
    castor__rng rng;
    castor__rng_seed(&rng, 3, CASTOR_RNG_INIT, 0);
    double sum = 0;
    float lo = 1, hi = 0;
    for (int i = 0; i < 100000; i++) {
        float u = castor__rng_uniform(&rng);
        cr_assert(u >= 0.0f && u < 1.0f, "draw %d: %g", i, (double)u);
        sum += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    cr_assert(lo < 1e-3f && hi > 1 - 1e-3f, "draws from %g to %g", (double)lo, (double)hi);
    cr_assert(sum / 100000 > 0.49 && sum / 100000 < 0.51, "mean %g", sum / 100000);
}

/* The weights' stream, and every epoch's shuffle, are each a stream of
 * their own: a seeding that dropped the purpose shuffled the first epoch in
 * the order the weights were drawn in. */
Test(rng, every_purpose_and_index_has_its_own_stream)
{
    const uint64_t keys[4][2] = {{CASTOR_RNG_INIT, 0}, {CASTOR_RNG_SHUFFLE, 0},
                                 {CASTOR_RNG_SHUFFLE, 1}, {CASTOR_RNG_INIT, 1}};
    uint64_t first[4];
    for (int k = 0; k < 4; k++) {
        castor__rng rng;
        castor__rng_seed(&rng, 42, keys[k][0], keys[k][1]);
        first[k] = castor__rng_next(&rng);
    }
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++)
            cr_assert_neq(first[a], first[b], "purpose %llu index %llu and purpose %llu index "
                          "%llu begin alike", (unsigned long long)keys[a][0],
                          (unsigned long long)keys[a][1], (unsigned long long)keys[b][0],
                          (unsigned long long)keys[b][1]);
}

/*
 * host/reduce.c: the sum is in replica order and bitwise the same however
 * the range is split.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "host/pool.h"
#include "host/reduce.h"

#define MAX_SRC 4

/* splitmix64: a fixed stream, so a failure reproduces. */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Values over many magnitudes and both signs, so that float addition is far
 * from associative and a wrong order shows in the bits. */
static void fill_wild(uint64_t *rng, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next_u64(rng);
        float mantissa = (float)(r >> 40) / (float)(1u << 24) + 0.5f;
        int exponent = (int)((r >> 8) % 40) - 20;
        dst[i] = ldexpf((r & 1) ? -mantissa : mantissa, exponent);
    }
}

typedef struct sources {
    size_t n;
    float *bufs[MAX_SRC];
    const float *srcs[MAX_SRC];
} sources;

static sources make_sources(size_t n, uint64_t seed)
{
    sources s = {.n = n};
    uint64_t rng = seed;
    for (int k = 0; k < MAX_SRC; k++) {
        s.bufs[k] = malloc((n ? n : 1) * sizeof(float));
        cr_assert_not_null(s.bufs[k]);
        fill_wild(&rng, s.bufs[k], n);
        s.srcs[k] = s.bufs[k];
    }
    return s;
}

static void free_sources(sources *s)
{
    for (int k = 0; k < MAX_SRC; k++)
        free(s->bufs[k]);
}

/* The definition: one element at a time, replica 0 first. */
static void sequential_sum(float *dst, const sources *s, int nsrc)
{
    for (size_t i = 0; i < s->n; i++) {
        float acc = s->srcs[0][i];
        for (int k = 1; k < nsrc; k++)
            acc += s->srcs[k][i];
        dst[i] = acc;
    }
}

static void expect_bitwise(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof *got) != 0)
            cr_assert_fail("%s: first difference at [%zu] of %zu: got %a, want %a", what, i, n,
                           (double)got[i], (double)want[i]);
}

static const size_t lengths[] = {1, 2, 15, 17, 1023, 1025, 4099, 40001, 100003};
#define N_LENGTHS (sizeof lengths / sizeof lengths[0])

Test(reduce, equals_sequential_sum_for_every_split)
{
    castor__pool *pools[3];
    for (int t = 0; t < 3; t++)
        cr_assert_eq(castor__pool_create(t + 1, &pools[t], NULL), CASTOR_OK);
    for (size_t l = 0; l < N_LENGTHS; l++) {
        size_t n = lengths[l];
        sources s = make_sources(n, 1000 + l);
        float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
        cr_assert(want && got);
        for (int nsrc = 1; nsrc <= MAX_SRC; nsrc++) {
            sequential_sum(want, &s, nsrc);
            char what[96];
            memset(got, 0xff, n * sizeof *got);
            castor__reduce_sum(NULL, got, s.srcs, nsrc, n);
            snprintf(what, sizeof what, "n %zu, %d sources, no pool", n, nsrc);
            expect_bitwise(got, want, n, what);
            for (int t = 0; t < 3; t++) {
                memset(got, 0xff, n * sizeof *got);
                castor__reduce_sum(pools[t], got, s.srcs, nsrc, n);
                snprintf(what, sizeof what, "n %zu, %d sources, %d threads", n, nsrc, t + 1);
                expect_bitwise(got, want, n, what);
            }
            /* Any split point, including ones off the 16-float grid. */
            size_t cut = n / 3 + 1 < n ? n / 3 + 1 : n;
            memset(got, 0xff, n * sizeof *got);
            castor__reduce_range(got, s.srcs, nsrc, 0, cut);
            castor__reduce_range(got, s.srcs, nsrc, cut, n);
            snprintf(what, sizeof what, "n %zu, %d sources, split at %zu", n, nsrc, cut);
            expect_bitwise(got, want, n, what);
        }
        free(want);
        free(got);
        free_sources(&s);
    }
    for (int t = 0; t < 3; t++)
        castor__pool_free(pools[t]);
}

/* Guards the test itself: with this data a different order gives different
 * bits, so the checks above can tell orders apart. */
Test(reduce, data_tells_orders_apart)
{
    sources s = make_sources(1000, 5);
    int differs = 0;
    for (size_t i = 0; i < s.n && !differs; i++) {
        float forward = ((s.srcs[0][i] + s.srcs[1][i]) + s.srcs[2][i]) + s.srcs[3][i];
        float backward = ((s.srcs[3][i] + s.srcs[2][i]) + s.srcs[1][i]) + s.srcs[0][i];
        differs = memcmp(&forward, &backward, sizeof forward) != 0;
    }
    cr_assert(differs);
    free_sources(&s);
}

Test(reduce, in_place_into_first_source)
{
    size_t n = 5003;
    sources s = make_sources(n, 9);
    float *want = malloc(n * sizeof *want);
    cr_assert_not_null(want);
    sequential_sum(want, &s, 3);
    castor__reduce_sum(NULL, s.bufs[0], s.srcs, 3, n);
    expect_bitwise(s.bufs[0], want, n, "in place");
    free(want);
    free_sources(&s);
}

Test(reduce, no_sources_gives_zeros)
{
    float dst[37];
    memset(dst, 0xff, sizeof dst);
    castor__reduce_sum(NULL, dst, NULL, 0, 37);
    for (int i = 0; i < 37; i++)
        cr_assert(dst[i] == 0.0f, "dst[%d] = %g", i, (double)dst[i]);
}

Test(reduce, empty_range_touches_nothing)
{
    float dst[4] = {1, 2, 3, 4}, src[4] = {5, 6, 7, 8};
    const float *srcs[1] = {src};
    castor__reduce_range(dst, srcs, 1, 2, 2);
    castor__reduce_sum(NULL, dst, srcs, 1, 0);
    cr_assert(dst[0] == 1 && dst[1] == 2 && dst[2] == 3 && dst[3] == 4);
}

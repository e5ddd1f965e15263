/*
 * The reduction's kernels, for the files that run them (reduce.c, and
 * update.c, which feeds each summed chunk straight to the optimizer):
 * inlined there, so that a full chunk's loops see a constant trip count,
 * which gcc -O2's "very cheap" vectoriser needs (it will not vectorise a
 * loop that needs a scalar epilogue).
 */
#ifndef CASTOR_HOST_REDUCE_KERNELS_H
#define CASTOR_HOST_REDUCE_KERNELS_H

#include <stddef.h>
#include <string.h>

static inline void castor__sum_pair(float *restrict dst, const float *restrict a,
                                    const float *restrict b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] = a[i] + b[i];
}

/* Two sources per pass halves the loads and stores of dst; the brackets keep
 * the additions in replica order. */
static inline void castor__add_pair(float *restrict dst, const float *restrict a,
                                    const float *restrict b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] = (dst[i] + a[i]) + b[i];
}

static inline void castor__add_one(float *restrict dst, const float *restrict a, size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] += a[i];
}

/* dst[0..len) = the sum, in replica order, of srcs[k][at..at+len). dst may
 * be srcs[0] + at itself (the sum lands in replica 0's buffer) but must not
 * overlap any other source. */
static inline __attribute__((always_inline)) void
castor__reduce_chunk(float *dst, const float *const *srcs, int nsrc, size_t at, size_t len)
{
    int next;
    if (nsrc <= 0) {
        memset(dst, 0, len * sizeof *dst);  /* the empty sum */
        return;
    }
    if (dst == srcs[0] + at) {
        next = 1;  /* in place: dst already holds replica 0 */
    } else if (nsrc == 1) {
        memcpy(dst, srcs[0] + at, len * sizeof *dst);
        return;
    } else {
        castor__sum_pair(dst, srcs[0] + at, srcs[1] + at, len);
        next = 2;
    }
    for (; next + 1 < nsrc; next += 2)
        castor__add_pair(dst, srcs[next] + at, srcs[next + 1] + at, len);
    if (next < nsrc)
        castor__add_one(dst, srcs[next] + at, len);
}

#endif

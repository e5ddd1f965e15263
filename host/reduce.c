#include "reduce.h"

#include <string.h>

/* Floats per block. A block of dst (4 KiB) stays in L1 while every source is
 * added into it, so dst goes to memory once however many replicas there are.
 * A constant trip count also lets gcc -O2 (the "very cheap" vectoriser, which
 * refuses loops that need a scalar epilogue) vectorise the full blocks. */
#define BLOCK 1024

/* Below this many floats waking the host threads costs more than it saves. */
#define REDUCE_MIN_PARALLEL ((size_t)1 << 15)

static inline void sum_pair(float *restrict dst, const float *restrict a,
                            const float *restrict b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] = a[i] + b[i];
}

/* Two sources per pass halves the loads and stores of dst; the brackets keep
 * the additions in replica order. */
static inline void add_pair(float *restrict dst, const float *restrict a,
                            const float *restrict b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] = (dst[i] + a[i]) + b[i];
}

static inline void add_one(float *restrict dst, const float *restrict a, size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] += a[i];
}

static inline void reduce_block(float *dst, const float *const *srcs, int nsrc, size_t at,
                                size_t len)
{
    int next;
    if (dst == srcs[0]) {
        next = 1;  /* in place: dst already holds replica 0 */
    } else if (nsrc == 1) {
        memcpy(dst + at, srcs[0] + at, len * sizeof *dst);
        return;
    } else {
        sum_pair(dst + at, srcs[0] + at, srcs[1] + at, len);
        next = 2;
    }
    for (; next + 1 < nsrc; next += 2)
        add_pair(dst + at, srcs[next] + at, srcs[next + 1] + at, len);
    if (next < nsrc)
        add_one(dst + at, srcs[next] + at, len);
}

/* dst may be srcs[0] itself (the sum lands in replica 0's buffer) but must
 * not overlap any other source. */
void castor__reduce_range(float *dst, const float *const *srcs, int nsrc, size_t begin,
                          size_t end)
{
    if (begin >= end)
        return;
    if (nsrc <= 0) {
        memset(dst + begin, 0, (end - begin) * sizeof *dst);  /* the empty sum */
        return;
    }
    size_t at = begin;
    for (; end - at >= BLOCK; at += BLOCK)
        reduce_block(dst, srcs, nsrc, at, BLOCK);
    if (at < end)
        reduce_block(dst, srcs, nsrc, at, end - at);
}

typedef struct reduce_job {
    float *dst;
    const float *const *srcs;
    int nsrc;
} reduce_job;

static void reduce_task(void *ctx, size_t begin, size_t end)
{
    const reduce_job *job = ctx;
    castor__reduce_range(job->dst, job->srcs, job->nsrc, begin, end);
}

void castor__reduce_sum(castor__pool *pool, float *dst, const float *const *srcs, int nsrc,
                        size_t n)
{
    reduce_job job = {dst, srcs, nsrc};
    castor__pool_for(pool, n, REDUCE_MIN_PARALLEL, reduce_task, &job);
}

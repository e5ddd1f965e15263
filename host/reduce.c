#include "reduce.h"

#include "reduce_kernels.h"

/* Floats per block. A block of dst (4 KiB) stays in L1 while every source is
 * added into it, so dst goes to memory once however many replicas there are;
 * full blocks get a constant trip count (reduce_kernels.h). */
#define BLOCK 1024

/* Below this many floats waking the host threads costs more than it saves. */
#define REDUCE_MIN_PARALLEL ((size_t)1 << 15)

void castor__reduce_range(float *dst, const float *const *srcs, int nsrc, size_t begin,
                          size_t end)
{
    size_t at = begin;
    for (; at < end && end - at >= BLOCK; at += BLOCK)
        castor__reduce_chunk(dst + at, srcs, nsrc, at, BLOCK);
    if (at < end)
        castor__reduce_chunk(dst + at, srcs, nsrc, at, end - at);
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

/*
 * Reduction of the replicas' gradient buffers into one, on the CPU.
 *
 * dst[i] = (((src[0][i] + src[1][i]) + src[2][i]) + ...), always in replica
 * order, so the result does not depend on how the range is split over
 * threads: runs are bitwise reproducible.
 */
#ifndef CASTOR_HOST_REDUCE_H
#define CASTOR_HOST_REDUCE_H

#include <stddef.h>

#include "pool.h"

/* Over [begin, end) only: the kernel one thread runs. */
void castor__reduce_range(float *dst, const float *const *srcs, int nsrc, size_t begin,
                          size_t end);
/* Over [0, n), split over the pool (pool may be NULL: caller's thread). */
void castor__reduce_sum(castor__pool *pool, float *dst, const float *const *srcs, int nsrc,
                        size_t n);

#endif

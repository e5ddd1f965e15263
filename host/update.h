/*
 * The central strategy's host update in one pass: the replicas' gradients
 * are summed a chunk at a time (in replica order, as castor__reduce_sum)
 * and each summed chunk goes to the optimizer (as castor__optim_apply)
 * while it is in L1. The sum never reaches memory: per variable that saves
 * the write of the sum and its read by the optimizer, 8 of the 4 * (R + 8)
 * bytes that summing R gradients and then Adam moved (R = 2: 40 -> 32), and
 * of SGD's 4 * (R + 4) (24 -> 16). The arithmetic is the two functions', bit
 * for bit.
 */
#ifndef CASTOR_HOST_UPDATE_H
#define CASTOR_HOST_UPDATE_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"
#include "pool.h"

/* params and state (optim.h's layout) of n variables updated with the sum
 * of grads[0..ngrads) at step (1-based), split over the pool (may be NULL). */
void castor__host_update(castor__pool *pool, const castor_optimizer *opt, float *params,
                         float *state, const float *const *grads, int ngrads, size_t n,
                         int64_t step);

#endif

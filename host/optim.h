/*
 * The optimizers, applied to a flat buffer of variables on the CPU.
 *
 * Formulas (Keras 3's, in float32):
 *   SGD:        p -= lr * g
 *   momentum:   v = mu * v - lr * g;  p += v
 *   Nesterov:   v = mu * v - lr * g;  p += mu * v - lr * g
 *   Adam:       m += (g - m) * (1 - b1);  v += (g*g - v) * (1 - b2)
 *               a = lr * sqrt(1 - b2^t) / (1 - b1^t)
 *               p -= a * m / (sqrt(v) + eps)
 *   AdamW:      p -= lr * wd * p, then Adam
 * t is the 1-based step. The optimizer state is one flat buffer of
 * castor__optim_state_floats() floats: slot k of variable i at state[k*n + i]
 * (momentum: v; Adam: m then v).
 */
#ifndef CASTOR_HOST_OPTIM_H
#define CASTOR_HOST_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"
#include "pool.h"

/* Number of state slots per variable: 0, 1 (momentum) or 2 (Adam, AdamW). */
int castor__optim_slots(const castor_optimizer *opt);
/* Names of slot k for checkpoints: "momentum", "adam_m", "adam_v". */
const char *castor__optim_slot_name(const castor_optimizer *opt, int slot);
/* Check hyper-parameters; on error writes a message and returns CASTOR_INVALID. */
int castor__optim_validate(const castor_optimizer *opt, char *err, size_t errlen);
/* Settings another kind has and opt's kind would drop: momentum or nesterov
 * for Adam/AdamW, weight_decay for SGD/Adam (Keras applies those there; a
 * model refuses them rather than train without them). CASTOR_INVALID and
 * a message, or CASTOR_OK. */
int castor__optim_check_dropped(const castor_optimizer *opt, char *err, size_t errlen);
/* opt with the fields its kind does not read set to the kind's defaults:
 * what a model keeps, so that a checkpoint never carries a stray NaN. */
castor_optimizer castor__optim_normalized(const castor_optimizer *opt);

/* Update variables [begin, end) of n; the kernel one thread runs. */
void castor__optim_apply_range(const castor_optimizer *opt, float *params, const float *grads,
                               float *state, size_t n, int64_t step, size_t begin, size_t end);
/* Update all n variables, split over the pool (pool may be NULL). */
void castor__optim_apply(castor__pool *pool, const castor_optimizer *opt, float *params,
                         const float *grads, float *state, size_t n, int64_t step);

#endif

/*
 * The optimizers' kernels, for the files that run them (optim.c, and
 * update.c, which gives each chunk of the replicas' summed gradient to the
 * optimizer while it is in cache): inlined there, so that a full chunk's
 * loops see a constant trip count, which gcc -O2's "very cheap" vectoriser
 * needs (it will not vectorise a loop that needs a scalar epilogue).
 */
#ifndef CASTOR_HOST_OPTIM_KERNELS_H
#define CASTOR_HOST_OPTIM_KERNELS_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "castor.h"

/* ---- the kernels: one pass over len variables, no calls, no aliasing ---- */

/* Optimizer state below FLT_MIN is stored as 0. A variable whose gradient
 * stays 0 (the weights of a dead ReLU unit) sees its momentum and Adam m
 * decay by 0.9 a step and v by 0.999; in round-to-nearest a subnormal of a
 * few ulps times 0.9 (v: up to 500 ulps times 0.999) rounds back to
 * itself, so without this the state stayed subnormal for good, and every
 * later update read and wrote subnormals, which x86 cores handle in
 * microcode: the host update of a model whose dead units held 70% of its
 * state ran 1.8 times slower on an EPYC, much more on most Intel cores.
 * What is dropped is below 1.2e-38: a velocity that small moves no
 * variable, and Adam's sqrt(v) < 2^-63 vanishes next to an epsilon of at
 * least 2^-39 (half an ulp of it). Adam with a smaller epsilon keeps its
 * subnormal state (castor__adam_state_floor), since there the flush would
 * divide m by epsilon alone: one step with epsilon 1e-30 and a gradient of
 * 2e-19 moved a variable by 6e6 instead of 1e-3. Compiles to a compare and
 * a mask: the loops still vectorise. The CUDA kernels
 * (device/cuda/optimizer.cu) flush alike. */
static inline float castor__flush_below(float x, float floor)
{
    return fabsf(x) < floor ? 0.0f : x;
}

static inline float castor__flush_tiny(float x)
{
    return castor__flush_below(x, FLT_MIN);
}

/* The least epsilon at which Adam's state is flushed, and the floor an
 * epsilon gives: sqrt(FLT_MIN) = 2^-63 is half an ulp of 2^-39. */
#define CASTOR__ADAM_FLUSH_MIN_EPS 0x1p-39f
static inline float castor__adam_state_floor(float eps)
{
    return eps >= CASTOR__ADAM_FLUSH_MIN_EPS ? FLT_MIN : 0.0f;
}

static inline void castor__sgd_kernel(float *restrict p, const float *restrict g, size_t len,
                                      float lr)
{
    for (size_t i = 0; i < len; i++)
        p[i] -= lr * g[i];
}

static inline void castor__momentum_kernel(float *restrict p, const float *restrict g,
                                           float *restrict vel, size_t len, float mu, float lr)
{
    for (size_t i = 0; i < len; i++) {
        vel[i] = castor__flush_tiny(mu * vel[i] - lr * g[i]);
        p[i] += vel[i];
    }
}

static inline void castor__nesterov_kernel(float *restrict p, const float *restrict g,
                                           float *restrict vel, size_t len, float mu, float lr)
{
    for (size_t i = 0; i < len; i++) {
        vel[i] = castor__flush_tiny(mu * vel[i] - lr * g[i]);
        p[i] += mu * vel[i] - lr * g[i];
    }
}

/* optim.h's order, (lr * wd) * p. Keras multiplies (p * wd) * lr, which can
 * differ in the last bit; the device kernels follow optim.h. */
static inline void castor__decay_kernel(float *restrict p, size_t len, float lr_wd)
{
    for (size_t i = 0; i < len; i++)
        p[i] -= lr_wd * p[i];
}

/* sqrtf here is inlined as one instruction; gcc vectorises it only when
 * -fno-math-errno is on, since the library call may set errno. */
static inline void castor__adam_kernel(float *restrict p, const float *restrict g,
                                       float *restrict m, float *restrict v, size_t len,
                                       float one_minus_b1, float one_minus_b2, float alpha,
                                       float eps, float state_floor)
{
    for (size_t i = 0; i < len; i++) {
        m[i] = castor__flush_below(m[i] + (g[i] - m[i]) * one_minus_b1, state_floor);
        v[i] = castor__flush_below(v[i] + (g[i] * g[i] - v[i]) * one_minus_b2, state_floor);
        p[i] -= alpha * m[i] / (sqrtf(v[i]) + eps);
    }
}

/* What one call needs besides the buffers, worked out once per step. */
typedef struct castor__optim_consts {
    castor_optimizer_kind kind;
    int momentum, nesterov;
    float lr, mu;
    float one_minus_b1, one_minus_b2, alpha, eps;
    float adam_state_floor; /* castor__adam_state_floor(eps) */
    float lr_wd;
} castor__optim_consts;

/* The constants of step (1-based) for opt. */
castor__optim_consts castor__optim_consts_make(const castor_optimizer *opt, int64_t step);

/* One update of len variables at p with gradient g; s0 and s1 are the
 * state slots of the same variables (momentum: s0; Adam: s0 = m, s1 = v;
 * NULL where the kind has none). */
static inline __attribute__((always_inline)) void
castor__optim_chunk(const castor__optim_consts *c, float *p, const float *g, float *s0,
                    float *s1, size_t len)
{
    switch (c->kind) {
    case CASTOR_OPT_SGD:
        if (!c->momentum)
            castor__sgd_kernel(p, g, len, c->lr);
        else if (c->nesterov)
            castor__nesterov_kernel(p, g, s0, len, c->mu, c->lr);
        else
            castor__momentum_kernel(p, g, s0, len, c->mu, c->lr);
        break;
    case CASTOR_OPT_ADAM:
    case CASTOR_OPT_ADAMW:
        if (c->kind == CASTOR_OPT_ADAMW)  /* AdamW is Adam on the decayed variables */
            castor__decay_kernel(p, len, c->lr_wd);
        castor__adam_kernel(p, g, s0, s1, len, c->one_minus_b1, c->one_minus_b2, c->alpha,
                            c->eps, c->adam_state_floor);
        break;
    }
}

/* Slot k (0 or 1) of variables [at, ...) in a state buffer of n variables
 * (optim.h's layout), or NULL where the kind has no such slot. */
static inline float *castor__optim_slot(const castor__optim_consts *c, float *state, size_t n,
                                        int k, size_t at)
{
    int slots = c->kind == CASTOR_OPT_SGD ? c->momentum : 2;
    return state && k < slots ? state + (size_t)k * n + at : NULL;
}

#endif

/*
 * The optimizer update on the GPU (mirrored strategy), with the arithmetic
 * of host/optim.c so that a GPU replica and the host apply the same update
 * to the bit: Keras 3's formulas in float32 (see host/optim.h), the per-step
 * constants worked out on the host in double exactly as make_consts() in
 * host/optim.c does, and every product rounded before it is added
 * (__fmul_rn and friends), because the C code is compiled without FMA
 * contraction while nvcc would otherwise fuse a*b+c. sqrtf and the division
 * are IEEE round-to-nearest in both (nvcc's default -prec-sqrt/-prec-div).
 *
 * State layout as on the host: slot k of variable i at state[k*n + i]
 * (momentum: velocity; Adam: m then v). State below FLT_MIN is stored as 0,
 * on both, except Adam's with an epsilon under 2^-39 (host/optim_kernels.h
 * says why).
 */
#include <cfloat>
#include <cmath>

#include "device/cuda/grid.cuh"
#include "device/cuda/kernels.h"

namespace {

using castor_grid::blocks_for;
using castor_grid::grid_start;
using castor_grid::grid_stride;
using castor_grid::kBlock;

/* Mirrors host/optim.c's step_consts. */
struct StepConsts {
    float lr, mu;
    float one_minus_b1, one_minus_b2, alpha, eps;
    float adam_state_floor;
    float lr_wd;
};

StepConsts make_consts(const castor_optimizer *opt, int64_t step)
{
    /* Step 0 would divide by 1 - b1^0 = 0; the first step is 1. */
    double t = step < 1 ? 1.0 : (double)step;
    double lr = opt->learning_rate;
    StepConsts c;
    c.lr = opt->learning_rate;
    c.mu = opt->momentum;
    c.one_minus_b1 = (float)(1.0 - (double)opt->beta1);
    c.one_minus_b2 = (float)(1.0 - (double)opt->beta2);
    c.alpha = (float)(lr * std::sqrt(1.0 - std::pow((double)opt->beta2, t)) /
                      (1.0 - std::pow((double)opt->beta1, t)));
    c.eps = opt->epsilon;
    /* castor__adam_state_floor: 2^-39 is CASTOR__ADAM_FLUSH_MIN_EPS. */
    c.adam_state_floor = opt->epsilon >= 0x1p-39f ? FLT_MIN : 0.0f;
    c.lr_wd = (float)(lr * (double)opt->weight_decay);
    return c;
}

/* State below floor is stored as 0, as host/optim_kernels.h's
 * castor__flush_below does (why: there). */
__device__ __forceinline__ float flush_below(float x, float floor)
{
    return fabsf(x) < floor ? 0.0f : x;
}

/* p -= lr * g */
__global__ void sgd_kernel(float *p, const float *g, size_t n, float lr)
{
    for (size_t i = grid_start(); i < n; i += grid_stride()) {
        p[i] = __fsub_rn(p[i], __fmul_rn(lr, g[i]));
    }
}

/* v = mu * v - lr * g;  p += v  (Nesterov: p += mu * v - lr * g) */
template <bool NESTEROV>
__global__ void momentum_kernel(float *p, const float *g, float *vel, size_t n, float mu,
                                float lr)
{
    for (size_t i = grid_start(); i < n; i += grid_stride()) {
        float lg = __fmul_rn(lr, g[i]);
        float v = flush_below(__fsub_rn(__fmul_rn(mu, vel[i]), lg), FLT_MIN);
        vel[i] = v;
        p[i] = __fadd_rn(p[i], NESTEROV ? __fsub_rn(__fmul_rn(mu, v), lg) : v);
    }
}

/* AdamW first decays the variable (p -= lr * wd * p), then runs Adam:
 * m += (g - m) * (1 - b1);  v += (g*g - v) * (1 - b2);
 * p -= alpha * m / (sqrt(v) + eps) */
template <bool DECAY>
__global__ void adam_kernel(float *p, const float *g, float *m, float *v, size_t n,
                            float one_minus_b1, float one_minus_b2, float alpha, float eps,
                            float state_floor, float lr_wd)
{
    for (size_t i = grid_start(); i < n; i += grid_stride()) {
        float pi = p[i], gi = g[i];
        if (DECAY)
            pi = __fsub_rn(pi, __fmul_rn(lr_wd, pi));
        float mi = flush_below(
            __fadd_rn(m[i], __fmul_rn(__fsub_rn(gi, m[i]), one_minus_b1)), state_floor);
        float vi = flush_below(
            __fadd_rn(v[i], __fmul_rn(__fsub_rn(__fmul_rn(gi, gi), v[i]), one_minus_b2)),
            state_floor);
        m[i] = mi;
        v[i] = vi;
        p[i] = __fsub_rn(pi, __fdiv_rn(__fmul_rn(alpha, mi), __fadd_rn(__fsqrt_rn(vi), eps)));
    }
}

}  // namespace

cudaError_t castor__cuda_optimizer_step(cudaStream_t s, const castor_optimizer *opt,
                                        float *params, const float *grads, float *state,
                                        size_t n, int64_t step)
{
    if (n == 0)
        return cudaSuccess;
    const StepConsts c = make_consts(opt, step);
    const unsigned blocks = blocks_for(n);
    switch (opt->kind) {
    case CASTOR_OPT_SGD:
        /* As host/optim.c: momentum 0 means plain SGD, with no state. */
        if (opt->momentum == 0.0f)
            sgd_kernel<<<blocks, kBlock, 0, s>>>(params, grads, n, c.lr);
        else if (opt->nesterov)
            momentum_kernel<true><<<blocks, kBlock, 0, s>>>(params, grads, state, n, c.mu, c.lr);
        else
            momentum_kernel<false><<<blocks, kBlock, 0, s>>>(params, grads, state, n, c.mu, c.lr);
        break;
    case CASTOR_OPT_ADAM:
        adam_kernel<false><<<blocks, kBlock, 0, s>>>(params, grads, state, state + n, n,
                                                      c.one_minus_b1, c.one_minus_b2, c.alpha,
                                                      c.eps, c.adam_state_floor, 0.0f);
        break;
    case CASTOR_OPT_ADAMW:
        adam_kernel<true><<<blocks, kBlock, 0, s>>>(params, grads, state, state + n, n,
                                                     c.one_minus_b1, c.one_minus_b2, c.alpha,
                                                     c.eps, c.adam_state_floor, c.lr_wd);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

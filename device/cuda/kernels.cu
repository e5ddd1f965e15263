/*
 * The layer and loss kernels of the CUDA backend, and their host launchers.
 *
 * They follow the CPU backend's arithmetic (device/cpu/cpu_device.c) so the
 * two agree to rounding: the same expressions in the same order, every sum
 * that the interface says runs in a fixed order (the bias gradient) added in
 * that order, and no reduction with float atomics, so a run repeats bit for
 * bit. The row reductions of the losses are trees, so there the two differ
 * in the last bits. Where a product feeds an addition and the CPU
 * code rounds the product first (C11 does not contract a*b+c into an FMA),
 * the __fmul_rn intrinsic keeps nvcc from fusing it either.
 */
#include <cmath>

#include "device/cuda/grid.cuh"
#include "device/cuda/kernels.h"

namespace {

using castor_grid::blocks_for;
using castor_grid::grid_start;
using castor_grid::grid_stride;
using castor_grid::kBlock;

/* Warps per block at most (1024 threads): the size of the reduction scratch. */
constexpr int kMaxWarps = 32;

/* One block per row for the losses: a warp multiple that covers a short row
 * in one pass, at most 256 threads for long ones. */
unsigned row_threads(int cols)
{
    int t = (cols + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : (t > kBlock ? kBlock : t));
}

/* ---- activations: y = f(x); f'(x) written in terms of y ---- */

template <int ACT> __device__ __forceinline__ float act_f(float x)
{
    if (ACT == CASTOR_ACT_RELU)  /* a NaN goes on, as on the CPU backend */
        return x <= 0.0f ? 0.0f : x;
    if (ACT == CASTOR_ACT_TANH)
        return tanhf(x);
    if (ACT == CASTOR_ACT_SIGMOID)
        return 1.0f / (1.0f + expf(-x));
    return x;
}

template <int ACT> __device__ __forceinline__ float act_df(float y, float dy)
{
    if (ACT == CASTOR_ACT_RELU)
        return y <= 0.0f ? 0.0f : dy;
    if (ACT == CASTOR_ACT_TANH)
        return dy * (1.0f - __fmul_rn(y, y));
    if (ACT == CASTOR_ACT_SIGMOID)
        return dy * (y * (1.0f - y));
    return dy;
}

/* ---- block reductions, deterministic ----
 * Within a warp an xor butterfly: partner lanes add the same two values in
 * either order, which IEEE addition makes equal, so every lane ends with the
 * same bits. Across warps every thread adds the per-warp results in warp
 * order, so all threads agree without another broadcast. */

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float block_sum(float v, float *scratch)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0)
        scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; w++)
        s += scratch[w];
    __syncthreads();  /* scratch may be reused by the caller */
    return s;
}

struct ArgMax {
    float v;
    int i;
};

/* The larger value; on a tie the lower index, so the result is the row's
 * first maximum whatever order the partial results meet in. A NaN is never
 * larger (it compares false), and a NaN already held is never replaced. */
__device__ __forceinline__ ArgMax argmax_pick(ArgMax a, ArgMax b)
{
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

__device__ ArgMax block_argmax(ArgMax m, float *scratch_v, int *scratch_i)
{
    for (int o = 16; o > 0; o >>= 1) {
        ArgMax other = {__shfl_xor_sync(0xffffffffu, m.v, o),
                        __shfl_xor_sync(0xffffffffu, m.i, o)};
        m = argmax_pick(m, other);
    }
    if ((threadIdx.x & 31) == 0) {
        scratch_v[threadIdx.x >> 5] = m.v;
        scratch_i[threadIdx.x >> 5] = m.i;
    }
    __syncthreads();
    ArgMax best = {scratch_v[0], scratch_i[0]};
    for (unsigned w = 1; w < blockDim.x / 32; w++)
        best = argmax_pick(best, ArgMax{scratch_v[w], scratch_i[w]});
    __syncthreads();
    return best;
}

/* ---- kernels ---- */

/* c (rows x cols, row stride ld; n = rows * cols) = beta c; beta 0 writes
 * zeros without reading c, as BLAS's beta does. */
__global__ void scale_kernel(float *c, size_t n, size_t cols, size_t ld, float beta)
{
    for (size_t i = grid_start(); i < n; i += grid_stride()) {
        float *p = c + (i / cols) * ld + i % cols;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

__global__ void bias_add_kernel(float *y, const float *bias, size_t n, size_t cols)
{
    for (size_t i = grid_start(); i < n; i += grid_stride())
        y[i] += bias[i % cols];
}

/* One thread per column walking down the rows: the sum runs in row order as
 * the interface asks, and neighbouring threads read neighbouring floats. */
__global__ void bias_grad_kernel(const float *dy, float *db, int rows, int cols)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols)
        return;
    const float *p = dy + c;
    float s = 0.0f;
    for (int r = 0; r < rows; r++, p += cols)
        s += *p;
    db[c] = s;
}

template <int ACT> __global__ void act_forward_kernel(float *y, size_t n)
{
    for (size_t i = grid_start(); i < n; i += grid_stride())
        y[i] = act_f<ACT>(y[i]);
}

template <int ACT> __global__ void act_backward_kernel(const float *y, float *dy, size_t n)
{
    for (size_t i = grid_start(); i < n; i += grid_stride())
        dy[i] = act_df<ACT>(y[i], dy[i]);
}

/* One block per row: the row's first maximum, the sum of exp(x - max) (so
 * no exponent overflows), then the loss, the hit and the gradient. */
__global__ void softmax_xent_kernel(const float *logits, const int32_t *labels, int cols,
                                    float grad_scale, float *dlogits, float *row_stats)
{
    __shared__ float scratch_v[kMaxWarps];
    __shared__ int scratch_i[kMaxWarps];
    const size_t r = blockIdx.x;
    const float *x = logits + r * (size_t)cols;

    /* The CPU backend's scan starts at x[0] and moves only to a later column
     * that is greater ('>'): the first maximum, a NaN past column 0 never
     * taken, and a NaN in x[0] kept (nothing is greater than it). Seeding
     * every thread's partial with column 0 gives the same index: if x[0] is
     * NaN every partial stays {NaN, 0}; otherwise each is a non-NaN value at
     * least x[0], and the tree takes the largest, the lowest index on a tie. */
    ArgMax best = {x[0], 0};
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        best = argmax_pick(best, ArgMax{x[c], c});
    best = block_argmax(best, scratch_v, scratch_i);
    const float mx = best.v;

    float part = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        part += expf(x[c] - mx);
    /* From here the CPU backend's expressions, term for term, so the two
     * differ only by the order of the sum and expf/logf's last bits. */
    const float log_sum = logf(block_sum(part, scratch_v));

    /* Labels are checked on the host (the CPU backend refuses a bad one);
     * one out of range here still must not read outside the row, which
     * would take the whole context down, so its loss is NaN instead. */
    const int label = labels[r];
    const bool valid = label >= 0 && label < cols;
    if (threadIdx.x == 0) {
        const float loss = valid ? log_sum + (mx - x[label]) : NAN;  /* as the CPU backend */
        row_stats[2 * r] = loss;
        row_stats[2 * r + 1] = valid && best.i == label && !isnan(loss) ? 1.0f : 0.0f;
    }
    if (dlogits) {
        float *d = dlogits + r * (size_t)cols;
        for (int c = threadIdx.x; c < cols; c += blockDim.x)
            d[c] = grad_scale * (expf(x[c] - mx - log_sum) - (c == label ? 1.0f : 0.0f));
    }
}

/* grad = grad_scale * 2 / cols, worked out once on the host as the CPU
 * backend does, so the gradients agree to the bit. */
__global__ void mse_kernel(const float *pred, const float *target, int cols, float grad,
                           float *dpred, float *row_stats)
{
    __shared__ float scratch[kMaxWarps];
    const size_t off = (size_t)blockIdx.x * (size_t)cols;
    float part = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = pred[off + c] - target[off + c];
        part += __fmul_rn(d, d);
        if (dpred)
            dpred[off + c] = grad * d;
    }
    const float sum = block_sum(part, scratch);
    if (threadIdx.x == 0) {
        row_stats[2 * (size_t)blockIdx.x] = sum / (float)cols;
        row_stats[2 * (size_t)blockIdx.x + 1] = 0.0f;
    }
}

__global__ void add_kernel(float *dst, const float *src, size_t n)
{
    for (size_t i = grid_start(); i < n; i += grid_stride())
        dst[i] += src[i];
}

}  // namespace

/* ---- host launchers ---- */

cudaError_t castor__cuda_scale(cudaStream_t s, float *c, int rows, int cols, int ld, float beta)
{
    if (rows <= 0 || cols <= 0)
        return cudaSuccess;
    if (ld < cols)
        return cudaErrorInvalidValue;
    size_t n = (size_t)rows * (size_t)cols;
    scale_kernel<<<blocks_for(n), kBlock, 0, s>>>(c, n, (size_t)cols, (size_t)ld, beta);
    return cudaGetLastError();
}

cudaError_t castor__cuda_bias_add(cudaStream_t s, float *y, const float *bias, int rows, int cols)
{
    if (rows <= 0 || cols <= 0)
        return cudaSuccess;
    size_t n = (size_t)rows * (size_t)cols;
    bias_add_kernel<<<blocks_for(n), kBlock, 0, s>>>(y, bias, n, (size_t)cols);
    return cudaGetLastError();
}

cudaError_t castor__cuda_bias_grad(cudaStream_t s, const float *dy, float *db, int rows, int cols)
{
    if (cols <= 0)
        return cudaSuccess;
    /* rows == 0 still runs: the interface says db is overwritten (zeros). */
    const int threads = 128;
    bias_grad_kernel<<<(unsigned)((cols + threads - 1) / threads), threads, 0, s>>>(
        dy, db, rows < 0 ? 0 : rows, cols);
    return cudaGetLastError();
}

cudaError_t castor__cuda_act_forward(cudaStream_t s, castor_activation act, float *y, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    switch (act) {
    case CASTOR_ACT_LINEAR:
        return cudaSuccess;
    case CASTOR_ACT_RELU:
        act_forward_kernel<CASTOR_ACT_RELU><<<blocks_for(n), kBlock, 0, s>>>(y, n);
        break;
    case CASTOR_ACT_TANH:
        act_forward_kernel<CASTOR_ACT_TANH><<<blocks_for(n), kBlock, 0, s>>>(y, n);
        break;
    case CASTOR_ACT_SIGMOID:
        act_forward_kernel<CASTOR_ACT_SIGMOID><<<blocks_for(n), kBlock, 0, s>>>(y, n);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t castor__cuda_act_backward(cudaStream_t s, castor_activation act, const float *y,
                                      float *dy, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    switch (act) {
    case CASTOR_ACT_LINEAR:
        return cudaSuccess;
    case CASTOR_ACT_RELU:
        act_backward_kernel<CASTOR_ACT_RELU><<<blocks_for(n), kBlock, 0, s>>>(y, dy, n);
        break;
    case CASTOR_ACT_TANH:
        act_backward_kernel<CASTOR_ACT_TANH><<<blocks_for(n), kBlock, 0, s>>>(y, dy, n);
        break;
    case CASTOR_ACT_SIGMOID:
        act_backward_kernel<CASTOR_ACT_SIGMOID><<<blocks_for(n), kBlock, 0, s>>>(y, dy, n);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t castor__cuda_softmax_xent(cudaStream_t s, const float *logits, const int32_t *labels,
                                      int rows, int cols, float grad_scale, float *dlogits,
                                      float *row_stats)
{
    if (rows <= 0)
        return cudaSuccess;
    if (cols <= 0)
        return cudaErrorInvalidValue;
    softmax_xent_kernel<<<(unsigned)rows, row_threads(cols), 0, s>>>(logits, labels, cols,
                                                                      grad_scale, dlogits,
                                                                      row_stats);
    return cudaGetLastError();
}

cudaError_t castor__cuda_mse(cudaStream_t s, const float *pred, const float *target, int rows,
                             int cols, float grad_scale, float *dpred, float *row_stats)
{
    if (rows <= 0)
        return cudaSuccess;
    if (cols <= 0)
        return cudaErrorInvalidValue;
    const float grad = grad_scale * 2.0f / (float)cols;
    mse_kernel<<<(unsigned)rows, row_threads(cols), 0, s>>>(pred, target, cols, grad, dpred,
                                                             row_stats);
    return cudaGetLastError();
}

cudaError_t castor__cuda_add(cudaStream_t s, float *dst, const float *src, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    add_kernel<<<blocks_for(n), kBlock, 0, s>>>(dst, src, n);
    return cudaGetLastError();
}

/*
 * Host launchers for the backend's kernels (kernels.cu, optimizer.cu).
 *
 * Each queues its kernel on the given stream and returns cudaGetLastError()
 * read right after the launch, so a bad launch is reported by the call that
 * made it; the caller wraps it in CUDA_CHECK for the message. Empty inputs
 * launch nothing (a zero-block grid is itself a launch error). The caller has
 * already bound the thread to the stream's device.
 *
 * Shapes as in device/device.h: row-major float32.
 */
#ifndef CASTOR_DEVICE_CUDA_KERNELS_H
#define CASTOR_DEVICE_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "castor.h"

/* c (rows x cols, row stride ld >= cols) = beta * c; beta 0 writes zeros
 * without reading c. Any rows * cols (counted in size_t). */
cudaError_t castor__cuda_scale(cudaStream_t s, float *c, int rows, int cols, int ld,
                               float beta);
/* y (rows x cols) += bias (cols) on every row */
cudaError_t castor__cuda_bias_add(cudaStream_t s, float *y, const float *bias, int rows,
                                  int cols);
/* db (cols) = column sums of dy (rows x cols), rows added in order */
cudaError_t castor__cuda_bias_grad(cudaStream_t s, const float *dy, float *db, int rows,
                                   int cols);
/* y (n) = act(y) */
cudaError_t castor__cuda_act_forward(cudaStream_t s, castor_activation act, float *y, size_t n);
/* dy (n) *= act'(x), from y (n) = act(x) */
cudaError_t castor__cuda_act_backward(cudaStream_t s, castor_activation act, const float *y,
                                      float *dy, size_t n);
/* logits (rows x cols), labels (rows); dlogits (rows x cols) or NULL; stats (2 x rows) */
cudaError_t castor__cuda_softmax_xent(cudaStream_t s, const float *logits,
                                      const int32_t *labels, int rows, int cols,
                                      float grad_scale, float *dlogits, float *row_stats);
/* pred, target (rows x cols); dpred (rows x cols) or NULL; stats (2 x rows) */
cudaError_t castor__cuda_mse(cudaStream_t s, const float *pred, const float *target, int rows,
                             int cols, float grad_scale, float *dpred, float *row_stats);
/* dst (n) += src (n) */
cudaError_t castor__cuda_add(cudaStream_t s, float *dst, const float *src, size_t n);

/* params, grads (n); state (slots x n). The optimizer kind is valid (the
 * caller checked it); step is 1-based. */
cudaError_t castor__cuda_optimizer_step(cudaStream_t s, const castor_optimizer *opt,
                                        float *params, const float *grads, float *state,
                                        size_t n, int64_t step);

#endif /* CASTOR_DEVICE_CUDA_KERNELS_H */

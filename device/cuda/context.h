/*
 * What the CUDA backend keeps per replica (cdev->ctx), shared by the
 * backend's .cu files: the iface (cuda_device.cu) and NCCL (nccl.cu), which
 * queues its all-reduce on the replica's compute stream.
 */
#ifndef CASTOR_DEVICE_CUDA_CONTEXT_H
#define CASTOR_DEVICE_CUDA_CONTEXT_H

#include "device/cuda/check.h"

typedef struct castor__cuda_ctx {
    int logical;                              /* replica index on this GPU */
    int tf32;                                 /* GEMMs may use TF32 tensor cores */
    cudaStream_t stream[CDEV_NUM_STREAMS];    /* indexed by enum cdev_stream */
    cublasHandle_t blas;                      /* bound to stream[CDEV_STREAM_COMPUTE] */
} castor__cuda_ctx;

static inline castor__cuda_ctx *castor__cuda_ctx_of(const cdev *dev)
{
    return (castor__cuda_ctx *)dev->ctx;
}

/* Whether dev belongs to this backend (its ctx is a castor__cuda_ctx). */
int castor__cuda_is_cuda(const cdev *dev);

#endif /* CASTOR_DEVICE_CUDA_CONTEXT_H */

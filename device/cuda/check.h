/*
 * Check macros for CUDA, cuBLAS and NCCL calls inside the CUDA backend.
 *
 * After NCCL's CUDACHECK (src/include/checks.h): each macro evaluates the
 * call once and, on failure, RETURNS a castor status from the enclosing
 * function, with dev->errmsg saying which call failed, where, on which
 * device and why:
 *
 *   cuda:0: cudaMalloc(&p, bytes) failed at device/cuda/cuda_device.cu:120:
 *   out of memory (cudaErrorMemoryAllocation)
 *
 * The *_GOTO forms store the status in rc and jump to a cleanup label
 * instead. Nothing here prints, aborts or exits: the replica thread that hit
 * the error hands the status back to the strategy, which reports it on the
 * caller's handle.
 *
 * Only for the backend's .cu files (C++). The library's C headers have no
 * extern "C" guards of their own, so they are included here inside one.
 */
#ifndef CASTOR_DEVICE_CUDA_CHECK_H
#define CASTOR_DEVICE_CUDA_CHECK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

extern "C" {
#include "device/device.h"
}

/* The longest call text quoted in a message: a kernel launcher's argument
 * list can be long, and the reason matters more than the arguments. */
#define CASTOR_CUDA_CALL_CHARS 120

/* Errors that leave the context unusable: every later call on this device
 * fails too, so the message says so instead of leaving the user to retry. */
static inline const char *castor__cuda_sticky_hint(void)
{
    /* cudaGetLastError clears ordinary errors; a sticky one survives it. */
    (void)cudaGetLastError();
    return cudaPeekAtLastError() != cudaSuccess
               ? "; the GPU context is lost: this process cannot use the device again"
               : "";
}

static inline int castor__cuda_fail(cdev *dev, cudaError_t e, const char *call,
                                    const char *file, int line)
{
    /* Running out of memory is the user's to fix (smaller batch or model);
     * anything else is a device fault. */
    int code = e == cudaErrorMemoryAllocation ? CASTOR_DEVICE_MEMORY : CASTOR_DEVICE;
    /* The sticky check also clears a non-sticky error, so the next kernel
     * launch's cudaGetLastError() does not report this one again. */
    const char *hint = castor__cuda_sticky_hint();
    return castor__cdev_fail(dev, code, "%s: %.*s failed at %s:%d: %s (%s)%s", dev->name,
                             CASTOR_CUDA_CALL_CHARS, call, file, line, cudaGetErrorString(e),
                             cudaGetErrorName(e), hint);
}

static inline int castor__cublas_fail(cdev *dev, cublasStatus_t s, const char *call,
                                      const char *file, int line)
{
    int code = s == CUBLAS_STATUS_ALLOC_FAILED ? CASTOR_DEVICE_MEMORY : CASTOR_DEVICE;
    /* cuBLAS may have left a CUDA error behind (a failed launch inside it). */
    const char *hint = castor__cuda_sticky_hint();
    return castor__cdev_fail(dev, code, "%s: %.*s failed at %s:%d: %s (%s)%s", dev->name,
                             CASTOR_CUDA_CALL_CHARS, call, file, line, cublasGetStatusString(s),
                             cublasGetStatusName(s), hint);
}

/* comm may be NULL (before a communicator exists); with one, NCCL's own last
 * message usually names the real cause (a peer, a transport, a version). */
static inline int castor__nccl_fail(cdev *dev, ncclComm_t comm, ncclResult_t r,
                                    const char *call, const char *file, int line)
{
    const char *detail = ncclGetLastError(comm);
    const char *hint = castor__cuda_sticky_hint();
    return castor__cdev_fail(dev, CASTOR_DEVICE,
                             "%s: %.*s failed at %s:%d: %s%s%s%s (run with "
                             "NCCL_DEBUG=WARN for details)",
                             dev->name, CASTOR_CUDA_CALL_CHARS, call, file, line,
                             ncclGetErrorString(r), detail && *detail ? ": " : "",
                             detail ? detail : "", hint);
}

#define CUDA_CHECK(dev, call)                                                           \
    do {                                                                                \
        cudaError_t castor_e_ = (call);                                                 \
        if (castor_e_ != cudaSuccess)                                                   \
            return castor__cuda_fail((dev), castor_e_, #call, __FILE__, __LINE__);      \
    } while (0)

#define CUDA_CHECK_GOTO(dev, call, rc, label)                                           \
    do {                                                                                \
        cudaError_t castor_e_ = (call);                                                 \
        if (castor_e_ != cudaSuccess) {                                                 \
            (rc) = castor__cuda_fail((dev), castor_e_, #call, __FILE__, __LINE__);      \
            goto label;                                                                 \
        }                                                                               \
    } while (0)

#define CUBLAS_CHECK(dev, call)                                                         \
    do {                                                                                \
        cublasStatus_t castor_s_ = (call);                                              \
        if (castor_s_ != CUBLAS_STATUS_SUCCESS)                                         \
            return castor__cublas_fail((dev), castor_s_, #call, __FILE__, __LINE__);    \
    } while (0)

#define CUBLAS_CHECK_GOTO(dev, call, rc, label)                                         \
    do {                                                                                \
        cublasStatus_t castor_s_ = (call);                                              \
        if (castor_s_ != CUBLAS_STATUS_SUCCESS) {                                       \
            (rc) = castor__cublas_fail((dev), castor_s_, #call, __FILE__, __LINE__);    \
            goto label;                                                                 \
        }                                                                               \
    } while (0)

#define NCCL_CHECK(dev, comm, call)                                                     \
    do {                                                                                \
        ncclResult_t castor_r_ = (call);                                                \
        if (castor_r_ != ncclSuccess)                                                   \
            return castor__nccl_fail((dev), (comm), castor_r_, #call, __FILE__, __LINE__); \
    } while (0)

/* Every entry point binds its thread to the replica's GPU first: replicas
 * normally run on their own threads, but a caller may also drive several
 * devices from one thread (setup, teardown, tests). */
#define CUDA_ENTER(dev) CUDA_CHECK((dev), cudaSetDevice((dev)->ordinal))

#endif /* CASTOR_DEVICE_CUDA_CHECK_H */

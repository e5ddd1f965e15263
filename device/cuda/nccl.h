/*
 * NCCL all-reduce for the mirrored strategy, as a small C API.
 *
 * One communicator per replica, made together for a set of distinct GPUs in
 * this process (ncclCommInitAll). Each replica thread then calls
 * castor__nccl_allreduce_sum with its own communicator and device; the sum is
 * queued on that replica's compute stream, after its backward pass and
 * before its optimizer step, with no host round trip.
 *
 * Only in CUDA builds: callers guard their use with #ifdef CASTOR_HAVE_CUDA.
 * NCCL cannot put two ranks on one GPU, so logical replicas sharing a GPU
 * ("cuda:0x4") cannot use it; the caller reduces through the host instead.
 */
#ifndef CASTOR_DEVICE_CUDA_NCCL_H
#define CASTOR_DEVICE_CUDA_NCCL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "device/device.h"

/*
 * Communicators for n GPUs: comms_out[i] (an array of n) is the rank for
 * GPU ordinals[i]. Fails with CASTOR_INVALID if an ordinal repeats or does
 * not exist, CASTOR_DEVICE if NCCL fails; err then says why and comms_out is
 * all NULL.
 */
int castor__nccl_group_create(int n, const int *ordinals, void **comms_out, char *err,
                              size_t errlen);

/*
 * d_buf (n floats on dev) = its sum over all ranks, in place, queued on dev's
 * compute stream. Every rank must call it with the same n, each from its own
 * replica thread at the same time (the replica pool): ranks called one after
 * another from a single thread would wait for each other forever. It returns
 * once queued (the first call also connects the ranks). comm must be the rank
 * made for dev's GPU. Errors go to dev->errmsg.
 */
int castor__nccl_allreduce_sum(void *comm, cdev *dev, float *d_buf, size_t n);

/* Destroys the n communicators and sets them NULL; NULL entries are skipped.
 * Every replica's streams must be idle (synchronized) first. */
void castor__nccl_group_free(int n, void **comms);

#ifdef __cplusplus
}
#endif

#endif /* CASTOR_DEVICE_CUDA_NCCL_H */

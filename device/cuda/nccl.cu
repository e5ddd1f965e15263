/*
 * NCCL communicators and the in-place gradient sum for the mirrored
 * strategy (API and contract in nccl.h).
 */
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "device/cuda/context.h"
#include "device/cuda/nccl.h"

namespace {

__attribute__((format(printf, 4, 5))) int group_fail(char *err, size_t errlen, int code,
                                                     const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

}  // namespace

int castor__nccl_group_create(int n, const int *ordinals, void **comms_out, char *err,
                              size_t errlen)
{
    if (n <= 0 || !ordinals || !comms_out)
        return group_fail(err, errlen, CASTOR_MISUSE,
                          "NCCL group of %d GPUs without ordinals or output", n);
    for (int i = 0; i < n; i++)
        comms_out[i] = NULL;

    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        count = 0;
    }
    for (int i = 0; i < n; i++) {
        if (ordinals[i] < 0 || ordinals[i] >= count)
            return group_fail(err, errlen, CASTOR_INVALID,
                              "NCCL: no GPU cuda:%d (this machine has %d)", ordinals[i], count);
        for (int j = 0; j < i; j++)
            if (ordinals[j] == ordinals[i])
                /* NCCL rejects it too, but with "Duplicate GPU detected"
                 * and only after setting up; say what the user can change. */
                return group_fail(err, errlen, CASTOR_INVALID,
                                  "NCCL cannot place two replicas on one GPU (cuda:%d is "
                                  "given for ranks %d and %d): use one replica per GPU for "
                                  "the NCCL all-reduce",
                                  ordinals[i], j, i);
    }

    ncclComm_t *comms = (ncclComm_t *)calloc((size_t)n, sizeof *comms);
    if (!comms)
        return group_fail(err, errlen, CASTOR_NOMEM,
                          "out of host memory for %d NCCL communicators", n);
    /* ncclCommInitAll switches devices as it goes; the caller's binding is
     * put back so this thread keeps working on the GPU it had. */
    int current = 0;
    int had_current = cudaGetDevice(&current) == cudaSuccess;
    ncclResult_t r = ncclCommInitAll(comms, n, ordinals);
    if (had_current)
        (void)cudaSetDevice(current);
    (void)cudaGetLastError();
    if (r != ncclSuccess) {
        const char *detail = ncclGetLastError(NULL);
        if (err && errlen)
            snprintf(err, errlen, "ncclCommInitAll for %d GPUs failed at %s:%d: %s%s%s (run "
                     "with NCCL_DEBUG=WARN for details)",
                     n, __FILE__, __LINE__, ncclGetErrorString(r),
                     detail && *detail ? ": " : "", detail ? detail : "");
        free(comms);
        return CASTOR_DEVICE;
    }
    for (int i = 0; i < n; i++)
        comms_out[i] = comms[i];
    free(comms);
    return CASTOR_OK;
}

int castor__nccl_allreduce_sum(void *comm, cdev *dev, float *d_buf, size_t n)
{
    if (!castor__cuda_is_cuda(dev))
        return dev ? castor__cdev_fail(dev, CASTOR_MISUSE,
                                       "%s: NCCL all-reduce on a non-CUDA device", dev->name)
                   : CASTOR_MISUSE;
    if (!comm)
        return castor__cdev_fail(dev, CASTOR_MISUSE, "%s: NCCL all-reduce without a communicator",
                                 dev->name);
    if (n == 0)
        return CASTOR_OK;
    ncclComm_t c = (ncclComm_t)comm;
    /* A rank used from the wrong replica would wait forever for a peer that
     * never comes, or read another GPU's memory: refuse it up front. */
    int comm_dev = -1;
    NCCL_CHECK(dev, c, ncclCommCuDevice(c, &comm_dev));
    if (comm_dev != dev->ordinal)
        return castor__cdev_fail(dev, CASTOR_MISUSE,
                                 "%s: NCCL communicator belongs to cuda:%d, not this replica's GPU",
                                 dev->name, comm_dev);
    CUDA_ENTER(dev);
    NCCL_CHECK(dev, c, ncclAllReduce(d_buf, d_buf, n, ncclFloat, ncclSum, c,
                                     castor__cuda_ctx_of(dev)->stream[CDEV_STREAM_COMPUTE]));
    return CASTOR_OK;
}

void castor__nccl_group_free(int n, void **comms)
{
    if (!comms)
        return;
    /* One way for the whole clique: a communicator that hit an error may
     * never finish a clean destroy (it waits for its peers), so NCCL says to
     * abort it, and then every rank of it (NCCL reclaims a single process's
     * ranks together: some destroyed and some aborted could wait for each
     * other). Destroyed in a loop from one thread, as NCCL's own examples do
     * with ncclCommInitAll's communicators. */
    int any_error = 0;
    for (int i = 0; i < n; i++) {
        ncclResult_t state = ncclSuccess;
        if (comms[i] && (ncclCommGetAsyncError((ncclComm_t)comms[i], &state) != ncclSuccess ||
                         state != ncclSuccess))
            any_error = 1;
    }
    for (int i = 0; i < n; i++) {
        ncclComm_t c = (ncclComm_t)comms[i];
        comms[i] = NULL;
        if (c)
            (void)(any_error ? ncclCommAbort(c) : ncclCommDestroy(c));
    }
    (void)cudaGetLastError();  /* teardown errors have no one to go to */
}

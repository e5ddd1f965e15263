/*
 * The CUDA backend's device interface: one replica on one GPU.
 *
 * Each replica (cdev) owns three non-blocking streams (compute, copy-in,
 * copy-out) and a cuBLAS handle bound to its compute stream, so replicas
 * sharing a GPU ("cuda:0x4") run independently and never wait on each other
 * or on the legacy default stream. Memory is plain cudaMalloc; the budget is
 * enforced by castor__cdev_alloc() above this layer. Kernels live in kernels.cu and
 * optimizer.cu; this file turns the interface's calls into launches, copies
 * and cuBLAS calls, and every failure into a castor status with a message.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "device/cuda/context.h"
#include "device/cuda/kernels.h"

extern "C" {
#include "host/optim.h"
}

namespace {

/* The argument checks are device/device.c's, shared with the CPU backend,
 * so a bad call gets the same answer from either; here they also keep a
 * NULL buffer or a bad size from reaching a kernel (a fault that loses the
 * context) or cuBLAS. */

cudaStream_t stream_of(cdev *dev, int stream)
{
    return castor__cuda_ctx_of(dev)->stream[stream];
}

cudaStream_t compute_stream(cdev *dev)
{
    return stream_of(dev, CDEV_STREAM_COMPUTE);
}

/* Events are handed out as the cudaEvent_t itself: it already is an opaque
 * pointer, and wrapping it would cost an allocation per event for nothing. */
cdev_event *to_cdev_event(cudaEvent_t ev)
{
    return reinterpret_cast<cdev_event *>(ev);
}

cudaEvent_t to_cuda_event(cdev_event *ev)
{
    return reinterpret_cast<cudaEvent_t>(ev);
}

/* Releases what open_ctx made; safe on a half-made context. Errors are
 * dropped (nothing can be done about them at teardown) but cleared, so they
 * are not reported later by an unrelated call on this thread. */
void close_ctx(cdev *dev)
{
    castor__cuda_ctx *ctx = castor__cuda_ctx_of(dev);
    if (!ctx)
        return;
    (void)cudaSetDevice(dev->ordinal);
    for (int s = 0; s < CDEV_NUM_STREAMS; s++)
        if (ctx->stream[s])
            (void)cudaStreamSynchronize(ctx->stream[s]);
    if (ctx->blas)
        (void)cublasDestroy(ctx->blas);
    for (int s = 0; s < CDEV_NUM_STREAMS; s++)
        if (ctx->stream[s])
            (void)cudaStreamDestroy(ctx->stream[s]);
    (void)cudaGetLastError();
    free(ctx);
    dev->ctx = NULL;
}

/* ---- the interface ---- */

/* castor__cdev_destroy() hands the whole device over: the cdev itself was made by
 * castor__cdev_cuda_create and is freed here, as the CPU backend does. */
void cuda_destroy(cdev *dev)
{
    if (!dev)
        return;
    close_ctx(dev);
    free(dev);
}

int cuda_alloc(cdev *dev, size_t bytes, void **d_out)
{
    *d_out = NULL;
    CUDA_ENTER(dev);
    void *p = NULL;
    /* A zero-byte request still gets a real pointer that can be freed. */
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        /* Not CUDA_CHECK: the message names the size and what is free,
         * which is what the user needs to pick a smaller batch or model. */
        const char *hint = castor__cuda_sticky_hint();
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
            (void)cudaGetLastError();
        return castor__cdev_fail(
            dev, e == cudaErrorMemoryAllocation ? CASTOR_DEVICE_MEMORY : CASTOR_DEVICE,
            "%s: cudaMalloc of %zu bytes failed at %s:%d: %s (%s); the GPU has %zu "
            "of %zu bytes free and this replica holds %zu%s",
            dev->name, bytes, __FILE__, __LINE__, cudaGetErrorString(e), cudaGetErrorName(e),
            free_b, total_b, dev->used, hint);
    }
    *d_out = p;
    return CASTOR_OK;
}

void cuda_release(cdev *dev, void *d_ptr)
{
    if (!d_ptr)
        return;
    /* The strategies free buffers only after synchronizing the replica's
     * streams; cudaFree would wait for the device's work in any case. */
    if (cudaSetDevice(dev->ordinal) != cudaSuccess || cudaFree(d_ptr) != cudaSuccess)
        (void)cudaGetLastError();  /* nothing to report to; keep later checks clean */
}

int cuda_memset0(cdev *dev, int stream, void *d_dst, size_t bytes)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "memset0", stream);
    if (!d_dst && bytes)
        return castor__cdev_bad_args(dev, "memset0");
    if (bytes == 0)
        return CASTOR_OK;
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, cudaMemsetAsync(d_dst, 0, bytes, stream_of(dev, stream)));
    return CASTOR_OK;
}

int cuda_copy_h2d(cdev *dev, int stream, void *d_dst, const void *h_src, size_t bytes)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "copy_h2d", stream);
    if ((!d_dst || !h_src) && bytes)
        return castor__cdev_bad_args(dev, "copy_h2d");
    if (bytes == 0)
        return CASTOR_OK;
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, cudaMemcpyAsync(d_dst, h_src, bytes, cudaMemcpyHostToDevice,
                                    stream_of(dev, stream)));
    return CASTOR_OK;
}

int cuda_copy_d2h(cdev *dev, int stream, void *h_dst, const void *d_src, size_t bytes)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "copy_d2h", stream);
    if ((!h_dst || !d_src) && bytes)
        return castor__cdev_bad_args(dev, "copy_d2h");
    if (bytes == 0)
        return CASTOR_OK;
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, cudaMemcpyAsync(h_dst, d_src, bytes, cudaMemcpyDeviceToHost,
                                    stream_of(dev, stream)));
    return CASTOR_OK;
}

int cuda_copy_d2d(cdev *dev, int stream, void *d_dst, const void *d_src, size_t bytes)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "copy_d2d", stream);
    if ((!d_dst || !d_src) && bytes)
        return castor__cdev_bad_args(dev, "copy_d2d");
    if (bytes == 0)
        return CASTOR_OK;
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice,
                                    stream_of(dev, stream)));
    return CASTOR_OK;
}

int cuda_event_create(cdev *dev, cdev_event **out)
{
    if (!out)
        return castor__cdev_bad_args(dev, "event_create");
    *out = NULL;
    CUDA_ENTER(dev);
    cudaEvent_t ev = NULL;
    /* Only ordering is needed; timing would add work to every record. */
    CUDA_CHECK(dev, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = to_cdev_event(ev);
    return CASTOR_OK;
}

void cuda_event_destroy(cdev *dev, cdev_event *ev)
{
    if (!ev)
        return;
    if (cudaSetDevice(dev->ordinal) != cudaSuccess ||
        cudaEventDestroy(to_cuda_event(ev)) != cudaSuccess)
        (void)cudaGetLastError();
}

int cuda_event_record(cdev *dev, cdev_event *ev, int stream)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "event_record", stream);
    if (!ev)
        return castor__cdev_bad_args(dev, "event_record");
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, cudaEventRecord(to_cuda_event(ev), stream_of(dev, stream)));
    return CASTOR_OK;
}

int cuda_stream_wait(cdev *dev, int stream, cdev_event *ev)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "stream_wait", stream);
    /* Waiting on an event never recorded is legal (a no-op); NULL is not. */
    if (!ev)
        return castor__cdev_bad_args(dev, "stream_wait");
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, cudaStreamWaitEvent(stream_of(dev, stream), to_cuda_event(ev), 0));
    return CASTOR_OK;
}

/* This replica's streams only, not cudaDeviceSynchronize: logical replicas
 * on the same GPU must not wait for each other's work. */
int cuda_synchronize(cdev *dev)
{
    CUDA_ENTER(dev);
    for (int s = 0; s < CDEV_NUM_STREAMS; s++)
        CUDA_CHECK(dev, cudaStreamSynchronize(stream_of(dev, s)));
    return CASTOR_OK;
}

/*
 * Row-major C = alpha op(A) op(B) + beta C on column-major cuBLAS: a
 * row-major matrix read column-major is its transpose, so cuBLAS computes
 * C^T = op(B)^T op(A)^T, i.e. the operands swap places and m and n swap,
 * while each operand keeps its own transpose flag and leading dimension.
 */
int cuda_gemm(cdev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
              const float *d_a, int lda, const float *d_b, int ldb, float beta, float *d_c,
              int ldc)
{
    int rc = castor__cdev_check_gemm(dev, trans_a, trans_b, m, n, k, d_a, lda, d_b, ldb, d_c, ldc);
    if (rc)
        return rc;
    if (m == 0 || n == 0)
        return CASTOR_OK;
    CUDA_ENTER(dev);
    if (k == 0) {
        /* An empty product: C = beta C, as BLAS defines it and the CPU
         * backend (OpenBLAS) does it: beta 1 leaves C alone, beta 0 writes
         * zeros without reading C (a stale NaN does not survive), any other
         * beta multiplies. Done here since cuBLAS does not document k == 0;
         * one kernel counting in size_t, so m * n may pass INT_MAX. */
        if (beta != 1.0f)
            CUDA_CHECK(dev, castor__cuda_scale(compute_stream(dev), d_c, m, n, ldc, beta));
        return CASTOR_OK;
    }
    castor__cuda_ctx *ctx = castor__cuda_ctx_of(dev);
    CUBLAS_CHECK(dev, cublasSgemm(ctx->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, d_b, ldb,
                                  d_a, lda, &beta, d_c, ldc));
    return CASTOR_OK;
}

int cuda_bias_add(cdev *dev, float *d_y, const float *d_bias, int rows, int cols)
{
    if (!d_y || !d_bias || rows < 0 || cols < 0)
        return castor__cdev_bad_args(dev, "bias_add");
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, castor__cuda_bias_add(compute_stream(dev), d_y, d_bias, rows, cols));
    return CASTOR_OK;
}

int cuda_bias_grad(cdev *dev, const float *d_dy, float *d_db, int rows, int cols)
{
    if (!d_dy || !d_db || rows < 0 || cols < 0)
        return castor__cdev_bad_args(dev, "bias_grad");
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, castor__cuda_bias_grad(compute_stream(dev), d_dy, d_db, rows, cols));
    return CASTOR_OK;
}

bool act_ok(castor_activation act)
{
    return act == CASTOR_ACT_LINEAR || act == CASTOR_ACT_RELU || act == CASTOR_ACT_TANH ||
           act == CASTOR_ACT_SIGMOID;
}

int cuda_act_forward(cdev *dev, castor_activation act, float *d_y, size_t n)
{
    if (!d_y && n)
        return castor__cdev_bad_args(dev, "act_forward");
    if (!act_ok(act))
        return castor__cdev_fail(dev, CASTOR_INVALID, "%s: unknown activation %d", dev->name,
                                 (int)act);
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, castor__cuda_act_forward(compute_stream(dev), act, d_y, n));
    return CASTOR_OK;
}

int cuda_act_backward(cdev *dev, castor_activation act, const float *d_y, float *d_dy, size_t n)
{
    if ((!d_y || !d_dy) && n)
        return castor__cdev_bad_args(dev, "act_backward");
    if (!act_ok(act))
        return castor__cdev_fail(dev, CASTOR_INVALID, "%s: unknown activation %d", dev->name,
                                 (int)act);
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, castor__cuda_act_backward(compute_stream(dev), act, d_y, d_dy, n));
    return CASTOR_OK;
}

int cuda_softmax_xent(cdev *dev, const float *d_logits, const int32_t *d_labels, int rows,
                      int cols, float grad_scale, float *d_dlogits, float *d_row_stats)
{
    /* Labels are not checked here (the CPU backend refuses a bad one): that
     * would mean reading them back; the kernel gives such a row a NaN loss. */
    if (!d_logits || !d_labels || !d_row_stats || rows < 0 || cols <= 0)
        return castor__cdev_bad_args(dev, "softmax_xent");
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, castor__cuda_softmax_xent(compute_stream(dev), d_logits, d_labels, rows,
                                              cols, grad_scale, d_dlogits, d_row_stats));
    return CASTOR_OK;
}

int cuda_mse(cdev *dev, const float *d_pred, const float *d_target, int rows, int cols,
             float grad_scale, float *d_dpred, float *d_row_stats)
{
    if (!d_pred || !d_target || !d_row_stats || rows < 0 || cols <= 0)
        return castor__cdev_bad_args(dev, "mse");
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, castor__cuda_mse(compute_stream(dev), d_pred, d_target, rows, cols,
                                     grad_scale, d_dpred, d_row_stats));
    return CASTOR_OK;
}

int cuda_add(cdev *dev, float *d_dst, const float *d_src, size_t n)
{
    if ((!d_dst || !d_src) && n)
        return castor__cdev_bad_args(dev, "add");
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, castor__cuda_add(compute_stream(dev), d_dst, d_src, n));
    return CASTOR_OK;
}

int cuda_optimizer_step(cdev *dev, const castor_optimizer *opt, float *d_params,
                        const float *d_grads, float *d_state, size_t n, int64_t step)
{
    if (!opt || ((!d_params || !d_grads) && n))
        return castor__cdev_bad_args(dev, "optimizer_step");
    if (opt->kind != CASTOR_OPT_SGD && opt->kind != CASTOR_OPT_ADAM &&
        opt->kind != CASTOR_OPT_ADAMW)
        return castor__cdev_fail(dev, CASTOR_INVALID, "%s: unknown optimizer kind %d", dev->name,
                                 (int)opt->kind);
    if (castor__optim_slots(opt) > 0 && !d_state && n)
        return castor__cdev_fail(dev, CASTOR_MISUSE, "%s: %s needs optimizer state on the device",
                                 dev->name, castor_optimizer_kind_name(opt->kind));
    /* As on the CPU: Adam's bias correction divides by 1 - beta1^step. */
    if (step < 1)
        return castor__cdev_fail(dev, CASTOR_MISUSE, "%s: optimizer step %lld (steps count from 1)",
                                 dev->name, (long long)step);
    CUDA_ENTER(dev);
    CUDA_CHECK(dev, castor__cuda_optimizer_step(compute_stream(dev), opt, d_params, d_grads,
                                                d_state, n, step));
    return CASTOR_OK;
}

/* Positional (C++17 has no designated initialisers): in cdev_iface's order. */
const cdev_iface cuda_iface = {
    "cuda",
    cuda_destroy,
    cuda_alloc,
    cuda_release,
    cuda_memset0,
    cuda_copy_h2d,
    cuda_copy_d2h,
    cuda_copy_d2d,
    cuda_event_create,
    cuda_event_destroy,
    cuda_event_record,
    cuda_stream_wait,
    cuda_synchronize,
    cuda_gemm,
    cuda_bias_add,
    cuda_bias_grad,
    cuda_act_forward,
    cuda_act_backward,
    cuda_softmax_xent,
    cuda_mse,
    cuda_add,
    cuda_optimizer_step,
};

/* Why cudaGetDeviceCount found nothing, as a static text for the user. */
const char *count_reason(cudaError_t e)
{
    switch (e) {
    case cudaErrorNoDevice:
        return "no CUDA GPU present (or CUDA_VISIBLE_DEVICES hides them all)";
    case cudaErrorInsufficientDriver:
        return "no CUDA driver is installed, or it is older than this build's CUDA runtime";
    case cudaErrorSystemDriverMismatch:
        return "the CUDA driver library does not match the loaded kernel module";
    case cudaErrorDevicesUnavailable:
        return "every CUDA GPU is busy or in a prohibited compute mode";
    case cudaErrorSystemNotReady:
        return "the GPU system is not ready (is nvidia-fabricmanager running?)";
    case cudaErrorInitializationError:
        return "the CUDA driver failed to initialise";
    default:
        return cudaGetErrorString(e);  /* static in the runtime */
    }
}

/* The steps of castor__cdev_cuda_create that can fail, each reported on dev. */
int open_ctx(cdev *dev, castor__cuda_ctx *ctx, size_t budget, int tf32)
{
    CUDA_ENTER(dev);
    for (int s = 0; s < CDEV_NUM_STREAMS; s++)
        CUDA_CHECK(dev, cudaStreamCreateWithFlags(&ctx->stream[s], cudaStreamNonBlocking));
    CUBLAS_CHECK(dev, cublasCreate(&ctx->blas));
    CUBLAS_CHECK(dev, cublasSetStream(ctx->blas, ctx->stream[CDEV_STREAM_COMPUTE]));
    /* Plain fp32 unless asked: TF32 rounds the GEMM inputs to 10 mantissa
     * bits, ~1e-3 relative, which changes training curves. */
    CUBLAS_CHECK(dev, cublasSetMathMode(ctx->blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                         : CUBLAS_DEFAULT_MATH));
    /* The GPU's free memory, less room for what takes device memory later
     * without passing the budget: cuBLAS's workspace, kernels loaded at
     * their first launch, NCCL's buffers. A budget given is the limit only
     * where it is smaller (castor.h). */
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(dev, cudaMemGetInfo(&free_b, &total_b));
    size_t headroom = total_b / 20 > ((size_t)256 << 20) ? total_b / 20 : (size_t)256 << 20;
    size_t usable = free_b > headroom ? free_b - headroom : 0;
    dev->budget = budget == 0 || budget > usable ? usable : budget;
    return CASTOR_OK;
}

void put_err(char *err, size_t errlen, const char *msg)
{
    if (err && errlen)
        snprintf(err, errlen, "%s", msg);
}

}  // namespace

int castor__cuda_is_cuda(const cdev *dev)
{
    return dev && dev->iface == &cuda_iface;
}

int castor__cdev_cuda_compiled(void)
{
    return 1;
}

int castor__cdev_cuda_count(const char **why)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* Not sticky, but left set it would be reported by the next CUDA
         * call on this thread (pinned-memory allocation, for one). */
        (void)cudaGetLastError();
        if (why)
            *why = count_reason(e);
        return 0;
    }
    if (n <= 0) {
        if (why)
            *why = count_reason(cudaErrorNoDevice);
        return 0;
    }
    if (why)
        *why = "";
    return n;
}

int castor__cdev_cuda_info(int ordinal, castor_device_info *info)
{
    if (!info)
        return CASTOR_MISUSE;
    memset(info, 0, sizeof *info);
    int count = castor__cdev_cuda_count(NULL);
    if (count == 0)
        return CASTOR_UNSUPPORTED;
    if (ordinal < 0 || ordinal >= count)
        return CASTOR_INVALID;
    /* Properties and bus id come from the driver without creating a context,
     * so listing GPUs costs no device memory. */
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        return CASTOR_DEVICE;
    }
    /* GPU names are far shorter than the 256 bytes the driver allows. */
    snprintf(info->name, sizeof info->name, "%.*s", (int)sizeof info->name - 1, prop.name);
    snprintf(info->kind, sizeof info->kind, "cuda");
    info->ordinal = ordinal;
    info->total_memory = prop.totalGlobalMem;
    info->compute_major = prop.major;
    info->compute_minor = prop.minor;
    if (cudaDeviceGetPCIBusId(info->pci_bus_id, (int)sizeof info->pci_bus_id, ordinal) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        info->pci_bus_id[0] = '\0';
        return CASTOR_DEVICE;
    }
    return CASTOR_OK;
}

int castor__cdev_cuda_create(int ordinal, int logical, size_t budget, int tf32, cdev **out,
                             char *err, size_t errlen)
{
    char msg[sizeof ((cdev *)0)->errmsg];
    if (!out) {
        put_err(err, errlen, "castor__cdev_cuda_create: out is NULL");
        return CASTOR_MISUSE;
    }
    *out = NULL;
    const char *why = NULL;
    int count = castor__cdev_cuda_count(&why);
    if (count == 0) {
        snprintf(msg, sizeof msg, "cuda:%d: no CUDA GPU can be used: %s", ordinal, why);
        put_err(err, errlen, msg);
        return CASTOR_UNSUPPORTED;
    }
    if (ordinal < 0 || ordinal >= count) {
        snprintf(msg, sizeof msg, "cuda:%d: no such GPU: this machine has %d (cuda:0..%d)",
                 ordinal, count, count - 1);
        put_err(err, errlen, msg);
        return CASTOR_INVALID;
    }
    if (logical < 0) {
        snprintf(msg, sizeof msg, "cuda:%d: logical replica %d is negative", ordinal, logical);
        put_err(err, errlen, msg);
        return CASTOR_INVALID;
    }

    cdev *dev = (cdev *)calloc(1, sizeof *dev);
    castor__cuda_ctx *ctx = (castor__cuda_ctx *)calloc(1, sizeof *ctx);
    if (!dev || !ctx) {
        free(dev);
        free(ctx);
        put_err(err, errlen, "out of host memory for a CUDA device");
        return CASTOR_NOMEM;
    }
    ctx->logical = logical;
    ctx->tf32 = tf32 != 0;
    dev->iface = &cuda_iface;
    dev->ctx = ctx;
    dev->ordinal = ordinal;
    if (logical > 0)
        snprintf(dev->name, sizeof dev->name, "cuda:%d#%d", ordinal, logical);
    else
        snprintf(dev->name, sizeof dev->name, "cuda:%d", ordinal);

    int rc = open_ctx(dev, ctx, budget, tf32);
    if (rc) {
        put_err(err, errlen, dev->errmsg);
        close_ctx(dev);
        free(dev);
        return rc;
    }
    *out = dev;
    return CASTOR_OK;
}

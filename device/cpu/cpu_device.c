/*
 * The emulated device: a replica's "device memory" is memory of its own on
 * the host, reached only through this interface, with a byte budget. Copies
 * really copy, so a strategy that skipped an upload or read device memory
 * directly would compute wrong numbers here, as it would on a GPU.
 *
 * Work runs synchronously on the calling (replica) thread when it is
 * queued, so every stream is always idle and events are complete as soon as
 * they are recorded. GEMM goes to OpenBLAS; the element-wise kernels are
 * plain loops with the arithmetic the CUDA kernels use (device/cuda/
 * kernels.cu copies these expressions term for term, so change both or
 * neither).
 *
 * OpenBLAS's thread count is process-wide and left alone here: several
 * replicas calling a multi-threaded OpenBLAS at once oversubscribe the
 * cores, which is why the CLI sets it (src/cli/common.c, cli_blas_threads).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "host/optim.h"

struct cdev_event {
    int recorded;
};


static void cpu_destroy(cdev *dev)
{
    free(dev);
}

static int cpu_alloc(cdev *dev, size_t bytes, void **d_out)
{
    /* Aligned as cudaMalloc memory is (at least 64 bytes), so SIMD loads behave
     * alike; aligned_alloc wants the size rounded to the alignment. */
    if (bytes > SIZE_MAX - 63)
        return castor__cdev_fail(dev, CASTOR_DEVICE_MEMORY, "%s: %zu bytes cannot be allocated",
                                 dev->name, bytes);
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        return castor__cdev_fail(dev, CASTOR_NOMEM,
                                 "%s: host memory for %zu bytes of emulated device memory is not "
                                 "available",
                                 dev->name, bytes);
    *d_out = p;
    return CASTOR_OK;
}

static void cpu_release(cdev *dev, void *d_ptr)
{
    (void)dev;
    free(d_ptr);
}

static int cpu_memset0(cdev *dev, int stream, void *d_dst, size_t bytes)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "memset0", stream);
    if (!d_dst && bytes)
        return castor__cdev_bad_args(dev, "memset0");
    if (bytes)
        memset(d_dst, 0, bytes);
    return CASTOR_OK;
}

static int copy(cdev *dev, const char *op, int stream, void *dst, const void *src, size_t bytes)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, op, stream);
    if ((!dst || !src) && bytes)
        return castor__cdev_bad_args(dev, op);
    if (bytes)
        memcpy(dst, src, bytes);  /* overlap is a caller bug, as on CUDA; ASan reports it */
    return CASTOR_OK;
}

static int cpu_copy_h2d(cdev *dev, int stream, void *d_dst, const void *h_src, size_t bytes)
{
    return copy(dev, "copy_h2d", stream, d_dst, h_src, bytes);
}

static int cpu_copy_d2h(cdev *dev, int stream, void *h_dst, const void *d_src, size_t bytes)
{
    return copy(dev, "copy_d2h", stream, h_dst, d_src, bytes);
}

static int cpu_copy_d2d(cdev *dev, int stream, void *d_dst, const void *d_src, size_t bytes)
{
    return copy(dev, "copy_d2d", stream, d_dst, d_src, bytes);
}

static int cpu_event_create(cdev *dev, cdev_event **out)
{
    if (!out)
        return castor__cdev_bad_args(dev, "event_create");
    *out = calloc(1, sizeof **out);
    return *out
               ? CASTOR_OK
               : castor__cdev_fail(dev, CASTOR_NOMEM, "%s: no host memory for an event", dev->name);
}

static void cpu_event_destroy(cdev *dev, cdev_event *ev)
{
    (void)dev;
    free(ev);
}

static int cpu_event_record(cdev *dev, cdev_event *ev, int stream)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "event_record", stream);
    if (!ev)
        return castor__cdev_bad_args(dev, "event_record");
    ev->recorded = 1;
    return CASTOR_OK;
}

static int cpu_stream_wait(cdev *dev, int stream, cdev_event *ev)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "stream_wait", stream);
    /* Waiting on an event never recorded is legal on CUDA (a no-op), so
     * only its existence is checked; the work it marks ran when queued. */
    if (!ev)
        return castor__cdev_bad_args(dev, "stream_wait");
    return CASTOR_OK;
}

static int cpu_synchronize(cdev *dev)
{
    (void)dev;
    return CASTOR_OK;
}

static int cpu_gemm(cdev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta, float *c,
                    int ldc)
{
    int rc = castor__cdev_check_gemm(dev, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
    if (rc)
        return rc;
    if (m == 0 || n == 0)
        return CASTOR_OK;
    /* k == 0 is left to BLAS, which defines it as C = beta * C. */
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
    return CASTOR_OK;
}

static int cpu_bias_add(cdev *dev, float *y, const float *bias, int rows, int cols)
{
    if (!y || !bias || rows < 0 || cols < 0)
        return castor__cdev_bad_args(dev, "bias_add");
    for (int r = 0; r < rows; r++) {
        float *row = y + (size_t)r * (size_t)cols;
        for (int c = 0; c < cols; c++)
            row[c] += bias[c];
    }
    return CASTOR_OK;
}

static int cpu_bias_grad(cdev *dev, const float *dy, float *db, int rows, int cols)
{
    if (!dy || !db || rows < 0 || cols < 0)
        return castor__cdev_bad_args(dev, "bias_grad");
    memset(db, 0, (size_t)cols * sizeof(float));
    for (int r = 0; r < rows; r++) {
        const float *row = dy + (size_t)r * (size_t)cols;
        for (int c = 0; c < cols; c++)
            db[c] += row[c];
    }
    return CASTOR_OK;
}

static int unknown_act(cdev *dev, castor_activation act)
{
    return castor__cdev_fail(dev, CASTOR_INVALID, "%s: unknown activation %d", dev->name, (int)act);
}

static int cpu_act_forward(cdev *dev, castor_activation act, float *y, size_t n)
{
    if (!y && n)
        return castor__cdev_bad_args(dev, "act_forward");
    switch (act) {
    case CASTOR_ACT_RELU:
        for (size_t i = 0; i < n; i++)
            y[i] = y[i] > 0.0f ? y[i] : 0.0f;
        break;
    case CASTOR_ACT_TANH:
        for (size_t i = 0; i < n; i++)
            y[i] = tanhf(y[i]);
        break;
    case CASTOR_ACT_SIGMOID:
        for (size_t i = 0; i < n; i++)
            y[i] = 1.0f / (1.0f + expf(-y[i]));
        break;
    case CASTOR_ACT_LINEAR:
        break;
    default:
        return unknown_act(dev, act);
    }
    return CASTOR_OK;
}

static int cpu_act_backward(cdev *dev, castor_activation act, const float *y, float *dy, size_t n)
{
    if ((!y || !dy) && n)
        return castor__cdev_bad_args(dev, "act_backward");
    switch (act) {
    case CASTOR_ACT_RELU:
        for (size_t i = 0; i < n; i++)
            dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        break;
    case CASTOR_ACT_TANH:
        for (size_t i = 0; i < n; i++)
            dy[i] *= 1.0f - y[i] * y[i];
        break;
    case CASTOR_ACT_SIGMOID:
        for (size_t i = 0; i < n; i++)
            dy[i] *= y[i] * (1.0f - y[i]);
        break;
    case CASTOR_ACT_LINEAR:
        break;
    default:
        return unknown_act(dev, act);
    }
    return CASTOR_OK;
}

static int cpu_softmax_xent(cdev *dev, const float *logits, const int32_t *labels, int rows,
                            int cols, float grad_scale, float *dlogits, float *row_stats)
{
    if (!logits || !labels || !row_stats || rows < 0 || cols <= 0)
        return castor__cdev_bad_args(dev, "softmax_xent");
    for (int r = 0; r < rows; r++) {
        const float *l = logits + (size_t)r * (size_t)cols;
        int label = labels[r];
        /* The host checks labels when a dataset is made; reading outside the
         * row for a bad one would be worse than refusing it. */
        if (label < 0 || label >= cols)
            return castor__cdev_fail(dev, CASTOR_INVALID,
                                     "%s: softmax_xent: row %d has label %d, "
                                     "outside 0..%d",
                                     dev->name, r, label, cols - 1);
        /* Subtracting the row maximum keeps every exp in (0, 1], so no logit
         * overflows it; '>' keeps the first maximum, the interface's argmax. */
        int best = 0;
        for (int c = 1; c < cols; c++)
            if (l[c] > l[best])
                best = c;
        float mx = l[best], sum = 0.0f;
        for (int c = 0; c < cols; c++)
            sum += expf(l[c] - mx);
        float log_sum = logf(sum);
        /* mx - l[label] first: two nearby large logits subtract exactly,
         * where (log_sum + mx) would round log_sum away at |logit| ~ 1e4. */
        row_stats[2 * (size_t)r] = log_sum + (mx - l[label]);
        row_stats[2 * (size_t)r + 1] = best == label ? 1.0f : 0.0f;
        if (dlogits) {
            float *d = dlogits + (size_t)r * (size_t)cols;
            for (int c = 0; c < cols; c++)
                d[c] = grad_scale * (expf(l[c] - mx - log_sum) - (c == label ? 1.0f : 0.0f));
        }
    }
    return CASTOR_OK;
}

static int cpu_mse(cdev *dev, const float *pred, const float *target, int rows, int cols,
                   float grad_scale, float *dpred, float *row_stats)
{
    if (!pred || !target || !row_stats || rows < 0 || cols <= 0)
        return castor__cdev_bad_args(dev, "mse");
    /* One factor for every element, as the CUDA launcher passes it. */
    float g = grad_scale * 2.0f / (float)cols;
    for (int r = 0; r < rows; r++) {
        const float *p = pred + (size_t)r * (size_t)cols;
        const float *t = target + (size_t)r * (size_t)cols;
        float s = 0.0f;
        for (int c = 0; c < cols; c++) {
            float diff = p[c] - t[c];
            s += diff * diff;
            if (dpred)
                dpred[(size_t)r * (size_t)cols + (size_t)c] = g * diff;
        }
        row_stats[2 * (size_t)r] = s / (float)cols;
        row_stats[2 * (size_t)r + 1] = 0.0f;
    }
    return CASTOR_OK;
}

static int cpu_add(cdev *dev, float *dst, const float *src, size_t n)
{
    if ((!dst || !src) && n)
        return castor__cdev_bad_args(dev, "add");
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
    return CASTOR_OK;
}

static int cpu_optimizer_step(cdev *dev, const castor_optimizer *opt, float *params,
                              const float *grads, float *state, size_t n, int64_t step)
{
    if (!opt || ((!params || !grads) && n))
        return castor__cdev_bad_args(dev, "optimizer_step");
    if (opt->kind != CASTOR_OPT_SGD && opt->kind != CASTOR_OPT_ADAM &&
        opt->kind != CASTOR_OPT_ADAMW)
        return castor__cdev_fail(dev, CASTOR_INVALID, "%s: unknown optimizer kind %d", dev->name,
                                 (int)opt->kind);
    if (castor__optim_slots(opt) > 0 && !state && n)
        return castor__cdev_fail(dev, CASTOR_MISUSE, "%s: %s needs optimizer state on the device",
                                 dev->name, castor_optimizer_kind_name(opt->kind));
    if (step < 1)
        return castor__cdev_fail(dev, CASTOR_MISUSE, "%s: optimizer step %lld (steps count from 1)",
                                 dev->name, (long long)step);
    /* The host optimizer's own code, so mirrored and central agree bit for bit. */
    castor__optim_apply_range(opt, params, grads, state, n, step, 0, n);
    return CASTOR_OK;
}

static const cdev_iface cpu_iface = {
    .backend = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .memset0 = cpu_memset0,
    .copy_h2d = cpu_copy_h2d,
    .copy_d2h = cpu_copy_d2h,
    .copy_d2d = cpu_copy_d2d,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .synchronize = cpu_synchronize,
    .gemm = cpu_gemm,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .softmax_xent = cpu_softmax_xent,
    .mse = cpu_mse,
    .add = cpu_add,
    .optimizer_step = cpu_optimizer_step,
};

int castor__cdev_cpu_create(int ordinal, size_t budget, cdev **out, char *err, size_t errlen)
{
    if (!out) {
        if (err && errlen)
            snprintf(err, errlen, "castor__cdev_cpu_create: out is NULL");
        return CASTOR_MISUSE;
    }
    *out = NULL;
    if (ordinal < 0) {
        if (err && errlen)
            snprintf(err, errlen, "cpu:%d: a device number is 0 or more", ordinal);
        return CASTOR_INVALID;
    }
    cdev *dev = calloc(1, sizeof *dev);
    if (!dev) {
        if (err && errlen)
            snprintf(err, errlen, "cpu:%d: no host memory for the device", ordinal);
        return CASTOR_NOMEM;
    }
    dev->iface = &cpu_iface;
    dev->ordinal = ordinal;
    dev->budget = budget;
    snprintf(dev->name, sizeof dev->name, "cpu:%d", ordinal);
    *out = dev;
    return CASTOR_OK;
}

int castor__cdev_cpu_blas_threads(void)
{
    return openblas_get_num_threads();
}

/*
 * The emulated device: a replica's "device memory" is memory of its own on
 * the host, reached only through this interface, with a byte budget. Copies
 * really copy, so a strategy that skipped an upload or read device memory
 * directly would compute wrong numbers here, as it would on a GPU.
 *
 * Work runs synchronously on the calling (replica) thread when it is
 * queued, so every stream is always idle and events are complete as soon as
 * they are recorded. GEMM goes to OpenBLAS; the element-wise kernels are
 * plain loops with the arithmetic the CUDA kernels use.
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

static int bad_args(cdev *dev, const char *op)
{
    return cdev_fail(dev, CASTOR_MISUSE, "%s: %s called with a NULL buffer or negative size",
                     dev->name, op);
}

static void cpu_destroy(cdev *dev)
{
    free(dev);
}

static int cpu_alloc(cdev *dev, size_t bytes, void **d_out)
{
    /* 64-byte aligned and rounded up, so vector loops never straddle. */
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        return cdev_fail(dev, CASTOR_NOMEM, "%s: host memory for %zu bytes of emulated device "
                         "memory is not available", dev->name, bytes);
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
    (void)stream;
    if (!d_dst && bytes)
        return bad_args(dev, "memset0");
    if (bytes)
        memset(d_dst, 0, bytes);
    return CASTOR_OK;
}

static int cpu_copy(cdev *dev, int stream, void *dst, const void *src, size_t bytes)
{
    (void)stream;
    if ((!dst || !src) && bytes)
        return bad_args(dev, "copy");
    if (bytes)
        memcpy(dst, src, bytes);
    return CASTOR_OK;
}

static int cpu_event_create(cdev *dev, cdev_event **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? CASTOR_OK : cdev_fail(dev, CASTOR_NOMEM, "%s: out of memory", dev->name);
}

static void cpu_event_destroy(cdev *dev, cdev_event *ev)
{
    (void)dev;
    free(ev);
}

static int cpu_event_record(cdev *dev, cdev_event *ev, int stream)
{
    (void)dev, (void)stream;
    ev->recorded = 1;
    return CASTOR_OK;
}

static int cpu_stream_wait(cdev *dev, int stream, cdev_event *ev)
{
    (void)dev, (void)stream, (void)ev;
    return CASTOR_OK;  /* work ran when it was queued */
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
    if (!a || !b || !c || m < 0 || n < 0 || k < 0)
        return bad_args(dev, "gemm");
    if (m == 0 || n == 0)
        return CASTOR_OK;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
    return CASTOR_OK;
}

static int cpu_bias_add(cdev *dev, float *y, const float *bias, int rows, int cols)
{
    if (!y || !bias || rows < 0 || cols < 0)
        return bad_args(dev, "bias_add");
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
        return bad_args(dev, "bias_grad");
    memset(db, 0, (size_t)cols * sizeof(float));
    for (int r = 0; r < rows; r++) {
        const float *row = dy + (size_t)r * (size_t)cols;
        for (int c = 0; c < cols; c++)
            db[c] += row[c];
    }
    return CASTOR_OK;
}

static int cpu_act_forward(cdev *dev, castor_activation act, float *y, size_t n)
{
    if (!y && n)
        return bad_args(dev, "act_forward");
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
        return cdev_fail(dev, CASTOR_INVALID, "%s: unknown activation %d", dev->name, (int)act);
    }
    return CASTOR_OK;
}

static int cpu_act_backward(cdev *dev, castor_activation act, const float *y, float *dy, size_t n)
{
    if ((!y || !dy) && n)
        return bad_args(dev, "act_backward");
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
        return cdev_fail(dev, CASTOR_INVALID, "%s: unknown activation %d", dev->name, (int)act);
    }
    return CASTOR_OK;
}

static int cpu_softmax_xent(cdev *dev, const float *logits, const int32_t *labels, int rows,
                            int cols, float grad_scale, float *dlogits, float *row_stats)
{
    if (!logits || !labels || !row_stats || rows < 0 || cols <= 0)
        return bad_args(dev, "softmax_xent");
    for (int r = 0; r < rows; r++) {
        const float *l = logits + (size_t)r * (size_t)cols;
        int label = labels[r];
        if (label < 0 || label >= cols)
            return cdev_fail(dev, CASTOR_INVALID, "%s: label %d outside 0..%d", dev->name, label,
                             cols - 1);
        /* Subtracting the row maximum keeps exp in range for any logits. */
        int best = 0;
        for (int c = 1; c < cols; c++)
            if (l[c] > l[best])
                best = c;
        float mx = l[best], sum = 0.0f;
        for (int c = 0; c < cols; c++)
            sum += expf(l[c] - mx);
        float log_sum = logf(sum);
        row_stats[2 * r] = log_sum + mx - l[label];
        row_stats[2 * r + 1] = best == label ? 1.0f : 0.0f;
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
        return bad_args(dev, "mse");
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
        row_stats[2 * r] = s / (float)cols;
        row_stats[2 * r + 1] = 0.0f;
    }
    return CASTOR_OK;
}

static int cpu_add(cdev *dev, float *dst, const float *src, size_t n)
{
    if ((!dst || !src) && n)
        return bad_args(dev, "add");
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
    return CASTOR_OK;
}

static int cpu_optimizer_step(cdev *dev, const castor_optimizer *opt, float *params,
                              const float *grads, float *state, size_t n, int64_t step)
{
    if (!opt || ((!params || !grads) && n))
        return bad_args(dev, "optimizer_step");
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
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
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

int cdev_cpu_create(int ordinal, size_t budget, cdev **out, char *err, size_t errlen)
{
    *out = NULL;
    cdev *dev = calloc(1, sizeof *dev);
    if (!dev) {
        snprintf(err, errlen, "out of memory creating cpu:%d", ordinal);
        return CASTOR_NOMEM;
    }
    dev->iface = &cpu_iface;
    dev->ordinal = ordinal;
    dev->budget = budget;
    snprintf(dev->name, sizeof dev->name, "cpu:%d", ordinal);
    *out = dev;
    return CASTOR_OK;
}

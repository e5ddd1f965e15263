/*
 * The emulated device: a replica's "device memory" is memory of its own on
 * the host, reached only through this interface, with a byte budget. Copies
 * really copy, so a strategy that skipped an upload or read device memory
 * directly would compute wrong numbers here, as it would on a GPU.
 *
 * Work is queued on its stream when it is called, after its arguments are
 * checked, and runs when the host synchronizes, under the stream rules of
 * cpu_streams.h: a missing stream_wait is an error here, not a race that
 * shows only on a GPU. GEMM goes to OpenBLAS; the element-wise kernels are
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

#include "device/cpu/cpu_streams.h"
#include "device/device.h"
#include "host/optim.h"

static castor__cpu_streams *streams(const cdev *dev)
{
    return dev->ctx;
}

/* Queue run(args) on stream with the memory it touches. */
static int queue(cdev *dev, int stream, castor__cpu_run_fn run, const char *name,
                 const void *args, size_t size, const castor__cpu_access *acc, int n_acc)
{
    castor__cpu_op op = {.run = run, .name = name};
    memcpy(op.args, args, size);
    return castor__cpu_streams_enqueue(dev, streams(dev), stream, &op, acc, n_acc);
}

#define QUEUE(dev, stream, run, name, args, acc)                                           \
    queue(dev, stream, run, name, &(args), sizeof(args), acc, (int)(sizeof(acc) / sizeof((acc)[0])))
#define ARGS(type, op) ((const type *)(const void *)(op)->args)
#define FITS(type) _Static_assert(sizeof(type) <= CASTOR__CPU_OP_ARGS, #type " fits an op")

static void cpu_destroy(cdev *dev)
{
    castor__cpu_streams_free(streams(dev));
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
    if (!rounded)
        rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p)
        return castor__cdev_fail(dev, CASTOR_NOMEM,
                                 "%s: host memory for %zu bytes of emulated device memory is not "
                                 "available",
                                 dev->name, bytes);
    /* cudaMalloc does not clear memory: a new buffer holds what the GPU
     * held there (zeros in a fresh context, often a freed buffer's bytes
     * later), whereas a large aligned_alloc is fresh zeroed pages. Filled
     * with 0xff bytes (NaN as float32, -1 as a label), a read of memory
     * that nothing has written gives NaNs here, not zeros that look right. */
    memset(p, 0xff, rounded);
    *d_out = p;
    return CASTOR_OK;
}

static void cpu_release(cdev *dev, void *d_ptr)
{
    /* Queued work may still use the memory: let it run first, as cudaFree
     * waits for the device. */
    castor__cpu_streams_flush(dev, streams(dev));
    free(d_ptr);
}

/* ---- copies ---- */

typedef struct copy_args {
    void *dst;
    const void *src;  /* NULL: fill dst with zero bytes */
    size_t bytes;
} copy_args;
FITS(copy_args);

static int run_copy(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const copy_args *c = ARGS(copy_args, op);
    if (c->src)
        memcpy(c->dst, c->src, c->bytes);  /* overlap is a caller bug, as on CUDA (ASan says) */
    else
        memset(c->dst, 0, c->bytes);
    return CASTOR_OK;
}

static int cpu_memset0(cdev *dev, int stream, void *d_dst, size_t bytes)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "memset0", stream);
    if (!d_dst && bytes)
        return castor__cdev_bad_args(dev, "memset0");
    if (!bytes)
        return CASTOR_OK;
    copy_args args = {d_dst, NULL, bytes};
    castor__cpu_access acc[] = {{d_dst, bytes, 1}};
    return QUEUE(dev, stream, run_copy, "memset0", args, acc);
}

static int copy(cdev *dev, const char *op, int stream, void *dst, const void *src, size_t bytes)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, op, stream);
    if ((!dst || !src) && bytes)
        return castor__cdev_bad_args(dev, op);
    if (!bytes)
        return CASTOR_OK;
    copy_args args = {dst, src, bytes};
    castor__cpu_access acc[] = {{src, bytes, 0}, {dst, bytes, 1}};
    return QUEUE(dev, stream, run_copy, op, args, acc);
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

/* ---- events and synchronization ---- */

static int cpu_event_create(cdev *dev, cdev_event **out)
{
    if (!out)
        return castor__cdev_bad_args(dev, "event_create");
    *out = calloc(1, sizeof **out);
    if (!*out)
        return castor__cdev_fail(dev, CASTOR_NOMEM, "%s: no host memory for an event", dev->name);
    (*out)->dev = dev;
    return CASTOR_OK;
}

static void cpu_event_destroy(cdev *dev, cdev_event *ev)
{
    (void)dev;
    free(ev);
}

/* Every replica's emulated streams are its own, those of replicas sharing
 * an emulated device too: an event orders only its own replica's work
 * (device.h); across replicas the host synchronizes. */
static int foreign_event(cdev *dev, const char *op, const cdev_event *ev)
{
    return castor__cdev_fail(dev, CASTOR_MISUSE,
                             "%s: %s with an event of %s: the emulated device orders work across "
                             "replicas only through the host (synchronize)",
                             dev->name, op, ev->dev->name);
}

static int cpu_event_record(cdev *dev, cdev_event *ev, int stream)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "event_record", stream);
    if (!ev)
        return castor__cdev_bad_args(dev, "event_record");
    if (ev->dev != dev)
        return foreign_event(dev, "event_record", ev);
    castor__cpu_streams_record(streams(dev), stream, ev);
    return CASTOR_OK;
}

static int cpu_stream_wait(cdev *dev, int stream, cdev_event *ev)
{
    if (!cdev_stream_ok(stream))
        return castor__cdev_bad_stream(dev, "stream_wait", stream);
    /* Waiting on an event never recorded is legal on CUDA (a no-op). */
    if (!ev)
        return castor__cdev_bad_args(dev, "stream_wait");
    if (ev->dev != dev)
        return foreign_event(dev, "stream_wait", ev);
    return castor__cpu_streams_wait(dev, streams(dev), stream, ev);
}

static int cpu_synchronize(cdev *dev)
{
    return castor__cpu_streams_sync(dev, streams(dev));
}

/* ---- compute ---- */

/* Bytes from the first to the last element of a row-major rows x cols
 * matrix with row stride ld. */
static size_t span(int rows, int cols, int ld, size_t elem)
{
    if (rows <= 0 || cols <= 0)
        return 0;
    return ((size_t)(rows - 1) * (size_t)ld + (size_t)cols) * elem;
}

typedef struct gemm_args {
    int trans_a, trans_b, m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
} gemm_args;
FITS(gemm_args);

static int run_gemm(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const gemm_args *g = ARGS(gemm_args, op);
    /* k == 0 is left to BLAS, which defines it as C = beta * C. */
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans,
                g->trans_b ? CblasTrans : CblasNoTrans, g->m, g->n, g->k, g->alpha, g->a, g->lda,
                g->b, g->ldb, g->beta, g->c, g->ldc);
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
    gemm_args args = {trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, a, b, c};
    size_t f = sizeof(float);
    castor__cpu_access acc[] = {
        {a, span(trans_a ? k : m, trans_a ? m : k, lda, f), 0},
        {b, span(trans_b ? n : k, trans_b ? k : n, ldb, f), 0},
        {c, span(m, n, ldc, f), 1},
    };
    return QUEUE(dev, CDEV_STREAM_COMPUTE, run_gemm, "gemm", args, acc);
}

typedef struct rows_args {
    float *out;        /* bias_add: y; bias_grad: db */
    const float *in;   /* bias_add: bias; bias_grad: dy */
    int rows, cols;
} rows_args;
FITS(rows_args);

static int run_bias_add(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const rows_args *a = ARGS(rows_args, op);
    for (int r = 0; r < a->rows; r++) {
        float *row = a->out + (size_t)r * (size_t)a->cols;
        for (int c = 0; c < a->cols; c++)
            row[c] += a->in[c];
    }
    return CASTOR_OK;
}

static int cpu_bias_add(cdev *dev, float *y, const float *bias, int rows, int cols)
{
    if (!y || !bias || rows < 0 || cols < 0)
        return castor__cdev_bad_args(dev, "bias_add");
    rows_args args = {y, bias, rows, cols};
    castor__cpu_access acc[] = {{bias, span(rows ? 1 : 0, cols, cols, sizeof(float)), 0},
                                {y, span(rows, cols, cols, sizeof(float)), 1}};
    return QUEUE(dev, CDEV_STREAM_COMPUTE, run_bias_add, "bias_add", args, acc);
}

static int run_bias_grad(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const rows_args *a = ARGS(rows_args, op);
    memset(a->out, 0, (size_t)a->cols * sizeof(float));
    for (int r = 0; r < a->rows; r++) {
        const float *row = a->in + (size_t)r * (size_t)a->cols;
        for (int c = 0; c < a->cols; c++)
            a->out[c] += row[c];
    }
    return CASTOR_OK;
}

static int cpu_bias_grad(cdev *dev, const float *dy, float *db, int rows, int cols)
{
    if (!dy || !db || rows < 0 || cols < 0)
        return castor__cdev_bad_args(dev, "bias_grad");
    rows_args args = {db, dy, rows, cols};
    castor__cpu_access acc[] = {{dy, span(rows, cols, cols, sizeof(float)), 0},
                                {db, span(1, cols, cols, sizeof(float)), 1}};
    return QUEUE(dev, CDEV_STREAM_COMPUTE, run_bias_grad, "bias_grad", args, acc);
}

typedef struct act_args {
    castor_activation act;
    const float *y;  /* act_backward: the forward output */
    float *out;      /* act_forward: y, in place; act_backward: dy */
    size_t n;
} act_args;
FITS(act_args);

static int known_act(cdev *dev, castor_activation act)
{
    if (act == CASTOR_ACT_LINEAR || act == CASTOR_ACT_RELU || act == CASTOR_ACT_TANH ||
        act == CASTOR_ACT_SIGMOID)
        return CASTOR_OK;
    return castor__cdev_fail(dev, CASTOR_INVALID, "%s: unknown activation %d", dev->name, (int)act);
}

static int run_act_forward(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const act_args *a = ARGS(act_args, op);
    float *y = a->out;
    size_t n = a->n;
    switch (a->act) {
    case CASTOR_ACT_RELU:
        /* '<=', not '>': a NaN goes on (as in PyTorch and TensorFlow), so
         * that a diverged variable shows in the loss; -0 still gives +0. */
        for (size_t i = 0; i < n; i++)
            y[i] = y[i] <= 0.0f ? 0.0f : y[i];
        break;
    case CASTOR_ACT_TANH:
        for (size_t i = 0; i < n; i++)
            y[i] = tanhf(y[i]);
        break;
    case CASTOR_ACT_SIGMOID:
        for (size_t i = 0; i < n; i++)
            y[i] = 1.0f / (1.0f + expf(-y[i]));
        break;
    default:  /* linear; others were refused when queued */
        break;
    }
    return CASTOR_OK;
}

static int cpu_act_forward(cdev *dev, castor_activation act, float *y, size_t n)
{
    if (!y && n)
        return castor__cdev_bad_args(dev, "act_forward");
    int rc = known_act(dev, act);
    if (rc || act == CASTOR_ACT_LINEAR || !n)
        return rc;
    act_args args = {act, NULL, y, n};
    castor__cpu_access acc[] = {{y, n * sizeof(float), 1}};
    return QUEUE(dev, CDEV_STREAM_COMPUTE, run_act_forward, "act_forward", args, acc);
}

static int run_act_backward(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const act_args *a = ARGS(act_args, op);
    const float *y = a->y;
    float *dy = a->out;
    size_t n = a->n;
    switch (a->act) {
    case CASTOR_ACT_RELU:  /* as forward: a NaN output passes the gradient on */
        for (size_t i = 0; i < n; i++)
            dy[i] = y[i] <= 0.0f ? 0.0f : dy[i];
        break;
    case CASTOR_ACT_TANH:
        for (size_t i = 0; i < n; i++)
            dy[i] *= 1.0f - y[i] * y[i];
        break;
    case CASTOR_ACT_SIGMOID:
        for (size_t i = 0; i < n; i++)
            dy[i] *= y[i] * (1.0f - y[i]);
        break;
    default:
        break;
    }
    return CASTOR_OK;
}

static int cpu_act_backward(cdev *dev, castor_activation act, const float *y, float *dy, size_t n)
{
    if ((!y || !dy) && n)
        return castor__cdev_bad_args(dev, "act_backward");
    int rc = known_act(dev, act);
    if (rc || act == CASTOR_ACT_LINEAR || !n)
        return rc;
    act_args args = {act, y, dy, n};
    castor__cpu_access acc[] = {{y, n * sizeof(float), 0}, {dy, n * sizeof(float), 1}};
    return QUEUE(dev, CDEV_STREAM_COMPUTE, run_act_backward, "act_backward", args, acc);
}

/* softmax_xent and mse: one row of outputs against its label or targets. */
typedef struct loss_args {
    const float *pred;
    const void *truth;  /* int32 labels, or float targets */
    int rows, cols;
    float grad_scale;
    float *dpred;       /* may be NULL */
    float *row_stats;
} loss_args;
FITS(loss_args);

static int run_softmax_xent(cdev *dev, const castor__cpu_op *op)
{
    const loss_args *a = ARGS(loss_args, op);
    const int32_t *labels = a->truth;
    int cols = a->cols;
    for (int r = 0; r < a->rows; r++) {
        const float *l = a->pred + (size_t)r * (size_t)cols;
        int label = labels[r];
        /* The host checks labels when a dataset is made; reading outside the
         * row for a bad one would be worse than refusing it. */
        if (label < 0 || label >= cols)
            return castor__cdev_fail(dev, CASTOR_INVALID,
                                     "%s: softmax_xent: row %d has label %d, outside 0..%d",
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
        float loss = log_sum + (mx - l[label]);
        a->row_stats[2 * (size_t)r] = loss;
        /* A NaN logit makes the loss NaN: no hit, or a model whose outputs
         * are all NaN scored the share of label 0 (argmax stays at 0). */
        a->row_stats[2 * (size_t)r + 1] = best == label && !isnan(loss) ? 1.0f : 0.0f;
        if (a->dpred) {
            float *d = a->dpred + (size_t)r * (size_t)cols;
            for (int c = 0; c < cols; c++)
                d[c] = a->grad_scale * (expf(l[c] - mx - log_sum) - (c == label ? 1.0f : 0.0f));
        }
    }
    return CASTOR_OK;
}

static int run_mse(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const loss_args *a = ARGS(loss_args, op);
    const float *target = a->truth;
    int cols = a->cols;
    /* One factor for every element, as the CUDA launcher passes it. */
    float g = a->grad_scale * 2.0f / (float)cols;
    for (int r = 0; r < a->rows; r++) {
        const float *p = a->pred + (size_t)r * (size_t)cols;
        const float *t = target + (size_t)r * (size_t)cols;
        float s = 0.0f;
        for (int c = 0; c < cols; c++) {
            float diff = p[c] - t[c];
            s += diff * diff;
            if (a->dpred)
                a->dpred[(size_t)r * (size_t)cols + (size_t)c] = g * diff;
        }
        a->row_stats[2 * (size_t)r] = s / (float)cols;
        a->row_stats[2 * (size_t)r + 1] = 0.0f;
    }
    return CASTOR_OK;
}

static int queue_loss(cdev *dev, castor__cpu_run_fn run, const char *name, loss_args args,
                      size_t truth_elem, size_t truth_cols)
{
    size_t f = sizeof(float);
    castor__cpu_access acc[] = {
        {args.pred, span(args.rows, args.cols, args.cols, f), 0},
        {args.truth, (size_t)args.rows * truth_cols * truth_elem, 0},
        {args.dpred, args.dpred ? span(args.rows, args.cols, args.cols, f) : 0, 1},
        {args.row_stats, 2 * (size_t)args.rows * f, 1},
    };
    return QUEUE(dev, CDEV_STREAM_COMPUTE, run, name, args, acc);
}

static int cpu_softmax_xent(cdev *dev, const float *logits, const int32_t *labels, int rows,
                            int cols, float grad_scale, float *dlogits, float *row_stats)
{
    if (!logits || !labels || !row_stats || rows < 0 || cols <= 0)
        return castor__cdev_bad_args(dev, "softmax_xent");
    loss_args args = {logits, labels, rows, cols, grad_scale, dlogits, row_stats};
    return queue_loss(dev, run_softmax_xent, "softmax_xent", args, sizeof(int32_t), 1);
}

static int cpu_mse(cdev *dev, const float *pred, const float *target, int rows, int cols,
                   float grad_scale, float *dpred, float *row_stats)
{
    if (!pred || !target || !row_stats || rows < 0 || cols <= 0)
        return castor__cdev_bad_args(dev, "mse");
    loss_args args = {pred, target, rows, cols, grad_scale, dpred, row_stats};
    return queue_loss(dev, run_mse, "mse", args, sizeof(float), (size_t)cols);
}

/* ---- used by the mirrored strategy ---- */

typedef struct add_args {
    float *dst;
    const float *src;
    size_t n;
} add_args;
FITS(add_args);

static int run_add(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const add_args *a = ARGS(add_args, op);
    for (size_t i = 0; i < a->n; i++)
        a->dst[i] += a->src[i];
    return CASTOR_OK;
}

static int cpu_add(cdev *dev, float *dst, const float *src, size_t n)
{
    if ((!dst || !src) && n)
        return castor__cdev_bad_args(dev, "add");
    if (!n)
        return CASTOR_OK;
    add_args args = {dst, src, n};
    castor__cpu_access acc[] = {{src, n * sizeof(float), 0}, {dst, n * sizeof(float), 1}};
    return QUEUE(dev, CDEV_STREAM_COMPUTE, run_add, "add", args, acc);
}

typedef struct optim_args {
    castor_optimizer opt;  /* by value: the caller's may change before it runs */
    float *params;
    const float *grads;
    float *state;
    size_t n;
    int64_t step;
} optim_args;
FITS(optim_args);

static int run_optimizer_step(cdev *dev, const castor__cpu_op *op)
{
    (void)dev;
    const optim_args *a = ARGS(optim_args, op);
    /* The host optimizer's own code, so mirrored and central agree bit for bit. */
    castor__optim_apply_range(&a->opt, a->params, a->grads, a->state, a->n, a->step, 0, a->n);
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
    int slots = castor__optim_slots(opt);
    if (slots > 0 && !state && n)
        return castor__cdev_fail(dev, CASTOR_MISUSE, "%s: %s needs optimizer state on the device",
                                 dev->name, castor_optimizer_kind_name(opt->kind));
    if (step < 1)
        return castor__cdev_fail(dev, CASTOR_MISUSE, "%s: optimizer step %lld (steps count from 1)",
                                 dev->name, (long long)step);
    if (!n)
        return CASTOR_OK;
    optim_args args = {*opt, params, grads, state, n, step};
    size_t bytes = n * sizeof(float);
    castor__cpu_access acc[] = {{grads, bytes, 0},
                                {params, bytes, 1},
                                {state, slots > 0 ? (size_t)slots * bytes : 0, 1}};
    return QUEUE(dev, CDEV_STREAM_COMPUTE, run_optimizer_step, "optimizer_step", args, acc);
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

int castor__cdev_cpu_create(int ordinal, int logical, size_t budget, cdev **out, char *err,
                            size_t errlen)
{
    if (!out) {
        if (err && errlen)
            snprintf(err, errlen, "castor__cdev_cpu_create: out is NULL");
        return CASTOR_MISUSE;
    }
    *out = NULL;
    if (ordinal < 0 || logical < 0) {
        if (err && errlen)
            snprintf(err, errlen, "cpu:%d#%d: device and replica numbers are 0 or more", ordinal,
                     logical);
        return CASTOR_INVALID;
    }
    cdev *dev = calloc(1, sizeof *dev);
    castor__cpu_streams *st = castor__cpu_streams_new();
    if (!dev || !st) {
        free(dev);
        castor__cpu_streams_free(st);
        if (err && errlen)
            snprintf(err, errlen, "cpu:%d: no host memory for the device", ordinal);
        return CASTOR_NOMEM;
    }
    dev->iface = &cpu_iface;
    dev->ctx = st;
    dev->ordinal = ordinal;
    dev->budget = budget;
    if (logical > 0)
        snprintf(dev->name, sizeof dev->name, "cpu:%d#%d", ordinal, logical);
    else
        snprintf(dev->name, sizeof dev->name, "cpu:%d", ordinal);
    *out = dev;
    return CASTOR_OK;
}

int castor__cdev_cpu_blas_threads(void)
{
    return openblas_get_num_threads();
}

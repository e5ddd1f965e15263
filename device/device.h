/*
 * The device interface: what a replica needs from the hardware it runs on.
 *
 * A backend fills a cdev_iface with function pointers (after ggml-backend);
 * a cdev is one replica's view of a device: several logical replicas may
 * share one physical GPU, each with its own cdev, streams and handles.
 *
 * Every call returns a castor_status. On failure the backend writes a one-line
 * message into dev->errmsg (call, file:line, device) with castor__cdev_fail().
 * Nothing here prints or exits.
 *
 * Pointers named d_* are device memory and may only be handed back to the
 * functions of a device on the same physical device (logical replicas that
 * share a GPU may use each other's buffers: the mirrored strategy sums their
 * gradients that way); the CPU backend keeps its memory apart from the
 * host's, so a strategy that touched device memory directly would be wrong
 * on a GPU and is caught by the tests.
 *
 * Streams: every operation names the stream it is queued on. Work on one
 * stream runs in order; streams are ordered against each other only by
 * events (event_record on one, stream_wait on another). Host memory passed to
 * copies must stay valid, and unchanged, until the stream is synchronized,
 * and a copy's destination holds the result only then. The CPU backend
 * holds callers to these rules (cpu/cpu_streams.h): its work runs when the
 * host synchronizes, and an access that no event orders against a
 * conflicting one on another stream is CASTOR_MISUSE. A failure of queued
 * work may surface only at synchronize. Its limits: each replica (cdev) has
 * streams of its own, so logical replicas sharing an emulated device
 * (cpu:NxK) are ordered against each other only through the host (each
 * synchronizes before another touches its buffers; an event of one cannot
 * be waited on by another, and such accesses are not checked, though work
 * run late still gives wrong numbers where a synchronize is missing), and
 * freeing memory runs the freeing replica's queued work, not its siblings'.
 * All matrices are row-major float32.
 */
#ifndef CASTOR_DEVICE_H
#define CASTOR_DEVICE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "castor.h"

typedef struct cdev cdev;
typedef struct cdev_event cdev_event;

enum cdev_stream {
    CDEV_STREAM_COMPUTE = 0,
    CDEV_STREAM_H2D = 1,
    CDEV_STREAM_D2H = 2,
    CDEV_NUM_STREAMS = 3
};

typedef struct cdev_iface {
    const char *backend;  /* "cpu", "cuda" */

    void (*destroy)(cdev *dev);  /* frees ctx and dev itself; buffers already released */

    /* Raw allocation; the budget is enforced by castor__cdev_alloc() around it. */
    int (*alloc)(cdev *dev, size_t bytes, void **d_out);
    void (*release)(cdev *dev, void *d_ptr);

    int (*memset0)(cdev *dev, int stream, void *d_dst, size_t bytes);
    int (*copy_h2d)(cdev *dev, int stream, void *d_dst, const void *h_src, size_t bytes);
    int (*copy_d2h)(cdev *dev, int stream, void *h_dst, const void *d_src, size_t bytes);
    int (*copy_d2d)(cdev *dev, int stream, void *d_dst, const void *d_src, size_t bytes);

    int (*event_create)(cdev *dev, cdev_event **out);
    void (*event_destroy)(cdev *dev, cdev_event *ev);
    int (*event_record)(cdev *dev, cdev_event *ev, int stream);
    int (*stream_wait)(cdev *dev, int stream, cdev_event *ev);
    int (*synchronize)(cdev *dev);  /* waits for all streams */

    /* ---- compute; all on CDEV_STREAM_COMPUTE ---- */

    /* C (m x n) = alpha * op(A) * op(B) + beta * C, row-major; op(A) is
     * m x k, op(B) is k x n; lda/ldb/ldc are row strides of A, B, C as stored. */
    int (*gemm)(cdev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                const float *d_a, int lda, const float *d_b, int ldb, float beta, float *d_c,
                int ldc);
    /* y[r][c] += bias[c] */
    int (*bias_add)(cdev *dev, float *d_y, const float *d_bias, int rows, int cols);
    /* db[c] = sum over r of dy[r][c] (overwrites db; rows summed in order) */
    int (*bias_grad)(cdev *dev, const float *d_dy, float *d_db, int rows, int cols);
    /* y = act(y), in place, n elements */
    int (*act_forward)(cdev *dev, castor_activation act, float *d_y, size_t n);
    /* dy *= act'(x) where y = act(x) is given (the forward output), in place */
    int (*act_backward)(cdev *dev, castor_activation act, const float *d_y, float *d_dy,
                        size_t n);
    /*
     * Softmax cross-entropy from logits on integer labels, fused:
     *   d_dlogits[r][c] = grad_scale * (softmax(logits[r])[c] - (c == label[r]))
     *   d_row_stats[2r]   = -log softmax(logits[r])[label[r]]
     *   d_row_stats[2r+1] = 1 if argmax(logits[r]) == label[r] and the
     *     row's loss is not NaN, else 0 (argmax: the first maximum; a row
     *     with a NaN logit is no correct prediction, whichever its argmax)
     * d_dlogits may be NULL (evaluation). Labels outside [0, cols) are the
     * caller's error, checked on the host when the dataset is made.
     */
    int (*softmax_xent)(cdev *dev, const float *d_logits, const int32_t *d_labels, int rows,
                        int cols, float grad_scale, float *d_dlogits, float *d_row_stats);
    /*
     * Mean squared error:
     *   d_dpred[r][c] = grad_scale * 2 * (pred - target) / cols
     *   d_row_stats[2r] = sum_c (pred - target)^2 / cols,  d_row_stats[2r+1] = 0
     * d_dpred may be NULL.
     */
    int (*mse)(cdev *dev, const float *d_pred, const float *d_target, int rows, int cols,
               float grad_scale, float *d_dpred, float *d_row_stats);

    /* ---- used by the mirrored strategy ---- */

    /* d_dst[i] += d_src[i] */
    int (*add)(cdev *dev, float *d_dst, const float *d_src, size_t n);
    /* One optimizer update of n variables on the device, same arithmetic as
     * host/optim.h (castor__optim_apply). step is 1-based. */
    int (*optimizer_step)(cdev *dev, const castor_optimizer *opt, float *d_params,
                          const float *d_grads, float *d_state, size_t n, int64_t step);
} cdev_iface;

struct cdev {
    const cdev_iface *iface;
    void *ctx;                /* the backend's own state */
    char name[32];            /* "cpu:1", "cuda:0", "cuda:0#2" (logical replica 2) */
    int ordinal;              /* physical device index */
    size_t budget;            /* bytes this replica may hold on the device */
    size_t used, peak;        /* bytes held now, most ever held */
    uint64_t bytes_h2d;       /* bytes queued host-to-device so far */
    uint64_t bytes_d2h;       /* bytes queued device-to-host so far */
    char errmsg[384];
};

/* Copies through these count the bytes that cross the bus, for the bench. */
static inline int cdev_copy_h2d(cdev *dev, int stream, void *d_dst, const void *h_src,
                                size_t bytes)
{
    dev->bytes_h2d += bytes;
    return dev->iface->copy_h2d(dev, stream, d_dst, h_src, bytes);
}

static inline int cdev_copy_d2h(cdev *dev, int stream, void *h_dst, const void *d_src,
                                size_t bytes)
{
    dev->bytes_d2h += bytes;
    return dev->iface->copy_d2h(dev, stream, h_dst, d_src, bytes);
}

/* Record a failure on the device: formats into dev->errmsg and returns code. */
int castor__cdev_fail(cdev *dev, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Argument checks every backend makes, so that a bad call gets the same
 * status and message from each (CASTOR_MISUSE, naming the device and op). */
int castor__cdev_bad_args(cdev *dev, const char *op);
int castor__cdev_bad_stream(cdev *dev, const char *op, int stream);
static inline int cdev_stream_ok(int stream)
{
    return stream >= 0 && stream < CDEV_NUM_STREAMS;
}
/* gemm's pointers, sizes and leading dimensions (row strides of A, B, C as
 * stored, each at least its row and at least 1); CASTOR_OK if they hold. */
int castor__cdev_check_gemm(cdev *dev, int trans_a, int trans_b, int m, int n, int k,
                            const float *a, int lda, const float *b, int ldb, const float *c,
                            int ldc);

/* Budget-checked allocation: fails with CASTOR_DEVICE_MEMORY naming the bytes
 * asked, held and the budget. castor__cdev_free takes the size it was allocated with. */
int castor__cdev_alloc(cdev *dev, size_t bytes, void **d_out);
void castor__cdev_free(cdev *dev, void *d_ptr, size_t bytes);
void castor__cdev_destroy(cdev *dev);

/* ---- backends ---- */

/* An emulated device on the host, doing GEMM with OpenBLAS: device
 * `ordinal`, or logical replica `logical` of those that share it (named
 * cpu:I#L when logical > 0, as on a GPU; their memory is one address space,
 * so each may use the others' buffers). */
int castor__cdev_cpu_create(int ordinal, int logical, size_t budget, cdev **out, char *err,
                            size_t errlen);
/* Threads OpenBLAS will use for one GEMM (process-wide, read only). */
int castor__cdev_cpu_blas_threads(void);

/* Whether the CUDA backend is compiled in. */
int castor__cdev_cuda_compiled(void);
/*
 * A replica on CUDA GPU `ordinal` (logical replica `logical` of those that
 * share it). budget 0 means the GPU's free memory. Fails with
 * CASTOR_UNSUPPORTED in a build without CUDA or with no GPU present.
 */
int castor__cdev_cuda_create(int ordinal, int logical, size_t budget, int tf32, cdev **out,
                             char *err, size_t errlen);
/* Devices present; 0 and a reason when none (no build, no driver, no GPU). */
int castor__cdev_cuda_count(const char **why);
int castor__cdev_cuda_info(int ordinal, castor_device_info *info);

#endif /* CASTOR_DEVICE_H */

/*
 * Every operation of the emulated device against a plain double-precision
 * reference on random inputs, and its memory rules.
 *
 * Errors are normalised as in ggml's test-backend-ops: |got - want| /
 * max(|want|, 1), so values near zero are held to an absolute bound rather
 * than an impossible relative one.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "host/optim.h"
#include "src/rng.h"
#include "support.h"

/* float32 on O(1) data: a few ulps (6e-8) per term of the longest sum. */
#define TOL 1e-5

static cdev *dev;
static castor__rng rng;

#define BUDGET ((size_t)64 << 20)

static void setup(void)
{
    char err[256];
    cr_assert_eq(cdev_cpu_create(0, BUDGET, &dev, err, sizeof err), CASTOR_OK, "%s", err);
    castor__rng_seed(&rng, 1234, 7, 0);
}

static void teardown(void)
{
    cdev_destroy(dev);
}

TestSuite(cpu_device, .init = setup, .fini = teardown);

/* Uniform in [-scale, scale). */
static float *randu(size_t n, float scale)
{
    float *v = malloc((n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * (2.0f * castor__rng_uniform(&rng) - 1.0f);
    return v;
}

static void *dalloc(size_t bytes)
{
    void *d = NULL;
    cr_assert_eq(cdev_alloc(dev, bytes, &d), CASTOR_OK, "%s", dev->errmsg);
    return d;
}

/* Host data onto the device, the way a replica does it. */
static float *up(const float *h, size_t n)
{
    float *d = dalloc(n * sizeof(float));
    cr_assert_eq(cdev_copy_h2d(dev, CDEV_STREAM_H2D, d, h, n * sizeof(float)), CASTOR_OK, "%s",
                 dev->errmsg);
    return d;
}

static float *down(const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_not_null(h);
    cr_assert_eq(cdev_copy_d2h(dev, CDEV_STREAM_D2H, h, d, n * sizeof(float)), CASTOR_OK, "%s",
                 dev->errmsg);
    return h;
}

static void release(void *d, size_t n_floats)
{
    cdev_free(dev, d, n_floats * sizeof(float));
}

static void expect_close(const float *got, const double *want, size_t n, double tol,
                         const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / fmax(fabs(want[i]), 1.0);
        cr_assert(err <= tol, "%s: element %zu: %.9g, reference %.9g (error %.3g > %.3g)", what,
                  i, (double)got[i], want[i], err, tol);
    }
}

/* ---- GEMM ---- */

/* C = alpha op(A) op(B) + beta C with padded rows; the padding must come
 * back untouched, as it would from cuBLAS. */
static void check_gemm(int m, int n, int k, int pad, float alpha, float beta)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
            int lda = acols + pad, ldb = bcols + pad + 1, ldc = n + pad + 2;
            size_t na = (size_t)arows * lda, nb = (size_t)brows * ldb, nc = (size_t)m * ldc;
            float *a = randu(na, 1), *b = randu(nb, 1), *c = randu(nc, 1);
            double *want = malloc(nc * sizeof *want);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < ldc; j++) {
                    size_t at = (size_t)i * ldc + j;
                    if (j >= n) {
                        want[at] = c[at];
                        continue;
                    }
                    double s = 0;
                    for (int p = 0; p < k; p++)
                        s += (double)(ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]) *
                             (double)(tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j]);
                    want[at] = (double)alpha * s + (double)beta * c[at];
                }
            float *da = up(a, na), *db = up(b, nb), *dc = up(c, nc);
            cr_assert_eq(dev->iface->gemm(dev, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta,
                                          dc, ldc),
                         CASTOR_OK, "%s", dev->errmsg);
            float *got = down(dc, nc);
            char what[64];
            snprintf(what, sizeof what, "gemm %c%c %dx%dx%d", ta ? 'T' : 'N', tb ? 'T' : 'N', m,
                     n, k);
            /* Sums of k products of magnitude <= 1: scale the bound with k. */
            expect_close(got, want, nc, TOL * fmax(1.0, sqrt((double)k) / 4), what);
            release(da, na), release(db, nb), release(dc, nc);
            free(a), free(b), free(c), free(want), free(got);
        }
}

Test(cpu_device, gemm_all_transposes_and_strides)
{
    check_gemm(13, 9, 17, 3, 0.5f, 0.25f);
    check_gemm(1, 1, 1, 0, 1.0f, 0.0f);
    check_gemm(67, 45, 131, 5, -1.5f, 1.0f);
}

Test(cpu_device, gemm_at_training_shapes)
{
    /* Forward X W and the two backward products of a 784 -> 128 layer on a
     * batch of 64, large enough for OpenBLAS's blocked, threaded paths. */
    const int b = 64, in = 784, out = 128;
    float *x = randu((size_t)b * in, 1), *w = randu((size_t)in * out, 0.1f);
    float *dx = up(x, (size_t)b * in), *dw = up(w, (size_t)in * out);
    float *dy = dalloc((size_t)b * out * sizeof(float));
    cr_assert_eq(dev->iface->gemm(dev, 0, 0, b, out, in, 1.0f, dx, in, dw, out, 0.0f, dy, out),
                 CASTOR_OK);
    float *y = down(dy, (size_t)b * out);
    double *want = malloc(sizeof(double) * (size_t)in * out);
    for (int i = 0; i < b; i++)
        for (int j = 0; j < out; j++) {
            double s = 0;
            for (int p = 0; p < in; p++)
                s += (double)x[(size_t)i * in + p] * w[(size_t)p * out + j];
            want[(size_t)i * out + j] = s;
        }
    expect_close(y, want, (size_t)b * out, TOL, "forward X W");

    /* dW = X^T dY with dY := Y */
    float *dgw = dalloc((size_t)in * out * sizeof(float));
    cr_assert_eq(dev->iface->gemm(dev, 1, 0, in, out, b, 1.0f, dx, in, dy, out, 0.0f, dgw, out),
                 CASTOR_OK);
    float *gw = down(dgw, (size_t)in * out);
    for (int i = 0; i < in; i++)
        for (int j = 0; j < out; j++) {
            double s = 0;
            for (int p = 0; p < b; p++)
                s += (double)x[(size_t)p * in + i] * y[(size_t)p * out + j];
            want[(size_t)i * out + j] = s;
        }
    expect_close(gw, want, (size_t)in * out, TOL, "backward X^T dY");

    /* dX = dY W^T */
    float *dgx = dalloc((size_t)b * in * sizeof(float));
    cr_assert_eq(dev->iface->gemm(dev, 0, 1, b, in, out, 1.0f, dy, out, dw, out, 0.0f, dgx, in),
                 CASTOR_OK);
    float *gx = down(dgx, (size_t)b * in);
    double *wantx = malloc(sizeof(double) * (size_t)b * in);
    for (int i = 0; i < b; i++)
        for (int j = 0; j < in; j++) {
            double s = 0;
            for (int p = 0; p < out; p++)
                s += (double)y[(size_t)i * out + p] * w[(size_t)j * out + p];
            wantx[(size_t)i * in + j] = s;
        }
    expect_close(gx, wantx, (size_t)b * in, TOL, "backward dY W^T");

    release(dx, (size_t)b * in), release(dw, (size_t)in * out), release(dy, (size_t)b * out);
    release(dgw, (size_t)in * out), release(dgx, (size_t)b * in);
    free(x), free(w), free(y), free(gw), free(gx), free(want), free(wantx);
    cr_assert_eq(dev->used, 0);
}

Test(cpu_device, gemm_beta_zero_and_k_zero)
{
    /* beta = 0 must overwrite C, NaN included: replicas multiply into
     * buffers nobody initialised. */
    const int m = 4, n = 5, k = 3;
    float *a = randu((size_t)m * k, 1), *b = randu((size_t)k * n, 1);
    float c[20];
    for (int i = 0; i < m * n; i++)
        c[i] = NAN;
    float *da = up(a, (size_t)m * k), *db = up(b, (size_t)k * n), *dc = up(c, 20);
    cr_assert_eq(dev->iface->gemm(dev, 0, 0, m, n, k, 1.0f, da, k, db, n, 0.0f, dc, n),
                 CASTOR_OK);
    float *got = down(dc, 20);
    for (int i = 0; i < m * n; i++)
        cr_assert(isfinite(got[i]), "beta 0 kept a NaN at %d", i);

    /* k = 0: an empty product, so C = beta C. */
    float before[20];
    memcpy(before, got, sizeof before);
    cr_assert_eq(dev->iface->gemm(dev, 0, 0, m, n, 0, 1.0f, da, 1, db, n, 0.5f, dc, n),
                 CASTOR_OK, "%s", dev->errmsg);
    free(got);
    got = down(dc, 20);
    for (int i = 0; i < m * n; i++)
        cr_assert_eq(got[i], 0.5f * before[i], "k = 0 at %d: %g vs %g", i, got[i],
                     0.5f * before[i]);
    /* m = 0 or n = 0: nothing to do, not an error. */
    cr_assert_eq(dev->iface->gemm(dev, 0, 0, 0, n, k, 1.0f, da, k, db, n, 0.0f, dc, n),
                 CASTOR_OK);
    release(da, (size_t)m * k), release(db, (size_t)k * n), release(dc, 20);
    free(a), free(b), free(got);
}

Test(cpu_device, gemm_rejects_bad_arguments_without_printing)
{
    /* OpenBLAS would print its complaint about a short leading dimension;
     * a library must not, so the device refuses it first. */
    cr_redirect_stdout();
    cr_redirect_stderr();
    float *d = dalloc(64 * sizeof(float));
    cr_assert_eq(dev->iface->gemm(dev, 0, 0, 2, 2, 4, 1.0f, d, 3, d, 2, 0.0f, d, 2),
                 CASTOR_MISUSE);
    cr_assert(strstr(dev->errmsg, "cpu:0") && strstr(dev->errmsg, "lda 3"), "%s", dev->errmsg);
    cr_assert_eq(dev->iface->gemm(dev, 1, 1, 2, 3, 4, 1.0f, d, 2, d, 3, 0.0f, d, 3),
                 CASTOR_MISUSE, "ldb 3 < k 4 for a transposed B");
    cr_assert_eq(dev->iface->gemm(dev, 0, 0, 2, 3, 4, 1.0f, d, 4, d, 3, 0.0f, d, 2),
                 CASTOR_MISUSE, "ldc 2 < n 3");
    cr_assert_eq(dev->iface->gemm(dev, 0, 0, -1, 3, 4, 1.0f, d, 4, d, 3, 0.0f, d, 3),
                 CASTOR_MISUSE);
    cr_assert_eq(dev->iface->gemm(dev, 0, 0, 2, 3, 4, 1.0f, NULL, 4, d, 3, 0.0f, d, 3),
                 CASTOR_MISUSE);
    cr_assert(strstr(dev->errmsg, "gemm"), "%s", dev->errmsg);
    release(d, 64);
    fflush(stdout);
    fflush(stderr);
    cr_assert_stdout_eq_str("");
    cr_assert_stderr_eq_str("");
}

/* ---- element-wise ---- */

Test(cpu_device, bias_add_and_bias_grad)
{
    const int rows = 37, cols = 23;
    size_t n = (size_t)rows * cols;
    float *y = randu(n, 3), *b = randu((size_t)cols, 1), *g = randu(n, 1);
    double *want = malloc(n * sizeof *want);

    float *dy = up(y, n), *db = up(b, (size_t)cols);
    cr_assert_eq(dev->iface->bias_add(dev, dy, db, rows, cols), CASTOR_OK);
    float *got = down(dy, n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)y[i] + b[i % (size_t)cols];
    expect_close(got, want, n, TOL, "bias_add");
    free(got);

    /* db starts as NaN: bias_grad overwrites, it does not accumulate. */
    float nans[23];
    for (int c = 0; c < cols; c++)
        nans[c] = NAN;
    float *dg = up(g, n), *dbg = up(nans, (size_t)cols);
    cr_assert_eq(dev->iface->bias_grad(dev, dg, dbg, rows, cols), CASTOR_OK);
    got = down(dbg, (size_t)cols);
    for (int c = 0; c < cols; c++) {
        double s = 0;
        float in_order = 0.0f;
        for (int r = 0; r < rows; r++) {
            s += g[(size_t)r * cols + c];
            in_order += g[(size_t)r * cols + c];
        }
        want[c] = s;
        /* The interface fixes the order (row 0 first), so the float sum is
         * known to the bit; the CUDA kernel must match it. */
        cr_assert_eq(got[c], in_order, "bias_grad column %d: %.9g, in row order %.9g", c,
                     (double)got[c], (double)in_order);
    }
    expect_close(got, want, (size_t)cols, TOL, "bias_grad");
    free(got);

    /* rows = 0: the gradient of nothing is zero. */
    cr_assert_eq(dev->iface->bias_grad(dev, dg, dbg, 0, cols), CASTOR_OK);
    got = down(dbg, (size_t)cols);
    for (int c = 0; c < cols; c++)
        cr_assert_eq(got[c], 0.0f);
    free(got);

    release(dy, n), release(db, (size_t)cols), release(dg, n), release(dbg, (size_t)cols);
    free(y), free(b), free(g), free(want);
}

static double act_ref(castor_activation act, double x)
{
    switch (act) {
    case CASTOR_ACT_RELU: return x > 0 ? x : 0;
    case CASTOR_ACT_TANH: return tanh(x);
    case CASTOR_ACT_SIGMOID: return 1 / (1 + exp(-x));
    default: return x;
    }
}

/* The derivative from the forward output y, as the interface defines it. */
static double dact_ref(castor_activation act, double y)
{
    switch (act) {
    case CASTOR_ACT_RELU: return y > 0;
    case CASTOR_ACT_TANH: return 1 - y * y;
    case CASTOR_ACT_SIGMOID: return y * (1 - y);
    default: return 1;
    }
}

Test(cpu_device, activations_forward_and_backward)
{
    const size_t n = 1000;
    castor_activation acts[] = {CASTOR_ACT_LINEAR, CASTOR_ACT_RELU, CASTOR_ACT_TANH,
                                CASTOR_ACT_SIGMOID};
    float *x = randu(n, 4), *g = randu(n, 1);
    /* Saturating inputs must stay finite and exact at the limits. */
    x[0] = 100.0f, x[1] = -100.0f, x[2] = 0.0f;
    double *want = malloc(n * sizeof *want);
    for (int a = 0; a < 4; a++) {
        const char *name = castor_activation_name(acts[a]);
        float *d = up(x, n);
        cr_assert_eq(dev->iface->act_forward(dev, acts[a], d, n), CASTOR_OK);
        float *y = down(d, n);
        for (size_t i = 0; i < n; i++)
            want[i] = act_ref(acts[a], x[i]);
        expect_close(y, want, n, TOL, name);
        for (size_t i = 0; i < n; i++)
            cr_assert(isfinite(y[i]), "%s(%g) = %g", name, (double)x[i], (double)y[i]);

        float *dg = up(g, n);
        cr_assert_eq(dev->iface->act_backward(dev, acts[a], d, dg, n), CASTOR_OK);
        float *got = down(dg, n);
        for (size_t i = 0; i < n; i++)
            want[i] = (double)g[i] * dact_ref(acts[a], y[i]);
        expect_close(got, want, n, TOL, name);
        release(d, n), release(dg, n);
        free(y), free(got);
    }
    float *d = up(x, n);
    cr_assert_eq(dev->iface->act_forward(dev, (castor_activation)42, d, n), CASTOR_INVALID);
    cr_assert(strstr(dev->errmsg, "42"), "%s", dev->errmsg);
    cr_assert_eq(dev->iface->act_backward(dev, (castor_activation)-1, d, d, n), CASTOR_INVALID);
    cr_assert_eq(dev->iface->act_forward(dev, CASTOR_ACT_RELU, d, 0), CASTOR_OK);
    release(d, n);
    free(x), free(g), free(want);
}

Test(cpu_device, add)
{
    const size_t n = 777;
    float *a = randu(n, 2), *b = randu(n, 2);
    float *da = up(a, n), *db = up(b, n);
    cr_assert_eq(dev->iface->add(dev, da, db, n), CASTOR_OK);
    float *got = down(da, n);
    double *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)a[i] + b[i];
    expect_close(got, want, n, TOL, "add");
    float *src = down(db, n);
    cr_assert_eq(memcmp(src, b, n * sizeof(float)), 0, "add changed its source");
    release(da, n), release(db, n);
    free(a), free(b), free(got), free(src), free(want);
}

/* ---- losses ---- */

Test(cpu_device, softmax_xent)
{
    enum { ROWS = 9, COLS = 10 };
    size_t n = (size_t)ROWS * COLS;
    float *logits = randu(n, 4);
    int32_t labels[ROWS];
    for (int r = 0; r < ROWS; r++)
        labels[r] = (int32_t)castor__rng_below(&rng, COLS);
    /* Row 0: one huge logit, which overflows expf without the max trick. */
    logits[0 * COLS + 3] = 1e4f, labels[0] = 3;
    /* Row 1: huge and labelled elsewhere: loss about 1e4, still finite. */
    logits[1 * COLS + 7] = 1e4f, labels[1] = 2;
    /* Row 2: all equal: the first maximum (column 0) is the argmax. */
    for (int c = 0; c < COLS; c++)
        logits[2 * COLS + c] = 0.5f;
    labels[2] = 4;
    /* Row 3: a tie for the maximum between columns 5 and 8, label on the
     * second: not correct. */
    for (int c = 0; c < COLS; c++)
        logits[3 * COLS + c] = -1.0f;
    logits[3 * COLS + 5] = logits[3 * COLS + 8] = 2.0f, labels[3] = 8;
    /* Row 4: very negative logits everywhere. */
    for (int c = 0; c < COLS; c++)
        logits[4 * COLS + c] = -1e4f + (float)c;
    labels[4] = COLS - 1;

    const float scale = 1.0f / ROWS;
    float *dl = up(logits, n);
    void *dlab = dalloc(sizeof labels);
    cr_assert_eq(cdev_copy_h2d(dev, CDEV_STREAM_H2D, dlab, labels, sizeof labels), CASTOR_OK);
    float *dgrad = dalloc(n * sizeof(float)), *dstats = dalloc(2 * ROWS * sizeof(float));
    cr_assert_eq(dev->iface->softmax_xent(dev, dl, dlab, ROWS, COLS, scale, dgrad, dstats),
                 CASTOR_OK, "%s", dev->errmsg);
    float *grad = down(dgrad, n), *stats = down(dstats, 2 * ROWS);

    double want_grad[ROWS * COLS], want_loss[ROWS];
    for (int r = 0; r < ROWS; r++) {
        const float *l = logits + (size_t)r * COLS;
        double mx = l[0], s = 0;
        int best = 0;
        for (int c = 1; c < COLS; c++)
            if (l[c] > mx)
                mx = l[c], best = c;
        for (int c = 0; c < COLS; c++)
            s += exp(l[c] - mx);
        want_loss[r] = log(s) + mx - l[labels[r]];
        cr_assert(isfinite(stats[2 * r]), "row %d loss %g", r, (double)stats[2 * r]);
        cr_assert_eq(stats[2 * r + 1], best == labels[r] ? 1.0f : 0.0f,
                     "row %d: correct %g, argmax %d, label %d", r, (double)stats[2 * r + 1],
                     best, labels[r]);
        for (int c = 0; c < COLS; c++)
            want_grad[r * COLS + c] = scale * (exp(l[c] - mx) / s - (c == labels[r]));
    }
    cr_assert_eq(stats[2 * 0 + 1], 1.0f);
    cr_assert_eq(stats[2 * 1 + 1], 0.0f);
    cr_assert_eq(stats[2 * 2 + 1], 0.0f, "all-equal row: the argmax is column 0");
    cr_assert_eq(stats[2 * 3 + 1], 0.0f, "a tie goes to the first maximum");
    cr_assert_eq(stats[2 * 4 + 1], 1.0f);
    cr_assert(stats[2 * 1] > 9990.0f, "row 1 loss %g", (double)stats[2 * 1]);
    float loss_got[ROWS];
    for (int r = 0; r < ROWS; r++)
        loss_got[r] = stats[2 * r];
    expect_close(loss_got, want_loss, ROWS, TOL, "softmax_xent loss");
    expect_close(grad, want_grad, n, TOL, "softmax_xent dlogits");

    /* Evaluation: no gradient buffer, the same statistics to the bit. */
    float *dstats2 = dalloc(2 * ROWS * sizeof(float));
    cr_assert_eq(dev->iface->softmax_xent(dev, dl, dlab, ROWS, COLS, scale, NULL, dstats2),
                 CASTOR_OK);
    float *stats2 = down(dstats2, 2 * ROWS);
    cr_assert_eq(memcmp(stats, stats2, 2 * ROWS * sizeof(float)), 0);

    /* A label outside the row is refused rather than read past the row. */
    int32_t bad = COLS;
    cr_assert_eq(cdev_copy_h2d(dev, CDEV_STREAM_H2D, dlab, &bad, sizeof bad), CASTOR_OK);
    cr_assert_eq(dev->iface->softmax_xent(dev, dl, dlab, 1, COLS, 1.0f, NULL, dstats2),
                 CASTOR_INVALID);
    cr_assert(strstr(dev->errmsg, "label 10"), "%s", dev->errmsg);
    cr_assert_eq(dev->iface->softmax_xent(dev, dl, NULL, ROWS, COLS, 1.0f, NULL, dstats2),
                 CASTOR_MISUSE);
    cr_assert_eq(dev->iface->softmax_xent(dev, dl, dlab, 0, COLS, 1.0f, NULL, dstats2),
                 CASTOR_OK);

    release(dl, n), release(dgrad, n), release(dstats, 2 * ROWS), release(dstats2, 2 * ROWS);
    cdev_free(dev, dlab, sizeof labels);
    free(grad), free(stats), free(stats2), free(logits);
    cr_assert_eq(dev->used, 0);
}

Test(cpu_device, mse)
{
    const int rows = 11, cols = 7;
    size_t n = (size_t)rows * cols;
    float *pred = randu(n, 2), *target = randu(n, 2);
    const float scale = 0.25f;
    float *dp = up(pred, n), *dt = up(target, n);
    float *dgrad = dalloc(n * sizeof(float)), *dstats = dalloc(2 * (size_t)rows * sizeof(float));
    cr_assert_eq(dev->iface->mse(dev, dp, dt, rows, cols, scale, dgrad, dstats), CASTOR_OK);
    float *grad = down(dgrad, n), *stats = down(dstats, 2 * (size_t)rows);
    double *want_grad = malloc(n * sizeof *want_grad), *want_loss = malloc(rows * sizeof(double));
    float *loss_got = malloc(rows * sizeof(float));
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            double d = (double)pred[i] - target[i];
            s += d * d;
            want_grad[i] = scale * 2 * d / cols;
        }
        want_loss[r] = s / cols;
        loss_got[r] = stats[2 * r];
        cr_assert_eq(stats[2 * r + 1], 0.0f);
    }
    expect_close(grad, want_grad, n, TOL, "mse dpred");
    expect_close(loss_got, want_loss, (size_t)rows, TOL, "mse loss");

    float *dstats2 = dalloc(2 * (size_t)rows * sizeof(float));
    cr_assert_eq(dev->iface->mse(dev, dp, dt, rows, cols, scale, NULL, dstats2), CASTOR_OK);
    float *stats2 = down(dstats2, 2 * (size_t)rows);
    cr_assert_eq(memcmp(stats, stats2, 2 * (size_t)rows * sizeof(float)), 0);
    cr_assert_eq(dev->iface->mse(dev, dp, dt, rows, 0, scale, NULL, dstats2), CASTOR_MISUSE);

    release(dp, n), release(dt, n), release(dgrad, n);
    release(dstats, 2 * (size_t)rows), release(dstats2, 2 * (size_t)rows);
    free(pred), free(target), free(grad), free(stats), free(stats2), free(want_grad);
    free(want_loss), free(loss_got);
}

/* ---- memory, copies, streams ---- */

Test(cpu_device, copies_really_copy)
{
    float h[4] = {1, 2, 3, 4};
    float *d = up(h, 4);
    cr_assert_neq((void *)d, (void *)h);
    cr_assert_eq((uintptr_t)d % 64, 0, "device memory is 64-byte aligned");
    h[0] = 99;  /* the device keeps what was copied */
    float *back = down(d, 4);
    cr_assert_eq(back[0], 1.0f);
    /* ...and the host keeps what it was given. */
    cr_assert_eq(dev->iface->memset0(dev, CDEV_STREAM_COMPUTE, d, 4 * sizeof(float)),
                 CASTOR_OK);
    cr_assert_eq(back[1], 2.0f);
    free(back);
    back = down(d, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(back[i], 0.0f, "memset0");

    float *d2 = dalloc(4 * sizeof(float));
    float h2[4] = {5, 6, 7, 8};
    cr_assert_eq(cdev_copy_h2d(dev, CDEV_STREAM_H2D, d, h2, sizeof h2), CASTOR_OK);
    cr_assert_eq(dev->iface->copy_d2d(dev, CDEV_STREAM_COMPUTE, d2, d, sizeof h2), CASTOR_OK);
    cr_assert_eq(dev->iface->memset0(dev, CDEV_STREAM_COMPUTE, d, sizeof h2), CASTOR_OK);
    free(back);
    back = down(d2, 4);
    cr_assert_eq(memcmp(back, h2, sizeof h2), 0, "copy_d2d");

    /* The bench counts bytes across the bus: h2d twice 16, d2h three times. */
    cr_assert_eq(dev->bytes_h2d, 32);
    cr_assert_eq(dev->bytes_d2h, 48);
    release(d, 4), release(d2, 4);
    free(back);
}

Test(cpu_device, streams_and_events)
{
    cdev_event *ev = NULL;
    cr_assert_eq(dev->iface->event_create(dev, &ev), CASTOR_OK);
    cr_assert_not_null(ev);
    /* Waiting on an event never recorded is allowed (a no-op on CUDA). */
    cr_assert_eq(dev->iface->stream_wait(dev, CDEV_STREAM_COMPUTE, ev), CASTOR_OK);
    for (int s = 0; s < CDEV_NUM_STREAMS; s++) {
        cr_assert_eq(dev->iface->event_record(dev, ev, s), CASTOR_OK);
        cr_assert_eq(dev->iface->stream_wait(dev, (s + 1) % CDEV_NUM_STREAMS, ev), CASTOR_OK);
    }
    cr_assert_eq(dev->iface->synchronize(dev), CASTOR_OK);
    cr_assert_eq(dev->iface->event_record(dev, ev, CDEV_NUM_STREAMS), CASTOR_MISUSE);
    cr_assert(strstr(dev->errmsg, "stream 3"), "%s", dev->errmsg);
    cr_assert_eq(dev->iface->stream_wait(dev, -1, ev), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->event_record(dev, NULL, 0), CASTOR_MISUSE);
    dev->iface->event_destroy(dev, ev);

    float h = 1.0f, *d = up(&h, 1);
    cr_assert_eq(dev->iface->copy_h2d(dev, 7, d, &h, sizeof h), CASTOR_MISUSE);
    cr_assert(strstr(dev->errmsg, "copy_h2d"), "%s", dev->errmsg);
    cr_assert_eq(dev->iface->copy_d2h(dev, 0, NULL, d, sizeof h), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->copy_d2h(dev, 0, NULL, d, 0), CASTOR_OK, "an empty copy");
    release(d, 1);
}

Test(cpu_device, budget_used_and_peak)
{
    void *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(dev->used, 0);
    cr_assert_eq(cdev_alloc(dev, 40 << 20, &a), CASTOR_OK);
    cr_assert_eq(dev->used, (size_t)40 << 20);
    cr_assert_eq(dev->peak, (size_t)40 << 20);

    b = (void *)1;
    int rc = cdev_alloc(dev, 30 << 20, &b);
    cr_assert_eq(rc, CASTOR_DEVICE_MEMORY);
    cr_assert_null(b, "a failed allocation hands out NULL");
    /* The message names the device, what was asked, what is held and the
     * budget, so a user knows how far over they are. */
    cr_assert(strstr(dev->errmsg, "cpu:0") && strstr(dev->errmsg, "31457280") &&
                  strstr(dev->errmsg, "41943040") && strstr(dev->errmsg, "67108864") &&
                  strstr(dev->errmsg, "out of device memory"),
              "%s", dev->errmsg);
    cr_assert_eq(dev->used, (size_t)40 << 20, "a refused allocation holds nothing");

    /* Exactly up to the budget is allowed; one byte more is not. */
    cr_assert_eq(cdev_alloc(dev, 24 << 20, &b), CASTOR_OK, "%s", dev->errmsg);
    cr_assert_eq(dev->used, BUDGET);
    cr_assert_eq(cdev_alloc(dev, 1, &c), CASTOR_DEVICE_MEMORY);
    cr_assert_eq(dev->peak, BUDGET);

    cdev_free(dev, a, 40 << 20);
    cr_assert_eq(dev->used, (size_t)24 << 20);
    cr_assert_eq(dev->peak, BUDGET, "peak is the most ever held");
    /* A request so large that used + bytes would wrap is still refused. */
    cr_assert_eq(cdev_alloc(dev, SIZE_MAX, &c), CASTOR_DEVICE_MEMORY);
    cr_assert_null(c);
    cdev_free(dev, b, 24 << 20);
    cr_assert_eq(dev->used, 0);

    /* Zero bytes is a valid allocation, and freeing NULL is a no-op. */
    cr_assert_eq(cdev_alloc(dev, 0, &c), CASTOR_OK);
    cr_assert_not_null(c);
    cdev_free(dev, c, 0);
    cdev_free(dev, NULL, 100);
    cdev_free(NULL, NULL, 0);
    cdev_destroy(NULL);
    cr_assert_eq(dev->used, 0);
    cr_assert_eq(cdev_alloc(dev, 16, NULL), CASTOR_MISUSE);
}

Test(cpu_device, null_and_negative_arguments_are_misuse)
{
    float *d = dalloc(16 * sizeof(float));
    cr_assert_eq(dev->iface->bias_add(dev, d, NULL, 2, 2), CASTOR_MISUSE);
    cr_assert(strstr(dev->errmsg, "cpu:0") && strstr(dev->errmsg, "bias_add"), "%s",
              dev->errmsg);
    cr_assert_eq(dev->iface->bias_add(dev, d, d, -1, 2), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->bias_grad(dev, d, d, 2, -2), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->act_forward(dev, CASTOR_ACT_TANH, NULL, 4), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->act_backward(dev, CASTOR_ACT_TANH, d, NULL, 4), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->mse(dev, d, d, -1, 2, 1.0f, NULL, d), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->mse(dev, d, d, 1, 2, 1.0f, NULL, NULL), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->add(dev, d, NULL, 4), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->memset0(dev, 0, NULL, 4), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->event_create(dev, NULL), CASTOR_MISUSE);
    release(d, 16);

    char err[128] = "";
    cdev *other = (cdev *)1;
    cr_assert_eq(cdev_cpu_create(-1, BUDGET, &other, err, sizeof err), CASTOR_INVALID);
    cr_assert_null(other);
    cr_assert(err[0]);
    cr_assert_eq(cdev_cpu_create(0, BUDGET, NULL, err, sizeof err), CASTOR_MISUSE);
}

Test(cpu_device, name_and_backend)
{
    cdev *other = NULL;
    char err[128];
    cr_assert_eq(cdev_cpu_create(3, 1024, &other, err, sizeof err), CASTOR_OK);
    cr_assert_str_eq(other->name, "cpu:3");
    cr_assert_str_eq(other->iface->backend, "cpu");
    cr_assert_eq(other->ordinal, 3);
    cr_assert_eq(other->budget, 1024);
    void *p = NULL;
    cr_assert_eq(cdev_alloc(other, 2000, &p), CASTOR_DEVICE_MEMORY);
    cr_assert(strstr(other->errmsg, "cpu:3:") == other->errmsg, "%s", other->errmsg);
    cr_assert_str_eq(dev->errmsg, "", "an error on one device leaves the others alone");
    cdev_destroy(other);
}

/* ---- the mirrored strategy's update ---- */

Test(cpu_device, optimizer_step_is_the_host_optimizer)
{
    const size_t n = 1001;
    castor_optimizer kinds[5] = {
        castor_optimizer_defaults(CASTOR_OPT_SGD), castor_optimizer_defaults(CASTOR_OPT_SGD),
        castor_optimizer_defaults(CASTOR_OPT_SGD), castor_optimizer_defaults(CASTOR_OPT_ADAM),
        castor_optimizer_defaults(CASTOR_OPT_ADAMW)};
    kinds[1].momentum = 0.9f;
    kinds[2].momentum = 0.8f, kinds[2].nesterov = 1;
    for (int k = 0; k < 5; k++) {
        size_t slots = (size_t)castor__optim_slots(&kinds[k]);
        size_t ns = slots * n;
        float *p = randu(n, 1), *st = calloc(ns ? ns : 1, sizeof(float));
        float *dp = up(p, n), *ds = ns ? up(st, ns) : NULL;
        float *dg = dalloc(n * sizeof(float));
        for (int step = 1; step <= 4; step++) {
            float *g = randu(n, 1);
            cr_assert_eq(cdev_copy_h2d(dev, CDEV_STREAM_H2D, dg, g, n * sizeof(float)),
                         CASTOR_OK);
            castor__optim_apply_range(&kinds[k], p, g, ns ? st : NULL, n, step, 0, n);
            cr_assert_eq(dev->iface->optimizer_step(dev, &kinds[k], dp, dg, ds, n, step),
                         CASTOR_OK, "%s", dev->errmsg);
            free(g);
        }
        float *got = down(dp, n);
        cr_assert_eq(memcmp(got, p, n * sizeof(float)), 0, "%s (case %d): parameters differ",
                     castor_optimizer_kind_name(kinds[k].kind), k);
        if (ns) {
            float *gst = down(ds, ns);
            cr_assert_eq(memcmp(gst, st, ns * sizeof(float)), 0, "%s (case %d): state differs",
                         castor_optimizer_kind_name(kinds[k].kind), k);
            free(gst);
            release(ds, ns);
        }
        release(dp, n), release(dg, n);
        free(p), free(st), free(got);
    }

    float *d = dalloc(4 * sizeof(float));
    cr_assert_eq(dev->iface->optimizer_step(dev, &kinds[3], d, d, NULL, 4, 1), CASTOR_MISUSE,
                 "Adam without state");
    cr_assert(strstr(dev->errmsg, "state"), "%s", dev->errmsg);
    cr_assert_eq(dev->iface->optimizer_step(dev, NULL, d, d, d, 4, 1), CASTOR_MISUSE);
    cr_assert_eq(dev->iface->optimizer_step(dev, &kinds[0], d, d, NULL, 4, 0), CASTOR_MISUSE,
                 "steps count from 1");
    castor_optimizer bogus = kinds[0];
    bogus.kind = (castor_optimizer_kind)9;
    cr_assert_eq(dev->iface->optimizer_step(dev, &bogus, d, d, d, 4, 1), CASTOR_INVALID);
    release(d, 4);
}

/* ---- replicas: one device per thread, all calling OpenBLAS at once ---- */

typedef struct gemm_job {
    cdev *dev;
    const float *a, *b;
    float *c;  /* host result */
    int m, n, k, reps, rc;
} gemm_job;

static void *gemm_thread(void *arg)
{
    gemm_job *j = arg;
    cdev *d = j->dev;
    size_t na = (size_t)j->m * j->k, nb = (size_t)j->k * j->n, nc = (size_t)j->m * j->n;
    void *da = NULL, *db = NULL, *dc = NULL;
    if ((j->rc = cdev_alloc(d, na * sizeof(float), &da)) ||
        (j->rc = cdev_alloc(d, nb * sizeof(float), &db)) ||
        (j->rc = cdev_alloc(d, nc * sizeof(float), &dc)))
        goto out;
    cdev_copy_h2d(d, CDEV_STREAM_H2D, da, j->a, na * sizeof(float));
    cdev_copy_h2d(d, CDEV_STREAM_H2D, db, j->b, nb * sizeof(float));
    for (int r = 0; r < j->reps && !j->rc; r++)
        j->rc = d->iface->gemm(d, 0, 0, j->m, j->n, j->k, 1.0f, da, j->k, db, j->n, 0.0f, dc,
                               j->n);
    if (!j->rc)
        j->rc = cdev_copy_d2h(d, CDEV_STREAM_D2H, j->c, dc, nc * sizeof(float));
out:
    cdev_free(d, da, na * sizeof(float));
    cdev_free(d, db, nb * sizeof(float));
    cdev_free(d, dc, nc * sizeof(float));
    return NULL;
}

Test(cpu_device, concurrent_replicas_agree_with_one)
{
    /* The same product from two replica threads at once must be bitwise
     * what one thread alone gets: central storage relies on replicas being
     * interchangeable. */
    const int m = 128, n = 128, k = 784;
    float *a = randu((size_t)m * k, 1), *b = randu((size_t)k * n, 0.1f);
    float *alone = malloc(sizeof(float) * m * n);
    gemm_job solo = {dev, a, b, alone, m, n, k, 1, 0};
    gemm_thread(&solo);
    cr_assert_eq(solo.rc, CASTOR_OK, "%s", dev->errmsg);

    cdev *devs[2];
    gemm_job jobs[2];
    pthread_t t[2];
    char err[128];
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(cdev_cpu_create(i + 1, BUDGET, &devs[i], err, sizeof err), CASTOR_OK);
        jobs[i] = (gemm_job){devs[i], a, b, malloc(sizeof(float) * m * n), m, n, k, 20, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, gemm_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(jobs[i].rc, CASTOR_OK, "%s", devs[i]->errmsg);
        cr_assert_eq(memcmp(jobs[i].c, alone, sizeof(float) * m * n), 0,
                     "replica %d differs from a lone one", i);
        cr_assert_eq(devs[i]->used, 0);
        free(jobs[i].c);
        cdev_destroy(devs[i]);
    }
    free(a), free(b), free(alone);
}

/* ---- the build without CUDA ---- */

Test(cpu_device, cuda_absent_says_why)
{
    if (cdev_cuda_compiled())
        cr_skip_test("this build has CUDA; tests/gpu covers it");
    const char *why = NULL;
    cr_assert_eq(cdev_cuda_count(&why), 0);
    cr_assert_str_eq(why, "built without CUDA");
    cr_assert_eq(cdev_cuda_count(NULL), 0);
    why = NULL;
    cr_assert_eq(castor_cuda_device_count(&why), 0);
    cr_assert_not_null(why);
    char err[160] = "";
    cdev *g = (cdev *)1;
    cr_assert_eq(cdev_cuda_create(0, 0, 0, 0, &g, err, sizeof err), CASTOR_UNSUPPORTED);
    cr_assert_null(g);
    cr_assert(strstr(err, "without CUDA") && strstr(err, "nvcc"), "%s", err);
    castor_device_info info;
    cr_assert_eq(castor_cuda_device_info(0, &info), CASTOR_UNSUPPORTED);
    cr_assert_eq(castor_cuda_device_info(0, NULL), CASTOR_MISUSE);
}

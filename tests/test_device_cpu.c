/*
 * Every operation of the emulated device against a plain double-precision
 * reference on random inputs (its memory rules: test_device_cpu_memory.c).
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
#include "tests/cpu_device_support.h"

TestSuite(cpu_device, .init = cpu_dev_setup, .fini = cpu_dev_teardown);

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
            float *a = cpu_randu(na, 1), *b = cpu_randu(nb, 1), *c = cpu_randu(nc, 1);
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
            float *da = cpu_up(a, na), *db = cpu_up(b, nb), *dc = cpu_up(c, nc);
            cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, ta, tb, m, n, k, alpha, da, lda, db, ldb,
                                              beta, dc, ldc),
                         CASTOR_OK, "%s", cpu_dev->errmsg);
            float *got = cpu_down(dc, nc);
            char what[64];
            snprintf(what, sizeof what, "gemm %c%c %dx%dx%d", ta ? 'T' : 'N', tb ? 'T' : 'N', m,
                     n, k);
            /* Sums of k products of magnitude <= 1: scale the bound with k. */
            cpu_expect_close(got, want, nc, TOL * fmax(1.0, sqrt((double)k) / 4), what);
            cpu_release(da, na), cpu_release(db, nb), cpu_release(dc, nc);
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
    float *x = cpu_randu((size_t)b * in, 1), *w = cpu_randu((size_t)in * out, 0.1f);
    float *dx = cpu_up(x, (size_t)b * in), *dw = cpu_up(w, (size_t)in * out);
    float *dy = cpu_dalloc((size_t)b * out * sizeof(float));
    cr_assert_eq(
        cpu_dev->iface->gemm(cpu_dev, 0, 0, b, out, in, 1.0f, dx, in, dw, out, 0.0f, dy, out),
        CASTOR_OK);
    float *y = cpu_down(dy, (size_t)b * out);
    double *want = malloc(sizeof(double) * (size_t)in * out);
    for (int i = 0; i < b; i++)
        for (int j = 0; j < out; j++) {
            double s = 0;
            for (int p = 0; p < in; p++)
                s += (double)x[(size_t)i * in + p] * w[(size_t)p * out + j];
            want[(size_t)i * out + j] = s;
        }
    cpu_expect_close(y, want, (size_t)b * out, TOL, "forward X W");

    /* dW = X^T dY with dY := Y */
    float *dgw = cpu_dalloc((size_t)in * out * sizeof(float));
    cr_assert_eq(
        cpu_dev->iface->gemm(cpu_dev, 1, 0, in, out, b, 1.0f, dx, in, dy, out, 0.0f, dgw, out),
        CASTOR_OK);
    float *gw = cpu_down(dgw, (size_t)in * out);
    for (int i = 0; i < in; i++)
        for (int j = 0; j < out; j++) {
            double s = 0;
            for (int p = 0; p < b; p++)
                s += (double)x[(size_t)p * in + i] * y[(size_t)p * out + j];
            want[(size_t)i * out + j] = s;
        }
    cpu_expect_close(gw, want, (size_t)in * out, TOL, "backward X^T dY");

    /* dX = dY W^T */
    float *dgx = cpu_dalloc((size_t)b * in * sizeof(float));
    cr_assert_eq(
        cpu_dev->iface->gemm(cpu_dev, 0, 1, b, in, out, 1.0f, dy, out, dw, out, 0.0f, dgx, in),
        CASTOR_OK);
    float *gx = cpu_down(dgx, (size_t)b * in);
    double *wantx = malloc(sizeof(double) * (size_t)b * in);
    for (int i = 0; i < b; i++)
        for (int j = 0; j < in; j++) {
            double s = 0;
            for (int p = 0; p < out; p++)
                s += (double)y[(size_t)i * out + p] * w[(size_t)j * out + p];
            wantx[(size_t)i * in + j] = s;
        }
    cpu_expect_close(gx, wantx, (size_t)b * in, TOL, "backward dY W^T");

    cpu_release(dx, (size_t)b * in), cpu_release(dw, (size_t)in * out),
        cpu_release(dy, (size_t)b * out);
    cpu_release(dgw, (size_t)in * out), cpu_release(dgx, (size_t)b * in);
    free(x), free(w), free(y), free(gw), free(gx), free(want), free(wantx);
    cr_assert_eq(cpu_dev->used, 0);
}

Test(cpu_device, gemm_beta_zero_and_k_zero)
{
    /* beta = 0 must overwrite C, NaN included: replicas multiply into
     * buffers nobody initialised. */
    const int m = 4, n = 5, k = 3;
    float *a = cpu_randu((size_t)m * k, 1), *b = cpu_randu((size_t)k * n, 1);
    float c[20];
    for (int i = 0; i < m * n; i++)
        c[i] = NAN;
    float *da = cpu_up(a, (size_t)m * k), *db = cpu_up(b, (size_t)k * n), *dc = cpu_up(c, 20);
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 0, 0, m, n, k, 1.0f, da, k, db, n, 0.0f, dc, n),
                 CASTOR_OK);
    float *got = cpu_down(dc, 20);
    for (int i = 0; i < m * n; i++)
        cr_assert(isfinite(got[i]), "beta 0 kept a NaN at %d", i);

    /* k = 0: an empty product, so C = beta C. */
    float before[20];
    memcpy(before, got, sizeof before);
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 0, 0, m, n, 0, 1.0f, da, 1, db, n, 0.5f, dc, n),
                 CASTOR_OK, "%s", cpu_dev->errmsg);
    free(got);
    got = cpu_down(dc, 20);
    for (int i = 0; i < m * n; i++)
        cr_assert_eq(got[i], 0.5f * before[i], "k = 0 at %d: %g vs %g", i, got[i],
                     0.5f * before[i]);
    /* m = 0 or n = 0: nothing to do, not an error. */
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 0, 0, 0, n, k, 1.0f, da, k, db, n, 0.0f, dc, n),
                 CASTOR_OK);
    cpu_release(da, (size_t)m * k), cpu_release(db, (size_t)k * n), cpu_release(dc, 20);
    free(a), free(b), free(got);
}

Test(cpu_device, gemm_rejects_bad_arguments_without_printing)
{
    /* OpenBLAS would print its complaint about a short leading dimension;
     * a library must not, so the device refuses it first. */
    cr_redirect_stdout();
    cr_redirect_stderr();
    float *d = cpu_dalloc(64 * sizeof(float));
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 0, 0, 2, 2, 4, 1.0f, d, 3, d, 2, 0.0f, d, 2),
                 CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "cpu:0") && strstr(cpu_dev->errmsg, "lda 3"), "%s",
              cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 1, 1, 2, 3, 4, 1.0f, d, 2, d, 3, 0.0f, d, 3),
                 CASTOR_MISUSE, "ldb 3 < k 4 for a transposed B");
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 0, 0, 2, 3, 4, 1.0f, d, 4, d, 3, 0.0f, d, 2),
                 CASTOR_MISUSE, "ldc 2 < n 3");
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 0, 0, -1, 3, 4, 1.0f, d, 4, d, 3, 0.0f, d, 3),
                 CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->gemm(cpu_dev, 0, 0, 2, 3, 4, 1.0f, NULL, 4, d, 3, 0.0f, d, 3),
                 CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "gemm"), "%s", cpu_dev->errmsg);
    cpu_release(d, 64);
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
    float *y = cpu_randu(n, 3), *b = cpu_randu((size_t)cols, 1), *g = cpu_randu(n, 1);
    double *want = malloc(n * sizeof *want);

    float *dy = cpu_up(y, n), *db = cpu_up(b, (size_t)cols);
    cr_assert_eq(cpu_dev->iface->bias_add(cpu_dev, dy, db, rows, cols), CASTOR_OK);
    float *got = cpu_down(dy, n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)y[i] + b[i % (size_t)cols];
    cpu_expect_close(got, want, n, TOL, "bias_add");
    free(got);

    /* db starts as NaN: bias_grad overwrites, it does not accumulate. */
    float nans[23];
    for (int c = 0; c < cols; c++)
        nans[c] = NAN;
    float *dg = cpu_up(g, n), *dbg = cpu_up(nans, (size_t)cols);
    cr_assert_eq(cpu_dev->iface->bias_grad(cpu_dev, dg, dbg, rows, cols), CASTOR_OK);
    got = cpu_down(dbg, (size_t)cols);
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
    cpu_expect_close(got, want, (size_t)cols, TOL, "bias_grad");
    free(got);

    /* rows = 0: the gradient of nothing is zero. */
    cr_assert_eq(cpu_dev->iface->bias_grad(cpu_dev, dg, dbg, 0, cols), CASTOR_OK);
    got = cpu_down(dbg, (size_t)cols);
    for (int c = 0; c < cols; c++)
        cr_assert_eq(got[c], 0.0f);
    free(got);

    cpu_release(dy, n), cpu_release(db, (size_t)cols), cpu_release(dg, n),
        cpu_release(dbg, (size_t)cols);
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
    float *x = cpu_randu(n, 4), *g = cpu_randu(n, 1);
    /* Saturating inputs must stay finite and exact at the limits. */
    x[0] = 100.0f, x[1] = -100.0f, x[2] = 0.0f;
    double *want = malloc(n * sizeof *want);
    for (int a = 0; a < 4; a++) {
        const char *name = castor_activation_name(acts[a]);
        float *d = cpu_up(x, n);
        cr_assert_eq(cpu_dev->iface->act_forward(cpu_dev, acts[a], d, n), CASTOR_OK);
        float *y = cpu_down(d, n);
        for (size_t i = 0; i < n; i++)
            want[i] = act_ref(acts[a], x[i]);
        cpu_expect_close(y, want, n, TOL, name);
        for (size_t i = 0; i < n; i++)
            cr_assert(isfinite(y[i]), "%s(%g) = %g", name, (double)x[i], (double)y[i]);

        float *dg = cpu_up(g, n);
        cr_assert_eq(cpu_dev->iface->act_backward(cpu_dev, acts[a], d, dg, n), CASTOR_OK);
        float *got = cpu_down(dg, n);
        for (size_t i = 0; i < n; i++)
            want[i] = (double)g[i] * dact_ref(acts[a], y[i]);
        cpu_expect_close(got, want, n, TOL, name);
        cpu_release(d, n), cpu_release(dg, n);
        free(y), free(got);
    }
    float *d = cpu_up(x, n);
    cr_assert_eq(cpu_dev->iface->act_forward(cpu_dev, (castor_activation)42, d, n), CASTOR_INVALID);
    cr_assert(strstr(cpu_dev->errmsg, "42"), "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->act_backward(cpu_dev, (castor_activation)-1, d, d, n),
                 CASTOR_INVALID);
    cr_assert_eq(cpu_dev->iface->act_forward(cpu_dev, CASTOR_ACT_RELU, d, 0), CASTOR_OK);
    cpu_release(d, n);
    free(x), free(g), free(want);
}

/* ReLU's edge values, bit for bit as the CUDA kernel gives them: -0 comes
 * out +0 (a '<' for '<=' kept the sign, and predict returned -0), a NaN
 * goes on, and the gradient stops at an output of 0 whatever the sign. */
Test(cpu_device, relu_of_minus_zero_is_plus_zero)
{
    float x[3] = {-0.0f, NAN, 0.0f}, g[3] = {1.0f, 1.0f, 1.0f};
    float *d = cpu_up(x, 3), *dg = cpu_up(g, 3);
    cr_assert_eq(cpu_dev->iface->act_forward(cpu_dev, CASTOR_ACT_RELU, d, 3), CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->act_backward(cpu_dev, CASTOR_ACT_RELU, d, dg, 3), CASTOR_OK);
    float *y = cpu_down(d, 3), *got = cpu_down(dg, 3);
    cr_assert(y[0] == 0.0f && !signbit(y[0]), "relu(-0) = %g", (double)y[0]);
    cr_assert(isnan(y[1]), "relu(NaN) = %g", (double)y[1]);
    cr_assert(y[2] == 0.0f && !signbit(y[2]), "relu(0) = %g", (double)y[2]);
    cr_assert(got[0] == 0.0f && got[2] == 0.0f && got[1] == 1.0f,
              "relu'(-0, NaN, 0) = %g %g %g", (double)got[0], (double)got[1], (double)got[2]);
    cpu_release(d, 3), cpu_release(dg, 3);
    free(y), free(got);
}

Test(cpu_device, add)
{
    const size_t n = 777;
    float *a = cpu_randu(n, 2), *b = cpu_randu(n, 2);
    float *da = cpu_up(a, n), *db = cpu_up(b, n);
    cr_assert_eq(cpu_dev->iface->add(cpu_dev, da, db, n), CASTOR_OK);
    float *got = cpu_down(da, n);
    double *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)a[i] + b[i];
    cpu_expect_close(got, want, n, TOL, "add");
    float *src = cpu_down(db, n);
    cr_assert_eq(memcmp(src, b, n * sizeof(float)), 0, "add changed its source");
    cpu_release(da, n), cpu_release(db, n);
    free(a), free(b), free(got), free(src), free(want);
}

/* ---- losses ---- */

Test(cpu_device, softmax_xent)
{
    enum { ROWS = 9, COLS = 10 };
    size_t n = (size_t)ROWS * COLS;
    float *logits = cpu_randu(n, 4);
    int32_t labels[ROWS];
    for (int r = 0; r < ROWS; r++)
        labels[r] = (int32_t)castor__rng_below(&cpu_rng, COLS);
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
    float *dl = cpu_up(logits, n);
    void *dlab = cpu_dalloc(sizeof labels);
    cpu_put(dlab, labels, sizeof labels);
    float *dgrad = cpu_dalloc(n * sizeof(float)), *dstats = cpu_dalloc(2 * ROWS * sizeof(float));
    cr_assert_eq(cpu_dev->iface->softmax_xent(cpu_dev, dl, dlab, ROWS, COLS, scale, dgrad, dstats),
                 CASTOR_OK, "%s", cpu_dev->errmsg);
    float *grad = cpu_down(dgrad, n), *stats = cpu_down(dstats, 2 * ROWS);

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
    cpu_expect_close(loss_got, want_loss, ROWS, TOL, "softmax_xent loss");
    cpu_expect_close(grad, want_grad, n, TOL, "softmax_xent dlogits");

    /* Evaluation: no gradient buffer, the same statistics to the bit. */
    float *dstats2 = cpu_dalloc(2 * ROWS * sizeof(float));
    cr_assert_eq(cpu_dev->iface->softmax_xent(cpu_dev, dl, dlab, ROWS, COLS, scale, NULL, dstats2),
                 CASTOR_OK);
    float *stats2 = cpu_down(dstats2, 2 * ROWS);
    cr_assert_eq(memcmp(stats, stats2, 2 * ROWS * sizeof(float)), 0);

    /* A label outside the row is refused rather than read past the row:
     * when the kernel runs, so the device's synchronize says so, as a
     * GPU's reports a failed kernel. */
    int32_t bad = COLS;
    cpu_put(dlab, &bad, sizeof bad);
    cr_assert_eq(cpu_dev->iface->softmax_xent(cpu_dev, dl, dlab, 1, COLS, 1.0f, NULL, dstats2),
                 CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_INVALID);
    cr_assert(strstr(cpu_dev->errmsg, "label 10"), "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_OK, "reported once");
    cr_assert_eq(cpu_dev->iface->softmax_xent(cpu_dev, dl, NULL, ROWS, COLS, 1.0f, NULL, dstats2),
                 CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->softmax_xent(cpu_dev, dl, dlab, 0, COLS, 1.0f, NULL, dstats2),
                 CASTOR_OK);

    cpu_release(dl, n), cpu_release(dgrad, n), cpu_release(dstats, 2 * ROWS),
        cpu_release(dstats2, 2 * ROWS);
    castor__cdev_free(cpu_dev, dlab, sizeof labels);
    free(grad), free(stats), free(stats2), free(logits);
    cr_assert_eq(cpu_dev->used, 0);
}

/* A row with a NaN logit is no correct prediction, whichever column its
 * argmax stops at: a model whose outputs were all NaN kept argmax at column
 * 0 and scored the share of label 0 as its accuracy (0.335 on a data set
 * of three classes). Rows: all NaN, label 0; NaN past the label's column;
 * an honest hit, as a control. */
Test(cpu_device, softmax_xent_counts_no_hit_in_a_nan_row)
{
    enum { R = 3, C = 3 };
    const float logits[R * C] = {NAN, NAN, NAN, 5.0f, 1.0f, NAN, 5.0f, 1.0f, 2.0f};
    const int32_t labels[R] = {0, 0, 0};
    float *dl = cpu_up(logits, R * C);
    int32_t *dlab = NULL;
    cr_assert_eq(castor__cdev_alloc(cpu_dev, sizeof labels, (void **)&dlab), CASTOR_OK);
    cpu_put(dlab, labels, sizeof labels);
    float *dstats = cpu_dalloc(2 * R * sizeof(float));
    cr_assert_eq(cpu_dev->iface->softmax_xent(cpu_dev, dl, dlab, R, C, 1.0f, NULL, dstats),
                 CASTOR_OK);
    float *stats = cpu_down(dstats, 2 * R);
    cr_assert(isnan(stats[0]) && isnan(stats[2]), "the NaN rows' losses: %g %g",
              (double)stats[0], (double)stats[2]);
    cr_assert_eq(stats[1], 0.0f, "a row of NaNs counted as a hit");
    cr_assert_eq(stats[3], 0.0f, "a row with a NaN counted as a hit");
    cr_assert_eq(stats[5], 1.0f, "the control row's hit");
    cpu_release(dl, R * C), cpu_release(dstats, 2 * R);
    castor__cdev_free(cpu_dev, dlab, sizeof labels);
    free(stats);
    cr_assert_eq(cpu_dev->used, 0);
}

Test(cpu_device, mse)
{
    const int rows = 11, cols = 7;
    size_t n = (size_t)rows * cols;
    float *pred = cpu_randu(n, 2), *target = cpu_randu(n, 2);
    const float scale = 0.25f;
    float *dp = cpu_up(pred, n), *dt = cpu_up(target, n);
    float *dgrad = cpu_dalloc(n * sizeof(float)),
          *dstats = cpu_dalloc(2 * (size_t)rows * sizeof(float));
    cr_assert_eq(cpu_dev->iface->mse(cpu_dev, dp, dt, rows, cols, scale, dgrad, dstats), CASTOR_OK);
    float *grad = cpu_down(dgrad, n), *stats = cpu_down(dstats, 2 * (size_t)rows);
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
    cpu_expect_close(grad, want_grad, n, TOL, "mse dpred");
    cpu_expect_close(loss_got, want_loss, (size_t)rows, TOL, "mse loss");

    float *dstats2 = cpu_dalloc(2 * (size_t)rows * sizeof(float));
    cr_assert_eq(cpu_dev->iface->mse(cpu_dev, dp, dt, rows, cols, scale, NULL, dstats2), CASTOR_OK);
    float *stats2 = cpu_down(dstats2, 2 * (size_t)rows);
    cr_assert_eq(memcmp(stats, stats2, 2 * (size_t)rows * sizeof(float)), 0);
    cr_assert_eq(cpu_dev->iface->mse(cpu_dev, dp, dt, rows, 0, scale, NULL, dstats2),
                 CASTOR_MISUSE);

    cpu_release(dp, n), cpu_release(dt, n), cpu_release(dgrad, n);
    cpu_release(dstats, 2 * (size_t)rows), cpu_release(dstats2, 2 * (size_t)rows);
    free(pred), free(target), free(grad), free(stats), free(stats2), free(want_grad);
    free(want_loss), free(loss_got);
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
        float *p = cpu_randu(n, 1), *st = calloc(ns ? ns : 1, sizeof(float));
        float *dp = cpu_up(p, n), *ds = ns ? cpu_up(st, ns) : NULL;
        float *dg = cpu_dalloc(n * sizeof(float));
        for (int step = 1; step <= 4; step++) {
            float *g = cpu_randu(n, 1);
            cpu_put(dg, g, n * sizeof(float));
            castor__optim_apply_range(&kinds[k], p, g, ns ? st : NULL, n, step, 0, n);
            cr_assert_eq(cpu_dev->iface->optimizer_step(cpu_dev, &kinds[k], dp, dg, ds, n, step),
                         CASTOR_OK, "%s", cpu_dev->errmsg);
            free(g);
        }
        float *got = cpu_down(dp, n);
        cr_assert_eq(memcmp(got, p, n * sizeof(float)), 0, "%s (case %d): parameters differ",
                     castor_optimizer_kind_name(kinds[k].kind), k);
        if (ns) {
            float *gst = cpu_down(ds, ns);
            cr_assert_eq(memcmp(gst, st, ns * sizeof(float)), 0, "%s (case %d): state differs",
                         castor_optimizer_kind_name(kinds[k].kind), k);
            free(gst);
            cpu_release(ds, ns);
        }
        cpu_release(dp, n), cpu_release(dg, n);
        free(p), free(st), free(got);
    }

    float *d = cpu_dalloc(4 * sizeof(float));
    cr_assert_eq(cpu_dev->iface->optimizer_step(cpu_dev, &kinds[3], d, d, NULL, 4, 1),
                 CASTOR_MISUSE, "Adam without state");
    cr_assert(strstr(cpu_dev->errmsg, "state"), "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->optimizer_step(cpu_dev, &kinds[1], d, d, NULL, 4, 1),
                 CASTOR_MISUSE, "momentum without state");
    cr_assert_eq(cpu_dev->iface->optimizer_step(cpu_dev, NULL, d, d, d, 4, 1), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->optimizer_step(cpu_dev, &kinds[0], d, d, NULL, 4, 0),
                 CASTOR_MISUSE, "steps count from 1");
    castor_optimizer bogus = kinds[0];
    bogus.kind = (castor_optimizer_kind)9;
    cr_assert_eq(cpu_dev->iface->optimizer_step(cpu_dev, &bogus, d, d, d, 4, 1), CASTOR_INVALID);
    cpu_release(d, 4);
}

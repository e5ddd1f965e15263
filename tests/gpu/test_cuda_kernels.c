/*
 * The CUDA kernels against the CPU backend's: GEMM (fp32, TF32, k == 0),
 * bias, activations, softmax cross-entropy and MSE, add, and the optimizer.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

/* ---- GEMM, every transpose, with padded leading dimensions ---- */

/* Returns the error relative to C's largest entry. */
static double gemm_case(twin *t, int ta, int tb, int m, int n, int k, int pad, float beta,
                        double tol, uint64_t *s)
{
    /* Stored shapes: A is m x k (k x m transposed), B is k x n (n x k). */
    int a_rows = ta ? k : m, a_cols = ta ? m : k;
    int b_rows = tb ? n : k, b_cols = tb ? k : n;
    /* At least 1, as BLAS wants even for an empty operand (k == 0). */
    int lda = (a_cols > 1 ? a_cols : 1) + pad, ldb = (b_cols > 1 ? b_cols : 1) + pad;
    int ldc = n + pad;
    size_t na = (size_t)a_rows * lda, nb = (size_t)b_rows * ldb, nc = (size_t)m * ldc;
    float *ha = rand_floats(s, na, -1, 1), *hb = rand_floats(s, nb, -1, 1);
    float *hc = rand_floats(s, nc, -1, 1);
    if (beta == 0.0f) {
        /* beta 0 means C is written, not read: stale NaNs must not leak in
         * (the replica hands uninitialised activations to gemm). */
        for (int r = 0; r < m; r++)
            for (int c = 0; c < n; c++)
                hc[(size_t)r * ldc + c] = NAN;
    }
    tbuf a = tb_up(t, ha, na * sizeof(float)), b = tb_up(t, hb, nb * sizeof(float));
    tbuf c = tb_up(t, hc, nc * sizeof(float));
    ON_BOTH(*t, d->iface->gemm(d, ta, tb, m, n, k, 0.75f, F(a, i), lda, F(b, i), ldb, beta,
                               F(c, i), ldc));
    float *rg = alloc_floats(nc), *rc = alloc_floats(nc);
    tb_down(t, &c, rg, rc);
    char what[128];
    snprintf(what, sizeof what, "gemm ta=%d tb=%d %dx%dx%d pad %d beta %g%s", ta, tb, m, n, k,
             pad, (double)beta, tol > TOL_FP32 ? " tf32" : "");
    double err = expect_close_norm(what, rg, rc, nc, tol);
    if (k == 0) {
        /* C = beta C exactly, on both: beta 0 writes zeros over the NaNs,
         * beta 1 leaves C alone, and the padding is never touched. */
        for (size_t i = 0; i < nc; i++) {
            int col = (int)(i % (size_t)ldc);
            float want = col >= n || beta == 1.0f ? hc[i] : beta == 0.0f ? 0.0f : beta * hc[i];
            if (!(rg[i] == want || (isnan(rg[i]) && isnan(want))) ||
                !(rc[i] == want || (isnan(rc[i]) && isnan(want)))) {
                cr_expect_fail("%s: C[%zu] is %g on the GPU and %g on the CPU, want %g", what, i,
                               (double)rg[i], (double)rc[i], (double)want);
                break;
            }
        }
    }
    tb_free(t, &a);
    tb_free(t, &b);
    tb_free(t, &c);
    free(ha);
    free(hb);
    free(hc);
    free(rg);
    free(rc);
    return err;
}

/* Returns the largest error of the Fashion-MNIST model's shapes (k >= 128). */
static double gemm_all(int tf32, double tol)
{
    static const int shapes[][3] = {
        {1, 1, 1}, {37, 29, 53}, {5, 300, 7}, {64, 128, 256},
        /* the Fashion-MNIST model's: forward, weight gradient, input gradient */
        {256, 128, 784}, {784, 128, 256}, {256, 784, 128},
    };
    twin t = twin_open(tf32);
    uint64_t s = 42;
    double big_err = 0.0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad <= 3; pad += 3) {
                    double e = gemm_case(&t, ta, tb, shapes[i][0], shapes[i][1], shapes[i][2],
                                         pad, pad ? -0.5f : 0.0f, tol, &s);
                    if (shapes[i][2] >= 128)
                        big_err = fmax(big_err, e);
                }
    twin_close(&t);
    return big_err;
}

Test(cuda, gemm_fp32)
{
    REQUIRE_GPU();
    gemm_all(0, TOL_FP32);
}

Test(cuda, gemm_tf32)
{
    REQUIRE_GPU();
    double err = gemm_all(1, TOL_TF32);
    /* TF32 tensor cores came with sm_80 (Ampere): on sm_75, which CUDA 13
     * still runs, cuBLAS computes in fp32 whatever the math mode, and no
     * change can be asked for. */
    castor_device_info info;
    cr_assert_eq(castor__cdev_cuda_info(0, &info), CASTOR_OK);
    if (info.compute_major < 8) {
        cr_log_info("sm_%d%d has no TF32: the largest GEMM error is %.3g, as fp32's",
                    info.compute_major, info.compute_minor, err);
        return;
    }
    /* Within TF32's tolerance is not enough: fp32 passes that too. TF32
     * rounds the inputs to 10 mantissa bits, ~1e-4 of C's largest entry at
     * these shapes, against ~1e-6 for fp32: an error below the fp32
     * tolerance means the flag never reached cuBLAS's math mode. */
    cr_expect(err > TOL_FP32, "--tf32 changed nothing: the largest GEMM error at the model's "
              "shapes is %.3g, within fp32's %.1g", err, TOL_FP32);
}

/* k == 0: an empty product, so C = beta C as BLAS (and the CPU backend)
 * define it, with beta 0 writing zeros rather than 0 * NaN. pad 0 is the
 * contiguous case (ldc == n), pad 3 the strided one. */
Test(cuda, gemm_k0)
{
    REQUIRE_GPU();
    static const int shapes[][2] = {{1, 1}, {37, 29}, {5, 300}, {300, 5}};
    static const float betas[] = {0.0f, 1.0f, -0.5f, 2.0f};
    twin t = twin_open(0);
    uint64_t s = 43;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t b = 0; b < sizeof betas / sizeof betas[0]; b++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int pad = 0; pad <= 3; pad += 3)
                        gemm_case(&t, ta, tb, shapes[i][0], shapes[i][1], 0, pad, betas[b],
                                  TOL_FP32, &s);
    twin_close(&t);
}

/* k == 0 on a C of more than INT_MAX elements (8 GiB), contiguous: the
 * scaling must reach the last row, which an int element count would not.
 * GPU only (the CPU reference would need as much host memory again). */
Test(cuda, gemm_k0_past_int_max)
{
    REQUIRE_GPU();
    char err[384] = "";
    cdev *g = NULL;
    cr_assert_eq(castor__cdev_cuda_create(0, 0, 0, 0, &g, err, sizeof err), CASTOR_OK, "%s", err);
    const int n = 1 << 16, m = (1 << 15) + 1;  /* m * n = 2^31 + 2^16 */
    const size_t count = (size_t)m * (size_t)n, bytes = count * sizeof(float);
    void *c = NULL, *ab = NULL;
    int rc = castor__cdev_alloc(g, bytes, &c);
    if (rc == CASTOR_DEVICE_MEMORY) {
        char why[sizeof g->errmsg];
        snprintf(why, sizeof why, "%s", g->errmsg);
        castor__cdev_destroy(g);
        cr_skip_test("needs %zu bytes of free GPU memory: %s", bytes, why);
    }
    cr_assert_eq(rc, CASTOR_OK, "%s", g->errmsg);
    CHECK_RC(g, castor__cdev_alloc(g, 64, &ab)); /* A (m x 0) and B (0 x n): never read */
    const size_t chunk = (size_t)1 << 24;
    float *h = alloc_floats(chunk);
    for (size_t i = 0; i < chunk; i++)
        h[i] = 3.0f;
    for (size_t off = 0; off < count; off += chunk) {
        size_t len = count - off < chunk ? count - off : chunk;
        CHECK_RC(g, g->iface->copy_h2d(g, CDEV_STREAM_COMPUTE, (float *)c + off, h,
                                       len * sizeof(float)));
    }
    CHECK_RC(g, g->iface->synchronize(g));
    /* The first row, the one holding element INT_MAX, and the last. */
    const int rows[] = {0, (int)(((size_t)1 << 31) / (size_t)n) - 1, m - 1};
    static const float betas[] = {0.5f, 0.0f};
    static const float want[] = {1.5f, 0.0f};
    for (int b = 0; b < 2; b++) {
        CHECK_RC(g, g->iface->gemm(g, 0, 0, m, n, 0, 1.0f, ab, 1, ab, n, betas[b], c, n));
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            CHECK_RC(g, g->iface->copy_d2h(g, CDEV_STREAM_COMPUTE, h,
                                           (float *)c + (size_t)rows[r] * (size_t)n,
                                           (size_t)n * sizeof(float)));
            CHECK_RC(g, g->iface->synchronize(g));
            for (int col = 0; col < n; col++)
                if (h[col] != want[b]) {
                    cr_expect_fail("beta %g: C[%d][%d] is %g, want %g", (double)betas[b],
                                   rows[r], col, (double)h[col], (double)want[b]);
                    break;
                }
        }
    }
    free(h);
    castor__cdev_free(g, ab, 64);
    castor__cdev_free(g, c, bytes);
    castor__cdev_destroy(g);
}

/* ---- bias ---- */

Test(cuda, bias_add_and_grad)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    uint64_t s = 7;
    /* 8193 x 257: more than one pass of bias_add's grid-stride loop. */
    static const int shapes[][2] = {{1, 1},    {67, 45}, {256, 128},
                                    {1000, 10}, {3, 1000}, {8193, 257}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int rows = shapes[k][0], cols = shapes[k][1];
        size_t n = (size_t)rows * cols;
        float *hy = rand_floats(&s, n, -2, 2), *hb = rand_floats(&s, (size_t)cols, -1, 1);
        tbuf y = tb_up(&t, hy, n * sizeof(float)), b = tb_up(&t, hb, cols * sizeof(float));
        ON_BOTH(t, d->iface->bias_add(d, F(y, i), F(b, i), rows, cols));
        float *rg = alloc_floats(n), *rc = alloc_floats(n);
        tb_down(&t, &y, rg, rc);
        expect_close("bias_add", rg, rc, n, 1e-6, TOL_FP32);

        /* Gradient of the (now biased) y, twice on the GPU: bit-identical. */
        ON_BOTH(t, d->iface->bias_grad(d, F(y, i), F(b, i), rows, cols));
        float *gg = alloc_floats(cols), *gc = alloc_floats(cols), *again = alloc_floats(cols);
        tb_down(&t, &b, gg, gc);
        expect_close_norm("bias_grad", gg, gc, (size_t)cols, TOL_FP32);
        cdev *g = t.dev[GPU];
        CHECK_RC(g, g->iface->memset0(g, CDEV_STREAM_COMPUTE, b.d[GPU], cols * sizeof(float)));
        CHECK_RC(g, g->iface->bias_grad(g, F(y, GPU), F(b, GPU), rows, cols));
        CHECK_RC(g, g->iface->copy_d2h(g, CDEV_STREAM_COMPUTE, again, b.d[GPU],
                                       cols * sizeof(float)));
        CHECK_RC(g, g->iface->synchronize(g));
        cr_expect(memcmp(again, gg, cols * sizeof(float)) == 0,
                  "bias_grad %dx%d is not run-to-run deterministic", rows, cols);
        tb_free(&t, &y);
        tb_free(&t, &b);
        free(hy);
        free(hb);
        free(rg);
        free(rc);
        free(gg);
        free(gc);
        free(again);
    }
    twin_close(&t);
}

/* ---- activations ---- */

Test(cuda, activations)
{
    REQUIRE_GPU();
    static const castor_activation acts[] = {CASTOR_ACT_LINEAR, CASTOR_ACT_RELU,
                                             CASTOR_ACT_TANH, CASTOR_ACT_SIGMOID};
    static const char *names[] = {"linear", "relu", "tanh", "sigmoid"};
    twin t = twin_open(0);
    uint64_t s = 11;
    const size_t n = BIG_N;
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
        float *hx = rand_floats(&s, n, -6, 6), *hdy = rand_floats(&s, n, -1, 1);
        hx[0] = 0.0f;  /* relu's kink */
        tbuf y = tb_up(&t, hx, n * sizeof(float));
        ON_BOTH(t, d->iface->act_forward(d, acts[a], F(y, i), n));
        float *yg = alloc_floats(n), *yc = alloc_floats(n);
        tb_down(&t, &y, yg, yc);
        char what[64];
        snprintf(what, sizeof what, "%s forward", names[a]);
        expect_close(what, yg, yc, n, 1e-6, TOL_FP32);

        /* Backward from one forward output (the CPU's), so both start equal. */
        tbuf yy = tb_up(&t, yc, n * sizeof(float)), dy = tb_up(&t, hdy, n * sizeof(float));
        ON_BOTH(t, d->iface->act_backward(d, acts[a], F(yy, i), F(dy, i), n));
        float *dg = alloc_floats(n), *dc = alloc_floats(n);
        tb_down(&t, &dy, dg, dc);
        snprintf(what, sizeof what, "%s backward", names[a]);
        expect_close(what, dg, dc, n, 1e-6, TOL_FP32);
        tb_free(&t, &y);
        tb_free(&t, &yy);
        tb_free(&t, &dy);
        free(hx);
        free(hdy);
        free(yg);
        free(yc);
        free(dg);
        free(dc);
    }
    twin_close(&t);
}

/* ---- losses ---- */

static void softmax_case(twin *t, int rows, int cols, float spread, int with_grad, uint64_t *s)
{
    size_t n = (size_t)rows * cols;
    float *hx = rand_floats(s, n, -spread, spread);
    int32_t *hl = malloc((size_t)rows * sizeof *hl);
    cr_assert(hl);
    for (int r = 0; r < rows; r++)
        hl[r] = (int32_t)(rng_next(s) % (uint64_t)cols);
    float scale = 1.0f / (float)rows;
    tbuf x = tb_up(t, hx, n * sizeof(float)), l = tb_up(t, hl, (size_t)rows * sizeof(int32_t));
    tbuf dx = tb_alloc(t, n * sizeof(float)), st = tb_alloc(t, 2 * (size_t)rows * sizeof(float));
    ON_BOTH(*t, d->iface->softmax_xent(d, F(x, i), (const int32_t *)l.d[i], rows, cols, scale,
                                       with_grad ? F(dx, i) : NULL, F(st, i)));
    float *sg = alloc_floats(2 * (size_t)rows), *sc = alloc_floats(2 * (size_t)rows);
    tb_down(t, &st, sg, sc);
    char what[96];
    for (int r = 0; r < rows; r++) {
        snprintf(what, sizeof what, "softmax_xent %dx%d row %d loss", rows, cols, r);
        /* Absolute below 0.1: a confident row's loss is log(1 + tiny), where
         * one ulp of the sum is all the difference. */
        expect_close(what, &sg[2 * r], &sc[2 * r], 1, 0.1, TOL_FP32);
        cr_expect_eq(sg[2 * r + 1], sc[2 * r + 1], "softmax_xent %dx%d row %d: correct %g vs %g",
                     rows, cols, r, (double)sg[2 * r + 1], (double)sc[2 * r + 1]);
    }
    if (with_grad) {
        float *gg = alloc_floats(n), *gc = alloc_floats(n);
        tb_down(t, &dx, gg, gc);
        snprintf(what, sizeof what, "softmax_xent %dx%d dlogits", rows, cols);
        /* Absolute below a tenth of the scale: p - 1 cancels for confident rows. */
        expect_close(what, gg, gc, n, 0.1 * scale, TOL_FP32);
        free(gg);
        free(gc);
    }
    tb_free(t, &x);
    tb_free(t, &l);
    tb_free(t, &dx);
    tb_free(t, &st);
    free(hx);
    free(hl);
    free(sg);
    free(sc);
}

Test(cuda, softmax_xent)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    uint64_t s = 3;
    softmax_case(&t, 65, 10, 3, 1, &s);
    softmax_case(&t, 65, 10, 3, 0, &s);
    softmax_case(&t, 7, 1000, 5, 1, &s);
    softmax_case(&t, 3, 1, 1, 1, &s);
    softmax_case(&t, 256, 37, 8, 1, &s);
    twin_close(&t);
}

/* Ties go to the first maximum; huge logits must not overflow. Checked
 * against values worked out here, not only against the CPU. */
Test(cuda, softmax_xent_ties_and_large_logits)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    enum { ROWS = 4, COLS = 4 };
    const float hx[ROWS * COLS] = {
        1, 3, 3, 0,          /* label 1: the first of two maxima -> correct */
        1, 3, 3, 0,          /* label 2: the second -> not correct */
        2e4f, -3e4f, 0, 1e4f, /* label 3: loss 1e4, exp(-1e4) underflows */
        5, 5, 5, 5,          /* label 3: all tied -> not correct, loss log 4 */
    };
    const int32_t hl[ROWS] = {1, 2, 3, 3};
    const double want_loss[ROWS] = {log(exp(1 - 3.0) + 2 + exp(0 - 3.0)),
                                    log(exp(1 - 3.0) + 2 + exp(0 - 3.0)), 1e4, log(4.0)};
    const float want_correct[ROWS] = {1, 0, 0, 0};
    tbuf x = tb_up(&t, hx, sizeof hx), l = tb_up(&t, hl, sizeof hl);
    tbuf dx = tb_alloc(&t, sizeof hx), st = tb_alloc(&t, 2 * ROWS * sizeof(float));
    ON_BOTH(t, d->iface->softmax_xent(d, F(x, i), (const int32_t *)l.d[i], ROWS, COLS, 1.0f,
                                      F(dx, i), F(st, i)));
    float sg[2 * ROWS], sc[2 * ROWS], gg[ROWS * COLS], gc[ROWS * COLS];
    tb_down(&t, &st, sg, sc);
    tb_down(&t, &dx, gg, gc);
    for (int r = 0; r < ROWS; r++) {
        cr_expect(fabs(sg[2 * r] - want_loss[r]) <= 1e-5 * fmax(1.0, fabs(want_loss[r])),
                  "row %d: loss %.9g, want %.9g", r, (double)sg[2 * r], want_loss[r]);
        cr_expect_eq(sg[2 * r + 1], want_correct[r], "row %d: correct %g", r,
                     (double)sg[2 * r + 1]);
        cr_expect_eq(sc[2 * r + 1], want_correct[r], "cpu row %d: correct %g", r,
                     (double)sc[2 * r + 1]);
    }
    for (int i = 0; i < ROWS * COLS; i++)
        cr_expect(isfinite(gg[i]), "dlogits[%d] = %g", i, (double)gg[i]);
    expect_close("softmax_xent ties dlogits", gg, gc, ROWS * COLS, 1e-3, TOL_FP32);
    tb_free(&t, &x);
    tb_free(&t, &l);
    tb_free(&t, &dx);
    tb_free(&t, &st);
    twin_close(&t);
}

/* Labels are checked on the host; one that slips through must still not
 * read outside the row (which would kill the context). */
Test(cuda, softmax_xent_bad_label_does_not_fault)
{
    REQUIRE_GPU();
    char err[384] = "";
    cdev *g = NULL;
    cr_assert_eq(castor__cdev_cuda_create(0, 0, 0, 0, &g, err, sizeof err), CASTOR_OK, "%s", err);
    const float hx[2 * 3] = {1, 2, 3, 4, 5, 6};
    const int32_t hl[2] = {1 << 30, -5};
    float hs[4];
    void *x = NULL, *l = NULL, *st = NULL;
    CHECK_RC(g, castor__cdev_alloc(g, sizeof hx, &x));
    CHECK_RC(g, castor__cdev_alloc(g, sizeof hl, &l));
    CHECK_RC(g, castor__cdev_alloc(g, sizeof hs, &st));
    CHECK_RC(g, g->iface->copy_h2d(g, CDEV_STREAM_COMPUTE, x, hx, sizeof hx));
    CHECK_RC(g, g->iface->copy_h2d(g, CDEV_STREAM_COMPUTE, l, hl, sizeof hl));
    CHECK_RC(g, g->iface->softmax_xent(g, x, l, 2, 3, 1.0f, NULL, st));
    CHECK_RC(g, g->iface->copy_d2h(g, CDEV_STREAM_COMPUTE, hs, st, sizeof hs));
    CHECK_RC(g, g->iface->synchronize(g));
    cr_expect_eq(hs[1], 0.0f);
    cr_expect_eq(hs[3], 0.0f);
    castor__cdev_free(g, x, sizeof hx);
    castor__cdev_free(g, l, sizeof hl);
    castor__cdev_free(g, st, sizeof hs);
    castor__cdev_destroy(g);
}

/* The CPU backend's argmax: a scan from column 0 that moves only to a
 * greater value, so a NaN in column 0 keeps index 0 and a NaN elsewhere is
 * passed over. */
static int cpu_scan_argmax(const float *l, int cols)
{
    int best = 0;
    for (int c = 1; c < cols; c++)
        if (l[c] > l[best])
            best = c;
    return best;
}

/* The argmax when every NaN is skipped, column 0's too: what a GPU
 * reduction seeded with -inf would find, so a label there must miss. */
static int nan_skipping_argmax(const float *l, int cols)
{
    int best = -1;
    for (int c = 0; c < cols; c++)
        if (!isnan(l[c]) && (best < 0 || l[c] > l[best]))
            best = c;
    return best < 0 ? 0 : best;
}

/* NaN logits: the loss is NaN on both backends and no row with a NaN is a
 * hit, whichever column its argmax stops at (labelled with the CPU's
 * argmax or another); the row without one is a hit at the CPU's argmax
 * only. 600 columns: each of the 256 threads scans several, so the NaNs and
 * maxima land in different threads' partials and warps. */
Test(cuda, softmax_xent_nan_argmax_as_on_cpu)
{
    REQUIRE_GPU();
    enum { ROWS = 8, COLS = 600 };
    twin t = twin_open(0);
    uint64_t s = 23;
    float *hx = rand_floats(&s, (size_t)ROWS * COLS, -1, 1);
#define X(r, c) hx[(size_t)(r) * COLS + (c)]
    X(0, 0) = NAN, X(0, 450) = 5;                   /* NaN first: index 0 */
    for (int c = 0; c < COLS; c++)                   /* all NaN: index 0 */
        X(1, c) = NAN;
    X(2, 300) = NAN, X(2, 450) = 5;                  /* NaN later: skipped, 450 */
    X(3, 0) = 3, X(3, 7) = NAN, X(3, 299) = 3;       /* tie with column 0: 0 */
    for (int c = 0; c < COLS; c++)                   /* -inf and NaN only: 0 */
        X(4, c) = c % 2 ? NAN : -INFINITY;
    X(5, 0) = NAN, X(5, 1) = NAN, X(5, 599) = 9;     /* NaN first, max last: 0 */
    X(6, 0) = -7, X(6, 100) = NAN, X(6, 256) = 7, X(6, 512) = 7;  /* 256 */
    X(7, 599) = 4;                                   /* no NaN: 599 */
#undef X
    static const int want_best[ROWS] = {0, 0, 450, 0, 0, 0, 256, 599};
    int32_t hit[ROWS], miss[ROWS];
    for (int r = 0; r < ROWS; r++) {
        const float *row = hx + (size_t)r * COLS;
        hit[r] = cpu_scan_argmax(row, COLS);
        cr_assert_eq(hit[r], want_best[r], "row %d: the reference scan gives %d", r, hit[r]);
        int other = nan_skipping_argmax(row, COLS);
        miss[r] = other != hit[r] ? other : (hit[r] + 1) % COLS;
    }
    const size_t n = (size_t)ROWS * COLS;
    tbuf x = tb_up(&t, hx, n * sizeof(float));
    tbuf dx = tb_alloc(&t, n * sizeof(float)), st = tb_alloc(&t, 2 * ROWS * sizeof(float));
    const int32_t *labels[2] = {hit, miss};
    for (int pass = 0; pass < 2; pass++) {
        tbuf l = tb_up(&t, labels[pass], ROWS * sizeof(int32_t));
        ON_BOTH(t, d->iface->softmax_xent(d, F(x, i), (const int32_t *)l.d[i], ROWS, COLS, 1.0f,
                                          F(dx, i), F(st, i)));
        float sg[2 * ROWS], sc[2 * ROWS];
        tb_down(&t, &st, sg, sc);
        for (int r = 0; r < ROWS; r++) {
            const float want = pass == 0 && r == ROWS - 1 ? 1.0f : 0.0f;
            cr_expect_eq(sc[2 * r + 1], want, "cpu row %d label %d: correct %g", r,
                         labels[pass][r], (double)sc[2 * r + 1]);
            cr_expect_eq(sg[2 * r + 1], sc[2 * r + 1], "row %d label %d: correct %g, cpu %g", r,
                         labels[pass][r], (double)sg[2 * r + 1], (double)sc[2 * r + 1]);
            if (r < ROWS - 1)
                cr_expect(isnan(sg[2 * r]) && isnan(sc[2 * r]),
                          "row %d has a NaN: loss %g on the GPU, %g on the CPU", r,
                          (double)sg[2 * r], (double)sc[2 * r]);
            else
                expect_close("softmax_xent NaN test, finite row loss", &sg[2 * r], &sc[2 * r],
                             1, 0.1, TOL_FP32);
        }
        tb_free(&t, &l);
    }
    tb_free(&t, &x);
    tb_free(&t, &dx);
    tb_free(&t, &st);
    free(hx);
    twin_close(&t);
}

Test(cuda, mse)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    uint64_t s = 5;
    static const int shapes[][2] = {{33, 17}, {1, 1}, {4, 1000}, {256, 10}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        for (int with_grad = 0; with_grad < 2; with_grad++) {
            int rows = shapes[k][0], cols = shapes[k][1];
            size_t n = (size_t)rows * cols;
            float *hp = rand_floats(&s, n, -2, 2), *ht = rand_floats(&s, n, -2, 2);
            float scale = 1.0f / (float)rows;
            tbuf p = tb_up(&t, hp, n * sizeof(float)), tg = tb_up(&t, ht, n * sizeof(float));
            tbuf dp = tb_alloc(&t, n * sizeof(float));
            tbuf st = tb_alloc(&t, 2 * (size_t)rows * sizeof(float));
            ON_BOTH(t, d->iface->mse(d, F(p, i), F(tg, i), rows, cols, scale,
                                     with_grad ? F(dp, i) : NULL, F(st, i)));
            float *sg = alloc_floats(2 * (size_t)rows), *sc = alloc_floats(2 * (size_t)rows);
            tb_down(&t, &st, sg, sc);
            expect_close("mse row stats", sg, sc, 2 * (size_t)rows, 1e-6, TOL_FP32);
            if (with_grad) {
                float *gg = alloc_floats(n), *gc = alloc_floats(n);
                tb_down(&t, &dp, gg, gc);
                expect_close("mse dpred", gg, gc, n, 1e-6 * scale, TOL_FP32);
                free(gg);
                free(gc);
            }
            tb_free(&t, &p);
            tb_free(&t, &tg);
            tb_free(&t, &dp);
            tb_free(&t, &st);
            free(hp);
            free(ht);
            free(sg);
            free(sc);
        }
    }
    twin_close(&t);
}

Test(cuda, add)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    uint64_t s = 9;
    const size_t n = BIG_N;
    float *ha = rand_floats(&s, n, -3, 3), *hb = rand_floats(&s, n, -3, 3);
    tbuf a = tb_up(&t, ha, n * sizeof(float)), b = tb_up(&t, hb, n * sizeof(float));
    ON_BOTH(t, d->iface->add(d, F(a, i), F(b, i), n));
    float *rg = alloc_floats(n), *rc = alloc_floats(n);
    tb_down(&t, &a, rg, rc);
    cr_expect(memcmp(rg, rc, n * sizeof(float)) == 0, "add differs from the CPU's");
    tb_free(&t, &a);
    tb_free(&t, &b);
    free(ha);
    free(hb);
    free(rg);
    free(rc);
    twin_close(&t);
}

/* ---- the optimizer, against the CPU backend's (host/optim.c) ---- */

static void optimizer_case(twin *t, castor_optimizer opt, const char *what, uint64_t *s)
{
    const size_t n = BIG_N;
    float *hp = rand_floats(s, n, -1, 1);
    tbuf p = tb_up(t, hp, n * sizeof(float));
    tbuf g = tb_alloc(t, n * sizeof(float));
    tbuf st = tb_alloc(t, 2 * n * sizeof(float));
    ON_BOTH(*t, d->iface->memset0(d, CDEV_STREAM_COMPUTE, st.d[i], st.bytes));
    static const int64_t steps[] = {1, 2, 3, 1000};
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        float *hg = rand_floats(s, n, -0.1f, 0.1f);
        for (int i = 0; i < 2; i++) {
            cdev *d = t->dev[i];
            CHECK_RC(d, d->iface->copy_h2d(d, CDEV_STREAM_COMPUTE, g.d[i], hg, g.bytes));
            CHECK_RC(d, d->iface->optimizer_step(d, &opt, F(p, i), F(g, i), F(st, i), n,
                                                 steps[k]));
            CHECK_RC(d, d->iface->synchronize(d));
        }
        free(hg);
    }
    float *pg = alloc_floats(n), *pc = alloc_floats(n);
    float *sg = alloc_floats(2 * n), *sc = alloc_floats(2 * n);
    tb_down(t, &p, pg, pc);
    tb_down(t, &st, sg, sc);
    char buf[96];
    snprintf(buf, sizeof buf, "%s params", what);
    expect_close(buf, pg, pc, n, 1e-6, TOL_FP32);
    snprintf(buf, sizeof buf, "%s state", what);
    expect_close(buf, sg, sc, 2 * n, 1e-6, TOL_FP32);
    /* Same float operations in the same order: expected to the bit. */
    if (memcmp(pg, pc, n * sizeof(float)) != 0)
        cr_log_info("%s: GPU and CPU updates agree within tolerance but not to the bit", what);
    tb_free(t, &p);
    tb_free(t, &g);
    tb_free(t, &st);
    free(hp);
    free(pg);
    free(pc);
    free(sg);
    free(sc);
}

Test(cuda, optimizer_step)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    uint64_t s = 13;
    castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
    optimizer_case(&t, sgd, "sgd", &s);
    castor_optimizer mom = sgd;
    mom.momentum = 0.9f;
    optimizer_case(&t, mom, "sgd momentum", &s);
    castor_optimizer nest = mom;
    nest.nesterov = 1;
    optimizer_case(&t, nest, "sgd nesterov", &s);
    optimizer_case(&t, castor_optimizer_defaults(CASTOR_OPT_ADAM), "adam", &s);
    castor_optimizer adamw = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
    optimizer_case(&t, adamw, "adamw", &s);
    adamw.weight_decay = 0.1f;
    adamw.learning_rate = 0.01f;
    optimizer_case(&t, adamw, "adamw strong decay", &s);
    twin_close(&t);
}

/* Every operation of the emulated device against a plain double-precision
 * reference on random inputs, and its memory rules. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "host/optim.h"
#include "src/rng.h"
#include "support.h"

static cdev *dev;
static castor__rng rng;

static void setup(void)
{
    char err[256];
    cr_assert_eq(cdev_cpu_create(0, 64 << 20, &dev, err, sizeof err), CASTOR_OK, "%s", err);
    castor__rng_seed(&rng, 1234, 7, 0);
}

static void teardown(void)
{
    cdev_destroy(dev);
}

TestSuite(cpu_device, .init = setup, .fini = teardown);

static float *randn(size_t n, float scale)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * (2.0f * castor__rng_uniform(&rng) - 1.0f);
    return v;
}

/* Host data onto the device (the copy is what a replica does). */
static float *up(const float *h, size_t n)
{
    void *d = NULL;
    cr_assert_eq(cdev_alloc(dev, n * sizeof(float), &d), CASTOR_OK, "%s", dev->errmsg);
    cr_assert_eq(cdev_copy_h2d(dev, CDEV_STREAM_H2D, d, h, n * sizeof(float)), CASTOR_OK);
    return d;
}

static float *down(const float *d, size_t n)
{
    float *h = malloc(n * sizeof *h);
    cr_assert_eq(cdev_copy_d2h(dev, CDEV_STREAM_D2H, h, d, n * sizeof(float)), CASTOR_OK);
    return h;
}

static void release(float *d, size_t n)
{
    cdev_free(dev, d, n * sizeof(float));
}

static void expect_close(const float *got, const double *want, size_t n, double tol,
                         const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs(got[i] - want[i]) / fmax(fabs(want[i]), 1.0);
        cr_assert(err <= tol, "%s: element %zu: %.9g, reference %.9g", what, i, got[i], want[i]);
    }
}

Test(cpu_device, gemm_all_transposes_and_strides)
{
    const int m = 13, n = 9, k = 17, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
            int lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
            float *a = randn((size_t)arows * lda, 1), *b = randn((size_t)brows * ldb, 1);
            float *c = randn((size_t)m * ldc, 1);
            double *want = malloc(sizeof(double) * (size_t)m * ldc);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < ldc; j++) {
                    if (j >= n) {
                        want[i * ldc + j] = c[i * ldc + j];  /* padding untouched */
                        continue;
                    }
                    double s = 0;
                    for (int p = 0; p < k; p++)
                        s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                             (double)(tb ? b[j * ldb + p] : b[p * ldb + j]);
                    want[i * ldc + j] = 0.5 * s + 0.25 * c[i * ldc + j];
                }
            float *da = up(a, (size_t)arows * lda), *db = up(b, (size_t)brows * ldb);
            float *dc = up(c, (size_t)m * ldc);
            cr_assert_eq(dev->iface->gemm(dev, ta, tb, m, n, k, 0.5f, da, lda, db, ldb, 0.25f, dc,
                                          ldc),
                         CASTOR_OK);
            float *got = down(dc, (size_t)m * ldc);
            expect_close(got, want, (size_t)m * ldc, 1e-5, ta ? (tb ? "gemm TT" : "gemm TN")
                                                              : (tb ? "gemm NT" : "gemm NN"));
            release(da, (size_t)arows * lda);
            release(db, (size_t)brows * ldb);
            release(dc, (size_t)m * ldc);
            free(a), free(b), free(c), free(want), free(got);
        }
}

Test(cpu_device, bias_and_activations)
{
    const int rows = 7, cols = 11;
    size_t n = (size_t)rows * cols;
    float *y = randn(n, 3), *b = randn((size_t)cols, 1), *dy = randn(n, 1);
    double *want = malloc(n * sizeof(double));
    float *dy_ = up(y, n), *db_ = up(b, (size_t)cols);
    cr_assert_eq(dev->iface->bias_add(dev, dy_, db_, rows, cols), CASTOR_OK);
    float *got = down(dy_, n);
    for (size_t i = 0; i < n; i++)
        want[i] = (double)y[i] + b[i % (size_t)cols];
    expect_close(got, want, n, 1e-6, "bias_add");
    free(got);

    float *dgrad = up(dy, n), *dbias = up(b, (size_t)cols);
    cr_assert_eq(dev->iface->bias_grad(dev, dgrad, dbias, rows, cols), CASTOR_OK);
    got = down(dbias, (size_t)cols);
    for (int c = 0; c < cols; c++) {
        want[c] = 0;
        for (int r = 0; r < rows; r++)
            want[c] += dy[r * cols + c];
    }
    expect_close(got, want, (size_t)cols, 1e-6, "bias_grad");
    free(got);

    castor_activation acts[] = {CASTOR_ACT_RELU, CASTOR_ACT_TANH, CASTOR_ACT_SIGMOID};
    for (int a = 0; a < 3; a++) {
        float *d = up(y, n);
        cr_assert_eq(dev->iface->act_forward(dev, acts[a], d, n), CASTOR_OK);
        float *out = down(d, n);
        for (size_t i = 0; i < n; i++) {
            double z = y[i];
            want[i] = acts[a] == CASTOR_ACT_RELU ? (z > 0 ? z : 0)
                      : acts[a] == CASTOR_ACT_TANH ? tanh(z)
                                                   : 1 / (1 + exp(-z));
        }
        expect_close(out, want, n, 1e-6, castor_activation_name(acts[a]));
        float *g = up(dy, n);
        cr_assert_eq(dev->iface->act_backward(dev, acts[a], d, g, n), CASTOR_OK);
        float *gout = down(g, n);
        for (size_t i = 0; i < n; i++) {
            double o = out[i];
            double deriv = acts[a] == CASTOR_ACT_RELU ? (o > 0) : acts[a] == CASTOR_ACT_TANH
                                                                      ? 1 - o * o
                                                                      : o * (1 - o);
            want[i] = dy[i] * deriv;
        }
        expect_close(gout, want, n, 1e-6, "act_backward");
        release(d, n);
        release(g, n);
        free(out), free(gout);
    }
    release(dy_, n), release(db_, (size_t)cols), release(dgrad, n), release(dbias, (size_t)cols);
    free(y), free(b), free(dy), free(want);
}

Test(cpu_device, softmax_xent_and_mse)
{
    const int rows = 6, cols = 5;
    size_t n = (size_t)rows * cols;
    float *logits = randn(n, 4);
    logits[0] = 1e4f;  /* a huge logit must stay finite */
    int32_t labels[6] = {0, 4, 2, 2, 1, 3};
    float *dl = up(logits, n);
    void *dlab = NULL, *dgrad = NULL, *dstats = NULL;
    cdev_alloc(dev, sizeof labels, &dlab);
    cdev_alloc(dev, n * sizeof(float), &dgrad);
    cdev_alloc(dev, 2 * rows * sizeof(float), &dstats);
    cdev_copy_h2d(dev, 0, dlab, labels, sizeof labels);
    cr_assert_eq(dev->iface->softmax_xent(dev, dl, dlab, rows, cols, 0.5f, dgrad, dstats),
                 CASTOR_OK);
    float *grad = down(dgrad, n), *stats = down(dstats, 2 * (size_t)rows);
    for (int r = 0; r < rows; r++) {
        const float *l = logits + r * cols;
        double mx = l[0], s = 0;
        int best = 0;
        for (int c = 1; c < cols; c++)
            if (l[c] > mx)
                mx = l[c], best = c;
        for (int c = 0; c < cols; c++)
            s += exp(l[c] - mx);
        double loss = log(s) + mx - l[labels[r]];
        cr_assert(fabs(stats[2 * r] - loss) <= 1e-5 * fmax(1, loss), "row %d loss %g vs %g", r,
                  stats[2 * r], loss);
        cr_assert_eq(stats[2 * r + 1], best == labels[r] ? 1.0f : 0.0f);
        for (int c = 0; c < cols; c++) {
            double want = 0.5 * (exp(l[c] - mx) / s - (c == labels[r]));
            cr_assert(fabs(grad[r * cols + c] - want) <= 1e-6, "grad %d,%d: %g vs %g", r, c,
                      grad[r * cols + c], want);
        }
    }
    free(grad), free(stats);

    float *target = randn(n, 1);
    float *dt = up(target, n);
    cr_assert_eq(dev->iface->mse(dev, dl, dt, rows, cols, 0.25f, dgrad, dstats), CASTOR_OK);
    grad = down(dgrad, n);
    stats = down(dstats, 2 * (size_t)rows);
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) {
            double d = (double)logits[r * cols + c] - target[r * cols + c];
            s += d * d;
            cr_assert(fabs(grad[r * cols + c] - 0.25 * 2 * d / cols) <= 1e-5 * fmax(1, fabs(d)));
        }
        cr_assert(fabs(stats[2 * r] - s / cols) <= 1e-5 * fmax(1, s / cols));
    }
    free(grad), free(stats), free(target), free(logits);
    release(dl, n), release(dt, n);
    cdev_free(dev, dlab, sizeof labels);
    cdev_free(dev, dgrad, n * sizeof(float));
    cdev_free(dev, dstats, 2 * rows * sizeof(float));
    cr_assert_eq(dev->used, 0);
}

Test(cpu_device, copies_really_copy)
{
    float h[4] = {1, 2, 3, 4};
    float *d = up(h, 4);
    h[0] = 99;  /* the device keeps what was copied */
    float *back = down(d, 4);
    cr_assert_eq(back[0], 1.0f);
    cr_assert_neq((void *)d, (void *)h);
    release(d, 4);
    free(back);
}

Test(cpu_device, budget_and_peak)
{
    void *a = NULL, *b = NULL;
    cr_assert_eq(cdev_alloc(dev, 40 << 20, &a), CASTOR_OK);
    int rc = cdev_alloc(dev, 30 << 20, &b);
    cr_assert_eq(rc, CASTOR_DEVICE_MEMORY);
    cr_assert_null(b);
    cr_assert(strstr(dev->errmsg, "31457280") && strstr(dev->errmsg, "67108864"), "%s",
              dev->errmsg);
    cr_assert_eq(dev->used, (size_t)40 << 20);
    cdev_free(dev, a, 40 << 20);
    cr_assert_eq(dev->used, 0);
    cr_assert_eq(dev->peak, (size_t)40 << 20);
}

Test(cpu_device, optimizer_step_is_the_host_optimizer)
{
    const size_t n = 1000;
    castor_optimizer kinds[3] = {castor_optimizer_defaults(CASTOR_OPT_SGD),
                                 castor_optimizer_defaults(CASTOR_OPT_ADAM),
                                 castor_optimizer_defaults(CASTOR_OPT_ADAMW)};
    kinds[0].momentum = 0.9f;
    for (int k = 0; k < 3; k++) {
        size_t slots = (size_t)castor__optim_slots(&kinds[k]);
        float *p = randn(n, 1), *g = randn(n, 1), *st = calloc(slots * n + 1, sizeof(float));
        float *dp = up(p, n), *dg = up(g, n), *ds = up(st, slots * n + 1);
        for (int step = 1; step <= 3; step++) {
            castor__optim_apply_range(&kinds[k], p, g, st, n, step, 0, n);
            cr_assert_eq(dev->iface->optimizer_step(dev, &kinds[k], dp, dg, ds, n, step),
                         CASTOR_OK);
        }
        float *got = down(dp, n);
        cr_assert_eq(memcmp(got, p, n * sizeof(float)), 0, "%s differs",
                     castor_optimizer_kind_name(kinds[k].kind));
        release(dp, n), release(dg, n), release(ds, slots * n + 1);
        free(p), free(g), free(st), free(got);
    }
}

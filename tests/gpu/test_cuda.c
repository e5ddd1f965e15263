/*
 * The CUDA backend against the CPU backend (make check-gpu).
 *
 * Every operation runs on both with the same inputs and the results are
 * compared by relative error, after ggml's test-backend-ops: the CPU backend
 * is the reference. With no GPU (no driver, no device, CUDA_VISIBLE_DEVICES
 * empty) every GPU test is skipped with the reason, so the suite still
 * builds, links and passes; the one test that needs no GPU checks that the
 * backend then fails cleanly.
 *
 * Tolerances: TOL_FP32 for plain fp32 (the GPU's expf/tanhf are within a
 * few ulp of glibc's, and cuBLAS sums in another order than OpenBLAS);
 * TOL_TF32 for GEMMs on TF32 tensor cores (10-bit mantissa inputs).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "device/device.h"
#include "host/pinned.h"
#include "tests/support.h"
#ifdef CASTOR_HAVE_CUDA
#include "device/cuda/nccl.h"
#endif

#define TOL_FP32 1e-5
#define TOL_TF32 1e-2
#define CPU_BUDGET ((size_t)1 << 30)
/* More elements than one pass of the element-wise kernels' grid covers
 * (kMaxBlocks 4096 x kBlock 256 = 1 << 20), and not a multiple of a block:
 * the grid-stride loops take three passes, the last with three elements. */
#define BIG_N (((size_t)1 << 21) + 3)

/* Every test that needs a GPU starts with this; cr_skip_test ends it. */
#define REQUIRE_GPU()                                                                    \
    do {                                                                                 \
        const char *why_ = NULL;                                                         \
        if (cdev_cuda_count(&why_) == 0)                                                 \
            cr_skip_test("no GPU: %s", why_ ? why_ : "(no reason given)");               \
    } while (0)

#define CHECK_RC(dev, expr)                                                              \
    do {                                                                                 \
        int rc_ = (expr);                                                                \
        cr_assert_eq(rc_, CASTOR_OK, "%s: %s returned %d: %s", (dev)->name, #expr, rc_,  \
                     (dev)->errmsg);                                                     \
    } while (0)

/* ---- random inputs ---- */

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64: reproducible inputs, no library state */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static float rng_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rng_next(s) >> 40) / (double)(1ull << 24));
}

static float *rand_floats(uint64_t *s, size_t n, float lo, float hi)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    cr_assert(p, "out of host memory");
    for (size_t i = 0; i < n; i++)
        p[i] = rng_uniform(s, lo, hi);
    return p;
}

static float *alloc_floats(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    cr_assert(p, "out of host memory");
    return p;
}

static double max_abs(const float *a, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)a[i]) > m)
            m = fabs((double)a[i]);
    return m;
}

/* |gpu - cpu| / max(|cpu|, floor) over all n; the first worst place is named. */
static void expect_close(const char *what, const float *gpu, const float *cpu, size_t n,
                         double floor, double tol)
{
    size_t at = 0;
    double e = support_max_rel_err(gpu, cpu, n, floor, &at);
    cr_expect(e < tol, "%s: relative error %.3g at [%zu] (gpu %.9g, cpu %.9g), tolerance %.1g",
              what, e, at, n ? (double)gpu[at] : 0.0, n ? (double)cpu[at] : 0.0, tol);
}

/* Normwise: errors relative to the largest reference value, for results
 * (GEMMs, column sums) whose small entries come from cancellation. */
static void expect_close_norm(const char *what, const float *gpu, const float *cpu, size_t n,
                              double tol)
{
    double scale = max_abs(cpu, n);
    expect_close(what, gpu, cpu, n, scale > 0 ? scale : 1.0, tol);
}

/* ---- the same buffers on the GPU (index 0) and the CPU device (1) ---- */

typedef struct twin {
    cdev *dev[2];
} twin;

typedef struct tbuf {
    void *d[2];
    size_t bytes;
} tbuf;

#define GPU 0
#define CPU 1

static twin twin_open(int tf32)
{
    twin t = {{NULL, NULL}};
    char err[384] = "";
    int rc = cdev_cuda_create(0, 0, 0, tf32, &t.dev[GPU], err, sizeof err);
    cr_assert_eq(rc, CASTOR_OK, "cdev_cuda_create(0): %d: %s", rc, err);
    rc = cdev_cpu_create(0, CPU_BUDGET, &t.dev[CPU], err, sizeof err);
    cr_assert_eq(rc, CASTOR_OK, "cdev_cpu_create: %d: %s", rc, err);
    return t;
}

static void twin_close(twin *t)
{
    for (int i = 0; i < 2; i++)
        cdev_destroy(t->dev[i]);
}

static tbuf tb_alloc(twin *t, size_t bytes)
{
    tbuf b = {{NULL, NULL}, bytes};
    for (int i = 0; i < 2; i++)
        CHECK_RC(t->dev[i], cdev_alloc(t->dev[i], bytes, &b.d[i]));
    return b;
}

/* Allocated and filled from host memory on both, ready when it returns. */
static tbuf tb_up(twin *t, const void *h, size_t bytes)
{
    tbuf b = tb_alloc(t, bytes);
    for (int i = 0; i < 2; i++) {
        cdev *d = t->dev[i];
        CHECK_RC(d, d->iface->copy_h2d(d, CDEV_STREAM_COMPUTE, b.d[i], h, bytes));
        CHECK_RC(d, d->iface->synchronize(d));
    }
    return b;
}

/* Both copies back to the host, after all work queued on them. */
static void tb_down(twin *t, const tbuf *b, void *h_gpu, void *h_cpu)
{
    void *h[2] = {h_gpu, h_cpu};
    for (int i = 0; i < 2; i++) {
        cdev *d = t->dev[i];
        CHECK_RC(d, d->iface->copy_d2h(d, CDEV_STREAM_COMPUTE, h[i], b->d[i], b->bytes));
        CHECK_RC(d, d->iface->synchronize(d));
    }
}

static void tb_free(twin *t, tbuf *b)
{
    for (int i = 0; i < 2; i++)
        if (b->d[i])
            cdev_free(t->dev[i], b->d[i], b->bytes);
    b->d[0] = b->d[1] = NULL;
}

#define F(b, i) ((float *)(b).d[i])

/* Run expr on both devices; inside it, d is the device and i its index. */
#define ON_BOTH(t, expr)                                                                 \
    for (int i = 0; i < 2; i++) {                                                        \
        cdev *d = (t).dev[i];                                                            \
        CHECK_RC(d, (expr));                                                             \
    }

/* ======================================================================== */

/* Runs with or without a GPU: without one, every entry point must fail
 * cleanly with a reason and no crash. */
Test(cuda, reports_missing_gpu_cleanly)
{
    const char *why = NULL;
    int count = cdev_cuda_count(&why);
    cr_expect(cdev_cuda_compiled() || count == 0, "a build without CUDA sees %d GPUs", count);
    cdev *dev = (cdev *)0x1;
    char err[384] = "";
    if (count == 0) {
        cr_assert(why && *why, "no reason given for having no GPU");
        /* Printed directly: Criterion shows skips only with --verbose, and
         * its cr_log_warn makes the run exit non-zero. */
        fprintf(stderr, "cuda: no GPU: %s; every other CUDA test is skipped "
                        "(--verbose lists them)\n", why);
        int rc = cdev_cuda_create(0, 0, 0, 0, &dev, err, sizeof err);
        cr_expect_eq(rc, CASTOR_UNSUPPORTED, "create without a GPU returned %d: %s", rc, err);
        cr_expect_null(dev);
        cr_expect(strstr(err, why) != NULL, "the error does not give the reason: '%s'", err);
        castor_device_info info;
        cr_expect_eq(cdev_cuda_info(0, &info), CASTOR_UNSUPPORTED);
        return;
    }
    int rc = cdev_cuda_create(count, 0, 0, 0, &dev, err, sizeof err);
    cr_expect_eq(rc, CASTOR_INVALID, "create(cuda:%d) returned %d: %s", count, rc, err);
    cr_expect_null(dev);
    cr_expect(strlen(err) > 0);
    rc = cdev_cuda_create(-1, 0, 0, 0, &dev, err, sizeof err);
    cr_expect_eq(rc, CASTOR_INVALID);
    castor_device_info info;
    cr_expect_eq(cdev_cuda_info(count, &info), CASTOR_INVALID);
}

Test(cuda, info)
{
    REQUIRE_GPU();
    int count = cdev_cuda_count(NULL);
    for (int g = 0; g < count; g++) {
        castor_device_info info;
        int rc = cdev_cuda_info(g, &info);
        cr_assert_eq(rc, CASTOR_OK, "cdev_cuda_info(%d) returned %d", g, rc);
        cr_log_info("cuda:%d: %s, %zu bytes, sm_%d%d, bus %s", g, info.name, info.total_memory,
                    info.compute_major, info.compute_minor, info.pci_bus_id);
        cr_expect_str_eq(info.kind, "cuda");
        cr_expect_eq(info.ordinal, g);
        cr_expect(strlen(info.name) > 0);
        cr_expect_gt(info.total_memory, (size_t)1 << 28);
        cr_expect_geq(info.compute_major, 7, "CUDA 13 needs sm_75 or newer");
        cr_expect(strchr(info.pci_bus_id, ':') != NULL, "bus id '%s'", info.pci_bus_id);
    }
}

Test(cuda, create_names_and_budget)
{
    REQUIRE_GPU();
    char err[384] = "";
    cdev *a = NULL, *b = NULL;
    cr_assert_eq(cdev_cuda_create(0, 0, 0, 0, &a, err, sizeof err), CASTOR_OK, "%s", err);
    cr_assert_eq(cdev_cuda_create(0, 2, (size_t)12345678, 1, &b, err, sizeof err), CASTOR_OK,
                 "%s", err);
    cr_expect_str_eq(a->name, "cuda:0");
    cr_expect_str_eq(b->name, "cuda:0#2");
    cr_expect_str_eq(a->iface->backend, "cuda");
    cr_expect_eq(a->ordinal, 0);
    cr_expect_gt(a->budget, (size_t)1 << 28, "budget 0 should become the free memory");
    cr_expect_eq(b->budget, (size_t)12345678);
    cr_expect_eq(a->used, (size_t)0);
    cdev_destroy(a);
    cdev_destroy(b);
}

Test(cuda, bad_stream_is_misuse)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    cdev *g = t.dev[GPU];
    void *p = NULL;
    CHECK_RC(g, cdev_alloc(g, 64, &p));
    float h[16] = {0};
    cr_expect_eq(g->iface->copy_h2d(g, 7, p, h, sizeof h), CASTOR_MISUSE);
    cr_expect(strstr(g->errmsg, "stream") != NULL, "%s", g->errmsg);
    cr_expect_eq(g->iface->memset0(g, -1, p, 64), CASTOR_MISUSE);
    CHECK_RC(g, g->iface->synchronize(g));
    cdev_free(g, p, 64);
    twin_close(&t);
}

/* The same refusal from both backends: the status asked for, and the same
 * message once each device's name is taken off the front. */
static void expect_refused(twin *t, const char *call, int want, const int rc[2])
{
    const char *msg[2];
    for (int i = 0; i < 2; i++) {
        const cdev *d = t->dev[i];
        size_t len = strlen(d->name);
        msg[i] = strncmp(d->errmsg, d->name, len) == 0 ? d->errmsg + len : d->errmsg;
    }
    cr_expect_eq(rc[CPU], want, "cpu: %s returned %d, want %d: %s", call, rc[CPU], want,
                 t->dev[CPU]->errmsg);
    cr_expect_eq(rc[GPU], want, "gpu: %s returned %d, want %d: %s", call, rc[GPU], want,
                 t->dev[GPU]->errmsg);
    cr_expect(strcmp(msg[GPU], msg[CPU]) == 0, "%s: the messages differ:\n  %s\n  %s", call,
              t->dev[GPU]->errmsg, t->dev[CPU]->errmsg);
}

/* Run expr on both devices (d, i as in ON_BOTH) and expect it refused alike. */
#define EXPECT_REFUSED(t, want, expr)                                                    \
    do {                                                                                 \
        int rc_[2];                                                                      \
        for (int i = 0; i < 2; i++) {                                                    \
            cdev *d = (t).dev[i];                                                        \
            d->errmsg[0] = '\0';                                                         \
            rc_[i] = (expr);                                                             \
        }                                                                                \
        expect_refused(&(t), #expr, (want), rc_);                                        \
    } while (0)

/* Bad arguments get the CPU backend's answer (device/cpu/cpu_device.c) from
 * the CUDA backend too, and none reaches a kernel or cuBLAS: afterwards the
 * GPU still works, with no error left behind for the next launch. */
Test(cuda, bad_arguments_refused_as_on_cpu)
{
    REQUIRE_GPU();
    enum { N = 64 };
    twin t = twin_open(0);
    tbuf x = tb_alloc(&t, N * sizeof(float)), y = tb_alloc(&t, N * sizeof(float));
    tbuf z = tb_alloc(&t, N * sizeof(float)), lab = tb_alloc(&t, N * sizeof(int32_t));
    ON_BOTH(t, d->iface->memset0(d, CDEV_STREAM_COMPUTE, x.d[i], x.bytes));
    ON_BOTH(t, d->iface->memset0(d, CDEV_STREAM_COMPUTE, lab.d[i], lab.bytes));
    float h[N] = {0};
    cdev_event *ev[2] = {NULL, NULL};
    ON_BOTH(t, d->iface->event_create(d, &ev[i]));
    const castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
    const castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    castor_optimizer bogus = sgd;
    bogus.kind = (castor_optimizer_kind)99;
    const castor_activation no_act = (castor_activation)99;
    const int32_t *L[2] = {lab.d[0], lab.d[1]};

    /* copies, streams and events */
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->memset0(d, CDEV_STREAM_COMPUTE, NULL, 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->memset0(d, CDEV_NUM_STREAMS, x.d[i], 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->copy_h2d(d, CDEV_STREAM_H2D, NULL, h, 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->copy_h2d(d, CDEV_STREAM_H2D, x.d[i], NULL, 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->copy_d2h(d, CDEV_STREAM_D2H, NULL, x.d[i], 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->copy_d2h(d, -1, h, x.d[i], 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->copy_d2d(d, CDEV_STREAM_COMPUTE, x.d[i], NULL, 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->event_create(d, NULL));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->event_record(d, NULL, CDEV_STREAM_COMPUTE));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->event_record(d, ev[i], 5));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->stream_wait(d, CDEV_STREAM_D2H, NULL));

    /* gemm: NULL operands, negative sizes, short leading dimensions */
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 0, 0, 2, 2, 2, 1.0f, NULL, 2, F(y, i), 2,
                                                    0.0f, F(z, i), 2));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 0, 0, 0, 2, 2, 1.0f, F(x, i), 2, F(y, i),
                                                    2, 0.0f, NULL, 2));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 0, 0, -1, 2, 2, 1.0f, F(x, i), 2, F(y, i),
                                                    2, 0.0f, F(z, i), 2));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 0, 0, 2, 2, -1, 1.0f, F(x, i), 2, F(y, i),
                                                    2, 0.0f, F(z, i), 2));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 0, 0, 4, 4, 8, 1.0f, F(x, i), 7, F(y, i),
                                                    4, 0.0f, F(z, i), 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 1, 0, 8, 4, 4, 1.0f, F(x, i), 4, F(y, i),
                                                    4, 0.0f, F(z, i), 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 0, 1, 2, 2, 5, 1.0f, F(x, i), 5, F(y, i),
                                                    4, 0.0f, F(z, i), 2));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 0, 0, 2, 4, 2, 1.0f, F(x, i), 2, F(y, i),
                                                    4, 0.0f, F(z, i), 3));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->gemm(d, 0, 0, 2, 2, 0, 1.0f, F(x, i), 0, F(y, i),
                                                    2, 0.0f, F(z, i), 2));

    /* layers and losses */
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->bias_add(d, NULL, F(y, i), 2, 2));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->bias_add(d, F(x, i), F(y, i), -1, 2));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->bias_grad(d, F(x, i), NULL, 2, 2));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->bias_grad(d, F(x, i), F(y, i), 2, -3));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->act_forward(d, CASTOR_ACT_RELU, NULL, 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->act_backward(d, CASTOR_ACT_TANH, F(x, i), NULL, 4));
    EXPECT_REFUSED(t, CASTOR_INVALID, d->iface->act_forward(d, no_act, F(x, i), 4));
    EXPECT_REFUSED(t, CASTOR_INVALID, d->iface->act_backward(d, no_act, F(x, i), F(y, i), 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->softmax_xent(d, F(x, i), NULL, 2, 4, 1.0f, NULL,
                                                            F(y, i)));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->softmax_xent(d, F(x, i), L[i], 2, 4, 1.0f,
                                                            F(z, i), NULL));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->softmax_xent(d, F(x, i), L[i], 2, 0, 1.0f, NULL,
                                                            F(y, i)));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->softmax_xent(d, F(x, i), L[i], -2, 4, 1.0f, NULL,
                                                            F(y, i)));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->mse(d, F(x, i), NULL, 2, 4, 1.0f, NULL, F(y, i)));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->mse(d, F(x, i), F(z, i), 2, 0, 1.0f, NULL,
                                                   F(y, i)));

    /* mirrored strategy: add and the optimizer */
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->add(d, F(x, i), NULL, 4));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->optimizer_step(d, NULL, F(x, i), F(y, i), NULL, 4,
                                                              1));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->optimizer_step(d, &sgd, NULL, F(y, i), NULL, 4,
                                                              1));
    EXPECT_REFUSED(t, CASTOR_INVALID, d->iface->optimizer_step(d, &bogus, F(x, i), F(y, i),
                                                               F(z, i), 4, 1));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->optimizer_step(d, &adam, F(x, i), F(y, i), NULL,
                                                              4, 1));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->optimizer_step(d, &sgd, F(x, i), F(y, i), NULL, 4,
                                                              0));
    EXPECT_REFUSED(t, CASTOR_MISUSE, d->iface->optimizer_step(d, &adam, F(x, i), F(y, i),
                                                              F(z, i), 4, -5));

    /* Nothing ran and nothing lingers: a real launch and a sync succeed,
     * and x is still the zeros it was set to. */
    ON_BOTH(t, d->iface->add(d, F(x, i), F(x, i), N));
    float back[2][N];
    tb_down(&t, &x, back[GPU], back[CPU]);
    for (int k = 0; k < N; k++)
        cr_expect_eq(back[GPU][k], 0.0f, "x[%d] is %g after refused calls", k,
                     (double)back[GPU][k]);
    for (int i = 0; i < 2; i++)
        t.dev[i]->iface->event_destroy(t.dev[i], ev[i]);
    tb_free(&t, &x);
    tb_free(&t, &y);
    tb_free(&t, &z);
    tb_free(&t, &lab);
    twin_close(&t);
}

Test(cuda, copies_round_trip)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    cdev *g = t.dev[GPU];
    uint64_t s = 1;
    const size_t n = 100003;
    float *h = rand_floats(&s, n, -10, 10), *back = alloc_floats(n);
    void *a = NULL, *b = NULL;
    CHECK_RC(g, cdev_alloc(g, n * sizeof(float), &a));
    CHECK_RC(g, cdev_alloc(g, n * sizeof(float), &b));
    cr_expect_eq(g->used, 2 * n * sizeof(float));

    /* Whole buffers on each stream, then an odd-sized piece at an odd offset. */
    for (int st = 0; st < CDEV_NUM_STREAMS; st++) {
        memset(back, 0, n * sizeof(float));
        CHECK_RC(g, g->iface->memset0(g, st, b, n * sizeof(float)));
        CHECK_RC(g, g->iface->copy_h2d(g, st, a, h, n * sizeof(float)));
        CHECK_RC(g, g->iface->copy_d2d(g, st, b, a, n * sizeof(float)));
        CHECK_RC(g, g->iface->copy_d2h(g, st, back, b, n * sizeof(float)));
        CHECK_RC(g, g->iface->synchronize(g));
        cr_expect(memcmp(back, h, n * sizeof(float)) == 0, "round trip on stream %d differs", st);
    }
    CHECK_RC(g, g->iface->memset0(g, CDEV_STREAM_COMPUTE, b, n * sizeof(float)));
    CHECK_RC(g, g->iface->copy_d2d(g, CDEV_STREAM_COMPUTE, (char *)b + 3, (char *)a + 5, 4097));
    CHECK_RC(g, g->iface->copy_d2h(g, CDEV_STREAM_COMPUTE, back, b, n * sizeof(float)));
    CHECK_RC(g, g->iface->synchronize(g));
    const unsigned char *hb = (const unsigned char *)h, *bb = (const unsigned char *)back;
    for (size_t i = 0; i < n * sizeof(float); i++) {
        unsigned char want = (i >= 3 && i < 3 + 4097) ? hb[i - 3 + 5] : 0;
        if (bb[i] != want) {
            cr_expect_eq(bb[i], want, "byte %zu after an unaligned d2d copy", i);
            break;
        }
    }
    cdev_free(g, a, n * sizeof(float));
    cdev_free(g, b, n * sizeof(float));
    cr_expect_eq(g->used, (size_t)0);
    free(h);
    free(back);
    twin_close(&t);
}

/* Copy in on one stream, compute on another, copy out on a third, ordered
 * only by events; big enough that a missing wait would read stale data. */
Test(cuda, events_order_streams)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    cdev *g = t.dev[GPU];
    const size_t n = (size_t)16 << 20, bytes = n * sizeof(float);
    castor__host_buf src, dst;
    cr_assert_eq(castor__host_alloc(&src, bytes, 1), CASTOR_OK);
    cr_assert_eq(castor__host_alloc(&dst, bytes, 1), CASTOR_OK);
    float *hs = src.ptr, *hd = dst.ptr;
    void *a = NULL, *b = NULL;
    CHECK_RC(g, cdev_alloc(g, bytes, &a));
    CHECK_RC(g, cdev_alloc(g, bytes, &b));
    cdev_event *copied = NULL, *computed = NULL;
    CHECK_RC(g, g->iface->event_create(g, &copied));
    CHECK_RC(g, g->iface->event_create(g, &computed));
    for (int round = 1; round <= 4; round++) {
        for (size_t i = 0; i < n; i++)
            hs[i] = (float)(round * 1000 + (int)(i % 997));
        memset(hd, 0xff, bytes);
        CHECK_RC(g, g->iface->copy_h2d(g, CDEV_STREAM_H2D, a, hs, bytes));
        CHECK_RC(g, g->iface->event_record(g, copied, CDEV_STREAM_H2D));
        CHECK_RC(g, g->iface->memset0(g, CDEV_STREAM_COMPUTE, b, bytes));
        CHECK_RC(g, g->iface->stream_wait(g, CDEV_STREAM_COMPUTE, copied));
        CHECK_RC(g, g->iface->add(g, b, a, n));
        CHECK_RC(g, g->iface->event_record(g, computed, CDEV_STREAM_COMPUTE));
        CHECK_RC(g, g->iface->stream_wait(g, CDEV_STREAM_D2H, computed));
        CHECK_RC(g, g->iface->copy_d2h(g, CDEV_STREAM_D2H, hd, b, bytes));
        CHECK_RC(g, g->iface->synchronize(g));
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (hd[i] != hs[i])
                bad = i;
        cr_expect_eq(bad, n, "round %d: element %zu is %g, not %g", round, bad,
                     bad < n ? (double)hd[bad] : 0.0, bad < n ? (double)hs[bad] : 0.0);
    }
    g->iface->event_destroy(g, copied);
    g->iface->event_destroy(g, computed);
    cdev_free(g, a, bytes);
    cdev_free(g, b, bytes);
    castor__host_free(&src);
    castor__host_free(&dst);
    twin_close(&t);
}

/* More than any GPU has, with the budget out of the way: cudaMalloc itself
 * fails, which must come back as a castor error, and the device must keep
 * working afterwards (the error must not linger for the next launch). */
Test(cuda, allocation_larger_than_the_gpu)
{
    REQUIRE_GPU();
    char err[384] = "";
    cdev *g = NULL;
    cr_assert_eq(cdev_cuda_create(0, 0, SIZE_MAX / 4, 0, &g, err, sizeof err), CASTOR_OK, "%s",
                 err);
    void *p = (void *)0x1;
    int rc = cdev_alloc(g, (size_t)1 << 50, &p);
    cr_expect(rc == CASTOR_DEVICE_MEMORY || rc == CASTOR_DEVICE, "1 PiB allocation returned %d",
              rc);
    cr_expect_null(p);
    cr_expect(strlen(g->errmsg) > 0, "no message");
    cr_expect(strstr(g->errmsg, "cuda:0") != NULL, "message does not name the device: %s",
              g->errmsg);
    cr_log_info("1 PiB allocation: %s", g->errmsg);
    cr_expect_eq(g->used, (size_t)0);

    void *q = NULL;
    CHECK_RC(g, cdev_alloc(g, 4096, &q));
    CHECK_RC(g, g->iface->memset0(g, CDEV_STREAM_COMPUTE, q, 4096));
    CHECK_RC(g, g->iface->add(g, q, q, 1024));
    CHECK_RC(g, g->iface->synchronize(g));
    cdev_free(g, q, 4096);
    cdev_destroy(g);
}

/* ---- GEMM, every transpose, with padded leading dimensions ---- */

static void gemm_case(twin *t, int ta, int tb, int m, int n, int k, int pad, float beta,
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
    expect_close_norm(what, rg, rc, nc, tol);
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
}

static void gemm_all(int tf32, double tol)
{
    static const int shapes[][3] = {
        {1, 1, 1}, {37, 29, 53}, {5, 300, 7}, {64, 128, 256},
        /* the Fashion-MNIST model's: forward, weight gradient, input gradient */
        {256, 128, 784}, {784, 128, 256}, {256, 784, 128},
    };
    twin t = twin_open(tf32);
    uint64_t s = 42;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad <= 3; pad += 3)
                    gemm_case(&t, ta, tb, shapes[i][0], shapes[i][1], shapes[i][2], pad,
                              pad ? -0.5f : 0.0f, tol, &s);
    twin_close(&t);
}

Test(cuda, gemm_fp32)
{
    REQUIRE_GPU();
    gemm_all(0, TOL_FP32);
}

Test(cuda, gemm_tf32)
{
    REQUIRE_GPU();
    gemm_all(1, TOL_TF32);
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
    cr_assert_eq(cdev_cuda_create(0, 0, 0, 0, &g, err, sizeof err), CASTOR_OK, "%s", err);
    const int n = 1 << 16, m = (1 << 15) + 1;  /* m * n = 2^31 + 2^16 */
    const size_t count = (size_t)m * (size_t)n, bytes = count * sizeof(float);
    void *c = NULL, *ab = NULL;
    int rc = cdev_alloc(g, bytes, &c);
    if (rc == CASTOR_DEVICE_MEMORY) {
        char why[sizeof g->errmsg];
        snprintf(why, sizeof why, "%s", g->errmsg);
        cdev_destroy(g);
        cr_skip_test("needs %zu bytes of free GPU memory: %s", bytes, why);
    }
    cr_assert_eq(rc, CASTOR_OK, "%s", g->errmsg);
    CHECK_RC(g, cdev_alloc(g, 64, &ab));  /* A (m x 0) and B (0 x n): never read */
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
    cdev_free(g, ab, 64);
    cdev_free(g, c, bytes);
    cdev_destroy(g);
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
    cr_assert_eq(cdev_cuda_create(0, 0, 0, 0, &g, err, sizeof err), CASTOR_OK, "%s", err);
    const float hx[2 * 3] = {1, 2, 3, 4, 5, 6};
    const int32_t hl[2] = {1 << 30, -5};
    float hs[4];
    void *x = NULL, *l = NULL, *st = NULL;
    CHECK_RC(g, cdev_alloc(g, sizeof hx, &x));
    CHECK_RC(g, cdev_alloc(g, sizeof hl, &l));
    CHECK_RC(g, cdev_alloc(g, sizeof hs, &st));
    CHECK_RC(g, g->iface->copy_h2d(g, CDEV_STREAM_COMPUTE, x, hx, sizeof hx));
    CHECK_RC(g, g->iface->copy_h2d(g, CDEV_STREAM_COMPUTE, l, hl, sizeof hl));
    CHECK_RC(g, g->iface->softmax_xent(g, x, l, 2, 3, 1.0f, NULL, st));
    CHECK_RC(g, g->iface->copy_d2h(g, CDEV_STREAM_COMPUTE, hs, st, sizeof hs));
    CHECK_RC(g, g->iface->synchronize(g));
    cr_expect_eq(hs[1], 0.0f);
    cr_expect_eq(hs[3], 0.0f);
    cdev_free(g, x, sizeof hx);
    cdev_free(g, l, sizeof hl);
    cdev_free(g, st, sizeof hs);
    cdev_destroy(g);
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

/* NaN logits: the loss is NaN on both backends and the hit flag follows the
 * CPU's argmax. 600 columns: each of the 256 threads scans several, so the
 * NaNs and maxima land in different threads' partials and warps. */
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
        const float want = pass == 0 ? 1.0f : 0.0f;
        for (int r = 0; r < ROWS; r++) {
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

/* Two logical replicas on one GPU: separate streams, handles and budgets. */
Test(cuda, logical_replicas_share_a_gpu)
{
    REQUIRE_GPU();
    char err[384] = "";
    cdev *r[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++)
        cr_assert_eq(cdev_cuda_create(0, k, (size_t)64 << 20, 0, &r[k], err, sizeof err),
                     CASTOR_OK, "%s", err);
    const size_t n = 1 << 20;
    float *h = alloc_floats(n), *back = alloc_floats(n);
    void *buf[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        CHECK_RC(r[k], cdev_alloc(r[k], n * sizeof(float), &buf[k]));
        for (size_t i = 0; i < n; i++)
            h[i] = (float)(k + 1);
        CHECK_RC(r[k], r[k]->iface->copy_h2d(r[k], CDEV_STREAM_H2D, buf[k], h,
                                             n * sizeof(float)));
        CHECK_RC(r[k], r[k]->iface->synchronize(r[k]));
    }
    for (int k = 0; k < 2; k++)
        CHECK_RC(r[k], r[k]->iface->add(r[k], buf[k], buf[k], n));
    for (int k = 0; k < 2; k++) {
        CHECK_RC(r[k], r[k]->iface->copy_d2h(r[k], CDEV_STREAM_COMPUTE, back, buf[k],
                                             n * sizeof(float)));
        CHECK_RC(r[k], r[k]->iface->synchronize(r[k]));
        cr_expect_eq(back[0], 2.0f * (float)(k + 1));
        cr_expect_eq(back[n - 1], 2.0f * (float)(k + 1));
        cdev_free(r[k], buf[k], n * sizeof(float));
    }
    /* The second replica's budget is its own: 64 MiB, so 65 MiB fails. */
    void *big = NULL;
    cr_expect_eq(cdev_alloc(r[1], (size_t)65 << 20, &big), CASTOR_DEVICE_MEMORY);
    free(h);
    free(back);
    cdev_destroy(r[0]);
    cdev_destroy(r[1]);
}

#ifdef CASTOR_HAVE_CUDA
/* ---- NCCL (mirrored strategy) ---- */

Test(cuda, nccl_refuses_two_ranks_on_one_gpu)
{
    REQUIRE_GPU();
    void *comms[2] = {(void *)0x1, (void *)0x1};
    char err[384] = "";
    const int dup[2] = {0, 0};
    cr_expect_eq(castor__nccl_group_create(2, dup, comms, err, sizeof err), CASTOR_INVALID);
    cr_expect(strstr(err, "one GPU") != NULL, "message: %s", err);
    cr_expect_null(comms[0]);
    cr_expect_null(comms[1]);
}

/* One rank: the sum over one replica is the buffer itself. */
Test(cuda, nccl_single_rank_allreduce)
{
    REQUIRE_GPU();
    void *comm = NULL;
    char err[384] = "";
    const int one[1] = {0};
    int rc = castor__nccl_group_create(1, one, &comm, err, sizeof err);
    cr_assert_eq(rc, CASTOR_OK, "ncclCommInitAll for cuda:0: %d: %s", rc, err);
    cdev *g = NULL;
    cr_assert_eq(cdev_cuda_create(0, 0, 0, 0, &g, err, sizeof err), CASTOR_OK, "%s", err);
    const size_t n = 100003;
    uint64_t s = 17;
    float *h = rand_floats(&s, n, -1, 1), *back = alloc_floats(n);
    void *d = NULL;
    CHECK_RC(g, cdev_alloc(g, n * sizeof(float), &d));
    CHECK_RC(g, g->iface->copy_h2d(g, CDEV_STREAM_COMPUTE, d, h, n * sizeof(float)));
    CHECK_RC(g, castor__nccl_allreduce_sum(comm, g, d, n));
    CHECK_RC(g, g->iface->copy_d2h(g, CDEV_STREAM_COMPUTE, back, d, n * sizeof(float)));
    CHECK_RC(g, g->iface->synchronize(g));
    cr_expect(memcmp(h, back, n * sizeof(float)) == 0, "one-rank all-reduce changed the data");
    cr_expect_eq(castor__nccl_allreduce_sum(NULL, g, d, n), CASTOR_MISUSE);
    cdev_free(g, d, n * sizeof(float));
    cdev_destroy(g);
    castor__nccl_group_free(1, &comm);
    cr_expect_null(comm);
    free(h);
    free(back);
}

typedef struct nccl_rank {
    void *comm;
    cdev *dev;
    void *d;
    size_t n;
    int rc;
} nccl_rank;

static void *nccl_rank_main(void *arg)
{
    nccl_rank *r = arg;
    r->rc = castor__nccl_allreduce_sum(r->comm, r->dev, r->d, r->n);
    if (!r->rc)
        r->rc = r->dev->iface->synchronize(r->dev);
    return NULL;
}

/* Every GPU one rank, each driven from its own thread as the replica pool
 * does: rank g holds g + 1 everywhere, so the sum is G (G + 1) / 2. */
Test(cuda, nccl_allreduce_across_gpus)
{
    REQUIRE_GPU();
    enum { MAX_G = 16 };
    int count = cdev_cuda_count(NULL);
    if (count < 2)
        cr_skip_test("needs two GPUs, this machine has %d", count);
    int G = count < MAX_G ? count : MAX_G;
    int ords[MAX_G];
    void *comms[MAX_G];
    nccl_rank ranks[MAX_G];
    pthread_t th[MAX_G];
    char err[384] = "";
    for (int g = 0; g < G; g++)
        ords[g] = g;
    int rc = castor__nccl_group_create(G, ords, comms, err, sizeof err);
    cr_assert_eq(rc, CASTOR_OK, "%s", err);
    const size_t n = (size_t)1 << 20;
    float *h = alloc_floats(n);
    for (int g = 0; g < G; g++) {
        ranks[g] = (nccl_rank){comms[g], NULL, NULL, n, 0};
        cr_assert_eq(cdev_cuda_create(g, 0, 0, 0, &ranks[g].dev, err, sizeof err), CASTOR_OK,
                     "%s", err);
        cdev *d = ranks[g].dev;
        CHECK_RC(d, cdev_alloc(d, n * sizeof(float), &ranks[g].d));
        for (size_t i = 0; i < n; i++)
            h[i] = (float)(g + 1);
        CHECK_RC(d, d->iface->copy_h2d(d, CDEV_STREAM_COMPUTE, ranks[g].d, h, n * sizeof(float)));
        CHECK_RC(d, d->iface->synchronize(d));
    }
    for (int g = 0; g < G; g++)
        cr_assert_eq(pthread_create(&th[g], NULL, nccl_rank_main, &ranks[g]), 0);
    for (int g = 0; g < G; g++)
        pthread_join(th[g], NULL);
    const float want = (float)(G * (G + 1) / 2);
    for (int g = 0; g < G; g++) {
        cdev *d = ranks[g].dev;
        cr_expect_eq(ranks[g].rc, CASTOR_OK, "%s: %s", d->name, d->errmsg);
        CHECK_RC(d, d->iface->copy_d2h(d, CDEV_STREAM_COMPUTE, h, ranks[g].d, n * sizeof(float)));
        CHECK_RC(d, d->iface->synchronize(d));
        cr_expect_eq(h[0], want, "%s: %g, want %g", d->name, (double)h[0], (double)want);
        cr_expect_eq(h[n - 1], want, "%s: %g, want %g", d->name, (double)h[n - 1], (double)want);
        cdev_free(d, ranks[g].d, n * sizeof(float));
    }
    castor__nccl_group_free(G, comms);
    for (int g = 0; g < G; g++)
        cdev_destroy(ranks[g].dev);
    free(h);
}
#endif /* CASTOR_HAVE_CUDA */

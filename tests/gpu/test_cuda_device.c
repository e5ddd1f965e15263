/*
 * The CUDA backend's device itself: the missing-GPU path, device info and
 * creation, bad arguments refused as on the CPU, copies, streams ordered by
 * events, and allocations larger than the GPU.
 */
#include <criterion/criterion.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/pinned.h"
#include "tests/gpu/gpu_support.h"

/* Runs with or without a GPU: without one, every entry point must fail
 * cleanly with a reason and no crash. */
Test(cuda, reports_missing_gpu_cleanly)
{
    const char *why = NULL;
    int count = castor__cdev_cuda_count(&why);
    cr_expect(castor__cdev_cuda_compiled() || count == 0, "a build without CUDA sees %d GPUs",
              count);
    cdev *dev = (cdev *)0x1;
    char err[384] = "";
    if (count == 0) {
        cr_assert(why && *why, "no reason given for having no GPU");
        /* Printed directly: Criterion shows skips only with --verbose, and
         * its cr_log_warn makes the run exit non-zero. */
        fprintf(stderr, "cuda: no GPU: %s; every other CUDA test is skipped "
                        "(--verbose lists them)\n", why);
        int rc = castor__cdev_cuda_create(0, 0, 0, 0, &dev, err, sizeof err);
        cr_expect_eq(rc, CASTOR_UNSUPPORTED, "create without a GPU returned %d: %s", rc, err);
        cr_expect_null(dev);
        cr_expect(strstr(err, why) != NULL, "the error does not give the reason: '%s'", err);
        castor_device_info info;
        cr_expect_eq(castor__cdev_cuda_info(0, &info), CASTOR_UNSUPPORTED);
        return;
    }
    int rc = castor__cdev_cuda_create(count, 0, 0, 0, &dev, err, sizeof err);
    cr_expect_eq(rc, CASTOR_INVALID, "create(cuda:%d) returned %d: %s", count, rc, err);
    cr_expect_null(dev);
    cr_expect(strlen(err) > 0);
    rc = castor__cdev_cuda_create(-1, 0, 0, 0, &dev, err, sizeof err);
    cr_expect_eq(rc, CASTOR_INVALID);
    castor_device_info info;
    cr_expect_eq(castor__cdev_cuda_info(count, &info), CASTOR_INVALID);
}

Test(cuda, info)
{
    REQUIRE_GPU();
    int count = castor__cdev_cuda_count(NULL);
    for (int g = 0; g < count; g++) {
        castor_device_info info;
        int rc = castor__cdev_cuda_info(g, &info);
        cr_assert_eq(rc, CASTOR_OK, "castor__cdev_cuda_info(%d) returned %d", g, rc);
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
    cr_assert_eq(castor__cdev_cuda_create(0, 0, 0, 0, &a, err, sizeof err), CASTOR_OK, "%s", err);
    cr_assert_eq(castor__cdev_cuda_create(0, 2, (size_t)12345678, 1, &b, err, sizeof err),
                 CASTOR_OK, "%s", err);
    cr_expect_str_eq(a->name, "cuda:0");
    cr_expect_str_eq(b->name, "cuda:0#2");
    cr_expect_str_eq(a->iface->backend, "cuda");
    cr_expect_eq(a->ordinal, 0);
    cr_expect_gt(a->budget, (size_t)1 << 28, "budget 0 should become the free memory");
    cr_expect_eq(b->budget, (size_t)12345678);
    cr_expect_eq(a->used, (size_t)0);
    castor__cdev_destroy(a);
    castor__cdev_destroy(b);
}

Test(cuda, bad_stream_is_misuse)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    cdev *g = t.dev[GPU];
    void *p = NULL;
    CHECK_RC(g, castor__cdev_alloc(g, 64, &p));
    float h[16] = {0};
    cr_expect_eq(g->iface->copy_h2d(g, 7, p, h, sizeof h), CASTOR_MISUSE);
    cr_expect(strstr(g->errmsg, "stream") != NULL, "%s", g->errmsg);
    cr_expect_eq(g->iface->memset0(g, -1, p, 64), CASTOR_MISUSE);
    CHECK_RC(g, g->iface->synchronize(g));
    castor__cdev_free(g, p, 64);
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
    CHECK_RC(g, castor__cdev_alloc(g, n * sizeof(float), &a));
    CHECK_RC(g, castor__cdev_alloc(g, n * sizeof(float), &b));
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
    castor__cdev_free(g, a, n * sizeof(float));
    castor__cdev_free(g, b, n * sizeof(float));
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
    CHECK_RC(g, castor__cdev_alloc(g, bytes, &a));
    CHECK_RC(g, castor__cdev_alloc(g, bytes, &b));
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
    castor__cdev_free(g, a, bytes);
    castor__cdev_free(g, b, bytes);
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
    cr_assert_eq(castor__cdev_cuda_create(0, 0, SIZE_MAX / 4, 0, &g, err, sizeof err), CASTOR_OK,
                 "%s", err);
    /* A budget larger than the GPU is held to what the GPU has free, less
     * headroom (it was taken as given: the budget check passed what
     * cudaMalloc, cuBLAS or NCCL then failed). Checked against the total
     * less the smallest headroom (256 MiB), not against what is free now:
     * under make check-gpu other tests run beside this one and take and give
     * back GBs of the GPU between the budget's reading and this one. */
    size_t free_b = 0, total_b = 0;
    cr_assert_eq(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    const size_t least_headroom = (size_t)256 << 20;
    cr_expect(g->budget > 0 && g->budget <= total_b - least_headroom,
              "budget %zu, total %zu, free now %zu", g->budget, total_b, free_b);
    void *p = (void *)0x1;
    int rc = castor__cdev_alloc(g, (size_t)1 << 50, &p);
    cr_expect_eq(rc, CASTOR_DEVICE_MEMORY, "1 PiB past the budget returned %d", rc);
    cr_expect(strstr(g->errmsg, "budget") != NULL, "%s", g->errmsg);
    /* cudaMalloc's own refusal, past the budget check. */
    p = (void *)0x1;
    rc = g->iface->alloc(g, (size_t)1 << 50, &p);
    cr_expect(rc == CASTOR_DEVICE_MEMORY || rc == CASTOR_DEVICE, "1 PiB allocation returned %d",
              rc);
    cr_expect_null(p);
    cr_expect(strlen(g->errmsg) > 0, "no message");
    cr_expect(strstr(g->errmsg, "cuda:0") != NULL, "message does not name the device: %s",
              g->errmsg);
    cr_log_info("1 PiB allocation: %s", g->errmsg);
    cr_expect_eq(g->used, (size_t)0);

    void *q = NULL;
    CHECK_RC(g, castor__cdev_alloc(g, 4096, &q));
    CHECK_RC(g, g->iface->memset0(g, CDEV_STREAM_COMPUTE, q, 4096));
    CHECK_RC(g, g->iface->add(g, q, q, 1024));
    CHECK_RC(g, g->iface->synchronize(g));
    castor__cdev_free(g, q, 4096);
    castor__cdev_destroy(g);
}

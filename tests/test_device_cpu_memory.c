/*
 * The emulated device's memory rules: copies that really copy, streams and
 * events, the budget and its peak, bad arguments, several replica threads
 * calling OpenBLAS at once, and the build without CUDA. (The suite's fixture
 * is in test_device_cpu.c's TestSuite.)
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "support.h"
#include "tests/cpu_device_support.h"

/* ---- memory, copies, streams ---- */

Test(cpu_device, copies_really_copy)
{
    float h[4] = {1, 2, 3, 4};
    float *d = cpu_up(h, 4);
    cr_assert_neq((void *)d, (void *)h);
    cr_assert_eq((uintptr_t)d % 64, 0, "device memory is 64-byte aligned");
    h[0] = 99;  /* the device keeps what was copied */
    float *back = cpu_down(d, 4);
    cr_assert_eq(back[0], 1.0f);
    /* ...and the host keeps what it was given. */
    cr_assert_eq(cpu_dev->iface->memset0(cpu_dev, CDEV_STREAM_COMPUTE, d, 4 * sizeof(float)),
                 CASTOR_OK);
    cr_assert_eq(back[1], 2.0f);
    free(back);
    back = cpu_down(d, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(back[i], 0.0f, "memset0");

    float *d2 = cpu_dalloc(4 * sizeof(float));
    float h2[4] = {5, 6, 7, 8};
    cpu_put(d, h2, sizeof h2);
    cr_assert_eq(cpu_dev->iface->copy_d2d(cpu_dev, CDEV_STREAM_COMPUTE, d2, d, sizeof h2),
                 CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->memset0(cpu_dev, CDEV_STREAM_COMPUTE, d, sizeof h2), CASTOR_OK);
    free(back);
    back = cpu_down(d2, 4);
    cr_assert_eq(memcmp(back, h2, sizeof h2), 0, "copy_d2d");

    /* The bench counts bytes across the bus: h2d twice 16, d2h three times. */
    cr_assert_eq(cpu_dev->bytes_h2d, 32);
    cr_assert_eq(cpu_dev->bytes_d2h, 48);
    cpu_release(d, 4), cpu_release(d2, 4);
    free(back);
}

/* cudaMalloc leaves memory as it was: zeros on a fresh context, a freed
 * buffer's bytes later. A replica that read memory before writing it would
 * see plausible zeros on a fresh emulated device (large allocations are
 * fresh pages): here it reads NaNs (and -1 as a label). */
Test(cpu_device, new_memory_is_not_cleared_as_cudaMalloc_memory_is_not)
{
    size_t n = (size_t)1 << 18;  /* 1 MiB: fresh zeroed pages from the system */
    float *d = cpu_dalloc(n * sizeof(float));
    float *got = cpu_down(d, n);
    for (size_t i = 0; i < n; i++)
        cr_assert(isnan(got[i]), "element %zu of new device memory is %g", i, (double)got[i]);
    free(got);
    cpu_release(d, n);

    /* A buffer freed and allocated again does not keep what was written. */
    float *small = cpu_up((float[4]){1, 2, 3, 4}, 4);
    cpu_release(small, 4);
    int32_t *labels = cpu_dalloc(4 * sizeof(int32_t)), back[4];
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, back, labels, sizeof back), CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_OK, "%s", cpu_dev->errmsg);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(back[i], -1, "label %d of new device memory is %d", i, (int)back[i]);
    castor__cdev_free(cpu_dev, labels, sizeof back);
}

Test(cpu_device, streams_and_events)
{
    cdev_event *ev = NULL;
    cr_assert_eq(cpu_dev->iface->event_create(cpu_dev, &ev), CASTOR_OK);
    cr_assert_not_null(ev);
    /* Waiting on an event never recorded is allowed (a no-op on CUDA). */
    cr_assert_eq(cpu_dev->iface->stream_wait(cpu_dev, CDEV_STREAM_COMPUTE, ev), CASTOR_OK);
    for (int s = 0; s < CDEV_NUM_STREAMS; s++) {
        cr_assert_eq(cpu_dev->iface->event_record(cpu_dev, ev, s), CASTOR_OK);
        cr_assert_eq(cpu_dev->iface->stream_wait(cpu_dev, (s + 1) % CDEV_NUM_STREAMS, ev),
                     CASTOR_OK);
    }
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_OK);
    cr_assert_eq(cpu_dev->iface->event_record(cpu_dev, ev, CDEV_NUM_STREAMS), CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "stream 3"), "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->stream_wait(cpu_dev, -1, ev), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->event_record(cpu_dev, NULL, 0), CASTOR_MISUSE);
    cpu_dev->iface->event_destroy(cpu_dev, ev);

    float h = 1.0f, *d = cpu_up(&h, 1);
    cr_assert_eq(cpu_dev->iface->copy_h2d(cpu_dev, 7, d, &h, sizeof h), CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "copy_h2d"), "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->copy_d2h(cpu_dev, 0, NULL, d, sizeof h), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->copy_d2h(cpu_dev, 0, NULL, d, 0), CASTOR_OK, "an empty copy");
    cpu_release(d, 1);
}

Test(cpu_device, budget_used_and_peak)
{
    void *a = NULL, *b = NULL, *c = NULL;
    cr_assert_eq(cpu_dev->used, 0);
    cr_assert_eq(castor__cdev_alloc(cpu_dev, 40 << 20, &a), CASTOR_OK);
    cr_assert_eq(cpu_dev->used, (size_t)40 << 20);
    cr_assert_eq(cpu_dev->peak, (size_t)40 << 20);

    b = (void *)1;
    int rc = castor__cdev_alloc(cpu_dev, 30 << 20, &b);
    cr_assert_eq(rc, CASTOR_DEVICE_MEMORY);
    cr_assert_null(b, "a failed allocation hands out NULL");
    /* The message names the device, what was asked, what is held and the
     * budget, so a user knows how far over they are. */
    cr_assert(strstr(cpu_dev->errmsg, "cpu:0") && strstr(cpu_dev->errmsg, "31457280") &&
                  strstr(cpu_dev->errmsg, "41943040") && strstr(cpu_dev->errmsg, "67108864") &&
                  strstr(cpu_dev->errmsg, "out of device memory"),
              "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->used, (size_t)40 << 20, "a refused allocation holds nothing");

    /* Exactly up to the budget is allowed; one byte more is not. */
    cr_assert_eq(castor__cdev_alloc(cpu_dev, 24 << 20, &b), CASTOR_OK, "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->used, BUDGET);
    cr_assert_eq(castor__cdev_alloc(cpu_dev, 1, &c), CASTOR_DEVICE_MEMORY);
    cr_assert_eq(cpu_dev->peak, BUDGET);

    castor__cdev_free(cpu_dev, a, 40 << 20);
    cr_assert_eq(cpu_dev->used, (size_t)24 << 20);
    cr_assert_eq(cpu_dev->peak, BUDGET, "peak is the most ever held");
    /* A request so large that used + bytes would wrap is still refused. */
    cr_assert_eq(castor__cdev_alloc(cpu_dev, SIZE_MAX, &c), CASTOR_DEVICE_MEMORY);
    cr_assert_null(c);
    castor__cdev_free(cpu_dev, b, 24 << 20);
    cr_assert_eq(cpu_dev->used, 0);

    /* Zero bytes is a valid allocation, and freeing NULL is a no-op. */
    cr_assert_eq(castor__cdev_alloc(cpu_dev, 0, &c), CASTOR_OK);
    cr_assert_not_null(c);
    castor__cdev_free(cpu_dev, c, 0);
    castor__cdev_free(cpu_dev, NULL, 100);
    castor__cdev_free(NULL, NULL, 0);
    castor__cdev_destroy(NULL);
    cr_assert_eq(cpu_dev->used, 0);
    cr_assert_eq(castor__cdev_alloc(cpu_dev, 16, NULL), CASTOR_MISUSE);
}

Test(cpu_device, null_and_negative_arguments_are_misuse)
{
    float *d = cpu_dalloc(16 * sizeof(float));
    cr_assert_eq(cpu_dev->iface->bias_add(cpu_dev, d, NULL, 2, 2), CASTOR_MISUSE);
    cr_assert(strstr(cpu_dev->errmsg, "cpu:0") && strstr(cpu_dev->errmsg, "bias_add"), "%s",
              cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->bias_add(cpu_dev, d, d, -1, 2), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->bias_grad(cpu_dev, d, d, 2, -2), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->act_forward(cpu_dev, CASTOR_ACT_TANH, NULL, 4), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->act_backward(cpu_dev, CASTOR_ACT_TANH, d, NULL, 4), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->mse(cpu_dev, d, d, -1, 2, 1.0f, NULL, d), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->mse(cpu_dev, d, d, 1, 2, 1.0f, NULL, NULL), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->add(cpu_dev, d, NULL, 4), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->memset0(cpu_dev, 0, NULL, 4), CASTOR_MISUSE);
    cr_assert_eq(cpu_dev->iface->event_create(cpu_dev, NULL), CASTOR_MISUSE);
    cpu_release(d, 16);

    char err[128] = "";
    cdev *other = (cdev *)1;
    cr_assert_eq(castor__cdev_cpu_create(-1, 0, BUDGET, &other, err, sizeof err), CASTOR_INVALID);
    cr_assert_null(other);
    cr_assert(err[0]);
    cr_assert_eq(castor__cdev_cpu_create(0, 0, BUDGET, NULL, err, sizeof err), CASTOR_MISUSE);
}

Test(cpu_device, name_and_backend)
{
    cdev *other = NULL;
    char err[128];
    cr_assert_eq(castor__cdev_cpu_create(3, 0, 1024, &other, err, sizeof err), CASTOR_OK);
    cr_assert_str_eq(other->name, "cpu:3");
    cr_assert_str_eq(other->iface->backend, "cpu");
    cr_assert_eq(other->ordinal, 3);
    cr_assert_eq(other->budget, 1024);
    void *p = NULL;
    cr_assert_eq(castor__cdev_alloc(other, 2000, &p), CASTOR_DEVICE_MEMORY);
    cr_assert(strstr(other->errmsg, "cpu:3:") == other->errmsg, "%s", other->errmsg);
    cr_assert_str_eq(cpu_dev->errmsg, "", "an error on one device leaves the others alone");
    castor__cdev_destroy(other);
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
    cdev_event *uploaded = NULL, *computed = NULL;
    if ((j->rc = castor__cdev_alloc(d, na * sizeof(float), &da)) ||
        (j->rc = castor__cdev_alloc(d, nb * sizeof(float), &db)) ||
        (j->rc = castor__cdev_alloc(d, nc * sizeof(float), &dc)))
        goto out;
    /* As a replica orders its streams: inputs, then the products, then the result. */
    if ((j->rc = d->iface->event_create(d, &uploaded)) ||
        (j->rc = d->iface->event_create(d, &computed)) ||
        (j->rc = cdev_copy_h2d(d, CDEV_STREAM_H2D, da, j->a, na * sizeof(float))) ||
        (j->rc = cdev_copy_h2d(d, CDEV_STREAM_H2D, db, j->b, nb * sizeof(float))) ||
        (j->rc = d->iface->event_record(d, uploaded, CDEV_STREAM_H2D)) ||
        (j->rc = d->iface->stream_wait(d, CDEV_STREAM_COMPUTE, uploaded)))
        goto out;
    for (int r = 0; r < j->reps && !j->rc; r++)
        j->rc = d->iface->gemm(d, 0, 0, j->m, j->n, j->k, 1.0f, da, j->k, db, j->n, 0.0f, dc,
                               j->n);
    if (!j->rc && !(j->rc = d->iface->event_record(d, computed, CDEV_STREAM_COMPUTE)) &&
        !(j->rc = d->iface->stream_wait(d, CDEV_STREAM_D2H, computed)) &&
        !(j->rc = cdev_copy_d2h(d, CDEV_STREAM_D2H, j->c, dc, nc * sizeof(float))))
        j->rc = d->iface->synchronize(d);
out:
    if (uploaded)
        d->iface->event_destroy(d, uploaded);
    if (computed)
        d->iface->event_destroy(d, computed);
    castor__cdev_free(d, da, na * sizeof(float));
    castor__cdev_free(d, db, nb * sizeof(float));
    castor__cdev_free(d, dc, nc * sizeof(float));
    return NULL;
}

Test(cpu_device, concurrent_replicas_agree_with_one)
{
    /* The same product from two replica threads at once must be bitwise
     * what one thread alone gets: central storage relies on replicas being
     * interchangeable. */
    const int m = 128, n = 128, k = 784;
    float *a = cpu_randu((size_t)m * k, 1), *b = cpu_randu((size_t)k * n, 0.1f);
    float *alone = malloc(sizeof(float) * m * n);
    gemm_job solo = {cpu_dev, a, b, alone, m, n, k, 1, 0};
    gemm_thread(&solo);
    cr_assert_eq(solo.rc, CASTOR_OK, "%s", cpu_dev->errmsg);

    cdev *devs[2];
    gemm_job jobs[2];
    pthread_t t[2];
    char err[128];
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(castor__cdev_cpu_create(i + 1, 0, BUDGET, &devs[i], err, sizeof err),
                     CASTOR_OK);
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
        castor__cdev_destroy(devs[i]);
    }
    free(a), free(b), free(alone);
}

/* ---- the build without CUDA ---- */

Test(cpu_device, cuda_absent_says_why)
{
    if (castor__cdev_cuda_compiled())
        cr_skip_test("this build has CUDA; tests/gpu covers it");
    const char *why = NULL;
    cr_assert_eq(castor__cdev_cuda_count(&why), 0);
    cr_assert_str_eq(why, "built without CUDA");
    cr_assert_eq(castor__cdev_cuda_count(NULL), 0);
    why = NULL;
    cr_assert_eq(castor_cuda_device_count(&why), 0);
    cr_assert_not_null(why);
    char err[160] = "";
    cdev *g = (cdev *)1;
    cr_assert_eq(castor__cdev_cuda_create(0, 0, 0, 0, &g, err, sizeof err), CASTOR_UNSUPPORTED);
    cr_assert_null(g);
    cr_assert(strstr(err, "without CUDA") && strstr(err, "nvcc"), "%s", err);
    castor_device_info info;
    cr_assert_eq(castor_cuda_device_info(0, &info), CASTOR_UNSUPPORTED);
    cr_assert_eq(castor_cuda_device_info(0, NULL), CASTOR_MISUSE);
}

/* The helpers declared in gpu_support.h. */
#include "tests/gpu/gpu_support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "tests/support.h"

uint64_t rng_next(uint64_t *s)
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

float *rand_floats(uint64_t *s, size_t n, float lo, float hi)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    cr_assert(p, "out of host memory");
    for (size_t i = 0; i < n; i++)
        p[i] = rng_uniform(s, lo, hi);
    return p;
}

float *alloc_floats(size_t n)
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

double expect_close(const char *what, const float *gpu, const float *cpu, size_t n, double floor,
                    double tol)
{
    size_t at = 0;
    double e = support_max_rel_err(gpu, cpu, n, floor, &at);
    cr_expect(e < tol, "%s: relative error %.3g at [%zu] (gpu %.9g, cpu %.9g), tolerance %.1g",
              what, e, at, n ? (double)gpu[at] : 0.0, n ? (double)cpu[at] : 0.0, tol);
    return e;
}

double expect_close_norm(const char *what, const float *gpu, const float *cpu, size_t n,
                         double tol)
{
    double scale = max_abs(cpu, n);
    return expect_close(what, gpu, cpu, n, scale > 0 ? scale : 1.0, tol);
}

twin twin_open(int tf32)
{
    twin t = {{NULL, NULL}};
    char err[384] = "";
    int rc = castor__cdev_cuda_create(0, 0, 0, tf32, &t.dev[GPU], err, sizeof err);
    cr_assert_eq(rc, CASTOR_OK, "castor__cdev_cuda_create(0): %d: %s", rc, err);
    rc = castor__cdev_cpu_create(0, 0, CPU_BUDGET, &t.dev[CPU], err, sizeof err);
    cr_assert_eq(rc, CASTOR_OK, "castor__cdev_cpu_create: %d: %s", rc, err);
    return t;
}

void twin_close(twin *t)
{
    for (int i = 0; i < 2; i++)
        castor__cdev_destroy(t->dev[i]);
}

tbuf tb_alloc(twin *t, size_t bytes)
{
    tbuf b = {{NULL, NULL}, bytes};
    for (int i = 0; i < 2; i++)
        CHECK_RC(t->dev[i], castor__cdev_alloc(t->dev[i], bytes, &b.d[i]));
    return b;
}

tbuf tb_up(twin *t, const void *h, size_t bytes)
{
    tbuf b = tb_alloc(t, bytes);
    for (int i = 0; i < 2; i++) {
        cdev *d = t->dev[i];
        CHECK_RC(d, d->iface->copy_h2d(d, CDEV_STREAM_COMPUTE, b.d[i], h, bytes));
        CHECK_RC(d, d->iface->synchronize(d));
    }
    return b;
}

void tb_down(twin *t, const tbuf *b, void *h_gpu, void *h_cpu)
{
    void *h[2] = {h_gpu, h_cpu};
    for (int i = 0; i < 2; i++) {
        cdev *d = t->dev[i];
        CHECK_RC(d, d->iface->copy_d2h(d, CDEV_STREAM_COMPUTE, h[i], b->d[i], b->bytes));
        CHECK_RC(d, d->iface->synchronize(d));
    }
}

void tb_free(twin *t, tbuf *b)
{
    for (int i = 0; i < 2; i++)
        if (b->d[i])
            castor__cdev_free(t->dev[i], b->d[i], b->bytes);
    b->d[0] = b->d[1] = NULL;
}

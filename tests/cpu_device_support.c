/* The emulated-device suites' fixture and helpers: see cpu_device_support.h. */
#include "tests/cpu_device_support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

cdev *cpu_dev;
castor__rng cpu_rng;

void cpu_dev_setup(void)
{
    char err[256];
    cr_assert_eq(castor__cdev_cpu_create(0, 0, BUDGET, &cpu_dev, err, sizeof err), CASTOR_OK, "%s",
                 err);
    castor__rng_seed(&cpu_rng, 1234, 7, 0);
}

void cpu_dev_teardown(void)
{
    castor__cdev_destroy(cpu_dev);
}

float *cpu_randu(size_t n, float scale)
{
    float *v = malloc((n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * (2.0f * castor__rng_uniform(&cpu_rng) - 1.0f);
    return v;
}

void *cpu_dalloc(size_t bytes)
{
    void *d = NULL;
    cr_assert_eq(castor__cdev_alloc(cpu_dev, bytes, &d), CASTOR_OK, "%s", cpu_dev->errmsg);
    return d;
}

void cpu_put(void *d, const void *h, size_t bytes)
{
    /* Ordered after what was queued before on the compute stream, and done
     * before h is reused: the copy runs when the device synchronizes. */
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_OK, "%s", cpu_dev->errmsg);
    cr_assert_eq(cdev_copy_h2d(cpu_dev, CDEV_STREAM_H2D, d, h, bytes), CASTOR_OK, "%s",
                 cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_OK, "%s", cpu_dev->errmsg);
}

float *cpu_up(const float *h, size_t n)
{
    float *d = cpu_dalloc(n * sizeof(float));
    cpu_put(d, h, n * sizeof(float));
    return d;
}

float *cpu_down(const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    cr_assert_not_null(h);
    /* What was queued on the compute stream first, with nothing to order
     * the copy stream after it but this; then the copy itself. */
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_OK, "%s", cpu_dev->errmsg);
    cr_assert_eq(cdev_copy_d2h(cpu_dev, CDEV_STREAM_D2H, h, d, n * sizeof(float)), CASTOR_OK,
                 "%s", cpu_dev->errmsg);
    cr_assert_eq(cpu_dev->iface->synchronize(cpu_dev), CASTOR_OK, "%s", cpu_dev->errmsg);
    return h;
}

void cpu_release(void *d, size_t n_floats)
{
    castor__cdev_free(cpu_dev, d, n_floats * sizeof(float));
}

void cpu_expect_close(const float *got, const double *want, size_t n, double tol,
                      const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / fmax(fabs(want[i]), 1.0);
        cr_assert(err <= tol, "%s: element %zu: %.9g, reference %.9g (error %.3g > %.3g)", what,
                  i, (double)got[i], want[i], err, tol);
    }
}

/*
 * What the emulated-device suites (tests/test_device_cpu*.c, suite
 * cpu_device) share: one CPU device per test with a 64 MiB budget, seeded
 * random inputs, and copies to and from it.
 */
#ifndef CASTOR_TEST_CPU_DEVICE_SUPPORT_H
#define CASTOR_TEST_CPU_DEVICE_SUPPORT_H

#include <stddef.h>

#include "device/device.h"
#include "src/rng.h"

/* float32 on O(1) data: a few ulps (6e-8) per term of the longest sum. */
#define TOL 1e-5
#define BUDGET ((size_t)64 << 20)

extern cdev *cpu_dev;
extern castor__rng cpu_rng;

/* The suite's .init and .fini: cpu_dev made and destroyed, cpu_rng seeded. */
void cpu_dev_setup(void);
void cpu_dev_teardown(void);
/* n floats uniform in [-scale, scale), malloc'd. */
float *cpu_randu(size_t n, float scale);
void *cpu_dalloc(size_t bytes);
/* Host data onto the device, the way a replica does it, each copy ordered
 * after the work queued before it and finished when it returns: into d, or
 * into new device memory; and back (malloc'd). */
void cpu_put(void *d, const void *h, size_t bytes);
float *cpu_up(const float *h, size_t n);
float *cpu_down(const float *d, size_t n);
void cpu_release(void *d, size_t n_floats);
/* |got - want| / max(|want|, 1) <= tol everywhere (as ggml's
 * test-backend-ops: values near zero held to an absolute bound). */
void cpu_expect_close(const float *got, const double *want, size_t n, double tol,
                      const char *what);

#endif

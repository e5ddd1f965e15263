/*
 * Helpers shared by the CUDA suite (tests/gpu/test_cuda_*.c).
 *
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
#ifndef CASTOR_TEST_GPU_SUPPORT_H
#define CASTOR_TEST_GPU_SUPPORT_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>

#include "device/device.h"

#define TOL_FP32 1e-5
#define TOL_TF32 1e-2
#define CPU_BUDGET ((size_t)1 << 30)
/* More elements than one pass of the element-wise kernels' grid covers
 * (kMaxBlocks 4096 x kBlock 256 = 1 << 20), and not a multiple of a block:
 * the grid-stride loops take three passes, the last with three elements. */
#define BIG_N (((size_t)1 << 21) + 3)

/* Every test that needs a GPU starts with this; cr_skip_test ends it. */
#define REQUIRE_GPU()                                                                              \
    do {                                                                                           \
        const char *why_ = NULL;                                                                   \
        if (castor__cdev_cuda_count(&why_) == 0)                                                   \
            cr_skip_test("no GPU: %s", why_ ? why_ : "(no reason given)");                         \
    } while (0)

#define CHECK_RC(dev, expr)                                                              \
    do {                                                                                 \
        int rc_ = (expr);                                                                \
        cr_assert_eq(rc_, CASTOR_OK, "%s: %s returned %d: %s", (dev)->name, #expr, rc_,  \
                     (dev)->errmsg);                                                     \
    } while (0)

/* ---- random inputs ---- */

/* splitmix64: the next value of the stream s. */
uint64_t rng_next(uint64_t *s);
/* n values uniform in [lo, hi), in a malloc'd buffer. */
float *rand_floats(uint64_t *s, size_t n, float lo, float hi);
/* n zeros, in a calloc'd buffer. */
float *alloc_floats(size_t n);

/* |gpu - cpu| / max(|cpu|, floor) over all n; the first worst place is named. */
double expect_close(const char *what, const float *gpu, const float *cpu, size_t n, double floor,
                    double tol);

/* Normwise: errors relative to the largest reference value, for results
 * (GEMMs, column sums) whose small entries come from cancellation. */
double expect_close_norm(const char *what, const float *gpu, const float *cpu, size_t n,
                         double tol);

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

twin twin_open(int tf32);
void twin_close(twin *t);
tbuf tb_alloc(twin *t, size_t bytes);
/* Allocated and filled from host memory on both, ready when it returns. */
tbuf tb_up(twin *t, const void *h, size_t bytes);
/* Both copies back to the host, after all work queued on them. */
void tb_down(twin *t, const tbuf *b, void *h_gpu, void *h_cpu);
void tb_free(twin *t, tbuf *b);

#define F(b, i) ((float *)(b).d[i])

/* Run expr on both devices; inside it, d is the device and i its index. */
#define ON_BOTH(t, expr)                                                                 \
    for (int i = 0; i < 2; i++) {                                                        \
        cdev *d = (t).dev[i];                                                            \
        CHECK_RC(d, (expr));                                                             \
    }

#endif

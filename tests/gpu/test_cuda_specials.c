/*
 * The CUDA kernels against the CPU backend's at special values: the
 * activations and the optimizer at NaN, inf, -0 and subnormal inputs, to the
 * bit (random finite inputs are test_cuda_kernels.c's).
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

/* ---- NaN, inf, -0 and subnormals: the two backends to the bit ----
 * Both backends use the same float operations in the same order with no
 * contraction (and nvcc's default -ftz=false), so their results are
 * expected to be the same bits for every input, the special ones included:
 * a NaN must stay a NaN (ReLU passes it on, forward and backward), -0 must
 * give what the other backend gives (+0 out of ReLU), and optimizer state
 * below FLT_MIN must be stored as +0 on both. NaNs are compared as NaNs
 * only: x86 passes a NaN operand's payload on where a GPU gives its
 * canonical NaN. */

static const float specials[] = {
    0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1.8p-127f, -0x1.8p-127f, FLT_MIN, -FLT_MIN,
    1e-20f, -3e-5f, 0.5f, -1.0f, 3.0f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN,
};
#define N_SPECIALS (sizeof specials / sizeof specials[0])

static int same_bits(float a, float b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

/* gpu and cpu equal to the bit (NaN as NaN); inputs names the inputs of the
 * first difference. */
static void expect_same_bits(const char *what, const float *gpu, const float *cpu, size_t n,
                             void (*inputs)(size_t i, char *buf, size_t len))
{
    for (size_t i = 0; i < n; i++)
        if (!same_bits(gpu[i], cpu[i])) {
            char in[160] = "";
            if (inputs)
                inputs(i, in, sizeof in);
            cr_expect_fail("%s: [%zu] (%s) is %a on the GPU, %a on the CPU", what, i, in,
                           (double)gpu[i], (double)cpu[i]);
            return;
        }
}

/* Element i of a grid over specials^k: coordinate j of i. */
static float grid_at(size_t i, int j)
{
    for (int k = 0; k < j; k++)
        i /= N_SPECIALS;
    return specials[i % N_SPECIALS];
}

static void act_inputs(size_t i, char *buf, size_t len)
{
    snprintf(buf, len, "y %a, dy %a", (double)grid_at(i, 0), (double)grid_at(i, 1));
}

/* What f gives at the special inputs where libm's and CUDA's tanhf and expf
 * are exact (NaN, the infinities, the zeros, and beyond saturation): the
 * other specials are left to the tolerance of the activations test. */
static int act_exact(castor_activation act, float x, float *want)
{
    switch (act) {
    case CASTOR_ACT_RELU:
        *want = x <= 0.0f ? 0.0f : x;  /* NaN goes on; -0 and below give +0 */
        return 1;
    case CASTOR_ACT_LINEAR:
        *want = x;
        return 1;
    case CASTOR_ACT_TANH:
        if (isnan(x) || x == 0.0f || fabsf(x) >= 1e20f) {
            *want = isnan(x) || x == 0.0f ? x : copysignf(1.0f, x);
            return 1;
        }
        return 0;
    default:  /* sigmoid */
        if (isnan(x) || x == 0.0f || fabsf(x) >= 1e20f) {
            *want = isnan(x) ? x : x == 0.0f ? 0.5f : x > 0 ? 1.0f : 0.0f;
            return 1;
        }
        return 0;
    }
}

Test(cuda, activations_at_nan_inf_and_signed_zero)
{
    REQUIRE_GPU();
    static const castor_activation acts[] = {CASTOR_ACT_LINEAR, CASTOR_ACT_RELU,
                                             CASTOR_ACT_TANH, CASTOR_ACT_SIGMOID};
    twin t = twin_open(0);
    const size_t n = N_SPECIALS * N_SPECIALS;
    float *hy = alloc_floats(n), *hdy = alloc_floats(n);
    for (size_t i = 0; i < n; i++) {
        hy[i] = grid_at(i, 0);
        hdy[i] = grid_at(i, 1);
    }
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
        const char *name = castor_activation_name(acts[a]);
        char what[96];
        /* Forward at every special value, against the value it must give. */
        float in[N_SPECIALS], want;
        memcpy(in, specials, sizeof in);
        tbuf y = tb_up(&t, in, sizeof in);
        ON_BOTH(t, d->iface->act_forward(d, acts[a], F(y, i), N_SPECIALS));
        float yg[N_SPECIALS], yc[N_SPECIALS];
        tb_down(&t, &y, yg, yc);
        for (size_t k = 0; k < N_SPECIALS; k++)
            if (act_exact(acts[a], specials[k], &want)) {
                cr_expect(same_bits(yc[k], want), "%s forward(%a): %a on the CPU, want %a",
                          name, (double)specials[k], (double)yc[k], (double)want);
                cr_expect(same_bits(yg[k], want), "%s forward(%a): %a on the GPU, want %a",
                          name, (double)specials[k], (double)yg[k], (double)want);
            }
        tb_free(&t, &y);

        /* Backward at every pair of special output and gradient: the same
         * multiplications on both, so the same bits. */
        tbuf yy = tb_up(&t, hy, n * sizeof(float)), dy = tb_up(&t, hdy, n * sizeof(float));
        ON_BOTH(t, d->iface->act_backward(d, acts[a], F(yy, i), F(dy, i), n));
        float *dg = alloc_floats(n), *dc = alloc_floats(n);
        tb_down(&t, &dy, dg, dc);
        snprintf(what, sizeof what, "%s backward", name);
        expect_same_bits(what, dg, dc, n, act_inputs);
        if (acts[a] == CASTOR_ACT_RELU)
            for (size_t i = 0; i < n; i++) {
                float w = hy[i] <= 0.0f ? 0.0f : hdy[i];  /* a NaN y passes dy on */
                if (!same_bits(dc[i], w)) {
                    cr_expect_fail("relu backward at y %a, dy %a: %a on the CPU, want %a",
                                   (double)hy[i], (double)hdy[i], (double)dc[i], (double)w);
                    break;
                }
            }
        tb_free(&t, &yy);
        tb_free(&t, &dy);
        free(dg);
        free(dc);
    }
    free(hy);
    free(hdy);
    twin_close(&t);
}

static void optim_inputs(size_t i, char *buf, size_t len)
{
    snprintf(buf, len, "p %a, g %a, s0 %a, s1 %a", (double)grid_at(i, 0), (double)grid_at(i, 1),
             (double)grid_at(i, 2), (double)grid_at(i, 3));
}

/* One step of opt over every combination of special variable, gradient and
 * state (both slots): variables and state the same bits on both backends,
 * and, where flushed, the state written holds no subnormal and no -0
 * (flushed to +0; Adam with an epsilon under 2^-39 keeps them). */
static void optimizer_specials_case(twin *t, castor_optimizer opt, int slots, int flushed,
                                    const char *what)
{
    const size_t n = N_SPECIALS * N_SPECIALS * N_SPECIALS * N_SPECIALS;
    float *hp = alloc_floats(n), *hg = alloc_floats(n), *hs = alloc_floats(2 * n);
    for (size_t i = 0; i < n; i++) {
        hp[i] = grid_at(i, 0);
        hg[i] = grid_at(i, 1);
        hs[i] = grid_at(i, 2);
        hs[n + i] = grid_at(i, 3);
    }
    tbuf p = tb_up(t, hp, n * sizeof(float)), g = tb_up(t, hg, n * sizeof(float));
    tbuf st = tb_up(t, hs, 2 * n * sizeof(float));
    ON_BOTH(*t, d->iface->optimizer_step(d, &opt, F(p, i), F(g, i), F(st, i), n, 3));
    float *pg = alloc_floats(n), *pc = alloc_floats(n);
    float *sg = alloc_floats(2 * n), *sc = alloc_floats(2 * n);
    tb_down(t, &p, pg, pc);
    tb_down(t, &st, sg, sc);
    char buf[96];
    snprintf(buf, sizeof buf, "%s at special values: variables", what);
    expect_same_bits(buf, pg, pc, n, optim_inputs);
    for (int k = 0; k < slots; k++) {
        snprintf(buf, sizeof buf, "%s at special values: state slot %d", what, k);
        expect_same_bits(buf, sg + (size_t)k * n, sc + (size_t)k * n, n, optim_inputs);
        const float *both[2] = {sg + (size_t)k * n, sc + (size_t)k * n};
        for (int b = 0; b < 2 && flushed; b++)
            for (size_t i = 0; i < n; i++) {
                float x = both[b][i];
                if ((x != 0.0f && fabsf(x) < FLT_MIN) || (x == 0.0f && signbit(x))) {
                    char in[160];
                    optim_inputs(i, in, sizeof in);
                    cr_expect_fail("%s: state slot %d [%zu] (%s) is %a on the %s, not flushed "
                                   "to +0", what, k, i, in, (double)x, b ? "CPU" : "GPU");
                    break;
                }
            }
    }
    tb_free(t, &p);
    tb_free(t, &g);
    tb_free(t, &st);
    free(hp);
    free(hg);
    free(hs);
    free(pg);
    free(pc);
    free(sg);
    free(sc);
}

Test(cuda, optimizer_step_at_nan_inf_signed_zero_and_subnormals)
{
    REQUIRE_GPU();
    twin t = twin_open(0);
    castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
    optimizer_specials_case(&t, sgd, 0, 1, "sgd");
    castor_optimizer mom = sgd;
    mom.momentum = 0.9f;
    optimizer_specials_case(&t, mom, 1, 1, "sgd momentum");
    castor_optimizer nest = mom;
    nest.nesterov = 1;
    optimizer_specials_case(&t, nest, 1, 1, "sgd nesterov");
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    optimizer_specials_case(&t, adam, 2, 1, "adam");
    adam.epsilon = 1e-30f;
    optimizer_specials_case(&t, adam, 2, 0, "adam, epsilon 1e-30");
    castor_optimizer adamw = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
    adamw.weight_decay = 0.1f;
    optimizer_specials_case(&t, adamw, 2, 1, "adamw");
    twin_close(&t);
}

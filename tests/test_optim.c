/*
 * host/optim.c against the textbook optimizers, computed here in double
 * precision with different (but mathematically equal) algebra.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host/optim.h"
#include "host/pool.h"
#include "host/reduce.h"
#include "host/update.h"

#define N_VARS 1031  /* four full kernel blocks and a ragged tail */
#define STEPS 7
/* Relative error allowed against the double reference. Errors below
 * FLOOR_FRACTION of the array's largest value are measured against that
 * instead, so values that pass near zero do not blow up the ratio. */
#define TOL 1e-5
#define FLOOR_FRACTION 0.1

/* splitmix64: a fixed stream, so a failure reproduces. */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static float uniform(uint64_t *state, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(next_u64(state) >> 40) / (double)(1u << 24));
}

static void fill(uint64_t *rng, float *dst, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = uniform(rng, lo, hi);
}

static void expect_close(const char *what, int step, const float *got, const double *want,
                         size_t n)
{
    double largest = 0;
    for (size_t i = 0; i < n; i++)
        largest = fmax(largest, fabs(want[i]));
    double floor = FLOOR_FRACTION * largest;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / fmax(fabs(want[i]), floor);
        if (!(err <= TOL))
            cr_assert_fail("%s after step %d: first difference at [%zu]: got %.9g, want %.9g "
                           "(relative error %.3g > %g)",
                           what, step, i, (double)got[i], want[i], err, TOL);
    }
}

/* The variables, gradients and state of one run, in float (the code under
 * test) and double (the reference). */
typedef struct run {
    castor_optimizer opt;
    float params[N_VARS], grads[N_VARS], state[2 * N_VARS];
    double ref_params[N_VARS], ref_slot0[N_VARS], ref_slot1[N_VARS];
} run;

static run *run_create(castor_optimizer opt, uint64_t seed)
{
    run *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    r->opt = opt;
    uint64_t rng = seed;
    fill(&rng, r->params, N_VARS, -1.0f, 1.0f);
    for (size_t i = 0; i < N_VARS; i++)
        r->ref_params[i] = r->params[i];
    return r;
}

static void ref_sgd(run *r, int step)
{
    (void)step;
    double lr = r->opt.learning_rate;
    for (size_t i = 0; i < N_VARS; i++)
        r->ref_params[i] -= lr * r->grads[i];
}

/* Sutskever et al.'s momentum, in Keras's sign convention: the velocity
 * already holds the step to take. */
static void ref_momentum(run *r, int step)
{
    (void)step;
    double lr = r->opt.learning_rate, mu = r->opt.momentum;
    for (size_t i = 0; i < N_VARS; i++) {
        double *vel = &r->ref_slot0[i];
        *vel = mu * *vel - lr * r->grads[i];
        if (r->opt.nesterov)
            r->ref_params[i] += mu * *vel - lr * r->grads[i];
        else
            r->ref_params[i] += *vel;
    }
}

/* Kingma & Ba, Algorithm 1, with the bias corrections spelt out. Keras adds
 * epsilon to sqrt(v) before the correction, which is the paper's epsilon-hat:
 * here that is epsilon / sqrt(1 - b2^t) added to sqrt(v_hat). */
static void ref_adam(run *r, int step)
{
    double lr = r->opt.learning_rate, b1 = r->opt.beta1, b2 = r->opt.beta2;
    double eps = r->opt.epsilon;
    double c1 = 1.0 - pow(b1, step), c2 = 1.0 - pow(b2, step);
    for (size_t i = 0; i < N_VARS; i++) {
        double g = r->grads[i];
        if (r->opt.kind == CASTOR_OPT_ADAMW)
            r->ref_params[i] *= 1.0 - lr * (double)r->opt.weight_decay;
        double *m = &r->ref_slot0[i], *v = &r->ref_slot1[i];
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        double m_hat = *m / c1, v_hat = *v / c2;
        r->ref_params[i] -= lr * m_hat / (sqrt(v_hat) + eps / sqrt(c2));
    }
}

/* STEPS steps of fresh gradients in [-grad_scale, grad_scale), comparing the
 * variables and every state slot after each. */
static void check_against(castor_optimizer opt, void (*reference)(run *, int), float grad_scale)
{
    char err[256] = "";
    cr_assert_eq(castor__optim_validate(&opt, err, sizeof err), CASTOR_OK, "%s", err);
    run *r = run_create(opt, 42);
    uint64_t rng = 7;
    int slots = castor__optim_slots(&opt);
    for (int step = 1; step <= STEPS; step++) {
        fill(&rng, r->grads, N_VARS, -grad_scale, grad_scale);
        castor__optim_apply_range(&opt, r->params, r->grads, r->state, N_VARS, step, 0, N_VARS);
        reference(r, step);
        expect_close("params", step, r->params, r->ref_params, N_VARS);
        if (slots > 0)
            expect_close(castor__optim_slot_name(&opt, 0), step, r->state, r->ref_slot0, N_VARS);
        if (slots > 1)
            expect_close(castor__optim_slot_name(&opt, 1), step, r->state + N_VARS,
                         r->ref_slot1, N_VARS);
    }
    free(r);
}

Test(optim, sgd_plain)
{
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_SGD);
    opt.learning_rate = 0.1f;
    check_against(opt, ref_sgd, 1.0f);
}

Test(optim, sgd_momentum)
{
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_SGD);
    opt.learning_rate = 0.05f;
    opt.momentum = 0.9f;
    check_against(opt, ref_momentum, 1.0f);
}

Test(optim, sgd_nesterov)
{
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_SGD);
    opt.learning_rate = 0.05f;
    opt.momentum = 0.9f;
    opt.nesterov = 1;
    check_against(opt, ref_momentum, 1.0f);
}

Test(optim, adam)
{
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    opt.learning_rate = 0.01f;
    check_against(opt, ref_adam, 1.0f);
}

Test(optim, adamw)
{
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
    opt.learning_rate = 0.01f;
    opt.weight_decay = 0.5f;  /* large, so a wrong decay shows */
    check_against(opt, ref_adam, 1.0f);
}

/* With gradients near epsilon, where epsilon is added decides the step. */
Test(optim, adam_epsilon_placement)
{
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    opt.learning_rate = 0.01f;
    opt.epsilon = 1e-2f;
    check_against(opt, ref_adam, 1e-2f);
}

Test(optim, step_zero_counts_as_first)
{
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    float p0[4] = {1, 2, 3, 4}, p1[4] = {1, 2, 3, 4}, g[4] = {0.5f, -1, 2, 0};
    float s0[8] = {0}, s1[8] = {0};
    castor__optim_apply_range(&opt, p0, g, s0, 4, 0, 0, 4);
    castor__optim_apply_range(&opt, p1, g, s1, 4, 1, 0, 4);
    cr_assert(memcmp(p0, p1, sizeof p0) == 0 && memcmp(s0, s1, sizeof s0) == 0);
    for (int i = 0; i < 4; i++)
        cr_assert(isfinite(p0[i]), "p[%d] = %g", i, (double)p0[i]);
}

/* The pool splits the variables; every element's arithmetic is unchanged. */
Test(optim, pool_split_is_bitwise_identical)
{
    const size_t n = ((size_t)1 << 17) + 5;
    castor_optimizer_kind kinds[] = {CASTOR_OPT_SGD, CASTOR_OPT_ADAM, CASTOR_OPT_ADAMW};
    castor__pool *pool;
    cr_assert_eq(castor__pool_create(3, &pool, NULL), CASTOR_OK);
    float *grads = malloc(n * sizeof *grads);
    float *serial = malloc(n * sizeof *serial), *split = malloc(n * sizeof *split);
    float *serial_state = calloc(2 * n, sizeof *serial_state);
    float *split_state = calloc(2 * n, sizeof *split_state);
    cr_assert(grads && serial && split && serial_state && split_state);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        castor_optimizer opt = castor_optimizer_defaults(kinds[k]);
        opt.momentum = kinds[k] == CASTOR_OPT_SGD ? 0.9f : 0.0f;
        uint64_t rng = 3 + k;
        fill(&rng, serial, n, -1, 1);
        memcpy(split, serial, n * sizeof *split);
        memset(serial_state, 0, 2 * n * sizeof *serial_state);
        memset(split_state, 0, 2 * n * sizeof *split_state);
        for (int step = 1; step <= 3; step++) {
            fill(&rng, grads, n, -1, 1);
            castor__optim_apply_range(&opt, serial, grads, serial_state, n, step, 0, n);
            castor__optim_apply(pool, &opt, split, grads, split_state, n, step);
        }
        cr_assert(memcmp(serial, split, n * sizeof *split) == 0, "%s: params differ",
                  castor_optimizer_kind_name(kinds[k]));
        cr_assert(memcmp(serial_state, split_state, 2 * n * sizeof *split_state) == 0,
                  "%s: state differs", castor_optimizer_kind_name(kinds[k]));
    }
    free(grads);
    free(serial);
    free(split);
    free(serial_state);
    free(split_state);
    castor__pool_free(pool);
}

/* Central's one-pass update (host/update.h) is the sum and then the
 * optimizer, bit for bit: every kind, 0 to 5 gradients, sizes with partial
 * chunks, alone and over a pool. */
Test(optim, one_pass_update_is_the_sum_then_the_optimizer)
{
    const size_t sizes[] = {1, 1023, 1025, ((size_t)1 << 16) + 7};
    castor_optimizer opts[5] = {
        castor_optimizer_defaults(CASTOR_OPT_SGD), castor_optimizer_defaults(CASTOR_OPT_SGD),
        castor_optimizer_defaults(CASTOR_OPT_SGD), castor_optimizer_defaults(CASTOR_OPT_ADAM),
        castor_optimizer_defaults(CASTOR_OPT_ADAMW)};
    opts[1].momentum = 0.9f, opts[1].nesterov = 1;
    opts[2].momentum = 0.8f;
    castor__pool *pool;
    cr_assert_eq(castor__pool_create(3, &pool, NULL), CASTOR_OK);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *g[5], *sum = malloc(n * sizeof(float));
        float *p0 = malloc(n * sizeof(float)), *p1 = malloc(n * sizeof(float));
        float *s0 = calloc(2 * n, sizeof(float)), *s1 = calloc(2 * n, sizeof(float));
        cr_assert(sum && p0 && p1 && s0 && s1);
        for (int k = 0; k < 5; k++)
            cr_assert_not_null(g[k] = malloc(n * sizeof(float)));
        for (int o = 0; o < 5; o++)
            for (int ngrads = 0; ngrads <= 5; ngrads++) {
                uint64_t rng = 11 + (uint64_t)(o * 7 + ngrads);
                fill(&rng, p0, n, -1, 1);
                memcpy(p1, p0, n * sizeof(float));
                memset(s0, 0, 2 * n * sizeof(float));
                memset(s1, 0, 2 * n * sizeof(float));
                for (int step = 1; step <= 3; step++) {
                    for (int k = 0; k < ngrads; k++)
                        fill(&rng, g[k], n, -1, 1);
                    castor__reduce_sum(NULL, sum, (const float *const *)g, ngrads, n);
                    castor__optim_apply(NULL, &opts[o], p0, sum, s0, n, step);
                    castor__host_update(step == 2 ? NULL : pool, &opts[o], p1, s1,
                                        (const float *const *)g, ngrads, n, step);
                }
                const char *kind = castor_optimizer_kind_name(opts[o].kind);
                cr_assert(memcmp(p0, p1, n * sizeof(float)) == 0,
                          "%s, %d gradients, n %zu: variables differ", kind, ngrads, n);
                cr_assert(memcmp(s0, s1, 2 * n * sizeof(float)) == 0,
                          "%s, %d gradients, n %zu: state differs", kind, ngrads, n);
            }
        for (int k = 0; k < 5; k++)
            free(g[k]);
        free(sum), free(p0), free(p1), free(s0), free(s1);
    }
    castor__pool_free(pool);
}

Test(optim, slots_and_names)
{
    castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
    cr_assert_eq(castor__optim_slots(&sgd), 0);
    cr_assert_null(castor__optim_slot_name(&sgd, 0));
    sgd.momentum = 0.5f;
    cr_assert_eq(castor__optim_slots(&sgd), 1);
    cr_assert_str_eq(castor__optim_slot_name(&sgd, 0), "momentum");
    cr_assert_null(castor__optim_slot_name(&sgd, 1));
    castor_optimizer adamw = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
    cr_assert_eq(castor__optim_slots(&adamw), 2);
    cr_assert_str_eq(castor__optim_slot_name(&adamw, 0), "adam_m");
    cr_assert_str_eq(castor__optim_slot_name(&adamw, 1), "adam_v");
    cr_assert_null(castor__optim_slot_name(&adamw, -1));
}

Test(optim, keras_defaults)
{
    castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
    cr_assert(sgd.kind == CASTOR_OPT_SGD && sgd.learning_rate == 0.01f && sgd.momentum == 0.0f &&
              !sgd.nesterov);
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    cr_assert(adam.learning_rate == 0.001f && adam.beta1 == 0.9f && adam.beta2 == 0.999f &&
              adam.epsilon == 1e-7f && adam.weight_decay == 0.0f);
    castor_optimizer adamw = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
    cr_assert(adamw.kind == CASTOR_OPT_ADAMW && adamw.learning_rate == 0.001f &&
              adamw.weight_decay == 0.004f);
}

Test(optim, kind_names_round_trip)
{
    castor_optimizer_kind kinds[] = {CASTOR_OPT_SGD, CASTOR_OPT_ADAM, CASTOR_OPT_ADAMW};
    const char *names[] = {"sgd", "adam", "adamw"};
    for (int i = 0; i < 3; i++) {
        castor_optimizer_kind parsed = (castor_optimizer_kind)-1;
        cr_assert_str_eq(castor_optimizer_kind_name(kinds[i]), names[i]);
        cr_assert_eq(castor_optimizer_kind_parse(names[i], &parsed), CASTOR_OK);
        cr_assert_eq(parsed, kinds[i]);
    }
    castor_optimizer_kind parsed;
    cr_assert_eq(castor_optimizer_kind_parse("rmsprop", &parsed), CASTOR_INVALID);
    cr_assert_eq(castor_optimizer_kind_parse("", &parsed), CASTOR_INVALID);
    cr_assert_eq(castor_optimizer_kind_parse(NULL, &parsed), CASTOR_INVALID);
    cr_assert_not_null(castor_optimizer_kind_name((castor_optimizer_kind)99));
}

static void expect_rejected(castor_optimizer opt, const char *field)
{
    char err[256] = "";
    cr_assert_eq(castor__optim_validate(&opt, err, sizeof err), CASTOR_INVALID,
                 "%s accepted: lr %g momentum %g b1 %g b2 %g eps %g wd %g", field,
                 (double)opt.learning_rate, (double)opt.momentum, (double)opt.beta1,
                 (double)opt.beta2, (double)opt.epsilon, (double)opt.weight_decay);
    cr_assert(strstr(err, field) != NULL, "message \"%s\" does not name %s", err, field);
}

Test(optim, validate_rejects_bad_values)
{
    const float bad_lr[] = {0.0f, -0.1f, NAN, INFINITY};
    for (int k = CASTOR_OPT_SGD; k <= CASTOR_OPT_ADAMW; k++) {
        for (size_t i = 0; i < sizeof bad_lr / sizeof bad_lr[0]; i++) {
            castor_optimizer opt = castor_optimizer_defaults((castor_optimizer_kind)k);
            opt.learning_rate = bad_lr[i];
            expect_rejected(opt, "learning_rate");
        }
    }
    const float bad_unit[] = {-0.1f, 1.0f, 1.5f, NAN};
    for (size_t i = 0; i < sizeof bad_unit / sizeof bad_unit[0]; i++) {
        castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_SGD);
        opt.momentum = bad_unit[i];
        expect_rejected(opt, "momentum");
        opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
        opt.beta1 = bad_unit[i];
        expect_rejected(opt, "beta1");
        opt = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
        opt.beta2 = bad_unit[i];
        expect_rejected(opt, "beta2");
    }
    const float bad_eps[] = {0.0f, -1e-7f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_eps / sizeof bad_eps[0]; i++) {
        castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
        opt.epsilon = bad_eps[i];
        expect_rejected(opt, "epsilon");
    }
    const float bad_wd[] = {-0.004f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_wd / sizeof bad_wd[0]; i++) {
        castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
        opt.weight_decay = bad_wd[i];
        expect_rejected(opt, "weight_decay");
    }
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    opt.kind = (castor_optimizer_kind)7;
    expect_rejected(opt, "kind");
}

Test(optim, validate_accepts_good_values)
{
    char err[256] = "";
    for (int k = CASTOR_OPT_SGD; k <= CASTOR_OPT_ADAMW; k++) {
        castor_optimizer opt = castor_optimizer_defaults((castor_optimizer_kind)k);
        cr_assert_eq(castor__optim_validate(&opt, err, sizeof err), CASTOR_OK, "%s", err);
    }
    /* Fields the kind does not read are not checked. */
    castor_optimizer sgd = {.kind = CASTOR_OPT_SGD, .learning_rate = 0.1f, .momentum = 0.0f};
    cr_assert_eq(castor__optim_validate(&sgd, err, sizeof err), CASTOR_OK, "%s", err);
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    adam.beta1 = 0.0f;
    adam.beta2 = 0.0f;
    adam.momentum = -5.0f;
    adam.weight_decay = -1.0f;
    cr_assert_eq(castor__optim_validate(&adam, err, sizeof err), CASTOR_OK, "%s", err);
    /* A NULL buffer is allowed: the caller may only want the verdict. */
    adam.learning_rate = -1.0f;
    cr_assert_eq(castor__optim_validate(&adam, NULL, 0), CASTOR_INVALID);
}

/* A variable whose gradient stays 0 (a dead ReLU unit's weights) keeps
 * decaying its optimizer state: m and the velocity by 0.9 a step, v by
 * 0.999. In round-to-nearest a subnormal of a few ulps times 0.9 (or v of
 * up to 500 ulps times 0.999) rounds back to itself, so the state stuck
 * there for good, and every later update of it ran on subnormals, which
 * x86 cores handle in microcode (the host update of a Fashion-MNIST model
 * with 70% such entries took 1.8 times as long on an EPYC, far more on
 * most Intel cores). Every update flushes state below FLT_MIN to 0. */
Test(optim, state_left_subnormal_is_flushed_to_zero)
{
    enum { n = N_VARS };
    castor_optimizer opts[4] = {
        castor_optimizer_defaults(CASTOR_OPT_SGD), castor_optimizer_defaults(CASTOR_OPT_SGD),
        castor_optimizer_defaults(CASTOR_OPT_ADAM), castor_optimizer_defaults(CASTOR_OPT_ADAMW)};
    opts[0].momentum = 0.9f;
    opts[1].momentum = 0.9f, opts[1].nesterov = 1;
    static float p[n], g[n], s[2 * n];
    const float *grads[1] = {g};
    for (int o = 0; o < 4; o++)
        for (int path = 0; path < 2; path++) {
            int slots = castor__optim_slots(&opts[o]);
            for (size_t i = 0; i < n; i++)
                p[i] = 0.5f;
            memset(g, 0, sizeof g);
            /* Every subnormal from 1 to 1031 ulps, of either sign. */
            for (size_t i = 0; i < (size_t)slots * n; i++)
                s[i] = (i % 2 ? -1.0f : 1.0f) * (float)(i % n + 1) * 0x1p-149f;
            if (path == 0)
                castor__optim_apply_range(&opts[o], p, g, s, n, 1000, 0, n);
            else
                castor__host_update(NULL, &opts[o], p, s, grads, 1, n, 1000);
            for (size_t i = 0; i < (size_t)slots * n; i++)
                cr_assert(s[i] == 0.0f, "%s%s, %s: state[%zu] is %a after a zero gradient, not 0",
                          castor_optimizer_kind_name(opts[o].kind),
                          opts[o].nesterov ? " (nesterov)" : "",
                          path ? "central's one-pass update" : "the optimizer", i,
                          (double)s[i]);
            for (size_t i = 0; i < n; i++)
                cr_assert(p[i] == 0.5f || opts[o].kind == CASTOR_OPT_ADAMW, "p[%zu] = %a", i,
                          (double)p[i]);
        }
}

/* The flush above is for state too small to show. Adam's sqrt(v) below
 * 2^-63 vanishes next to epsilon 1e-7, not next to 1e-30: there a gradient
 * of 2e-19 gives v = 4e-41 (subnormal), and flushing it divided m by
 * epsilon alone, one step moving the variable by 6.3e6 (epsilon 1e-30) or
 * 6.3e-4 (1e-20) where Adam's formula moves it by 1e-3 or 3.9e-4. */
Test(optim, adam_with_a_tiny_epsilon_keeps_its_subnormal_state)
{
    enum { n = N_VARS };
    const float epsilons[2] = {1e-20f, 1e-30f};
    const castor_optimizer_kind kinds[2] = {CASTOR_OPT_ADAM, CASTOR_OPT_ADAMW};
    static float p[n], g[n], s[2 * n];
    const float *grads[1] = {g};
    for (int k = 0; k < 2; k++)
        for (int e = 0; e < 2; e++)
            for (int path = 0; path < 2; path++) {
                castor_optimizer opt = castor_optimizer_defaults(kinds[k]);
                opt.epsilon = epsilons[e];
                opt.weight_decay = 0.0f;
                for (size_t i = 0; i < n; i++)
                    p[i] = 0.0f, g[i] = -2e-19f;
                memset(s, 0, sizeof s);
                if (path == 0)
                    castor__optim_apply_range(&opt, p, g, s, n, 1, 0, n);
                else
                    castor__host_update(NULL, &opt, p, s, grads, 1, n, 1);
                /* Adam's first step in double: m = 0.1 g, v = 0.001 g^2. */
                double m = 0.1 * -2e-19, v = 0.001 * 4e-38;
                double alpha = 1e-3 * sqrt(0.001) / 0.1;
                double want = -alpha * m / (sqrt(v) + (double)opt.epsilon);
                for (size_t i = 0; i < n; i++) {
                    cr_assert(s[n + i] > 0.0f, "%s, epsilon %g, %s: v[%zu] is %a, not ~4e-41",
                              castor_optimizer_kind_name(opt.kind), (double)opt.epsilon,
                              path ? "central's one-pass update" : "the optimizer", i,
                              (double)s[n + i]);
                    cr_assert(fabs(p[i] - want) <= 1e-4 * want,
                              "%s, epsilon %g, %s: the variable moved by %.6g, not %.6g",
                              castor_optimizer_kind_name(opt.kind), (double)opt.epsilon,
                              path ? "central's one-pass update" : "the optimizer",
                              (double)p[i], want);
                }
            }
}

/* Where the two tests above meet: Adam flushes its state from epsilon
 * 2^-39 on (sqrt(FLT_MIN) = 2^-63 is half an ulp of it) and keeps it
 * subnormal below. A flush that began only above 2^-39 survived them. */
Test(optim, adam_flushes_its_state_from_epsilon_2_to_the_minus_39)
{
    const float epsilons[2] = {0x1p-39f, 0x1.fffffep-40f};  /* the bound, and the float below */
    float p[4], g[4] = {0}, s[8];
    for (int e = 0; e < 2; e++) {
        castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
        opt.epsilon = epsilons[e];
        for (int i = 0; i < 8; i++)
            s[i] = (float)(i + 1) * 0x1p-149f;
        for (int i = 0; i < 4; i++)
            p[i] = 0.5f;
        castor__optim_apply_range(&opt, p, g, s, 4, 1000, 0, 4);
        for (int i = 0; i < 8; i++)
            cr_assert(e == 0 ? s[i] == 0.0f : s[i] > 0.0f,
                      "epsilon %a: state[%d] is %a after a zero gradient, want %s",
                      (double)opt.epsilon, i, (double)s[i], e == 0 ? "0" : "it kept");
    }
}

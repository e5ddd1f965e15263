/*
 * Training through the public API on emulated CPU devices: replica-count
 * invariance, determinism, central/mirrored equivalence, uneven batches,
 * argument errors and the device memory budget.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "src/rng.h"
#include "support.h"

#define N 101  /* not a multiple of the batch: the last batch is short */
#define F 12
#define C 3

static castor_dataset *synthetic(uint64_t seed)
{
    return support_synthetic(seed, N, F, C);
}

typedef struct run {
    const char *devices;
    castor_strategy_kind kind;
    castor_optimizer_kind opt;
    int batch;
    int steps;
} run;

/* Train and return the final variables (malloc'd); *count their number. */
static float *train(const run *r, size_t *count)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, r->kind, r->devices, NULL), CASTOR_OK, "%s",
                 castor_strategy_errmsg(s));
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "16:tanh,8:relu,3"), CASTOR_OK);
    castor_optimizer opt = castor_optimizer_defaults(r->opt);
    if (r->opt == CASTOR_OPT_SGD) {
        opt.momentum = 0.9f;
        opt.nesterov = 1;
    }
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 42), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    castor_dataset *ds = synthetic(1);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 100;
    fo.batch_size = r->batch;
    fo.max_steps = r->steps;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), r->steps);
    *count = castor_model_num_params(m);
    float *w = malloc(*count * sizeof *w);
    cr_assert_eq(castor_model_get_params(m, w, *count), CASTOR_OK);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
    return w;
}

Test(train, replica_count_invariance)
{
    /* 101 samples in batches of 25: the fifth batch has one row, so with 3
     * replicas two of them get none. */
    size_t n1, n2, n3;
    run r = {"cpu", CASTOR_STRATEGY_CENTRAL, CASTOR_OPT_ADAM, 25, 12};
    float *w1 = train(&r, &n1);
    r.devices = "cpu:2";
    float *w2 = train(&r, &n2);
    r.devices = "cpu:3";
    float *w3 = train(&r, &n3);
    size_t at;
    double e2 = support_max_rel_err(w2, w1, n1, 1e-3, &at);
    cr_assert(e2 < 1e-4, "cpu:2 vs cpu: rel err %g at %zu (%g vs %g)", e2, at, w2[at], w1[at]);
    double e3 = support_max_rel_err(w3, w1, n1, 1e-3, &at);
    cr_assert(e3 < 1e-4, "cpu:3 vs cpu: rel err %g at %zu (%g vs %g)", e3, at, w3[at], w1[at]);
    /* and training did move the weights */
    run r0 = r;
    r0.steps = 1;
    size_t n0;
    float *w0 = train(&r0, &n0);
    cr_assert(support_max_rel_err(w0, w1, n1, 1e-3, NULL) > 1e-3);
    free(w0);
    free(w1);
    free(w2);
    free(w3);
}

Test(train, deterministic)
{
    size_t n1, n2;
    run r = {"cpu:2", CASTOR_STRATEGY_CENTRAL, CASTOR_OPT_ADAMW, 16, 15};
    float *a = train(&r, &n1);
    float *b = train(&r, &n2);
    cr_assert_eq(memcmp(a, b, n1 * sizeof *a), 0, "same seed, different weights");
    free(a);
    free(b);
}

/* Keras's glorot_uniform: each kernel drawn from U(-a, a), a = sqrt(6 / (in +
 * out)), the biases 0. The first layer's 40 x 60 draws fill their interval:
 * the largest lies within 5% of a (a fan-in-only a was 1.58 times wider). */
Test(train, initial_weights_are_glorot_uniform)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, 40), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "60:relu,5"), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 7), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    size_t n = castor_model_num_params(m);
    cr_assert_eq(n, 40 * 60 + 60 + 60 * 5 + 5);
    float *p = malloc(n * sizeof *p);
    cr_assert_eq(castor_model_get_params(m, p, n), CASTOR_OK);
    const struct { size_t at, in, out; } layers[] = {{0, 40, 60}, {40 * 60 + 60, 60, 5}};
    for (int l = 0; l < 2; l++) {
        double a = sqrt(6.0 / (double)(layers[l].in + layers[l].out)), largest = 0.0;
        for (size_t i = 0; i < layers[l].in * layers[l].out; i++)
            largest = fmax(largest, fabs((double)p[layers[l].at + i]));
        cr_assert(largest <= a && largest >= 0.95 * a, "layer %d: largest |w| %g, a %g", l,
                  largest, a);
        for (size_t j = 0; j < layers[l].out; j++)
            cr_assert_eq(p[layers[l].at + layers[l].in * layers[l].out + j], 0.0f);
    }
    free(p);
    castor_model_free(m);
    castor_strategy_free(s);
}

static void central_equals_mirrored(const char *devices, castor_optimizer_kind opt)
{
    size_t n1, n2;
    run r = {devices, CASTOR_STRATEGY_CENTRAL, opt, 20, 11};
    float *a = train(&r, &n1);
    r.kind = CASTOR_STRATEGY_MIRRORED;
    float *b = train(&r, &n2);
    size_t first = 0;
    while (first < n1 && memcmp(&a[first], &b[first], sizeof *a) == 0)
        first++;
    cr_assert_eq(first, n1, "%s %s: first difference at %zu: central %.9g mirrored %.9g", devices,
                 castor_optimizer_kind_name(opt), first, a[first < n1 ? first : 0],
                 b[first < n1 ? first : 0]);
    free(a);
    free(b);
}

Test(equivalence, sgd_nesterov_cpu2) { central_equals_mirrored("cpu:2", CASTOR_OPT_SGD); }
Test(equivalence, adam_cpu2) { central_equals_mirrored("cpu:2", CASTOR_OPT_ADAM); }
Test(equivalence, adamw_cpu3) { central_equals_mirrored("cpu:3", CASTOR_OPT_ADAMW); }
Test(equivalence, adam_cpu1) { central_equals_mirrored("cpu", CASTOR_OPT_ADAM); }
/* Replicas sharing one device: mirrored sums on it (replica 0 adds the
 * others' gradients, the others copy the sum), as on cuda:0xK. With three,
 * the one-row batch leaves two replicas without rows. */
Test(equivalence, adam_cpu1x2) { central_equals_mirrored("cpu:1x2", CASTOR_OPT_ADAM); }
Test(equivalence, sgd_nesterov_cpu1x3) { central_equals_mirrored("cpu:1x3", CASTOR_OPT_SGD); }
Test(equivalence, adamw_cpu2x2) { central_equals_mirrored("cpu:2x2", CASTOR_OPT_ADAMW); }

/* The shared device's sum is the device's: no gradient crosses the bus, as
 * through the host it would (each replica's down, the sum up). */
Test(equivalence, replicas_sharing_a_device_all_reduce_on_it)
{
    const char *lists[] = {"cpu:1x2", "cpu:2"};
    uint64_t d2h[2];
    size_t params = 0;
    for (int i = 0; i < 2; i++) {
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_MIRRORED, lists[i], NULL),
                     CASTOR_OK, "%s", castor_strategy_errmsg(s));
        castor_model *m = NULL;
        cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
        cr_assert_eq(castor_model_add_layers(m, "16:tanh,3"), CASTOR_OK);
        cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 42), CASTOR_OK);
        castor_dataset *ds = synthetic(1);
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.batch_size = 20;
        fo.max_steps = 1;
        castor_model_reset_run_stats(m);
        cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s",
                     castor_model_errmsg(m));
        castor_run_stats rs;
        cr_assert_eq(castor_model_run_stats(m, &rs), CASTOR_OK);
        d2h[i] = rs.bytes_d2h;
        params = castor_model_num_params(m);
        castor_dataset_free(ds);
        castor_model_free(m);
        castor_strategy_free(s);
    }
    /* 20 rows of statistics (two floats each) come down either way. */
    cr_assert_eq(d2h[0], 20 * 2 * sizeof(float), "cpu:1x2: %llu bytes down",
                 (unsigned long long)d2h[0]);
    cr_assert_eq(d2h[1], 20 * 2 * sizeof(float) + 2 * params * sizeof(float),
                 "cpu:2: %llu bytes down", (unsigned long long)d2h[1]);
}

Test(train, predict_matches_evaluate)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_MIRRORED, "cpu:2", NULL), CASTOR_OK);
    castor_model *m = NULL;
    castor_model_create(&m, F);
    castor_model_add_layers(m, "8:relu,3");
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    adam.learning_rate = 0.02f;
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &adam, 3), CASTOR_OK);
    castor_dataset *ds = synthetic(2);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 10;
    fo.batch_size = 10;
    castor_metrics fit_m, ev;
    cr_assert_eq(castor_model_fit(m, ds, &fo, &fit_m), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_evaluate(m, ds, 7, &ev), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(ev.samples, N);
    float *out = malloc(sizeof(float) * N * C);
    cr_assert_eq(castor_model_predict(m, castor_dataset_x(ds), N, 33, out), CASTOR_OK);
    const int32_t *y = castor_dataset_labels(ds);
    int correct = 0;
    for (int i = 0; i < N; i++) {
        int best = 0;
        for (int c = 1; c < C; c++)
            if (out[i * C + c] > out[i * C + best])
                best = c;
        correct += best == y[i];
    }
    cr_assert_float_eq(ev.accuracy, (double)correct / N, 1e-12);
    cr_assert(ev.accuracy > 0.6, "the synthetic task is learnable: accuracy %g", ev.accuracy);
    free(out);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(train, bad_arguments)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:4", NULL), CASTOR_OK);
    castor_model *m = NULL;
    castor_model_create(&m, F);
    castor_model_add_layers(m, "4:relu,3");
    castor_dataset *ds = synthetic(3);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_MISUSE, "fit before compile");
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK);
    fo.epochs = 0;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_INVALID);
    fo.epochs = 1;
    fo.batch_size = 3;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_INVALID);
    cr_assert(strstr(castor_model_errmsg(m), "smaller than the 4 replicas"), "%s",
              castor_model_errmsg(m));
    fo.batch_size = -1;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_INVALID);
    castor_model *wrong = NULL;
    castor_model_create(&wrong, F + 1);
    castor_model_free(wrong);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);

    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "gpu:1", NULL),
                 CASTOR_INVALID);
    cr_assert(strstr(castor_strategy_errmsg(s), "gpu:1"), "%s", castor_strategy_errmsg(s));
    castor_strategy_free(s);
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:0", NULL),
                 CASTOR_INVALID);
    castor_strategy_free(s);

    cr_assert_eq(castor_model_create(&m, 4), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "8:relu,"), CASTOR_INVALID);
    cr_assert_eq(castor_model_add_layers(m, "8:swish"), CASTOR_INVALID);
    cr_assert_eq(castor_model_add_layers(m, "x"), CASTOR_INVALID);
    cr_assert_eq(castor_model_add_layers(m, "-3"), CASTOR_INVALID);
    cr_assert_eq(castor_model_add_layers(m, "8:relu,3:sigmoid"), CASTOR_OK);
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_INVALID);
    cr_assert(strstr(castor_model_errmsg(m), "linear"), "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(train, device_budget)
{
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = 1 << 20;  /* 1 MiB */
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", &so), CASTOR_OK);
    castor_model *m = NULL;
    castor_model_create(&m, 784);
    castor_model_add_layers(m, "512:relu,10");  /* 407,050 floats: 1.6 MB of variables */
    int rc = castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1);
    cr_assert_eq(rc, CASTOR_DEVICE_MEMORY, "%s", castor_errstr(rc));
    const char *msg = castor_model_errmsg(m);
    cr_assert(strstr(msg, "1048576"), "names the budget: %s", msg);
    cr_assert(strstr(msg, "needs 1628416 bytes"), "names the bytes needed: %s", msg);
    cr_assert(strstr(msg, "before any batch's activations"), "a floor, not the whole: %s", msg);
    /* Compile reserves no gradients (evaluate never uses them), but says
     * what training will need besides. */
    cr_assert(strstr(msg, "(variables 1628200; to train, also gradients 1628200)"), "%s", msg);
    castor_model_free(m);

    /* The variables fit but a large batch's activations do not. */
    castor_model_create(&m, 784);
    castor_model_add_layers(m, "64:relu,10");
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    float *x = calloc(4096 * 784, sizeof(float));
    int32_t *y = calloc(4096, sizeof(int32_t));
    castor_dataset *ds = NULL;
    castor_dataset_from_memory(&ds, x, 4096, 784, y, NULL, 0);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 4096;
    rc = castor_model_fit(m, ds, &fo, NULL);
    cr_assert_eq(rc, CASTOR_DEVICE_MEMORY, "%s", castor_model_errmsg(m));
    cr_assert(strstr(castor_model_errmsg(m), "2048 rows"), "%s", castor_model_errmsg(m));
    /* a smaller batch still trains afterwards */
    fo.batch_size = 64;
    fo.max_steps = 2;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    free(x);
    free(y);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(train, device_budget_mirrored_names_each_part)
{
    /* A mirrored replica holds Adam's two slots too, once it trains: the
     * message named "optimizer state" with no size, so its parts did not
     * add up. Compile reserves the variables alone, which fit: the first
     * fit is refused, before any step, naming every part. */
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = 600 * 1024;
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_MIRRORED, "cpu:2", &so), CASTOR_OK);
    castor_model *m = NULL;
    castor_model_create(&m, 784);
    castor_model_add_layers(m, "64:relu,10");  /* 50,890 floats: 203,560 bytes */
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    float *x = calloc(16 * 784, sizeof(float));
    int32_t y[16] = {0};
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_from_memory(&ds, x, 16, 784, y, NULL, 0), CASTOR_OK);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 16;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_DEVICE_MEMORY);
    const char *msg = castor_model_errmsg(m);
    cr_assert(strstr(msg, "to train (variables 203560, gradients 203560, optimizer state 407120, "
                          "activations for 8 rows "),
              "%s", msg);
    cr_assert_eq(castor_model_step(m), 0);
    free(x);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

static int stop_after_three(void *user, const castor_progress *p)
{
    int *calls = user;
    ++*calls;
    return p->global_step >= 3;
}

/* The callback stops fit at step 3; with max_steps 3 the limit falls on the
 * same step, and the stop is still reported (it was taken for the limit:
 * CASTOR_OK). */
static void stop_at_three(const char *devices, int64_t max_steps)
{
    castor_strategy *s = NULL;
    castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, devices, NULL);
    castor_model *m = NULL;
    castor_model_create(&m, F);
    castor_model_add_layers(m, "3");
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK);
    castor_dataset *ds = synthetic(4);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 5;
    fo.batch_size = 8;
    fo.max_steps = max_steps;
    int calls = 0;
    fo.progress = stop_after_three;
    fo.progress_user = &calls;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_INTERRUPTED, "%s",
                 castor_model_errmsg(m));
    cr_assert_eq(calls, 3);
    cr_assert_eq(castor_model_step(m), 3);
    if (max_steps) {
        /* The limit alone is no interruption. */
        fo.progress = NULL;
        cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s",
                     castor_model_errmsg(m));
        cr_assert_eq(castor_model_step(m), 3 + max_steps);
    }
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(train, progress_can_stop)
{
    stop_at_three("cpu:2", 0);
}

Test(train, progress_stop_on_the_max_steps_step_is_reported)
{
    stop_at_three("cpu", 3);
}

/* Validation batches larger than the training set's: the device room for
 * them is found missing before the first step, not after a trained epoch
 * (fit failed at the epoch's end with the model already moved on). */
Test(train, validation_rows_are_reserved_before_training)
{
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = 3000;
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", &so), CASTOR_OK);
    castor_model *m = NULL;
    castor_model_create(&m, 4);
    castor_model_add_layers(m, "3");
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK,
                 "%s", castor_model_errmsg(m));
    castor_dataset *train = support_synthetic(1, 8, 4, 3);
    castor_dataset *val = support_synthetic(2, 200, 4, 3);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 5;
    fo.batch_size = 64;
    fo.validation = val;
    cr_assert_eq(castor_model_fit(m, train, &fo, NULL), CASTOR_DEVICE_MEMORY, "%s",
                 castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), 0, "trained %lld steps first",
                 (long long)castor_model_step(m));
    cr_assert_eq(castor_model_epoch(m), 0);
    /* Without the validation set, the same fit trains. */
    fo.validation = NULL;
    cr_assert_eq(castor_model_fit(m, train, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_epoch(m), 5);
    castor_dataset_free(val);
    castor_dataset_free(train);
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(train, mse_regression_learns)
{
    enum { RN = 256 };
    float *x = malloc(sizeof(float) * RN * 2), *t = malloc(sizeof(float) * RN);
    castor__rng rng;
    castor__rng_seed(&rng, 5, 5, 5);
    for (int i = 0; i < RN; i++) {
        x[2 * i] = castor__rng_uniform(&rng);
        x[2 * i + 1] = castor__rng_uniform(&rng);
        t[i] = 0.5f * x[2 * i] - 0.25f * x[2 * i + 1] + 0.1f;
    }
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_from_memory(&ds, x, RN, 2, NULL, t, 1), CASTOR_OK);
    castor_strategy *s = NULL;
    castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL);
    castor_model *m = NULL;
    castor_model_create(&m, 2);
    castor_model_add_layers(m, "1");
    castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
    sgd.learning_rate = 0.5f;
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_MSE, &sgd, 1), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 60;
    fo.batch_size = 32;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_metrics ev;
    cr_assert_eq(castor_model_evaluate(m, ds, 64, &ev), CASTOR_OK);
    cr_assert(ev.loss < 1e-4, "mse %g", ev.loss);
    cr_assert(isnan(ev.accuracy));
    free(x);
    free(t);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

/* Labels one past the last layer's units are refused before any step: left
 * to the device, which finds one only in the batch that holds it, the fit
 * failed there after training on the batches before it. */
Test(train, a_label_past_the_last_layer_is_refused_before_any_step)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    castor_model *m = NULL;
    castor_model_create(&m, F);
    castor_model_add_layers(m, "4:relu,3");
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK);
    castor_dataset *good = synthetic(3);
    int32_t labels[N];
    memcpy(labels, castor_dataset_labels(good), sizeof labels);
    labels[N - 1] = C;  /* in the last batch only */
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_from_memory(&ds, castor_dataset_x(good), N, F, labels, NULL, 0),
                 CASTOR_OK);
    size_t np = castor_model_num_params(m);
    float *before = malloc(np * sizeof *before), *after = malloc(np * sizeof *after);
    cr_assert(before && after);
    cr_assert_eq(castor_model_get_params(m, before, np), CASTOR_OK);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 10;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_MISMATCH, "%s",
                 castor_model_errmsg(m));
    cr_assert(strstr(castor_model_errmsg(m), "labels go up to 3 but the last layer has 3 units"),
              "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), 0);
    cr_assert_eq(castor_model_get_params(m, after, np), CASTOR_OK);
    cr_assert(memcmp(before, after, np * sizeof *before) == 0, "the variables were trained");
    castor_metrics ev;
    cr_assert_eq(castor_model_evaluate(m, ds, 10, &ev), CASTOR_MISMATCH, "%s",
                 castor_model_errmsg(m));
    free(before);
    free(after);
    castor_dataset_free(ds);
    castor_dataset_free(good);
    castor_model_free(m);
    castor_strategy_free(s);
}

/* Epoch e is shuffled by castor__rng_seed(seed, CASTOR_RNG_SHUFFLE, e)
 * (rng.h): two shuffled epochs train as two unshuffled ones on the data put
 * in those orders. A shuffle seeded without the epoch gave every epoch the
 * first one's order, and nothing else noticed. */
Test(train, each_epoch_is_shuffled_by_its_own_stream)
{
    castor_dataset *ds = synthetic(5);
    const float *x = castor_dataset_x(ds);
    const int32_t *y = castor_dataset_labels(ds);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 10;
    fo.epochs = 2;
    castor_strategy *s1 = NULL, *s2 = NULL;
    castor_model *shuffled = support_central_model(&s1, "cpu", F, "4:relu,3", 7);
    castor_model *ordered = support_central_model(&s2, "cpu", F, "4:relu,3", 7);
    cr_assert_eq(castor_model_fit(shuffled, ds, &fo, NULL), CASTOR_OK);
    fo.epochs = 1;
    fo.shuffle = 0;
    for (uint64_t e = 0; e < 2; e++) {
        castor__rng rng;
        castor__rng_seed(&rng, 7, CASTOR_RNG_SHUFFLE, e);
        uint32_t perm[N];
        castor__rng_permutation(&rng, perm, N);
        float px[N * F];
        int32_t py[N];
        for (int i = 0; i < N; i++) {
            memcpy(px + i * F, x + (size_t)perm[i] * F, F * sizeof *px);
            py[i] = y[perm[i]];
        }
        castor_dataset *epoch = NULL;
        cr_assert_eq(castor_dataset_from_memory(&epoch, px, N, F, py, NULL, 0), CASTOR_OK);
        cr_assert_eq(castor_model_fit(ordered, epoch, &fo, NULL), CASTOR_OK);
        castor_dataset_free(epoch);
    }
    size_t np = castor_model_num_params(shuffled);
    float *a = malloc(np * sizeof *a), *b = malloc(np * sizeof *b);
    cr_assert(a && b);
    cr_assert_eq(castor_model_get_params(shuffled, a, np), CASTOR_OK);
    cr_assert_eq(castor_model_get_params(ordered, b, np), CASTOR_OK);
    cr_assert_eq(memcmp(a, b, np * sizeof *a), 0, "the epochs were not in their streams' orders");
    free(a);
    free(b);
    castor_model_free(shuffled);
    castor_model_free(ordered);
    castor_strategy_free(s1);
    castor_strategy_free(s2);
    castor_dataset_free(ds);
}

/*
 * Training on CUDA devices through the public API (make check-gpu): central
 * and mirrored agree, and the demo model learns Fashion-MNIST. Skipped, with
 * the reason, where no GPU is present.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "src/rng.h"
#include "tests/support.h"

#define REQUIRE_GPU()                                                                    \
    do {                                                                                 \
        const char *why_ = NULL;                                                         \
        if (castor_cuda_device_count(&why_) == 0)                                        \
            cr_skip_test("no GPU: %s", why_ ? why_ : "(no reason given)");               \
    } while (0)

#define N 600
#define F 40

static castor_dataset *synthetic(void)
{
    float *x = malloc(sizeof(float) * N * F);
    int32_t *y = malloc(sizeof(int32_t) * N);
    castor__rng rng;
    castor__rng_seed(&rng, 8, 8, 8);
    for (int i = 0; i < N; i++) {
        y[i] = (int32_t)castor__rng_below(&rng, 5);
        for (int j = 0; j < F; j++)
            x[i * F + j] = castor__rng_uniform(&rng) + (j % 5 == y[i] ? 0.5f : 0.0f);
    }
    castor_dataset *ds = NULL;
    castor_dataset_from_memory(&ds, x, N, F, y, NULL, 0);
    free(x);
    free(y);
    return ds;
}

static float *train(castor_strategy_kind kind, const char *devices, castor_optimizer_kind ok,
                    size_t *count)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, kind, devices, NULL), CASTOR_OK, "%s",
                 castor_strategy_errmsg(s));
    castor_model *m = NULL;
    castor_model_create(&m, F);
    castor_model_add_layers(m, "64:relu,32:tanh,5");
    castor_optimizer opt = castor_optimizer_defaults(ok);
    if (ok == CASTOR_OPT_SGD)
        opt.momentum = 0.9f;
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 5), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    castor_dataset *ds = synthetic();
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 2;
    fo.batch_size = 50;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    *count = castor_model_num_params(m);
    float *w = malloc(*count * sizeof *w);
    cr_assert_eq(castor_model_get_params(m, w, *count), CASTOR_OK);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
    return w;
}

static void central_vs_mirrored(const char *devices, castor_optimizer_kind ok)
{
    REQUIRE_GPU();
    size_t n1, n2;
    float *a = train(CASTOR_STRATEGY_CENTRAL, devices, ok, &n1);
    float *b = train(CASTOR_STRATEGY_MIRRORED, devices, ok, &n2);
    size_t at;
    double err = support_max_rel_err(b, a, n1, 1e-2, &at);
    cr_assert(err < 1e-5, "%s %s: mirrored vs central rel err %g at %zu (%g vs %g)", devices,
              castor_optimizer_kind_name(ok), err, at, b[at], a[at]);
    /* and against the emulated device, looser: another GEMM summation order */
    char cpu[16];
    snprintf(cpu, sizeof cpu, "cpu:%d", strchr(devices, 'x') ? atoi(strchr(devices, 'x') + 1) : 1);
    float *c = train(CASTOR_STRATEGY_CENTRAL, cpu, ok, &n1);
    err = support_max_rel_err(a, c, n1, 1e-2, &at);
    cr_assert(err < 1e-2, "%s vs %s: rel err %g at %zu", devices, cpu, err, at);
    free(a);
    free(b);
    free(c);
}

Test(gpu_train, central_vs_mirrored_cuda0_adam) { central_vs_mirrored("cuda:0", CASTOR_OPT_ADAM); }
Test(gpu_train, central_vs_mirrored_cuda0x2_adam) { central_vs_mirrored("cuda:0x2", CASTOR_OPT_ADAM); }
Test(gpu_train, central_vs_mirrored_cuda0x3_sgd) { central_vs_mirrored("cuda:0x3", CASTOR_OPT_SGD); }
Test(gpu_train, central_vs_mirrored_cuda0x2_adamw) { central_vs_mirrored("cuda:0x2", CASTOR_OPT_ADAMW); }

Test(gpu_train, fashion_mnist_on_cuda0x2, .timeout = 300)
{
    REQUIRE_GPU();
    const char *dir = support_fashion_dir();
    if (!dir)
        cr_skip_test("Fashion-MNIST not found (set CASTOR_FASHION_MNIST)");
    castor_dataset *train_ds = NULL, *test_ds = NULL;
    cr_assert_eq(castor_dataset_load_mnist_dir(&train_ds, dir, "train"), CASTOR_OK);
    cr_assert_eq(castor_dataset_load_mnist_dir(&test_ds, dir, "test"), CASTOR_OK);
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cuda:0x2", NULL), CASTOR_OK,
                 "%s", castor_strategy_errmsg(s));
    castor_model *m = NULL;
    castor_model_create(&m, 784);
    castor_model_add_layers(m, "128:relu,10");
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 4;
    fo.batch_size = 256;
    cr_assert_eq(castor_model_fit(m, train_ds, &fo, NULL), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    castor_metrics ev;
    cr_assert_eq(castor_model_evaluate(m, test_ds, 1000, &ev), CASTOR_OK);
    cr_assert(ev.accuracy >= 0.85, "test accuracy %.4f", ev.accuracy);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(train_ds);
    castor_dataset_free(test_ds);
}

Test(gpu_train, no_gpu_is_a_clear_error)
{
    const char *why = NULL;
    if (castor_cuda_device_count(&why) > 0)
        cr_skip_test("a GPU is present");
    castor_strategy *s = NULL;
    int rc = castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cuda", NULL);
    cr_assert_eq(rc, CASTOR_UNSUPPORTED, "%s", castor_strategy_errmsg(s));
    cr_assert(strstr(castor_strategy_errmsg(s), "GPU") || strstr(castor_strategy_errmsg(s), "CUDA"),
              "%s", castor_strategy_errmsg(s));
    castor_strategy_free(s);
}

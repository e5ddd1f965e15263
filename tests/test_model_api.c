/*
 * The model handle's life cycle through the public API: a failed layer spec
 * adds nothing, a model compiled again after its strategy was freed starts
 * afresh, and run statistics belong to the model, not to the strategy's
 * devices.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "model_api_support.h"
#include "support.h"

static void fit_steps(castor_model *m, castor_dataset *ds, int batch, int64_t steps)
{
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 10;
    fo.batch_size = batch;
    fo.max_steps = steps;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
}

Test(model_api, add_layers_is_all_or_nothing)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "5:tanh"), CASTOR_OK);
    const char *bad[] = {"16:relu,3:softmax", "16:relu,,3", "16:relu,3,", "16,x", "16,0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(castor_model_add_layers(m, bad[i]), CASTOR_INVALID, "%s", bad[i]);
        cr_assert_eq(castor_model_num_layers(m), 1, "'%s' left layers behind", bad[i]);
        cr_assert_eq(castor_model_num_params(m), (size_t)(F * 5 + 5), "%s", bad[i]);
    }
    cr_assert_eq(castor_model_add_layers(m, "16:relu,3"), CASTOR_OK);
    char spec[64];
    cr_assert_eq(castor_model_layers_spec(m, spec, sizeof spec), CASTOR_OK);
    cr_assert_str_eq(spec, "5:tanh,16:relu,3:linear");
    castor_model_free(m);
}

/* The limits on widths and depths are inclusive: 2^24 input features and
 * 1024 layers are a model, one more is refused. */
Test(model_api, size_limits_take_their_top)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, 1 << 24), CASTOR_OK, "%s", castor_model_errmsg(m));
    /* 2^48 weights: over the 2^40 parameters a model may hold */
    cr_assert_eq(castor_model_add_dense(m, 1 << 24, CASTOR_ACT_LINEAR), CASTOR_INVALID);
    cr_assert(strstr(castor_model_errmsg(m), "too large"), "%s", castor_model_errmsg(m));
    castor_model_free(m);
    cr_assert_eq(castor_model_create(&m, (1 << 24) + 1), CASTOR_INVALID);
    castor_model_free(m);
    cr_assert_eq(castor_model_create(&m, 1), CASTOR_OK);
    /* and start at 1: a layer of no units is refused, not counted */
    cr_assert_eq(castor_model_add_dense(m, 0, CASTOR_ACT_LINEAR), CASTOR_INVALID);
    for (int i = 0; i < 1024; i++)
        cr_assert_eq(castor_model_add_dense(m, 1, CASTOR_ACT_LINEAR), CASTOR_OK, "layer %d: %s",
                     i, castor_model_errmsg(m));
    cr_assert_eq(castor_model_add_dense(m, 1, CASTOR_ACT_LINEAR), CASTOR_INVALID);
    cr_assert(strstr(castor_model_errmsg(m), "at most 1024 layers"), "%s",
              castor_model_errmsg(m));
    cr_assert_eq(castor_model_num_layers(m), 1024);
    castor_model_free(m);
}

/* layers_spec needs room for the text and its NUL: a buffer one short
 * (snprintf then drops the last character) is refused, not filled with a
 * spec that names other layers. */
Test(model_api, layers_spec_needs_room_for_the_nul)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "5:tanh,16"), CASTOR_OK);
    const char *want = "5:tanh,16:linear";
    char spec[32];
    cr_assert_eq(castor_model_layers_spec(m, spec, strlen(want)), CASTOR_INVALID, "'%s'", spec);
    cr_assert_eq(castor_model_layers_spec(m, spec, strlen(want) + 1), CASTOR_OK);
    cr_assert_str_eq(spec, want);
    castor_model_free(m);
}

Test(model_api, compile_again_after_the_strategy_was_freed_starts_afresh)
{
    castor_dataset *ds = small_dataset();
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    castor_model *m = compiled(s, "8:relu,3");
    fit_steps(m, ds, 10, 3);  /* stops mid-epoch with batch 10 */
    cr_assert_eq(castor_model_step(m), 3);
    castor_strategy_free(s);

    /* The detached model refuses work and says why, every call alike
     * (set_params, set_learning_rate and load said only "not compiled", or
     * "load needs a compiled model")... */
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    size_t count = castor_model_num_params(m);
    float *p = calloc(count ? count : 1, sizeof *p), met_out[3];
    cr_assert(p);
    castor_metrics met;
    const float x[F] = {0};
    const char *names[] = {"fit", "evaluate", "predict", "get_params", "set_params",
                           "set_learning_rate", "load", "save"};
    for (int call = 0; call < 8; call++) {
        int rc = call == 0   ? castor_model_fit(m, ds, &fo, NULL)
                 : call == 1 ? castor_model_evaluate(m, ds, 16, &met)
                 : call == 2 ? castor_model_predict(m, x, 1, 1, met_out)
                 : call == 3 ? castor_model_get_params(m, p, count)
                 : call == 4 ? castor_model_set_params(m, p, count)
                 : call == 5 ? castor_model_set_learning_rate(m, 0.5f)
                 : call == 6 ? castor_model_load(m, "/nonexistent/x.safetensors")
                             : castor_model_save(m, "/nonexistent/x.safetensors");
        cr_assert_eq(rc, CASTOR_MISUSE, "%s: %d", names[call], rc);
        char want[96];
        snprintf(want, sizeof want, "%s: the model is not compiled (or its strategy was freed)",
                 names[call]);
        cr_assert_str_eq(castor_model_errmsg(m), want);
    }
    free(p);

    /* ...and compiled again it is a new model: step 0, fresh weights, any
     * batch size (the old epoch in progress is gone), nothing leaked (the
     * sanitizer build checks that). */
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 3), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), 0);
    cr_assert_eq(castor_model_epoch(m), 0);
    cr_assert_eq(castor_model_step_in_epoch(m), 0);
    fit_steps(m, ds, 16, 2);
    cr_assert_eq(castor_model_step(m), 2);

    /* The same as a model never compiled before. */
    castor_strategy *s2 = NULL;
    cr_assert_eq(castor_strategy_create(&s2, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    castor_model *fresh = compiled(s2, "8:relu,3");
    fit_steps(fresh, ds, 16, 2);
    size_t n = castor_model_num_params(m);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    cr_assert_eq(castor_model_get_params(m, a, n), CASTOR_OK);
    cr_assert_eq(castor_model_get_params(fresh, b, n), CASTOR_OK);
    cr_assert(memcmp(a, b, n * sizeof *a) == 0, "a recompiled model trains as a fresh one");
    free(a);
    free(b);
    castor_model_free(fresh);
    castor_strategy_free(s2);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

Test(model_api, run_stats_start_with_each_model)
{
    castor_dataset *ds = small_dataset();
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    /* A big model first, so that its device peak is far above the next one's. */
    castor_model *big = compiled(s, "256:relu,256:relu,3");
    fit_steps(big, ds, 16, 2);
    castor_run_stats st;
    cr_assert_eq(castor_model_run_stats(big, &st), CASTOR_OK);
    size_t big_peak = st.device_peak_bytes;
    cr_assert_gt(st.bytes_h2d, 0);
    castor_model_free(big);

    castor_model *small = compiled(s, "4,3");
    cr_assert_eq(castor_model_run_stats(small, &st), CASTOR_OK);
    cr_assert_eq(st.steps, 0);
    cr_assert_eq(st.bytes_h2d, 0, "bytes of the last model: %llu",
                 (unsigned long long)st.bytes_h2d);
    cr_assert_eq(st.bytes_d2h, 0);
    fit_steps(small, ds, 16, 1);
    cr_assert_eq(castor_model_run_stats(small, &st), CASTOR_OK);
    cr_assert_lt(st.device_peak_bytes, big_peak / 4, "peak %zu carried over from %zu",
                 st.device_peak_bytes, big_peak);
    cr_assert_eq(castor_model_device_peak_bytes(small), st.device_peak_bytes);
    castor_model_free(small);
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

Test(model_api, run_stats_bytes_are_the_training_steps_only)
{
    /* Compile (a mirrored model's first upload), set_params and evaluate
     * moved bytes the run statistics reported as the training steps'. */
    castor_dataset *ds = small_dataset();
    for (int kind = CASTOR_STRATEGY_CENTRAL; kind <= CASTOR_STRATEGY_MIRRORED; kind++) {
        castor_run_stats plain, busy;
        for (int extra = 0; extra < 2; extra++) {
            castor_strategy *s = NULL;
            cr_assert_eq(castor_strategy_create(&s, (castor_strategy_kind)kind, "cpu:2", NULL),
                         CASTOR_OK);
            castor_model *m = compiled(s, "8:relu,3");  /* 6*8+8 + 8*3+3 = 83 variables */
            castor_run_stats st;
            cr_assert_eq(castor_model_run_stats(m, &st), CASTOR_OK);
            cr_assert_eq(st.bytes_h2d + st.bytes_d2h, 0, "%s: %llu + %llu bytes after compile",
                         castor_strategy_kind_name((castor_strategy_kind)kind),
                         (unsigned long long)st.bytes_h2d, (unsigned long long)st.bytes_d2h);
            if (extra) {
                float *p = model_params(m);
                cr_assert_eq(castor_model_set_params(m, p, castor_model_num_params(m)),
                             CASTOR_OK);
                free(p);
                castor_metrics mt;
                cr_assert_eq(castor_model_evaluate(m, ds, 16, &mt), CASTOR_OK, "%s",
                             castor_model_errmsg(m));
                cr_assert_eq(castor_model_run_stats(m, &st), CASTOR_OK);
                cr_assert_eq(st.bytes_h2d + st.bytes_d2h, 0,
                             "%s: %llu + %llu bytes after set_params and evaluate",
                             castor_strategy_kind_name((castor_strategy_kind)kind),
                             (unsigned long long)st.bytes_h2d, (unsigned long long)st.bytes_d2h);
            }
            fit_steps(m, ds, 16, 2);
            cr_assert_eq(castor_model_run_stats(m, extra ? &busy : &plain), CASTOR_OK);
            castor_model_free(m);
            castor_strategy_free(s);
        }
        /* The same two steps cost the same, whatever came before them, but
         * for central's first upload of the variables to its 2 replicas:
         * evaluate made it, and the first step found them there. */
        cr_assert_eq(busy.steps, 2);
        cr_assert_gt(plain.bytes_h2d, 0);
        uint64_t uploaded = kind == CASTOR_STRATEGY_CENTRAL ? 2 * 83 * sizeof(float) : 0;
        cr_assert_eq(busy.bytes_h2d + uploaded, plain.bytes_h2d,
                     "%s: h2d %llu, %llu without the extra calls",
                     castor_strategy_kind_name((castor_strategy_kind)kind),
                     (unsigned long long)busy.bytes_h2d, (unsigned long long)plain.bytes_h2d);
        cr_assert_eq(busy.bytes_d2h, plain.bytes_d2h, "%s: d2h %llu, %llu without the extra calls",
                     castor_strategy_kind_name((castor_strategy_kind)kind),
                     (unsigned long long)busy.bytes_d2h, (unsigned long long)plain.bytes_d2h);
    }
    castor_dataset_free(ds);
}

Test(model_api, a_failed_strategy_cannot_be_compiled_on)
{
    /* castor_strategy_create hands out the handle on failure, for its
     * message; compiling on it crashed (no replicas: a division by zero;
     * an unknown kind: no operations). */
    struct {
        castor_strategy_kind kind;
        const char *devices;
    } bad[] = {{CASTOR_STRATEGY_CENTRAL, "gpu0"},
               {(castor_strategy_kind)7, "cpu"},
               {CASTOR_STRATEGY_MIRRORED, ""},
               {CASTOR_STRATEGY_CENTRAL, "cpu:64,cpu"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        castor_strategy *s = NULL;
        cr_assert_neq(castor_strategy_create(&s, bad[i].kind, bad[i].devices, NULL), CASTOR_OK);
        cr_assert(s, "the failed create hands out its handle");
        /* It may have opened devices before it failed: it has no replicas. */
        cr_assert_eq(castor_strategy_replicas(s), 0, "'%s'", bad[i].devices);
        castor_model *m = NULL;
        cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
        cr_assert_eq(castor_model_add_layers(m, "3"), CASTOR_OK);
        cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_MISUSE,
                     "'%s': %s", bad[i].devices, castor_model_errmsg(m));
        cr_assert(strstr(castor_model_errmsg(m), "not created"), "%s", castor_model_errmsg(m));
        float x[F] = {0}, out[3];
        cr_assert_neq(castor_model_predict(m, x, 1, 1, out), CASTOR_OK);
        castor_model_free(m);
        castor_strategy_free(s);
    }
}

/* Messages logged by a strategy, counted. */
static void count_log(void *user, castor_log_level level, const char *message)
{
    (void)level;
    (void)message;
    ++*(int *)user;
}

Test(model_api, strategy_options_out_of_range_are_refused)
{
    /* log_level -1 (meant as "silent") was taken, and with the enum
     * compared unsigned every message went to log_fn; 4 was taken too. */
    struct {
        int host_threads, log_level;
        const char *says;
    } bad[] = {{-1, CASTOR_LOG_WARN, "host_threads must be 0..1024, not -1"},
               {1025, CASTOR_LOG_WARN, "host_threads must be 0..1024, not 1025"},
               {0, -1, "log_level must be CASTOR_LOG_ERROR (0) to CASTOR_LOG_DEBUG (3), not -1"},
               {0, 4, "not 4"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
        int logged = 0;
        so.host_threads = bad[i].host_threads;
        so.log_level = (castor_log_level)bad[i].log_level;
        so.log_fn = count_log;
        so.log_user = &logged;
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", &so),
                     CASTOR_INVALID, "case %zu: %s", i, castor_strategy_errmsg(s));
        cr_assert(strstr(castor_strategy_errmsg(s), bad[i].says), "case %zu: %s", i,
                  castor_strategy_errmsg(s));
        cr_assert_eq(logged, 0, "case %zu: a refused strategy logged %d messages", i, logged);
        castor_strategy_free(s);
    }
    /* Every level in range is taken, and logs only up to itself. */
    for (int level = CASTOR_LOG_ERROR; level <= CASTOR_LOG_DEBUG; level++) {
        castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
        int logged = 0;
        so.log_level = (castor_log_level)level;
        so.log_fn = count_log;
        so.log_user = &logged;
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", &so), CASTOR_OK,
                     "level %d: %s", level, castor_strategy_errmsg(s));
        /* Creating logs one INFO line ("central strategy on 'cpu'"). */
        cr_assert_eq(logged, level >= CASTOR_LOG_INFO, "level %d: %d messages", level, logged);
        castor_strategy_free(s);
    }
}

Test(model_api, a_failed_model_create_builds_nothing)
{
    /* The handle of a failed create took layers (with 0 inputs), compiled,
     * and then failed at predict with a NULL GEMM buffer. */
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, 0), CASTOR_INVALID);
    cr_assert(m);
    cr_assert_eq(castor_model_add_dense(m, 4, CASTOR_ACT_RELU), CASTOR_MISUSE);
    cr_assert(strstr(castor_model_errmsg(m), "not created"), "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_add_layers(m, "4:relu,3"), CASTOR_MISUSE);
    cr_assert_eq(castor_model_num_layers(m), 0);
    /* compile said "the model has no layers" (CASTOR_INVALID), as if the
     * caller had only forgotten them. */
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_MISUSE);
    cr_assert(strstr(castor_model_errmsg(m), "not created"), "%s", castor_model_errmsg(m));
    castor_strategy_free(s);
    castor_model_free(m);
}

/* ---- arguments the caller got wrong: the documented code, a message, no crash ---- */

Test(model_api, null_and_empty_arguments_say_what_is_wrong)
{
    castor_strategy_kind kind;
    castor_activation act;
    cr_assert_eq(castor_strategy_kind_parse("central", NULL), CASTOR_INVALID);  /* crashed */
    cr_assert_eq(castor_activation_parse("relu", NULL), CASTOR_INVALID);        /* crashed */
    cr_assert_eq(castor_strategy_kind_parse("Mirrored", &kind), CASTOR_OK);
    cr_assert_eq(kind, CASTOR_STRATEGY_MIRRORED);
    cr_assert_eq(castor_activation_parse("ReLU", &act), CASTOR_OK);

    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    castor_dataset *ds = small_dataset();
    castor_model *m = compiled(s, "3");
    size_t n = castor_model_num_params(m);
    float params[64], x[F] = {0}, out[3];
    castor_metrics met;
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    /* Each left the message of an earlier, unrelated error (or none). */
    struct {
        int rc;
        const char *says;
    } calls[] = {
        {castor_model_get_params(m, NULL, n), "dst is NULL"},
        {castor_model_set_params(m, NULL, n), "src is NULL"},
        {castor_model_evaluate(m, ds, 8, NULL), "out is NULL"},
        {castor_model_predict(m, NULL, 1, 1, out), "x is NULL"},
        {castor_model_predict(m, x, 1, 1, NULL), "out is NULL"},
        {castor_model_fit(m, NULL, &fo, NULL), "dataset is NULL"},
        {castor_model_evaluate(m, NULL, 8, &met), "dataset is NULL"},
    };
    for (size_t i = 0; i < sizeof calls / sizeof *calls; i++) {
        cr_assert_eq(calls[i].rc, CASTOR_MISUSE, "call %zu: %d", i, calls[i].rc);
    }
    /* The calls ran in order; check each message by running it again. */
    castor_model_get_params(m, NULL, n);
    cr_assert(strstr(castor_model_errmsg(m), "dst is NULL"), "%s", castor_model_errmsg(m));
    castor_model_set_params(m, NULL, n);
    cr_assert(strstr(castor_model_errmsg(m), "src is NULL"), "%s", castor_model_errmsg(m));
    castor_model_evaluate(m, ds, 8, NULL);
    cr_assert(strstr(castor_model_errmsg(m), "out is NULL"), "%s", castor_model_errmsg(m));
    castor_model_predict(m, NULL, 1, 1, out);
    cr_assert(strstr(castor_model_errmsg(m), "x is NULL"), "%s", castor_model_errmsg(m));
    castor_model_fit(m, NULL, &fo, NULL);
    cr_assert(strstr(castor_model_errmsg(m), "dataset is NULL"), "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_get_params(m, params, n), CASTOR_OK, "the model still works");

    castor_dataset *tail = NULL;
    cr_assert_eq(castor_dataset_split_tail(ds, 1, NULL), CASTOR_MISUSE);
    cr_assert(strstr(castor_dataset_errmsg(ds), "tail is NULL"), "%s", castor_dataset_errmsg(ds));
    cr_assert_eq(castor_dataset_split_tail(ds, 1, &tail), CASTOR_OK);
    castor_dataset_free(tail);

    /* "" looked for the files in the root directory. */
    castor_dataset *d = NULL;
    cr_assert_eq(castor_dataset_load_mnist_dir(&d, "", "test"), CASTOR_MISUSE);
    cr_assert(strstr(castor_dataset_errmsg(d), "empty"), "%s", castor_dataset_errmsg(d));
    castor_dataset_free(d);
    cr_assert_eq(castor_dataset_load_mnist_dir(&d, "/nonexistent", NULL), CASTOR_MISUSE);
    castor_dataset_free(d);
    cr_assert_eq(castor_dataset_load_idx(&d, "", "labels"), CASTOR_MISUSE);
    cr_assert(strstr(castor_dataset_errmsg(d), "images path is empty"), "%s",
              castor_dataset_errmsg(d));
    castor_dataset_free(d);

    /* A NULL pointer argument is CASTOR_MISUSE, as castor.h says; these three
     * were CASTOR_INVALID. An empty spec or list is a bad value. */
    cr_assert_eq(castor_dataset_from_memory(&d, NULL, 1, F, (int32_t[1]){0}, NULL, 0),
                 CASTOR_MISUSE);
    cr_assert(strstr(castor_dataset_errmsg(d), "x is NULL"), "%s", castor_dataset_errmsg(d));
    castor_dataset_free(d);
    castor_model *fresh = NULL;
    cr_assert_eq(castor_model_create(&fresh, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(fresh, NULL), CASTOR_MISUSE);
    cr_assert(strstr(castor_model_errmsg(fresh), "spec is NULL"), "%s",
              castor_model_errmsg(fresh));
    cr_assert_eq(castor_model_add_layers(fresh, ""), CASTOR_INVALID);
    castor_model_free(fresh);
    castor_strategy *none = NULL;
    cr_assert_eq(castor_strategy_create(&none, CASTOR_STRATEGY_CENTRAL, NULL, NULL),
                 CASTOR_MISUSE);
    cr_assert(strstr(castor_strategy_errmsg(none), "devices is NULL"), "%s",
              castor_strategy_errmsg(none));
    castor_strategy_free(none);
    none = NULL;
    cr_assert_eq(castor_strategy_create(&none, CASTOR_STRATEGY_CENTRAL, "", NULL),
                 CASTOR_INVALID);
    castor_strategy_free(none);

    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

Test(model_api, non_finite_samples_are_refused_at_the_door)
{
    /* One NaN trained every variable into NaN with fit returning OK. */
    float x[4 * 2] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t y[4] = {0, 1, 0, 1};
    float t[4 * 2] = {0};
    castor_dataset *d = NULL;
    x[5] = NAN;
    cr_assert_eq(castor_dataset_from_memory(&d, x, 4, 2, y, NULL, 0), CASTOR_INVALID);
    cr_assert(strstr(castor_dataset_errmsg(d), "sample 2, feature 1"), "%s",
              castor_dataset_errmsg(d));
    castor_dataset_free(d);
    x[5] = 5;
    t[6] = -INFINITY;
    cr_assert_eq(castor_dataset_from_memory(&d, x, 4, 2, NULL, t, 2), CASTOR_INVALID);
    cr_assert(strstr(castor_dataset_errmsg(d), "sample 3, target 0"), "%s",
              castor_dataset_errmsg(d));
    castor_dataset_free(d);
    t[6] = 0;
    cr_assert_eq(castor_dataset_from_memory(&d, x, 4, 2, NULL, t, 2), CASTOR_OK);
    castor_dataset_free(d);
}

Test(model_api, unit_counts_are_digits_only)
{
    /* strtol skipped the blanks, and the sign check looked at the blank. */
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    const char *bad[] = {" +5", "\t7", "\n 8:relu", " 5", "5 ", "+5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(castor_model_add_layers(m, bad[i]), CASTOR_INVALID, "'%s'", bad[i]);
    cr_assert_eq(castor_model_num_layers(m), 0);
    cr_assert_eq(castor_model_add_layers(m, "05:relu,3"), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
}

Test(model_api, a_failed_save_says_why_even_with_a_long_path,
     .init = support_dir_init, .fini = support_dir_fini)
{
    /* The reason came last, after the path and the temporary file's path,
     * and a 300-character path pushed it out of the message. */
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    castor_model *m = compiled(s, "3");
    char path[SUPPORT_PATH_LEN], name[320];
    /* two directories of 150 characters (a name may have 255), neither there */
    memset(name, 'a', 301);
    name[150] = '/';
    strcpy(name + 301, "/model.safetensors");
    support_path_in(path, name);
    cr_assert_neq(castor_model_save(m, path), CASTOR_OK);
    cr_assert(strstr(castor_model_errmsg(m), "No such file or directory"), "%s",
              castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
}

/* Peak resident memory of this process since the mark was reset. */
static long rss_peak_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* A model larger than a device's budget is refused before its host copies
 * are made (compile allocated and initialised gigabytes of host memory
 * first: a large enough model got castor OOM-killed instead of an error). */
Test(model_api, a_model_too_big_for_the_devices_is_refused_before_host_memory)
{
    FILE *clear = fopen("/proc/self/clear_refs", "w");
    if (!clear || fputs("5", clear) == EOF || fclose(clear) != 0)
        cr_skip_test("cannot reset the peak RSS mark (/proc/self/clear_refs)");
    long before = rss_peak_kib();
    for (int kind = 0; kind < 2; kind++) {
        castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
        so.device_memory_budget = (size_t)64 << 20;
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, (castor_strategy_kind)kind, "cpu:2", &so),
                     CASTOR_OK);
        castor_model *m = NULL;
        castor_model_create(&m, 256);
        cr_assert_eq(castor_model_add_layers(m, "262144:relu,10"), CASTOR_OK);  /* 280 MB */
        cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1),
                     CASTOR_DEVICE_MEMORY);
        cr_assert(strstr(castor_model_errmsg(m), "budget"), "%s", castor_model_errmsg(m));
        castor_model_free(m);
        castor_strategy_free(s);
    }
    long grew = rss_peak_kib() - before;
    cr_assert(before > 0 && grew < 64 * 1024, "compile touched %ld MiB of host memory first",
              grew / 1024);
}

Test(model_api, settings_the_optimizer_would_drop_are_refused)
{
    /* Keras applies weight_decay to SGD and Adam too, and an Adam with
     * momentum 0.9 reads as a request: castor's SGD and Adam have neither,
     * and compile took them and trained without them. */
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    struct {
        castor_optimizer_kind kind;
        float momentum, weight_decay;
        int nesterov;
        const char *says;
    } bad[] = {{CASTOR_OPT_SGD, 0.9f, 0.01f, 0, "weight_decay applies to adamw only"},
               {CASTOR_OPT_ADAM, 0.0f, 0.01f, 0, "weight_decay applies to adamw only"},
               {CASTOR_OPT_ADAM, 0.9f, 0.0f, 0, "momentum applies to sgd only"},
               {CASTOR_OPT_ADAMW, 0.0f, 0.004f, 1, "nesterov applies to sgd only"},
               {CASTOR_OPT_ADAM, NAN, 0.0f, 0, "momentum applies to sgd only"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        castor_optimizer opt = castor_optimizer_defaults(bad[i].kind);
        opt.momentum = bad[i].momentum;
        opt.weight_decay = bad[i].weight_decay;
        opt.nesterov = bad[i].nesterov;
        castor_model *m = NULL;
        cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
        cr_assert_eq(castor_model_add_layers(m, "3"), CASTOR_OK);
        cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 1),
                     CASTOR_INVALID, "case %zu", i);
        cr_assert(strstr(castor_model_errmsg(m), bad[i].says), "case %zu: %s", i,
                  castor_model_errmsg(m));
        castor_model_free(m);
    }
    /* The kinds' own settings, and the other kinds' at zero, compile. */
    for (int k = CASTOR_OPT_SGD; k <= CASTOR_OPT_ADAMW; k++) {
        castor_optimizer opt = castor_optimizer_defaults((castor_optimizer_kind)k);
        if (k == CASTOR_OPT_SGD)
            opt.momentum = 0.9f, opt.nesterov = 1;
        castor_model *m = NULL;
        cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
        cr_assert_eq(castor_model_add_layers(m, "3"), CASTOR_OK);
        cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 1), CASTOR_OK,
                     "%s", castor_model_errmsg(m));
        castor_model_free(m);
    }
    castor_strategy_free(s);
}

Test(model_api, a_refused_fit_still_says_no_epoch_ended)
{
    /* last_epoch is {NaN, NaN, 0} when no epoch ended: it kept the caller's
     * values when fit refused its arguments. */
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    castor_model *m = compiled(s, "3");
    castor_dataset *ds = small_dataset();
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 0;
    castor_metrics last = {12345.0, 678.0, 999};
    cr_assert_eq(castor_model_fit(m, ds, &fo, &last), CASTOR_INVALID);
    cr_assert(isnan(last.loss) && isnan(last.accuracy) && last.samples == 0,
              "{%g, %g, %zu}", last.loss, last.accuracy, last.samples);
    last = (castor_metrics){1.0, 1.0, 1};
    cr_assert_eq(castor_model_fit(NULL, ds, &fo, &last), CASTOR_MISUSE);
    cr_assert(isnan(last.loss) && last.samples == 0);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

/* Every status has words of its own: a code castor_errstr does not know
 * reads "unknown status code", which tells a user nothing of what failed. */
Test(model_api, every_status_has_its_own_errstr)
{
    for (int rc = CASTOR_OK; rc <= CASTOR_NOT_DURABLE; rc++)
        for (int other = -1; other < rc; other++)
            cr_assert_str_neq(castor_errstr(rc), castor_errstr(other), "%d and %d", rc, other);
}

/*
 * What a model holds on its devices when: compile and castor_model_open
 * place the variables alone; evaluate and predict add a batch's forward
 * activations; the first fit adds the training buffers (the gradients, and
 * mirrored's optimizer state), checking every device's room before it
 * allocates any, and the host buffers for the gradients only where the
 * host sums them. Emulated CPU devices, most with small budgets.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "support.h"

/* 64 -> 512:relu -> 10 (Adam): 38,410 floats, 153,640 bytes of variables.
 * On one replica a 256 KiB budget holds them and a batch of 16's
 * activations (192,000 bytes with the alignment), not them and their
 * gradients (307,712 bytes before any activations). */
#define LAZY_F 64
#define LAZY_N 40
#define LAZY_BATCH 16
#define LAZY_BUDGET ((size_t)256 << 10)

static castor_model *lazy_model(castor_strategy *s)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, LAZY_F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "512:relu,10"), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 9), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    return m;
}

static castor_strategy *lazy_strategy(castor_strategy_kind kind, size_t budget)
{
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = budget;
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, kind, "cpu", &so), CASTOR_OK, "%s",
                 castor_strategy_errmsg(s));
    return s;
}

/* evaluate and predict give what they give on an unconstrained model, and
 * fit is refused before any step with a message naming the gradients;
 * after it, the model still evaluates. */
static void evaluates_but_does_not_train(castor_model *m, const castor_dataset *ds,
                                         const castor_metrics *want, const float *want_out,
                                         const char *what)
{
    castor_metrics got;
    cr_assert_eq(castor_model_evaluate(m, ds, LAZY_BATCH, &got), CASTOR_OK, "%s: %s", what,
                 castor_model_errmsg(m));
    cr_assert(got.loss == want->loss && got.accuracy == want->accuracy,
              "%s: loss %.9g accuracy %.9g, not %.9g %.9g", what, got.loss, got.accuracy,
              want->loss, want->accuracy);
    float out[LAZY_N * 10];
    cr_assert_eq(castor_model_predict(m, castor_dataset_x(ds), LAZY_N, LAZY_BATCH, out),
                 CASTOR_OK, "%s: %s", what, castor_model_errmsg(m));
    cr_assert(memcmp(out, want_out, sizeof out) == 0, "%s: other outputs", what);
    cr_assert_leq(castor_model_device_peak_bytes(m), LAZY_BUDGET, "%s", what);

    int64_t step = castor_model_step(m), epoch = castor_model_epoch(m);
    int64_t in_epoch = castor_model_step_in_epoch(m);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = LAZY_BATCH;
    fo.max_steps = 1;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_DEVICE_MEMORY, "%s: %s", what,
                 castor_model_errmsg(m));
    const char *msg = castor_model_errmsg(m);
    cr_assert(strstr(msg, "gradients 153640"), "%s: the gradients are not named: %s", what, msg);
    cr_assert(strstr(msg, "budget is 262144 bytes"), "%s: %s", what, msg);
    cr_assert_eq(castor_model_step(m), step, "%s: trained", what);
    cr_assert_eq(castor_model_epoch(m), epoch, "%s", what);
    cr_assert_eq(castor_model_step_in_epoch(m), in_epoch, "%s", what);
    cr_assert_eq(castor_model_evaluate(m, ds, LAZY_BATCH, &got), CASTOR_OK, "%s: after: %s",
                 what, castor_model_errmsg(m));
    cr_assert(got.loss == want->loss, "%s: after the refused fit: loss %.9g", what, got.loss);
}

/* castor eval --device-memory 30M on a 256 -> 2048 -> 2048 -> 10 model was
 * refused for 37,945,856 bytes "(variables 18972712, gradients 18972712)":
 * compile and open reserved the gradients, which evaluation never uses. */
static void variables_fit_without_their_gradients(castor_strategy_kind kind)
{
    const char *name = castor_strategy_kind_name(kind);
    castor_dataset *ds = support_synthetic(5, LAZY_N, LAZY_F, 10);
    char *dir = support_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);

    /* The reference, on an unconstrained device: two steps (the optimizer
     * state is no longer zero), saved, then two more. */
    castor_strategy *big = lazy_strategy(kind, 0);
    castor_model *ref = lazy_model(big);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 100;
    fo.batch_size = LAZY_BATCH;
    fo.max_steps = 2;
    cr_assert_eq(castor_model_fit(ref, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(ref));
    castor_metrics want;
    cr_assert_eq(castor_model_evaluate(ref, ds, LAZY_BATCH, &want), CASTOR_OK);
    float want_out[LAZY_N * 10];
    cr_assert_eq(castor_model_predict(ref, castor_dataset_x(ds), LAZY_N, LAZY_BATCH, want_out),
                 CASTOR_OK);
    cr_assert_eq(castor_model_save(ref, path), CASTOR_OK, "%s", castor_model_errmsg(ref));
    cr_assert_eq(castor_model_fit(ref, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(ref));
    size_t np = castor_model_num_params(ref);
    float *want_params = malloc(np * sizeof *want_params);
    cr_assert_eq(castor_model_get_params(ref, want_params, np), CASTOR_OK);
    castor_model_free(ref);

    /* A fresh model compiled on the small budget: the reference's start. */
    castor_model *fresh = lazy_model(big);
    castor_metrics fresh_want;
    float fresh_out[LAZY_N * 10];
    cr_assert_eq(castor_model_evaluate(fresh, ds, LAZY_BATCH, &fresh_want), CASTOR_OK);
    cr_assert_eq(castor_model_predict(fresh, castor_dataset_x(ds), LAZY_N, LAZY_BATCH,
                                      fresh_out),
                 CASTOR_OK);
    castor_model_free(fresh);
    castor_strategy_free(big);

    castor_strategy *s = lazy_strategy(kind, LAZY_BUDGET);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s: open: %s", name,
                 castor_model_errmsg(m));
    char what[64];
    snprintf(what, sizeof what, "%s, opened", name);
    evaluates_but_does_not_train(m, ds, &want, want_out, what);
    castor_model_free(m);
    m = lazy_model(s);
    snprintf(what, sizeof what, "%s, compiled", name);
    evaluates_but_does_not_train(m, ds, &fresh_want, fresh_out, what);
    castor_model_free(m);
    castor_strategy_free(s);

    /* Where the gradients fit too, the opened model evaluates first and
     * then trains on as the reference did, to the bit. */
    s = lazy_strategy(kind, (size_t)1 << 20);
    cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_metrics got;
    cr_assert_eq(castor_model_evaluate(m, ds, LAZY_BATCH, &got), CASTOR_OK);
    size_t eval_peak = castor_model_device_peak_bytes(m);
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_gt(castor_model_device_peak_bytes(m), eval_peak + 153640,
                 "%s: the gradients are not counted in the peak", name);
    float *params = malloc(np * sizeof *params);
    cr_assert_eq(castor_model_get_params(m, params, np), CASTOR_OK);
    cr_assert(memcmp(params, want_params, np * sizeof *params) == 0,
              "%s: trained on after an evaluation, it differs from the reference", name);
    free(params);
    free(want_params);
    castor_model_free(m);
    castor_strategy_free(s);
    support_rmrf(dir);
    free(dir);
    castor_dataset_free(ds);
}

Test(train, variables_that_fit_without_their_gradients_evaluate_central)
{
    variables_fit_without_their_gradients(CASTOR_STRATEGY_CENTRAL);
}

Test(train, variables_that_fit_without_their_gradients_evaluate_mirrored)
{
    variables_fit_without_their_gradients(CASTOR_STRATEGY_MIRRORED);
}

/* An evaluate of a big batch before the first fit left a forward-only
 * activation arena that the first fit's training buffers were refused
 * beside (the check counted the arena the fit would replace, the
 * allocation found it still held): the fit failed, and every fit after it,
 * on a budget it fits in. 1 MiB (central; 1400 KiB mirrored, whose
 * replica holds the optimizer state too) holds a 350-row evaluation
 * (978,688 bytes) and a 16-row fit, not both at once. */
static void fit_after_a_big_evaluate(castor_strategy_kind kind, size_t budget,
                                     size_t training_bytes)
{
    castor_dataset *ds = support_synthetic(6, 400, LAZY_F, 10);
    castor_strategy *s = lazy_strategy(kind, budget);
    castor_model *m = lazy_model(s);
    castor_metrics met;
    cr_assert_eq(castor_model_evaluate(m, ds, 350, &met), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    cr_assert_gt(castor_model_device_peak_bytes(m) + training_bytes, budget,
                 "the evaluation and the gradients fit at once: the test shows nothing");
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 16;
    fo.max_steps = 1;
    for (int k = 0; k < 2; k++)
        cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s, fit %d: %s",
                     castor_strategy_kind_name(kind), k, castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), 2);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

Test(train, a_fit_after_a_big_evaluate_has_its_room)
{
    /* The training buffers: the gradients, and mirrored Adam's m and v. */
    fit_after_a_big_evaluate(CASTOR_STRATEGY_CENTRAL, (size_t)1 << 20, 153640);
    fit_after_a_big_evaluate(CASTOR_STRATEGY_MIRRORED, (size_t)1400 << 10, 3 * 153640);
}

/* The backward pass's two delta buffers hold a layer's output gradient
 * (rows x that layer's units) and never one of the input's width: the
 * first layer's input gradient is not computed. They were sized by the
 * widest of the input and the layers, so a wide input (4096 features
 * into 16 units) asked 2 x 64 x 4096 floats (2 MiB) more than training
 * uses, and a fit that needs about 1.6 MiB was refused on a 2 MiB budget. */
Test(train, a_wide_input_needs_no_backward_buffers_of_its_width)
{
    const int features = 4096, batch = 64;
    const size_t budget = (size_t)2 << 20;
    castor_dataset *ds = support_synthetic(7, batch, features, 10);
    castor_strategy *s = lazy_strategy(CASTOR_STRATEGY_CENTRAL, budget);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, features), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "16:relu,10"), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 9), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 2;
    fo.batch_size = batch;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), 2);
    cr_assert_leq(castor_model_device_peak_bytes(m), budget);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

/* A mirrored model's gradients come to the host only where the host sums
 * them (replicas on several emulated devices, or a mix): one replica
 * updates on its own, replicas sharing a device sum on it, and NCCL sums
 * on the GPUs. Each replica's host gradient buffer and the host's sum were
 * allocated all the same, never written: on cuda:0x4 a model of 1e9
 * variables held 20 GB of pinned host memory for nothing (4 GB each). */
Test(train, mirrored_holds_host_gradients_only_where_the_host_sums_them)
{
    castor_dataset *ds = support_synthetic(8, LAZY_N, LAZY_F, 10);
    static const struct {
        const char *devices;
        int host_sums;
    } cases[] = {{"cpu", 0}, {"cpu:1x2", 0}, {"cpu:2", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_MIRRORED, cases[i].devices, NULL),
                     CASTOR_OK);
        castor_model *m = lazy_model(s);
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.batch_size = LAZY_BATCH;
        fo.max_steps = 2;
        cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s: %s", cases[i].devices,
                     castor_model_errmsg(m));
        castor_run_stats st;
        cr_assert_eq(castor_model_run_stats(m, &st), CASTOR_OK);
        /* The variables and Adam's m and v; with the host's sum, the sum and
         * a gradient per replica besides. Row statistics are a few bytes. */
        size_t vars = castor_model_num_params(m) * sizeof(float);
        int replicas = castor_strategy_replicas(s);
        if (cases[i].host_sums)
            cr_assert_geq(st.host_bytes, (3 + 1 + (size_t)replicas) * vars, "%s: %zu",
                          cases[i].devices, st.host_bytes);
        else
            cr_assert_lt(st.host_bytes, 4 * vars, "%s: %zu host bytes for %zu of variables",
                         cases[i].devices, st.host_bytes, vars);
        castor_model_free(m);
        castor_strategy_free(s);
    }
    castor_dataset_free(ds);
}

/* The room to train is checked to the byte, before anything is allocated:
 * on a budget one byte short of what a fit needs it is refused holding no
 * more than compile placed (a check with slack let the gradients in and
 * refused the activations after them, which kept the gradients), and on
 * the exact budget it trains. */
Test(train, the_room_to_train_is_checked_to_the_byte_before_allocating)
{
    castor_dataset *ds = support_synthetic(6, LAZY_N, LAZY_F, 10);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = LAZY_BATCH;
    fo.max_steps = 1;
    castor_strategy *s = lazy_strategy(CASTOR_STRATEGY_CENTRAL, LAZY_BUDGET);
    castor_model *m = lazy_model(s);
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_DEVICE_MEMORY);
    const char *needs = strstr(castor_model_errmsg(m), "needs ");
    size_t need = 0;
    cr_assert(needs && sscanf(needs, "needs %zu", &need) == 1, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    for (size_t budget = need - 1; budget <= need; budget++) {
        s = lazy_strategy(CASTOR_STRATEGY_CENTRAL, budget);
        m = lazy_model(s);
        size_t placed = castor_model_device_peak_bytes(m);
        int rc = castor_model_fit(m, ds, &fo, NULL);
        if (budget < need) {
            cr_assert_eq(rc, CASTOR_DEVICE_MEMORY, "%s", castor_model_errmsg(m));
            cr_assert_eq(castor_model_device_peak_bytes(m), placed,
                         "a refused fit allocated %zu bytes",
                         castor_model_device_peak_bytes(m) - placed);
        } else {
            cr_assert_eq(rc, CASTOR_OK, "budget %zu: %s", budget, castor_model_errmsg(m));
        }
        castor_model_free(m);
        castor_strategy_free(s);
    }
    castor_dataset_free(ds);
}

/* Compile checks the variables' room to the byte too, and says what the
 * model needs (153,640 bytes of variables, 153,856 with the alignment):
 * with slack in the check, a budget a byte short failed in the allocator
 * instead, whose message names no budget that would do. */
Test(train, the_room_for_the_variables_is_checked_to_the_byte_at_compile)
{
    const size_t placed = 153856;
    for (size_t budget = placed - 1; budget <= placed; budget++) {
        castor_strategy *s = lazy_strategy(CASTOR_STRATEGY_CENTRAL, budget);
        castor_model *m = NULL;
        cr_assert_eq(castor_model_create(&m, LAZY_F), CASTOR_OK);
        cr_assert_eq(castor_model_add_layers(m, "512:relu,10"), CASTOR_OK);
        int rc = castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 9);
        if (budget < placed) {
            cr_assert_eq(rc, CASTOR_DEVICE_MEMORY, "%s", castor_model_errmsg(m));
            cr_assert(strstr(castor_model_errmsg(m), "needs 153856 bytes of device memory"),
                      "%s", castor_model_errmsg(m));
        } else {
            cr_assert_eq(rc, CASTOR_OK, "%s", castor_model_errmsg(m));
            cr_assert_eq(castor_model_device_peak_bytes(m), placed);
        }
        castor_model_free(m);
        castor_strategy_free(s);
    }
}

/*
 * Training, evaluation and prediction on several replicas, the host pool
 * at work, and application threads driving separate handles at once: each
 * result equal, bit for bit, to the same run made alone.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tsan.h"

/* The last batch of each (181 = 6 x 30 + 1 = 3 x 60 + 1 = 4 x 45 + 1) has one
 * row: two of three replicas sit it out, which each strategy handles apart. */
enum { SAMPLES = 181, BATCH = 30, EVAL_BATCH = 60, PREDICT_BATCH = 45 };

/* What a run leaves: its variables, test metrics and predictions. */
typedef struct outcome {
    tsan_setup setup;
    const castor_dataset *ds;  /* NULL: a data set of the run's own, from its seed */
    float *params;
    castor_metrics met;
    float *pred;
    size_t n_params;
} outcome;

/* Two epochs, then evaluate and predict on the training data. */
static void *run(void *arg)
{
    outcome *o = arg;
    castor_dataset *own = o->ds ? NULL : tsan_data(o->setup.seed, SAMPLES);
    const castor_dataset *ds = o->ds ? o->ds : own;
    castor_strategy *s = NULL;
    castor_model *m = tsan_model(&o->setup, NULL, &s);
    if (m && ds) {
        o->n_params = castor_model_num_params(m);
        o->pred = malloc(sizeof(float) * SAMPLES * TSAN_C);
        int rc = tsan_fit(m, ds, 2, BATCH, 0);
        if (!rc)
            rc = castor_model_evaluate(m, ds, EVAL_BATCH, &o->met);
        if (!rc)
            rc = castor_model_predict(m, castor_dataset_x(ds), SAMPLES, PREDICT_BATCH, o->pred);
        CHECK(rc == CASTOR_OK, "%s on %s: %s", castor_strategy_kind_name(o->setup.kind),
              o->setup.devices, castor_model_errmsg(m));
        if (!rc)
            o->params = tsan_params(m);
    }
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(own);
    return NULL;
}

static void outcome_free(outcome *o)
{
    free(o->params);
    free(o->pred);
    o->params = o->pred = NULL;
}

/* got is want's run, bit for bit. */
static void check_same(const outcome *got, const outcome *want, const char *what)
{
    const tsan_setup *g = &got->setup;
    CHECK(got->params && got->n_params == want->n_params &&
              tsan_same(got->params, want->params, want->n_params),
          "%s: %s on %s (host_threads %d): variables differ", what,
          castor_strategy_kind_name(g->kind), g->devices, g->host_threads);
    CHECK(got->met.loss == want->met.loss && got->met.accuracy == want->met.accuracy,
          "%s: %s on %s: evaluate %.9g/%.9g, alone %.9g/%.9g", what,
          castor_strategy_kind_name(g->kind), g->devices, got->met.loss, got->met.accuracy,
          want->met.loss, want->met.accuracy);
    CHECK(got->pred && tsan_same(got->pred, want->pred, SAMPLES * TSAN_C),
          "%s: %s on %s: predictions differ", what, castor_strategy_kind_name(g->kind),
          g->devices);
}

/* Central and mirrored on three emulated devices and on one shared by
 * three replicas (mirrored sums on it, replica 0 reading the others'
 * buffers): the same bits. */
static void strategies_agree(const char *layers)
{
    outcome ref = {.setup = {CASTOR_STRATEGY_CENTRAL, "cpu:3", layers, 1, 7}};
    run(&ref);
    CHECK(ref.params != NULL, "central on cpu:3 (%s) trains", layers);
    const tsan_setup others[] = {{CASTOR_STRATEGY_MIRRORED, "cpu:3", layers, 1, 7},
                                 {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", layers, 1, 7},
                                 {CASTOR_STRATEGY_CENTRAL, "cpu:1x3", layers, 1, 7}};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        outcome o = {.setup = others[i]};
        run(&o);
        check_same(&o, &ref, "alone");
        outcome_free(&o);
    }

    /* Four application threads at once, with the host pool's work split
     * 1, 2, 3 ways and one thread per core (0): the host's sum and update
     * are element by element, so the split changes no bit. */
    outcome par[4] = {{.setup = {CASTOR_STRATEGY_CENTRAL, "cpu:3", layers, 2, 7}},
                      {.setup = {CASTOR_STRATEGY_MIRRORED, "cpu:3", layers, 3, 7}},
                      {.setup = {CASTOR_STRATEGY_CENTRAL, "cpu:1x3", layers, 0, 7}},
                      {.setup = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", layers, 2, 7}}};
    tsan_parallel(4, run, par, sizeof *par);
    for (int i = 0; i < 4; i++) {
        check_same(&par[i], &ref, "four threads at once");
        outcome_free(&par[i]);
    }
    outcome_free(&ref);
}

/* Separate models and strategies reading one data set at once (fit and
 * evaluate only read it), beside two that have their own. */
static void shared_dataset(void)
{
    outcome ref = {.setup = {CASTOR_STRATEGY_MIRRORED, "cpu:2", TSAN_SMALL, 2, 11}};
    run(&ref);
    castor_dataset *ds = tsan_data(11, SAMPLES);
    outcome par[4] = {{.setup = ref.setup, .ds = ds}, {.setup = ref.setup, .ds = ds},
                      {.setup = ref.setup}, {.setup = ref.setup}};
    tsan_parallel(4, run, par, sizeof *par);
    for (int i = 0; i < 4; i++) {
        check_same(&par[i], &ref, i < 2 ? "one data set, two threads" : "beside them");
        outcome_free(&par[i]);
    }
    castor_dataset_free(ds);
    outcome_free(&ref);
}

void tsan_train(void)
{
    strategies_agree(TSAN_SMALL);
    strategies_agree(TSAN_BIG);
    shared_dataset();
}

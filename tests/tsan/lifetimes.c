/*
 * Handles made, freed and compiled again while other application threads
 * train: a strategy freed before its model (castor.h: the model keeps its
 * layers, refuses work with CASTOR_MISUSE, and compiled again on another
 * strategy starts afresh), a strategy freed from fit's progress callback,
 * and three threads doing all of this at once with host_threads 1 to 3;
 * every model's variables equal those of the same run made alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tsan.h"

enum { SAMPLES = 90, BATCH = 15, ROUNDS = 4, THREADS = 3 };

static const tsan_setup setups[2] = {{CASTOR_STRATEGY_CENTRAL, "cpu:3", TSAN_SMALL, 1, 61},
                                     {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", TSAN_BIG, 1, 61}};

/* Each setup's variables, compiled and after an epoch, run alone. */
static float *fresh[2], *trained[2];

static int compile_on(castor_model *m, const tsan_setup *setup, castor_strategy **s)
{
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.host_threads = setup->host_threads;
    int rc = castor_strategy_create(s, setup->kind, setup->devices, &so);
    if (!rc)
        rc = castor_model_compile(m, *s, CASTOR_LOSS_SOFTMAX_XENT, NULL, setup->seed);
    return rc;
}

/* Everything castor.h says a model whose strategy was freed refuses. */
static void refuses_work(castor_model *m, const castor_dataset *ds, const char *what)
{
    size_t np = castor_model_num_params(m);
    float *p = calloc(np, sizeof *p), out[TSAN_C];
    castor_metrics met;
    CHECK(tsan_fit(m, ds, 1, BATCH, 1) == CASTOR_MISUSE, "%s: fit not refused", what);
    CHECK(castor_model_evaluate(m, ds, BATCH, &met) == CASTOR_MISUSE,
          "%s: evaluate not refused", what);
    CHECK(castor_model_predict(m, castor_dataset_x(ds), 1, 1, out) == CASTOR_MISUSE,
          "%s: predict not refused", what);
    CHECK(castor_model_get_params(m, p, np) == CASTOR_MISUSE, "%s: get_params not refused",
          what);
    CHECK(castor_model_set_params(m, p, np) == CASTOR_MISUSE, "%s: set_params not refused",
          what);
    CHECK(castor_model_save(m, "/nonexistent/castor-tsan.safetensors") == CASTOR_MISUSE,
          "%s: save not refused", what);
    CHECK(castor_model_num_layers(m) == 3 || castor_model_num_layers(m) == 2,
          "%s: the layers were lost", what);
    free(p);
}

/* A model through one or more strategies; which = the setup to start on. */
static void rounds(int which0, castor_dataset *ds, const char *who)
{
    for (int i = 0; i < ROUNDS; i++) {
        int which = (which0 + i) % 2;
        tsan_setup setup = setups[which];
        setup.host_threads = 1 + i % 3;
        char what[96];
        snprintf(what, sizeof what, "%s round %d (%s on %s)", who, i,
                 castor_strategy_kind_name(setup.kind), setup.devices);
        castor_strategy *s = NULL;
        castor_model *m = tsan_model(&setup, NULL, &s);
        if (!m)
            continue;
        size_t np = castor_model_num_params(m);
        int rc = tsan_fit(m, ds, 1, BATCH, 0);
        float *p = rc ? NULL : tsan_params(m);
        CHECK(tsan_same(p, trained[which], np), "%s: differs from the run alone", what);
        free(p);
        if (i % 2 == 0) {
            castor_model_free(m);
            castor_strategy_free(s);
            continue;
        }
        /* The strategy first: the model outlives it, detached. */
        castor_strategy_free(s);
        refuses_work(m, ds, what);
        /* Compiled again it starts afresh: the variables of a new model. */
        rc = compile_on(m, &setup, &s);
        CHECK(rc == CASTOR_OK && castor_model_step(m) == 0, "%s: compile again: %s", what,
              castor_model_errmsg(m));
        p = rc ? NULL : tsan_params(m);
        CHECK(tsan_same(p, fresh[which], np), "%s: compiled again, not afresh", what);
        free(p);
        rc = tsan_fit(m, ds, 1, BATCH, 0);
        p = rc ? NULL : tsan_params(m);
        CHECK(tsan_same(p, trained[which], np), "%s: trained after compiling again", what);
        free(p);
        castor_model_free(m);
        castor_strategy_free(s);
    }
}

typedef struct churn {
    int which0;
    char who[16];
} churn;

static void *churn_thread(void *arg)
{
    churn *c = arg;
    castor_dataset *ds = tsan_data(61, SAMPLES);
    rounds(c->which0, ds, c->who);
    castor_dataset_free(ds);
    return NULL;
}

/* The progress callback frees the model's strategy: fit stops with
 * CASTOR_MISUSE, the model detached (castor.h). */
typedef struct free_in_callback {
    castor_strategy *s;
    int calls;
} free_in_callback;

static int free_strategy(void *user, const castor_progress *p)
{
    (void)p;
    free_in_callback *f = user;
    if (++f->calls == 2) {
        castor_strategy_free(f->s);
        f->s = NULL;
    }
    return 0;
}

static void *callback_thread(void *arg)
{
    (void)arg;
    castor_dataset *ds = tsan_data(61, SAMPLES);
    free_in_callback f = {NULL, 0};
    castor_model *m = tsan_model(&setups[1], NULL, &f.s);
    if (m && ds) {
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.epochs = 2;
        fo.batch_size = BATCH;
        fo.progress = free_strategy;
        fo.progress_user = &f;
        int rc = castor_model_fit(m, ds, &fo, NULL);
        CHECK(rc == CASTOR_MISUSE && f.calls == 2 && !f.s,
              "strategy freed in the callback: rc %d after %d calls: %s", rc, f.calls,
              castor_model_errmsg(m));
        refuses_work(m, ds, "strategy freed in the callback");
    }
    castor_model_free(m);
    castor_strategy_free(f.s);
    castor_dataset_free(ds);
    return NULL;
}

void tsan_lifetimes(void)
{
    castor_dataset *ds = tsan_data(61, SAMPLES);
    for (int k = 0; k < 2; k++) {
        castor_strategy *s = NULL;
        castor_model *m = tsan_model(&setups[k], NULL, &s);
        if (m) {
            fresh[k] = tsan_params(m);
            CHECK(tsan_fit(m, ds, 1, BATCH, 0) == CASTOR_OK, "alone: %s",
                  castor_model_errmsg(m));
            trained[k] = tsan_params(m);
        }
        castor_model_free(m);
        castor_strategy_free(s);
    }
    castor_dataset_free(ds);
    if (fresh[0] && fresh[1] && trained[0] && trained[1]) {
        churn c[THREADS];
        for (int i = 0; i < THREADS; i++) {
            c[i].which0 = i % 2;
            snprintf(c[i].who, sizeof c[i].who, "thread %d", i);
        }
        pthread_t cb;
        pthread_create(&cb, NULL, callback_thread, NULL);
        tsan_parallel(THREADS, churn_thread, c, sizeof *c);
        pthread_join(cb, NULL);
    }
    for (int k = 0; k < 2; k++) {
        free(fresh[k]);
        free(trained[k]);
    }
}

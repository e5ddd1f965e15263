/*
 * A device fault on one replica while the others run: in a step (its
 * gradient phase and mirrored's update), in evaluate, predict, get_params,
 * set_params, save, load and compile, on central and mirrored, on three
 * emulated devices and on one shared by three replicas. The failed call
 * must wait for what it queued and leave the model as it was (a failed
 * compile: not compiled, the strategy free for it again), or (mirrored,
 * after its replicas may have diverged) refusing work until set_params;
 * either way the next step must give the very bits of a run that never
 * failed. Meanwhile another application thread trains a model of its own,
 * which must not notice.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/model.h"
#include "src/strategy.h"
#include "tests/fault_inject.h"
#include "tsan.h"

enum { SAMPLES = 60, BATCH = 12, WARM = 2 };

enum { ACT_STEP, ACT_EVALUATE, ACT_PREDICT, ACT_GET, ACT_SET, ACT_SAVE, ACT_LOAD };
static const char *const act_names[] = {"step",       "evaluate", "predict", "get_params",
                                        "set_params", "save",     "load"};

typedef struct fault_case {
    int act;
    int op;
    int replica;
    long at;
    int async;
    /* mirrored only: its replicas may disagree after it (the update, or
     * set_params and load placing the values) */
    int diverges;
} fault_case;

static const fault_case cases[] = {
    {ACT_STEP, OP_GEMM, 1, 1, 0, 0},
    {ACT_STEP, OP_GEMM, 2, 3, 1, 0},
    {ACT_STEP, OP_SYNC, 0, 1, 0, 0},
    {ACT_STEP, OP_D2H, 2, 1, 1, 0},
    {ACT_STEP, OP_OPTIM, 1, 1, 0, 1},   /* mirrored's update on the device */
    {ACT_STEP, OP_ADD, 0, 2, 0, 0},     /* mirrored on cpu:1x3: the sum on replica 0 */
    {ACT_EVALUATE, OP_XENT, 1, 1, 0, 0},
    {ACT_EVALUATE, OP_D2H, 2, 2, 1, 0},
    {ACT_PREDICT, OP_GEMM, 2, 2, 0, 0},
    {ACT_GET, OP_D2H, 0, 1, 0, 0},      /* mirrored reads replica 0 */
    {ACT_SET, OP_H2D, 2, 1, 0, 1},      /* mirrored places them on every replica */
    {ACT_SAVE, OP_D2H, 0, 2, 1, 0},     /* mirrored reads replica 0 */
    {ACT_LOAD, OP_H2D, 1, 1, 0, 1},     /* mirrored places them on every replica */
};

/* Faults in compile: central's touch only the caller's thread (buffers
 * and events), mirrored's also its replica threads (placing the initial
 * variables). */
static const fault_case compile_cases[] = {
    {0, OP_ALLOC, 2, 1, 0, 0},
    {0, OP_EVENT, 1, 2, 0, 0},
    {0, OP_H2D, 1, 1, 0, 0},
    {0, OP_SYNC, 2, 1, 0, 0},
};

/* What a run that never failed gives compiled, after WARM steps, and after
 * one more; where its files go. */
typedef struct reference {
    float *fresh, *warm, *next;
    char saved[4200], other[4200];
    castor_metrics met;
    float pred[SAMPLES * TSAN_C];
} reference;

static castor_model *warm_model(const tsan_setup *setup, const castor_dataset *ds,
                                castor_strategy **s)
{
    castor_model *m = tsan_model(setup, NULL, s);
    if (m && tsan_fit(m, ds, 1000, BATCH, WARM)) {
        CHECK(0, "warm-up: %s", castor_model_errmsg(m));
        castor_model_free(m);
        castor_strategy_free(*s);
        m = NULL;
    }
    return m;
}

static int make_reference(const tsan_setup *setup, const castor_dataset *ds, reference *ref)
{
    castor_strategy *s = NULL;
    castor_model *m = tsan_model(setup, NULL, &s);
    if (!m)
        return -1;
    ref->fresh = tsan_params(m);
    castor_model_free(m);
    castor_strategy_free(s);
    if (!(m = warm_model(setup, ds, &s)))
        return -1;
    ref->warm = tsan_params(m);
    int rc = castor_model_evaluate(m, ds, BATCH, &ref->met) ||
             castor_model_predict(m, castor_dataset_x(ds), SAMPLES, BATCH, ref->pred) ||
             tsan_fit(m, ds, 1000, BATCH, 1);
    CHECK(!rc, "reference: %s", castor_model_errmsg(m));
    ref->next = tsan_params(m);
    castor_model_free(m);
    castor_strategy_free(s);
    return rc || !ref->warm || !ref->next ? -1 : 0;
}

static int act(int a, castor_model *m, const castor_dataset *ds, const reference *ref,
               castor_metrics *met, float *pred)
{
    const float *params = ref->warm;
    size_t np = castor_model_num_params(m);
    switch (a) {
    case ACT_STEP:
        return tsan_fit(m, ds, 1000, BATCH, 1);
    case ACT_EVALUATE:
        return castor_model_evaluate(m, ds, BATCH, met);
    case ACT_PREDICT:
        return castor_model_predict(m, castor_dataset_x(ds), SAMPLES, BATCH, pred);
    case ACT_GET: {
        float *p = malloc(np * sizeof *p);
        int rc = castor_model_get_params(m, p, np);
        free(p);
        return rc;
    }
    case ACT_SET:
        return castor_model_set_params(m, params, np);
    case ACT_SAVE:
        return castor_model_save(m, ref->other);
    default:
        return castor_model_load(m, ref->saved);
    }
}

/* Whether the case's device operation runs at all in this call. */
static int reached(const fault_case *fc, const tsan_setup *setup)
{
    int mirrored = setup->kind == CASTOR_STRATEGY_MIRRORED;
    int shared = strcmp(setup->devices, "cpu:1x3") == 0;
    if (fc->op == OP_OPTIM)
        return mirrored;
    if (fc->op == OP_ADD)
        return mirrored && shared;
    if (fc->act == ACT_GET || fc->act == ACT_SET || fc->act == ACT_SAVE || fc->act == ACT_LOAD)
        return mirrored;  /* central's variables are on the host */
    return 1;
}

static void run_case(const tsan_setup *setup, const castor_dataset *ds, const reference *ref,
                     const fault_case *fc)
{
    char what[160];
    snprintf(what, sizeof what, "%s %s %s: %s #%ld on replica %d%s",
             castor_strategy_kind_name(setup->kind), setup->devices, act_names[fc->act],
             fault_op_names[fc->op], fc->at, fc->replica, fc->async ? " (queued)" : "");
    castor_strategy *s = NULL;
    castor_model *m = warm_model(setup, ds, &s);
    if (!m)
        return;
    size_t np = castor_model_num_params(m);
    float *before = tsan_params(m);
    CHECK(tsan_same(before, ref->warm, np), "%s: warm-up differs", what);
    /* The warm model's file, for load (its values are those of the run). */
    CHECK(castor_model_save(m, ref->saved) == CASTOR_OK, "%s: save: %s", what,
          castor_model_errmsg(m));
    /* get_params made the host's copy current; as if trained since, so that
     * mirrored's get_params and set_params read the replicas again. */
    m->host_params_current = setup->kind == CASTOR_STRATEGY_CENTRAL;
    int64_t step0 = castor_model_step(m);
    castor_metrics met;
    float pred[SAMPLES * TSAN_C];

    fault_arm(s, s->devs[fc->replica], fc->op, fc->at, fc->async);
    int rc = act(fc->act, m, ds, ref, &met, pred);
    fault_uninject();
    if (!reached(fc, setup)) {
        CHECK(rc == CASTOR_OK && !fault_failed, "%s: rc %d (%s), fired %d where nothing "
              "should run on the device", what, rc, castor_model_errmsg(m), fault_failed);
        goto done;
    }
    CHECK(fault_failed, "%s: not reached", what);
    CHECK(rc == CASTOR_DEVICE, "%s: rc %d: %s", what, rc, castor_model_errmsg(m));
    CHECK(strstr(castor_model_errmsg(m), "injected") != NULL, "%s: message '%s'", what,
          castor_model_errmsg(m));
    CHECK(castor_model_step(m) == step0, "%s: step moved", what);
    for (int i = 0; i < s->n_replicas; i++)
        CHECK(fault_queued(s, i) == 0, "%s: work left queued on replica %d", what, i);
    if (fc->act == ACT_SAVE) {
        FILE *f = fopen(ref->other, "rb");
        CHECK(!f, "%s: a file was written", what);
        if (f)
            fclose(f);
    }

    int mirrored = setup->kind == CASTOR_STRATEGY_MIRRORED;
    if (fc->diverges && mirrored) {
        /* castor.h: the model refuses work until set_params or load. */
        CHECK(tsan_fit(m, ds, 1000, BATCH, 1) == CASTOR_DEVICE, "%s: fit not refused", what);
        CHECK(castor_model_evaluate(m, ds, BATCH, &met) == CASTOR_DEVICE,
              "%s: evaluate not refused", what);
        CHECK(castor_model_set_params(m, ref->warm, np) == CASTOR_OK, "%s: set_params: %s",
              what, castor_model_errmsg(m));
    } else {
        float *now = tsan_params(m);
        CHECK(tsan_same(now, ref->warm, np), "%s: the variables changed", what);
        free(now);
        if (fc->act == ACT_EVALUATE) {
            rc = castor_model_evaluate(m, ds, BATCH, &met);
            CHECK(rc == CASTOR_OK && met.loss == ref->met.loss &&
                      met.accuracy == ref->met.accuracy,
                  "%s: evaluate again: rc %d, %.9g/%.9g, want %.9g/%.9g", what, rc, met.loss,
                  met.accuracy, ref->met.loss, ref->met.accuracy);
        }
        if (fc->act == ACT_PREDICT) {
            rc = castor_model_predict(m, castor_dataset_x(ds), SAMPLES, BATCH, pred);
            CHECK(rc == CASTOR_OK && tsan_same(pred, ref->pred, SAMPLES * TSAN_C),
                  "%s: predict again: rc %d, or other outputs", what, rc);
        }
    }
    rc = tsan_fit(m, ds, 1000, BATCH, 1);
    CHECK(rc == CASTOR_OK, "%s: the next step: %s", what, castor_model_errmsg(m));
    float *next = tsan_params(m);
    CHECK(tsan_same(next, ref->next, np), "%s: the next step differs from a run without the "
          "fault", what);
    free(next);
done:
    free(before);
    castor_model_free(m);
    castor_strategy_free(s);
}

/* A compile that fails leaves the model uncompiled and the strategy free;
 * compiled again, the model is a fresh one, bit for bit. */
static void compile_case(const tsan_setup *setup, const castor_dataset *ds, const reference *ref,
                         const fault_case *fc)
{
    char what[160];
    snprintf(what, sizeof what, "%s %s compile: %s #%ld on replica %d",
             castor_strategy_kind_name(setup->kind), setup->devices, fault_op_names[fc->op],
             fc->at, fc->replica);
    castor_strategy *s = NULL;
    castor_model *m = NULL;
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.host_threads = setup->host_threads;
    if (castor_strategy_create(&s, setup->kind, setup->devices, &so) ||
        castor_model_create(&m, TSAN_F) || castor_model_add_layers(m, setup->layers)) {
        CHECK(0, "%s: setting up", what);
        goto done;
    }
    fault_arm(s, s->devs[fc->replica], fc->op, fc->at, fc->async);
    int rc = castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, setup->seed);
    fault_uninject();
    int mirrored = setup->kind == CASTOR_STRATEGY_MIRRORED;
    if (!mirrored && (fc->op == OP_H2D || fc->op == OP_SYNC)) {
        CHECK(rc == CASTOR_OK && !fault_failed, "%s: rc %d (%s), fired %d where nothing "
              "should run on the device", what, rc, castor_model_errmsg(m), fault_failed);
        goto done;
    }
    CHECK(fault_failed && rc == CASTOR_DEVICE, "%s: fired %d, rc %d: %s", what, fault_failed, rc,
          castor_model_errmsg(m));
    CHECK(strstr(castor_model_errmsg(m), "injected") != NULL, "%s: message '%s'", what,
          castor_model_errmsg(m));
    for (int i = 0; i < s->n_replicas; i++)
        CHECK(fault_queued(s, i) == 0, "%s: work left queued on replica %d", what, i);
    CHECK(tsan_fit(m, ds, 1000, BATCH, 1) == CASTOR_MISUSE, "%s: fit not refused", what);
    rc = castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, setup->seed);
    CHECK(rc == CASTOR_OK, "%s: compile again: %s", what, castor_model_errmsg(m));
    if (rc)
        goto done;
    size_t np = castor_model_num_params(m);
    float *p = tsan_params(m);
    CHECK(tsan_same(p, ref->fresh, np), "%s: compiled again, not a fresh model", what);
    free(p);
    rc = tsan_fit(m, ds, 1000, BATCH, WARM);
    p = rc ? NULL : tsan_params(m);
    CHECK(tsan_same(p, ref->warm, np), "%s: trained after compiling again: rc %d", what, rc);
    free(p);
done:
    castor_model_free(m);
    castor_strategy_free(s);
}

static void *faulty_thread(void *arg)
{
    const char *dir = arg;
    static const tsan_setup setups[] = {
        {CASTOR_STRATEGY_CENTRAL, "cpu:3", TSAN_SMALL, 2, 5},
        {CASTOR_STRATEGY_MIRRORED, "cpu:3", TSAN_SMALL, 2, 5},
        {CASTOR_STRATEGY_CENTRAL, "cpu:1x3", TSAN_SMALL, 2, 5},
        {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", TSAN_SMALL, 2, 5},
    };
    castor_dataset *ds = tsan_data(5, SAMPLES);
    for (size_t i = 0; i < sizeof setups / sizeof *setups; i++) {
        reference ref = {0};
        snprintf(ref.saved, sizeof ref.saved, "%s/warm.safetensors", dir);
        snprintf(ref.other, sizeof ref.other, "%s/other.safetensors", dir);
        if (make_reference(&setups[i], ds, &ref) == 0) {
            for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
                run_case(&setups[i], ds, &ref, &cases[c]);
            for (size_t c = 0; c < sizeof compile_cases / sizeof *compile_cases; c++)
                compile_case(&setups[i], ds, &ref, &compile_cases[c]);
        }
        remove(ref.saved);
        remove(ref.other);
        free(ref.fresh);
        free(ref.warm);
        free(ref.next);
    }
    castor_dataset_free(ds);
    return NULL;
}

typedef struct bystander {
    atomic_int *done;
    int rounds, bad;  /* how many rounds varies with timing: checked once, at the end */
} bystander;

/* Trains a model of its own on another strategy, round after round, until
 * the faults are through: each round the same bits. */
static void *bystander_thread(void *arg)
{
    bystander *b = arg;
    const tsan_setup setup = {CASTOR_STRATEGY_MIRRORED, "cpu:2", TSAN_SMALL, 2, 9};
    castor_dataset *ds = tsan_data(9, SAMPLES);
    float *first = NULL;
    size_t np = 0;
    do {
        castor_strategy *s = NULL;
        castor_model *m = tsan_model(&setup, NULL, &s);
        if (!m)
            break;
        np = castor_model_num_params(m);
        float *p = tsan_fit(m, ds, 1, BATCH, 0) ? NULL : tsan_params(m);
        if (!first && p) {
            first = p;
        } else {
            b->bad += !tsan_same(p, first, np);
            free(p);
        }
        b->rounds++;
        castor_model_free(m);
        castor_strategy_free(s);
    } while (!atomic_load(b->done));
    free(first);
    castor_dataset_free(ds);
    return NULL;
}

void tsan_faults(void)
{
    atomic_int done = 0;
    bystander b = {&done, 0, 0};
    pthread_t by;
    pthread_create(&by, NULL, bystander_thread, &b);
    char *dir = tsan_tmpdir();
    faulty_thread(dir);
    atomic_store(&done, 1);
    pthread_join(by, NULL);
    CHECK(tsan_dir_entries(dir) == 0, "faults: %d files left behind (a temporary file of a "
          "failed save?)", tsan_dir_entries(dir));
    tsan_rmdir(dir);
    free(dir);
    CHECK(b.rounds > 1 && b.bad == 0, "the bystander trained %d rounds beside the faults, %d "
          "of them failed or differ from its first", b.rounds, b.bad);
}

/*
 * Callbacks while the replica threads and the host pool run: fit's
 * progress callback with validation data, reading and saving the model it
 * is called for; and castor_strategy_options.log_fn, which castor.h says
 * is called on the thread of the castor call that logs (so, for one
 * handle, never twice at once), here with the warnings that a step whose
 * replicas all fail gives. Several application threads at once, each
 * trace equal, bit for bit, to its run alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/strategy.h"
#include "tsan.h"

/* ---- progress ---- */

enum { SAMPLES = 240, VALIDATION = 40, BATCH = 25, EPOCHS = 3, MAX_CALLS = 32 };

typedef struct progress_run {
    tsan_setup setup;
    char path[4200];                /* saved from the callback at each epoch's end */
    pthread_t owner;
    castor_model *m;
    const castor_dataset *train;
    castor_progress calls[MAX_CALLS];
    int n_calls;
    int bad;                        /* what the callback found wrong, counted */
    float *params;                  /* after fit */
    float *saved;                   /* the file of the last epoch, loaded back */
    size_t n_params;
} progress_run;

static int on_progress(void *user, const castor_progress *p)
{
    progress_run *r = user;
    if (!pthread_equal(pthread_self(), r->owner))
        r->bad++;  /* castor.h: called on fit's thread */
    if (r->n_calls < MAX_CALLS) {
        r->calls[r->n_calls] = *p;
    }
    r->n_calls++;
    /* What the callback may do: read and save the model... */
    float *params = malloc(r->n_params * sizeof *params);
    if (castor_model_get_params(r->m, params, r->n_params) != CASTOR_OK)
        r->bad++;
    free(params);
    if (p->epoch_end && castor_model_save(r->m, r->path) != CASTOR_OK)
        r->bad++;
    /* ...and what it may not: run it, or split the data fit reads. */
    castor_metrics met;
    castor_dataset *tail = NULL;
    if (castor_model_evaluate(r->m, r->train, BATCH, &met) != CASTOR_MISUSE)
        r->bad++;
    if (castor_dataset_split_tail((castor_dataset *)r->train, 1, &tail) != CASTOR_MISUSE)
        r->bad++;
    return 0;
}

static void *progress_thread(void *arg)
{
    progress_run *r = arg;
    r->owner = pthread_self();
    castor_dataset *train = tsan_data(21, SAMPLES), *val = NULL;
    if (!train || castor_dataset_split_tail(train, VALIDATION, &val)) {
        CHECK(0, "progress: the data");
        castor_dataset_free(train);
        return NULL;
    }
    castor_strategy *s = NULL;
    castor_model *m = tsan_model(&r->setup, NULL, &s);
    if (m) {
        r->m = m;
        r->train = train;
        r->n_params = castor_model_num_params(m);
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.epochs = EPOCHS;
        fo.batch_size = BATCH;
        fo.validation = val;
        fo.progress = on_progress;
        fo.progress_user = r;
        int rc = castor_model_fit(m, train, &fo, NULL);
        CHECK(rc == CASTOR_OK, "progress: fit on %s: %s", r->setup.devices,
              castor_model_errmsg(m));
        r->params = tsan_params(m);
        castor_model *back = NULL;
        castor_strategy *s2 = NULL;
        castor_model_free(m);
        castor_strategy_free(s);
        /* The last epoch's file holds what fit ended with. */
        const tsan_setup one = {r->setup.kind, "cpu", r->setup.layers, 1, 0};
        if (castor_strategy_create(&s2, one.kind, one.devices, NULL) == CASTOR_OK &&
            castor_model_open(&back, r->path, s2) == CASTOR_OK)
            r->saved = tsan_params(back);
        else
            CHECK(0, "progress: open %s: %s", r->path, castor_model_errmsg(back));
        castor_model_free(back);
        castor_strategy_free(s2);
    }
    castor_dataset_free(val);
    castor_dataset_free(train);
    return NULL;
}

/* Bits, not ==: a NaN (val_loss before an epoch's end) equals itself. */
static int same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Field by field: a struct's padding is no part of what castor reports. */
static int same_report(const castor_progress *a, const castor_progress *b)
{
    return a->epoch == b->epoch && a->epochs == b->epochs &&
           a->step_in_epoch == b->step_in_epoch && a->steps_per_epoch == b->steps_per_epoch &&
           a->global_step == b->global_step && same_bits(a->loss, b->loss) &&
           same_bits(a->accuracy, b->accuracy) && a->epoch_end == b->epoch_end &&
           same_bits(a->val_loss, b->val_loss) && same_bits(a->val_accuracy, b->val_accuracy);
}

static void progress_same(const progress_run *got, const progress_run *want, const char *what)
{
    const char *dev = got->setup.devices;
    CHECK(got->bad == 0, "%s %s: the callback found %d things wrong", what, dev, got->bad);
    CHECK(got->n_calls == want->n_calls && got->n_calls == EPOCHS * (SAMPLES - VALIDATION) /
                                                               BATCH,
          "%s %s: %d progress calls, alone %d", what, dev, got->n_calls, want->n_calls);
    int n = got->n_calls < MAX_CALLS ? got->n_calls : MAX_CALLS, same = 1;
    for (int i = 0; i < n && got->n_calls == want->n_calls; i++)
        same &= same_report(&got->calls[i], &want->calls[i]);
    CHECK(same, "%s %s: the progress reports (losses, validation) differ from the run alone",
          what, dev);
    CHECK(got->params && tsan_same(got->params, want->params, want->n_params),
          "%s %s: the variables differ from the run alone", what, dev);
    CHECK(got->saved && tsan_same(got->saved, got->params, got->n_params),
          "%s %s: the file saved at the last epoch's end is not what fit ended with", what,
          dev);
}

static void progress_free(progress_run *r)
{
    free(r->params);
    free(r->saved);
    remove(r->path);
}

static void progress_runs(const char *dir)
{
    const tsan_setup setups[2] = {{CASTOR_STRATEGY_MIRRORED, "cpu:3", TSAN_BIG, 2, 3},
                                  {CASTOR_STRATEGY_CENTRAL, "cpu:1x3", TSAN_SMALL, 3, 4}};
    progress_run *alone = calloc(2, sizeof *alone), *par = calloc(4, sizeof *par);
    for (int i = 0; i < 2; i++) {
        alone[i].setup = setups[i];
        snprintf(alone[i].path, sizeof alone[i].path, "%s/alone%d.safetensors", dir, i);
        progress_thread(&alone[i]);
    }
    for (int i = 0; i < 4; i++) {
        par[i].setup = setups[i % 2];
        snprintf(par[i].path, sizeof par[i].path, "%s/par%d.safetensors", dir, i);
    }
    tsan_parallel(4, progress_thread, par, sizeof *par);
    for (int i = 0; i < 4; i++)
        progress_same(&par[i], &alone[i % 2], "four threads at once");
    for (int i = 0; i < 2; i++)
        progress_same(&alone[i], &alone[i], "alone");
    for (int i = 0; i < 4; i++)
        progress_free(&par[i]);
    for (int i = 0; i < 2; i++)
        progress_free(&alone[i]);
    free(alone);
    free(par);
}

/* ---- log_fn ---- */

typedef struct log_run {
    tsan_setup setup;
    pthread_t owner;
    atomic_int inside;         /* calls in progress: more than one is two at once */
    int calls, info, warn, elsewhere, overlapped;
    char warnings[2][256];
} log_run;

static void on_log(void *user, castor_log_level level, const char *message)
{
    log_run *r = user;
    if (atomic_fetch_add(&r->inside, 1) != 0)
        r->overlapped++;
    if (!pthread_equal(pthread_self(), r->owner))
        r->elsewhere++;
    r->calls++;
    if (level == CASTOR_LOG_INFO)
        r->info++;
    if (level == CASTOR_LOG_WARN && r->warn < 2)
        snprintf(r->warnings[r->warn], sizeof r->warnings[0], "%s", message);
    if (level == CASTOR_LOG_WARN)
        r->warn++;
    atomic_fetch_sub(&r->inside, 1);
}

static int refuse_h2d(cdev *dev, int stream, void *d_dst, const void *h_src, size_t bytes)
{
    (void)stream, (void)d_dst, (void)h_src, (void)bytes;
    return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: refused", dev->name);
}

/* Every replica's uploads fail in one step: replica 0's failure is fit's
 * error, the other two are logged, from the thread that called fit. */
static void *log_thread(void *arg)
{
    log_run *r = arg;
    r->owner = pthread_self();
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.host_threads = 2;
    so.log_level = CASTOR_LOG_DEBUG;
    so.log_fn = on_log;
    so.log_user = r;
    castor_strategy *s = NULL;
    castor_model *m = tsan_model(&r->setup, &so, &s);
    castor_dataset *ds = tsan_data(31, 90);
    /* One step first: a model's first fit uploads mirrored's optimizer
     * state, where a refused copy stops the fit before any step. */
    if (m && ds && tsan_fit(m, ds, 1, 30, 1) != CASTOR_OK) {
        CHECK(0, "log: first fit: %s", castor_model_errmsg(m));
    } else if (m && ds) {
        const cdev_iface *real[3];
        cdev_iface failing[3];
        for (int i = 0; i < 3; i++) {
            real[i] = s->devs[i]->iface;
            failing[i] = *real[i];
            failing[i].copy_h2d = refuse_h2d;
            s->devs[i]->iface = &failing[i];
        }
        int rc = tsan_fit(m, ds, 1, 30, 1);
        for (int i = 0; i < 3; i++)
            s->devs[i]->iface = real[i];
        CHECK(rc == CASTOR_DEVICE, "log: fit with failing replicas: rc %d", rc);
        rc = tsan_fit(m, ds, 1, 30, 0);
        CHECK(rc == CASTOR_OK, "log: fit again: %s", castor_model_errmsg(m));
    }
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
    return NULL;
}

static void log_runs(void)
{
    const tsan_setup setups[3] = {{CASTOR_STRATEGY_CENTRAL, "cpu:3", TSAN_BIG, 2, 1},
                                  {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", TSAN_SMALL, 2, 1},
                                  {CASTOR_STRATEGY_MIRRORED, "cpu:3", TSAN_BIG, 2, 1}};
    log_run runs[3];
    memset(runs, 0, sizeof runs);
    for (int i = 0; i < 3; i++)
        runs[i].setup = setups[i];
    tsan_parallel(3, log_thread, runs, sizeof *runs);
    for (int i = 0; i < 3; i++) {
        log_run *r = &runs[i];
        const char *dev = r->setup.devices;
        int shared = strcmp(dev, "cpu:1x3") == 0;
        CHECK(r->elsewhere == 0 && r->overlapped == 0,
              "log on %s: %d of %d calls on another thread than the caller's, %d at once", dev,
              r->elsewhere, r->calls, r->overlapped);
        /* The strategy, the compile (and mirrored's reduction) say what they did. */
        CHECK(r->info >= 2, "log on %s: %d info messages", dev, r->info);
        CHECK(r->warn == 2, "log on %s: %d warnings, want 2", dev, r->warn);
        char want[2][64];
        for (int k = 0; k < 2; k++)
            snprintf(want[k], sizeof want[k], "replica %d (%s%d) failed too", k + 1,
                     shared ? "cpu:0#" : "cpu:", k + 1);
        CHECK(r->warn == 2 && strstr(r->warnings[0], want[0]) && strstr(r->warnings[1], want[1]),
              "log on %s: '%s', '%s'", dev, r->warnings[0], r->warnings[1]);
    }
}

void tsan_callbacks(void)
{
    char *dir = tsan_tmpdir();
    progress_runs(dir);
    tsan_rmdir(dir);
    free(dir);
    log_runs();
}

/*
 * castor_model_set_stop_check: how a signal handler or another thread stops
 * a long evaluate, predict or fit. Each stops at its next batch or step with
 * CASTOR_INTERRUPTED, leaves the model as a callback's stop would, and runs
 * whole again once the check says go on; fit's validation pass is never cut.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "model_api_support.h"
#include "src/model.h"
#include "support.h"

/* Says stop from its stop_at-th call on (0: never). */
typedef struct stopper {
    int calls, stop_at;
} stopper;

static int stop_from(void *user)
{
    stopper *s = user;
    s->calls++;
    return s->stop_at && s->calls >= s->stop_at;
}

/* A model on cpu:2, and the stopper installed. */
static castor_model *stoppable(castor_strategy **s, castor_strategy_kind kind, stopper *st)
{
    cr_assert_eq(castor_strategy_create(s, kind, "cpu:2", NULL), CASTOR_OK);
    castor_model *m = compiled(*s, "8:relu,3");
    cr_assert_eq(castor_model_set_stop_check(m, stop_from, st), CASTOR_OK);
    return m;
}

Test(stop_check, evaluate_and_predict_stop_at_the_next_batch)
{
    castor_dataset *ds = small_dataset();
    stopper st = {0, 0};
    castor_strategy *s = NULL;
    castor_model *m = stoppable(&s, CASTOR_STRATEGY_CENTRAL, &st);
    castor_metrics whole, met = {-1, -1, 7};
    cr_assert_eq(castor_model_evaluate(m, ds, 16, &whole), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    cr_assert_eq(st.calls, N / 16, "one check before each of the %d batches", N / 16);

    /* Stop before the third batch: two of three ran. */
    st = (stopper){0, 3};
    cr_assert_eq(castor_model_evaluate(m, ds, 16, &met), CASTOR_INTERRUPTED);
    cr_assert_str_eq(castor_model_errmsg(m), "evaluate: stopped after 32 of 48 samples");
    cr_assert_eq(met.samples, 7, "an interrupted evaluate leaves out alone");
    /* A flag already set stops it before any batch. */
    st = (stopper){0, 1};
    cr_assert_eq(castor_model_evaluate(m, ds, 16, &met), CASTOR_INTERRUPTED);
    cr_assert_str_eq(castor_model_errmsg(m), "evaluate: stopped after 0 of 48 samples");

    float x[N * F], out[N * 3], again[N * 3];
    memcpy(x, castor_dataset_x(ds), sizeof x);
    st = (stopper){0, 0};
    cr_assert_eq(castor_model_predict(m, x, N, 16, out), CASTOR_OK);
    st = (stopper){0, 2};
    cr_assert_eq(castor_model_predict(m, x, N, 16, again), CASTOR_INTERRUPTED);
    cr_assert_str_eq(castor_model_errmsg(m), "predict: stopped after 16 of 48 samples");

    /* Told to go on (or with no check), both run whole, as before. */
    st = (stopper){0, 0};
    cr_assert_eq(castor_model_evaluate(m, ds, 16, &met), CASTOR_OK);
    cr_assert(met.loss == whole.loss && met.accuracy == whole.accuracy);
    cr_assert_eq(castor_model_set_stop_check(m, NULL, NULL), CASTOR_OK);
    cr_assert_eq(castor_model_predict(m, x, N, 16, again), CASTOR_OK);
    cr_assert_arr_eq(again, out, sizeof out);
    cr_assert_eq(castor_model_set_stop_check(NULL, stop_from, &st), CASTOR_MISUSE);

    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

Test(stop_check, a_stopped_fit_goes_on_to_the_same_model)
{
    castor_dataset *ds = small_dataset();
    for (int kind = CASTOR_STRATEGY_CENTRAL; kind <= CASTOR_STRATEGY_MIRRORED; kind++) {
        const char *name = castor_strategy_kind_name((castor_strategy_kind)kind);
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.epochs = 2;
        fo.batch_size = 8;  /* 6 steps an epoch */
        castor_metrics last;

        stopper never = {0, 0};
        castor_strategy *s1 = NULL;
        castor_model *whole = stoppable(&s1, (castor_strategy_kind)kind, &never);
        cr_assert_eq(castor_model_fit(whole, ds, &fo, &last), CASTOR_OK, "%s",
                     castor_model_errmsg(whole));
        cr_assert_eq(never.calls, 12, "%s: one check before each step, not %d", name,
                     never.calls);
        float *want = model_params(whole);

        /* Stopped before step 4: three steps taken, mid-epoch. */
        stopper st = {0, 4};
        castor_strategy *s2 = NULL;
        castor_model *m = stoppable(&s2, (castor_strategy_kind)kind, &st);
        cr_assert_eq(castor_model_fit(m, ds, &fo, &last), CASTOR_INTERRUPTED, "%s: %s", name,
                     castor_model_errmsg(m));
        cr_assert_str_eq(castor_model_errmsg(m), "fit: stopped after step 3");
        cr_assert_eq(castor_model_step(m), 3);
        cr_assert_eq(castor_model_step_in_epoch(m), 3);
        cr_assert(isnan(last.loss) && last.samples == 0, "%s: no epoch ended", name);
        /* Going on: the rest of the first epoch and the second. */
        st = (stopper){0, 0};
        cr_assert_eq(castor_model_fit(m, ds, &fo, &last), CASTOR_OK, "%s: %s", name,
                     castor_model_errmsg(m));
        cr_assert_eq(castor_model_step(m), 12);
        float *got = model_params(m);
        cr_assert_arr_eq(got, want, castor_model_num_params(m) * sizeof(float),
                         "%s: the stopped and resumed fit ends elsewhere", name);
        free(got);
        free(want);
        castor_model_free(m);
        castor_strategy_free(s2);
        castor_model_free(whole);
        castor_strategy_free(s1);
    }
    castor_dataset_free(ds);
}

typedef struct epoch_end {
    stopper *st;
    double val_loss;
    int ends;
} epoch_end;

/* After the check before the first epoch's last step, the check says stop:
 * a validation pass that polled it would be cut. */
static int arm_at_epoch_end(void *user, const castor_progress *p)
{
    epoch_end *e = user;
    if (p->step_in_epoch == p->steps_per_epoch - 1)
        e->st->stop_at = e->st->calls + 2;
    if (p->epoch_end) {
        e->ends++;
        e->val_loss = p->val_loss;
    }
    return 0;
}

Test(stop_check, the_validation_pass_at_an_epoch_end_runs_whole)
{
    castor_dataset *ds = small_dataset();
    castor_dataset *val = NULL;
    cr_assert_eq(castor_dataset_split_tail(ds, 16, &val), CASTOR_OK);
    stopper st = {0, 0};
    castor_strategy *s = NULL;
    castor_model *m = stoppable(&s, CASTOR_STRATEGY_CENTRAL, &st);
    epoch_end e = {&st, NAN, 0};
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 3;
    fo.batch_size = 8;  /* 4 steps an epoch */
    fo.validation = val;
    fo.progress = arm_at_epoch_end;
    fo.progress_user = &e;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_INTERRUPTED, "%s",
                 castor_model_errmsg(m));
    /* The last step ran, its epoch's validation and callback came, and fit
     * stopped before the next epoch's first step. */
    cr_assert_eq(castor_model_step(m), 4);
    cr_assert_eq(castor_model_epoch(m), 1);
    cr_assert_eq(e.ends, 1);
    cr_assert(isfinite(e.val_loss), "the validation pass was cut: %g", e.val_loss);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(val);
    castor_dataset_free(ds);
}

Test(stop_check, a_fit_stopped_before_its_first_step_changes_nothing)
{
    /* At an epoch boundary a fit stopped before any step recorded its own
     * batch size as the epoch's, which a checkpoint then carried and a
     * resume without --batch adopted. */
    castor_dataset *ds = small_dataset();
    stopper st = {0, 0};
    castor_strategy *s = NULL;
    castor_model *m = stoppable(&s, CASTOR_STRATEGY_CENTRAL, &st);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 8;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(m->epoch_batch, 8);
    st = (stopper){0, 1};
    fo.batch_size = 16;
    fo.shuffle = 0;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_INTERRUPTED);
    cr_assert_str_eq(castor_model_errmsg(m), "fit: stopped after step 6");
    cr_assert_eq(castor_model_step(m), 6);
    cr_assert_eq(castor_model_epoch(m), 1);
    cr_assert_eq(m->epoch_batch, 8, "the stopped fit's batch size was recorded: %d",
                 m->epoch_batch);
    cr_assert_eq(m->epoch_shuffle, 1);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

/* A stop check that calls back into castor: frees the strategy, or tries
 * what it may not. */
typedef struct meddler {
    castor_model *m;
    castor_strategy *s;
    castor_dataset *ds;
    int free_strategy, calls, refused;
} meddler;

static int meddle(void *user)
{
    meddler *d = user;
    if (d->calls++ != 1)  /* the second check: a batch or step has run */
        return 0;
    if (d->free_strategy) {
        castor_strategy_free(d->s);
        d->s = NULL;
        return 0;
    }
    size_t n = castor_model_num_params(d->m);
    float *p = calloc(n, sizeof *p);
    cr_assert(p);
    castor_metrics met;
    castor_dataset *tail = NULL;
    d->refused += castor_model_set_params(d->m, p, n) == CASTOR_MISUSE;
    d->refused += castor_model_evaluate(d->m, d->ds, 16, &met) == CASTOR_MISUSE;
    d->refused += castor_dataset_split_tail(d->ds, 8, &tail) == CASTOR_MISUSE;
    /* From predict's check the split goes through (predict reads the
     * caller's array, not ds): the tail is this test's to free. */
    castor_dataset_free(tail);
    free(p);
    return 0;
}

Test(stop_check, a_check_that_frees_the_strategy_stops_the_call)
{
    /* fit, evaluate and predict went on to the freed runtime: a crash. */
    castor_dataset *ds = small_dataset();
    float x[N * F], out[N * 3];
    memcpy(x, castor_dataset_x(ds), sizeof x);
    for (int call = 0; call < 3; call++) {
        meddler d = {NULL, NULL, ds, 1, 0, 0};
        cr_assert_eq(castor_strategy_create(&d.s, CASTOR_STRATEGY_MIRRORED, "cpu:2", NULL),
                     CASTOR_OK);
        d.m = compiled(d.s, "8:relu,3");
        cr_assert_eq(castor_model_set_stop_check(d.m, meddle, &d), CASTOR_OK);
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.batch_size = 16;
        castor_metrics met;
        int rc = call == 0   ? castor_model_fit(d.m, ds, &fo, NULL)
                 : call == 1 ? castor_model_evaluate(d.m, ds, 16, &met)
                             : castor_model_predict(d.m, x, N, 16, out);
        const char *what[] = {"fit", "evaluate", "predict"};
        cr_assert_eq(rc, CASTOR_MISUSE, "%s: %d", what[call], rc);
        char want[96];
        snprintf(want, sizeof want, "%s: the strategy was freed during the stop check",
                 what[call]);
        cr_assert_str_eq(castor_model_errmsg(d.m), want);
        cr_assert_eq(castor_model_evaluate(d.m, ds, 16, &met), CASTOR_MISUSE, "detached");
        castor_model_free(d.m);
    }
    castor_dataset_free(ds);
}

/* Frees its model at its second call. */
typedef struct freer {
    castor_model *m;
    int calls;
} freer;

static int free_model_check(void *user)
{
    freer *f = user;
    if (f->calls++ == 1)
        castor_model_free(f->m);
    return 0;
}

static int free_model_progress(void *user, const castor_progress *p)
{
    (void)p;
    return free_model_check(user);
}

Test(stop_check, a_check_or_callback_that_frees_the_model_stops_the_call)
{
    /* The call went on with the freed model: a use after free (ASan). Now
     * it stops with CASTOR_MISUSE and frees the model as it returns. */
    castor_dataset *ds = small_dataset();
    float x[N * F], out[N * 3];
    memcpy(x, castor_dataset_x(ds), sizeof x);
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    const char *what[] = {"fit's stop check", "evaluate's stop check", "predict's stop check",
                          "fit's progress callback"};
    for (int call = 0; call < 4; call++) {
        /* Compiles only if the last model let go of the strategy. */
        freer f = {compiled(s, "8:relu,3"), 0};
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.batch_size = 16;
        fo.epochs = 3;
        if (call < 3)
            cr_assert_eq(castor_model_set_stop_check(f.m, free_model_check, &f), CASTOR_OK);
        else
            fo.progress = free_model_progress, fo.progress_user = &f;
        castor_metrics met;
        int rc = call == 0 || call == 3 ? castor_model_fit(f.m, ds, &fo, NULL)
                 : call == 1            ? castor_model_evaluate(f.m, ds, 16, &met)
                                        : castor_model_predict(f.m, x, N, 16, out);
        cr_assert_eq(rc, CASTOR_MISUSE, "%s freed the model: status %d", what[call], rc);
        cr_assert_eq(f.calls, 2, "%s was called %d times after it freed the model", what[call],
                     f.calls - 2);
    }
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

Test(stop_check, evaluate_and_predict_refuse_changes_from_their_check)
{
    /* From evaluate's check, set_params went through: the metrics mixed
     * the batches of two models. */
    castor_dataset *ds = small_dataset();
    float x[N * F], out[N * 3];
    memcpy(x, castor_dataset_x(ds), sizeof x);
    meddler d = {NULL, NULL, ds, 0, 0, 0};
    cr_assert_eq(castor_strategy_create(&d.s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    d.m = compiled(d.s, "8:relu,3");
    castor_metrics whole, met;
    cr_assert_eq(castor_model_evaluate(d.m, ds, 16, &whole), CASTOR_OK);
    cr_assert_eq(castor_model_set_stop_check(d.m, meddle, &d), CASTOR_OK);
    cr_assert_eq(castor_model_evaluate(d.m, ds, 16, &met), CASTOR_OK, "%s",
                 castor_model_errmsg(d.m));
    cr_assert_eq(d.refused, 3, "evaluate's check: %d of 3 refused", d.refused);
    cr_assert(met.loss == whole.loss, "the model changed under evaluate: %g, not %g", met.loss,
              whole.loss);
    cr_assert(strstr(castor_model_errmsg(d.m), "called from inside evaluate, from its stop "
                                                "check"),
              "%s", castor_model_errmsg(d.m));
    d.calls = d.refused = 0;
    cr_assert_eq(castor_model_predict(d.m, x, N, 16, out), CASTOR_OK, "%s",
                 castor_model_errmsg(d.m));
    cr_assert_eq(d.refused, 2, "predict's check: %d of 2 refused (the data is the caller's)",
                 d.refused);
    castor_model_free(d.m);
    castor_strategy_free(d.s);
    castor_dataset_free(ds);
}

Test(stop_check, a_fit_that_trains_nothing_keeps_the_data_kind, .init = support_dir_init,
     .fini = support_dir_fini)
{
    /* The kind of data a model is trained on (IDX type and sample shape)
     * goes into its checkpoints; a fit stopped before its first step took
     * its data's, and the CLI then refused the model's own data. */
    unsigned char img[64 + N * F], lab[64 + N];
    uint32_t idims[3] = {N, 2, 3}, ldims[1] = {N};
    unsigned char labels[N];
    for (int i = 0; i < N; i++)
        labels[i] = (unsigned char)(i % 3);
    char ip[SUPPORT_PATH_LEN], lp[SUPPORT_PATH_LEN];
    support_write_in(ip, "img", img, support_idx_build_ubyte(img, 3, idims, N * F));
    support_write_in(lp, "lab", lab, support_idx_build(lab, 0x08, 1, ldims, labels, N));
    castor_dataset *idx = NULL;
    cr_assert_eq(castor_dataset_load_idx(&idx, ip, lp), CASTOR_OK, "%s",
                 castor_dataset_errmsg(idx));
    stopper st = {0, 1};
    castor_strategy *s = NULL;
    castor_model *m = stoppable(&s, CASTOR_STRATEGY_CENTRAL, &st);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 16;
    cr_assert_eq(castor_model_fit(m, idx, &fo, NULL), CASTOR_INTERRUPTED);
    cr_assert_eq(m->in_rank, 0, "a fit that trained nothing recorded a %dx%d sample shape",
                 m->in_dims[0], m->in_dims[1]);
    st = (stopper){0, 0};
    fo.max_steps = 1;
    cr_assert_eq(castor_model_fit(m, idx, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert(m->in_rank == 2 && m->in_dims[0] == 2 && m->in_dims[1] == 3 && m->in_type == 0x08,
              "one step records the data's kind: rank %d, %ux%u, type %d", m->in_rank,
              m->in_dims[0], m->in_dims[1], m->in_type);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(idx);
}

/*
 * fit's progress callback calling back into castor: it may read the model
 * and save it; running, changing or freeing what fit is working on is
 * refused, and the fit goes on as it began.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "model_api_support.h"
#include "support.h"

typedef struct reentry {
    castor_model *m;
    castor_dataset *ds;
    castor_strategy *s;
    int free_strategy_at;  /* 0: never */
    int calls, refused, saved;
} reentry;

static int reenter(void *user, const castor_progress *p)
{
    reentry *r = user;
    r->calls++;
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = 8;
    castor_metrics met;
    float x[F] = {0}, out[3];
    size_t n = castor_model_num_params(r->m);
    float *params = malloc(n * sizeof *params);
    cr_assert(params);
    /* Reading and saving are fine; running, changing or reloading are not
     * (a nested fit trained the next epoch on this one's shuffle). */
    cr_assert_eq(castor_model_get_params(r->m, params, n), CASTOR_OK, "%s",
                 castor_model_errmsg(r->m));
    char path[SUPPORT_PATH_LEN];
    support_path_in(path, "in-callback.safetensors");
    r->saved += castor_model_save(r->m, path) == CASTOR_OK;
    r->refused += castor_model_fit(r->m, r->ds, &fo, &met) == CASTOR_MISUSE;
    r->refused += castor_model_evaluate(r->m, r->ds, 8, &met) == CASTOR_MISUSE;
    r->refused += castor_model_predict(r->m, x, 1, 1, out) == CASTOR_MISUSE;
    r->refused += castor_model_set_params(r->m, params, n) == CASTOR_MISUSE;
    r->refused += castor_model_load(r->m, path) == CASTOR_MISUSE;
    cr_assert(strstr(castor_model_errmsg(r->m), "progress callback"), "%s",
              castor_model_errmsg(r->m));
    free(params);
    if (r->free_strategy_at && p->global_step == r->free_strategy_at) {
        castor_strategy_free(r->s);
        r->s = NULL;
        /* Compiling the detached model again under the running fit reset
         * its position: fit then never finished its epoch. */
        castor_strategy *again = NULL;
        cr_assert_eq(castor_strategy_create(&again, CASTOR_STRATEGY_CENTRAL, "cpu", NULL),
                     CASTOR_OK);
        cr_assert_eq(castor_model_compile(r->m, again, CASTOR_LOSS_SOFTMAX_XENT, NULL, 3),
                     CASTOR_MISUSE, "%s", castor_model_errmsg(r->m));
        castor_strategy_free(again);
    }
    return 0;
}

Test(fit_callback, the_progress_callback_may_read_and_save_not_run_or_change,
     .init = support_dir_init, .fini = support_dir_fini)
{
    for (int free_at = 0; free_at <= 2; free_at += 2) {
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL),
                     CASTOR_OK);
        castor_dataset *ds = small_dataset();
        castor_model *m = compiled(s, "5:relu,3");
        reentry r = {m, ds, s, free_at, 0, 0, 0};
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.epochs = 2;
        fo.batch_size = 8;
        fo.progress = reenter;
        fo.progress_user = &r;
        int rc = castor_model_fit(m, ds, &fo, NULL);
        if (free_at) {
            /* Freed under the loop: fit stops there (it dereferenced the
             * freed strategy). */
            cr_assert_eq(rc, CASTOR_MISUSE, "rc %d: %s", rc, castor_model_errmsg(m));
            cr_assert(strstr(castor_model_errmsg(m), "freed"), "%s", castor_model_errmsg(m));
            cr_assert_eq(r.calls, free_at);
        } else {
            cr_assert_eq(rc, CASTOR_OK, "%s", castor_model_errmsg(m));
            cr_assert_eq(r.calls, 2 * N / 8);
            cr_assert_eq(castor_model_step(m), 2 * N / 8, "nothing nested trained");
            /* After fit returns, the model runs again. */
            castor_metrics met;
            cr_assert_eq(castor_model_evaluate(m, ds, 8, &met), CASTOR_OK, "%s",
                         castor_model_errmsg(m));
        }
        cr_assert_eq(r.refused, 5 * r.calls);
        cr_assert_eq(r.saved, r.calls);
        castor_model_free(m);
        castor_strategy_free(r.s);
        castor_dataset_free(ds);
    }
}

/* The callback may reach the datasets fit is reading: splitting one then
 * shrank it under the loop, which gathered rows past its end. */
typedef struct split_in_callback {
    castor_dataset *train, *val;
    int refused, calls;
} split_in_callback;

static int split_during_fit(void *user, const castor_progress *p)
{
    (void)p;
    split_in_callback *c = user;
    castor_dataset *tail = NULL;
    c->calls++;
    c->refused += castor_dataset_split_tail(c->train, 8, &tail) == CASTOR_MISUSE;
    cr_assert(!tail);
    c->refused += castor_dataset_split_tail(c->val, 2, &tail) == CASTOR_MISUSE;
    cr_assert(!tail);
    cr_assert(strstr(castor_dataset_errmsg(c->val), "in use"), "%s",
              castor_dataset_errmsg(c->val));
    return 0;
}

Test(fit_callback, datasets_fit_is_reading_are_not_split_under_it)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    castor_model *m = compiled(s, "5:relu,3");
    castor_dataset *train = small_dataset(), *val = small_dataset();
    split_in_callback c = {train, val, 0, 0};
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 2;
    fo.batch_size = 8;
    fo.validation = val;
    fo.progress = split_during_fit;
    fo.progress_user = &c;
    cr_assert_eq(castor_model_fit(m, train, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(c.calls, 2 * N / 8);
    cr_assert_eq(c.refused, 2 * c.calls);
    cr_assert_eq(castor_dataset_size(train), N);
    /* Once fit has returned they split as before. */
    castor_dataset *tail = NULL;
    cr_assert_eq(castor_dataset_split_tail(train, 8, &tail), CASTOR_OK);
    castor_dataset_free(tail);
    cr_assert_eq(castor_dataset_split_tail(val, 8, &tail), CASTOR_OK);
    castor_dataset_free(tail);
    castor_dataset_free(train);
    castor_dataset_free(val);
    castor_model_free(m);
    castor_strategy_free(s);
}

/* A callback holding the options (its user pointer) changes them: fit had
 * read them on every step, so a larger batch took rows from past the end of
 * the epoch's order and a validation set of other features went unchecked. */
typedef struct options_in_callback {
    castor_fit_options *fo;
    castor_dataset *other;
    int calls;
} options_in_callback;

static int change_options(void *user, const castor_progress *p)
{
    (void)p;
    options_in_callback *c = user;
    c->calls++;
    c->fo->batch_size = 1000;
    c->fo->validation = c->other;
    c->fo->epochs = 50;
    c->fo->shuffle = !c->fo->shuffle;
    return 0;
}

Test(fit_callback, fit_reads_its_options_once)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    castor_model *m = compiled(s, "5:relu,3");
    castor_dataset *train = small_dataset(), *val = small_dataset(), *other = NULL;
    float x[2 * (F + 3)] = {0};
    int32_t y[2] = {0, 1};
    cr_assert_eq(castor_dataset_from_memory(&other, x, 2, F + 3, y, NULL, 0), CASTOR_OK);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    options_in_callback c = {&fo, other, 0};
    fo.epochs = 2;
    fo.batch_size = 8;
    fo.validation = val;
    fo.progress = change_options;
    fo.progress_user = &c;
    castor_metrics last;
    cr_assert_eq(castor_model_fit(m, train, &fo, &last), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    cr_assert_eq(c.calls, 2 * N / 8);
    cr_assert_eq(castor_model_step(m), 2 * N / 8);
    cr_assert_eq(castor_model_epoch(m), 2);
    cr_assert_eq(last.samples, N);
    castor_dataset_free(other);
    castor_dataset_free(train);
    castor_dataset_free(val);
    castor_model_free(m);
    castor_strategy_free(s);
}

/* The calls of a fit, as the callback was told them (up to 16). */
typedef struct told {
    int calls;
    castor_progress p[16];
} told;

static int record(void *user, const castor_progress *p)
{
    told *t = user;
    if (t->calls < 16)
        t->p[t->calls] = *p;
    t->calls++;
    return 0;
}

/* Where in the fit each call is: 48 samples in batches of 10 are 5 steps
 * an epoch, the last of 8 rows. The epoch's last call says step 5 of 5,
 * not the 0 the model's count is back at (a progress line read "0/5"). */
Test(fit_callback, each_call_says_where_in_the_fit_it_is)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    castor_model *m = compiled(s, "4:relu,3");
    castor_dataset *ds = small_dataset();
    told t = {0};
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 2;
    fo.batch_size = 10;
    fo.progress = record;
    fo.progress_user = &t;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(t.calls, 10);
    for (int i = 0; i < 10; i++) {
        const castor_progress *p = &t.p[i];
        int step = i % 5 + 1;
        cr_assert(p->epoch == i / 5 && p->epochs == 2 && p->step_in_epoch == step &&
                      p->steps_per_epoch == 5 && p->global_step == i + 1 &&
                      p->epoch_end == (step == 5),
                  "call %d: epoch %d of %d, step %lld of %lld, global step %lld, epoch_end %d",
                  i, p->epoch, p->epochs, (long long)p->step_in_epoch,
                  (long long)p->steps_per_epoch, (long long)p->global_step, p->epoch_end);
    }
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

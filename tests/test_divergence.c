/*
 * A model gone non-finite, and what set_params keeps: a NaN variable shows
 * in the loss whatever activation lies between it and the output,
 * castor_model_all_finite sees an optimizer state that overflowed while the
 * variables stayed finite, a model diverged in training trains on after
 * set_params, and set_params on a healthy model keeps the optimizer's step
 * count. On the numerics suites' data (tests/numerics_support.h).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "numerics_support.h"
#include "src/model.h"
#include "src/strategy.h"

/* A variable gone NaN (a diverged step) must show in the loss, whatever
 * activation lies between it and the output: PyTorch's and TensorFlow's
 * ReLU pass a NaN on. Castor's ReLU made it 0, so a model with a NaN in a
 * kernel under a ReLU reported a finite loss, trained on, and was saved
 * with its NaN, while nothing (the CLI's divergence warning included) saw. */
Test(divergence, a_nan_variable_shows_in_the_loss)
{
    data d;
    numerics_make_data(&d, 8);
    static const char *const layers[] = {"6:relu,3", "6:tanh,3", "6:sigmoid,3",
                                         "6:tanh,4:relu,3"};
    for (size_t i = 0; i < sizeof layers / sizeof *layers; i++)
        for (int k = 0; k < 2; k++) {
            castor_strategy *s = NULL;
            castor_model *m = numerics_make_model("cpu:2", (castor_strategy_kind)k, layers[i],
                                                  CASTOR_LOSS_SOFTMAX_XENT, &s);
            castor_dataset *ds = numerics_make_dataset(&d, CASTOR_LOSS_SOFTMAX_XENT);
            /* One kernel weight of the first layer, as a diverged step leaves it
             * (set_params refuses NaN; a checkpoint or a step does not). */
            size_t np = castor_model_num_params(m);
            float *p = malloc(np * sizeof *p);
            cr_assert_eq(castor_model_get_params(m, p, np), CASTOR_OK);
            p[0] = NAN;
            memcpy(m->params.ptr, p, np * sizeof *p);
            m->params_version++;
            m->host_params_current = 1;
            cr_assert_eq(m->strategy->ops->push(m), CASTOR_OK);
            castor_metrics met;
            cr_assert_eq(castor_model_evaluate(m, ds, 4, &met), CASTOR_OK, "%s",
                         castor_model_errmsg(m));
            cr_assert(isnan(met.loss), "%s %s: evaluate's loss is %g with a NaN variable",
                      layers[i], castor_strategy_kind_name((castor_strategy_kind)k), met.loss);
            castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
            fo.batch_size = 4;
            castor_metrics epoch;
            cr_assert_eq(castor_model_fit(m, ds, &fo, &epoch), CASTOR_OK, "%s",
                         castor_model_errmsg(m));
            cr_assert(isnan(epoch.loss), "%s %s: fit's loss is %g with a NaN variable",
                      layers[i], castor_strategy_kind_name((castor_strategy_kind)k),
                      epoch.loss);
            free(p);
            castor_dataset_free(ds);
            castor_model_free(m);
            castor_strategy_free(s);
        }
}

/* Seed 9's data with inputs of 1e30: Adam's v overflows (g * g = inf) while
 * its update, m / (sqrt(inf) + eps), is 0 and the variables stay finite. */
static void make_overflowing_data(data *d)
{
    numerics_make_data(d, 9);
    for (int i = 0; i < NS * NF; i++)
        d->x[i] *= 1e30f;
}

/* NF -> 3, softmax cross-entropy, seed 5, compiled on s with opt (NULL:
 * Adam's defaults). */
static castor_model *compile_3(castor_strategy *s, const castor_optimizer *opt)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, NF), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "3"), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, opt, 5), CASTOR_OK);
    return m;
}

/* castor_model_all_finite sees a diverged optimizer state, not only a
 * diverged variable: inputs of 1e30 make Adam's v overflow (g * g = inf)
 * while its update, m / (sqrt(inf) + eps), is 0 and every variable stays
 * finite; the next step's v is inf - inf = NaN, so such a model cannot
 * train on. Then a plain SGD step of the same gradients makes the
 * variables themselves infinite. Central and mirrored on cpu:2. */
Test(divergence, all_finite_sees_the_optimizer_state)
{
    data d;
    make_overflowing_data(&d);
    for (int k = 0; k < 2; k++) {
        const char *kind = castor_strategy_kind_name((castor_strategy_kind)k);
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, (castor_strategy_kind)k, "cpu:2", NULL),
                     CASTOR_OK);
        castor_model *m = compile_3(s, NULL);
        castor_dataset *ds = numerics_make_dataset(&d, CASTOR_LOSS_SOFTMAX_XENT);
        int finite = -1;
        cr_assert_eq(castor_model_all_finite(m, &finite), CASTOR_OK);
        cr_assert_eq(finite, 1, "%s: a fresh model is not finite", kind);
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.batch_size = NS;
        fo.max_steps = 1;
        castor_metrics met;
        cr_assert_eq(castor_model_fit(m, ds, &fo, &met), CASTOR_OK, "%s",
                     castor_model_errmsg(m));
        size_t np = castor_model_num_params(m);
        float *p = malloc(np * sizeof *p);
        cr_assert_eq(castor_model_get_params(m, p, np), CASTOR_OK);
        for (size_t i = 0; i < np; i++)
            cr_assert(isfinite(p[i]), "%s: variable %zu is %g: the test needs them finite", kind,
                      i, p[i]);
        cr_assert_eq(castor_model_all_finite(m, &finite), CASTOR_OK, "%s",
                     castor_model_errmsg(m));
        cr_assert_eq(finite, 0, "%s: Adam's v overflowed, and all_finite says finite", kind);
        free(p);
        castor_model_free(m);
        /* SGD: the variables themselves. */
        castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
        sgd.learning_rate = 1e30f;
        m = compile_3(s, &sgd);
        cr_assert_eq(castor_model_fit(m, ds, &fo, &met), CASTOR_OK);
        cr_assert_eq(castor_model_all_finite(m, &finite), CASTOR_OK);
        cr_assert_eq(finite, 0, "%s: SGD's step made the variables infinite, all_finite says "
                     "finite", kind);
        cr_assert_eq(castor_model_all_finite(m, NULL), CASTOR_MISUSE);
        cr_assert_eq(castor_model_all_finite(NULL, &finite), CASTOR_MISUSE);
        castor_dataset_free(ds);
        castor_model_free(m);
        castor_strategy_free(s);
    }
}

/* A model whose training diverged trains on (castor.h, castor_model_fit):
 * fit refuses only what a load placed. Setting finite variables on it made
 * fit refuse it all the same, saying its optimizer state was "loaded from
 * the checkpoint" that it never was: set_params flagged the state that
 * training had made infinite as if a load had placed it. Found by
 * tests/fuzz/fuzz_api.c. Central and mirrored on cpu:2. */
Test(divergence, set_params_on_a_model_diverged_in_training_trains_on)
{
    data d;
    make_overflowing_data(&d);
    for (int k = 0; k < 2; k++) {
        const char *kind = castor_strategy_kind_name((castor_strategy_kind)k);
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, (castor_strategy_kind)k, "cpu:2", NULL),
                     CASTOR_OK);
        castor_model *m = compile_3(s, NULL);
        castor_dataset *ds = numerics_make_dataset(&d, CASTOR_LOSS_SOFTMAX_XENT);
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.batch_size = NS;
        fo.max_steps = 1;
        cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
        int finite = -1;
        cr_assert_eq(castor_model_all_finite(m, &finite), CASTOR_OK);
        cr_assert_eq(finite, 0, "%s: the test needs a diverged optimizer state", kind);
        cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s: a diverged model "
                     "trains on: %s", kind, castor_model_errmsg(m));
        size_t np = castor_model_num_params(m);
        float *p = malloc(np * sizeof *p);
        cr_assert(p);
        for (size_t i = 0; i < np; i++)
            p[i] = 0.01f * (float)i;
        cr_assert_eq(castor_model_set_params(m, p, np), CASTOR_OK, "%s",
                     castor_model_errmsg(m));
        int64_t step = castor_model_step(m);
        cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s: fit after set_params: "
                     "%s", kind, castor_model_errmsg(m));
        cr_assert_eq(castor_model_step(m), step + 1, "%s", kind);
        free(p);
        castor_dataset_free(ds);
        castor_model_free(m);
        castor_strategy_free(s);
    }
}

/* set_params on a healthy model keeps the count of optimizer steps that
 * Adam's bias correction reads: 3 steps, the variables set to themselves,
 * 3 more train as 6 in a row. A central model whose host copy of the count
 * stayed at compile's 0 restarted the correction there. cpu:2. */
Test(divergence, set_params_keeps_the_optimizer_step)
{
    data d;
    numerics_make_data(&d, 4);
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    adam.learning_rate = 0.01f;
    for (int k = 0; k < 2; k++) {
        float *got[2];
        size_t np = 0;
        for (int pause = 0; pause < 2; pause++) {
            castor_strategy *s = NULL;
            cr_assert_eq(castor_strategy_create(&s, (castor_strategy_kind)k, "cpu:2", NULL),
                         CASTOR_OK);
            castor_model *m = compile_3(s, &adam);
            castor_dataset *ds = numerics_make_dataset(&d, CASTOR_LOSS_SOFTMAX_XENT);
            castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
            fo.epochs = 3;
            fo.batch_size = 4;
            fo.shuffle = 0;
            fo.max_steps = 3;
            np = castor_model_num_params(m);
            got[pause] = malloc(np * sizeof(float));
            cr_assert(got[pause]);
            cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK);
            if (pause) {
                cr_assert_eq(castor_model_get_params(m, got[pause], np), CASTOR_OK);
                cr_assert_eq(castor_model_set_params(m, got[pause], np), CASTOR_OK);
            }
            cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK);
            cr_assert_eq(castor_model_get_params(m, got[pause], np), CASTOR_OK);
            castor_dataset_free(ds);
            castor_model_free(m);
            castor_strategy_free(s);
        }
        cr_assert(memcmp(got[0], got[1], np * sizeof(float)) == 0,
                  "%s: set_params changed the steps after it",
                  castor_strategy_kind_name((castor_strategy_kind)k));
        free(got[0]);
        free(got[1]);
    }
}

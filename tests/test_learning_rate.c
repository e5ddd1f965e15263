/*
 * castor_model_set_learning_rate: a rate changed between steps (from fit's
 * progress callback, or between fits) takes effect at the next step, on the
 * host and on the devices alike, and checkpoints record it.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "model_api_support.h"
#include "support.h"

Test(learning_rate, bad_rates_and_calls_are_refused)
{
    cr_assert_eq(castor_model_set_learning_rate(NULL, 0.1f), CASTOR_MISUSE);
    cr_assert_eq(castor_model_learning_rate(NULL), 0.0f);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_set_learning_rate(m, 0.1f), CASTOR_MISUSE);
    cr_assert_eq(castor_model_learning_rate(m), 0.0f);
    castor_model_free(m);

    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", NULL), CASTOR_OK);
    m = compiled(s, "3");
    cr_assert_eq(castor_model_learning_rate(m), 0.001f, "adam's default");
    const float bad[] = {0.0f, -0.5f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(castor_model_set_learning_rate(m, bad[i]), CASTOR_INVALID, "%g",
                     (double)bad[i]);
        cr_assert(strstr(castor_model_errmsg(m), "finite and > 0"), "%s", castor_model_errmsg(m));
        cr_assert_eq(castor_model_learning_rate(m), 0.001f, "a refused rate changed it");
    }
    cr_assert_eq(castor_model_set_learning_rate(m, 0.25f), CASTOR_OK);
    cr_assert_eq(castor_model_learning_rate(m), 0.25f);
    castor_model_free(m);
    castor_strategy_free(s);
}

/* Halves the rate at each epoch end. */
static int halve_at_epoch_end(void *user, const castor_progress *p)
{
    castor_model *m = user;
    if (p->epoch_end)
        cr_assert_eq(castor_model_set_learning_rate(m, castor_model_learning_rate(m) / 2),
                     CASTOR_OK, "in the callback: %s", castor_model_errmsg(m));
    return 0;
}

Test(learning_rate, a_schedule_from_the_callback_is_the_same_as_between_fits)
{
    castor_dataset *ds = small_dataset();
    for (int kind = CASTOR_STRATEGY_CENTRAL; kind <= CASTOR_STRATEGY_MIRRORED; kind++) {
        const char *name = castor_strategy_kind_name((castor_strategy_kind)kind);
        castor_strategy *s = NULL;
        cr_assert_eq(castor_strategy_create(&s, (castor_strategy_kind)kind, "cpu:2", NULL),
                     CASTOR_OK);
        castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
        sgd.learning_rate = 0.4f;
        castor_model *models[3];
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(castor_model_create(&models[i], F), CASTOR_OK);
            cr_assert_eq(castor_model_add_layers(models[i], "8:relu,3"), CASTOR_OK);
        }
        castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
        fo.batch_size = 8;
        /* The schedule from the callback, over three epochs in one fit. */
        castor_model *sched = models[0];
        cr_assert_eq(castor_model_compile(sched, s, CASTOR_LOSS_SOFTMAX_XENT, &sgd, 5),
                     CASTOR_OK);
        fo.epochs = 3;
        fo.progress = halve_at_epoch_end;
        fo.progress_user = sched;
        cr_assert_eq(castor_model_fit(sched, ds, &fo, NULL), CASTOR_OK, "%s: %s", name,
                     castor_model_errmsg(sched));
        cr_assert_eq(castor_model_learning_rate(sched), 0.05f);
        float *want = model_params(sched);
        castor_model_free(sched);

        /* The same by hand, an epoch a fit. */
        castor_model *hand = models[1];
        cr_assert_eq(castor_model_compile(hand, s, CASTOR_LOSS_SOFTMAX_XENT, &sgd, 5),
                     CASTOR_OK);
        fo.epochs = 1;
        fo.progress = NULL;
        for (int e = 0; e < 3; e++) {
            cr_assert_eq(castor_model_fit(hand, ds, &fo, NULL), CASTOR_OK);
            cr_assert_eq(castor_model_set_learning_rate(hand, 0.4f / (float)(2 << e)),
                         CASTOR_OK);
        }
        float *got = model_params(hand);
        size_t bytes = castor_model_num_params(hand) * sizeof(float);
        cr_assert_arr_eq(got, want, bytes, "%s: the callback's schedule is not the same", name);
        free(got);
        castor_model_free(hand);

        /* And the rate did change something: at a constant 0.4 it ends
         * elsewhere. */
        castor_model *constant = models[2];
        cr_assert_eq(castor_model_compile(constant, s, CASTOR_LOSS_SOFTMAX_XENT, &sgd, 5),
                     CASTOR_OK);
        fo.epochs = 3;
        cr_assert_eq(castor_model_fit(constant, ds, &fo, NULL), CASTOR_OK);
        got = model_params(constant);
        cr_assert(memcmp(got, want, bytes) != 0, "%s: the schedule changed nothing", name);
        free(got);
        free(want);
        castor_model_free(constant);
        castor_strategy_free(s);
    }
    castor_dataset_free(ds);
}

Test(learning_rate, checkpoints_record_the_rate_in_force, .init = support_dir_init,
     .fini = support_dir_fini)
{
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_MIRRORED, "cpu:2", NULL), CASTOR_OK);
    castor_model *m = compiled(s, "8:relu,3");
    cr_assert_eq(castor_model_set_learning_rate(m, 0.0625f), CASTOR_OK);
    char path[SUPPORT_PATH_LEN];
    support_path_in(path, "lr.safetensors");
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);  /* one model a strategy */
    castor_model *back = NULL;
    cr_assert_eq(castor_model_open(&back, path, s), CASTOR_OK, "%s", castor_model_errmsg(back));
    cr_assert_eq(castor_model_learning_rate(back), 0.0625f);
    /* load brings the file's rate too. */
    cr_assert_eq(castor_model_set_learning_rate(back, 0.5f), CASTOR_OK);
    cr_assert_eq(castor_model_load(back, path), CASTOR_OK, "%s", castor_model_errmsg(back));
    cr_assert_eq(castor_model_learning_rate(back), 0.0625f);
    castor_model_free(back);
    castor_strategy_free(s);
}

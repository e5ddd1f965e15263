/*
 * Going on from a checkpoint: where a run stands (step, epoch, step in the
 * epoch, the epoch's order, the seed its shuffles come from, the epochs its
 * fit was to run) comes back from the file, a resumed run ends bitwise where
 * an uninterrupted one does, and an epoch in progress is finished only over
 * the data, batch size and shuffle flag it was started with (the files that
 * lie about this: test_checkpoint_bad_position.c; a run killed and resumed:
 * test_resume.c).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "checkpoint_support.h"
#include "src/model.h"
#include "src/safetensors.h"
#include "support.h"

/* ---- target_epochs: where the last fit was to end ------------------------------------- */

/* __metadata__[key] of the file at path, malloc'd, or NULL. */
static char *meta_of(const char *path, const char *key)
{
    castor__st_file f;
    char err[256];
    cr_assert_eq(castor__st_read(path, &f, err, sizeof err), CASTOR_OK, "%s", err);
    const char *v = castor__st_meta_get(&f, key);
    char *copy = v ? strdup(v) : NULL;
    castor__st_free(&f);
    return copy;
}

static void expect_target(castor_model *m, const char *path, const char *want)
{
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    char *v = meta_of(path, "target_epochs");
    if (!want)
        cr_assert_null(v, "target_epochs '%s' in a file of a model never fitted", v);
    else
        cr_assert(v && strcmp(v, want) == 0, "target_epochs '%s', want '%s'", v ? v : "(none)",
                  want);
    free(v);
}

/* A run resumed from a checkpoint can go on to the end its fit was given
 * (castor train took its default of 10 epochs, whatever the run's were). */
Test(checkpoint_resume, target_epochs_is_where_the_last_fit_was_to_end)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "t.safetensors");
    castor_dataset *ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 3);
    expect_target(m, path, NULL);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.epochs = 3;
    fo.max_steps = 10;  /* stopped 3 steps into epoch 1 of 3 */
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    expect_target(m, path, "3");
    /* kept through a load and a save */
    castor_strategy *s2 = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m2 = ckpt_make_model(s2, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 3);
    cr_assert_eq(castor_model_load(m2, path), CASTOR_OK, "%s", castor_model_errmsg(m2));
    char *again = ckpt_path_in(dir, "again.safetensors");
    expect_target(m2, again, "3");
    /* the epoch in progress is one of a fit's epochs: 1 done + 2 */
    fo.epochs = 2;
    fo.max_steps = 1;
    cr_assert_eq(castor_model_fit(m2, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m2));
    expect_target(m2, again, "3");
    fo.epochs = 5;
    cr_assert_eq(castor_model_fit(m2, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m2));
    expect_target(m2, again, "6");
    castor_model_free(m2);
    castor_model_free(m);
    castor_strategy_free(s2);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(again);
    free(path);
}

/* ---- exact resume -------------------------------------------------------------------- */

/* total steps uninterrupted vs `first` steps, save, free everything, open
 * from the file on a fresh strategy, the rest: bitwise the same. */
static void resume(castor_strategy_kind kind, const char *devices, castor_optimizer_kind ok,
                   int64_t first, int64_t total)
{
    castor_dataset *ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(kind, devices);
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(ok), 11);
    ckpt_train_steps(m, ds, total);
    snap want = ckpt_take(m);
    castor_model_free(m);
    castor_strategy_free(s);

    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "resume.safetensors");
    s = ckpt_make_strategy(kind, devices);
    m = ckpt_make_model(s, LAYERS, ckpt_make_opt(ok), 11);
    ckpt_train_steps(m, ds, first);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);

    s = ckpt_make_strategy(kind, devices);
    m = NULL;
    cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), first);
    ckpt_train_steps(m, ds, total - first);
    snap got = ckpt_take(m);
    ckpt_assert_same(&want, &got, "resumed run");
    ckpt_snap_free(&want);
    ckpt_snap_free(&got);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

/* 7 steps per epoch: 10 is 3 steps into the second epoch, 7 an epoch end. */
Test(checkpoint_resume, resume_mid_epoch_central_adam)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu:2", CASTOR_OPT_ADAM, 10, 23);
}

Test(checkpoint_resume, resume_mid_epoch_central_sgd)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu:3", CASTOR_OPT_SGD, 5, 16);
}

Test(checkpoint_resume, resume_epoch_end_central_adamw)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu", CASTOR_OPT_ADAMW, 7, 20);
}

Test(checkpoint_resume, resume_mid_epoch_mirrored_adam)
{
    resume(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_ADAM, 10, 23);
}

Test(checkpoint_resume, resume_mid_epoch_mirrored_sgd)
{
    resume(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_SGD, 13, 19);
}

Test(checkpoint_resume, resume_with_another_batch_size_is_refused)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "b.safetensors");
    castor_dataset *ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 1);
    ckpt_train_steps(m, ds, 3);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    m = NULL;
    cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH * 2;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_MISMATCH);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

/* A seed is 64 bits, and all of them come back. */
Test(checkpoint_resume, the_largest_seed_round_trips)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "seed.safetensors");
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), UINT64_MAX);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    m = NULL;
    cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(m->seed, UINT64_MAX);
    castor_model_free(m);
    castor_strategy_free(s);
    support_rmrf(dir);
    free(dir);
    free(path);
}

/* An epoch in progress goes on over the permutation it started with: other
 * training data (fewer samples: a larger validation split) or another shuffle
 * flag would visit some samples twice and others never. */
static void refuse_other_epoch_data(int through_file, int other_n, int shuffle)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "d.safetensors");
    castor_dataset *ds = ckpt_synthetic();
    castor_dataset *other = support_synthetic(5, other_n, F, C);
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 1);
    ckpt_train_steps(m, ds, 3);
    if (through_file) {
        cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
        castor_model_free(m);
        m = NULL;
        cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s", castor_model_errmsg(m));
    }
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.shuffle = shuffle;
    int64_t step = castor_model_step(m);
    cr_assert_eq(castor_model_fit(m, other, &fo, NULL), CASTOR_MISMATCH,
                 "%s", castor_model_errmsg(m));
    cr_assert(strstr(castor_model_errmsg(m), "epoch in progress"), "%s",
              castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), step, "nothing trained");
    /* The same data and flag finish the epoch; after it, any data will do. */
    fo.shuffle = 1;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_step_in_epoch(m), 0);
    fo.shuffle = shuffle;
    cr_assert_eq(castor_model_fit(m, other, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(other);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

Test(checkpoint_resume, mid_epoch_fit_on_fewer_samples_is_refused)
{
    refuse_other_epoch_data(0, N - 10, 1);
}

Test(checkpoint_resume, mid_epoch_resume_on_fewer_samples_is_refused)
{
    refuse_other_epoch_data(1, N - 10, 1);
}

Test(checkpoint_resume, mid_epoch_resume_on_more_samples_is_refused)
{
    refuse_other_epoch_data(1, N + 40, 1);
}

Test(checkpoint_resume, mid_epoch_resume_unshuffled_is_refused)
{
    refuse_other_epoch_data(1, N, 0);
}

/* The other way round: an epoch started unshuffled (epoch_shuffle 0, which
 * the file must hold as it holds 1) is not finished shuffled. */
Test(checkpoint_resume, mid_epoch_resume_of_an_unshuffled_epoch_refuses_shuffling)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "u.safetensors");
    castor_dataset *ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 1);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.shuffle = 0;
    fo.max_steps = 3;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    m = NULL;
    cr_assert_eq(castor_model_open(&m, path, s), CASTOR_OK, "%s", castor_model_errmsg(m));
    fo.shuffle = 1;
    fo.max_steps = 0;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_MISMATCH, "%s",
                 castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), 3, "nothing trained");
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

/*
 * Checkpoints whose metadata misstates where the run stands: the step, the
 * optimizer's own step count, the epoch in progress and its order (samples,
 * shuffle flag, batch size, step in the epoch), and the epochs the last fit
 * was to run; and the older files that lack some of these keys, which load.
 * The rest of what must not be trusted: test_checkpoint_corrupt.c.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "checkpoint_support.h"
#include "support.h"

/* A fixture whose model has loaded the good file as mutate edited it
 * (ckpt_teardown it). */
static void load_edited(fixture *fx, void (*mutate)(parts *))
{
    ckpt_setup(fx);
    ckpt_write_bad(fx, mutate);
    cr_assert_eq(castor_model_load(fx->m, fx->bad), CASTOR_OK, "%s", castor_model_errmsg(fx->m));
}

/* The good file edited by mutate loads (at the given step, unless it is
 * negative), and is saved again: the parts of what that save wrote. */
static parts load_and_save_again(void (*mutate)(parts *), int64_t step)
{
    fixture fx;
    load_edited(&fx, mutate);
    if (step >= 0)
        cr_assert_eq(castor_model_step(fx.m), step);
    cr_assert_eq(castor_model_save(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    parts p = ckpt_split_file(fx.good);
    ckpt_teardown(&fx);
    return p;
}

static void huge_step(parts *p)
{
    char *at = strstr(p->header, "\"step\":\"");
    cr_assert(at);
    char *end = strchr(at + 8, '"');
    size_t old = (size_t)(end - (at + 8));
    char *h = malloc(strlen(p->header) + 32);
    memcpy(h, p->header, (size_t)(at + 8 - p->header));
    strcpy(h + (at + 8 - p->header), "9223372036854775807");
    strcat(h, at + 8 + old);
    free(p->header);
    p->header = h;
}

Test(checkpoint_bad_position, step_past_what_a_checkpoint_name_holds)
{
    /* INT64_MAX passed before, and training on from it overflowed. */
    ckpt_corrupt_case(huge_step, CASTOR_FORMAT, "'step'");
}

static void bad_optimizer_step(parts *p)
{
    ckpt_edit(p, "\"seed\":", "\"optimizer_step\":\"x\",\"seed\":");
}

Test(checkpoint_bad_position, bad_optimizer_step)
{
    ckpt_corrupt_case(bad_optimizer_step, CASTOR_FORMAT, "'optimizer_step' is 'x'");
}

static void optimizer_step_behind(parts *p)
{
    ckpt_edit(p, "\"seed\":", "\"optimizer_step\":\"1\",\"seed\":");
}

/* The optimizer state's own step count (behind the model's after a mirrored
 * recovery: Adam's bias correction counts it) is what load takes and save
 * writes back, not the model's step in its place. */
Test(checkpoint_bad_position, optimizer_step_behind_the_step_survives_load_and_save)
{
    parts p = load_and_save_again(optimizer_step_behind, 3);
    cr_assert(strstr(p.header, "\"optimizer_step\":\"1\""), "%s", p.header);
    ckpt_parts_free(&p);
}

static void zero_epoch_samples(parts *p)
{
    ckpt_edit(p, "\"epoch_samples\":\"101\"", "\"epoch_samples\":\"0\"");
}
static void two_epoch_shuffle(parts *p)
{
    ckpt_edit(p, "\"epoch_shuffle\":\"1\"", "\"epoch_shuffle\":\"2\"");
}
/* An epoch in progress (the good file is 3 steps into its first) needs
 * the batch size it was started with: fit refuses to finish it with any
 * other, so 0 would make the file unresumable, not merely unusual. */
static void zero_epoch_batch(parts *p)
{
    ckpt_edit(p, "\"epoch_batch\":\"16\"", "\"epoch_batch\":\"0\"");
}
/* The good file is at step 3 of 7 (101 samples in batches of 16). */
static void step_past_the_epoch(parts *p)
{
    ckpt_edit(p, "\"step_in_epoch\":\"3\"", "\"step_in_epoch\":\"7\"");
}
static void last_step_of_the_epoch(parts *p)
{
    ckpt_edit(p, "\"step_in_epoch\":\"3\"", "\"step_in_epoch\":\"6\"");
}
/* As written before these keys existed. */
static void no_epoch_order(parts *p)
{
    ckpt_edit(p, "\"epoch_samples\":", "\"comment_a\":");
    ckpt_edit(p, "\"epoch_shuffle\":", "\"comment_b\":");
}

/* The good file's fit was to run 1000 epochs (checkpoint_support.c). */
static void zero_target_epochs(parts *p)
{
    ckpt_edit(p, "\"target_epochs\":\"1000\"", "\"target_epochs\":\"0\"");
}
static void target_below_the_epoch(parts *p)
{
    ckpt_edit(p, "\"target_epochs\":\"1000\"", "\"target_epochs\":\"1\"");
    ckpt_edit(p, "\"epoch\":\"0\"", "\"epoch\":\"2\"");
}
static void no_target_epochs(parts *p)
{
    ckpt_edit(p, "\"target_epochs\":", "\"comment_c\":");
}

Test(checkpoint_bad_position, bad_target_epochs)
{
    ckpt_corrupt_case(zero_target_epochs, CASTOR_FORMAT, "'target_epochs' is '0'");
    ckpt_corrupt_case(target_below_the_epoch, CASTOR_FORMAT, "'target_epochs' is '1'");
}

/* Files written before the key lack it: they load, and save without it. */
Test(checkpoint_bad_position, target_epochs_absent_from_older_files)
{
    parts p = load_and_save_again(no_target_epochs, -1);
    cr_assert_null(strstr(p.header, "target_epochs"), "%s", p.header);
    ckpt_parts_free(&p);
}

Test(checkpoint_bad_position, bad_epoch_order)
{
    ckpt_corrupt_case(zero_epoch_samples, CASTOR_FORMAT, "'epoch_samples' is '0'");
    ckpt_corrupt_case(two_epoch_shuffle, CASTOR_FORMAT, "'epoch_shuffle' is '2'");
    ckpt_corrupt_case(zero_epoch_batch, CASTOR_FORMAT, "'epoch_batch' is '0'");
    /* It loaded, and then every fit refused the model ("is this the
     * dataset it was trained on?"). */
    ckpt_corrupt_case(step_past_the_epoch, CASTOR_FORMAT,
                      "'step_in_epoch' is '7', not below 7, the steps of an epoch of 101 samples "
                      "in batches of 16");
}

Test(checkpoint_bad_position, the_last_step_of_an_epoch_loads_and_finishes_it)
{
    fixture fx;
    load_edited(&fx, last_step_of_the_epoch);
    cr_assert_eq(castor_model_step_in_epoch(fx.m), 6);
    castor_dataset *same = support_synthetic(5, N, F, C);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.max_steps = 1;
    cr_assert_eq(castor_model_fit(fx.m, same, &fo, NULL), CASTOR_OK, "%s",
                 castor_model_errmsg(fx.m));
    cr_assert_eq(castor_model_step_in_epoch(fx.m), 0, "the one step left ends the epoch");
    castor_dataset_free(same);
    ckpt_teardown(&fx);
}

Test(checkpoint_bad_position, epoch_order_absent_from_older_files)
{
    fixture fx;
    load_edited(&fx, no_epoch_order);
    cr_assert_eq(castor_model_step_in_epoch(fx.m), 3);
    /* Nothing to hold the epoch in progress to: it goes on over other data. */
    castor_dataset *other = support_synthetic(5, N + 40, F, C);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.shuffle = 0;
    cr_assert_eq(castor_model_fit(fx.m, other, &fo, NULL), CASTOR_OK, "%s",
                 castor_model_errmsg(fx.m));
    castor_dataset_free(other);
    ckpt_teardown(&fx);
}

/* With no order recorded the epoch in progress may go on over other data,
 * but not over data whose epoch it has already passed the end of: fit
 * refuses an epoch of 3 steps to a model at step 3 (one that took it for
 * an epoch to finish ran no step and returned CASTOR_OK). */
Test(checkpoint_bad_position, older_files_at_the_end_of_the_data_epoch_are_refused)
{
    fixture fx;
    load_edited(&fx, no_epoch_order);
    cr_assert_eq(castor_model_step_in_epoch(fx.m), 3);
    castor_dataset *three_steps = support_synthetic(5, 3 * BATCH, F, C);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.shuffle = 0;
    cr_assert_eq(castor_model_fit(fx.m, three_steps, &fo, NULL), CASTOR_MISMATCH, "%s",
                 castor_model_errmsg(fx.m));
    cr_assert(strstr(castor_model_errmsg(fx.m), "at step 3 of an epoch of 3 steps"), "%s",
              castor_model_errmsg(fx.m));
    castor_dataset_free(three_steps);
    ckpt_teardown(&fx);
}

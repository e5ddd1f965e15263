/*
 * Checkpoints of a trained model: save/load round trips (variables,
 * optimizer state, position) on both strategies, exact resume part-way
 * through an epoch, atomic writes, and a file read back by Python's
 * safetensors.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <dirent.h>
#include <locale.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "castor.h"
#include "checkpoint_support.h"
#include "src/model.h"
#include "src/safetensors.h"
#include "src/strategy.h"
#include "support.h"

/* ---- round trips ------------------------------------------------------------------- */

static void round_trip(castor_strategy_kind kind, const char *devices, castor_optimizer_kind ok)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "ckpt.safetensors");
    castor_dataset *ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(kind, devices);
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(ok), 42);
    ckpt_train_steps(m, ds, 10);  /* epoch 1, 3 steps into it */
    cr_assert_eq(castor_model_epoch(m), 1);
    cr_assert_eq(castor_model_step_in_epoch(m), 3);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    snap a = ckpt_take(m);
    cr_assert(a.ns == (ok == CASTOR_OPT_SGD ? 1 : 2) * a.n);

    /* load into a model compiled differently (seed, learning rate) */
    castor_strategy *s2 = ckpt_make_strategy(kind, devices);
    castor_optimizer other = ckpt_make_opt(ok);
    other.learning_rate *= 3;
    castor_model *m2 = ckpt_make_model(s2, LAYERS, other, 7);
    cr_assert_eq(castor_model_load(m2, path), CASTOR_OK, "%s", castor_model_errmsg(m2));
    snap b = ckpt_take(m2);
    ckpt_assert_same(&a, &b, "load");

    /* open on a fresh strategy */
    castor_model_free(m2);
    castor_model *m3 = NULL;
    cr_assert_eq(castor_model_open(&m3, path, s2), CASTOR_OK, "%s", castor_model_errmsg(m3));
    snap c = ckpt_take(m3);
    ckpt_assert_same(&a, &c, "open");
    cr_assert_eq(castor_model_input_features(m3), F);
    char spec[64];
    cr_assert_eq(castor_model_layers_spec(m3, spec, sizeof spec), CASTOR_OK);
    cr_assert_str_eq(spec, "16:tanh,8:relu,3:linear");

    /* saving what was loaded gives the same bytes */
    char *again = ckpt_path_in(dir, "again.safetensors");
    cr_assert_eq(castor_model_save(m3, again), CASTOR_OK, "%s", castor_model_errmsg(m3));
    size_t l1, l2;
    unsigned char *b1 = ckpt_slurp(path, &l1), *b2 = ckpt_slurp(again, &l2);
    cr_assert(l1 == l2 && memcmp(b1, b2, l1) == 0, "a re-saved checkpoint differs");
    free(b1);
    free(b2);
    free(again);

    ckpt_snap_free(&a);
    ckpt_snap_free(&b);
    ckpt_snap_free(&c);
    castor_model_free(m3);
    castor_model_free(m);
    castor_strategy_free(s2);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

Test(checkpoint, round_trip_central_sgd)
{
    round_trip(CASTOR_STRATEGY_CENTRAL, "cpu:2", CASTOR_OPT_SGD);
}

Test(checkpoint, round_trip_central_adam)
{
    round_trip(CASTOR_STRATEGY_CENTRAL, "cpu:2", CASTOR_OPT_ADAM);
}

Test(checkpoint, round_trip_central_adamw)
{
    round_trip(CASTOR_STRATEGY_CENTRAL, "cpu", CASTOR_OPT_ADAMW);
}

Test(checkpoint, round_trip_mirrored_sgd)
{
    round_trip(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_SGD);
}

Test(checkpoint, round_trip_mirrored_adam)
{
    round_trip(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_ADAM);
}

Test(checkpoint, round_trip_mirrored_adamw)
{
    round_trip(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_ADAMW);
}

Test(checkpoint, plain_sgd_has_no_slots)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "sgd.safetensors");
    castor_dataset *ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, castor_optimizer_defaults(CASTOR_OPT_SGD), 3);
    ckpt_train_steps(m, ds, 4);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor__st_file f;
    char err[256];
    cr_assert_eq(castor__st_read(path, &f, err, sizeof err), CASTOR_OK, "%s", err);
    cr_assert_eq(f.n_tensors, 6);
    castor__st_free(&f);
    /* A model with momentum keeps a slot the file lacks. */
    castor_strategy *s2 = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m2 = ckpt_make_model(s2, LAYERS, ckpt_make_opt(CASTOR_OPT_SGD), 3);
    cr_assert_eq(castor_model_load(m2, path), CASTOR_MISMATCH);
    cr_assert(strstr(castor_model_errmsg(m2), "slot"), "%s", castor_model_errmsg(m2));
    castor_model_free(m2);
    castor_strategy_free(s2);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(path);
}

/* ---- the application's locale -------------------------------------------------------- */

/* A locale whose decimal point is a comma, compiled into dir (Debian's
 * `locales` package has the source; scripts/install-deps installs it). */
static void use_comma_locale(const char *dir)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "localedef -i de_DE -f UTF-8 '%s/de_DE.UTF-8' >/dev/null 2>&1", dir);
    int rc = system(cmd);
    cr_assert(rc != -1, "cannot run localedef");
    cr_assert_eq(setenv("LOCPATH", dir, 1), 0);
    cr_assert(setlocale(LC_ALL, "de_DE.UTF-8"), "localedef made no de_DE.UTF-8 in %s (status %d; "
              "is Debian's locales package installed?)", dir, rc);
    cr_assert_str_eq(localeconv()->decimal_point, ",");
}

Test(checkpoint, files_do_not_depend_on_the_locale)
{
    /* Written under a comma locale, the floats in the metadata read
     * "0,00100000005" and a program in the C locale could not load them
     * (nor the reverse). */
    char *dir = support_tmpdir();
    char *comma = ckpt_path_in(dir, "comma.safetensors");
    char *plain = ckpt_path_in(dir, "plain.safetensors");
    castor_dataset *ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAMW), 5);
    ckpt_train_steps(m, ds, 3);
    cr_assert_eq(castor_model_save(m, plain), CASTOR_OK, "%s", castor_model_errmsg(m));
    snap a = ckpt_take(m);

    use_comma_locale(dir);
    cr_assert_eq(castor_model_save(m, comma), CASTOR_OK, "%s", castor_model_errmsg(m));
    size_t len_plain, len_comma;
    unsigned char *b_plain = ckpt_slurp(plain, &len_plain);
    unsigned char *b_comma = ckpt_slurp(comma, &len_comma);
    cr_assert(len_plain == len_comma && memcmp(b_plain, b_comma, len_plain) == 0,
              "the file written under the comma locale differs from the C locale's");
    castor_strategy *s2 = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m2 = NULL;
    cr_assert_eq(castor_model_open(&m2, plain, s2), CASTOR_OK, "%s", castor_model_errmsg(m2));
    snap b = ckpt_take(m2);
    ckpt_assert_same(&a, &b, "opened under the comma locale");

    setlocale(LC_ALL, "C");
    cr_assert_eq(castor_model_load(m2, comma), CASTOR_OK, "%s", castor_model_errmsg(m2));
    ckpt_snap_free(&b);
    b = ckpt_take(m2);
    ckpt_assert_same(&a, &b, "written under the comma locale, loaded under C");

    ckpt_snap_free(&a);
    ckpt_snap_free(&b);
    free(b_plain);
    free(b_comma);
    castor_model_free(m2);
    castor_strategy_free(s2);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(dir);
    free(comma);
    free(plain);
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
Test(checkpoint, resume_mid_epoch_central_adam)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu:2", CASTOR_OPT_ADAM, 10, 23);
}

Test(checkpoint, resume_mid_epoch_central_sgd)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu:3", CASTOR_OPT_SGD, 5, 16);
}

Test(checkpoint, resume_epoch_end_central_adamw)
{
    resume(CASTOR_STRATEGY_CENTRAL, "cpu", CASTOR_OPT_ADAMW, 7, 20);
}

Test(checkpoint, resume_mid_epoch_mirrored_adam)
{
    resume(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_ADAM, 10, 23);
}

Test(checkpoint, resume_mid_epoch_mirrored_sgd)
{
    resume(CASTOR_STRATEGY_MIRRORED, "cpu:2", CASTOR_OPT_SGD, 13, 19);
}

Test(checkpoint, resume_with_another_batch_size_is_refused)
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

Test(checkpoint, mid_epoch_fit_on_fewer_samples_is_refused)
{
    refuse_other_epoch_data(0, N - 10, 1);
}

Test(checkpoint, mid_epoch_resume_on_fewer_samples_is_refused)
{
    refuse_other_epoch_data(1, N - 10, 1);
}

Test(checkpoint, mid_epoch_resume_on_more_samples_is_refused)
{
    refuse_other_epoch_data(1, N + 40, 1);
}

Test(checkpoint, mid_epoch_resume_unshuffled_is_refused)
{
    refuse_other_epoch_data(1, N, 0);
}

/* Whatever compile accepts, save writes and load reads back: fields the
 * optimizer does not read (they were written as "nan" and "inf"), and
 * subnormal rates (strtof's ERANGE on them was taken for an error). */
static void save_and_reload(castor_optimizer opt, const char *what)
{
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "o.safetensors");
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, LAYERS, opt, 3);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s: %s", what, castor_model_errmsg(m));
    castor_strategy *s2 = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *back = NULL;
    cr_assert_eq(castor_model_open(&back, path, s2), CASTOR_OK, "%s: %s", what,
                 castor_model_errmsg(back));
    cr_assert_eq(castor_model_load(m, path), CASTOR_OK, "%s: %s", what, castor_model_errmsg(m));
    /* The fields the optimizer reads come back exactly. */
    const castor_optimizer *a = &m->opt, *b = &back->opt;
    cr_assert_eq(a->kind, opt.kind, "%s", what);
    cr_assert(a->learning_rate == opt.learning_rate && b->learning_rate == opt.learning_rate,
              "%s: learning_rate %g", what, (double)b->learning_rate);
    if (opt.kind == CASTOR_OPT_SGD)
        cr_assert(b->momentum == opt.momentum && b->nesterov == opt.nesterov, "%s", what);
    else
        cr_assert(b->beta1 == opt.beta1 && b->beta2 == opt.beta2 && b->epsilon == opt.epsilon,
                  "%s: epsilon %g", what, (double)b->epsilon);
    if (opt.kind == CASTOR_OPT_ADAMW)
        cr_assert(b->weight_decay == opt.weight_decay, "%s: weight_decay %g", what,
                  (double)b->weight_decay);
    castor_model_free(back);
    castor_model_free(m);
    castor_strategy_free(s2);
    castor_strategy_free(s);
    support_rmrf(dir);
    free(dir);
    free(path);
}

Test(checkpoint, unread_optimizer_fields_and_subnormal_rates_round_trip)
{
    castor_optimizer o = castor_optimizer_defaults(CASTOR_OPT_SGD);
    o.beta1 = NAN;
    o.epsilon = INFINITY;
    save_and_reload(o, "sgd, beta1 nan, epsilon inf");
    o = castor_optimizer_defaults(CASTOR_OPT_ADAMW);
    o.momentum = 0.0f;
    o.nesterov = 0;
    o.weight_decay = 1e-40f;
    save_and_reload(o, "adamw, weight_decay 1e-40");
    o = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    o.epsilon = 1e-40f;
    save_and_reload(o, "adam, epsilon 1e-40");
    o = castor_optimizer_defaults(CASTOR_OPT_SGD);
    o.learning_rate = 1e-39f;
    o.momentum = 1e-41f;
    save_and_reload(o, "sgd, learning_rate 1e-39, momentum 1e-41");
}

/* ---- atomic writes ------------------------------------------------------------------------ */

/* Names in dir other than "." and ".."; *count of them. */
static int dir_entries(const char *dir, const char *skip)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            (!skip || strcmp(e->d_name, skip)))
            count++;
    closedir(d);
    return count;
}

Test(checkpoint, failed_save_leaves_old_file)
{
    fixture fx;
    ckpt_setup(&fx);
    size_t len0;
    unsigned char *old = ckpt_slurp(fx.good, &len0);

    /* a directory that does not exist */
    char *nodir = ckpt_path_in(fx.dir, "no/such/dir/x.safetensors");
    cr_assert_eq(castor_model_save(fx.m, nodir), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), nodir), "%s", castor_model_errmsg(fx.m));
    free(nodir);
    /* a path that is a directory */
    char *sub = ckpt_path_in(fx.dir, "sub");
    cr_assert_eq(mkdir(sub, 0755), 0);
    cr_assert_eq(castor_model_save(fx.m, sub), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), sub), "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(sub, NULL), 0);
    support_rmrf(sub);
    free(sub);

    /* a write that fails half-way (file size limit: EFBIG) over the old file */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit saved, small;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
    small = saved;
    small.rlim_cur = 1000;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = castor_model_save(fx.m, fx.good);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
    cr_assert_eq(rc, CASTOR_IO, "save under a 1000-byte limit: %d %s", rc,
                 castor_model_errmsg(fx.m));
    cr_assert(strstr(castor_model_errmsg(fx.m), fx.good), "%s", castor_model_errmsg(fx.m));
    size_t len1;
    unsigned char *now = ckpt_slurp(fx.good, &len1);
    cr_assert(len0 == len1 && memcmp(old, now, len0) == 0, "the old checkpoint changed");
    free(now);
    /* no temporary file left behind: only good.safetensors */
    cr_assert_eq(dir_entries(fx.dir, NULL), 1);

    /* a save that works replaces it, and the old one loaded is the old state */
    cr_assert_eq(castor_model_save(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(fx.dir, NULL), 1);
    struct stat st;
    cr_assert_eq(stat(fx.good, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0644);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, fx.good, ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu")),
                 CASTOR_OK);
    cr_assert_eq(castor_model_step(m), 2);
    castor_strategy *ms = m->strategy;
    castor_model_free(m);
    castor_strategy_free(ms);
    free(old);
    ckpt_teardown(&fx);
}

/* A save to a symbolic link writes the file it leads to, as open() would,
 * and leaves the link: renaming over the link put a plain file in its
 * place and left the file the user keeps the model in stale. */
Test(checkpoint, save_writes_through_a_symbolic_link)
{
    fixture fx;
    ckpt_setup(&fx);
    char *store = ckpt_path_in(fx.dir, "store");
    cr_assert_eq(mkdir(store, 0755), 0);
    char *real = ckpt_path_in(fx.dir, "store/model.safetensors");
    char *link1 = ckpt_path_in(fx.dir, "link1.safetensors");
    char *link2 = ckpt_path_in(fx.dir, "link2.safetensors");
    /* link2 -> link1 -> store/model.safetensors (relative, read from each
     * link's directory), which does not exist yet */
    cr_assert_eq(symlink("store/model.safetensors", link1), 0);
    cr_assert_eq(symlink("link1.safetensors", link2), 0);
    cr_assert_eq(castor_model_save(fx.m, link2), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    struct stat st;
    cr_assert_eq(lstat(link2, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the link was replaced by a plain file");
    cr_assert_eq(lstat(link1, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the inner link was replaced by a plain file");
    cr_assert_eq(lstat(real, &st), 0);
    cr_assert(S_ISREG(st.st_mode));
    size_t want_len, got_len;
    unsigned char *want = ckpt_slurp(real, &want_len);
    cr_assert_eq(castor_model_save(fx.m, fx.bad), CASTOR_OK);
    unsigned char *got = ckpt_slurp(fx.bad, &got_len);
    cr_assert(want_len == got_len && memcmp(want, got, want_len) == 0,
              "the file behind the links is not the model's");
    /* a save over it through the link replaces the target's contents */
    cr_assert_eq(castor_model_save(fx.m, link1), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(lstat(link1, &st), 0);
    cr_assert(S_ISLNK(st.st_mode));
    cr_assert_eq(dir_entries(store, NULL), 1);  /* no temporary file left */
    free(want);
    free(got);

    /* a loop of links is refused, naming the path given */
    char *loop = ckpt_path_in(fx.dir, "loop.safetensors");
    cr_assert_eq(symlink("loop.safetensors", loop), 0);
    cr_assert_eq(castor_model_save(fx.m, loop), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), loop), "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(lstat(loop, &st), 0);
    cr_assert(S_ISLNK(st.st_mode));
    /* a link to a directory is refused as the directory is */
    char *to_dir = ckpt_path_in(fx.dir, "to_dir.safetensors");
    cr_assert_eq(symlink("store", to_dir), 0);
    cr_assert_eq(castor_model_save(fx.m, to_dir), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), "is a directory"), "%s",
              castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(store, NULL), 1);
    free(loop);
    free(to_dir);
    free(store);
    free(real);
    free(link1);
    free(link2);
    ckpt_teardown(&fx);
}

/* As many links as open() follows (40 on Linux) are followed, one more is
 * ELOOP: a chain of 40 was refused, the last link never looked at. */
Test(checkpoint, save_follows_as_many_links_as_open)
{
    fixture fx;
    ckpt_setup(&fx);
    char name[32], prev[32] = "model.safetensors";
    char *path = NULL;
    for (int i = 1; i <= 41; i++) {
        snprintf(name, sizeof name, "l%d", i);
        free(path);
        path = ckpt_path_in(fx.dir, name);
        cr_assert_eq(symlink(prev, path), 0);
        snprintf(prev, sizeof prev, "%s", name);
        if (i == 40)
            cr_assert_eq(castor_model_save(fx.m, path), CASTOR_OK, "%s",
                         castor_model_errmsg(fx.m));
    }
    cr_assert_eq(castor_model_save(fx.m, path), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), "Too many levels of symbolic links"), "%s",
              castor_model_errmsg(fx.m));
    char *real = ckpt_path_in(fx.dir, "model.safetensors");
    struct stat st;
    cr_assert_eq(lstat(real, &st), 0);
    cr_assert(S_ISREG(st.st_mode));
    free(real);
    free(path);
    ckpt_teardown(&fx);
}

static int refuse_h2d(cdev *dev, int stream, void *d_dst, const void *h_src, size_t bytes)
{
    (void)stream, (void)d_dst, (void)h_src, (void)bytes;
    return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected copy failure", dev->name);
}

/* castor.h's one exception to "a failed load leaves the model unchanged": a
 * mirrored replica that fails as the values are placed on it. The model then
 * refuses work, and a load that succeeds brings it back whole. */
Test(checkpoint, a_load_the_devices_fail_to_place_is_recovered_by_loading_again)
{
    fixture fx;
    ckpt_setup(&fx);
    cdev *dev1 = fx.s->devs[1];
    const cdev_iface *real = dev1->iface;
    cdev_iface failing = *real;
    failing.copy_h2d = refuse_h2d;
    dev1->iface = &failing;
    int rc = castor_model_load(fx.m, fx.good);
    dev1->iface = real;
    cr_assert_eq(rc, CASTOR_DEVICE, "rc %d: %s", rc, castor_model_errmsg(fx.m));
    cr_assert(strstr(castor_model_errmsg(fx.m), "injected"), "%s", castor_model_errmsg(fx.m));
    size_t n = castor_model_num_params(fx.m);
    float *params = malloc(n * sizeof *params);
    cr_assert_eq(castor_model_get_params(fx.m, params, n), CASTOR_DEVICE);
    free(params);

    cr_assert_eq(castor_model_load(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    snap got = ckpt_take(fx.m);
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *ref = NULL;
    cr_assert_eq(castor_model_open(&ref, fx.good, s), CASTOR_OK, "%s", castor_model_errmsg(ref));
    snap want = ckpt_take(ref);
    ckpt_assert_same(&want, &got, "loaded again after the failed placement");
    ckpt_train_steps(fx.m, fx.ds, 1);
    ckpt_snap_free(&got);
    ckpt_snap_free(&want);
    castor_model_free(ref);
    castor_strategy_free(s);
    ckpt_teardown(&fx);
}

/* ---- Python ------------------------------------------------------------------------------- */

Test(checkpoint, python_safetensors_reads_it)
{
    if (system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0)
        cr_skip_test("python3 with safetensors and numpy is not available");
    fixture fx;
    ckpt_setup(&fx);
    cr_assert_eq(castor_model_load(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    snap s = ckpt_take(fx.m);
    /* dense_0.kernel[2][5] is params[2*16+5]; dense_1.bias[3] at 12*16+16+16*8+3;
     * adam_v of dense_0.kernel[0][1] at state[n + 1]. */
    size_t b1 = 12 * 16 + 16 + 16 * 8 + 3;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c '\n"
             "import sys, numpy as np\n"
             "from safetensors import safe_open\n"
             "from safetensors.numpy import load_file\n"
             "t = load_file(sys.argv[1])\n"
             "meta = safe_open(sys.argv[1], \"np\").metadata()\n"
             "k = t[\"dense_0.kernel\"]\n"
             "assert k.shape == (12, 16) and k.dtype == np.float32\n"
             "assert t[\"dense_2.bias.adam_m\"].shape == (3,)\n"
             "assert len(t) == 18, len(t)\n"
             "assert t[\"dense_0.kernel\"][2, 5] == np.float32(%.9g), t[\"dense_0.kernel\"][2, 5]\n"
             "assert t[\"dense_1.bias\"][3] == np.float32(%.9g)\n"
             "assert t[\"dense_0.kernel.adam_v\"][0, 1] == np.float32(%.9g)\n"
             "assert meta[\"format\"] == \"castor-checkpoint-1\" and meta[\"step\"] == \"3\"\n"
             "assert meta[\"layers\"] == \"16:tanh,8:relu,3:linear\"\n"
             "' '%s'",
             (double)s.params[2 * 16 + 5], (double)s.params[b1], (double)s.state[s.n + 1],
             fx.good);
    cr_assert_eq(system(cmd), 0, "python3 could not read the checkpoint as expected");
    ckpt_snap_free(&s);
    ckpt_teardown(&fx);
}

Test(checkpoint, a_long_device_list_is_recorded_whole)
{
    /* The strategy kept the list in 256 bytes: a longer one (the old
     * parser refused it; the new one takes any length) was cut short in
     * the checkpoint's metadata. */
    char devices[512] = "";
    for (int i = 0; i < 60; i++)
        strcat(devices, i ? ",cpu:1" : "cpu:1");
    cr_assert_gt(strlen(devices), 300);
    char *dir = support_tmpdir();
    char *path = ckpt_path_in(dir, "many.safetensors");
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, devices);
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_SGD), 1);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor__st_file f;
    char err[256];
    cr_assert_eq(castor__st_read(path, &f, err, sizeof err), CASTOR_OK, "%s", err);
    const char *got = castor__st_meta_get(&f, "devices");
    cr_assert(got && strcmp(got, devices) == 0, "devices '%s'", got ? got : "(none)");
    castor__st_free(&f);
    castor_model_free(m);
    castor_strategy_free(s);
    support_rmrf(dir);
    free(dir);
    free(path);
}

Test(checkpoint, a_file_name_near_name_max_saves)
{
    /* The temporary file was the name + ".tmp.XXXXXX": past NAME_MAX for
     * names of 245..255 bytes, which the file system itself takes. */
    fixture fx;
    ckpt_setup(&fx);
    char name[NAME_MAX + 1];
    memset(name, 'n', NAME_MAX);
    memcpy(name + NAME_MAX - strlen(".safetensors"), ".safetensors", strlen(".safetensors"));
    name[NAME_MAX] = '\0';
    char *path = ckpt_path_in(fx.dir, name);
    cr_assert_eq(castor_model_save(fx.m, path), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(castor_model_load(fx.m, path), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    /* again, over the file: and nothing else is left in the directory */
    cr_assert_eq(castor_model_save(fx.m, path), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(fx.dir, NULL), 2, "good.safetensors and the long one");
    free(path);
    ckpt_teardown(&fx);
}

/* ---- a checkpoint of a diverged model ---------------------------------------------- */

/* What castor_model_save writes of a model whose training diverged (NaN or
 * inf in its variables, or in its optimizer state only) is a file to
 * inspect: load takes it, and evaluate, predict and get_params show the
 * values. Training from it is pointless: fit refuses it, changing nothing,
 * until finite values are set or loaded. */
static void diverged_checkpoint(castor_strategy_kind kind, const char *devices, int in_state)
{
    char *dir = support_tmpdir();
    char *good = ckpt_path_in(dir, "good.safetensors");
    char *bad = ckpt_path_in(dir, "diverged.safetensors");
    castor_dataset *ds = ckpt_synthetic();
    castor_strategy *s = ckpt_make_strategy(kind, devices);
    castor_model *m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 42);
    ckpt_train_steps(m, ds, 3);
    cr_assert_eq(castor_model_save(m, good), CASTOR_OK, "%s", castor_model_errmsg(m));
    snap a = ckpt_take(m);  /* the host's copies are current: save writes them */
    if (in_state)
        ((float *)m->opt_state.ptr)[a.n + 5] = INFINITY;  /* an adam_v overflowed */
    else
        ((float *)m->params.ptr)[3] = NAN;
    cr_assert_eq(castor_model_save(m, bad), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);

    const char *what = in_state ? "inf in the optimizer state" : "NaN in a variable";
    s = ckpt_make_strategy(kind, devices);
    m = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 7);
    cr_assert_eq(castor_model_load(m, bad), CASTOR_OK, "%s: %s", what, castor_model_errmsg(m));
    snap b = ckpt_take(m);
    cr_assert_eq(isnan(b.params[3]), !in_state, "%s: get_params shows it", what);
    castor_metrics met;
    cr_assert_eq(castor_model_evaluate(m, ds, BATCH, &met), CASTOR_OK, "%s: %s", what,
                 castor_model_errmsg(m));
    cr_assert_eq(isnan(met.loss), !in_state, "%s: loss %g", what, met.loss);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.max_steps = 1;
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_INVALID, "%s: fit took it", what);
    cr_assert(strstr(castor_model_errmsg(m), "not finite"), "%s: '%s'", what,
              castor_model_errmsg(m));
    snap c = ckpt_take(m);
    cr_assert_eq(c.step, b.step, "%s: fit stepped", what);
    /* Finite variables set: enough where only they were not finite. */
    cr_assert_eq(castor_model_set_params(m, a.params, a.n), CASTOR_OK, "%s", what);
    int rc = castor_model_fit(m, ds, &fo, NULL);
    cr_assert_eq(rc, in_state ? CASTOR_INVALID : CASTOR_OK, "%s: fit after set_params: %s",
                 what, castor_model_errmsg(m));
    cr_assert_eq(castor_model_load(m, good), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_fit(m, ds, &fo, NULL), CASTOR_OK, "%s: fit after a good load: %s",
                 what, castor_model_errmsg(m));
    ckpt_snap_free(&a);
    ckpt_snap_free(&b);
    ckpt_snap_free(&c);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
    support_rmrf(dir);
    free(good);
    free(bad);
    free(dir);
}

Test(checkpoint, a_diverged_model_loads_for_eval_and_fit_refuses_it_central)
{
    diverged_checkpoint(CASTOR_STRATEGY_CENTRAL, "cpu:2", 0);
    diverged_checkpoint(CASTOR_STRATEGY_CENTRAL, "cpu:2", 1);
}
Test(checkpoint, a_diverged_model_loads_for_eval_and_fit_refuses_it_mirrored)
{
    diverged_checkpoint(CASTOR_STRATEGY_MIRRORED, "cpu:2", 0);
    diverged_checkpoint(CASTOR_STRATEGY_MIRRORED, "cpu:2", 1);
}

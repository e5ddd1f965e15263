/*
 * Checkpoints of a trained model: save/load round trips (variables,
 * optimizer state, position) on both strategies, files that do not depend on
 * the locale, a load the devices fail to place, a file read back by Python's
 * safetensors, and a diverged model's checkpoint (going on from one:
 * test_checkpoint_resume.c; the writes themselves: test_checkpoint_write.c).
 */
#include <criterion/criterion.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- optimizer settings, and a load the devices fail to place ---------------------- */

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

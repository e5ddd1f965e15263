/*
 * Device faults injected into the calls around the training steps
 * (evaluate, predict, get_params, set_params, save, load) and into compile:
 * each must fail with the injected message, leave the model as it was or
 * refusing work until set_params, and leave nothing queued behind.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "device/device.h"
#include "fault_support.h"
#include "src/model.h"
#include "src/strategy.h"
#include "support.h"

/* ---- faults in the calls around the steps ---- */

enum { ACT_EVALUATE, ACT_PREDICT, ACT_GET, ACT_SET, ACT_SAVE, ACT_LOAD, ACT_EVAL_BIG, ACT_N };
static const char *const act_names[ACT_N] = {"evaluate", "predict", "get_params", "set_params",
                                             "save", "load", "evaluate in larger batches"};

static int act(int a, castor_model *m, castor_dataset *ds, const fault_scenario *sc,
               const float *params, const char *path)
{
    size_t np = castor_model_num_params(m);
    castor_metrics met;
    int rc;
    switch (a) {
    case ACT_EVALUATE:
        return castor_model_evaluate(m, ds, sc->batch, &met);
    case ACT_PREDICT: {
        size_t n = castor_dataset_size(ds);
        float *out = malloc(n * C * sizeof *out);
        rc = castor_model_predict(m, castor_dataset_x(ds), n, sc->batch, out);
        free(out);
        return rc;
    }
    case ACT_GET: {
        float *p = malloc(np * sizeof *p);
        rc = castor_model_get_params(m, p, np);
        free(p);
        return rc;
    }
    case ACT_SET:
        return castor_model_set_params(m, params, np);
    case ACT_SAVE:
        return castor_model_save(m, path);
    case ACT_EVAL_BIG:
        return castor_model_evaluate(m, ds, 3 * sc->batch, &met);
    default:
        return castor_model_load(m, path);
    }
}

static void sweep_calls(const fault_scenario *sc)
{
    castor_dataset *ds = support_synthetic(3, sc->n, F, C);
    char *dir = support_tmpdir();
    char path[4200], path2[4200];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    snprintf(path2, sizeof path2, "%s/b.safetensors", dir);
    castor_strategy *s = NULL;
    castor_model *m = fault_make(sc, &s);
    cr_assert_eq(fault_fit_steps(m, ds, sc, sc->warm_steps + 1), CASTOR_OK);
    float *want = fault_params_of(m);
    size_t np = castor_model_num_params(m);
    castor_model_free(m);
    castor_strategy_free(s);
    int cases = 0;
    for (int a = 0; a < ACT_N; a++) {
        m = fault_make(sc, &s);
        cr_assert_eq(fault_fit_steps(m, ds, sc, sc->warm_steps), CASTOR_OK);
        cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
        /* Trained on since the host's copy was taken (mirrored). */
        cr_assert_eq(fault_fit_steps(m, ds, sc, 1), CASTOR_OK);
        float *p = fault_params_of(m);
        cr_assert_eq(castor_model_load(m, path), CASTOR_OK);
        /* The replicas hold what the host does; as if trained since (mirrored),
         * so that get_params and save read them back. */
        m->host_params_current = 0;
        fault_inject(s);
        cr_assert_eq(act(a, m, ds, sc, p, path2), CASTOR_OK, "%s", castor_model_errmsg(m));
        long counts[MAXDEV][OP_N];
        int nrep = fault_take_counts(counts);
        free(p);
        castor_model_free(m);
        castor_strategy_free(s);
        for (int rep = 0; rep < nrep; rep++)
            for (int op = 0; op < OP_N; op++)
                for (long at = 1; at <= counts[rep][op]; at++) {
                    m = fault_make(sc, &s);
                    cr_assert_eq(fault_fit_steps(m, ds, sc, sc->warm_steps), CASTOR_OK);
                    float *before = fault_params_of(m);
                    int64_t step0 = castor_model_step(m);
                    m->host_params_current = 0;
                    fault_arm(s, s->devs[rep], op, at, sc->async);
                    int rc = act(a, m, ds, sc, before, path);
                    fault_uninject();
                    char what[160];
                    snprintf(what, sizeof what, "%s %s %s: %s #%ld on replica %d",
                             castor_strategy_kind_name(sc->kind), sc->devices, act_names[a],
                             fault_op_names[op], at, rep);
                    cr_assert(fault_failed, "%s: not reached", what);
                    cr_assert_neq(rc, CASTOR_OK, "%s: succeeded", what);
                    /* A dropped copy may leave labels a kernel refuses first. */
                    cr_assert(sc->async || strstr(castor_model_errmsg(m), "injected"),
                              "%s: message '%s'", what, castor_model_errmsg(m));
                    cr_assert_eq(castor_model_step(m), step0, "%s: step moved", what);
                    fault_assert_nothing_queued(s, what);
                    if (m->inconsistent) {
                        cr_assert(a == ACT_SET || a == ACT_LOAD, "%s: inconsistent", what);
                        cr_assert_eq(castor_model_set_params(m, before, np), CASTOR_OK,
                                     "%s: %s", what, castor_model_errmsg(m));
                    } else {
                        float *now = fault_params_of(m);
                        cr_assert(memcmp(now, before, np * sizeof *now) == 0,
                                  "%s: consistent but changed", what);
                        free(now);
                    }
                    cr_assert_eq(fault_fit_steps(m, ds, sc, 1), CASTOR_OK, "%s: retry: %s", what,
                                 castor_model_errmsg(m));
                    float *got = fault_params_of(m);
                    cr_assert(memcmp(got, want, np * sizeof *got) == 0,
                              "%s: the next step differs from the reference", what);
                    free(got);
                    free(before);
                    castor_model_free(m);
                    castor_strategy_free(s);
                    cases++;
                }
    }
    cr_log_info("calls %s %s: %d faults", castor_strategy_kind_name(sc->kind), sc->devices,
                cases);
    support_rmrf(dir);
    free(dir);
    free(want);
    castor_dataset_free(ds);
}

Test(faults, calls_central_cpu3)
{
    fault_scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 0};
    sweep_calls(&sc);
}
Test(faults, calls_central_cpu3_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 1};
    sweep_calls(&sc);
}
Test(faults, calls_mirrored_cpu3)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 0};
    sweep_calls(&sc);
}
Test(faults, calls_mirrored_cpu3_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 1};
    sweep_calls(&sc);
}
Test(faults, calls_mirrored_cpu1x3_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 1, 1};
    sweep_calls(&sc);
}

/* ---- faults while compiling ---- */

static void sweep_compile(const fault_scenario *sc)
{
    castor_strategy *s = NULL;
    castor_model *m = fault_make(sc, &s);
    float *want = fault_params_of(m);
    size_t np = castor_model_num_params(m);
    castor_model_free(m);
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    fault_inject(s);
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "5:tanh,3"), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 7), CASTOR_OK);
    long counts[MAXDEV][OP_N];
    int nrep = fault_take_counts(counts);
    castor_model_free(m);
    castor_strategy_free(s);
    int cases = 0;
    for (int rep = 0; rep < nrep; rep++)
        for (int op = 0; op < OP_N; op++)
            for (long at = 1; at <= counts[rep][op]; at++) {
                cr_assert_eq(castor_strategy_create(&s, sc->kind, sc->devices, NULL),
                             CASTOR_OK);
                cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
                cr_assert_eq(castor_model_add_layers(m, "5:tanh,3"), CASTOR_OK);
                fault_arm(s, s->devs[rep], op, at, sc->async);
                int rc = castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 7);
                fault_uninject();
                char what[160];
                snprintf(what, sizeof what, "%s %s compile: %s #%ld on replica %d",
                         castor_strategy_kind_name(sc->kind), sc->devices, fault_op_names[op], at,
                         rep);
                cr_assert(fault_failed, "%s: not reached", what);
                cr_assert_neq(rc, CASTOR_OK, "%s: succeeded", what);
                cr_assert(strstr(castor_model_errmsg(m), "injected"), "%s: message '%s'", what,
                          castor_model_errmsg(m));
                for (int i = 0; i < s->n_replicas; i++)
                    cr_assert_eq(s->devs[i]->used, 0, "%s: %zu bytes left on replica %d", what,
                                 s->devs[i]->used, i);
                float p[1];
                cr_assert_eq(castor_model_get_params(m, p, 1), CASTOR_MISUSE, "%s", what);
                /* Compiled again on the same strategy, it is the model it would have been. */
                cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 7),
                             CASTOR_OK, "%s: again: %s", what, castor_model_errmsg(m));
                float *got = fault_params_of(m);
                cr_assert(memcmp(got, want, np * sizeof *got) == 0, "%s: differs", what);
                cr_assert_eq(castor_model_step(m), 0, "%s", what);
                cr_assert_eq(m->inconsistent, 0, "%s", what);
                free(got);
                castor_model_free(m);
                castor_strategy_free(s);
                cases++;
            }
    cr_log_info("compile %s %s: %d faults", castor_strategy_kind_name(sc->kind), sc->devices,
                cases);
    free(want);
}

Test(faults, compile_central_cpu3)
{
    fault_scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 0};
    sweep_compile(&sc);
}
Test(faults, compile_mirrored_cpu3)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 0};
    sweep_compile(&sc);
}
Test(faults, compile_mirrored_cpu3_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 1};
    sweep_compile(&sc);
}
Test(faults, compile_mirrored_cpu1x3)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 1, 0};
    sweep_compile(&sc);
}

/* A mirrored get_params that failed part-way left its first copy (replica 0's
 * variables into the host's) queued: a load after it placed the file's
 * values, and then that copy ran, ahead of replica 0's upload, and put the
 * old variables back on the host and on replica 0. */
Test(faults, a_failed_read_back_leaves_no_copy_behind)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:2", 40, 8, 1, 0};
    castor_dataset *ds = support_synthetic(3, sc.n, F, C);
    char *dir = support_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    castor_strategy *s = NULL;
    castor_model *m = fault_make(&sc, &s);
    cr_assert_eq(fault_fit_steps(m, ds, &sc, 1), CASTOR_OK);
    float *saved = fault_params_of(m);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(fault_fit_steps(m, ds, &sc, 1), CASTOR_OK);
    size_t np = castor_model_num_params(m);
    float *p = malloc(np * sizeof *p);

    /* The second copy back (the optimizer state) fails as it is queued. */
    fault_arm(s, s->devs[0], OP_D2H, 2, 0);
    int rc = castor_model_get_params(m, p, np);
    fault_uninject();
    cr_assert(fault_failed);
    cr_assert_eq(rc, CASTOR_DEVICE, "%s", castor_model_errmsg(m));

    cr_assert_eq(castor_model_load(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_get_params(m, p, np), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert(memcmp(p, saved, np * sizeof *p) == 0, "the loaded variables were overwritten");
    /* And every replica holds them: the host's copy is read back from replica 0. */
    m->host_params_current = 0;
    cr_assert_eq(castor_model_get_params(m, p, np), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert(memcmp(p, saved, np * sizeof *p) == 0, "replica 0 holds other variables");
    free(p);
    free(saved);
    castor_model_free(m);
    castor_strategy_free(s);
    support_rmrf(dir);
    free(dir);
    castor_dataset_free(ds);
}

/* One mirrored replica updates in the same phase as it computes: a failure
 * before the update was queued changed nothing, and the model was marked as
 * if it had (refusing work until set_params, which takes the optimizer
 * state back to the host's last copy of it). */
Test(faults, one_mirrored_replica_failing_before_its_update_stays_consistent)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu", 40, 8, 2, 0};
    castor_dataset *ds = support_synthetic(3, sc.n, F, C);
    castor_strategy *s = NULL;
    castor_model *m = fault_make(&sc, &s);
    cr_assert_eq(fault_fit_steps(m, ds, &sc, sc.warm_steps + 1), CASTOR_OK);
    float *want = fault_params_of(m);
    castor_model_free(m);
    castor_strategy_free(s);
    static const int ops[] = {OP_H2D, OP_GEMM, OP_XENT, OP_OPTIM};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        m = fault_make(&sc, &s);
        cr_assert_eq(fault_fit_steps(m, ds, &sc, sc.warm_steps), CASTOR_OK);
        fault_arm(s, s->devs[0], ops[i], 1, 0);
        int rc = fault_fit_steps(m, ds, &sc, 1);
        fault_uninject();
        cr_assert(fault_failed);
        cr_assert_eq(rc, CASTOR_DEVICE, "%s", castor_model_errmsg(m));
        castor_metrics met;
        cr_assert_eq(castor_model_evaluate(m, ds, sc.batch, &met), CASTOR_OK, "%s: %s",
                     fault_op_names[ops[i]], castor_model_errmsg(m));
        cr_assert_eq(fault_fit_steps(m, ds, &sc, 1), CASTOR_OK, "%s", castor_model_errmsg(m));
        float *got = fault_params_of(m);
        size_t np = castor_model_num_params(m);
        cr_assert(memcmp(got, want, np * sizeof *got) == 0, "%s: the step differs",
                  fault_op_names[ops[i]]);
        free(got);
        castor_model_free(m);
        castor_strategy_free(s);
    }
    free(want);
    castor_dataset_free(ds);
}

/* set_params after a failed mirrored update takes the optimizer state back
 * to the host's last copy of it; Adam's step count, which its bias
 * correction reads, must go back with it. Every step here trains on the
 * same rows in the same order (one batch of the whole data, unshuffled), so
 * a model recovered to the variables and state of step 2 must take the step
 * that a model at step 2 takes, whatever steps it trained meanwhile. */
static int whole_batch_steps(castor_model *m, castor_dataset *ds, int steps)
{
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 1000;
    fo.batch_size = (int)castor_dataset_size(ds);
    fo.shuffle = 0;
    fo.max_steps = steps;
    return castor_model_fit(m, ds, &fo, NULL);
}

Test(faults, recovery_takes_adams_step_count_back_with_its_state)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:2", 12, 12, 2, 0};
    castor_dataset *ds = support_synthetic(3, sc.n, F, C);
    castor_strategy *s = NULL;
    castor_model *m = fault_make(&sc, &s);
    cr_assert_eq(whole_batch_steps(m, ds, 3), CASTOR_OK, "%s", castor_model_errmsg(m));
    float *want = fault_params_of(m);
    castor_model_free(m);
    castor_strategy_free(s);

    m = fault_make(&sc, &s);
    cr_assert_eq(whole_batch_steps(m, ds, 2), CASTOR_OK);
    float *at2 = fault_params_of(m);  /* the host's copy of the state: step 2's */
    cr_assert_eq(whole_batch_steps(m, ds, 3), CASTOR_OK);
    /* Replica 1's update fails after replica 0's was applied. */
    fault_arm(s, s->devs[1], OP_OPTIM, 1, 0);
    int rc = whole_batch_steps(m, ds, 1);
    fault_uninject();
    cr_assert(fault_failed);
    cr_assert_eq(rc, CASTOR_DEVICE, "%s", castor_model_errmsg(m));
    cr_assert(m->inconsistent);
    size_t np = castor_model_num_params(m);
    cr_assert_eq(castor_model_set_params(m, at2, np), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_step(m), 5, "the model's own step count stays");
    /* A checkpoint of the recovered model carries the state's count too. */
    char *dir = support_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/recovered.safetensors", dir);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    for (int loaded = 0; loaded < 2; loaded++) {
        if (loaded) {
            castor_model_free(m);
            castor_strategy_free(s);
            m = fault_make(&sc, &s);
            cr_assert_eq(castor_model_load(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
            cr_assert_eq(castor_model_step(m), 5);
        }
        cr_assert_eq(whole_batch_steps(m, ds, 1), CASTOR_OK, "%s", castor_model_errmsg(m));
        float *got = fault_params_of(m);
        size_t differ = 0;
        for (size_t i = 0; i < np; i++)
            differ += got[i] != want[i];
        cr_assert_eq(differ, 0, "%s: %zu of %zu variables differ from the third step of a "
                     "model at step 2 (first: %.9g, want %.9g)",
                     loaded ? "loaded from its checkpoint" : "recovered", differ, np,
                     (double)got[0], (double)want[0]);
        free(got);
    }
    support_rmrf(dir);
    free(dir);
    free(at2);
    free(want);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(ds);
}

/* A mirrored get_params that fails part-way may have written some of
 * replica 0's optimizer state into the host's copy, all of it, or none (a
 * copy that fails as queued work may have landed before the failure is
 * reported, or in part), while the host's count of that state's steps stays
 * the old one. set_params recovery restores that copy: it must either be
 * the copy the count says (the step after recovery is that of a model at
 * step 2) or be refused, leaving load to recover. Every fault of every call
 * get_params makes on replica 0, at once and as queued work. */
Test(faults, recovery_after_a_failed_read_back_restores_no_torn_state)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:2", 12, 12, 2, 0};
    castor_dataset *ds = support_synthetic(3, sc.n, F, C);
    char *dir = support_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/at2.safetensors", dir);
    castor_strategy *s = NULL;
    castor_model *m = fault_make(&sc, &s);
    cr_assert_eq(whole_batch_steps(m, ds, 3), CASTOR_OK, "%s", castor_model_errmsg(m));
    float *want = fault_params_of(m);
    size_t np = castor_model_num_params(m);
    castor_model_free(m);
    castor_strategy_free(s);
    float *p = malloc(np * sizeof *p);

    /* The calls a get_params makes on replica 0. */
    m = fault_make(&sc, &s);
    cr_assert_eq(whole_batch_steps(m, ds, 1), CASTOR_OK);
    fault_inject(s);
    cr_assert_eq(castor_model_get_params(m, p, np), CASTOR_OK, "%s", castor_model_errmsg(m));
    long counts[MAXDEV][OP_N];
    fault_take_counts(counts);
    castor_model_free(m);
    castor_strategy_free(s);

    int cases = 0, refused = 0;
    for (int async = 0; async < 2; async++)
        for (int op = 0; op < OP_N; op++)
            for (long at = 1; at <= counts[0][op]; at++) {
                char what[160];
                snprintf(what, sizeof what, "get_params: %s #%ld on replica 0%s",
                         fault_op_names[op], at, async ? " (queued)" : "");
                m = fault_make(&sc, &s);
                cr_assert_eq(whole_batch_steps(m, ds, 2), CASTOR_OK);
                float *at2 = fault_params_of(m);  /* the host's copy of the state: step 2's */
                cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s",
                             castor_model_errmsg(m));
                cr_assert_eq(whole_batch_steps(m, ds, 1), CASTOR_OK);
                fault_arm(s, s->devs[0], op, at, async);
                int rc = castor_model_get_params(m, p, np);
                fault_uninject();
                cr_assert(fault_failed, "%s: not reached", what);
                cr_assert_eq(rc, CASTOR_DEVICE, "%s: %s", what, castor_model_errmsg(m));
                /* Replica 1's update fails after replica 0's was applied. */
                fault_arm(s, s->devs[1], OP_OPTIM, 1, 0);
                rc = whole_batch_steps(m, ds, 1);
                fault_uninject();
                cr_assert_eq(rc, CASTOR_DEVICE, "%s: %s", what, castor_model_errmsg(m));
                cr_assert(m->inconsistent, "%s", what);
                rc = castor_model_set_params(m, at2, np);
                if (rc) {
                    cr_assert_eq(rc, CASTOR_DEVICE, "%s: %s", what, castor_model_errmsg(m));
                    cr_assert(strstr(castor_model_errmsg(m), "load a checkpoint"),
                              "%s: message '%s'", what, castor_model_errmsg(m));
                    castor_metrics met;
                    cr_assert_eq(castor_model_evaluate(m, ds, sc.batch, &met), CASTOR_DEVICE,
                                 "%s: refused recovery, yet it works", what);
                    cr_assert_eq(castor_model_load(m, path), CASTOR_OK, "%s: %s", what,
                                 castor_model_errmsg(m));
                    refused++;
                }
                cr_assert_eq(whole_batch_steps(m, ds, 1), CASTOR_OK, "%s: %s", what,
                             castor_model_errmsg(m));
                float *got = fault_params_of(m);
                size_t differ = 0;
                for (size_t i = 0; i < np; i++)
                    differ += got[i] != want[i];
                cr_assert_eq(differ, 0, "%s: recovered %s, %zu of %zu variables differ from "
                             "the third step of a model at step 2", what,
                             rc ? "by load" : "by set_params", differ, np);
                free(got);
                free(at2);
                castor_model_free(m);
                castor_strategy_free(s);
                cases++;
            }
    cr_log_info("torn state: %d faults, %d recoveries refused", cases, refused);
    free(p);
    support_rmrf(dir);
    free(dir);
    free(want);
    castor_dataset_free(ds);
}

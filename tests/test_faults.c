/*
 * Device faults injected into training steps: every device operation, on
 * every replica, at every call a step makes, for both strategies. After the
 * failed step the model must either be as it was (the next step trains as
 * if nothing had happened) or refuse work until set_params restores it.
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

static void sweep(const fault_scenario *sc)
{
    castor_dataset *ds = support_synthetic(3, sc->n, F, C);
    /* The reference: warm_steps + 2 steps with no fault. */
    castor_strategy *s = NULL;
    castor_model *m = fault_make(sc, &s);
    cr_assert_eq(fault_fit_steps(m, ds, sc, sc->warm_steps + 2), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    float *want = fault_params_of(m);
    size_t np = castor_model_num_params(m);
    /* Count the calls one step makes. */
    castor_model_free(m);
    castor_strategy_free(s);
    m = fault_make(sc, &s);
    cr_assert_eq(fault_fit_steps(m, ds, sc, sc->warm_steps), CASTOR_OK);
    fault_inject(s);
    long counts[MAXDEV][OP_N];
    cr_assert_eq(fault_fit_steps(m, ds, sc, 1), CASTOR_OK, "%s", castor_model_errmsg(m));
    int nrep = fault_take_counts(counts);
    castor_model_free(m);
    castor_strategy_free(s);

    int cases = 0;
    for (int rep = 0; rep < nrep; rep++)
        for (int op = 0; op < OP_N; op++)
            for (long at = 1; at <= counts[rep][op]; at++) {
                m = fault_make(sc, &s);
                cr_assert_eq(fault_fit_steps(m, ds, sc, sc->warm_steps), CASTOR_OK);
                float *before = fault_params_of(m);  /* also the host's optimizer state */
                castor_run_stats rs0, rs1;
                castor_model_run_stats(m, &rs0);
                int64_t step0 = castor_model_step(m), sie0 = castor_model_step_in_epoch(m);
                int64_t ep0 = castor_model_epoch(m);
                fault_arm(s, s->devs[rep], op, at, sc->async);
                int rc = fault_fit_steps(m, ds, sc, 1);
                fault_uninject();
                char what[160];
                snprintf(what, sizeof what, "%s %s: %s #%ld on replica %d",
                         castor_strategy_kind_name(sc->kind), sc->devices, fault_op_names[op],
                         at, rep);
                cr_assert(fault_failed, "%s: not reached", what);
                cr_assert_neq(rc, CASTOR_OK, "%s: fit succeeded", what);
                /* A dropped copy of the labels into buffers no step has
                 * written yet leaves labels a kernel refuses first: only
                 * a failed upload may be reported so. */
                const char *msg = castor_model_errmsg(m);
                cr_assert(strstr(msg, "injected") ||
                              (sc->async && !sc->warm_steps && op == OP_H2D &&
                               strstr(msg, "label")),
                          "%s: message '%s'", what, msg);
                cr_assert_eq(castor_model_step(m), step0, "%s: step moved", what);
                fault_assert_nothing_queued(s, what);
                cr_assert_eq(castor_model_step_in_epoch(m), sie0, "%s", what);
                cr_assert_eq(castor_model_epoch(m), ep0, "%s", what);
                castor_model_run_stats(m, &rs1);
                cr_assert_eq(rs1.steps, rs0.steps, "%s: run stats counted it", what);
                if (m->inconsistent) {
                    castor_metrics met;
                    cr_assert_eq(castor_model_evaluate(m, ds, sc->batch, &met), CASTOR_DEVICE,
                                 "%s", what);
                    cr_assert_eq(fault_fit_steps(m, ds, sc, 1), CASTOR_DEVICE, "%s", what);
                    cr_assert_eq(castor_model_set_params(m, before, np), CASTOR_OK, "%s: %s",
                                 what, castor_model_errmsg(m));
                } else {
                    float *now = fault_params_of(m);
                    cr_assert(memcmp(now, before, np * sizeof *now) == 0,
                              "%s: consistent but changed", what);
                    free(now);
                }
                castor_metrics met;
                cr_assert_eq(castor_model_evaluate(m, ds, sc->batch, &met), CASTOR_OK, "%s: %s",
                             what, castor_model_errmsg(m));
                cr_assert_eq(fault_fit_steps(m, ds, sc, 2), CASTOR_OK, "%s: retry: %s", what,
                             castor_model_errmsg(m));
                float *got = fault_params_of(m);
                cr_assert(memcmp(got, want, np * sizeof *got) == 0,
                          "%s: the retried steps differ from the reference", what);
                free(got);
                free(before);
                castor_model_free(m);
                castor_strategy_free(s);
                cases++;
            }
    cr_log_info("%s %s: %d faults", castor_strategy_kind_name(sc->kind), sc->devices, cases);
    free(want);
    castor_dataset_free(ds);
}

Test(faults, central_cpu3)
{
    fault_scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu3)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu1)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu", 40, 9, 1, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu1x3)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 1, 0};
    sweep(&sc);
}
/* 10 samples in batches of 3 over 3 replicas: the last batch has 1 row,
 * replicas 1 and 2 none. */
Test(faults, central_cpu3_zero_rows)
{
    fault_scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 10, 3, 3, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu3_zero_rows)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 10, 3, 3, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu1x3_zero_rows)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 10, 3, 3, 0};
    sweep(&sc);
}

Test(faults, central_cpu3_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 1};
    sweep(&sc);
}
Test(faults, mirrored_cpu3_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 1};
    sweep(&sc);
}
Test(faults, mirrored_cpu1x3_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 1, 1};
    sweep(&sc);
}
Test(faults, mirrored_cpu1_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu", 40, 9, 1, 1};
    sweep(&sc);
}
Test(faults, central_cpu3_zero_rows_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 10, 3, 3, 1};
    sweep(&sc);
}

/* No step before the faulty one: the fit that first trains the model also
 * allocates its gradients (and, mirrored, places the optimizer state on the
 * replicas, which compile leaves on the host), and a fault there must leave
 * the model as compile made it. */
Test(faults, central_cpu3_first_fit)
{
    fault_scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 0, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu3_first_fit)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 0, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu1_first_fit_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu", 40, 9, 0, 1};
    sweep(&sc);
}
Test(faults, mirrored_cpu1x3_first_fit_async)
{
    fault_scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 0, 1};
    sweep(&sc);
}

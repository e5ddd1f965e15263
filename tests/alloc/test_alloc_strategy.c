/*
 * castor_strategy_create with each of its allocations failing in turn: a
 * failed create hands out a handle (or none, when not even that could be
 * had) that says memory ran out, has no replicas, refuses a model and frees
 * cleanly; a create right after it works, and trains as if nothing had
 * failed.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "alloc_model.h"
#include "alloc_sweep.h"

static void setup(void *arg)
{
    am_run *st = arg;
    st->train = am_train();
}

static int call(void *arg)
{
    am_run *st = arg;
    castor_strategy_options o = am_strategy_options();
    return castor_strategy_create(&st->s, st->place->kind, st->place->devices, &o);
}

static const char *errmsg(void *arg)
{
    return castor_strategy_errmsg(((am_run *)arg)->s);
}

static void check(void *arg, int rc)
{
    am_run *st = arg;
    if (rc) {
        cr_assert_eq(castor_strategy_replicas(st->s), 0, "%s: a failed create has replicas",
                     alloc_where());
        if (st->s) {
            castor_model *m = am_layers();
            cr_assert_eq(castor_model_compile(m, st->s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1),
                         CASTOR_MISUSE, "%s: compile on a strategy whose create failed",
                         alloc_where());
            castor_model_free(m);
        }
        castor_strategy_free(st->s);
        st->s = am_strategy(st->place);
    }
    st->m = am_model(st->s);
    am_run_one_step(st, "one step after the create");
}

Test(alloc, strategy_create, .timeout = 300)
{
    for (int p = 0; p < AM_PLACES; p++) {
        am_run st = {.place = &am_places[p]};
        char what[128];
        snprintf(what, sizeof what, "strategy_create on %s", am_place_name(st.place));
        alloc_case c = {what, &st, setup, call, errmsg, check, am_run_teardown};
        alloc_sweep(&c);
        free(st.want);
    }
}

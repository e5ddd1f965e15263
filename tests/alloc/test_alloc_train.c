/*
 * Training and the calls around it with each allocation failing in turn:
 * fit (two epochs, with validation data), evaluate, predict, get_params and
 * set_params, on central and mirrored, one replica, two devices and two
 * replicas sharing one; on a fresh model, on one deep enough that the
 * devices' queues grow in the middle of a step, and after a call in
 * smaller batches (the replicas' buffers grow, the old ones given up).
 *
 * A failed call leaves nothing queued on a device and the model where
 * castor.h says: a fit stops after its last whole step and the rest of the
 * training, allocations allowed, ends bitwise where a fit that never failed
 * ends; evaluate, predict and get_params called again give what they give
 * with nothing failing. Where a mirrored update or upload failed part-way,
 * the model must refuse work until set_params.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_model.h"
#include "alloc_sweep.h"

enum { FIT, EVALUATE, PREDICT, GET_PARAMS, SET_PARAMS, CALLS };
static const char *const call_names[CALLS] = {"fit", "evaluate", "predict", "get_params",
                                              "set_params"};

enum { PLAIN, DEEP, GROWN, VARIANTS };
static const char *const variant_names[VARIANTS] = {"", " (deep model)",
                                                    " (after smaller batches)"};

#define SMALL_BATCH 4

typedef struct state {
    int call, variant;
    const am_place *place;
    castor_strategy *s;
    castor_model *m;
    castor_dataset *train, *val;
    float *start;    /* the variables at compile */
    float *buf;      /* what predict and get_params write, set_params reads */
    int64_t steps0, epochs0;  /* where the model stood before the call */
    castor_metrics met;
    /* From the first round: the variables after the fit, evaluate's
     * metrics, predict's outputs, get_params' variables. */
    float *want;
    castor_metrics want_met;
} state;

#define OUTPUTS ((size_t)AM_VAL_SAMPLES * AM_CLASSES)

static size_t buf_floats(const state *st)
{
    size_t np = castor_model_num_params(st->m);
    return np > OUTPUTS ? np : OUTPUTS;
}

static void setup(void *arg)
{
    state *st = arg;
    st->s = am_strategy(st->place);
    st->m = am_model_of(st->s, st->variant == DEEP ? AM_DEEP_LAYERS : AM_LAYERS);
    st->train = am_train();
    st->val = am_validation();
    st->start = am_params(st->m);
    st->buf = calloc(buf_floats(st), sizeof *st->buf);
    cr_assert(st->buf);
    if (st->variant == GROWN) {
        castor_metrics met;
        cr_assert_eq(castor_model_evaluate(st->m, st->val, SMALL_BATCH, &met), CASTOR_OK,
                     "%s: evaluate: %s", alloc_where(), castor_model_errmsg(st->m));
        cr_assert_eq(am_fit_in(st->m, st->train, NULL, SMALL_BATCH, 1, 0), CASTOR_OK,
                     "%s: fit: %s", alloc_where(), castor_model_errmsg(st->m));
    }
    if (st->call == GET_PARAMS)  /* mirrored: the host's copy is behind */
        cr_assert_eq(am_fit(st->m, st->train, NULL, 1), CASTOR_OK, "%s: fit: %s",
                     alloc_where(), castor_model_errmsg(st->m));
    if (st->call == SET_PARAMS)
        for (size_t i = 0; i < castor_model_num_params(st->m); i++)
            st->buf[i] = st->start[i] * 0.5f + 0.01f;
    st->steps0 = castor_model_step(st->m);
    st->epochs0 = castor_model_epoch(st->m);
}

static int call(void *arg)
{
    state *st = arg;
    size_t np = castor_model_num_params(st->m);
    switch (st->call) {
    case FIT:
        return am_fit(st->m, st->train, st->val, 0);
    case EVALUATE:
        return castor_model_evaluate(st->m, st->val, AM_VAL_SAMPLES, &st->met);
    case PREDICT:
        return castor_model_predict(st->m, castor_dataset_x(st->val), AM_VAL_SAMPLES,
                                    AM_VAL_SAMPLES, st->buf);
    case GET_PARAMS:
        return castor_model_get_params(st->m, st->buf, np);
    default:
        return castor_model_set_params(st->m, st->buf, np);
    }
}

static const char *errmsg(void *arg)
{
    return castor_model_errmsg(((state *)arg)->m);
}

/* A model refusing work after a failed mirrored update or upload says so,
 * and set_params brings it back. */
static void recover(state *st, const float *values)
{
    castor_metrics met;
    cr_assert_eq(castor_model_evaluate(st->m, st->val, AM_BATCH, &met), CASTOR_DEVICE,
                 "%s: a model left inconsistent evaluates", alloc_where());
    cr_assert_eq(castor_model_set_params(st->m, values, castor_model_num_params(st->m)),
                 CASTOR_OK, "%s: set_params: %s", alloc_where(), castor_model_errmsg(st->m));
}

/* The rest of the fit a failure cut short, then the variables. */
static void check_fit(state *st, int rc)
{
    if (rc && am_inconsistent(st->m)) {
        recover(st, st->start);
        cr_assert_eq(am_fit(st->m, st->train, st->val, 0), CASTOR_OK, "%s: fit: %s",
                     alloc_where(), castor_model_errmsg(st->m));
        return;  /* the optimizer state went back: no run to compare with */
    }
    int64_t done = castor_model_step(st->m) - st->steps0;
    cr_assert(done >= 0 && done <= AM_STEPS, "%s: %lld steps done", alloc_where(),
              (long long)done);
    if (rc && done < AM_STEPS)
        cr_assert_eq(am_fit(st->m, st->train, st->val, AM_STEPS - done), CASTOR_OK,
                     "%s: the rest of the fit: %s", alloc_where(), castor_model_errmsg(st->m));
    cr_assert_eq(castor_model_step(st->m), st->steps0 + AM_STEPS, "%s", alloc_where());
    cr_assert_eq(castor_model_epoch(st->m), st->epochs0 + AM_EPOCHS, "%s", alloc_where());
    am_same_as_first_round(st->m, &st->want, "after the fit");
}

static void check(void *arg, int rc)
{
    state *st = arg;
    am_assert_idle(st->s);
    if (st->call == FIT) {
        check_fit(st, rc);
        return;
    }
    if (rc && st->call == SET_PARAMS && am_inconsistent(st->m))
        recover(st, st->buf);
    else if (rc)
        cr_assert_eq(call(st), CASTOR_OK, "%s: %s again: %s", alloc_where(),
                     call_names[st->call], castor_model_errmsg(st->m));
    size_t n = st->call == PREDICT ? OUTPUTS : castor_model_num_params(st->m);
    if (st->call == SET_PARAMS) {
        am_assert_params(st->m, st->buf, "after set_params");
    } else if (alloc_first_round()) {
        st->want_met = st->met;
        st->want = malloc(n * sizeof *st->want);
        cr_assert(st->want);
        memcpy(st->want, st->buf, n * sizeof *st->want);
    } else if (st->call == EVALUATE) {
        cr_assert(memcmp(&st->met, &st->want_met, sizeof st->met) == 0,
                  "%s: evaluate gives loss %.9g accuracy %.9g, not %.9g %.9g", alloc_where(),
                  st->met.loss, st->met.accuracy, st->want_met.loss, st->want_met.accuracy);
    } else {
        cr_assert_eq(memcmp(st->buf, st->want, n * sizeof *st->want), 0,
                     "%s: %s gives other values", alloc_where(), call_names[st->call]);
    }
    /* And the model trains on. */
    cr_assert_eq(am_fit(st->m, st->train, NULL, 1), CASTOR_OK, "%s: fit: %s", alloc_where(),
                 castor_model_errmsg(st->m));
}

static void teardown(void *arg)
{
    state *st = arg;
    castor_model_free(st->m);
    castor_strategy_free(st->s);
    castor_dataset_free(st->train);
    castor_dataset_free(st->val);
    free(st->start);
    free(st->buf);
    st->m = NULL;
    st->s = NULL;
    st->train = st->val = NULL;
    st->start = st->buf = NULL;
}

static void sweep(int which, int variant)
{
    for (int p = 0; p < AM_PLACES; p++) {
        state st = {.call = which, .variant = variant, .place = &am_places[p]};
        char what[128];
        snprintf(what, sizeof what, "%s on %s%s", call_names[which], am_place_name(st.place),
                 variant_names[variant]);
        alloc_case c = {what, &st, setup, call, errmsg, check, teardown};
        alloc_sweep(&c);
        free(st.want);
    }
}

TestSuite(alloc_train, .timeout = 300);

Test(alloc_train, fit)
{
    sweep(FIT, PLAIN);
}

Test(alloc_train, fit_deep)
{
    sweep(FIT, DEEP);
}

Test(alloc_train, fit_grown)
{
    sweep(FIT, GROWN);
}

Test(alloc_train, evaluate)
{
    for (int v = 0; v < VARIANTS; v++)
        sweep(EVALUATE, v);
}

Test(alloc_train, predict)
{
    for (int v = 0; v < VARIANTS; v++)
        sweep(PREDICT, v);
}

Test(alloc_train, params)
{
    for (int v = 0; v < VARIANTS; v++) {
        sweep(GET_PARAMS, v);
        sweep(SET_PARAMS, v);
    }
}

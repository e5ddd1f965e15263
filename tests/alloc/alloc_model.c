/* The helpers of alloc_model.h. */
#include "alloc_model.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_sweep.h"
#include "device/cpu/cpu_streams.h"
#include "src/model.h"
#include "src/strategy.h"
#include "tests/support.h"

const am_place am_places[AM_PLACES] = {
    {CASTOR_STRATEGY_CENTRAL, "cpu"},  {CASTOR_STRATEGY_CENTRAL, "cpu:2"},
    {CASTOR_STRATEGY_CENTRAL, "cpu:1x2"}, {CASTOR_STRATEGY_MIRRORED, "cpu"},
    {CASTOR_STRATEGY_MIRRORED, "cpu:2"}, {CASTOR_STRATEGY_MIRRORED, "cpu:1x2"},
};

const char *am_place_name(const am_place *p)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "%s %s", castor_strategy_kind_name(p->kind), p->devices);
    return buf;
}

castor_strategy_options am_strategy_options(void)
{
    castor_strategy_options o = CASTOR_STRATEGY_OPTIONS_INIT;
    o.host_threads = 2;
    return o;
}

castor_strategy *am_strategy(const am_place *p)
{
    castor_strategy_options o = am_strategy_options();
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, p->kind, p->devices, &o), CASTOR_OK,
                 "%s: strategy_create: %s", alloc_where(), castor_strategy_errmsg(s));
    return s;
}

castor_model *am_layers_of(const char *spec)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, AM_FEATURES), CASTOR_OK, "%s: model_create",
                 alloc_where());
    cr_assert_eq(castor_model_add_layers(m, spec), CASTOR_OK, "%s: add_layers: %s",
                 alloc_where(), castor_model_errmsg(m));
    return m;
}

castor_model *am_layers(void)
{
    return am_layers_of(AM_LAYERS);
}

void am_compile(castor_model *m, castor_strategy *s)
{
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &adam, AM_SEED), CASTOR_OK,
                 "%s: compile: %s", alloc_where(), castor_model_errmsg(m));
}

castor_model *am_model_of(castor_strategy *s, const char *spec)
{
    castor_model *m = am_layers_of(spec);
    am_compile(m, s);
    return m;
}

castor_model *am_model(castor_strategy *s)
{
    return am_model_of(s, AM_LAYERS);
}

castor_dataset *am_train(void)
{
    return support_synthetic(11, AM_SAMPLES, AM_FEATURES, AM_CLASSES);
}

castor_dataset *am_validation(void)
{
    return support_synthetic(12, AM_VAL_SAMPLES, AM_FEATURES, AM_CLASSES);
}

int am_fit_in(castor_model *m, const castor_dataset *train, const castor_dataset *val,
              int batch, int epochs, int64_t max_steps)
{
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = epochs;
    fo.batch_size = batch;
    fo.validation = val;
    fo.max_steps = max_steps;
    return castor_model_fit(m, train, &fo, NULL);
}

int am_fit(castor_model *m, const castor_dataset *train, const castor_dataset *val,
           int64_t max_steps)
{
    return am_fit_in(m, train, val, AM_BATCH, AM_EPOCHS, max_steps);
}

am_snap am_take(castor_model *m)
{
    am_snap s = {0};
    s.n = castor_model_num_params(m);
    s.params = malloc(s.n * sizeof(float));
    cr_assert(s.params);
    /* get_params brings the optimizer state to the host too (mirrored). */
    cr_assert_eq(castor_model_get_params(m, s.params, s.n), CASTOR_OK, "%s: get_params: %s",
                 alloc_where(), castor_model_errmsg(m));
    s.ns = (size_t)m->opt_slots * s.n;
    s.state = malloc((s.ns ? s.ns : 1) * sizeof(float));
    cr_assert(s.state);
    if (s.ns)
        memcpy(s.state, m->opt_state.ptr, s.ns * sizeof(float));
    s.step = castor_model_step(m);
    s.epoch = castor_model_epoch(m);
    s.step_in_epoch = castor_model_step_in_epoch(m);
    s.seed = m->seed;
    return s;
}

void am_assert_same(const am_snap *got, const am_snap *want, const char *what)
{
    cr_assert(got->n == want->n && got->ns == want->ns, "%s: %s: sizes differ", alloc_where(),
              what);
    cr_assert_eq(memcmp(got->params, want->params, got->n * sizeof(float)), 0,
                 "%s: %s: the variables differ", alloc_where(), what);
    cr_assert_eq(memcmp(got->state, want->state, got->ns * sizeof(float)), 0,
                 "%s: %s: the optimizer state differs", alloc_where(), what);
    cr_assert(got->step == want->step && got->epoch == want->epoch &&
                  got->step_in_epoch == want->step_in_epoch,
              "%s: %s: at step %lld (epoch %lld + %lld), not %lld (%lld + %lld)", alloc_where(),
              what, (long long)got->step, (long long)got->epoch, (long long)got->step_in_epoch,
              (long long)want->step, (long long)want->epoch, (long long)want->step_in_epoch);
    cr_assert_eq(got->seed, want->seed, "%s: %s: the seed differs", alloc_where(), what);
}

void am_snap_free(am_snap *s)
{
    free(s->params);
    free(s->state);
    s->params = s->state = NULL;
}

float *am_params(castor_model *m)
{
    size_t n = castor_model_num_params(m);
    float *p = malloc(n * sizeof *p);
    cr_assert(p);
    cr_assert_eq(castor_model_get_params(m, p, n), CASTOR_OK, "%s: get_params: %s",
                 alloc_where(), castor_model_errmsg(m));
    return p;
}

void am_assert_params(castor_model *m, const float *want, const char *what)
{
    float *got = am_params(m);
    int same = memcmp(got, want, castor_model_num_params(m) * sizeof *got) == 0;
    free(got);
    cr_assert(same, "%s: %s: the variables differ from a run where nothing failed",
              alloc_where(), what);
}

void am_same_as_first_round(castor_model *m, float **want, const char *what)
{
    if (alloc_first_round())
        *want = am_params(m);
    else
        am_assert_params(m, *want, what);
}

void am_run_one_step(am_run *run, const char *what)
{
    cr_assert_eq(am_fit(run->m, run->train, NULL, 1), CASTOR_OK, "%s: fit: %s", alloc_where(),
                 castor_model_errmsg(run->m));
    am_same_as_first_round(run->m, &run->want, what);
}

void am_run_teardown(void *arg)
{
    am_run *run = arg;
    castor_model_free(run->m);
    castor_strategy_free(run->s);
    castor_dataset_free(run->train);
    run->m = NULL;
    run->s = NULL;
    run->train = NULL;
}

void am_assert_idle(const castor_strategy *s)
{
    for (int i = 0; i < s->n_replicas; i++) {
        size_t pending = castor__cpu_streams_pending(s->devs[i]->ctx);
        cr_assert_eq(pending, 0, "%s: replica %d (%s) has %zu operation(s) still queued",
                     alloc_where(), i, s->devs[i]->name, pending);
    }
}

void am_assert_unbound(const castor_strategy *s)
{
    cr_assert_null(s->bound, "%s: the strategy still holds a model", alloc_where());
    for (int i = 0; i < s->n_replicas; i++)
        cr_assert_eq(s->devs[i]->used, 0, "%s: %s still holds %zu bytes of device memory",
                     alloc_where(), s->devs[i]->name, s->devs[i]->used);
    am_assert_idle(s);
}

int am_inconsistent(const castor_model *m)
{
    return m->inconsistent;
}

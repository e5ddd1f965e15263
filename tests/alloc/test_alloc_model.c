/*
 * Building a model with each allocation failing in turn: model_create,
 * add_layers (all of a spec's layers or none: a failed one adds none), and
 * compile, which on failure leaves the model uncompiled and the strategy
 * holding nothing, free to compile the same model again: that model then
 * trains as one whose compile never failed.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_model.h"
#include "alloc_sweep.h"

/* ---- model_create and add_layers ---- */

typedef struct build_state {
    const char *before;  /* layers added before the call ("" for none) */
    castor_model *m;
} build_state;

#define MORE_LAYERS "4,4,4,4,3"  /* past the room for 4 and for 8 layers */

static void build_setup(void *arg)
{
    build_state *st = arg;
    if (!st->before)
        return;
    cr_assert_eq(castor_model_create(&st->m, AM_FEATURES), CASTOR_OK);
    if (*st->before)
        cr_assert_eq(castor_model_add_layers(st->m, st->before), CASTOR_OK);
}

static int create_call(void *arg)
{
    return castor_model_create(&((build_state *)arg)->m, AM_FEATURES);
}

static int add_call(void *arg)
{
    return castor_model_add_layers(((build_state *)arg)->m, MORE_LAYERS);
}

static const char *build_errmsg(void *arg)
{
    return castor_model_errmsg(((build_state *)arg)->m);
}

static void create_check(void *arg, int rc)
{
    build_state *st = arg;
    if (rc) {
        castor_model_free(st->m);
        st->m = NULL;
        cr_assert_eq(create_call(st), CASTOR_OK, "%s: create again", alloc_where());
    }
    cr_assert_eq(castor_model_input_features(st->m), AM_FEATURES, "%s", alloc_where());
    cr_assert_eq(castor_model_add_layers(st->m, AM_LAYERS), CASTOR_OK, "%s: add_layers: %s",
                 alloc_where(), castor_model_errmsg(st->m));
}

/* The layers and parameter count of a model given these specs (b may be
 * NULL), nothing failing. */
static size_t spec_of(const char *a, const char *b, char *buf, size_t len)
{
    castor_model *ref = NULL;
    cr_assert_eq(castor_model_create(&ref, AM_FEATURES), CASTOR_OK);
    if (*a)
        cr_assert_eq(castor_model_add_layers(ref, a), CASTOR_OK);
    if (b)
        cr_assert_eq(castor_model_add_layers(ref, b), CASTOR_OK);
    cr_assert_eq(castor_model_layers_spec(ref, buf, len), CASTOR_OK);
    size_t n = castor_model_num_params(ref);
    castor_model_free(ref);
    return n;
}

static void assert_layers(castor_model *m, const char *a, const char *b, const char *what)
{
    char want[256], got[256];
    size_t n = spec_of(a, b, want, sizeof want);
    cr_assert_eq(castor_model_layers_spec(m, got, sizeof got), CASTOR_OK);
    cr_assert_str_eq(got, want, "%s: %s: the layers are '%s', not '%s'", alloc_where(), what, got,
                     want);
    cr_assert_eq(castor_model_num_params(m), n, "%s: %s: the parameter count", alloc_where(),
                 what);
}

static void add_check(void *arg, int rc)
{
    build_state *st = arg;
    if (rc) {
        assert_layers(st->m, st->before, NULL, "after a failed add_layers");
        cr_assert_eq(add_call(st), CASTOR_OK, "%s: add_layers again: %s", alloc_where(),
                     castor_model_errmsg(st->m));
    }
    assert_layers(st->m, st->before, MORE_LAYERS, "after add_layers");
}

static void build_teardown(void *arg)
{
    build_state *st = arg;
    castor_model_free(st->m);
    st->m = NULL;
}

Test(alloc, model_create, .timeout = 60)
{
    build_state st = {NULL, NULL};
    alloc_case c = {"model_create", &st, build_setup, create_call, build_errmsg, create_check,
                    build_teardown};
    alloc_sweep(&c);
}

Test(alloc, add_layers, .timeout = 60)
{
    static const char *const before[] = {"", "5:tanh,4:relu,4"};
    for (int i = 0; i < 2; i++) {
        build_state st = {before[i], NULL};
        char what[128];
        snprintf(what, sizeof what, "add_layers after '%s'", before[i]);
        alloc_case c = {what, &st, build_setup, add_call, build_errmsg, add_check,
                        build_teardown};
        alloc_sweep(&c);
    }
}

/* ---- compile ---- */

static void compile_setup(void *arg)
{
    am_run *st = arg;
    st->s = am_strategy(st->place);
    st->m = am_layers();
    st->train = am_train();
}

static int compile_call(void *arg)
{
    am_run *st = arg;
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    return castor_model_compile(st->m, st->s, CASTOR_LOSS_SOFTMAX_XENT, &adam, AM_SEED);
}

static const char *compile_errmsg(void *arg)
{
    return castor_model_errmsg(((am_run *)arg)->m);
}

static void compile_check(void *arg, int rc)
{
    am_run *st = arg;
    if (rc) {
        am_assert_unbound(st->s);
        castor_metrics met;
        cr_assert_eq(castor_model_evaluate(st->m, st->train, AM_BATCH, &met), CASTOR_MISUSE,
                     "%s: a model whose compile failed evaluates", alloc_where());
        cr_assert_eq(compile_call(st), CASTOR_OK, "%s: compile again: %s", alloc_where(),
                     castor_model_errmsg(st->m));
    }
    am_run_one_step(st, "one step after the compile");
}

Test(alloc, compile, .timeout = 300)
{
    for (int p = 0; p < AM_PLACES; p++) {
        am_run st = {.place = &am_places[p]};
        char what[128];
        snprintf(what, sizeof what, "compile on %s", am_place_name(st.place));
        alloc_case c = {what, &st, compile_setup, compile_call, compile_errmsg, compile_check,
                        am_run_teardown};
        alloc_sweep(&c);
        free(st.want);
    }
}

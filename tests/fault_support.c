/* The fault tests' scenarios: see fault_support.h. */
#include "fault_support.h"

#include <criterion/criterion.h>
#include <stdlib.h>

#include "src/strategy.h"

void fault_assert_nothing_queued(const castor_strategy *s, const char *what)
{
    for (int i = 0; i < s->n_replicas; i++)
        cr_assert_eq(fault_queued(s, i), 0, "%s: work left queued on replica %d", what, i);
}

castor_model *fault_make(const fault_scenario *sc, castor_strategy **s)
{
    cr_assert_eq(castor_strategy_create(s, sc->kind, sc->devices, NULL), CASTOR_OK, "%s",
                 castor_strategy_errmsg(*s));
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "5:tanh,3"), CASTOR_OK);
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    cr_assert_eq(castor_model_compile(m, *s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 7), CASTOR_OK,
                 "%s", castor_model_errmsg(m));
    return m;
}

int fault_fit_steps(castor_model *m, castor_dataset *ds, const fault_scenario *sc, int steps)
{
    if (steps == 0)  /* max_steps 0 would be no limit */
        return CASTOR_OK;
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 1000;
    fo.batch_size = sc->batch;
    fo.max_steps = steps;
    return castor_model_fit(m, ds, &fo, NULL);
}

float *fault_params_of(castor_model *m)
{
    size_t n = castor_model_num_params(m);
    float *p = malloc(n * sizeof *p);
    cr_assert_eq(castor_model_get_params(m, p, n), CASTOR_OK, "%s", castor_model_errmsg(m));
    return p;
}

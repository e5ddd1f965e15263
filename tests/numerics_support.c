/* The helpers declared in numerics_support.h. */
#include "numerics_support.h"

#include <criterion/criterion.h>

#include "src/rng.h"

void numerics_make_data(data *d, uint64_t seed)
{
    castor__rng rng;
    castor__rng_seed(&rng, seed, 77, 0);
    for (int i = 0; i < NS * NF; i++)
        d->x[i] = 2.0f * castor__rng_uniform(&rng) - 1.0f;
    for (int i = 0; i < NS; i++)
        d->labels[i] = (int32_t)castor__rng_below(&rng, NC);
    for (int i = 0; i < NS * NC; i++)
        d->targets[i] = castor__rng_uniform(&rng);
}

castor_model *numerics_make_model_lr(const char *devices, castor_strategy_kind kind,
                                     const char *layers, castor_loss loss, float lr,
                                     castor_strategy **s)
{
    cr_assert_eq(castor_strategy_create(s, kind, devices, NULL), CASTOR_OK, "%s",
                 castor_strategy_errmsg(*s));
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, NF), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, layers), CASTOR_OK);
    castor_optimizer sgd = castor_optimizer_defaults(CASTOR_OPT_SGD);
    sgd.learning_rate = lr;
    cr_assert_eq(castor_model_compile(m, *s, loss, &sgd, 5), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    return m;
}

castor_model *numerics_make_model(const char *devices, castor_strategy_kind kind,
                                  const char *layers, castor_loss loss, castor_strategy **s)
{
    return numerics_make_model_lr(devices, kind, layers, loss, 0.5f, s);
}

castor_dataset *numerics_make_dataset(const data *d, castor_loss loss)
{
    castor_dataset *ds = NULL;
    int mse = loss == CASTOR_LOSS_MSE;
    cr_assert_eq(castor_dataset_from_memory(&ds, d->x, NS, NF, mse ? NULL : d->labels,
                                            mse ? d->targets : NULL, mse ? NC : 0),
                 CASTOR_OK);
    return ds;
}

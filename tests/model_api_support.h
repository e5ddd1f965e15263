/*
 * The small data set and model that the model-API suites share
 * (tests/test_model_api.c, tests/test_fit_callback.c).
 */
#ifndef CASTOR_TESTS_MODEL_API_SUPPORT_H
#define CASTOR_TESTS_MODEL_API_SUPPORT_H

#include <criterion/criterion.h>
#include <stdlib.h>

#include "castor.h"

#define N 48
#define F 6

static inline castor_dataset *small_dataset(void)
{
    float x[N * F];
    int32_t y[N];
    for (int i = 0; i < N; i++) {
        y[i] = i % 3;
        for (int j = 0; j < F; j++)
            x[i * F + j] = (float)((i * 7 + j * 3) % 11) / 11.0f + (j == y[i] ? 1.0f : 0.0f);
    }
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_from_memory(&ds, x, N, F, y, NULL, 0), CASTOR_OK);
    return ds;
}

static inline castor_model *compiled(castor_strategy *s, const char *layers)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, layers), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 3), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    return m;
}

/* The model's variables, copied into floats the caller frees. */
static inline float *model_params(castor_model *m)
{
    size_t n = castor_model_num_params(m);
    float *p = malloc(n * sizeof *p);
    cr_assert(p);
    cr_assert_eq(castor_model_get_params(m, p, n), CASTOR_OK, "%s", castor_model_errmsg(m));
    return p;
}

#endif

/*
 * What the numerics suites (tests/test_numerics.c, tests/test_divergence.c)
 * share: a small seeded data set of NS samples, and models compiled with
 * plain SGD on it.
 */
#ifndef CASTOR_TESTS_NUMERICS_SUPPORT_H
#define CASTOR_TESTS_NUMERICS_SUPPORT_H

#include <stdint.h>

#include "castor.h"

#define NS 11   /* samples: batches of 4 leave a short last batch of 3 */
#define NF 5
#define NC 3

typedef struct data {
    float x[NS * NF];
    int32_t labels[NS];
    float targets[NS * NC];
} data;

/* Inputs uniform in [-1, 1), labels and targets; the same for the same seed. */
void numerics_make_data(data *d, uint64_t seed);
/* A model of NF inputs and `layers`, compiled with plain SGD at learning
 * rate lr, seed 5, on a new strategy of `kind` over `devices` (*s). */
castor_model *numerics_make_model_lr(const char *devices, castor_strategy_kind kind,
                                     const char *layers, castor_loss loss, float lr,
                                     castor_strategy **s);
/* numerics_make_model_lr at a learning rate of 0.5. */
castor_model *numerics_make_model(const char *devices, castor_strategy_kind kind,
                                  const char *layers, castor_loss loss, castor_strategy **s);
/* d as a dataset: its labels for softmax cross-entropy, its targets for MSE. */
castor_dataset *numerics_make_dataset(const data *d, castor_loss loss);

#endif

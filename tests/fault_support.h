/*
 * The fault tests' scenarios (tests/test_faults*.c), over the injection of
 * tests/fault_inject.h: a small model, steps of fit, its variables, and
 * Criterion's assertion that a failed call left nothing queued.
 */
#ifndef CASTOR_TESTS_FAULT_SUPPORT_H
#define CASTOR_TESTS_FAULT_SUPPORT_H

#include "castor.h"
#include "fault_inject.h"

#define F 6
#define C 3

/* A call that failed has waited for what it queued: nothing of it may run
 * later, over the buffers the next call uses. */
void fault_assert_nothing_queued(const castor_strategy *s, const char *what);

typedef struct fault_scenario {
    castor_strategy_kind kind;
    const char *devices;
    int n;          /* samples */
    int batch;
    int warm_steps; /* before the faulty one (0: the faulty one is the model's first) */
    int async;
} fault_scenario;

/* F -> 5:tanh -> 3 (softmax cross-entropy, Adam, seed 7) on sc's strategy. */
castor_model *fault_make(const fault_scenario *sc, castor_strategy **s);
/* Up to steps steps of fit in sc's batches (none, and no fit, for 0). */
int fault_fit_steps(castor_model *m, castor_dataset *ds, const fault_scenario *sc, int steps);
/* The model's variables (malloc'd). */
float *fault_params_of(castor_model *m);

#endif

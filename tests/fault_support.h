/*
 * Device faults injected into a strategy's emulated devices, for
 * tests/test_faults*.c: every device operation of every replica is wrapped,
 * its calls counted, and one chosen call made to fail, at once or as queued
 * work that the device's next synchronize reports.
 */
#ifndef CASTOR_TESTS_FAULT_SUPPORT_H
#define CASTOR_TESTS_FAULT_SUPPORT_H

#include "castor.h"
#include "device/device.h"

#define F 6
#define C 3

enum { OP_H2D, OP_D2H, OP_D2D, OP_MEMSET, OP_GEMM, OP_BIAS_ADD, OP_BIAS_GRAD, OP_ACT_F,
       OP_ACT_B, OP_XENT, OP_MSE, OP_ADD, OP_OPTIM, OP_SYNC, OP_RECORD, OP_WAIT, OP_ALLOC,
       OP_EVENT, OP_N };
extern const char *const fault_op_names[OP_N];

#define MAXDEV 8

/* Set when the armed fault has fired. */
extern int fault_failed;

/* Wrap every replica's device operations, counting their calls. */
void fault_inject(castor_strategy *s);
/* Put the real operations back. */
void fault_uninject(void);
/* The calls each replica made since fault_inject(), into counts, then
 * fault_uninject(); returns the number of replicas. */
int fault_take_counts(long counts[MAXDEV][OP_N]);
/* Inject, failing the at-th call of op on dev (queued with async). */
void fault_arm(castor_strategy *s, cdev *dev, int op, long at, int async);
/* A call that failed has waited for what it queued: nothing of it may run
 * later, over the buffers the next call uses. */
void fault_assert_nothing_queued(const castor_strategy *s, const char *what);

typedef struct fault_scenario {
    castor_strategy_kind kind;
    const char *devices;
    int n;          /* samples */
    int batch;
    int warm_steps; /* before the faulty one */
    int async;
} fault_scenario;

/* F -> 5:tanh -> 3 (softmax cross-entropy, Adam, seed 7) on sc's strategy. */
castor_model *fault_make(const fault_scenario *sc, castor_strategy **s);
/* Up to steps steps of fit in sc's batches. */
int fault_fit_steps(castor_model *m, castor_dataset *ds, const fault_scenario *sc, int steps);
/* The model's variables (malloc'd). */
float *fault_params_of(castor_model *m);

#endif

/*
 * Device faults injected into a strategy's emulated devices: every device
 * operation of every replica is wrapped, its calls counted, and one chosen
 * call made to fail, at once or as queued work that the device's next
 * synchronize reports. Plain C without Criterion, so that the TSan program
 * (tests/tsan/, where Criterion cannot start) injects faults with the very
 * code the Criterion suites use (tests/fault_support.h adds their helpers).
 *
 * One strategy at a time is wrapped. Its replica threads run the wrappers
 * at once, each on its own device; what they share is atomic.
 */
#ifndef CASTOR_TESTS_FAULT_INJECT_H
#define CASTOR_TESTS_FAULT_INJECT_H

#include <stddef.h>

#include "castor.h"
#include "device/device.h"

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
/* Entries still queued on replica i's emulated device. */
size_t fault_queued(const castor_strategy *s, int i);

#endif

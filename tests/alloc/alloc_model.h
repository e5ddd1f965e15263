/*
 * The tiny problem the allocation sweeps train (tests/alloc/test_alloc_*.c),
 * the places they run it (central and mirrored on cpu, cpu:2 and cpu:1x2),
 * and checks on handles after a failed call. Every helper asserts success
 * and names the sweep's round (alloc_where) when it fails.
 */
#ifndef CASTOR_TESTS_ALLOC_MODEL_H
#define CASTOR_TESTS_ALLOC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"

#define AM_FEATURES 6
#define AM_CLASSES 3
#define AM_SAMPLES 40  /* 5 batches of 8 */
#define AM_VAL_SAMPLES 12
#define AM_BATCH 8
#define AM_EPOCHS 2
#define AM_LAYERS "5:tanh,3"
/* Deep enough that a step queues more work on a device than its first
 * queues hold: they grow in the middle of a step. */
#define AM_DEEP_LAYERS "4:relu,4:tanh,4:relu,4:tanh,4:relu,4:tanh,4:relu,4:tanh,4:relu,4:tanh,3"
#define AM_SEED 7

typedef struct am_place {
    castor_strategy_kind kind;
    const char *devices;
} am_place;

#define AM_PLACES 6
extern const am_place am_places[AM_PLACES];

/* "central cpu:2" */
const char *am_place_name(const am_place *p);

/* Two host threads, whatever the machine, so that every run allocates alike. */
castor_strategy_options am_strategy_options(void);
castor_strategy *am_strategy(const am_place *p);
/* The model, uncompiled (layers added) or compiled on s with Adam and
 * AM_SEED; of AM_LAYERS, or of the layers given. */
castor_model *am_layers(void);
castor_model *am_layers_of(const char *spec);
void am_compile(castor_model *m, castor_strategy *s);
castor_model *am_model(castor_strategy *s);
castor_model *am_model_of(castor_strategy *s, const char *spec);
castor_dataset *am_train(void);
castor_dataset *am_validation(void);

/* fit in AM_BATCH batches, AM_EPOCHS epochs (stopping after max_steps if not
 * 0), with validation data if val is not NULL; returns fit's status. */
int am_fit(castor_model *m, const castor_dataset *train, const castor_dataset *val,
           int64_t max_steps);
/* The same in batches of batch, for epochs. */
int am_fit_in(castor_model *m, const castor_dataset *train, const castor_dataset *val,
              int batch, int epochs, int64_t max_steps);
/* Steps of a whole am_fit. */
#define AM_STEPS ((int64_t)AM_EPOCHS * (AM_SAMPLES / AM_BATCH))

/* Everything a checkpoint holds, read out of a model (malloc'd arrays). */
typedef struct am_snap {
    float *params, *state;
    size_t n, ns;
    int64_t step, epoch, step_in_epoch;
    uint64_t seed;
} am_snap;
am_snap am_take(castor_model *m);
void am_assert_same(const am_snap *got, const am_snap *want, const char *what);
void am_snap_free(am_snap *s);
/* The variables (malloc'd), and the check that a model holds want's. */
float *am_params(castor_model *m);
void am_assert_params(castor_model *m, const float *want, const char *what);
/* The sweep's first round (nothing failed) records m's variables in *want;
 * every later round must end with the same ones (what: after what). */
void am_same_as_first_round(castor_model *m, float **want, const char *what);

/* The handles of a sweep whose call makes the strategy or the model: each
 * round must end training one step as the first round did. */
typedef struct am_run {
    const am_place *place;
    castor_strategy *s;
    castor_model *m;
    castor_dataset *train;
    float *want;  /* the variables after one step, from the first round */
} am_run;
/* One step of am_fit on run->m, checked against the first round's. */
void am_run_one_step(am_run *run, const char *what);
/* The sweep's teardown: frees the handles (want stays, for the next round). */
void am_run_teardown(void *run);

/* After a failed call: no replica has work left queued (it would run later
 * over buffers the next call uses). */
void am_assert_idle(const castor_strategy *s);
/* No model holds the strategy or any of its device memory (after a failed
 * compile or open). */
void am_assert_unbound(const castor_strategy *s);
/* Whether a failed call left the model refusing work until set_params (a
 * mirrored update or upload failed part-way, as castor.h allows). */
int am_inconsistent(const castor_model *m);

#endif

/*
 * The model behind castor_model: layer shapes, the flat parameter layout,
 * the master variables and optimizer state on the host, and where training
 * stands (steps, epochs) so that it can be saved and resumed exactly.
 */
#ifndef CASTOR_MODEL_H
#define CASTOR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"
#include "host/pinned.h"
#include "src/util.h"

/* One dense layer: y = act(x W + b). Its kernel W (in x out, row-major) and
 * bias b (out) sit next to each other in the flat buffer, so a layer's
 * upload or gradient download is one copy. */
typedef struct castor__layer {
    int in, out;
    castor_activation act;
    size_t w_off;  /* floats from the start of the flat buffer */
    size_t b_off;  /* = w_off + in * out */
} castor__layer;

struct castor_model {
    int input_features;
    int n_layers, cap_layers;
    castor__layer *layers;
    size_t n_params;

    /* Set by compile. */
    int compiled;
    castor_loss loss;
    castor_optimizer opt;
    int opt_slots;           /* optimizer state floats per variable */
    uint64_t seed;
    castor_strategy *strategy;

    /* Master copies on the host (pinned). For the central strategy these
     * are the variables; for the mirrored one, host mirrors of replica 0's
     * copy, brought up to date on demand (host_params_current); its
     * optimizer state stays the host's alone until the first fit places
     * it on the replicas. */
    castor__host_buf params;     /* n_params floats */
    castor__host_buf opt_state;  /* opt_slots * n_params floats */
    castor__host_buf grads;      /* n_params floats: the reduced gradient (mirrored,
                                    from the first fit on) */
    int host_params_current;

    /* Where training stands. */
    int64_t step;            /* optimizer steps taken */
    /* Steps the optimizer state has taken, which Adam's bias correction
     * counts (Keras's optimizer.iterations): step, except after a mirrored
     * recovery took the state back to an older host copy (set_params). */
    int64_t opt_step;
    int64_t host_opt_step;   /* opt_step of the host's copy of the state */
    /* The host's copy of the state may be part one step's, part another's:
     * a read-back from replica 0 into it failed (mirrored get_params or
     * save), and a failed copy may have landed in full, in part or not at
     * all. Recovery by set_params refuses it; a read-back or load that
     * succeeds makes the copy whole again. */
    int host_state_torn;
    int64_t epoch;           /* epochs completed */
    int64_t step_in_epoch;   /* steps done in the epoch in progress */
    int epoch_batch;         /* batch size of the epoch in progress */
    /* The rest of what fixes its order of samples: the training samples it
     * is over (0: unknown, from an older checkpoint) and whether they are
     * shuffled (-1: unknown). */
    uint64_t epoch_samples;
    int epoch_shuffle;
    /* The epoch count the last fit that trained a step was to end at (its
     * start epoch plus its epochs; 0: unknown): kept in checkpoints, so
     * that a run resumed from one can go on to the end it was given. */
    int64_t target_epochs;
    /* The IDX element type and sample shape of the data it was last fitted
     * on, where that data came from IDX files (in_rank 0: unknown): kept
     * in checkpoints so that another kind of data can be told apart. */
    int in_type;
    int in_rank;
    uint32_t in_dims[3];
    uint64_t params_version; /* bumped whenever the variables change */

    /* What a load placed that is not finite (NaN or inf), which fit
     * refuses to train from: NONFINITE_PARAMS, NONFINITE_STATE. Cleared by
     * compile and by a load of finite values; set_params clears the first
     * (its values are finite) and keeps the second. Training that diverges
     * sets neither: such a model trains on (castor.h). */
    int nonfinite;

    /* Set when a device failed half-way through an update that the strategy
     * cannot roll back (mirrored): the replicas may disagree. */
    int inconsistent;

    /* "fit", "evaluate" or "predict" while one runs, else NULL: its
     * progress callback and stop check may read and save the model, not
     * run, change or reload it under the running loop. */
    const char *running;
    /* castor_model_free was called from the running call's callback or
     * stop check: the call stops, and frees the model as it returns. */
    int free_asked;

    /* castor_model_set_stop_check's: polled between batches and steps. */
    castor_stop_fn stop_check;
    void *stop_user;

    struct castor__runtime *rt;  /* the strategy's per-model state */
    char errmsg[CASTOR__MSG_MAX];
};

enum { CASTOR__NONFINITE_PARAMS = 1, CASTOR__NONFINITE_STATE = 2 };

int castor__model_fail(castor_model *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Which of the host's copies (variables, optimizer state) hold a value that
 * is not finite: CASTOR__NONFINITE_* flags. */
int castor__model_host_nonfinite(const castor_model *m);
/* CASTOR_MISUSE, said on m, unless it is compiled on a live strategy. */
int castor__model_compiled(castor_model *m, const char *what);
/* Checks shared by fit/evaluate/predict: compiled, consistent. */
int castor__model_ready(castor_model *m, const char *what);
/* CASTOR_MISUSE, said on m, when called from inside fit, evaluate or
 * predict (their progress callback or stop check). */
int castor__model_not_fitting(castor_model *m, const char *what);
/* Why s cannot take a model now, as "WHAT: why" in err (CASTOR_MISUSE): it
 * was not created, or it has a model; else CASTOR_OK. */
int castor__strategy_refuses_model(const castor_strategy *s, const char *what, char *err,
                                   size_t errlen);
/* Undo compile: the replicas and host buffers freed, the strategy free for
 * another model; the layers and the message stay. */
void castor__model_detach(castor_model *m);
/* Glorot-uniform kernels and zero biases from the seed (src/rng.h). */
void castor__model_init_params(const castor_model *m, float *params);

#endif

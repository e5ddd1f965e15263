/*
 * Strategies: where the variables live and how gradients are reduced and
 * applied. Both run the same replica loop (replica.h); they differ only in
 * the functions below.
 */
#ifndef CASTOR_STRATEGY_H
#define CASTOR_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"
#include "device/device.h"
#include "device_list.h"
#include "host/pool.h"
#include "model.h"
#include "replica.h"
#include "src/util.h"

/* A batch as the trainer hands it over: rows contiguous on the host (pinned). */
typedef struct castor__batch {
    const float *x;           /* rows x features */
    const int32_t *labels;    /* rows, or NULL */
    const float *targets;     /* rows x output units, or NULL */
    int rows;
} castor__batch;

/* What one step or forward pass measured, summed in replica order. */
typedef struct castor__batch_stats {
    double loss_sum;
    double correct;
    int rows;
} castor__batch_stats;

typedef struct castor__strategy_ops {
    const char *name;
    /* Whether each replica keeps the variables' optimizer state (mirrored)
     * or only what a step needs (central): what a device must hold to
     * train. */
    int device_state;
    /* After compile: allocate replica state, place the initial variables. */
    int (*prepare)(castor_model *m);
    /* One optimizer step on a global batch. Either the whole update happens
     * or (central) none of it does. */
    int (*train_step)(castor_model *m, const castor__batch *b, castor__batch_stats *stats);
    /* Make m->params and m->opt_state hold the current values. */
    int (*pull)(castor_model *m);
    /* Place m->params and m->opt_state (changed on the host) on the replicas. */
    int (*push)(castor_model *m);
} castor__strategy_ops;

extern const castor__strategy_ops castor__central_ops;
extern const castor__strategy_ops castor__mirrored_ops;

struct castor_strategy {
    castor_strategy_kind kind;
    const castor__strategy_ops *ops;
    castor_strategy_options opts;
    char *devices_spec;        /* the device list as given (malloc'd, whole) */
    int n_replicas;
    cdev **devs;               /* one per replica */
    int use_cuda;              /* any replica on a GPU */
    castor__pool *replica_pool;   /* one thread per replica, thread i runs replica i */
    castor__pool *host_pool;      /* reduction and optimizer threads */
    castor_model *bound;       /* the model compiled on this strategy */
    /* Set only when castor_strategy_create succeeded: a failed create still
     * hands out the handle (for its message), and a model must not be
     * compiled on what it left half made. */
    int ready;
    char errmsg[CASTOR__MSG_MAX];
};

/* Per-model state of a strategy: the replicas. */
typedef struct castor__runtime {
    int n;
    castor__replica *reps;
    int rows_capacity;         /* rows each replica's buffers hold */
    /* Every replica holds the training buffers (the gradients, mirrored's
     * optimizer state, the backward pass's activations), and mirrored the
     * host's sum of the gradients: set by the first fit, kept until the
     * model is freed or compiled again. */
    int training;
    castor_run_stats stats;    /* steps, seconds, bytes of the training steps */
    int reduce;                /* mirrored: how gradients are all-reduced (mirrored.c) */
    /* The replicas' gradients are summed on the host (set by the strategy's
     * prepare: central, and mirrored all-reducing through the host): only
     * then do the replicas and, mirrored, the sum have host buffers. */
    int host_sums;
    void **nccl_comms;         /* mirrored on distinct GPUs: one NCCL rank per replica */
} castor__runtime;

/* How many of its replicas are emulated CPU devices (OpenBLAS's GEMMs). */
int castor__strategy_cpu_replicas(const castor_strategy *s);

/* Log through the strategy's callback if level is enabled. */
void castor__log(const castor_strategy *s, castor_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Allocate the runtime and the replicas' variables. */
int castor__runtime_create(castor_model *m);
/* Whether every device's budget holds the model's variables: asked before
 * any host memory is taken for them. */
int castor__runtime_check_room(castor_model *m);
void castor__runtime_free(castor_model *m);
/* Grow every replica's activation buffers to hold `rows` rows (a global
 * batch), for a forward pass. */
int castor__runtime_ensure_rows(castor_model *m, int rows);
/* The same for training: the first call also allocates the training
 * buffers, after checking every device's room for them and `rows` rows'
 * activations (CASTOR_DEVICE_MEMORY naming the gradients' bytes, nothing
 * allocated). */
int castor__runtime_ensure_training(castor_model *m, int rows);

/* Rows of a global batch given to replica r: an even split, the first
 * (rows % n) replicas taking one more. */
void castor__split_rows(int rows, int n, int r, int *offset, int *count);

/* Run fn on every replica thread; returns the first failure (by replica
 * order) with its message copied to the model. */
int castor__run_replicas(castor_model *m, castor__pool_fn fn, void *ctx);

/* The host gradients of the replicas that had rows, in replica order, into
 * srcs; how many. */
int castor__host_grads(const castor_model *m, const float *srcs[CASTOR__MAX_REPLICAS]);
/* Sum them into m->grads (mirrored through the host). Central sums the same
 * sources in the same order inside its update (host/update.h), so the two
 * strategies add alike. */
void castor__reduce_grads(castor_model *m);
/* Sum the replicas' row statistics of the last call, in replica order. */
void castor__sum_stats(castor_model *m, castor__batch_stats *stats);

/* A training step has been applied: count it and its phases (replicas from
 * t0 to t1, reduction to t2, update to t3). */
void castor__step_done(castor_model *m, double t0, double t1, double t2, double t3);
/* One training step through the strategy's train_step, its device traffic
 * added to the run statistics. */
int castor__train_step(castor_model *m, const castor__batch *b, castor__batch_stats *stats);

/* Forward pass over a global batch on all replicas; per-row outputs go to
 * out (rows x output units) when out is not NULL. */
int castor__forward_batch(castor_model *m, const castor__batch *b, float *out,
                          castor__batch_stats *stats);

#endif

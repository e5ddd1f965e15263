/*
 * The replica loop: what one replica does on its device for one batch
 * slice, the same for every strategy. Forward and backward run layer by
 * layer against the device interface; weights go up layer by layer on the
 * copy-in stream and gradients come back layer by layer on the copy-out
 * stream, ordered by events, so a device with real streams overlaps them
 * with compute.
 */
#ifndef CASTOR_REPLICA_H
#define CASTOR_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "device/device.h"
#include "host/pinned.h"
#include "model.h"

typedef struct castor__replica {
    int index;
    cdev *dev;
    int mirrored;           /* holds its own variables (and, training, optimizer state) */
    int use_cuda;           /* host buffers pinned through CUDA */

    /* Device memory. Shapes in rows of the replica's slice (cap = capacity). */
    float *d_params;        /* n_params: the variables this replica computes with */
    /* What only training uses, allocated by the first fit
     * (castor__replica_alloc_training) and NULL before it, so that a model
     * compiled or opened to evaluate and predict needs no device memory
     * for it: */
    float *d_grads;         /* n_params */
    float *d_state;         /* opt_slots * n_params (mirrored only) */
    float *d_x;             /* cap x input_features */
    float *d_acts;          /* sum over layers of cap x out: each layer's output */
    float *d_delta[2];      /* cap x widest layer output: backward ping-pong (NULL unless
                               act_backward) */
    int32_t *d_labels;      /* cap */
    float *d_targets;       /* cap x output units (MSE) */
    float *d_row_stats;     /* 2 x cap: loss and correct per row */
    /* The one allocation the per-row buffers above are carved from, kept on
     * its own: d_x is NULL where the model has no input features. */
    void *d_act_arena;
    int act_backward;       /* the arena holds d_delta */
    /* For castor__cdev_free: d_params', d_grads' (with d_state after it)
     * and the arena's allocations; state_bytes is d_state's part. */
    size_t param_bytes, train_bytes, state_bytes, act_bytes;
    int cap;

    cdev_event **layer_ready;  /* per layer: its weights are on the device */
    cdev_event **grad_ready;   /* per layer: its gradient is computed */
    cdev_event *input_ready;

    /* Host memory (pinned). */
    castor__host_buf h_grads;      /* n_params: this replica's gradient (with d_grads) */
    castor__host_buf h_row_stats;  /* 2 x cap */
    uint64_t params_version;       /* version of the variables in d_params */

    /* The slice of the current batch. */
    int offset, rows;
    int status;             /* result of this replica's part of the last call */
} castor__replica;

/* Allocate the variables' buffer (and the events). Fails with
 * CASTOR_DEVICE_MEMORY naming the bytes needed. */
int castor__replica_init(castor__replica *r, const castor_model *m, cdev *dev, int index,
                         int mirrored, int use_cuda);
/* CASTOR_DEVICE_MEMORY, said on dev, when its budget cannot hold the
 * model's variables whatever the batch (the message says what training
 * needs besides). */
int castor__replica_check_room(const castor_model *m, cdev *dev, int mirrored);
/* CASTOR_DEVICE_MEMORY, said on the replica's device, when its budget
 * cannot hold the variables, the training buffers and the activations of
 * `rows` rows with the backward pass's: the message names each. Allocates
 * nothing. */
int castor__replica_check_training_room(const castor__replica *r, const castor_model *m,
                                        int rows);
/* Allocate what training needs: the gradients on the device and, with
 * host_grads (the host sums them), on the host and, mirrored, the
 * optimizer state, which starts as a copy of h_state (the host's: no step
 * has changed it while the replica held none). All or nothing; nothing left
 * queued on a failure. */
int castor__replica_alloc_training(castor__replica *r, const castor_model *m,
                                   const float *h_state, int host_grads);
void castor__replica_free_training(castor__replica *r);
/* Give back the activation buffers (between calls: nothing is queued on
 * them); the next reserve allocates anew. */
void castor__replica_release_acts(castor__replica *r);
/* (Re)allocate activation buffers for `rows` rows, with the backward
 * pass's when `backward` (an arena without them is grown anew for it). */
int castor__replica_reserve(castor__replica *r, const castor_model *m, int rows, int backward);
void castor__replica_free(castor__replica *r, const castor_model *m);

/* Queue the upload of host variables, one copy per layer. */
int castor__replica_upload_params(castor__replica *r, const castor_model *m,
                                  const float *h_params);
/* Queue the upload of this replica's slice of the batch. */
int castor__replica_upload_batch(castor__replica *r, const castor_model *m, const float *h_x,
                                 const int32_t *h_labels, const float *h_targets);
/* Forward over the slice; with backward also the loss gradient and the
 * backward pass into d_grads (the training buffers allocated, the arena
 * reserved with the backward pass's). Row stats land in d_row_stats. */
int castor__replica_compute(castor__replica *r, const castor_model *m, int backward,
                            float grad_scale);
/* Queue the download of d_grads into h_grads layer by layer, each as soon
 * as its backward step is done. */
int castor__replica_download_grads(castor__replica *r, const castor_model *m);
/* Queue the download of row stats (and outputs when h_out is not NULL),
 * then wait for every stream. */
int castor__replica_finish(castor__replica *r, const castor_model *m, float *h_out);
/* Sum of the row stats, in row order. */
void castor__replica_stats(const castor__replica *r, double *loss_sum, double *correct);

#endif

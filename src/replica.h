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
    int mirrored;           /* holds its own variables and optimizer state */
    int use_cuda;           /* host buffers pinned through CUDA */

    /* Device memory. Shapes in rows of the replica's slice (cap = capacity). */
    float *d_params;        /* n_params: the variables this replica computes with */
    float *d_grads;         /* n_params */
    float *d_state;         /* opt_slots * n_params (mirrored only) */
    float *d_x;             /* cap x input_features */
    float *d_acts;          /* sum over layers of cap x out: each layer's output */
    float *d_delta[2];      /* cap x widest layer: backward ping-pong */
    int32_t *d_labels;      /* cap */
    float *d_targets;       /* cap x output units (MSE) */
    float *d_row_stats;     /* 2 x cap: loss and correct per row */
    /* The one allocation the per-row buffers above are carved from, kept on
     * its own: d_x is NULL where the model has no input features. */
    void *d_act_arena;
    size_t param_bytes, state_bytes, act_bytes; /* for castor__cdev_free */
    int cap;

    cdev_event **layer_ready;  /* per layer: its weights are on the device */
    cdev_event **grad_ready;   /* per layer: its gradient is computed */
    cdev_event *input_ready;

    /* Host memory (pinned). */
    castor__host_buf h_grads;      /* n_params: this replica's gradient */
    castor__host_buf h_row_stats;  /* 2 x cap */
    uint64_t params_version;       /* version of the variables in d_params */

    /* The slice of the current batch. */
    int offset, rows;
    int status;             /* result of this replica's part of the last call */
} castor__replica;

/* Allocate the parameter-sized buffers (and optimizer state when
 * mirrored). Fails with CASTOR_DEVICE_MEMORY naming the bytes needed. */
int castor__replica_init(castor__replica *r, const castor_model *m, cdev *dev, int index,
                         int mirrored, int use_cuda);
/* (Re)allocate activation buffers for `rows` rows. */
int castor__replica_reserve(castor__replica *r, const castor_model *m, int rows);
void castor__replica_free(castor__replica *r, const castor_model *m);
/* Bytes of device memory a replica needs for `rows` rows. */
size_t castor__replica_bytes(const castor_model *m, int rows, int mirrored);
/* CASTOR_DEVICE_MEMORY, said on dev, when its budget cannot hold the
 * model's variables (and optimizer state, mirrored) whatever the batch. */
int castor__replica_check_room(const castor_model *m, cdev *dev, int mirrored);

/* Queue the upload of host variables, one copy per layer. */
int castor__replica_upload_params(castor__replica *r, const castor_model *m,
                                  const float *h_params);
/* Queue the upload of this replica's slice of the batch. */
int castor__replica_upload_batch(castor__replica *r, const castor_model *m, const float *h_x,
                                 const int32_t *h_labels, const float *h_targets);
/* Forward over the slice; with grad_scale > 0 also the loss gradient and
 * the backward pass into d_grads. Row stats land in d_row_stats. */
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

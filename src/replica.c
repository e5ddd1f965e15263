#include "replica.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Sub-buffers of an arena start on 256-byte boundaries: what cudaMalloc
 * gives a whole allocation, so vector loads stay aligned. */
#define ARENA_ALIGN 256u

/* Sizes saturate at SIZE_MAX instead of wrapping: a batch and model too
 * large to address then fails the budget check, rather than passing it with
 * a small wrapped size and getting an arena too small for it. */
static size_t sat_mul(size_t a, size_t b)
{
    size_t r;
    return castor__mul_ok(a, b, &r) ? r : SIZE_MAX;
}

static size_t sat_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static size_t align_up(size_t bytes)
{
    if (bytes > SIZE_MAX - (ARENA_ALIGN - 1))
        return SIZE_MAX;
    return (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

/* The widest layer output: what a delta buffer holds. Not the input's
 * width: backward never computes the first layer's input gradient, and a
 * wide input (bag-of-words features into a small layer) counted here asked
 * for two more rows x input_features buffers that were never written. */
static size_t widest_layer(const castor_model *m)
{
    size_t w = 0;
    for (int l = 0; l < m->n_layers; l++)
        if ((size_t)m->layers[l].out > w)
            w = (size_t)m->layers[l].out;
    return w;
}

static size_t sum_outputs(const castor_model *m)
{
    size_t s = 0;
    for (int l = 0; l < m->n_layers; l++)
        s += (size_t)m->layers[l].out;
    return s;
}

static size_t output_units(const castor_model *m)
{
    return (size_t)m->layers[m->n_layers - 1].out;
}

/* Byte sizes of the activation arena's parts for `rows` rows, in order.
 * The backward pass's ping-pong buffers only with `backward`: forward alone
 * (evaluate, predict) never writes them. */
enum { ACT_X, ACT_ACTS, ACT_DELTA0, ACT_DELTA1, ACT_LABELS, ACT_TARGETS, ACT_STATS, ACT_PARTS };

static void act_parts(const castor_model *m, size_t rows, int backward, size_t parts[ACT_PARTS])
{
    size_t f = sizeof(float);
    parts[ACT_X] = align_up(sat_mul(rows, (size_t)m->input_features * f));
    parts[ACT_ACTS] = align_up(sat_mul(rows, sat_mul(sum_outputs(m), f)));
    parts[ACT_DELTA0] = backward ? align_up(sat_mul(rows, widest_layer(m) * f)) : 0;
    parts[ACT_DELTA1] = parts[ACT_DELTA0];
    parts[ACT_LABELS] = align_up(sat_mul(rows, sizeof(int32_t)));
    parts[ACT_TARGETS] =
        m->loss == CASTOR_LOSS_MSE ? align_up(sat_mul(rows, output_units(m) * f)) : 0;
    parts[ACT_STATS] = align_up(sat_mul(rows, 2 * f));
}

static size_t act_bytes(const castor_model *m, size_t rows, int backward)
{
    size_t parts[ACT_PARTS], total = 0;
    act_parts(m, rows, backward, parts);
    for (int i = 0; i < ACT_PARTS; i++)
        total = sat_add(total, parts[i]);
    return total;
}

/* What every replica holds from compile on: the variables. */
static size_t param_arena_bytes(const castor_model *m)
{
    return align_up(m->n_params * sizeof(float));
}

/* What only training adds, from the first fit on: the gradients and, on a
 * mirrored replica, the optimizer state (after the gradients). */
static size_t training_bytes(const castor_model *m, int mirrored)
{
    size_t grads = align_up(m->n_params * sizeof(float));
    size_t state =
        mirrored ? align_up(sat_mul((size_t)m->opt_slots, m->n_params * sizeof(float))) : 0;
    return sat_add(grads, state);
}

/* CASTOR_DEVICE_MEMORY, said on dev, for a replica that needs the
 * variables, the training buffers when `training`, and the activations for
 * `rows` rows (0: not known yet). */
static int too_big(cdev *dev, const castor_model *m, int rows, int mirrored, int training)
{
    size_t params = m->n_params * sizeof(float);
    size_t state = mirrored && m->opt_slots > 0 ? sat_mul((size_t)m->opt_slots, params) : 0;
    size_t held = param_arena_bytes(m);
    if (training)
        held = sat_add(held, training_bytes(m, mirrored));
    size_t acts = act_bytes(m, (size_t)rows, training);
    size_t need = sat_add(held, rows > 0 ? acts : 0);
    char state_part[64] = "", parts[256];
    if (state)
        snprintf(state_part, sizeof state_part, "%s optimizer state %zu",
                 training ? "," : " and", state);
    const char *when = "";
    if (rows <= 0) {
        /* At compile the batch is not known yet: the figure is a floor (a
         * budget just above it failed again at the first batch, for the
         * activations the message had not named). Training needs more,
         * allocated by the first fit: said here so that the budget that
         * would do for it can be picked at once. */
        when = " before any batch's activations";
        snprintf(parts, sizeof parts, "variables %zu; to train, also gradients %zu%s", params,
                 params, state_part);
    } else if (!training) {
        snprintf(parts, sizeof parts, "variables %zu, activations for %d rows %zu", params, rows,
                 acts);
    } else {
        when = " to train";
        snprintf(parts, sizeof parts, "variables %zu, gradients %zu%s, activations for %d rows "
                 "%zu", params, params, state_part, rows, acts);
    }
    return castor__cdev_fail(dev, CASTOR_DEVICE_MEMORY,
                             "the model needs %zu bytes of device memory per replica on %s%s "
                             "(%s), but the budget is %zu bytes a replica there (the device's, "
                             "split among the replicas that share it)",
                             need, dev->name, when, parts, dev->budget);
}

int castor__replica_check_room(const castor_model *m, cdev *dev, int mirrored)
{
    return param_arena_bytes(m) > dev->budget ? too_big(dev, m, 0, mirrored, 0) : CASTOR_OK;
}

int castor__replica_check_training_room(const castor__replica *r, const castor_model *m,
                                        int rows)
{
    size_t need = sat_add(sat_add(r->param_bytes, training_bytes(m, r->mirrored)),
                          act_bytes(m, (size_t)rows, 1));
    return need > r->dev->budget ? too_big(r->dev, m, rows, r->mirrored, 1) : CASTOR_OK;
}

int castor__replica_init(castor__replica *r, const castor_model *m, cdev *dev, int index,
                         int mirrored, int use_cuda)
{
    memset(r, 0, sizeof *r);
    r->index = index;
    r->dev = dev;
    r->params_version = UINT64_MAX;
    r->mirrored = mirrored;
    r->use_cuda = use_cuda;

    r->param_bytes = param_arena_bytes(m);
    int rc = castor__replica_check_room(m, dev, mirrored);
    if (rc)
        return rc;
    void *arena = NULL;
    if ((rc = castor__cdev_alloc(dev, r->param_bytes, &arena)))
        return rc;
    r->d_params = arena;

    r->layer_ready = calloc((size_t)m->n_layers, sizeof *r->layer_ready);
    r->grad_ready = calloc((size_t)m->n_layers, sizeof *r->grad_ready);
    if (!r->layer_ready || !r->grad_ready)
        return castor__cdev_fail(dev, CASTOR_NOMEM, "out of host memory for events");
    for (int l = 0; l < m->n_layers; l++) {
        if ((rc = dev->iface->event_create(dev, &r->layer_ready[l])) ||
            (rc = dev->iface->event_create(dev, &r->grad_ready[l])))
            return rc;
    }
    return dev->iface->event_create(dev, &r->input_ready);
}

int castor__replica_alloc_training(castor__replica *r, const castor_model *m,
                                   const float *h_state, int host_grads)
{
    if (r->d_grads)
        return CASTOR_OK;
    cdev *dev = r->dev;
    if (host_grads && castor__host_alloc(&r->h_grads, m->n_params * sizeof(float), r->use_cuda))
        return castor__cdev_fail(dev, CASTOR_NOMEM,
                                 "out of host memory for replica %d's gradients", r->index);
    size_t bytes = training_bytes(m, r->mirrored);
    void *arena = NULL;
    int rc = castor__cdev_alloc(dev, bytes, &arena);
    if (rc) {
        castor__host_free(&r->h_grads);
        return rc;
    }
    r->d_grads = arena;
    r->train_bytes = bytes;
    if (r->mirrored && m->opt_slots > 0) {
        r->d_state = (float *)((char *)arena + align_up(m->n_params * sizeof(float)));
        r->state_bytes = (size_t)m->opt_slots * m->n_params * sizeof(float);
        rc = cdev_copy_h2d(dev, CDEV_STREAM_COMPUTE, r->d_state, h_state, r->state_bytes);
        if (!rc)
            rc = dev->iface->synchronize(dev);
        if (rc) {
            /* The copy may still be queued: it must not land after the
             * buffer is given back. */
            (void)dev->iface->synchronize(dev);
            castor__replica_free_training(r);
            return rc;
        }
    }
    return CASTOR_OK;
}

void castor__replica_free_training(castor__replica *r)
{
    if (r->d_grads)
        castor__cdev_free(r->dev, r->d_grads, r->train_bytes);
    r->d_grads = r->d_state = NULL;
    r->train_bytes = r->state_bytes = 0;
    castor__host_free(&r->h_grads);
}

void castor__replica_release_acts(castor__replica *r)
{
    if (r->d_act_arena)
        castor__cdev_free(r->dev, r->d_act_arena, r->act_bytes);
    r->d_act_arena = NULL;
    r->d_x = r->d_acts = r->d_delta[0] = r->d_delta[1] = NULL;
    r->d_targets = r->d_row_stats = NULL;
    r->d_labels = NULL;
    r->act_bytes = 0;
    r->act_backward = 0;
    r->cap = 0;
    castor__host_free(&r->h_row_stats);
}

int castor__replica_reserve(castor__replica *r, const castor_model *m, int rows, int backward)
{
    if (rows <= r->cap && (r->act_backward || !backward))
        return CASTOR_OK;
    cdev *dev = r->dev;
    size_t parts[ACT_PARTS], total = 0;
    act_parts(m, (size_t)rows, backward, parts);
    for (int i = 0; i < ACT_PARTS; i++)
        total = sat_add(total, parts[i]);
    /* Checked before freeing the old buffers, so a failed grow keeps them. */
    size_t others = dev->used - r->act_bytes;  /* what the device holds besides */
    if (total > dev->budget || others > dev->budget - total)
        return too_big(dev, m, rows, r->mirrored, backward);

    castor__replica_release_acts(r);

    void *arena = NULL;
    int rc = castor__cdev_alloc(dev, total, &arena);
    if (rc)
        return rc;
    r->d_act_arena = arena;
    r->act_bytes = total;
    r->act_backward = backward;
    char *p = arena;
    float **slots[ACT_PARTS] = {&r->d_x, &r->d_acts, &r->d_delta[0], &r->d_delta[1], NULL,
                                &r->d_targets, &r->d_row_stats};
    for (int i = 0; i < ACT_PARTS; i++) {
        if (i == ACT_LABELS)
            r->d_labels = (int32_t *)(void *)p;
        else
            *slots[i] = parts[i] ? (float *)(void *)p : NULL;
        p += parts[i];
    }
    if (castor__host_alloc(&r->h_row_stats, 2 * (size_t)rows * sizeof(float), r->use_cuda))
        return castor__cdev_fail(dev, CASTOR_NOMEM, "out of host memory for row statistics");
    r->cap = rows;
    return CASTOR_OK;
}

void castor__replica_free(castor__replica *r, const castor_model *m)
{
    cdev *dev = r->dev;
    if (!dev)
        return;
    if (r->dev->iface->synchronize)
        (void)dev->iface->synchronize(dev);
    for (int l = 0; l < m->n_layers; l++) {
        if (r->layer_ready && r->layer_ready[l])
            dev->iface->event_destroy(dev, r->layer_ready[l]);
        if (r->grad_ready && r->grad_ready[l])
            dev->iface->event_destroy(dev, r->grad_ready[l]);
    }
    if (r->input_ready)
        dev->iface->event_destroy(dev, r->input_ready);
    free(r->layer_ready);
    free(r->grad_ready);
    if (r->d_act_arena)
        castor__cdev_free(dev, r->d_act_arena, r->act_bytes);
    if (r->d_params)
        castor__cdev_free(dev, r->d_params, r->param_bytes);
    castor__replica_free_training(r);
    castor__host_free(&r->h_row_stats);
    memset(r, 0, sizeof *r);
}

static size_t layer_floats(const castor__layer *lay)
{
    return (size_t)lay->in * (size_t)lay->out + (size_t)lay->out;
}

int castor__replica_upload_params(castor__replica *r, const castor_model *m,
                                  const float *h_params)
{
    cdev *dev = r->dev;
    int rc;
    for (int l = 0; l < m->n_layers; l++) {
        const castor__layer *lay = &m->layers[l];
        if ((rc = cdev_copy_h2d(dev, CDEV_STREAM_H2D, r->d_params + lay->w_off,
                                       h_params + lay->w_off, layer_floats(lay) * sizeof(float))))
            return rc;
        if ((rc = dev->iface->event_record(dev, r->layer_ready[l], CDEV_STREAM_H2D)))
            return rc;
    }
    return CASTOR_OK;
}

int castor__replica_upload_batch(castor__replica *r, const castor_model *m, const float *h_x,
                                 const int32_t *h_labels, const float *h_targets)
{
    cdev *dev = r->dev;
    int rc;
    size_t rows = (size_t)r->rows;
    if ((rc = cdev_copy_h2d(dev, CDEV_STREAM_H2D, r->d_x,
                                   h_x + (size_t)r->offset * (size_t)m->input_features,
                                   rows * (size_t)m->input_features * sizeof(float))))
        return rc;
    if (h_labels && (rc = cdev_copy_h2d(dev, CDEV_STREAM_H2D, r->d_labels,
                                               h_labels + r->offset, rows * sizeof(int32_t))))
        return rc;
    if (h_targets && r->d_targets) {
        size_t out = output_units(m);
        if ((rc = cdev_copy_h2d(dev, CDEV_STREAM_H2D, r->d_targets,
                                       h_targets + (size_t)r->offset * out,
                                       rows * out * sizeof(float))))
            return rc;
    }
    return dev->iface->event_record(dev, r->input_ready, CDEV_STREAM_H2D);
}

/* Output of layer l inside the activation arena. */
static float *layer_output(const castor__replica *r, const castor_model *m, int l)
{
    size_t off = 0;
    for (int j = 0; j < l; j++)
        off += (size_t)r->cap * (size_t)m->layers[j].out;
    return r->d_acts + off;
}

static int forward(castor__replica *r, const castor_model *m)
{
    cdev *dev = r->dev;
    const cdev_iface *f = dev->iface;
    int rows = r->rows, rc;
    if ((rc = f->stream_wait(dev, CDEV_STREAM_COMPUTE, r->input_ready)))
        return rc;
    const float *x = r->d_x;
    for (int l = 0; l < m->n_layers; l++) {
        const castor__layer *lay = &m->layers[l];
        float *y = layer_output(r, m, l);
        if ((rc = f->stream_wait(dev, CDEV_STREAM_COMPUTE, r->layer_ready[l])))
            return rc;
        if ((rc = f->gemm(dev, 0, 0, rows, lay->out, lay->in, 1.0f, x, lay->in,
                          r->d_params + lay->w_off, lay->out, 0.0f, y, lay->out)))
            return rc;
        if ((rc = f->bias_add(dev, y, r->d_params + lay->b_off, rows, lay->out)))
            return rc;
        if (lay->act != CASTOR_ACT_LINEAR &&
            (rc = f->act_forward(dev, lay->act, y, (size_t)rows * (size_t)lay->out)))
            return rc;
        x = y;
    }
    return CASTOR_OK;
}

static int backward(castor__replica *r, const castor_model *m)
{
    cdev *dev = r->dev;
    const cdev_iface *f = dev->iface;
    int rows = r->rows, rc;
    float *cur = r->d_delta[0], *next = r->d_delta[1];
    for (int l = m->n_layers - 1; l >= 0; l--) {
        const castor__layer *lay = &m->layers[l];
        const float *y = layer_output(r, m, l);
        const float *x = l > 0 ? layer_output(r, m, l - 1) : r->d_x;
        if (lay->act != CASTOR_ACT_LINEAR &&
            (rc = f->act_backward(dev, lay->act, y, cur, (size_t)rows * (size_t)lay->out)))
            return rc;
        /* dW (in x out) = x^T (in x rows) . delta (rows x out) */
        if ((rc = f->gemm(dev, 1, 0, lay->in, lay->out, rows, 1.0f, x, lay->in, cur, lay->out,
                          0.0f, r->d_grads + lay->w_off, lay->out)))
            return rc;
        if ((rc = f->bias_grad(dev, cur, r->d_grads + lay->b_off, rows, lay->out)))
            return rc;
        if ((rc = f->event_record(dev, r->grad_ready[l], CDEV_STREAM_COMPUTE)))
            return rc;
        if (l > 0) {
            /* delta for the layer below (rows x in) = delta . W^T */
            if ((rc = f->gemm(dev, 0, 1, rows, lay->in, lay->out, 1.0f, cur, lay->out,
                              r->d_params + lay->w_off, lay->out, 0.0f, next, lay->in)))
                return rc;
            float *t = cur;
            cur = next;
            next = t;
        }
    }
    return CASTOR_OK;
}

int castor__replica_compute(castor__replica *r, const castor_model *m, int backward_pass,
                            float grad_scale)
{
    cdev *dev = r->dev;
    int rc = forward(r, m);
    if (rc)
        return rc;
    const castor__layer *last = &m->layers[m->n_layers - 1];
    float *logits = layer_output(r, m, m->n_layers - 1);
    float *dout = backward_pass ? r->d_delta[0] : NULL;
    if (m->loss == CASTOR_LOSS_SOFTMAX_XENT)
        rc = dev->iface->softmax_xent(dev, logits, r->d_labels, r->rows, last->out, grad_scale,
                                      dout, r->d_row_stats);
    else
        rc = dev->iface->mse(dev, logits, r->d_targets, r->rows, last->out, grad_scale, dout,
                             r->d_row_stats);
    if (rc || !backward_pass)
        return rc;
    return backward(r, m);
}

int castor__replica_download_grads(castor__replica *r, const castor_model *m)
{
    cdev *dev = r->dev;
    float *h = r->h_grads.ptr;
    int rc;
    for (int l = m->n_layers - 1; l >= 0; l--) {
        const castor__layer *lay = &m->layers[l];
        if ((rc = dev->iface->stream_wait(dev, CDEV_STREAM_D2H, r->grad_ready[l])))
            return rc;
        if ((rc = cdev_copy_d2h(dev, CDEV_STREAM_D2H, h + lay->w_off,
                                       r->d_grads + lay->w_off,
                                       layer_floats(lay) * sizeof(float))))
            return rc;
    }
    return CASTOR_OK;
}

int castor__replica_finish(castor__replica *r, const castor_model *m, float *h_out)
{
    cdev *dev = r->dev;
    int rc;
    /* Small results ride the compute stream: they are ready when it is. */
    if ((rc = cdev_copy_d2h(dev, CDEV_STREAM_COMPUTE, r->h_row_stats.ptr, r->d_row_stats,
                                   2 * (size_t)r->rows * sizeof(float))))
        return rc;
    if (h_out) {
        size_t out = output_units(m);
        if ((rc = cdev_copy_d2h(dev, CDEV_STREAM_COMPUTE, h_out + (size_t)r->offset * out,
                                       layer_output(r, m, m->n_layers - 1),
                                       (size_t)r->rows * out * sizeof(float))))
            return rc;
    }
    return dev->iface->synchronize(dev);
}

void castor__replica_stats(const castor__replica *r, double *loss_sum, double *correct)
{
    const float *s = r->h_row_stats.ptr;
    double l = 0, c = 0;
    for (int i = 0; i < r->rows; i++) {
        l += s[2 * (size_t)i];
        c += s[2 * (size_t)i + 1];
    }
    *loss_sum = l;
    *correct = c;
}

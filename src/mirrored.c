/*
 * Mirrored: every replica holds the variables and the optimizer state in its
 * own device memory. After backward the gradients are all-reduced (summed;
 * the loss is already scaled by the global batch) and every replica applies
 * the same update on its device, so the copies stay identical.
 *
 * The all-reduce here goes through host memory: each replica downloads its
 * gradient, the host sums them in replica order with the same code as the
 * central strategy, and each replica uploads the sum. On the CPU backend that
 * makes mirrored and central bitwise identical.
 */
#include <string.h>

#include "strategy.h"
#include "util.h"


typedef struct step_ctx {
    castor_model *m;
    const castor__batch *b;
    float grad_scale;
} step_ctx;

static int compute_grads(castor_model *m, castor__replica *r, const castor__batch *b, float scale)
{
    int rc;
    if ((rc = castor__replica_upload_batch(r, m, b->x, b->labels, b->targets)) ||
        (rc = castor__replica_compute(r, m, 1, scale)) ||
        (rc = castor__replica_download_grads(r, m)))
        return rc;
    return castor__replica_finish(r, m, NULL);
}

static void grads_task(void *ctx, int index, int count)
{
    step_ctx *c = ctx;
    castor__replica *r = &c->m->rt->reps[index];
    castor__split_rows(c->b->rows, count, index, &r->offset, &r->rows);
    r->status = r->rows ? compute_grads(c->m, r, c->b, c->grad_scale) : CASTOR_OK;
}

static void update_task(void *ctx, int index, int count)
{
    (void)count;
    castor_model *m = ctx;
    castor__replica *r = &m->rt->reps[index];
    cdev *dev = r->dev;
    int rc = cdev_copy_h2d(dev, CDEV_STREAM_COMPUTE, r->d_grads, m->grads.ptr,
                                  m->n_params * sizeof(float));
    if (!rc)
        rc = dev->iface->optimizer_step(dev, &m->opt, r->d_params, r->d_grads, r->d_state,
                                        m->n_params, m->step + 1);
    if (!rc)
        rc = dev->iface->synchronize(dev);
    r->status = rc;
}

static int mirrored_train_step(castor_model *m, const castor__batch *b,
                               castor__batch_stats *stats)
{
    int rc = castor__runtime_ensure_rows(m, b->rows);
    if (rc)
        return rc;
    step_ctx c = {m, b, 1.0f / (float)b->rows};
    castor_run_stats *rs = &m->rt->stats;
    double t0 = castor__now();
    if ((rc = castor__run_replicas(m, grads_task, &c)))
        return rc;  /* no replica has changed its variables yet */
    double t1 = castor__now();
    castor__reduce_replicas(m, stats);
    double t2 = castor__now();
    if ((rc = castor__run_replicas(m, update_task, m))) {
        /* Some replicas may have applied the update and others not. */
        m->inconsistent = 1;
        return rc;
    }
    double t3 = castor__now();
    rs->seconds_replicas += t1 - t0;
    rs->seconds_reduce += t2 - t1;
    rs->seconds_update += t3 - t2;
    rs->seconds_total += t3 - t0;
    rs->steps++;
    m->step++;
    m->params_version++;
    m->host_params_current = 0;
    return CASTOR_OK;
}

static void upload_task(void *ctx, int index, int count)
{
    (void)count;
    castor_model *m = ctx;
    castor__replica *r = &m->rt->reps[index];
    cdev *dev = r->dev;
    int rc = cdev_copy_h2d(dev, CDEV_STREAM_COMPUTE, r->d_params, m->params.ptr,
                                  m->n_params * sizeof(float));
    if (!rc && r->d_state)
        rc = cdev_copy_h2d(dev, CDEV_STREAM_COMPUTE, r->d_state, m->opt_state.ptr,
                                  r->state_bytes);
    if (!rc)
        rc = dev->iface->synchronize(dev);
    r->status = rc;
}

static int mirrored_push(castor_model *m)
{
    int rc = castor__run_replicas(m, upload_task, m);
    if (rc) {
        m->inconsistent = 1;
        return rc;
    }
    m->inconsistent = 0;
    m->host_params_current = 1;
    return CASTOR_OK;
}

static int mirrored_prepare(castor_model *m)
{
    int rc = castor__runtime_create(m, 1);
    return rc ? rc : mirrored_push(m);
}

static int mirrored_pull(castor_model *m)
{
    if (m->host_params_current)
        return CASTOR_OK;
    /* Every replica holds the same values; replica 0's are the model's. */
    castor__replica *r = &m->rt->reps[0];
    cdev *dev = r->dev;
    int rc = cdev_copy_d2h(dev, CDEV_STREAM_COMPUTE, m->params.ptr, r->d_params,
                                  m->n_params * sizeof(float));
    if (!rc && r->d_state)
        rc = cdev_copy_d2h(dev, CDEV_STREAM_COMPUTE, m->opt_state.ptr, r->d_state,
                                  r->state_bytes);
    if (!rc)
        rc = dev->iface->synchronize(dev);
    if (rc)
        return castor__model_fail(m, rc, "replica 0 (%s): %s", dev->name, dev->errmsg);
    m->host_params_current = 1;
    return CASTOR_OK;
}

const castor__strategy_ops castor__mirrored_ops = {
    .name = "mirrored",
    .prepare = mirrored_prepare,
    .train_step = mirrored_train_step,
    .pull = mirrored_pull,
    .push = mirrored_push,
};

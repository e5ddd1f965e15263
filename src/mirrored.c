/*
 * Mirrored: every replica holds the variables and the optimizer state in its
 * own device memory. After backward the gradients are all-reduced (summed;
 * the loss is already scaled by the global batch) and every replica applies
 * the same update on its device, so the copies stay identical.
 *
 * The optimizer state goes to the devices with the gradients, at the first
 * fit (castor__runtime_ensure_training): only an update reads it, so a
 * model that only evaluates and predicts needs device room for its
 * variables alone. Until then no update has changed it and the host's copy
 * is the state: pull and push skip it while the replicas hold none.
 *
 * How the all-reduce runs depends on where the replicas are:
 *   REDUCE_NONE    one replica: nothing to reduce.
 *   REDUCE_HOST    emulated CPU devices, or a mix: each replica downloads its
 *                  gradient, the host sums them in replica order with the
 *                  same code as the central strategy, each uploads the sum.
 *                  On the CPU backend mirrored and central are then bitwise
 *                  identical.
 *   REDUCE_NCCL    distinct GPUs: ncclAllReduce on each replica's stream.
 *                  It runs in the second phase, once every replica's
 *                  gradient is known to be good: a collective that one rank
 *                  never joins would hang the others, so a replica that
 *                  fails must fail before any rank has queued it.
 *   REDUCE_SHARED  logical replicas on one device (cuda:0xK; NCCL refuses two
 *                  ranks on a GPU), or on one emulated device (cpu:1xK):
 *                  replica 0 adds the others' gradients in replica order
 *                  on the device, and the others copy the sum. On the CPU
 *                  backend this too is bitwise the host's sum.
 */
#include <stdlib.h>

#include "strategy.h"
#include "util.h"
#ifdef CASTOR_HAVE_CUDA
#include "device/cuda/nccl.h"
#endif

enum { REDUCE_NONE, REDUCE_HOST, REDUCE_NCCL, REDUCE_SHARED };

typedef struct step_ctx {
    castor_model *m;
    const castor__batch *b;
    float grad_scale;
    int update_queued;  /* REDUCE_NONE: the one replica has queued its update */
} step_ctx;

static int apply_update(castor_model *m, castor__replica *r)
{
    return r->dev->iface->optimizer_step(r->dev, &m->opt, r->d_params, r->d_grads, r->d_state,
                                         m->n_params, m->opt_step + 1);
}

/* Forward and backward over the replica's slice; a replica without rows
 * contributes a zero gradient where the reduction happens on the device. */
static int compute_grads(castor_model *m, castor__replica *r, const castor__batch *b,
                         float scale)
{
    cdev *dev = r->dev;
    int rc;
    if (!r->rows)
        return dev->iface->memset0(dev, CDEV_STREAM_COMPUTE, r->d_grads,
                                   m->n_params * sizeof(float));
    if ((rc = castor__replica_upload_batch(r, m, b->x, b->labels, b->targets)))
        return rc;
    return castor__replica_compute(r, m, 1, scale);
}

static void grads_task(void *ctx, int index, int count)
{
    step_ctx *c = ctx;
    castor_model *m = c->m;
    castor__replica *r = &m->rt->reps[index];
    castor__split_rows(c->b->rows, count, index, &r->offset, &r->rows);
    int mode = m->rt->reduce, rc;
    if (mode == REDUCE_HOST && !r->rows) {
        r->status = CASTOR_OK;
        return;
    }
    if ((rc = compute_grads(m, r, c->b, c->grad_scale)))
        goto done;
    switch (mode) {
    case REDUCE_HOST:
        rc = castor__replica_download_grads(r, m);
        break;
    case REDUCE_NONE:
        rc = apply_update(m, r);
        c->update_queued = !rc;
        break;
    default:
        break;  /* REDUCE_SHARED, REDUCE_NCCL: summed in the second phase */
    }
    if (!rc)
        rc = r->rows ? castor__replica_finish(r, m, NULL) : r->dev->iface->synchronize(r->dev);
done:
    r->status = rc;
}

/* Second phase: place the reduced gradient and apply the update. */
static void update_task(void *ctx, int index, int count)
{
    (void)count;
    castor_model *m = ctx;
    castor__replica *r = &m->rt->reps[index];
    cdev *dev = r->dev;
    int rc = CASTOR_OK;
    switch (m->rt->reduce) {
    case REDUCE_HOST:
        rc = cdev_copy_h2d(dev, CDEV_STREAM_COMPUTE, r->d_grads, m->grads.ptr,
                           m->n_params * sizeof(float));
        break;
#ifdef CASTOR_HAVE_CUDA
    case REDUCE_NCCL:
        rc = castor__nccl_allreduce_sum(m->rt->nccl_comms[index], dev, r->d_grads, m->n_params);
        break;
#endif
    default:  /* REDUCE_SHARED: the sum is in replica 0's buffer, same GPU */
        if (index > 0)
            rc = dev->iface->copy_d2d(dev, CDEV_STREAM_COMPUTE, r->d_grads,
                                      m->rt->reps[0].d_grads, m->n_params * sizeof(float));
        break;
    }
    if (!rc)
        rc = apply_update(m, r);
    if (!rc)
        rc = dev->iface->synchronize(dev);
    r->status = rc;
}

/* Waits for what was queued on replica 0's device (rc: how queuing it went).
 * On a failure the model gets the error, and the work queued before the
 * failure is still run to its end before this returns, so none of it runs
 * later, behind the caller's back. */
static int finish_on_replica0(castor_model *m, cdev *dev, int rc)
{
    if (!rc)
        rc = dev->iface->synchronize(dev);
    if (!rc)
        return CASTOR_OK;
    rc = castor__model_fail(m, rc, "replica 0 (%s): %s", dev->name, dev->errmsg);
    (void)dev->iface->synchronize(dev);
    return rc;
}

/* REDUCE_SHARED: replica 0's gradient += each other's, in replica order. */
static int sum_on_device(castor_model *m)
{
    castor__replica *r0 = &m->rt->reps[0];
    cdev *dev = r0->dev;
    int rc = CASTOR_OK;
    for (int i = 1; i < m->rt->n && !rc; i++)
        rc = dev->iface->add(dev, r0->d_grads, m->rt->reps[i].d_grads, m->n_params);
    /* The sums queued before a failure read the other replicas' gradients:
     * they must run now, not while those are written next step. */
    return finish_on_replica0(m, dev, rc);
}

static int mirrored_train_step(castor_model *m, const castor__batch *b,
                               castor__batch_stats *stats)
{
    int rc = castor__runtime_ensure_training(m, b->rows);
    if (rc)
        return rc;
    castor__runtime *rt = m->rt;
    step_ctx c = {m, b, 1.0f / (float)b->rows, 0};
    /* With one replica the update happens inside the first phase. */
    int one_phase = rt->reduce == REDUCE_NONE;
    double t0 = castor__now();
    if ((rc = castor__run_replicas(m, grads_task, &c))) {
        /* The replica may have updated once its update was queued; before,
         * or with several replicas, none has changed its variables yet. */
        if (one_phase && c.update_queued)
            m->inconsistent = 1;
        return rc;
    }
    double t1 = castor__now();
    castor__sum_stats(m, stats);
    if (rt->reduce == REDUCE_HOST)
        castor__reduce_grads(m);
    else if (rt->reduce == REDUCE_SHARED && (rc = sum_on_device(m)))
        return rc;
    double t2 = castor__now();
    if (!one_phase && (rc = castor__run_replicas(m, update_task, m))) {
        m->inconsistent = 1;
        return rc;
    }
    castor__step_done(m, t0, t1, t2, castor__now());
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

static int choose_reduction(castor_model *m)
{
    castor_strategy *s = m->strategy;
    castor__runtime *rt = m->rt;
    if (rt->n == 1)
        return REDUCE_NONE;
    castor__placement where = castor__devices_placement(s->devs, rt->n);
    if (where.same_device)
        return REDUCE_SHARED;
#ifdef CASTOR_HAVE_CUDA
    if (where.distinct_gpus) {
        int ordinals[CASTOR__MAX_REPLICAS];
        for (int i = 0; i < rt->n; i++)
            ordinals[i] = s->devs[i]->ordinal;
        rt->nccl_comms = calloc((size_t)rt->n, sizeof *rt->nccl_comms);
        char err[256] = "";
        if (rt->nccl_comms &&
            castor__nccl_group_create(rt->n, ordinals, rt->nccl_comms, err, sizeof err) == 0)
            return REDUCE_NCCL;
        free(rt->nccl_comms);
        rt->nccl_comms = NULL;
        castor__log(s, CASTOR_LOG_WARN, "NCCL unavailable (%s); all-reducing through the host",
                    err[0] ? err : "out of memory");
    }
#endif
    return REDUCE_HOST;  /* emulated devices, a mix, or GPUs some replicas share */
}

static int mirrored_prepare(castor_model *m)
{
    int rc = castor__runtime_create(m);
    if (rc)
        return rc;
    m->rt->reduce = choose_reduction(m);
    /* Only there do the replicas' gradients come to the host, to be summed:
     * one replica, replicas sharing a device and NCCL never read them back. */
    m->rt->host_sums = m->rt->reduce == REDUCE_HOST;
    static const char *const names[] = {"none", "host", "nccl", "device (shared by the replicas)"};
    castor__log(m->strategy, CASTOR_LOG_INFO, "mirrored: all-reduce through %s",
                names[m->rt->reduce]);
    return mirrored_push(m);
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
    if (!rc && r->d_state) {
        /* Once this copy is queued, the host's state is host_opt_step's
         * only if it never ran, and the step's after it only if it ran
         * whole: a failure reported by synchronize leaves either, or a part
         * of each (a GPU's copy that faulted part-way). Until it is known
         * to have landed, the copy is no state to recover to. */
        m->host_state_torn = 1;
        rc = cdev_copy_d2h(dev, CDEV_STREAM_COMPUTE, m->opt_state.ptr, r->d_state,
                           r->state_bytes);
    }
    /* A copy queued before a failure must not land in the host's buffers
     * later, over what a load or set_params puts there. */
    if ((rc = finish_on_replica0(m, dev, rc)))
        return rc;
    m->host_params_current = 1;
    m->host_opt_step = m->opt_step;
    m->host_state_torn = 0;
    return CASTOR_OK;
}

const castor__strategy_ops castor__mirrored_ops = {
    .name = "mirrored",
    .device_state = 1,
    .prepare = mirrored_prepare,
    .train_step = mirrored_train_step,
    .pull = mirrored_pull,
    .push = mirrored_push,
};

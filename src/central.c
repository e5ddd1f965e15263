/*
 * Central storage: the variables and the optimizer state live only on the
 * host. Each step every replica uploads the current variables layer by
 * layer, computes its slice's gradient and hands it back; the host sums the
 * replicas' gradients in replica order and applies the optimizer to the
 * master copy, both in one pass. A failure on any replica leaves the master
 * copy untouched.
 */
#include "host/update.h"
#include "util.h"
#include "strategy.h"

typedef struct step_ctx {
    castor_model *m;
    const castor__batch *b;
    float grad_scale;
} step_ctx;

static int replica_step(castor_model *m, castor__replica *r, const castor__batch *b, float scale)
{
    int rc;
    if ((rc = castor__replica_upload_batch(r, m, b->x, b->labels, b->targets)))
        return rc;
    if (r->params_version != m->params_version) {
        if ((rc = castor__replica_upload_params(r, m, m->params.ptr)))
            return rc;
        r->params_version = m->params_version;
    }
    if ((rc = castor__replica_compute(r, m, 1, scale)) ||
        (rc = castor__replica_download_grads(r, m)))
        return rc;
    return castor__replica_finish(r, m, NULL);
}

static void step_task(void *ctx, int index, int count)
{
    step_ctx *c = ctx;
    castor__replica *r = &c->m->rt->reps[index];
    castor__split_rows(c->b->rows, count, index, &r->offset, &r->rows);
    r->status = r->rows ? replica_step(c->m, r, c->b, c->grad_scale) : CASTOR_OK;
}

static int central_train_step(castor_model *m, const castor__batch *b, castor__batch_stats *stats)
{
    int rc = castor__runtime_ensure_training(m, b->rows);
    if (rc)
        return rc;
    /* The loss gradient is scaled by the global batch, so the sum of the
     * replicas' gradients is the mean over the batch. */
    step_ctx c = {m, b, 1.0f / (float)b->rows};
    double t0 = castor__now();
    if ((rc = castor__run_replicas(m, step_task, &c)))
        return rc;
    double t1 = castor__now();
    castor__sum_stats(m, stats);
    /* The sum and the update in one pass over the variables: no reduce
     * phase of its own (seconds_reduce stays 0). */
    const float *grads[CASTOR__MAX_REPLICAS];
    int k = castor__host_grads(m, grads);
    castor__host_update(m->strategy->host_pool, &m->opt, m->params.ptr, m->opt_state.ptr, grads,
                        k, m->n_params, m->opt_step + 1);
    castor__step_done(m, t0, t1, t1, castor__now());
    m->host_opt_step = m->opt_step;  /* the host's state is the state */
    return CASTOR_OK;
}

static int central_prepare(castor_model *m)
{
    int rc = castor__runtime_create(m);
    if (!rc)
        m->rt->host_sums = 1;
    return rc;
}

static int central_pull(castor_model *m)
{
    (void)m;  /* the host copy is the master */
    return CASTOR_OK;
}

static int central_push(castor_model *m)
{
    m->params_version++;  /* replicas upload again before their next use */
    return CASTOR_OK;
}

const castor__strategy_ops castor__central_ops = {
    .name = "central",
    .device_state = 0,
    .prepare = central_prepare,
    .train_step = central_train_step,
    .pull = central_pull,
    .push = central_push,
};

/* Strategy handles: the device list, the replica threads, and the pieces of
 * a step that every strategy shares (splitting a batch, running the
 * replicas, collecting their errors, the forward pass). */
#include "strategy.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cores.h"
#include "host/reduce.h"
#ifdef CASTOR_HAVE_CUDA
#include "device/cuda/nccl.h"
#endif
#include "util.h"

#define DEFAULT_CPU_BUDGET ((size_t)1 << 30)

void castor__log(const castor_strategy *s, castor_log_level level, const char *fmt, ...)
{
    if (!s || !s->opts.log_fn || level > s->opts.log_level)
        return;
    char msg[CASTOR__MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->opts.log_fn(s->opts.log_user, level, msg);
}

static int strategy_fail(castor_strategy *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int strategy_fail(castor_strategy *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->errmsg, sizeof s->errmsg, fmt, ap);
    va_end(ap);
    return code;
}

/* A pool fails for its memory (CASTOR_NOMEM) or for a thread the system
 * would not start (why: pthread's error number): the message says which,
 * and where a limit is the likely cause, which one. */
static int pool_fail(castor_strategy *s, int rc, int why, int threads, const char *kind)
{
    if (rc == CASTOR_NOMEM)
        return strategy_fail(s, rc, "cannot start %d %s threads: out of host memory", threads,
                             kind);
    char buf[128];
    return strategy_fail(s, rc, "cannot start %d %s threads: %s%s", threads, kind,
                         castor__strerror(why, buf, sizeof buf),
                         why == EAGAIN ? " (raise ulimit -u?)" : "");
}

static int open_devices(castor_strategy *s, const char *spec)
{
    castor__device_entry entries[CASTOR__MAX_REPLICAS];
    int n_entries = 0;
    int rc = castor__device_list_parse(spec, entries, &n_entries, s->errmsg, sizeof s->errmsg);
    if (rc)
        return rc;
    s->devs = calloc(CASTOR__MAX_REPLICAS, sizeof *s->devs);
    if (!s->devs)
        return strategy_fail(s, CASTOR_NOMEM, "out of memory");
    size_t budget = s->opts.device_memory_budget;
    rc = castor__devices_open(entries, n_entries, budget ? budget : DEFAULT_CPU_BUDGET, budget,
                              s->opts.tf32, s->devs, &s->n_replicas, s->errmsg, sizeof s->errmsg);
    for (int i = 0; i < s->n_replicas; i++)
        s->use_cuda |= strcmp(s->devs[i]->iface->backend, "cuda") == 0;
    if (rc)
        return rc;
    if (s->n_replicas == 0)
        return strategy_fail(s, CASTOR_INVALID, "no devices in '%s'", spec);
    return CASTOR_OK;
}

int castor__strategy_cpu_replicas(const castor_strategy *s)
{
    int cpu_replicas = 0;
    for (int i = 0; i < s->n_replicas; i++)
        cpu_replicas += strcmp(s->devs[i]->iface->backend, "cpu") == 0;
    return cpu_replicas;
}

/* Emulated replicas each run OpenBLAS GEMMs at once; with OpenBLAS's own
 * threads on top they oversubscribe the cores (measured 2-3x slower on 2
 * cores). OpenBLAS's thread count is process-wide and the application's to
 * set, so the library only says so. */
static void warn_blas_oversubscription(const castor_strategy *s)
{
    int cpu_replicas = castor__strategy_cpu_replicas(s);
    int threads = cpu_replicas ? castor__cdev_cpu_blas_threads() : 0;
    int cores = castor__cpu_count();
    if (cpu_replicas > 1 && threads > 1 && threads * cpu_replicas > cores)
        castor__log(s, CASTOR_LOG_WARN,
                    "%d emulated replicas x %d OpenBLAS threads on %d cores oversubscribe the CPU; "
                    "set OPENBLAS_NUM_THREADS=%d (or call openblas_set_num_threads) for speed",
                    cpu_replicas, threads, cores,
                    cores / cpu_replicas > 0 ? cores / cpu_replicas : 1);
}

int castor_strategy_create(castor_strategy **out, castor_strategy_kind kind, const char *devices,
                           const castor_strategy_options *options)
{
    if (!out)
        return CASTOR_MISUSE;
    *out = NULL;
    castor_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return CASTOR_NOMEM;
    *out = s;
    castor_strategy_options defaults = CASTOR_STRATEGY_OPTIONS_INIT;
    s->opts = options ? *options : defaults;
    if (kind != CASTOR_STRATEGY_CENTRAL && kind != CASTOR_STRATEGY_MIRRORED)
        return strategy_fail(s, CASTOR_INVALID, "unknown strategy kind %d", (int)kind);
    s->kind = kind;
    s->ops = kind == CASTOR_STRATEGY_CENTRAL ? &castor__central_ops : &castor__mirrored_ops;
    if (!devices)
        return strategy_fail(s, CASTOR_MISUSE, "devices is NULL (e.g. \"cpu:2\" or \"cuda:0\")");
    if (s->opts.host_threads < 0 || s->opts.host_threads > 1024)
        return strategy_fail(s, CASTOR_INVALID, "host_threads must be 0..1024, not %d",
                             s->opts.host_threads);
    /* Compared as an int: the enum may be unsigned, and -1 (meant as
     * "silent") then passed every level's test and logged everything. */
    if ((int)s->opts.log_level < (int)CASTOR_LOG_ERROR ||
        (int)s->opts.log_level > (int)CASTOR_LOG_DEBUG)
        return strategy_fail(s, CASTOR_INVALID, "log_level must be CASTOR_LOG_ERROR (0) to "
                             "CASTOR_LOG_DEBUG (3), not %d (NULL log_fn: silent)",
                             (int)s->opts.log_level);
    if (!(s->devices_spec = strdup(devices)))
        return strategy_fail(s, CASTOR_NOMEM, "out of memory");
    int rc = open_devices(s, devices);
    if (rc)
        return rc;
    int why = 0;
    if ((rc = castor__pool_create(s->n_replicas, &s->replica_pool, &why)))
        return pool_fail(s, rc, why, s->n_replicas, "replica");
    int threads = s->opts.host_threads ? s->opts.host_threads : castor__cpu_count();
    if ((rc = castor__pool_create(threads, &s->host_pool, &why)))
        return pool_fail(s, rc, why, threads, "host");
    castor__log(s, CASTOR_LOG_INFO, "%s strategy on '%s': %d replica%s",
                castor_strategy_kind_name(kind), s->devices_spec, s->n_replicas,
                s->n_replicas == 1 ? "" : "s");
    warn_blas_oversubscription(s);
    /* Asked for and silently not given, TF32 would be taken to have been
     * measured (a bench, an accuracy comparison) where it never ran. */
    if (s->opts.tf32 && !s->use_cuda)
        castor__log(s, CASTOR_LOG_WARN, "tf32 has no effect here: no replica is a GPU (%s), and "
                    "the emulated devices compute in plain fp32", s->devices_spec);
    s->ready = 1;
    return CASTOR_OK;
}

void castor_strategy_free(castor_strategy *s)
{
    if (!s)
        return;
    /* The model outlives its strategy: detached, it fails cleanly (and
     * gives back its pinned buffers now) until compiled again. */
    if (s->bound)
        castor__model_detach(s->bound);
    castor__pool_free(s->replica_pool);
    castor__pool_free(s->host_pool);
    if (s->devs)
        for (int i = 0; i < s->n_replicas; i++)
            castor__cdev_destroy(s->devs[i]);
    free(s->devs);
    free(s->devices_spec);
    free(s);
}

const char *castor_strategy_errmsg(const castor_strategy *s)
{
    if (!s)
        return "out of memory (no strategy handle)";
    return s->errmsg[0] ? s->errmsg : "no error";
}

int castor_strategy_replicas(const castor_strategy *s)
{
    /* A failed create may have opened some devices: it has no replicas. */
    return s && s->ready ? s->n_replicas : 0;
}

castor_strategy_kind castor_strategy_get_kind(const castor_strategy *s)
{
    return s ? s->kind : CASTOR_STRATEGY_CENTRAL;
}

/* ---- the replicas of a compiled model ---- */

int castor__runtime_check_room(castor_model *m)
{
    castor_strategy *s = m->strategy;
    for (int i = 0; i < s->n_replicas; i++) {
        int rc = castor__replica_check_room(m, s->devs[i], s->ops->device_state);
        if (rc)
            return castor__model_fail(m, rc, "%s", s->devs[i]->errmsg);
    }
    return CASTOR_OK;
}

int castor__runtime_create(castor_model *m)
{
    castor_strategy *s = m->strategy;
    int mirrored = s->ops->device_state;
    castor__runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return castor__model_fail(m, CASTOR_NOMEM, "out of memory");
    m->rt = rt;
    rt->reps = calloc((size_t)s->n_replicas, sizeof *rt->reps);
    if (!rt->reps)
        return castor__model_fail(m, CASTOR_NOMEM, "out of memory");
    rt->n = s->n_replicas;
    for (int i = 0; i < rt->n; i++) {
        int rc = castor__replica_init(&rt->reps[i], m, s->devs[i], i, mirrored, s->use_cuda);
        if (rc)
            return castor__model_fail(m, rc, "%s", s->devs[i]->errmsg);
    }
    /* The devices' byte counters and peaks outlive a model: count this
     * one's from here, not from the last model compiled on the strategy. */
    castor_model_reset_run_stats(m);
    return CASTOR_OK;
}

void castor__runtime_free(castor_model *m)
{
    castor__runtime *rt = m->rt;
    if (!rt)
        return;
    for (int i = 0; i < rt->n; i++)
        castor__replica_free(&rt->reps[i], m);
#ifdef CASTOR_HAVE_CUDA
    if (rt->nccl_comms)
        castor__nccl_group_free(rt->n, rt->nccl_comms);
#endif
    free(rt->nccl_comms);
    free(rt->reps);
    free(rt);
    m->rt = NULL;
}

/* Rows of a global batch of `rows` that each replica must hold: rows / n
 * rounded up, without rows + n - 1 (which overflows near INT_MAX and would
 * skip the growth). */
static int rows_per_replica(const castor__runtime *rt, int rows)
{
    return rows / rt->n + (rows % rt->n != 0);
}

/* Every replica's activations for `per` rows, with the backward pass's
 * buffers once the model trains (it will train again: a forward pass that
 * grew them without would only make the next step grow them anew). */
static int reserve_rows(castor_model *m, int per)
{
    castor__runtime *rt = m->rt;
    if (per <= rt->rows_capacity)
        return CASTOR_OK;
    for (int i = 0; i < rt->n; i++) {
        int rc = castor__replica_reserve(&rt->reps[i], m, per, rt->training);
        if (rc) {
            /* A replica may have given up its old buffers: forget what the
             * replicas hold so the next call reserves again for each. */
            rt->rows_capacity = 0;
            return castor__model_fail(m, rc, "%s", rt->reps[i].dev->errmsg);
        }
    }
    rt->rows_capacity = per;
    return CASTOR_OK;
}

int castor__runtime_ensure_rows(castor_model *m, int rows)
{
    return reserve_rows(m, rows_per_replica(m->rt, rows));
}

static void free_training(castor_model *m)
{
    castor__runtime *rt = m->rt;
    for (int i = 0; i < rt->n; i++)
        castor__replica_free_training(&rt->reps[i]);
    castor__host_free(&m->grads);
}

/* The training buffers of every replica, or (on a failure, said on m) of
 * none: a model refused them stays as it was, holding no more memory. */
static int alloc_training(castor_model *m, int per)
{
    castor__runtime *rt = m->rt;
    castor_strategy *s = m->strategy;
    /* Every device's room first, so that a fit refused for it allocates
     * nothing and its message names every part (the gradients, too big
     * for the budget, are most often what a model that evaluates lacks). */
    for (int i = 0; i < rt->n; i++) {
        int rc = castor__replica_check_training_room(&rt->reps[i], m, per);
        if (rc)
            return castor__model_fail(m, rc, "%s", rt->reps[i].dev->errmsg);
    }
    /* The activations an evaluate or predict grew hold no backward
     * buffers, so the reserve after this replaces them anyway: given back
     * first, or they took the room the check above counted for the
     * training buffers, and a fit after a big-batch evaluate was refused,
     * every time. */
    for (int i = 0; i < rt->n; i++)
        if (!rt->reps[i].act_backward)
            castor__replica_release_acts(&rt->reps[i]);
    rt->rows_capacity = 0;
    /* Only mirrored keeps the sum of the gradients (to upload it), and only
     * where the host makes it; central's update sums them as it goes. */
    if (s->ops->device_state && rt->host_sums &&
        castor__host_alloc(&m->grads, m->n_params * sizeof(float), s->use_cuda))
        return castor__model_fail(m, CASTOR_NOMEM,
                                  "out of host memory for the sum of %zu gradients",
                                  m->n_params);
    /* Until now no step has changed the optimizer state, so the host's
     * copy is the state (mirrored: what the replicas start from). */
    const float *state = s->ops->device_state ? m->opt_state.ptr : NULL;
    for (int i = 0; i < rt->n; i++) {
        int rc = castor__replica_alloc_training(&rt->reps[i], m, state, rt->host_sums);
        if (rc) {
            rc = castor__model_fail(m, rc, "%s", rt->reps[i].dev->errmsg);
            free_training(m);
            return rc;
        }
    }
    rt->training = 1;
    return CASTOR_OK;
}

int castor__runtime_ensure_training(castor_model *m, int rows)
{
    int per = rows_per_replica(m->rt, rows);
    int rc = m->rt->training ? CASTOR_OK : alloc_training(m, per);
    return rc ? rc : reserve_rows(m, per);
}

void castor__split_rows(int rows, int n, int r, int *offset, int *count)
{
    int base = rows / n, extra = rows % n;
    *count = base + (r < extra ? 1 : 0);
    *offset = r * base + (r < extra ? r : extra);
}

int castor__run_replicas(castor_model *m, castor__pool_fn fn, void *ctx)
{
    castor__runtime *rt = m->rt;
    castor__pool_run(m->strategy->replica_pool, fn, ctx);
    int rc = CASTOR_OK;
    for (int i = 0; i < rt->n; i++) {
        castor__replica *r = &rt->reps[i];
        if (!r->status)
            continue;
        if (!rc)  /* the first failure is the one reported, the others logged */
            rc = castor__model_fail(m, r->status, "replica %d (%s): %s", i, r->dev->name,
                                    r->dev->errmsg);
        else
            castor__log(m->strategy, CASTOR_LOG_WARN, "replica %d (%s) failed too: %s", i,
                        r->dev->name, r->dev->errmsg);
        /* A replica that failed part-way may still have copies and kernels
         * queued (asynchronous devices) that read the staging buffers and
         * write its device buffers: let them end before either is reused. */
        (void)r->dev->iface->synchronize(r->dev);
        /* Queued work may fail only at synchronize (device.h): an upload of
         * the variables it queued may not have landed, so the replica no
         * longer holds a known version of them and uploads them again. */
        r->params_version = UINT64_MAX;
    }
    return rc;
}

/* ---- forward pass, shared by evaluate and predict ---- */

typedef struct forward_ctx {
    castor_model *m;
    const castor__batch *b;
    float *out;
} forward_ctx;

static int forward_one(castor_model *m, castor__replica *r, const castor__batch *b, float *out)
{
    int rc;
    if (!r->mirrored && r->params_version != m->params_version) {
        if ((rc = castor__replica_upload_params(r, m, m->params.ptr)))
            return rc;
        r->params_version = m->params_version;
    }
    if ((rc = castor__replica_upload_batch(r, m, b->x, b->labels, b->targets)) ||
        (rc = castor__replica_compute(r, m, 0, 0.0f)))
        return rc;
    return castor__replica_finish(r, m, out);
}

static void forward_task(void *ctx, int index, int count)
{
    forward_ctx *c = ctx;
    castor__replica *r = &c->m->rt->reps[index];
    castor__split_rows(c->b->rows, count, index, &r->offset, &r->rows);
    r->status = r->rows ? forward_one(c->m, r, c->b, c->out) : CASTOR_OK;
}

int castor__forward_batch(castor_model *m, const castor__batch *b, float *out,
                          castor__batch_stats *stats)
{
    int rc = castor__runtime_ensure_rows(m, b->rows);
    if (rc)
        return rc;
    forward_ctx c = {m, b, out};
    if ((rc = castor__run_replicas(m, forward_task, &c)))
        return rc;
    castor__sum_stats(m, stats);
    return CASTOR_OK;
}

/* ---- the host reduction both strategies share ---- */

void castor__sum_stats(castor_model *m, castor__batch_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    for (int i = 0; i < m->rt->n; i++) {
        castor__replica *r = &m->rt->reps[i];
        double l, c;
        castor__replica_stats(r, &l, &c);
        stats->loss_sum += l;
        stats->correct += c;
        stats->rows += r->rows;
    }
}

int castor__host_grads(const castor_model *m, const float *srcs[CASTOR__MAX_REPLICAS])
{
    const castor__runtime *rt = m->rt;
    int k = 0;
    for (int i = 0; i < rt->n; i++)
        if (rt->reps[i].rows)
            srcs[k++] = rt->reps[i].h_grads.ptr;
    return k;
}

void castor__reduce_grads(castor_model *m)
{
    const float *srcs[CASTOR__MAX_REPLICAS];
    int k = castor__host_grads(m, srcs);
    castor__reduce_sum(m->strategy->host_pool, m->grads.ptr, srcs, k, m->n_params);
}

/* ---- run statistics ---- */

void castor__step_done(castor_model *m, double t0, double t1, double t2, double t3)
{
    castor_run_stats *rs = &m->rt->stats;
    rs->seconds_replicas += t1 - t0;
    rs->seconds_reduce += t2 - t1;
    rs->seconds_update += t3 - t2;
    rs->seconds_total += t3 - t0;
    rs->steps++;
    m->step++;
    m->opt_step++;
    m->params_version++;
}

static void device_bytes(const castor_model *m, uint64_t *h2d, uint64_t *d2h)
{
    *h2d = *d2h = 0;
    for (int i = 0; i < m->rt->n; i++) {
        *h2d += m->rt->reps[i].dev->bytes_h2d;
        *d2h += m->rt->reps[i].dev->bytes_d2h;
    }
}

int castor__train_step(castor_model *m, const castor__batch *b, castor__batch_stats *stats)
{
    /* The bytes are the devices' counters around the step: what compile,
     * set_params, load or evaluate moved is not a training step's cost
     * (the counters since compile were reported, and a mirrored model's
     * first upload and every evaluation were in them). */
    uint64_t h2d0, d2h0, h2d1, d2h1;
    device_bytes(m, &h2d0, &d2h0);
    int rc = m->strategy->ops->train_step(m, b, stats);
    device_bytes(m, &h2d1, &d2h1);
    m->rt->stats.bytes_h2d += h2d1 - h2d0;
    m->rt->stats.bytes_d2h += d2h1 - d2h0;
    return rc;
}

int castor_model_run_stats(const castor_model *m, castor_run_stats *out)
{
    if (!m || !out)
        return CASTOR_MISUSE;
    memset(out, 0, sizeof *out);
    if (!m->rt)
        return CASTOR_OK;
    *out = m->rt->stats;
    out->device_peak_bytes = castor_model_device_peak_bytes(m);
    size_t host = m->params.bytes + m->grads.bytes + m->opt_state.bytes;
    for (int i = 0; i < m->rt->n; i++)
        host += m->rt->reps[i].h_grads.bytes + m->rt->reps[i].h_row_stats.bytes;
    out->host_bytes = host;
    return CASTOR_OK;
}

void castor_model_reset_run_stats(castor_model *m)
{
    if (!m || !m->rt)
        return;
    memset(&m->rt->stats, 0, sizeof m->rt->stats);
    for (int i = 0; i < m->rt->n; i++)
        m->rt->reps[i].dev->peak = m->rt->reps[i].dev->used;
}

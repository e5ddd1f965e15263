/*
 * fit, evaluate, predict: batching and shuffling on the host, the step
 * handed to the strategy, progress reported after every step.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "rng.h"
#include "strategy.h"
#include "util.h"

/* Pinned staging for one global batch, gathered from the dataset. */
typedef struct staging {
    castor__host_buf x, labels, targets;
    int rows;
} staging;

static int staging_alloc(staging *st, const castor_model *m, const castor_dataset *ds, int rows)
{
    memset(st, 0, sizeof *st);
    int cuda = m->strategy->use_cuda;
    size_t r = (size_t)rows;
    if (castor__host_alloc(&st->x, r * (size_t)ds->features * sizeof(float), cuda))
        return CASTOR_NOMEM;
    if (ds->labels && castor__host_alloc(&st->labels, r * sizeof(int32_t), cuda))
        return CASTOR_NOMEM;
    if (ds->targets &&
        castor__host_alloc(&st->targets, r * (size_t)ds->target_dim * sizeof(float), cuda))
        return CASTOR_NOMEM;
    st->rows = rows;
    return CASTOR_OK;
}

static void staging_free(staging *st)
{
    castor__host_free(&st->x);
    castor__host_free(&st->labels);
    castor__host_free(&st->targets);
}

/* Rows idx[0..rows) (or first..first+rows when idx is NULL) into staging. */
static castor__batch gather(staging *st, const castor_dataset *ds, const uint32_t *idx,
                            size_t first, int rows)
{
    size_t f = (size_t)ds->features, t = (size_t)ds->target_dim;
    float *x = st->x.ptr;
    int32_t *labels = st->labels.ptr;
    float *targets = st->targets.ptr;
    for (int i = 0; i < rows; i++) {
        size_t src = idx ? idx[first + (size_t)i] : first + (size_t)i;
        memcpy(x + (size_t)i * f, ds->x + src * f, f * sizeof(float));
        if (labels)
            labels[i] = ds->labels[src];
        if (targets)
            memcpy(targets + (size_t)i * t, ds->targets + src * t, t * sizeof(float));
    }
    castor__batch b = {x, labels, targets, rows};
    return b;
}

/* Does the dataset fit the model's input and loss? */
static int check_data(castor_model *m, const castor_dataset *ds, const char *what)
{
    if (!ds)
        return castor__model_fail(m, CASTOR_MISUSE, "%s: the dataset is NULL", what);
    if (ds->n == 0 || !ds->x)
        return castor__model_fail(m, CASTOR_INVALID, "%s: empty dataset", what);
    if (ds->features != m->input_features)
        return castor__model_fail(m, CASTOR_MISMATCH,
                                  "%s: samples have %d features, the model takes %d", what,
                                  ds->features, m->input_features);
    int outputs = castor_model_output_units(m);
    if (m->loss == CASTOR_LOSS_SOFTMAX_XENT) {
        if (!ds->labels)
            return castor__model_fail(m, CASTOR_MISMATCH,
                                      "%s: softmax cross-entropy needs class labels", what);
        if (ds->num_classes > outputs)
            return castor__model_fail(m, CASTOR_MISMATCH,
                                      "%s: labels go up to %d but the last layer has %d units",
                                      what, ds->num_classes - 1, outputs);
    } else {
        if (!ds->targets || ds->target_dim != outputs)
            return castor__model_fail(m, CASTOR_MISMATCH,
                                      "%s: mean squared error needs %d float targets per sample",
                                      what, outputs);
    }
    return CASTOR_OK;
}

static int check_batch(castor_model *m, int batch, const char *what)
{
    int replicas = m->strategy->n_replicas;
    if (batch <= 0)
        return castor__model_fail(m, CASTOR_INVALID, "%s: batch size must be positive, not %d",
                                  what, batch);
    if (batch < replicas)
        return castor__model_fail(m, CASTOR_INVALID,
                                  "%s: batch size %d is smaller than the %d replicas", what,
                                  batch, replicas);
    return CASTOR_OK;
}

/* Whether a callback or stop check of the running call freed the model or
 * its strategy (said on m, as `from` names it): nothing of the model's
 * devices may be touched any more, and going on crashed. */
static int freed_during(castor_model *m, const char *from)
{
    if (m->strategy && !m->free_asked)
        return 0;
    castor__model_fail(m, CASTOR_MISUSE, "%s: the %s was freed during the %s", m->running,
                       m->free_asked ? "model" : "strategy", from);
    return 1;
}

/* Ends the running call with status rc: a model freed from its callback or
 * stop check is freed now (CASTOR_MISUSE, said on nothing: there is no
 * handle left to read it from). */
static int finish_running(castor_model *m, int rc)
{
    m->running = NULL;
    if (m->free_asked) {
        castor_model_free(m);
        return CASTOR_MISUSE;
    }
    return rc;
}

/* The caller's stop check, asked before a batch or step: 0 to go on, 1 to
 * stop (CASTOR_INTERRUPTED, said by the caller), -1 when the check freed
 * the model or its strategy (said here). */
static int stop_asked(castor_model *m)
{
    if (!m->stop_check)
        return 0;
    int stop = m->stop_check(m->stop_user) != 0;
    return freed_during(m, "stop check") ? -1 : stop;
}

/* evaluate's and predict's stop check, before the batch at sample first of
 * n: the status to stop with, said on m, or 0 to go on. */
static int batch_stop(castor_model *m, const char *what, size_t first, size_t n)
{
    int stop = stop_asked(m);
    if (stop < 0)
        return CASTOR_MISUSE;
    return stop ? castor__model_fail(m, CASTOR_INTERRUPTED, "%s: stopped after %zu of %zu "
                                     "samples", what, first, n)
                : CASTOR_OK;
}

/* can_stop: the public evaluate (fit's validation pass runs whole). */
static int evaluate(castor_model *m, const castor_dataset *ds, int batch, castor_metrics *out,
                    int can_stop)
{
    staging st;
    int rows = (size_t)batch < ds->n ? batch : (int)ds->n;
    int rc = staging_alloc(&st, m, ds, rows);
    if (rc) {
        staging_free(&st);
        return castor__model_fail(m, rc, "evaluate: out of host memory");
    }
    double loss = 0, correct = 0;
    for (size_t first = 0; first < ds->n && !rc; first += (size_t)rows) {
        if (can_stop && (rc = batch_stop(m, "evaluate", first, ds->n)))
            break;
        int n = (int)((ds->n - first) < (size_t)rows ? ds->n - first : (size_t)rows);
        castor__batch b = gather(&st, ds, NULL, first, n);
        castor__batch_stats s;
        if ((rc = castor__forward_batch(m, &b, NULL, &s)))
            break;
        loss += s.loss_sum;
        correct += s.correct;
    }
    staging_free(&st);
    if (rc)
        return rc;
    out->samples = ds->n;
    out->loss = loss / (double)ds->n;
    out->accuracy = m->loss == CASTOR_LOSS_SOFTMAX_XENT ? correct / (double)ds->n : NAN;
    return CASTOR_OK;
}

int castor_model_evaluate(castor_model *m, const castor_dataset *ds, int batch,
                          castor_metrics *out)
{
    if (!m)
        return CASTOR_MISUSE;
    if (!out)
        return castor__model_fail(m, CASTOR_MISUSE, "evaluate: out is NULL");
    int rc;
    if ((rc = castor__model_not_fitting(m, "evaluate")) ||
        (rc = castor__model_ready(m, "evaluate")) || (rc = check_data(m, ds, "evaluate")) ||
        (rc = check_batch(m, batch, "evaluate")))
        return rc;
    /* Its stop check may read the model and the data, not change them. */
    m->running = "evaluate";
    atomic_fetch_add(&((castor_dataset *)ds)->in_use, 1);
    rc = evaluate(m, ds, batch, out, 1);
    atomic_fetch_sub(&((castor_dataset *)ds)->in_use, 1);
    return finish_running(m, rc);
}

int castor_model_predict(castor_model *m, const float *x, size_t n, int batch, float *out)
{
    if (!m)
        return CASTOR_MISUSE;
    if (!x || !out)
        return castor__model_fail(m, CASTOR_MISUSE, "predict: %s is NULL", !x ? "x" : "out");
    int rc;
    if ((rc = castor__model_not_fitting(m, "predict")) ||
        (rc = castor__model_ready(m, "predict")) || (rc = check_batch(m, batch, "predict")))
        return rc;
    if (n == 0)
        return CASTOR_OK;
    /* Rows go through pinned staging so device copies can be asynchronous. */
    castor_dataset view = {0};
    view.n = n;
    view.features = m->input_features;
    view.x = (float *)x;
    staging st;
    int rows = (size_t)batch < n ? batch : (int)n;
    if ((rc = staging_alloc(&st, m, &view, rows))) {
        staging_free(&st);
        return castor__model_fail(m, rc, "predict: out of host memory");
    }
    /* Predict has no labels; the loss kernels still read some, so give zeros. */
    castor__host_buf zeros = {0};
    size_t outputs = (size_t)castor_model_output_units(m);
    int mse = m->loss == CASTOR_LOSS_MSE;
    if (castor__host_alloc(&zeros, (size_t)rows * (mse ? outputs * sizeof(float) : sizeof(int32_t)),
                           m->strategy->use_cuda)) {
        staging_free(&st);
        return castor__model_fail(m, CASTOR_NOMEM, "predict: out of host memory");
    }
    m->running = "predict";  /* its stop check may read the model, not change it */
    for (size_t first = 0; first < n && !rc; first += (size_t)rows) {
        if ((rc = batch_stop(m, "predict", first, n)))
            break;
        int k = (int)((n - first) < (size_t)rows ? n - first : (size_t)rows);
        castor__batch b = gather(&st, &view, NULL, first, k);
        if (mse)
            b.targets = zeros.ptr;
        else
            b.labels = zeros.ptr;
        castor__batch_stats s;
        rc = castor__forward_batch(m, &b, out + first * outputs, &s);
    }
    castor__host_free(&zeros);
    staging_free(&st);
    return finish_running(m, rc);
}

/* The order of the epoch's samples (seeded by the epoch: a resumed run
 * draws the same), and what the model records of it for its checkpoints. */
static void start_epoch(castor_model *m, const castor_dataset *train,
                        const castor_fit_options *o, uint32_t *perm)
{
    castor__rng rng;
    castor__rng_seed(&rng, m->seed, CASTOR_RNG_SHUFFLE, (uint64_t)m->epoch);
    if (o->shuffle)
        castor__rng_permutation(&rng, perm, train->n);
    else
        for (size_t i = 0; i < train->n; i++)
            perm[i] = (uint32_t)i;
    m->epoch_batch = o->batch_size;
    m->epoch_samples = train->n;
    m->epoch_shuffle = !!o->shuffle;
}

/* Mark fit's datasets read (delta 1) or no longer (-1). Every dataset is
 * the library's own allocation, so the count may be kept through the const
 * pointers fit is given. */
static void datasets_in_use(const castor_dataset *train, const castor_fit_options *o, int delta)
{
    atomic_fetch_add(&((castor_dataset *)train)->in_use, delta);
    if (o->validation)
        atomic_fetch_add(&((castor_dataset *)o->validation)->in_use, delta);
}

int castor_model_fit(castor_model *m, const castor_dataset *train,
                     const castor_fit_options *options, castor_metrics *last_epoch)
{
    /* What a fit that ends no epoch gives, a refused one included. */
    if (last_epoch)
        *last_epoch = (castor_metrics){NAN, NAN, 0};
    if (!m)
        return CASTOR_MISUSE;
    castor_fit_options defaults = CASTOR_FIT_OPTIONS_INIT;
    /* A copy, read once: the progress callback may hold the caller's struct
     * and change it under the loop. */
    const castor_fit_options opts = options ? *options : defaults;
    const castor_fit_options *o = &opts;
    int rc;
    if ((rc = castor__model_not_fitting(m, "fit")) || (rc = castor__model_ready(m, "fit")) ||
        (rc = check_data(m, train, "fit")))
        return rc;
    if (m->nonfinite)
        return castor__model_fail(m, CASTOR_INVALID,
                                  "fit: the %s loaded from the checkpoint %s not finite (NaN or "
                                  "inf): training from %s is pointless; %s",
                                  m->nonfinite & CASTOR__NONFINITE_PARAMS
                                      ? (m->nonfinite & CASTOR__NONFINITE_STATE
                                             ? "variables and optimizer state"
                                             : "variables")
                                      : "optimizer state",
                                  m->nonfinite & CASTOR__NONFINITE_PARAMS ? "are" : "is",
                                  m->nonfinite & CASTOR__NONFINITE_PARAMS ? "them" : "it",
                                  m->nonfinite & CASTOR__NONFINITE_STATE
                                      ? "load another checkpoint"
                                      : "set finite ones (castor_model_set_params) or load "
                                        "another checkpoint");
    if (o->epochs <= 0)
        return castor__model_fail(m, CASTOR_INVALID, "fit: epochs must be positive, not %d",
                                  o->epochs);
    if ((rc = check_batch(m, o->batch_size, "fit")))
        return rc;
    if (o->max_steps < 0)
        return castor__model_fail(m, CASTOR_INVALID, "fit: max_steps must not be negative");
    if (o->validation && (rc = check_data(m, o->validation, "fit (validation data)")))
        return rc;
    if (train->n > UINT32_MAX)
        return castor__model_fail(m, CASTOR_INVALID, "fit: at most %u samples", UINT32_MAX);
    if (m->step_in_epoch > 0 && m->epoch_batch != o->batch_size)
        return castor__model_fail(m, CASTOR_MISMATCH,
                                  "fit: the epoch in progress was started with batch size %d; "
                                  "finish it with the same batch size, not %d",
                                  m->epoch_batch, o->batch_size);
    if (m->step_in_epoch > 0 && m->epoch_samples && m->epoch_samples != train->n)
        return castor__model_fail(m, CASTOR_MISMATCH,
                                  "fit: the epoch in progress is over %" PRIu64 " training "
                                  "samples, this data has %zu; finish it on the same data",
                                  m->epoch_samples, train->n);
    if (m->step_in_epoch > 0 && m->epoch_shuffle >= 0 && m->epoch_shuffle != !!o->shuffle)
        return castor__model_fail(m, CASTOR_MISMATCH,
                                  "fit: the epoch in progress was started %s; finish it %s",
                                  m->epoch_shuffle ? "shuffled" : "unshuffled",
                                  m->epoch_shuffle ? "shuffled" : "unshuffled");

    int64_t steps_per_epoch = (int64_t)((train->n + (size_t)o->batch_size - 1) /
                                        (size_t)o->batch_size);
    if (m->step_in_epoch >= steps_per_epoch)
        return castor__model_fail(m, CASTOR_MISMATCH,
                                  "fit: the model is at step %lld of an epoch of %lld steps; "
                                  "is this the dataset it was trained on?",
                                  (long long)m->step_in_epoch, (long long)steps_per_epoch);
    int rows = (size_t)o->batch_size < train->n ? o->batch_size : (int)train->n;
    staging st;
    uint32_t *perm = malloc(train->n * sizeof *perm);
    if (!perm || staging_alloc(&st, m, train, rows)) {
        if (perm)
            staging_free(&st);
        free(perm);
        return castor__model_fail(m, CASTOR_NOMEM, "fit: out of host memory");
    }

    /* The devices' room for the largest batch this fit runs, validation's
     * included, and, on the model's first fit, for the gradients (compile
     * left them out: evaluate and predict never use them): one that does
     * not fit fails now, not after an epoch. */
    size_t val_rows = o->validation ? (o->validation->n < (size_t)o->batch_size
                                           ? o->validation->n : (size_t)o->batch_size) : 0;
    if ((rc = castor__runtime_ensure_training(m, val_rows > (size_t)rows ? (int)val_rows
                                                                         : rows))) {
        staging_free(&st);
        free(perm);
        return rc;
    }
    m->running = "fit";
    datasets_in_use(train, o, 1);
    double t0 = castor__now();
    int64_t steps_done = 0;
    /* An epoch in progress is one of o->epochs (see castor.h). */
    const int64_t target_epochs = m->epoch + o->epochs;
    castor_metrics epoch_metrics = {NAN, NAN, 0};
    int stop = 0;           /* max_steps reached, or the callback or stop check asked */
    int asked_to_stop = 0;  /* the callback or stop check asked: CASTOR_INTERRUPTED */
    for (int e = 0; e < o->epochs && !rc && !stop; e++) {
        double loss = 0, correct = 0;
        size_t seen = 0;
        for (int first_of_epoch = 1; m->step_in_epoch < steps_per_epoch; first_of_epoch = 0) {
            /* Asked before the epoch is set up too: a fit stopped before its
             * first step must not record this call's batch size as the
             * epoch's. */
            int asked = stop_asked(m);
            if (asked) {
                rc = asked < 0 ? CASTOR_MISUSE : CASTOR_OK;
                stop = asked_to_stop = asked > 0;
                break;
            }
            if (first_of_epoch)
                start_epoch(m, train, o, perm);
            size_t first = (size_t)m->step_in_epoch * (size_t)o->batch_size;
            int n = (int)((train->n - first) < (size_t)rows ? train->n - first : (size_t)rows);
            castor__batch b = gather(&st, train, perm, first, n);
            castor__batch_stats s;
            if ((rc = castor__train_step(m, &b, &s)))
                break;
            m->step_in_epoch++;
            /* What the model is trained on, for its checkpoints, once it is
             * (data from memory has no shape: what an IDX set said is
             * kept). Recorded at fit's start, it changed with a fit that
             * trained nothing: stopped, or refused the devices' room. */
            if (steps_done++ == 0) {
                m->target_epochs = target_epochs;
                if (train->sample_rank > 0) {
                    m->in_type = train->idx_type;
                    m->in_rank = train->sample_rank;
                    memcpy(m->in_dims, train->sample_dims, sizeof m->in_dims);
                }
            }
            loss += s.loss_sum;
            correct += s.correct;
            seen += (size_t)s.rows;
            int last_of_epoch = m->step_in_epoch == steps_per_epoch;
            if (last_of_epoch) {
                m->epoch++;
                m->step_in_epoch = 0;
            }
            castor_progress p = {0};
            p.epoch = e;
            p.epochs = o->epochs;
            p.step_in_epoch = last_of_epoch ? steps_per_epoch : m->step_in_epoch;
            p.steps_per_epoch = steps_per_epoch;
            p.global_step = m->step;
            p.loss = loss / (double)seen;
            p.accuracy = m->loss == CASTOR_LOSS_SOFTMAX_XENT ? correct / (double)seen : NAN;
            p.val_loss = p.val_accuracy = NAN;
            if (last_of_epoch) {
                epoch_metrics.loss = p.loss;
                epoch_metrics.accuracy = p.accuracy;
                epoch_metrics.samples = seen;
                if (o->validation) {
                    castor_metrics v;
                    if ((rc = evaluate(m, o->validation, o->batch_size, &v, 0)))
                        break;
                    p.val_loss = v.loss;
                    p.val_accuracy = v.accuracy;
                }
                p.epoch_end = 1;
            }
            p.seconds = castor__now() - t0;
            if (o->progress && o->progress(o->progress_user, &p))
                stop = asked_to_stop = 1;
            if (freed_during(m, "progress callback")) {
                rc = CASTOR_MISUSE;
                break;
            }
            if (o->max_steps && steps_done >= o->max_steps)
                stop = 1;
            if (stop || last_of_epoch)
                break;
        }
    }
    datasets_in_use(train, o, -1);
    staging_free(&st);
    free(perm);
    if (last_epoch)
        *last_epoch = epoch_metrics;
    if (!rc && asked_to_stop)
        rc = castor__model_fail(m, CASTOR_INTERRUPTED, "fit: stopped after step %lld",
                                (long long)m->step);
    return finish_running(m, rc);
}

int castor_model_set_stop_check(castor_model *m, castor_stop_fn fn, void *user)
{
    if (!m)
        return CASTOR_MISUSE;
    m->stop_check = fn;
    m->stop_user = user;
    return CASTOR_OK;
}

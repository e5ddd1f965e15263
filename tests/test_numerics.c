/*
 * Training semantics end to end, through the public API, against an
 * independent double-precision forward and backward pass: one plain SGD
 * step moves the variables by the learning rate times the mean gradient of
 * the batch, whatever the batch size, the short last batch, the strategy
 * and however the rows are split between replicas; evaluate's loss and
 * accuracy, and fit's after every step, are per-sample means over a dataset
 * that is not a multiple of the batch.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "numerics_support.h"
#include "support.h"
#include "src/model.h"

#define MAXW 16

/* d act / d z, from z. */
static double act_dz(castor_activation a, double z)
{
    switch (a) {
    case CASTOR_ACT_RELU: return z > 0 ? 1 : 0;
    case CASTOR_ACT_TANH: return 1 - tanh(z) * tanh(z);
    case CASTOR_ACT_SIGMOID: {
        double s = 1.0 / (1.0 + exp(-z));
        return s * (1 - s);
    }
    default: return 1;
    }
}

/* The model's variables, as the double reference reads them (malloc'd). */
static double *params_as_doubles(castor_model *m)
{
    size_t np = castor_model_num_params(m);
    float *pf = malloc(np * sizeof(float));
    double *p = malloc(np * sizeof(double));
    cr_assert(pf && p);
    cr_assert_eq(castor_model_get_params(m, pf, np), CASTOR_OK);
    for (size_t i = 0; i < np; i++)
        p[i] = pf[i];
    free(pf);
    return p;
}

/* The loss of sample i and (if grad) its gradient, added to grad with
 * weight w; returns the loss. *hit: the first maximum is the label. */
static double ref_sample(const castor_model *m, const double *p, const data *d, int i,
                         double *grad, double w, int *hit)
{
    double z[8][MAXW], a[9][MAXW];
    int L = m->n_layers;
    for (int j = 0; j < NF; j++)
        a[0][j] = d->x[i * NF + j];
    for (int l = 0; l < L; l++) {
        const castor__layer *lay = &m->layers[l];
        for (int o = 0; o < lay->out; o++) {
            double s = p[lay->b_off + (size_t)o];
            for (int k = 0; k < lay->in; k++)
                s += a[l][k] * p[lay->w_off + (size_t)k * (size_t)lay->out + (size_t)o];
            z[l][o] = s;
            a[l + 1][o] = support_activation(lay->act, s);
        }
    }
    int out = m->layers[L - 1].out;
    const double *y = a[L];
    double loss, dy[MAXW];
    if (m->loss == CASTOR_LOSS_SOFTMAX_XENT) {
        int best = 0;
        for (int c = 1; c < out; c++)
            if (y[c] > y[best])
                best = c;
        *hit = best == d->labels[i];
        double s = 0;
        for (int c = 0; c < out; c++)
            s += exp(y[c] - y[best]);
        loss = log(s) + y[best] - y[d->labels[i]];
        for (int c = 0; c < out; c++)
            dy[c] = exp(y[c] - y[best]) / s - (c == d->labels[i]);
    } else {
        *hit = 0;
        loss = 0;
        for (int c = 0; c < out; c++) {
            double e = y[c] - d->targets[i * NC + c];
            loss += e * e / out;
            dy[c] = 2 * e / out;
        }
    }
    if (!grad)
        return loss;
    for (int l = L - 1; l >= 0; l--) {
        const castor__layer *lay = &m->layers[l];
        double dz[MAXW], below[MAXW] = {0};
        for (int o = 0; o < lay->out; o++)
            dz[o] = dy[o] * act_dz(lay->act, z[l][o]);
        for (int o = 0; o < lay->out; o++) {
            grad[lay->b_off + (size_t)o] += w * dz[o];
            for (int k = 0; k < lay->in; k++) {
                size_t at = lay->w_off + (size_t)k * (size_t)lay->out + (size_t)o;
                grad[at] += w * a[l][k] * dz[o];
                below[k] += p[at] * dz[o];
            }
        }
        memcpy(dy, below, sizeof dy);
    }
    return loss;
}

/* One training step at a time against the reference: the variables before
 * the step (as floats, and as doubles in p), after it, and g, the reference
 * gradient at "before" of the rows the step trained on (their mean). */
typedef struct {
    castor_model *m;
    const castor_dataset *ds;
    const data *d;
    castor_fit_options fo;
    size_t np;
    float *before, *after;
    double *p, *g;
} stepper;

static void stepper_init(stepper *st, castor_model *m, const castor_dataset *ds, const data *d,
                         int batch)
{
    *st = (stepper){.m = m, .ds = ds, .d = d, .np = castor_model_num_params(m)};
    st->fo = (castor_fit_options)CASTOR_FIT_OPTIONS_INIT;
    st->fo.batch_size = batch;
    st->fo.shuffle = 0;
    st->fo.max_steps = 1;
    st->before = malloc(st->np * sizeof(float));
    st->after = malloc(st->np * sizeof(float));
    st->p = malloc(st->np * sizeof(double));
    st->g = malloc(st->np * sizeof(double));
    cr_assert(st->before && st->after && st->p && st->g);
    cr_assert_eq(castor_model_get_params(m, st->before, st->np), CASTOR_OK);
}

/* Trains one step (the rows first..first+rows-1, unshuffled) and fills
 * after, p and g; the next call starts from this one's "after". */
static void stepper_step(stepper *st, int first, int rows)
{
    cr_assert_eq(castor_model_fit(st->m, st->ds, &st->fo, NULL), CASTOR_OK, "%s",
                 castor_model_errmsg(st->m));
    cr_assert_eq(castor_model_get_params(st->m, st->after, st->np), CASTOR_OK);
    for (size_t i = 0; i < st->np; i++)
        st->p[i] = st->before[i], st->g[i] = 0;
    int hit;
    for (int i = first; i < first + rows; i++)
        ref_sample(st->m, st->p, st->d, i, st->g, 1.0 / rows, &hit);
    memcpy(st->before, st->after, st->np * sizeof(float));
}

static void stepper_free(stepper *st)
{
    free(st->before), free(st->after), free(st->p), free(st->g);
}

/* An epoch of plain SGD, one step at a time, each checked against
 * params - lr * (mean gradient over the step's rows). */
static void sgd_steps(const char *devices, castor_strategy_kind kind, const char *layers,
                      castor_loss loss, int batch)
{
    data d;
    numerics_make_data(&d, 3);
    castor_strategy *s = NULL;
    castor_model *m = numerics_make_model(devices, kind, layers, loss, &s);
    castor_dataset *ds = numerics_make_dataset(&d, loss);
    stepper st;
    stepper_init(&st, m, ds, &d, batch);
    for (int first = 0; first < NS; first += batch) {
        int rows = NS - first < batch ? NS - first : batch;
        stepper_step(&st, first, rows);
        for (size_t i = 0; i < st.np; i++) {
            double want = st.p[i] - 0.5 * st.g[i];
            double step = (double)st.after[i] - st.p[i], want_step = want - st.p[i];
            cr_assert(fabs(step - want_step) <= 1e-4 * fmax(fabs(want_step), 1e-2) + 1e-6,
                      "%s %s, batch %d, rows %d..%d: variable %zu moved %.8g, want %.8g",
                      devices, castor_strategy_kind_name(kind), batch, first, first + rows - 1,
                      i, step, want_step);
        }
    }
    stepper_free(&st);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

static const char *const device_lists[] = {"cpu", "cpu:3", "cpu:1x3", "cpu:2x2"};

Test(numerics, sgd_step_is_the_batch_mean_gradient_xent)
{
    for (size_t i = 0; i < sizeof device_lists / sizeof *device_lists; i++)
        for (int k = 0; k < 2; k++)
            for (int batch = 4; batch <= NS; batch += NS - 4)
                sgd_steps(device_lists[i], (castor_strategy_kind)k, "7:tanh,6:relu,3",
                          CASTOR_LOSS_SOFTMAX_XENT, batch);
}

Test(numerics, sgd_step_is_the_batch_mean_gradient_mse)
{
    for (size_t i = 0; i < sizeof device_lists / sizeof *device_lists; i++)
        for (int k = 0; k < 2; k++)
            for (int batch = 4; batch <= NS; batch += NS - 4)
                sgd_steps(device_lists[i], (castor_strategy_kind)k, "6:sigmoid,3:tanh",
                          CASTOR_LOSS_MSE, batch);
}

/* evaluate: the mean loss and the fraction correct over every sample, the
 * short last batch and replicas without rows included. */
static void evaluate_means(const char *devices, castor_strategy_kind kind, castor_loss loss,
                           int batch)
{
    data d;
    numerics_make_data(&d, 4);
    castor_strategy *s = NULL;
    const char *layers = loss == CASTOR_LOSS_MSE ? "6:relu,3:sigmoid" : "6:relu,3";
    castor_model *m = numerics_make_model(devices, kind, layers, loss, &s);
    castor_dataset *ds = numerics_make_dataset(&d, loss);
    double *p = params_as_doubles(m);
    double loss_sum = 0;
    int hits = 0;
    for (int i = 0; i < NS; i++) {
        int hit;
        loss_sum += ref_sample(m, p, &d, i, NULL, 0, &hit);
        hits += hit;
    }
    castor_metrics got;
    cr_assert_eq(castor_model_evaluate(m, ds, batch, &got), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    cr_assert_eq(got.samples, NS);
    cr_assert(fabs(got.loss - loss_sum / NS) <= 1e-5 * fmax(1, loss_sum / NS),
              "%s batch %d: loss %.9g, want %.9g", devices, batch, got.loss, loss_sum / NS);
    if (loss == CASTOR_LOSS_MSE)
        cr_assert(isnan(got.accuracy));
    else
        cr_assert(got.accuracy == (double)hits / NS, "%s batch %d: accuracy %.9g, want %d/%d",
                  devices, batch, got.accuracy, hits, NS);
    free(p);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(numerics, evaluate_is_the_mean_over_every_sample)
{
    for (size_t i = 0; i < sizeof device_lists / sizeof *device_lists; i++)
        for (int k = 0; k < 2; k++)
            for (int batch = 4; batch <= 20; batch += 3) {
                evaluate_means(device_lists[i], (castor_strategy_kind)k,
                               CASTOR_LOSS_SOFTMAX_XENT, batch);
                evaluate_means(device_lists[i], (castor_strategy_kind)k, CASTOR_LOSS_MSE, batch);
            }
}

/* fit's reported loss and accuracy, after every step and for the epoch, are
 * the means over the samples trained so far: the rows of a replica with
 * fewer rows, or none, count once each, not as a replica's share. A rate
 * too small to move the variables keeps every step at the compiled ones. */
typedef struct seen_steps {
    int n;
    double loss[NS], accuracy[NS];
} seen_steps;

static int keep_step(void *user, const castor_progress *p)
{
    seen_steps *s = user;
    cr_assert(s->n < NS);
    s->loss[s->n] = p->loss;
    s->accuracy[s->n++] = p->accuracy;
    return 0;
}

static void fit_means(const char *devices, castor_strategy_kind kind, castor_loss loss,
                      int batch)
{
    data d;
    numerics_make_data(&d, 8);
    castor_strategy *s = NULL;
    castor_model *m = numerics_make_model_lr(devices, kind, "6:tanh,3", loss, 1e-30f, &s);
    castor_dataset *ds = numerics_make_dataset(&d, loss);
    double *p = params_as_doubles(m);
    seen_steps seen = {0};
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = batch;
    fo.shuffle = 0;
    fo.progress = keep_step;
    fo.progress_user = &seen;
    castor_metrics epoch;
    cr_assert_eq(castor_model_fit(m, ds, &fo, &epoch), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(seen.n, (NS + batch - 1) / batch);
    double loss_sum = 0;
    int hits = 0;
    for (int i = 0; i < NS; i++) {
        int hit;
        loss_sum += ref_sample(m, p, &d, i, NULL, 0, &hit);
        hits += hit;
        int done = i + 1, step = i / batch;
        if (done % batch != 0 && done != NS)
            continue;
        double want = loss_sum / done;
        cr_assert(fabs(seen.loss[step] - want) <= 1e-5 * fmax(1, want),
                  "%s %s batch %d, step %d: loss %.9g, want %.9g over %d samples", devices,
                  castor_strategy_kind_name(kind), batch, step + 1, seen.loss[step], want, done);
        if (loss == CASTOR_LOSS_SOFTMAX_XENT)
            cr_assert(seen.accuracy[step] == (double)hits / done,
                      "%s %s batch %d, step %d: accuracy %.9g, want %d/%d", devices,
                      castor_strategy_kind_name(kind), batch, step + 1, seen.accuracy[step],
                      hits, done);
        else
            cr_assert(isnan(seen.accuracy[step]));
    }
    cr_assert_eq(epoch.samples, NS);
    cr_assert(epoch.loss == seen.loss[seen.n - 1]);
    cr_assert(loss == CASTOR_LOSS_MSE || epoch.accuracy == seen.accuracy[seen.n - 1]);
    free(p);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(numerics, fit_metrics_are_the_mean_over_every_sample)
{
    /* 4: a short last batch of 3 rows (one replica of cpu:2x2 gets none);
     * 6: 2 rows over 3 and 4 replicas at the end; 16: one batch, larger
     * than the data. */
    static const int batches[] = {4, 6, 16};
    for (size_t i = 0; i < sizeof device_lists / sizeof *device_lists; i++)
        for (int k = 0; k < 2; k++)
            for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
                fit_means(device_lists[i], (castor_strategy_kind)k, CASTOR_LOSS_SOFTMAX_XENT,
                          batches[b]);
                fit_means(device_lists[i], (castor_strategy_kind)k, CASTOR_LOSS_MSE,
                          batches[b]);
            }
}

/* An epoch trains on every sample exactly once, shuffled or not, whatever
 * the batch: with a learning rate too small to move any variable, fit's
 * epoch loss and accuracy are then evaluate's, over all NS samples. A
 * shuffle that repeated one sample and dropped another, or an epoch that
 * dropped a last batch of one row (NS = 5 * 2 + 1 = 2 * 5 + 1), changes them. */
static void epoch_sees_every_sample(const char *devices, castor_strategy_kind kind, int batch,
                                    int shuffle)
{
    data d;
    numerics_make_data(&d, 10);
    castor_strategy *s = NULL;
    castor_model *m = numerics_make_model_lr(devices, kind, "6:tanh,3", CASTOR_LOSS_SOFTMAX_XENT,
                                             1e-30f, &s);
    castor_dataset *ds = numerics_make_dataset(&d, CASTOR_LOSS_SOFTMAX_XENT);
    castor_metrics all;
    cr_assert_eq(castor_model_evaluate(m, ds, NS, &all), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = batch;
    fo.shuffle = shuffle;
    int64_t steps = (NS + batch - 1) / batch;
    /* One fit per epoch: each epoch has a shuffle of its own. */
    for (int e = 1; e <= 3; e++) {
        castor_metrics got;
        cr_assert_eq(castor_model_fit(m, ds, &fo, &got), CASTOR_OK, "%s",
                     castor_model_errmsg(m));
        cr_assert_eq(castor_model_epoch(m), e);
        cr_assert_eq(castor_model_step(m), e * steps, "%s batch %d: %lld steps after %d epochs",
                     devices, batch, (long long)castor_model_step(m), e);
        cr_assert_eq(got.samples, NS, "%s batch %d: the epoch saw %zu samples", devices, batch,
                     got.samples);
        cr_assert(fabs(got.loss - all.loss) <= 1e-6 * all.loss,
                  "%s %s batch %d shuffle %d epoch %d: loss %.9g, over every sample %.9g",
                  devices, castor_strategy_kind_name(kind), batch, shuffle, e, got.loss,
                  all.loss);
        cr_assert(got.accuracy == all.accuracy, "%s batch %d epoch %d: accuracy %.9g, want %.9g",
                  devices, batch, e, got.accuracy, all.accuracy);
    }
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(numerics, an_epoch_trains_on_every_sample_once)
{
    static const int batches[] = {2, 4, 5, NS};  /* 2 and 5 end on a batch of one */
    for (int k = 0; k < 2; k++)
        for (size_t b = 0; b < sizeof batches / sizeof *batches; b++)
            for (int shuffle = 0; shuffle < 2; shuffle++)
                epoch_sees_every_sample("cpu:2", (castor_strategy_kind)k, batches[b], shuffle);
}

/* Several steps of each optimizer through fit against the textbook update
 * on the reference gradient: the step count behind Adam's bias correction,
 * the velocity and the moments carried from step to step, across epochs. */
static void optimizer_steps(const char *devices, castor_strategy_kind kind, castor_optimizer opt)
{
    data d;
    numerics_make_data(&d, 6);
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, kind, devices, NULL), CASTOR_OK);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, NF), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "6:tanh,3"), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 9), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    castor_dataset *ds = numerics_make_dataset(&d, CASTOR_LOSS_SOFTMAX_XENT);
    stepper st;
    stepper_init(&st, m, ds, &d, 4);
    size_t np = st.np;
    const double *p = st.p, *g = st.g;
    double *s0 = calloc(np, sizeof(double)), *s1 = calloc(np, sizeof(double));
    cr_assert(s0 && s1);
    double lr = opt.learning_rate;
    for (int t = 1; t <= 9; t++) {
        int first = ((t - 1) % 3) * 4, rows = first == 8 ? 3 : 4;
        stepper_step(&st, first, rows);
        for (size_t i = 0; i < np; i++) {
            double want = p[i];
            if (opt.kind == CASTOR_OPT_SGD) {
                s0[i] = opt.momentum * s0[i] - lr * g[i];
                want += opt.nesterov ? opt.momentum * s0[i] - lr * g[i] : s0[i];
            } else {
                double b1 = opt.beta1, b2 = opt.beta2;
                if (opt.kind == CASTOR_OPT_ADAMW)
                    want -= lr * opt.weight_decay * want;
                s0[i] = b1 * s0[i] + (1 - b1) * g[i];
                s1[i] = b2 * s1[i] + (1 - b2) * g[i] * g[i];
                double mh = s0[i] / (1 - pow(b1, t)), vh = s1[i] / (1 - pow(b2, t));
                want -= lr * mh / (sqrt(vh) + opt.epsilon / sqrt(1 - pow(b2, t)));
            }
            double step = (double)st.after[i] - p[i], want_step = want - p[i];
            cr_assert(fabs(step - want_step) <= 1e-3 * fmax(fabs(want_step), 0.1 * lr),
                      "%s %s %s step %d: variable %zu moved %.8g, want %.8g", devices,
                      castor_strategy_kind_name(kind), castor_optimizer_kind_name(opt.kind), t,
                      i, step, want_step);
        }
    }
    stepper_free(&st);
    free(s0), free(s1);
    castor_dataset_free(ds);
    castor_model_free(m);
    castor_strategy_free(s);
}

Test(numerics, optimizers_step_by_step)
{
    castor_optimizer opts[5] = {
        castor_optimizer_defaults(CASTOR_OPT_SGD), castor_optimizer_defaults(CASTOR_OPT_SGD),
        castor_optimizer_defaults(CASTOR_OPT_ADAM), castor_optimizer_defaults(CASTOR_OPT_ADAMW),
        castor_optimizer_defaults(CASTOR_OPT_ADAM)};
    opts[0].momentum = 0.9f, opts[0].learning_rate = 0.1f;
    opts[1].momentum = 0.8f, opts[1].nesterov = 1, opts[1].learning_rate = 0.1f;
    opts[2].learning_rate = 0.01f;
    opts[3].learning_rate = 0.01f, opts[3].weight_decay = 0.3f;
    opts[4].learning_rate = 0.01f, opts[4].beta1 = 0.5f, opts[4].beta2 = 0.7f;
    opts[4].epsilon = 1e-3f;
    for (size_t i = 0; i < sizeof device_lists / sizeof *device_lists; i++)
        for (int k = 0; k < 2; k++)
            for (int o = 0; o < 5; o++)
                optimizer_steps(device_lists[i], (castor_strategy_kind)k, opts[o]);
}

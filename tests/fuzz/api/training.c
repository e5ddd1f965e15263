/*
 * fit, evaluate and predict: the statuses castor.h names for each, the steps
 * taken, and evaluate against predict.
 */
#include <limits.h>
#include <math.h>

#include "tests/fuzz/api/harness.h"

/* What castor.h says fit, evaluate refuse of the data: the codes. */
static unsigned data_refusal(const hmodel *M, int d)
{
    if (d < 0)
        return B(CASTOR_MISUSE);
    const hdata *D = &datas[d];
    if (!D->ok)
        return B(CASTOR_INVALID);
    unsigned f = 0;
    if (D->features != M->features)
        f |= B(CASTOR_MISMATCH);
    if (M->loss == CASTOR_LOSS_SOFTMAX_XENT) {
        if (!D->labels || D->num_classes > out_units(M))
            f |= B(CASTOR_MISMATCH);
    } else if (D->labels || D->tdim != out_units(M)) {
        f |= B(CASTOR_MISMATCH);
    }
    return f;
}

/* A dataset slot, or -1 (NULL); with the byte's top bit, the first from
 * there that M takes. */
static int some_data(const hmodel *M)
{
    unsigned b = u8();
    int d = (int)(b % (ND + 1));
    for (int i = 0; (b & 0x80) && M->compiled && !M->unknown && i < ND; i++) {
        int k = (d + i) % ND;
        if (datas[k].h && !data_refusal(M, k)) {
            d = k;
            break;
        }
    }
    return d < ND && datas[d].h ? d : -1;
}

void op_fit(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    int d = some_data(M);
    castor_fit_options o = CASTOR_FIT_OPTIONS_INIT;
    unsigned flags = u8();
    int with_opts = !(flags & 1);
    static const int epochs[] = {1, 2, 1, 3, 0, -1};
    static const int batches[] = {1, 2, 3, 4, 5, 8, 32, 0, -1, INT_MAX};
    static const int64_t max_steps[] = {0, 0, 1, 2, 3, -1};
    int v = -1;
    if (with_opts) {
        o.epochs = epochs[pick(6)];
        o.batch_size = batches[pick(10)];
        o.shuffle = (flags & 2) != 0;
        o.max_steps = max_steps[pick(6)];
        v = flags & 4 ? some_data(M) : -1;
        o.validation = v >= 0 ? datas[v].h : NULL;
    }
    run_ctx rc = {.model = m, .train = d, .val = v, .is_fit = 1, .epochs = o.epochs};
    if (with_opts && (flags & 8)) {
        o.progress = progress_fn;
        o.progress_user = &rc;
    }
    /* The refusals castor.h names. */
    unsigned want = 0, maybe = 0;
    int replicas = M->compiled ? strats[M->strat].replicas : 1;
    size_t n = d >= 0 && datas[d].ok ? datas[d].n : 0;
    position p0 = position_of(M);
    if (!M->compiled || model_busy(m) || d < 0)
        want |= B(CASTOR_MISUSE);
    if (M->compiled) {
        want |= data_refusal(M, d);
        if (M->nf_params == 1 || M->nf_state == 1)
            want |= B(CASTOR_INVALID);
        if (M->nf_params < 0 || M->nf_state < 0)
            maybe |= B(CASTOR_INVALID);
        if (o.epochs <= 0 || o.batch_size <= 0 || o.batch_size < replicas || o.max_steps < 0)
            want |= B(CASTOR_INVALID);
        if (v >= 0)
            want |= data_refusal(M, v);
        if (p0.sie > 0 && n && o.batch_size > 0) {
            int64_t spe = (int64_t)((n + (size_t)o.batch_size - 1) / (size_t)o.batch_size);
            if (!M->ep.known)
                maybe |= B(CASTOR_MISMATCH);
            else if (o.batch_size != M->ep.batch ||
                     (M->ep.samples && M->ep.samples != n) || M->ep.shuffle != !!o.shuffle ||
                     p0.sie >= spe)
                want |= B(CASTOR_MISMATCH);
        }
    }
    if (M->unknown) {
        want = 0;
        maybe = ~0u;
    }
    rc.step0 = p0.step;
    rc.epoch0 = p0.epoch;
    rc.xent = M->unknown ? -1 : M->loss == CASTOR_LOSS_SOFTMAX_XENT;  /* -1: unknown */
    rc.has_val = v >= 0;
    rc.spe = o.batch_size > 0 ? (int64_t)((n + (size_t)o.batch_size - 1) / (size_t)o.batch_size)
                              : 0;
    castor_metrics last = {1, 1, 12345};
    run_push(&rc);
    int status = castor_model_fit(M->h, d >= 0 ? datas[d].h : NULL, with_opts ? &o : NULL,
                                  &last);
    run_pop(&rc, status);
    if (!models[m].h || rc.freed)
        return;  /* freed, or detached, from its callbacks: checked by run_pop */
    expect(status, run_allowed(M, &rc, want) | maybe, "fit", mmsg(M));
    position p1 = position_of(M);
    int64_t steps = p1.step - p0.step;
    if (status != CASTOR_OK && status != CASTOR_INTERRUPTED) {
        CHECK(steps == 0, "a refused fit took %lld steps", (long long)steps);
        CHECK(isnan(last.loss) && isnan(last.accuracy) && last.samples == 0, "last_epoch");
        return;
    }
    M->stats_steps += steps;
    if (p1.sie > 0 && steps > 0)
        M->ep = (epoch_state){.known = 1, .batch = o.batch_size, .shuffle = !!o.shuffle,
                              .samples = n};
    int64_t spe = rc.spe;
    int64_t full = (spe - p0.sie) + (int64_t)(o.epochs - 1) * spe;
    if (status == CASTOR_OK) {
        int64_t expect_steps = o.max_steps && o.max_steps < full ? o.max_steps : full;
        CHECK(steps == expect_steps, "fit took %lld steps, not %lld", (long long)steps,
              (long long)expect_steps);
        if (expect_steps == full)
            CHECK(p1.sie == 0 && p1.epoch == p0.epoch + o.epochs, "epoch %lld after %lld + %d",
                  (long long)p1.epoch, (long long)p0.epoch, o.epochs);
    } else {
        CHECK(steps <= full, "an interrupted fit took %lld steps of %lld", (long long)steps,
              (long long)full);
    }
    CHECK(!(rc.stopped && status == CASTOR_OK), "fit went on after a stop");
    if (o.progress)
        CHECK(steps == rc.progress_calls, "%lld steps, %d progress calls", (long long)steps,
              rc.progress_calls);
    if (rc.stopped_by_check && status == CASTOR_INTERRUPTED)
        CHECK(steps == rc.stop_calls - 1, "stopped at stop check %d after %lld steps",
              rc.stop_calls, (long long)steps);
    if (M->stop_check && status == CASTOR_OK)
        CHECK(rc.stop_calls >= steps, "stop check called %d times for %lld steps",
              rc.stop_calls, (long long)steps);
    int64_t ended = p1.epoch - p0.epoch;
    if (ended == 0)
        CHECK(isnan(last.loss) && isnan(last.accuracy) && last.samples == 0,
              "last_epoch of a fit that ended no epoch");
    else
        CHECK(last.samples > 0 && last.samples <= n &&
                  (rc.xent < 0 ||
                   (rc.xent ? last.accuracy >= 0 && last.accuracy <= 1 : isnan(last.accuracy))),
              "last_epoch {%g, %g, %zu}", last.loss, last.accuracy, last.samples);
    check_finite(M, "fit");
    check_stats(M);
}

/* A batch size for evaluate or predict: mostly good, some refused. */
static int pick_batch(void)
{
    static const int batches[] = {1, 2, 3, 4, 32, 0, -1, INT_MAX};
    return batches[pick(8)];
}

/* castor.h: a batch of no samples, or fewer than the replicas, is refused. */
static int batch_refused(const hmodel *M, int batch)
{
    return batch <= 0 || batch < strats[M->strat].replicas;
}

/* evaluate's loss and accuracy against predict's outputs for the same
 * samples (castor.h: mean loss per sample; softmax cross-entropy from
 * logits; MSE averaged over outputs). */
static void check_evaluation(hmodel *M, int m, const hdata *D, const castor_metrics *met,
                             int batch)
{
    int outs = out_units(M);
    if (model_busy(m) || M->stop_check || M->unknown || outs > MAX_U || D->features > MAX_F)
        return;
    float pred[MAX_N * MAX_U];
    int replicas = strats[M->strat].replicas;
    int b2 = (int)D->n > replicas ? (int)D->n : replicas;
    int rc = castor_model_predict(M->h, castor_dataset_x(D->h), D->n, b2, pred);
    if (rc == CASTOR_DEVICE_MEMORY && small_budget(M->strat))
        return;
    expect(rc, B(CASTOR_OK), "predict for evaluate", mmsg(M));
    double loss = 0, correct = 0;
    int ties = 0;
    for (size_t i = 0; i < D->n; i++) {
        const float *z = pred + i * (size_t)outs;
        if (M->loss == CASTOR_LOSS_MSE) {
            double se = 0;
            for (int j = 0; j < outs; j++) {
                double e = (double)z[j] - (double)D->target[i * (size_t)outs + (size_t)j];
                se += e * e;
            }
            loss += se / outs;
            continue;
        }
        int best = 0;
        double mx = z[0];
        for (int j = 1; j < outs; j++)
            if (z[j] > mx) {
                mx = z[j];
                best = j;
            }
        double sum = 0;
        for (int j = 0; j < outs; j++) {
            sum += exp((double)z[j] - mx);
            ties += j != best && z[j] == z[best];
        }
        loss += log(sum) + (mx - (double)z[D->label[i]]);  /* exact for huge equal logits */
        correct += best == D->label[i];
    }
    loss /= (double)D->n;
    if (!isfinite(loss) || !isfinite(met->loss))
        return;
    CHECK(fabs(loss - met->loss) <= 1e-4 * (1 + fabs(loss)),
          "evaluate at batch %d says loss %.9g, its predictions %.9g", batch, met->loss, loss);
    if (M->loss == CASTOR_LOSS_SOFTMAX_XENT && !ties)
        CHECK(fabs(correct / (double)D->n - met->accuracy) < 1e-9,
              "evaluate at batch %d says accuracy %g, its predictions %g", batch,
              met->accuracy, correct / (double)D->n);
}

void op_evaluate(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    int d = some_data(M);
    int batch = pick_batch();
    unsigned want = 0;
    if (!M->compiled || model_busy(m) || d < 0)
        want |= B(CASTOR_MISUSE);
    if (M->compiled) {
        want |= data_refusal(M, d);
        if (batch_refused(M, batch))
            want |= B(CASTOR_INVALID);
    }
    if (M->unknown)
        want = ~0u;
    run_ctx rc = {.model = m, .train = d, .val = -1};
    castor_metrics out = {7, 7, 7};
    run_push(&rc);
    int status = castor_model_evaluate(M->h, d >= 0 ? datas[d].h : NULL, batch, &out);
    run_pop(&rc, status);
    if (!models[m].h || rc.freed)
        return;
    expect(status, run_allowed(M, &rc, want), "evaluate", mmsg(M));
    if (status != CASTOR_OK) {
        CHECK(out.loss == 7 && out.accuracy == 7 && out.samples == 7, "a failed evaluate's out");
        return;
    }
    CHECK(!rc.stopped, "evaluate went on after its stop check said stop");
    const hdata *D = &datas[d];
    CHECK(out.samples == D->n, "evaluated %zu of %zu", out.samples, D->n);
    CHECK(M->unknown || (M->loss == CASTOR_LOSS_SOFTMAX_XENT
                             ? out.accuracy >= 0 && out.accuracy <= 1
                             : isnan(out.accuracy)),
          "accuracy %g", out.accuracy);
    CHECK(!M->sane || (isfinite(out.loss) && out.loss >= 0), "loss %g", out.loss);
    if (M->stop_check)
        CHECK(rc.stop_calls == (int)((D->n + (size_t)batch - 1) / (size_t)batch),
              "%d stop checks", rc.stop_calls);
    check_evaluation(M, m, D, &out, batch);
}

void op_predict(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M || M->features <= 0 || M->features > MAX_F ||
        out_units(M) > MAX_U)
        return;
    size_t n = (size_t)pick(MAX_N + 1);
    int batch = pick_batch();
    unsigned nulls = u8();
    float x[MAX_N * MAX_F + 1];
    size_t outs = (size_t)(out_units(M) > 0 ? out_units(M) : 1);
    float out[MAX_N * MAX_U + 1], out2[MAX_N * MAX_U + 1];
    for (size_t i = 0; i < n * (size_t)M->features; i++)
        x[i] = unit();
    for (size_t i = 0; i < n * outs + 1; i++)
        out[i] = out2[i] = -7777.0f;
    int null_x = (nulls & 0xf0) == 0xf0, null_out = (nulls & 0x0f) == 0x0f;
    unsigned want = 0;
    if (!M->compiled || model_busy(m) || null_x || null_out)
        want |= B(CASTOR_MISUSE);
    if (M->compiled && batch_refused(M, batch))
        want |= B(CASTOR_INVALID);
    run_ctx rc = {.model = m, .train = -1, .val = -1};
    run_push(&rc);
    int status = castor_model_predict(M->h, null_x ? NULL : x, n, batch, null_out ? NULL : out);
    run_pop(&rc, status);
    if (!models[m].h || rc.freed)
        return;
    expect(status, run_allowed(M, &rc, want), "predict", mmsg(M));
    CHECK(!(rc.stopped && status == CASTOR_OK), "predict went on after a stop");
    CHECK(out[n * outs] == -7777.0f, "predict wrote past its n x outputs");
    /* castor.h: stopped, out holds the batches done before the stop. */
    size_t done = n;
    if (status == CASTOR_INTERRUPTED) {
        size_t rows = (size_t)batch < n ? (size_t)batch : n;
        done = (size_t)(rc.stop_calls - 1) * rows;
        CHECK(rc.stopped_by_check && done < n, "predict stopped at check %d of its %zu rows",
              rc.stop_calls, n);
    } else if (status != CASTOR_OK) {
        return;
    }
    for (size_t i = 0; i < done * outs; i++)
        CHECK(!M->sane || isfinite(out[i]), "a sane model predicted %g", (double)out[i]);
    /* The same samples at another batch size: the same outputs, to rounding. */
    if (!M->sane || done == 0 || model_busy(m) || !M->compiled)
        return;
    int batch2 = (int)n;
    if (batch2 < strats[M->strat].replicas)
        return;
    if (M->stop_check)
        castor_model_set_stop_check(M->h, NULL, NULL);
    status = castor_model_predict(M->h, x, n, batch2, out2);
    if (M->stop_check)
        castor_model_set_stop_check(M->h, stop_fn, (void *)&slot_ids[m]);
    if (status == CASTOR_DEVICE_MEMORY && small_budget(M->strat))
        return;
    expect(status, B(CASTOR_OK), "predict again", mmsg(M));
    for (size_t i = 0; i < done * outs; i++)
        CHECK(fabsf(out[i] - out2[i]) <= 1e-4f * (1 + fabsf(out[i])),
              "predict at batch %d and %d: %g and %g", batch, batch2, (double)out[i],
              (double)out2[i]);
}

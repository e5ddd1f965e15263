/*
 * The harness's account of each handle (hstrat, hmodel, hdata), what it expects
 * of a call (expect), and the checks that compare the model with the account.
 */
#include <math.h>
#include <string.h>

#include "tests/fuzz/api/harness.h"

hstrat strats[NS];
hmodel models[NM];
hdata datas[ND];
run_ctx *runs[8];
int n_runs;
int cb_depth;
const int slot_ids[NM] = {0, 1, 2};

int model_busy(int m)
{
    for (int i = 0; i < n_runs; i++)
        if (runs[i]->model == m)
            return 1;
    return 0;
}

/* A model or its strategy freed from a callback: its running calls stop
 * (castor.h), and run_pop checks that they say so. */
void runs_freed(int m)
{
    for (int i = 0; i < n_runs; i++)
        if (runs[i]->model == m)
            runs[i]->freed = 1;
}

int strat_busy(int s)
{
    for (int i = 0; i < n_runs; i++) {
        const hmodel *M = &models[runs[i]->model];
        if (M->compiled && M->strat == s)
            return 1;
    }
    return 0;
}

int data_busy(int d)
{
    for (int i = 0; i < n_runs; i++)
        if (runs[i]->train == d || runs[i]->val == d)
            return 1;
    return 0;
}

int errmsg_ok(const char *msg)
{
    return msg && msg[0] && strcmp(msg, "no error") != 0;
}

/* A status in the set `want`; a failure with a message on the handle. */
/* FUZZ_API_TRACE=1 in the environment: every checked call on stderr. */
int trace;

void expect(int rc, unsigned want, const char *what, const char *msg)
{
    if (trace)
        fprintf(stderr, "%*s%s -> %d%s%s\n", 2 * cb_depth, "", what, rc, rc ? ": " : "",
                rc && msg ? msg : "");
    if (!(want & B(rc)))
        FAIL("%s returned %d (%s): %s; expected the set 0x%x", what, rc, castor_errstr(rc),
             msg ? msg : "(no handle)", want);
    if (rc != CASTOR_OK && msg && !errmsg_ok(msg))
        FAIL("%s returned %d with no message ('%s')", what, rc, msg);
}

const char *mmsg(const hmodel *M)
{
    return castor_model_errmsg(M->h);
}

/* ---- helpers ---------------------------------------------------------- */

int small_budget(int s)
{
    return strats[s].budget && strats[s].budget < SMALL_BUDGET;
}

int out_units(const hmodel *M)
{
    return M->nl ? M->units[M->nl - 1] : 0;
}

/* The layers from layers_spec, into the account: the spec must parse back. */
void sync_layers(hmodel *M)
{
    char spec[4096];
    int rc = castor_model_layers_spec(M->h, spec, sizeof spec);
    CHECK(rc == CASTOR_OK, "layers_spec: %d", rc);
    int nl = castor_model_num_layers(M->h);
    CHECK(nl >= 0 && nl <= MAX_LF, "%d layers", nl);
    const char *p = spec;
    for (int l = 0; l < nl; l++) {
        char act[16];
        int units, used = 0;
        CHECK(sscanf(p, "%d:%15[a-z]%n", &units, act, &used) == 2, "spec '%s'", spec);
        castor_activation a = CASTOR_ACT_LINEAR;
        CHECK(castor_activation_parse(act, &a) == CASTOR_OK, "spec '%s'", spec);
        CHECK(strcmp(castor_activation_name(a), act) == 0, "spec '%s'", spec);
        M->units[l] = units;
        M->acts[l] = (int)a;
        p += used;
        CHECK(*p == (l + 1 < nl ? ',' : '\0'), "spec '%s'", spec);
        p += *p == ',';
    }
    M->nl = nl;
    size_t n = 0;
    int in = M->features;
    for (int l = 0; l < nl; l++) {
        n += (size_t)in * (size_t)M->units[l] + (size_t)M->units[l];
        in = M->units[l];
    }
    M->n_params = castor_model_num_params(M->h);
    CHECK(M->n_params == n, "%zu params, %zu by the layers", M->n_params, n);
    CHECK(castor_model_output_units(M->h) == out_units(M), "output units");
}

float *get_params(hmodel *M)
{
    float *p = malloc((M->n_params ? M->n_params : 1) * sizeof *p);
    if (!p)
        abort();
    int rc = castor_model_get_params(M->h, p, M->n_params);
    expect(rc, B(CASTOR_OK), "get_params", mmsg(M));
    return p;
}

/* castor.h: a call that fails leaves the model as it was. */
void check_params_unchanged(hmodel *M, const float *before, size_t count, const char *what)
{
    float *after = get_params(M);
    CHECK(memcmp(before, after, count * sizeof *after) == 0, "%s changed the variables", what);
    free(after);
}

/* The optimizer's values that compile accepts, as castor.h lists them. */
int opt_valid(const castor_optimizer *o)
{
    if ((int)o->kind < 0 || (int)o->kind > 2)
        return 0;
    if (!(o->learning_rate > 0) || !isfinite(o->learning_rate))
        return 0;
    if (o->kind == CASTOR_OPT_SGD) {
        if (!(o->momentum >= 0 && o->momentum < 1))
            return 0;
    } else {
        if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
            return 0;
        if (!(o->epsilon > 0) || !isfinite(o->epsilon))
            return 0;
        if (o->kind == CASTOR_OPT_ADAMW && (!(o->weight_decay >= 0) || !isfinite(o->weight_decay)))
            return 0;
        if (o->momentum != 0 || o->nesterov)
            return 0;
    }
    if (o->kind != CASTOR_OPT_ADAMW && o->weight_decay != 0)
        return 0;
    return 1;
}

/* Values with which finite data in [-1, 1] must keep the variables finite
 * for the few dozen steps an input runs. */
int lr_sane(float lr)
{
    return lr > 0 && lr <= 0.0101f;
}

int opt_sane(const castor_optimizer *o)
{
    if (!opt_valid(o) || !lr_sane(o->learning_rate))
        return 0;
    if (o->kind == CASTOR_OPT_SGD)
        return o->momentum <= 0.9f;
    return o->beta1 <= 0.9f && o->beta2 >= 0.99f && o->epsilon >= 1e-8f &&
           o->weight_decay <= 0.1f;
}

void model_detached(hmodel *M)
{
    M->compiled = 0;
    M->stats_steps = 0;
    M->last_peak = 0;
}


position position_of(const hmodel *M)
{
    position p = {castor_model_step(M->h), castor_model_epoch(M->h),
                  castor_model_step_in_epoch(M->h), castor_model_learning_rate(M->h)};
    return p;
}

void check_stats(hmodel *M)
{
    castor_run_stats st;
    int rc = castor_model_run_stats(M->h, &st);
    CHECK(rc == CASTOR_OK, "run_stats %d", rc);
    if (!M->compiled) {
        CHECK(st.steps == 0 && st.host_bytes == 0, "run_stats of a model not compiled: %lld",
              (long long)st.steps);
        return;
    }
    /* From a running fit's callbacks: with the steps it has taken so far. */
    int64_t steps = M->stats_steps;
    for (int i = 0; i < n_runs; i++)
        if (&models[runs[i]->model] == M && runs[i]->is_fit)
            steps += castor_model_step(M->h) - runs[i]->step0;
    CHECK(st.steps == steps, "run_stats.steps %lld, steps taken %lld", (long long)st.steps,
          (long long)steps);
    CHECK(st.seconds_total >= 0 && st.seconds_replicas >= 0, "run_stats seconds");
    /* castor.h: the variables and the optimizer state at least. */
    size_t slots = M->slots > 0 ? (size_t)M->slots : 0;
    CHECK(st.host_bytes >= M->n_params * sizeof(float) * (1 + slots), "host_bytes %zu",
          st.host_bytes);
    CHECK(st.device_peak_bytes == castor_model_device_peak_bytes(M->h), "peaks");
    CHECK(st.device_peak_bytes >= M->last_peak, "device_peak_bytes fell from %zu to %zu",
          M->last_peak, st.device_peak_bytes);
    M->last_peak = st.device_peak_bytes;
    /* Only the steps' traffic is counted (castor.h): none without a step, and
     * every step uploads its batch and reads results back. */
    CHECK(steps ? st.bytes_h2d > 0 && st.bytes_d2h > 0 : st.bytes_h2d == 0 && st.bytes_d2h == 0,
          "%lld steps moved %llu bytes up, %llu down", (long long)steps,
          (unsigned long long)st.bytes_h2d, (unsigned long long)st.bytes_d2h);
    const hstrat *S = &strats[M->strat];
    CHECK(S->kind != CASTOR_STRATEGY_CENTRAL || st.seconds_reduce == 0,
          "central's seconds_reduce %g", st.seconds_reduce);
    size_t budget = S->budget ? S->budget : (size_t)1 << 30;
    CHECK(st.device_peak_bytes <= budget, "peak %zu over the budget %zu", st.device_peak_bytes,
          budget);
}

/* Where the finite-data promise applies: every variable and optimizer value
 * finite. */
void check_finite(hmodel *M, const char *after)
{
    if (!M->compiled || !M->sane || M->zombie)
        return;
    int finite = -1;
    int rc = castor_model_all_finite(M->h, &finite);
    expect(rc, B(CASTOR_OK), "all_finite", mmsg(M));
    if (finite != 1)
        FAIL("a model trained at a sane rate on finite data is not finite after %s", after);
}

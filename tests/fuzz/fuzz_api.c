/*
 * libFuzzer harness: the public API (castor.h, nothing else of castor's)
 * driven through call sequences decoded from the input. A few strategies,
 * models, datasets and checkpoint files live in slots; each input byte
 * picks the next call and its arguments, good ones and bad ones, and fit's
 * progress callback and the stop check run calls of their own (the running
 * model's among them: what castor.h allows there, and what it says is
 * CASTOR_MISUSE there).
 *
 * Besides ASan, UBSan and LSan, what castor.h promises is checked, and a
 * broken promise aborts: a failure's message is never empty nor "no error";
 * the status of a call whose outcome the header decides is that one (the
 * harness keeps its own account of each handle: compiled or not, on which
 * strategy, the epoch in progress, ...); set_params then get_params, and
 * save then load or open, give the same bytes back; a load that fails
 * leaves the model as it was; a fit at a sane rate on finite data leaves
 * finite variables; run_stats counts the steps taken; a stop check or
 * progress callback that says stop stops the call where the header says.
 *
 * Kept tiny (at most 9 samples of 8 features, 16 units a layer) so that an
 * input runs in milliseconds.
 */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "castor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);
/* OpenBLAS reads OPENBLAS_NUM_THREADS as it loads, before the setenv below. */
void openblas_set_num_threads(int num_threads);

#define FAIL(...)                                                                      \
    do {                                                                               \
        fprintf(stderr, "fuzz_api: invariant broken at %s:%d: ", __FILE__, __LINE__);  \
        fprintf(stderr, __VA_ARGS__);                                                  \
        fprintf(stderr, "\n");                                                         \
        abort();                                                                       \
    } while (0)
#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "fuzz_api: invariant broken at %s:%d: %s: ", __FILE__,      \
                    __LINE__, #cond);                                                  \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

#define B(code) (1u << (code))
#define NS 2        /* strategy slots */
#define NM 3        /* model slots */
#define ND 3        /* dataset slots */
#define NF 2        /* checkpoint files */
#define MAX_L 8     /* layers the harness gives a model */
#define MAX_LF 32   /* layers a damaged checkpoint's may have */
#define MAX_N 9     /* samples a dataset may have */
#define MAX_F 8     /* features */
#define MAX_U 16    /* units a layer */
#define MAX_OPS 64
#define MAX_DEPTH 2 /* callbacks inside callbacks */
#define SMALL_BUDGET ((size_t)1 << 20)

/* ---- the input -------------------------------------------------------- */

static const uint8_t *in_p;
static size_t in_n, in_i;

static unsigned u8(void)
{
    return in_i < in_n ? in_p[in_i++] : 0;
}

static int pick(int n)
{
    return (int)(u8() % (unsigned)n);
}

static uint64_t u64(void)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)u8() << (8 * i);
    return v;
}

/* A value in [-1, 1]. */
static float unit(void)
{
    return (float)((int)u8() - 128) / 128.0f;
}

/* ---- the harness's account of the handles ------------------------------ */

/* The epoch a model has left part-way, as far as the harness knows it: what
 * a fit that goes on with it must give again (castor.h), and what a save
 * carries to a load. */
typedef struct epoch_state {
    int known;      /* 0: a load or open of a file of unknown making */
    int batch, shuffle;
    size_t samples; /* 0: not yet one */
} epoch_state;

typedef struct hstrat {
    castor_strategy *h;
    int ok;          /* created */
    int replicas, kind;
    size_t budget;   /* as given: 0 for the default */
    int log_level;   /* the log callback checks its levels against it */
    int bound;       /* model slot compiled on it, or -1 */
} hstrat;

typedef struct hmodel {
    castor_model *h;
    int created;      /* castor_model_create succeeded */
    int open_failed;  /* handed out by a failed open: errmsg and free only */
    int features;
    int nl, units[MAX_LF], acts[MAX_LF];
    size_t n_params;
    int compiled, strat;
    int loss, kind, slots;
    int sane;         /* finite data keeps it finite (see sane_opt) */
    /* What a load placed that is not finite, which fit refuses (castor.h):
     * in the variables (until set_params or a load), in the optimizer state
     * (until a load). 0, 1, or -1: unknown. Training that diverges sets
     * neither: such a model trains on. */
    int nf_params, nf_state;
    int64_t stats_steps;
    size_t last_peak;  /* device_peak_bytes last seen since compile or reset */
    epoch_state ep;   /* the epoch in progress */
    int zombie;       /* freed from a callback of its running call */
    int unknown;      /* opened from a damaged file: loss and optimizer unknown */
    int stop_check;   /* the harness's stop check is set */
} hmodel;

typedef struct hdata {
    castor_dataset *h;
    int ok;
    size_t n;
    int features, labels, num_classes, tdim;
    int32_t label[MAX_N];            /* what it was given, for evaluate's check */
    float target[MAX_N * MAX_U];
} hdata;

typedef struct hfile {
    int saved;        /* castor wrote it and it has not been changed since */
    unsigned char *bytes;  /* as castor wrote it */
    size_t len, header_end;
    int features, loss, kind, slots, sane, all_finite;
    char spec[MAX_LF * 24 + 1];
    int unknown;      /* saved by a model of unknown loss or optimizer */
    float *params;
    size_t n_params;
    float lr;
    int64_t step, epoch, step_in_epoch;
    epoch_state ep;
} hfile;

/* A call of fit, evaluate or predict that is running (its callbacks are). */
typedef struct run_ctx {
    int model;
    int train, val;  /* dataset slots it reads, or -1 */
    int is_fit;
    int progress_calls, stop_calls;
    int stopped;     /* a callback or stop check said stop */
    int stopped_by_check;
    int freed;       /* the model or its strategy was freed meanwhile */
    int64_t step0;
    int64_t spe;
    int64_t epoch0;  /* the model's epochs when fit started */
    int ends;        /* epoch ends its progress callback has seen */
    int epochs;
    int xent, has_val;
} run_ctx;

static hstrat strats[NS];
static hmodel models[NM];
static hdata datas[ND];
static hfile files[NF];
static run_ctx *runs[8];
static int n_runs;
static int cb_depth;
static char dir[64], paths[NF][96];
/* A directory (no file can be written there) and a symbolic link to the
 * last checkpoint file, which a save writes through (castor.h). */
static char subdir[96], link_path[96];
static const int slot_ids[NM] = {0, 1, 2};

static int model_busy(int m)
{
    for (int i = 0; i < n_runs; i++)
        if (runs[i]->model == m)
            return 1;
    return 0;
}

/* A model or its strategy freed from a callback: its running calls stop
 * (castor.h), and run_pop checks that they say so. */
static void runs_freed(int m)
{
    for (int i = 0; i < n_runs; i++)
        if (runs[i]->model == m)
            runs[i]->freed = 1;
}

static int strat_busy(int s)
{
    for (int i = 0; i < n_runs; i++) {
        const hmodel *M = &models[runs[i]->model];
        if (M->compiled && M->strat == s)
            return 1;
    }
    return 0;
}

static int data_busy(int d)
{
    for (int i = 0; i < n_runs; i++)
        if (runs[i]->train == d || runs[i]->val == d)
            return 1;
    return 0;
}

static int errmsg_ok(const char *msg)
{
    return msg && msg[0] && strcmp(msg, "no error") != 0;
}

/* A status in the set `want`; a failure with a message on the handle. */
/* FUZZ_API_TRACE=1 in the environment: every checked call on stderr. */
static int trace;

static void expect(int rc, unsigned want, const char *what, const char *msg)
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

static const char *mmsg(const hmodel *M)
{
    return castor_model_errmsg(M->h);
}

/* ---- helpers ---------------------------------------------------------- */

static int small_budget(int s)
{
    return strats[s].budget && strats[s].budget < SMALL_BUDGET;
}

static int out_units(const hmodel *M)
{
    return M->nl ? M->units[M->nl - 1] : 0;
}

/* The layers from layers_spec, into the account: the spec must parse back. */
static void sync_layers(hmodel *M)
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

static float *get_params(hmodel *M)
{
    float *p = malloc((M->n_params ? M->n_params : 1) * sizeof *p);
    if (!p)
        abort();
    int rc = castor_model_get_params(M->h, p, M->n_params);
    expect(rc, B(CASTOR_OK), "get_params", mmsg(M));
    return p;
}

/* castor.h: a call that fails leaves the model as it was. */
static void check_params_unchanged(hmodel *M, const float *before, size_t count,
                                   const char *what)
{
    float *after = get_params(M);
    CHECK(memcmp(before, after, count * sizeof *after) == 0, "%s changed the variables", what);
    free(after);
}

/* The optimizer's values that compile accepts, as castor.h lists them. */
static int opt_valid(const castor_optimizer *o)
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
static int lr_sane(float lr)
{
    return lr > 0 && lr <= 0.0101f;
}

static int opt_sane(const castor_optimizer *o)
{
    if (!opt_valid(o) || !lr_sane(o->learning_rate))
        return 0;
    if (o->kind == CASTOR_OPT_SGD)
        return o->momentum <= 0.9f;
    return o->beta1 <= 0.9f && o->beta2 >= 0.99f && o->epsilon >= 1e-8f &&
           o->weight_decay <= 0.1f;
}

static void model_detached(hmodel *M)
{
    M->compiled = 0;
    M->stats_steps = 0;
    M->last_peak = 0;
}

/* The model's training position. */
typedef struct position {
    int64_t step, epoch, sie;
    float lr;
} position;

static position position_of(const hmodel *M)
{
    position p = {castor_model_step(M->h), castor_model_epoch(M->h),
                  castor_model_step_in_epoch(M->h), castor_model_learning_rate(M->h)};
    return p;
}

static void check_stats(hmodel *M)
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
static void check_finite(hmodel *M, const char *after)
{
    if (!M->compiled || !M->sane || M->zombie)
        return;
    int finite = -1;
    int rc = castor_model_all_finite(M->h, &finite);
    expect(rc, B(CASTOR_OK), "all_finite", mmsg(M));
    if (finite != 1)
        FAIL("a model trained at a sane rate on finite data is not finite after %s", after);
}

/* ---- callbacks ------------------------------------------------------------ */

static void do_op(void);

static void log_fn(void *user, castor_log_level level, const char *message)
{
    const hstrat *S = user;
    CHECK(message && message[0], "empty log message");
    CHECK((int)level >= CASTOR_LOG_ERROR && (int)level <= CASTOR_LOG_DEBUG, "level %d",
          (int)level);
    CHECK((int)level <= S->log_level, "level %d logged at log_level %d: %s", (int)level,
          S->log_level, message);
}

/* What a callback does: some calls of its own (inside a callback, at most
 * MAX_DEPTH deep), then stop or go on. A byte of 0 (the input's end) does
 * nothing and goes on. */
static int callback_body(void)
{
    unsigned b = u8();
    if (cb_depth < MAX_DEPTH) {
        cb_depth++;
        for (unsigned i = 0; i < ((b >> 4) & 3); i++)
            do_op();
        cb_depth--;
    }
    return (b & 15) == 15;
}

static int progress_fn(void *user, const castor_progress *p)
{
    run_ctx *rc = user;
    hmodel *M = &models[rc->model];
    CHECK(rc->is_fit && !rc->freed && !M->zombie, "progress after the model was freed");
    rc->progress_calls++;
    CHECK(p->global_step == rc->step0 + rc->progress_calls, "global_step %lld, %lld + %d",
          (long long)p->global_step, (long long)rc->step0, rc->progress_calls);
    CHECK(p->global_step == castor_model_step(M->h), "global_step");
    CHECK(p->epochs == rc->epochs && p->epoch >= 0 && p->epoch < p->epochs, "epoch %d of %d",
          p->epoch, p->epochs);
    CHECK(p->steps_per_epoch == rc->spe && p->step_in_epoch >= 1 &&
              p->step_in_epoch <= p->steps_per_epoch,
          "step %lld of %lld", (long long)p->step_in_epoch, (long long)p->steps_per_epoch);
    CHECK(!p->epoch_end || p->step_in_epoch == p->steps_per_epoch, "epoch_end");
    CHECK(p->epoch == rc->ends, "progress epoch %d after %d epoch ends", p->epoch, rc->ends);
    rc->ends += p->epoch_end;
    CHECK(castor_model_epoch(M->h) == rc->epoch0 + rc->ends &&
              castor_model_step_in_epoch(M->h) == (p->epoch_end ? 0 : p->step_in_epoch),
          "the model at epoch %lld step %lld, its progress says %d step %lld",
          (long long)castor_model_epoch(M->h), (long long)castor_model_step_in_epoch(M->h),
          p->epoch, (long long)p->step_in_epoch);
    CHECK(p->epoch_end || p->step_in_epoch < p->steps_per_epoch, "epoch_end not said");
    CHECK(rc->xent < 0 || (rc->xent ? p->accuracy >= 0 && p->accuracy <= 1 : isnan(p->accuracy)),
          "accuracy %g", p->accuracy);
    CHECK(!(M->sane && !isfinite(p->loss)), "loss %g", p->loss);
    CHECK(p->seconds >= 0, "seconds");
    if (!p->epoch_end || !rc->has_val)
        CHECK(isnan(p->val_loss) && isnan(p->val_accuracy), "val_* without a validation");
    else
        CHECK(rc->xent < 0 || (rc->xent ? p->val_accuracy >= 0 && p->val_accuracy <= 1
                                        : isnan(p->val_accuracy)),
              "val_accuracy %g", p->val_accuracy);
    int stop = callback_body();
    rc->stopped |= stop;
    return stop;
}

static int stop_fn(void *user)
{
    int m = *(const int *)user;
    run_ctx *rc = NULL;
    for (int i = n_runs - 1; i >= 0 && !rc; i--)
        if (runs[i]->model == m)
            rc = runs[i];
    CHECK(rc, "stop check of model %d outside its calls", m);
    CHECK(!rc->freed && !models[m].zombie, "stop check after the model was freed");
    rc->stop_calls++;
    int stop = callback_body();
    rc->stopped |= stop;
    rc->stopped_by_check |= stop;
    return stop;
}

/* The statuses a running call may return: the refusals `want` (none:
 * CASTOR_OK); stopped by a callback or stop check, CASTOR_INTERRUPTED; on a
 * small device budget, CASTOR_DEVICE_MEMORY. */
static unsigned run_allowed(const hmodel *M, const run_ctx *rc, unsigned want)
{
    unsigned allowed = want ? want : B(CASTOR_OK);
    if (rc->stopped)
        allowed |= B(CASTOR_INTERRUPTED);
    if (M->compiled && small_budget(M->strat))
        allowed |= B(CASTOR_DEVICE_MEMORY);
    return allowed;
}

static void run_push(run_ctx *rc)
{
    if (n_runs == (int)(sizeof runs / sizeof *runs))
        abort();
    runs[n_runs++] = rc;
}

/* After a running call returns: a model freed from its callbacks is gone. */
static void run_pop(run_ctx *rc, int status)
{
    CHECK(n_runs > 0 && runs[n_runs - 1] == rc, "run stack");
    n_runs--;
    hmodel *M = &models[rc->model];
    if (rc->freed)
        CHECK(status == CASTOR_MISUSE, "a call whose model or strategy was freed from its "
              "callback returned %d", status);
    if (M->zombie) {
        if (M->compiled && strats[M->strat].bound == rc->model)
            strats[M->strat].bound = -1;
        memset(M, 0, sizeof *M);
    }
}

/* ---- strategies --------------------------------------------------------------- */

static void strat_free(int s)
{
    hstrat *S = &strats[s];
    castor_strategy_free(S->h);
    if (S->bound >= 0) {
        hmodel *M = &models[S->bound];
        model_detached(M);
        runs_freed(S->bound);
        if (!M->zombie) {
            /* castor.h: detached, it is not compiled (rate 0) and refuses
             * parameters. */
            CHECK(castor_model_learning_rate(M->h) == 0.0f, "a detached model's rate");
            float *v = malloc((M->n_params + 1) * sizeof *v);
            if (!v)
                abort();
            int rc = castor_model_get_params(M->h, v, M->n_params);
            expect(rc, B(CASTOR_MISUSE), "get_params of a detached model", mmsg(M));
            free(v);
        }
    }
    memset(S, 0, sizeof *S);
    S->bound = -1;
}

static const struct {
    const char *spec;
    int replicas;  /* 0: refused */
} DEVICES[] = {
    {"cpu:1", 1}, {"cpu:2", 2}, {"cpu:1x2", 2}, {"cpu", 1},   {"CPU:2", 2},  {"cpu:2x1", 2},
    {"cpu,cpu", 2}, {"cpu:0", 0}, {"", 0},      {"cpu,", 0}, {",cpu", 0},   {"gpu", 0},
    {"cpu:65", 0}, {"cpu:1x0", 0}, {"cuda", 0}, {"cpu:1x65", 0},
};

static void op_strategy_create(void)
{
    int s = pick(NS);
    if (strat_busy(s))
        return;
    strat_free(s);
    hstrat *S = &strats[s];
    unsigned how = u8();
    int di = (int)(how % (sizeof DEVICES / sizeof *DEVICES));
    const char *devices = (how & 0x80) && (how & 0x40) && (how & 0x20) ? NULL : DEVICES[di].spec;
    int kind = (int)(u8() % 5);
    kind = kind < 2 ? kind : kind == 2 ? 0 : kind == 3 ? 1 : 7;
    castor_strategy_options o = CASTOR_STRATEGY_OPTIONS_INIT;
    static const size_t budgets[] = {0, 0, (size_t)1 << 20, 64 << 10, 16 << 10, 4 << 10,
                                     1 << 10, 300, (size_t)1 << 30};
    o.device_memory_budget = budgets[pick(sizeof budgets / sizeof *budgets)];
    static const int threads[] = {1, 1, 2, 0, -1, 1025};
    o.host_threads = threads[pick(6)];
    static const int levels[] = {CASTOR_LOG_WARN, CASTOR_LOG_DEBUG, CASTOR_LOG_ERROR,
                                 CASTOR_LOG_INFO, -1, 4};
    o.log_level = (castor_log_level)levels[pick(6)];
    unsigned flags = u8();
    o.log_fn = flags & 1 ? log_fn : NULL;
    o.log_user = S;
    o.tf32 = (flags & 2) != 0;
    int use_opts = !(flags & 4);
    S->log_level = use_opts ? (int)o.log_level : CASTOR_LOG_WARN;
    S->budget = use_opts ? o.device_memory_budget : 0;
    unsigned want = 0;
    if (kind != 0 && kind != 1)
        want |= B(CASTOR_INVALID);
    if (!devices)
        want |= B(CASTOR_MISUSE);
    if (use_opts && (o.host_threads < 0 || o.host_threads > 1024 || (int)o.log_level < 0 ||
                     (int)o.log_level > 3))
        want |= B(CASTOR_INVALID);
    if (devices && !DEVICES[di].replicas)
        want |= B(CASTOR_INVALID) | B(CASTOR_UNSUPPORTED) | B(CASTOR_DEVICE);
    int rc = castor_strategy_create(&S->h, (castor_strategy_kind)kind, devices,
                                    use_opts ? &o : NULL);
    expect(rc, want ? want : B(CASTOR_OK), "strategy_create", castor_strategy_errmsg(S->h));
    S->ok = rc == CASTOR_OK;
    S->replicas = castor_strategy_replicas(S->h);
    S->bound = -1;
    if (S->ok) {
        CHECK(S->replicas == DEVICES[di].replicas, "%s: %d replicas", devices, S->replicas);
        CHECK((int)castor_strategy_get_kind(S->h) == kind, "kind");
        S->kind = kind;
    } else {
        CHECK(S->replicas == 0, "a failed strategy has %d replicas", S->replicas);
    }
}

static void op_strategy_free(void)
{
    int s = pick(NS);
    /* Freeing a running model's strategy from its callback stops the call
     * (castor.h); the stack of calls keeps track. */
    strat_free(s);
}

/* ---- models -------------------------------------------------------------------- */

static void model_free(int m)
{
    hmodel *M = &models[m];
    if (!M->h || M->zombie)
        return;
    if (model_busy(m)) {
        /* Freed as its running call returns (castor.h). */
        castor_model_free(M->h);
        M->zombie = 1;
        runs_freed(m);
        return;
    }
    if (M->compiled && strats[M->strat].bound == m)
        strats[M->strat].bound = -1;
    castor_model_free(M->h);
    memset(M, 0, sizeof *M);
}

/* A slot for a new model: its old one freed, unless that one is running. */
static hmodel *fresh_model(int m)
{
    if (models[m].h && (model_busy(m) || models[m].zombie))
        return NULL;
    model_free(m);
    return &models[m];
}

static void op_model_create(void)
{
    int m = pick(NM);
    hmodel *M = fresh_model(m);
    if (!M)
        return;
    static const int feats[] = {1, 2, 3, 4, 5, 8, 3, 2, 0, -1};
    int f = feats[pick(10)];
    int rc = castor_model_create(&M->h, f);
    CHECK(M->h, "create handed out no model");
    expect(rc, f > 0 ? B(CASTOR_OK) : B(CASTOR_INVALID), "model_create", mmsg(M));
    M->created = rc == CASTOR_OK;
    M->features = f;
    sync_layers(M);
    CHECK(M->nl == 0 && castor_model_input_features(M->h) == (M->created ? f : 0),
          "a new model");
    CHECK(castor_model_learning_rate(M->h) == 0.0f, "learning rate before compile");
}

/* A model slot that holds a handle usable here, or NULL; with the byte's
 * top bit, the first compiled one from there, so that sequences reach
 * training more often than chance would. */
static hmodel *some_model(int *slot)
{
    unsigned b = u8();
    int m = (int)(b % NM);
    for (int i = 0; (b & 0x80) && i < NM; i++) {
        int k = (m + i) % NM;
        if (models[k].h && !models[k].zombie && models[k].compiled) {
            m = k;
            break;
        }
    }
    *slot = m;
    hmodel *M = &models[m];
    return M->h && !M->zombie ? M : NULL;
}

/* As some_model, but not one handed out by a failed open, which takes
 * castor_model_errmsg and castor_model_free only. */
static hmodel *some_model_to_call(int *slot)
{
    hmodel *M = some_model(slot);
    return M && !M->open_failed ? M : NULL;
}

/* A strategy slot, or NS (NULL); with the byte's top bit, the first from
 * there that is free for a model. */
static int some_strategy(void)
{
    unsigned b = u8();
    int s = (int)(b % (NS + 1));
    for (int i = 0; (b & 0x80) && i < NS; i++) {
        int k = (s + i) % NS;
        if (strats[k].h && strats[k].ok && strats[k].bound < 0) {
            s = k;
            break;
        }
    }
    return s;
}

static void op_add_dense(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M || (model_busy(m) && !M->compiled))
        return;
    unsigned b = u8();
    int units = (int)(b % MAX_U) + 1;
    if ((b & 0xf0) == 0xf0)
        units = b & 1 ? 0 : (b & 2 ? -3 : (1 << 25));
    int act = pick(9);
    act = act < 4 ? act : act < 7 ? 0 : act == 7 ? 4 : -1;
    if (M->nl >= MAX_L && units > 0 && units <= MAX_U && act >= 0 && act < 4 && !M->compiled)
        return;
    int n0 = M->nl;
    unsigned want = B(CASTOR_OK);
    if (M->compiled || !M->created)
        want = B(CASTOR_MISUSE);
    else if (units <= 0 || units > (1 << 24) || act < 0 || act > 3)
        want = B(CASTOR_INVALID);
    int rc = castor_model_add_dense(M->h, units, (castor_activation)act);
    expect(rc, want, "add_dense", mmsg(M));
    sync_layers(M);
    CHECK(M->nl == n0 + (rc == CASTOR_OK), "layers %d after %d", M->nl, n0);
}

/* A layer list from tokens: mostly good, some not. */
static void make_spec(char *spec, size_t size, int *valid, int *layers)
{
    static const char *const acts[] = {"",       ":relu",  ":tanh", ":sigmoid", ":linear",
                                       ":RELU",  ":Tanh",  ":soft", ":",        ":relu:x"};
    size_t at = 0;
    int n = pick(4);
    *valid = 1;
    *layers = 0;
    spec[0] = '\0';
    for (int i = 0; i <= n; i++) {
        unsigned b = u8();
        char num[16];
        int units = (int)(b % MAX_U) + 1;
        if ((b & 0xe0) == 0xe0) {
            static const char *const bad[] = {"0", "-3", "x", "", " 3", "+3", "99999999", "3x"};
            snprintf(num, sizeof num, "%s", bad[b & 7]);
            *valid = 0;
        } else {
            snprintf(num, sizeof num, "%d", units);
        }
        int a = pick(10);
        if (a >= 7)
            *valid = 0;
        at += (size_t)snprintf(spec + at, size - at, "%s%s%s", i ? "," : "", num, acts[a]);
        (*layers)++;
    }
    unsigned tail = u8();
    if ((tail & 0xf0) == 0xf0) {
        snprintf(spec + at, size - at, "%s", tail & 1 ? "," : ",,4");
        *valid = 0;
    }
}

static void op_add_layers(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M || (model_busy(m) && !M->compiled))
        return;
    char spec[256];
    int valid, layers;
    make_spec(spec, sizeof spec, &valid, &layers);
    if (u8() == 0xff) {
        /* NULL spec */
        int rc = castor_model_add_layers(M->h, NULL);
        expect(rc, B(CASTOR_MISUSE), "add_layers(NULL)", mmsg(M));
        return;
    }
    if (M->nl + layers > MAX_L && valid && !M->compiled)
        return;
    int n0 = M->nl;
    size_t p0 = M->n_params;
    /* A bad spec to a model that takes no layers: castor.h names both
     * statuses and says neither comes first. */
    unsigned want = 0;
    if (M->compiled || !M->created)
        want |= B(CASTOR_MISUSE);
    if (!valid)
        want |= B(CASTOR_INVALID);
    if (!want)
        want = B(CASTOR_OK);
    int rc = castor_model_add_layers(M->h, spec);
    expect(rc, want, spec, mmsg(M));
    sync_layers(M);
    if (rc)
        CHECK(M->nl == n0 && M->n_params == p0, "a failed add_layers('%s') left layers", spec);
    else
        CHECK(M->nl == n0 + layers, "'%s' added %d layers", spec, M->nl - n0);
}

static const float LRS[] = {0.01f, 0.001f, 0.005f, 0.1f,  0.0f,      -0.01f, NAN,
                            INFINITY, 1e30f, 1e-30f, 1.0f, -INFINITY, 1e-40f, -0.0f};
static const float MOMS[] = {0.0f, 0.5f, 0.9f, 1.0f, 1.5f, -0.1f, NAN, 0.99f};
static const float BETAS[] = {0.9f, 0.999f, 0.0f, 0.5f, 1.0f, -0.1f, NAN, 0.99f};
static const float EPSS[] = {1e-7f, 1e-8f, 0.0f, -1e-7f, NAN, INFINITY, 1e-20f, 1.0f, 1e-45f};
static const float WDS[] = {0.0f, 0.004f, 0.1f, 1e6f, -0.1f, NAN, INFINITY, 1e30f};

#define PICKF(table) ((table)[pick((int)(sizeof(table) / sizeof *(table)))])

static void random_optimizer(castor_optimizer *o)
{
    int kind = pick(7);
    kind = kind < 3 ? kind : kind < 6 ? kind - 3 : 3;
    *o = castor_optimizer_defaults((castor_optimizer_kind)(kind < 3 ? kind : 0));
    o->kind = (castor_optimizer_kind)kind;
    unsigned what = u8();
    if (what & 1)
        o->learning_rate = PICKF(LRS);
    if (what & 2)
        o->momentum = PICKF(MOMS);
    if (what & 4)
        o->nesterov = (int)(u8() & 1);
    if (what & 8)
        o->beta1 = PICKF(BETAS);
    if (what & 16)
        o->beta2 = PICKF(BETAS);
    if (what & 32)
        o->epsilon = PICKF(EPSS);
    if (what & 64)
        o->weight_decay = PICKF(WDS);
}

/* Glorot-uniform kernels, zero biases (castor.h's compile). */
static void check_initial_params(hmodel *M)
{
    float *p = get_params(M);
    size_t at = 0;
    int in = M->features;
    for (int l = 0; l < M->nl; l++) {
        int out = M->units[l];
        float limit = (float)sqrt(6.0 / (double)(in + out));
        for (size_t i = 0; i < (size_t)in * (size_t)out; i++, at++)
            CHECK(fabsf(p[at]) <= limit, "initial kernel value %g over %g", (double)p[at],
                  (double)limit);
        for (int i = 0; i < out; i++, at++)
            CHECK(p[at] == 0.0f, "initial bias %g", (double)p[at]);
        in = out;
    }
    free(p);
}

static void op_compile(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    int s = some_strategy();
    hstrat *S = s < NS && strats[s].h ? &strats[s] : NULL;
    int loss = pick(5);
    loss = loss < 2 ? loss : loss < 4 ? loss - 2 : 2;
    castor_optimizer opt;
    int with_opt = !(u8() & 1);
    if (with_opt)
        random_optimizer(&opt);
    else
        opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    uint64_t seed = u64();
    unsigned misuse = 0, invalid = 0;
    if (!S || !S->ok || M->compiled || !M->created || S->bound >= 0 || model_busy(m))
        misuse = B(CASTOR_MISUSE);
    if (M->nl == 0 || (loss != 0 && loss != 1) || !opt_valid(&opt) ||
        (loss == CASTOR_LOSS_SOFTMAX_XENT && (M->acts[M->nl - 1] != 0 || out_units(M) < 2)))
        invalid = B(CASTOR_INVALID);
    unsigned want = misuse | invalid;
    if (!want)
        want = B(CASTOR_OK) | (small_budget(s) ? B(CASTOR_DEVICE_MEMORY) : 0);
    int was_compiled = M->compiled;
    int rc = castor_model_compile(M->h, S ? S->h : NULL, (castor_loss)loss,
                                  with_opt ? &opt : NULL, seed);
    expect(rc, want, "compile", mmsg(M));
    if (rc != CASTOR_OK) {
        CHECK(M->compiled == was_compiled, "state");
        if (S && S->bound < 0 && !was_compiled)
            CHECK(castor_model_learning_rate(M->h) == 0.0f, "a failed compile's rate");
        return;
    }
    M->compiled = 1;
    M->strat = s;
    S->bound = m;
    M->loss = loss;
    M->kind = (int)opt.kind;
    M->slots = opt.kind == CASTOR_OPT_SGD ? opt.momentum != 0 : 2;
    M->sane = opt_sane(&opt);
    M->nf_params = M->nf_state = 0;
    M->stats_steps = 0;
    M->last_peak = 0;
    M->ep = (epoch_state){.known = 1};
    position p = position_of(M);
    CHECK(p.step == 0 && p.epoch == 0 && p.sie == 0, "a new compile starts at step 0");
    CHECK(p.lr == opt.learning_rate, "learning_rate %g, compiled with %g", (double)p.lr,
          (double)opt.learning_rate);
    check_initial_params(M);
    check_stats(M);
}

static void op_model_free(void)
{
    model_free(pick(NM));
}

/* ---- datasets ------------------------------------------------------------------ */

static void data_free(int d)
{
    if (data_busy(d))
        return;  /* castor.h: the data a running call reads must not be freed */
    castor_dataset_free(datas[d].h);
    memset(&datas[d], 0, sizeof datas[d]);
}

static void op_dataset_create(void)
{
    int d = pick(ND);
    if (data_busy(d))
        return;
    data_free(d);
    hdata *D = &datas[d];
    /* Mostly shaped for one of the models, so that fits run. */
    const hmodel *M = &models[pick(NM)];
    int outs = M->h ? out_units(M) : 0;
    int features = M->h && M->features > 0 ? M->features : pick(MAX_F) + 1;
    if (features > MAX_F)
        features = MAX_F;  /* a damaged checkpoint's model */
    unsigned b = u8();
    if ((b & 0xf0) == 0xf0)
        features = b & 1 ? 0 : -1;
    size_t n = (size_t)pick(MAX_N + 1);
    int mode = pick(8);  /* 0-3 labels, 4-5 targets, 6 both, 7 neither */
    int classes = outs > 0 && outs < MAX_U ? outs : pick(4) + 1;
    int tdim = outs > 0 && outs < MAX_U ? outs : pick(4) + 1;
    unsigned bad = u8();
    if ((bad & 0x07) == 0x07)
        classes++;  /* one label more than the model has outputs: a mismatch */
    if ((bad & 0x38) == 0x38)
        tdim = bad & 0x40 ? 0 : tdim + 1;
    float x[MAX_N * MAX_F + 1], targets[MAX_N * MAX_U + 1];
    int32_t labels[MAX_N + 1];
    size_t nx = features > 0 ? n * (size_t)features : 0;
    for (size_t i = 0; i < nx; i++)
        x[i] = unit();
    unsigned bad2 = u8();
    int nan_x = nx && (bad2 & 0x07) == 0x07;
    if (nan_x)
        x[u8() % nx] = bad2 & 0x80 ? NAN : INFINITY;
    int max_label = -1, bad_label = 0;
    for (size_t i = 0; i < n; i++) {
        labels[i] = (int32_t)(u8() % (unsigned)classes);
        max_label = labels[i] > max_label ? labels[i] : max_label;
    }
    if (n && (bad2 & 0x38) == 0x38) {
        labels[n - 1] = bad2 & 0x40 ? -1 : INT32_MAX;
        bad_label = 1;
    }
    size_t nt = tdim > 0 ? n * (size_t)tdim : 0;
    for (size_t i = 0; i < nt; i++)
        targets[i] = unit();
    int with_labels = mode < 4 || mode == 6, with_targets = (mode >= 4 && mode < 7);
    int null_x = bad2 == 0x7e;
    unsigned want = 0;
    if (null_x)
        want |= B(CASTOR_MISUSE);
    if (n == 0 || features <= 0 || with_labels == with_targets ||
        (with_targets && tdim <= 0) || (with_labels && bad_label) || nan_x)
        want |= B(CASTOR_INVALID);
    int rc = castor_dataset_from_memory(&D->h, null_x ? NULL : x, n, features,
                                        with_labels ? labels : NULL,
                                        with_targets ? targets : NULL, tdim);
    CHECK(D->h, "from_memory handed out no dataset");
    expect(rc, want ? want : B(CASTOR_OK), "from_memory", castor_dataset_errmsg(D->h));
    D->ok = rc == CASTOR_OK;
    if (!D->ok) {
        CHECK(castor_dataset_size(D->h) == 0, "a failed dataset has samples");
        return;
    }
    D->n = n;
    D->features = features;
    D->labels = with_labels;
    D->num_classes = with_labels ? max_label + 1 : 0;
    D->tdim = with_labels ? 0 : tdim;
    if (with_labels)
        memcpy(D->label, labels, n * sizeof *labels);
    else
        memcpy(D->target, targets, nt * sizeof *targets);
    CHECK(castor_dataset_size(D->h) == n && castor_dataset_features(D->h) == features, "shape");
    CHECK(memcmp(castor_dataset_x(D->h), x, nx * sizeof *x) == 0, "x copied");
    const int32_t *l = castor_dataset_labels(D->h);
    CHECK(with_labels ? l && memcmp(l, labels, n * sizeof *labels) == 0 : !l, "labels");
}

static void op_dataset_split(void)
{
    int d = pick(ND), t = pick(ND);
    hdata *D = &datas[d];
    if (!D->h || t == d || data_busy(t))
        return;
    size_t count = (size_t)pick(MAX_N + 1);
    unsigned want = B(CASTOR_OK);
    if (data_busy(d))
        want = B(CASTOR_MISUSE);
    else if (count == 0 || count >= D->n)
        want = B(CASTOR_INVALID);
    size_t nf = D->ok ? D->n * (size_t)D->features : 0;
    float x[MAX_N * MAX_F + 1];
    int32_t labels[MAX_N + 1];
    if (nf)
        memcpy(x, castor_dataset_x(D->h), nf * sizeof *x);
    if (D->labels)
        memcpy(labels, castor_dataset_labels(D->h), D->n * sizeof *labels);
    castor_dataset *tail = (castor_dataset *)&tail;  /* must become NULL on failure */
    int rc = castor_dataset_split_tail(D->h, count, &tail);
    expect(rc, want, "split_tail", castor_dataset_errmsg(D->h));
    if (rc) {
        CHECK(tail == NULL, "a failed split's tail");
        CHECK(castor_dataset_size(D->h) == (D->ok ? D->n : 0), "a failed split changed the set");
        return;
    }
    data_free(t);
    hdata *T = &datas[t];
    *T = *D;
    T->h = tail;
    T->n = count;
    D->n -= count;
    memmove(T->label, D->label + D->n, count * sizeof *T->label);
    if (D->tdim > 0)
        memmove(T->target, D->target + D->n * (size_t)D->tdim,
                count * (size_t)D->tdim * sizeof *T->target);
    CHECK(castor_dataset_size(D->h) == D->n && castor_dataset_size(T->h) == count, "sizes");
    size_t f = (size_t)D->features;
    CHECK(memcmp(castor_dataset_x(D->h), x, D->n * f * sizeof *x) == 0, "head x");
    CHECK(memcmp(castor_dataset_x(T->h), x + D->n * f, count * f * sizeof *x) == 0, "tail x");
    if (D->labels) {
        CHECK(memcmp(castor_dataset_labels(T->h), labels + D->n, count * sizeof *labels) == 0,
              "tail labels");
        CHECK(memcmp(castor_dataset_labels(D->h), labels, D->n * sizeof *labels) == 0,
              "head labels");
    }
}

static void op_dataset_free(void)
{
    data_free(pick(ND));
}

/* ---- training ------------------------------------------------------------------ */

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

static void op_fit(void)
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

static void op_evaluate(void)
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

static void op_predict(void)
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

/* ---- variables --------------------------------------------------------------------- */

static void op_params(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    unsigned how = u8();
    size_t count = M->n_params;
    if ((how & 0x30) == 0x30)
        count = count + 1 - 2 * (how & 1) * (count > 0);
    int wild = (how & 0xc0) == 0xc0, nan_at = (how & 0x0e) == 0x0e;
    float *src = malloc((count + 1) * sizeof *src);
    float *dst = malloc((count + 1) * sizeof *dst);
    if (!src || !dst)
        abort();
    static const float odd[] = {-0.0f, 1e-40f, -1e-45f, 1e-38f};
    for (size_t i = 0; i < count; i++) {
        unsigned v = u8();
        src[i] = (v & 0xf8) == 0xf8 ? odd[v & 3] : wild ? ((float)v - 128) * 1e28f
                                                         : ((float)v - 128) / 128.0f;
    }
    if (nan_at && count)
        src[u8() % count] = how & 1 ? NAN : -INFINITY;
    float *before = NULL;
    if (M->compiled && (how & 0x80)) {
        /* get_params first, which the running call's callbacks may do too. */
        int rc = castor_model_get_params(M->h, dst, count);
        expect(rc, count == M->n_params ? B(CASTOR_OK) : B(CASTOR_INVALID), "get_params",
               mmsg(M));
    }
    if (M->compiled && count == M->n_params)
        before = get_params(M);
    unsigned want = 0;
    if (!M->compiled || model_busy(m))
        want |= B(CASTOR_MISUSE);
    if (M->compiled && (count != M->n_params || (nan_at && count)))
        want |= B(CASTOR_INVALID);
    int rc = castor_model_set_params(M->h, src, count);
    expect(rc, want ? want : B(CASTOR_OK), "set_params", mmsg(M));
    if (rc == CASTOR_OK) {
        int g = castor_model_get_params(M->h, dst, count);
        expect(g, B(CASTOR_OK), "get_params", mmsg(M));
        CHECK(memcmp(src, dst, count * sizeof *src) == 0, "get_params after set_params");
        if (wild)
            M->sane = 0;
        M->nf_params = 0;
    } else if (before) {
        check_params_unchanged(M, before, count, "a failed set_params");
    }
    free(before);
    free(src);
    free(dst);
}

static void op_learning_rate(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    float lr = PICKF(LRS);
    float lr0 = castor_model_learning_rate(M->h);
    unsigned want = !M->compiled ? B(CASTOR_MISUSE)
                    : !(lr > 0) || !isfinite(lr) ? B(CASTOR_INVALID)
                                                 : B(CASTOR_OK);
    int rc = castor_model_set_learning_rate(M->h, lr);
    expect(rc, want, "set_learning_rate", mmsg(M));
    float now = castor_model_learning_rate(M->h);
    CHECK(now == (rc == CASTOR_OK ? lr : lr0), "learning_rate %g after %g", (double)now,
          (double)lr);
    if (rc == CASTOR_OK && !lr_sane(lr))
        M->sane = 0;
}

static void op_stats(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M)
        return;
    unsigned b = u8();
    if ((b & 3) == 3 && !model_busy(m)) {
        /* Not from a callback: castor.h lets those read the model only. */
        castor_model_reset_run_stats(M->h);
        M->stats_steps = 0;
        M->last_peak = 0;
        /* The count starts again from what the replicas hold: the variables. */
        if (M->compiled)
            CHECK(castor_model_device_peak_bytes(M->h) >= M->n_params * sizeof(float),
                  "peak %zu after a reset", castor_model_device_peak_bytes(M->h));
    }
    if (b & 4) {
        int finite = 7;
        int rc = castor_model_all_finite(M->h, &finite);
        expect(rc, M->compiled ? B(CASTOR_OK) : B(CASTOR_MISUSE), "all_finite", mmsg(M));
        CHECK(rc || finite == 0 || finite == 1, "finite %d", finite);
        if (rc == CASTOR_OK && finite == 1)
            M->nf_params = M->nf_state = 0;  /* whatever a load placed, it was finite */
        if (rc == CASTOR_OK && M->sane)
            CHECK(finite == 1, "a sane model is not finite");
    }
    check_stats(M);
    CHECK(castor_model_run_stats(M->h, NULL) == CASTOR_MISUSE, "run_stats(NULL)");
}

static void op_stop_check(void)
{
    int m;
    hmodel *M = some_model_to_call(&m);
    if (!M || model_busy(m))
        return;  /* from its own callback castor.h does not say */
    int on = (int)(u8() & 1);
    int rc = castor_model_set_stop_check(M->h, on ? stop_fn : NULL, (void *)&slot_ids[m]);
    expect(rc, B(CASTOR_OK), "set_stop_check", mmsg(M));
    M->stop_check = on;
}

static void op_layers_spec(void)
{
    int m;
    hmodel *M = some_model(&m);
    if (!M)
        return;
    char full[4096], buf[80];
    int rc = castor_model_layers_spec(M->h, full, sizeof full);
    CHECK(rc == CASTOR_OK, "layers_spec %d", rc);
    size_t size = (size_t)pick(72);
    memset(buf, 'Z', sizeof buf);
    rc = castor_model_layers_spec(M->h, buf, size);
    if (size == 0) {
        CHECK(rc == CASTOR_MISUSE && buf[0] == 'Z', "layers_spec size 0: %d", rc);
    } else if (strlen(full) < size) {
        CHECK(rc == CASTOR_OK && strcmp(buf, full) == 0, "layers_spec %d '%s'", rc, buf);
    } else {
        CHECK(rc == CASTOR_INVALID && strlen(buf) == size - 1 &&
                  strncmp(buf, full, strlen(buf)) == 0,
              "layers_spec of %zu: %d '%.*s'", size, rc, (int)size, buf);
    }
    CHECK(buf[size < sizeof buf ? size : sizeof buf - 1] == 'Z' || size >= sizeof buf,
          "layers_spec wrote past its size");
    CHECK(castor_model_layers_spec(M->h, NULL, 8) == CASTOR_MISUSE, "layers_spec(NULL)");
}

/* ---- checkpoints --------------------------------------------------------------------- */

static void file_forget(int f)
{
    free(files[f].bytes);
    free(files[f].params);
    memset(&files[f], 0, sizeof files[f]);
}

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            unsigned char *grown = realloc(buf, cap);
            if (!grown)
                abort();
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0)
            break;
    }
    fclose(fp);
    *len = n;
    return buf;
}

/* How the file differs from what castor wrote there: 0 the same, 1 shorter,
 * 2 a byte of the data section changed, 3 a byte of the header changed;
 * -1 unknown. */
static int file_damage(int f)
{
    const hfile *F = &files[f];
    if (!F->saved)
        return -1;
    size_t len = 0;
    unsigned char *now = read_all(paths[f], &len);
    if (!now)
        return -1;
    /* A changed header may say anything (other tensor names, another CRC):
     * it decides, whatever else changed too. */
    int header = 0, data = 0;
    size_t common = len < F->len ? len : F->len;
    for (size_t i = 0; i < common; i++)
        if (now[i] != F->bytes[i])
            *(i < F->header_end ? &header : &data) = 1;
    free(now);
    if (header)
        return 3;
    if (len != F->len)
        return len < F->len ? 1 : -1;
    return data ? 2 : 0;
}

static const char *bad_path(unsigned b)
{
    static char missing[128];
    switch (b & 3) {
    case 0:
        return NULL;
    case 1:
        return "";
    case 2:
        return subdir;
    default:
        snprintf(missing, sizeof missing, "%s/no-such-dir/x.safetensors", dir);
        return missing;
    }
}

/* The path a save, load or open is given and the file it names: mostly
 * checkpoint file f itself, or the last one through its link; with a byte's
 * top four bits, a bad path (*bad). */
static const char *pick_path(int *f, int *bad)
{
    *f = pick(NF);
    unsigned b = u8();
    *bad = (b & 0xf0) == 0xf0;
    if (*bad)
        return bad_path(b);
    return (b & 0x0c) == 0x0c && *f == NF - 1 ? link_path : paths[*f];
}

/* What a save or load is called with: a model that takes calls, a path
 * (pick_path), and a compiled model's variables as they were before. */
typedef struct checkpoint_call {
    int m, f, bad;
    hmodel *M;
    const char *path;
    float *params;  /* NULL when not compiled; the caller frees it */
} checkpoint_call;

static int pick_checkpoint_call(checkpoint_call *c)
{
    c->M = some_model_to_call(&c->m);
    if (!c->M)
        return 0;
    c->path = pick_path(&c->f, &c->bad);
    c->params = c->M->compiled ? get_params(c->M) : NULL;
    return 1;
}

static void op_save(void)
{
    checkpoint_call c;
    if (!pick_checkpoint_call(&c))
        return;
    hmodel *M = c.M;
    int f = c.f, bad = c.bad;
    const char *path = c.path;
    float *params = c.params;
    int finite = 1;
    if (M->compiled)
        expect(castor_model_all_finite(M->h, &finite), B(CASTOR_OK), "all_finite", mmsg(M));
    position p = position_of(M);
    unsigned want = !M->compiled || !path || !*path ? B(CASTOR_MISUSE)
                    : bad ? B(CASTOR_IO) : B(CASTOR_OK);
    int rc = castor_model_save(M->h, path);
    expect(rc, want, "save", mmsg(M));
    struct stat st;
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode), "the link is gone");
    if (rc != CASTOR_OK) {
        free(params);
        return;
    }
    file_forget(f);
    hfile *F = &files[f];
    F->bytes = read_all(paths[f], &F->len);
    CHECK(F->bytes && F->len >= 8, "the saved file");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | F->bytes[i];
    CHECK(hlen <= F->len - 8, "header length");
    F->header_end = 8 + (size_t)hlen;
    F->saved = 1;
    F->unknown = M->unknown;
    F->features = M->features;
    F->loss = M->loss;
    F->kind = M->kind;
    F->slots = M->slots;
    F->sane = M->sane;
    F->all_finite = finite;
    CHECK(castor_model_layers_spec(M->h, F->spec, sizeof F->spec) == CASTOR_OK, "spec");
    F->params = params;
    F->n_params = M->n_params;
    F->lr = p.lr;
    F->step = p.step;
    F->epoch = p.epoch;
    F->step_in_epoch = p.sie;
    F->ep = M->ep;
}

static void op_damage(void)
{
    int f = pick(NF);
    size_t len = 0;
    unsigned char *now = read_all(paths[f], &len);
    if (!now)
        return;
    unsigned how = u8();
    size_t at = (size_t)u8() | (size_t)u8() << 8;
    if (how & 1) {
        if (len)
            len = at % len;  /* shorter */
    } else if (len) {
        unsigned char mask = (unsigned char)(u8() | 1);
        now[at % len] ^= mask;
    }
    FILE *fp = fopen(paths[f], "wb");
    if (!fp)
        abort();
    if (len && fwrite(now, 1, len, fp) != len)
        abort();
    fclose(fp);
    free(now);
}

/* The model against a file castor wrote and nobody changed. */
static int file_matches(const hmodel *M, const hfile *F)
{
    char spec[sizeof F->spec];
    if (castor_model_layers_spec(M->h, spec, sizeof spec) != CASTOR_OK)
        return 0;
    return M->features == F->features && strcmp(spec, F->spec) == 0 && M->loss == F->loss &&
           M->kind == F->kind && M->slots == F->slots;
}

/* After a load or open of a file castor wrote: the model is the file's. */
static void check_loaded(hmodel *M, const hfile *F, const char *what)
{
    float *p = get_params(M);
    CHECK(memcmp(p, F->params, F->n_params * sizeof *p) == 0, "%s: the variables differ from "
          "those saved", what);
    free(p);
    position now = position_of(M);
    CHECK(now.step == F->step && now.epoch == F->epoch && now.sie == F->step_in_epoch,
          "%s: step %lld epoch %lld in %lld; saved %lld %lld %lld", what, (long long)now.step,
          (long long)now.epoch, (long long)now.sie, (long long)F->step, (long long)F->epoch,
          (long long)F->step_in_epoch);
    CHECK(now.lr == F->lr, "%s: learning rate %g, saved %g", what, (double)now.lr,
          (double)F->lr);
    M->sane = F->sane;
    M->nf_params = 0;
    for (size_t i = 0; i < F->n_params; i++)
        M->nf_params |= !isfinite(F->params[i]);
    M->nf_state = F->all_finite ? 0 : M->nf_params ? -1 : 1;
    M->ep = F->ep;
}

/* What a load or open may return of the file at path (file_damage's
 * `damage`), when nothing else refuses it: 0 for one castor wrote and
 * nobody changed. A shorter file or a changed data section is refused as
 * CASTOR_FORMAT, or as `damaged` (the call's own word for it); a changed
 * header may say anything but that the call is misused. */
static unsigned file_refusal(const char *path, int bad, int damage, unsigned damaged)
{
    if (bad)
        return B(CASTOR_IO) | B(CASTOR_FORMAT);
    if (damage < 0)  /* no file, or one of unknown making */
        return access(path, F_OK) != 0 ? B(CASTOR_IO) : ~0u;
    if (damage == 1 || damage == 2)
        return B(CASTOR_FORMAT) | damaged;
    if (damage == 3)
        return ~0u & ~B(CASTOR_MISUSE);
    return 0;
}

/* A load or open of a file of unknown making: what the model holds is not
 * known, only what castor.h lets one ask it. */
static void model_of_unknown_making(hmodel *M)
{
    M->sane = 0;
    M->nf_params = M->nf_state = -1;
    M->ep.known = 0;
}

static void op_load(void)
{
    checkpoint_call c;
    if (!pick_checkpoint_call(&c))
        return;
    int damage = c.bad ? -1 : file_damage(c.f);
    const hfile *F = &files[c.f];
    hmodel *M = c.M;
    int m = c.m, bad = c.bad;
    const char *path = c.path;
    float *before = c.params;
    position p0 = position_of(M);
    unsigned want;
    if (!M->compiled || model_busy(m) || !path || !*path)
        want = B(CASTOR_MISUSE);
    else if ((want = file_refusal(path, bad, damage, B(CASTOR_MISMATCH))) != 0)
        ;
    else if (M->unknown || F->unknown)
        want = B(CASTOR_OK) | B(CASTOR_MISMATCH);
    else
        want = file_matches(M, F) ? B(CASTOR_OK) : B(CASTOR_MISMATCH);
    int rc = castor_model_load(M->h, path);
    expect(rc, want, "load", mmsg(M));
    if (rc == CASTOR_OK) {
        if (damage == 0) {
            check_loaded(M, F, "load");
        } else {
            model_of_unknown_making(M);
            float lr = castor_model_learning_rate(M->h);
            CHECK(lr > 0 && isfinite(lr), "loaded learning rate %g", (double)lr);
        }
    } else if (before) {
        /* castor.h: on any error the model is unchanged. */
        check_params_unchanged(M, before, M->n_params, "a failed load");
        position p1 = position_of(M);
        CHECK(p0.step == p1.step && p0.epoch == p1.epoch && p0.sie == p1.sie &&
                  p0.lr == p1.lr,
              "a failed load moved the model: step %lld epoch %lld in %lld lr %g, was %lld "
              "%lld %lld %g",
              (long long)p1.step, (long long)p1.epoch, (long long)p1.sie, (double)p1.lr,
              (long long)p0.step, (long long)p0.epoch, (long long)p0.sie, (double)p0.lr);
    }
    free(before);
}

static void op_open(void)
{
    int m = pick(NM);
    int s = some_strategy();
    int f, bad;
    const char *path = pick_path(&f, &bad);
    hmodel *M = fresh_model(m);
    if (!M)
        return;
    hstrat *S = s < NS && strats[s].h ? &strats[s] : NULL;
    int damage = bad ? -1 : file_damage(f);
    const hfile *F = &files[f];
    /* What the file says, then what the strategy does; castor.h leaves
     * which comes first open's (the file is read before the model is
     * compiled). */
    unsigned want;
    if (!path || !*path || !S)
        want = B(CASTOR_MISUSE);
    else if ((want = file_refusal(path, bad, damage, B(CASTOR_DEVICE_MEMORY))) == 0)
        want = B(CASTOR_OK) | (small_budget(s) ? B(CASTOR_DEVICE_MEMORY) : 0);
    if (S && (!S->ok || S->bound >= 0))
        want = (want & ~B(CASTOR_OK) & ~B(CASTOR_DEVICE_MEMORY)) | B(CASTOR_MISUSE);
    castor_model *h = (castor_model *)&h;
    int rc = castor_model_open(&h, path, S ? S->h : NULL);
    M->h = h;
    if (rc != CASTOR_OK) {
        expect(rc, want, "open", castor_model_errmsg(h));
        M->open_failed = 1;
        if (!h)
            memset(M, 0, sizeof *M);
        return;
    }
    expect(rc, want, "open", castor_model_errmsg(h));
    CHECK(h, "open handed out no model");
    M->created = 1;
    M->compiled = 1;
    M->strat = s;
    S->bound = m;
    M->features = castor_model_input_features(h);
    sync_layers(M);
    M->stats_steps = 0;
    if (damage == 0) {
        CHECK(M->features == F->features, "features");
        M->loss = F->loss;
        M->kind = F->kind;
        M->slots = F->slots;
        M->unknown = F->unknown;
        check_loaded(M, F, "open");
        check_stats(M);
    } else {
        model_of_unknown_making(M);
        M->loss = -1;
        M->kind = -1;
        M->slots = -1;
        M->unknown = 1;
    }
}

/* ---- resuming -------------------------------------------------------------------- */

/* A model of its own on a strategy of its own: trained straight through,
 * and trained again in two parts with a save, and an open or a load, in
 * between. castor.h: a load takes the variables, the optimizer state and
 * the training position, "so that training goes on as it would have";
 * an epoch left part-way is finished first, over its order of samples. On
 * the same strategy the two runs make the same float operations: the same
 * bytes. */
typedef struct resume_setup {
    castor_strategy *s;
    char spec[64];
    int features, loss;
    castor_optimizer opt;
    uint64_t seed;
    castor_dataset *ds;
    castor_fit_options fo;
} resume_setup;

static castor_model *resume_model(const resume_setup *r)
{
    castor_model *m = NULL;
    int rc = castor_model_create(&m, r->features);
    expect(rc, B(CASTOR_OK), "resume: create", castor_model_errmsg(m));
    rc = castor_model_add_layers(m, r->spec);
    expect(rc, B(CASTOR_OK), "resume: add_layers", castor_model_errmsg(m));
    rc = castor_model_compile(m, r->s, (castor_loss)r->loss, &r->opt, r->seed);
    expect(rc, B(CASTOR_OK), "resume: compile", castor_model_errmsg(m));
    return m;
}

static void op_resume(void)
{
    static const char *const devices[] = {"cpu:1", "cpu:2", "cpu:1x2"};
    static const char *const acts[] = {"linear", "relu", "tanh", "sigmoid"};
    unsigned b0 = u8(), b1 = u8(), b2 = u8(), b3 = u8(), b4 = u8();
    resume_setup r;
    memset(&r, 0, sizeof r);
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.host_threads = 1 + (int)((b0 >> 3) & 1);
    int replicas = b0 % 3 ? 2 : 1;
    int rc = castor_strategy_create(&r.s, (castor_strategy_kind)((b0 >> 2) & 1),
                                    devices[b0 % 3], &so);
    expect(rc, B(CASTOR_OK), "resume: strategy", castor_strategy_errmsg(r.s));
    r.features = 1 + (int)(b1 % 4);
    r.loss = (int)(b2 & 1);
    int outs = r.loss == CASTOR_LOSS_SOFTMAX_XENT ? 2 + (int)((b2 >> 1) % 3)
                                                   : 1 + (int)((b2 >> 1) % 3);
    snprintf(r.spec, sizeof r.spec, "%d:%s,%d", 1 + (int)((b1 >> 2) % 6), acts[(b1 >> 5) & 3],
             outs);
    r.opt = castor_optimizer_defaults((castor_optimizer_kind)((b2 >> 3) % 3));
    if (r.opt.kind == CASTOR_OPT_SGD) {
        static const float moms[] = {0.0f, 0.5f, 0.9f, 0.0f};
        r.opt.momentum = moms[(b2 >> 5) & 3];
        r.opt.nesterov = r.opt.momentum != 0 && (b2 & 0x80);
    }
    r.seed = b4;
    size_t n = 2 + b3 % 8;
    float x[MAX_N * MAX_F], t[MAX_N * 4];
    int32_t y[MAX_N];
    for (size_t i = 0; i < n * (size_t)r.features; i++)
        x[i] = unit();
    for (size_t i = 0; i < n; i++)
        y[i] = (int32_t)(u8() % (unsigned)outs);
    for (size_t i = 0; i < n * (size_t)outs; i++)
        t[i] = unit();
    rc = castor_dataset_from_memory(&r.ds, x, n, r.features,
                                    r.loss == CASTOR_LOSS_SOFTMAX_XENT ? y : NULL,
                                    r.loss == CASTOR_LOSS_SOFTMAX_XENT ? NULL : t, outs);
    expect(rc, B(CASTOR_OK), "resume: from_memory", castor_dataset_errmsg(r.ds));
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = replicas + (int)((b3 >> 3) % (n - (size_t)replicas + 1));
    fo.epochs = 1 + (int)((b3 >> 6) % 3);
    fo.shuffle = (int)(b4 & 1);
    int64_t spe = (int64_t)((n + (size_t)fo.batch_size - 1) / (size_t)fo.batch_size);
    int64_t total = spe * fo.epochs;
    int64_t split = 1 + (int64_t)(u8() % (unsigned)total);
    int how = (int)(u8() & 1);

    /* Straight through. */
    castor_model *a = resume_model(&r);
    rc = castor_model_fit(a, r.ds, &fo, NULL);
    expect(rc, B(CASTOR_OK), "resume: fit", castor_model_errmsg(a));
    size_t np = castor_model_num_params(a);
    float *want = malloc(np * sizeof *want), *got = malloc(np * sizeof *got);
    if (!want || !got)
        abort();
    expect(castor_model_get_params(a, want, np), B(CASTOR_OK), "resume: get", "");
    CHECK(castor_model_step(a) == total && castor_model_epoch(a) == fo.epochs, "resume: steps");
    castor_model_free(a);

    /* In two parts. */
    castor_model *b = resume_model(&r);
    castor_fit_options part = fo;
    part.max_steps = split;
    rc = castor_model_fit(b, r.ds, &part, NULL);
    expect(rc, B(CASTOR_OK), "resume: first part", castor_model_errmsg(b));
    CHECK(castor_model_step(b) == split, "resume: first part took %lld steps, not %lld",
          (long long)castor_model_step(b), (long long)split);
    char path[128];
    snprintf(path, sizeof path, "%s/resume.safetensors", dir);
    rc = castor_model_save(b, path);
    expect(rc, B(CASTOR_OK), "resume: save", castor_model_errmsg(b));
    castor_model_free(b);
    castor_model *c = NULL;
    if (how) {
        rc = castor_model_open(&c, path, r.s);
        expect(rc, B(CASTOR_OK), "resume: open", castor_model_errmsg(c));
    } else {
        resume_setup other = r;
        other.seed = r.seed + 1;  /* the file's seed replaces it */
        if (r.opt.kind == CASTOR_OPT_SGD && r.opt.momentum != 0)
            other.opt.momentum = 0.25f;  /* and so do its hyper-parameters */
        else
            other.opt.learning_rate *= 3;
        c = resume_model(&other);
        rc = castor_model_load(c, path);
        expect(rc, B(CASTOR_OK), "resume: load", castor_model_errmsg(c));
    }
    unlink(path);
    CHECK(castor_model_step(c) == split, "resume: loaded at step %lld, saved at %lld",
          (long long)castor_model_step(c), (long long)split);
    part = fo;
    part.epochs = fo.epochs - (int)castor_model_epoch(c);
    if (part.epochs > 0) {
        rc = castor_model_fit(c, r.ds, &part, NULL);
        expect(rc, B(CASTOR_OK), "resume: second part", castor_model_errmsg(c));
    }
    CHECK(castor_model_step(c) == total && castor_model_epoch(c) == fo.epochs &&
              castor_model_step_in_epoch(c) == 0,
          "resume: ends at step %lld epoch %lld, not %lld %d", (long long)castor_model_step(c),
          (long long)castor_model_epoch(c), (long long)total, fo.epochs);
    expect(castor_model_get_params(c, got, np), B(CASTOR_OK), "resume: get", "");
    for (size_t i = 0; i < np; i++)
        CHECK(memcmp(&want[i], &got[i], sizeof *got) == 0,
              "resume (%s, %s on %s, %s, batch %d of %zu, %d epochs, shuffle %d, split at "
              "step %lld of %lld by %s): variable %zu is %.9g, straight through %.9g",
              r.spec, castor_optimizer_kind_name(r.opt.kind),
              devices[b0 % 3], castor_strategy_kind_name(castor_strategy_get_kind(r.s)),
              fo.batch_size, n, fo.epochs, fo.shuffle, (long long)split, (long long)total,
              how ? "open" : "load", i, (double)got[i], (double)want[i]);
    free(want);
    free(got);
    castor_model_free(c);
    castor_dataset_free(r.ds);
    castor_strategy_free(r.s);
}

/* ---- the rest ------------------------------------------------------------------ */

static void op_names(void)
{
    int code = (int)u8() - 64;
    const char *s = castor_errstr(code);
    CHECK(s && s[0], "errstr(%d)", code);
    char name[8];
    for (size_t i = 0; i < sizeof name - 1; i++)
        name[i] = (char)u8();
    name[sizeof name - 1] = '\0';
    castor_activation a = (castor_activation)99;
    int rc = castor_activation_parse(name, &a);
    CHECK(rc == CASTOR_OK ? (int)a >= 0 && a <= 3 : rc == CASTOR_INVALID && (int)a == 99,
          "activation_parse");
    castor_optimizer_kind k = (castor_optimizer_kind)99;
    rc = castor_optimizer_kind_parse(name, &k);
    CHECK(rc == CASTOR_OK ? (int)k >= 0 && k <= 2 : rc == CASTOR_INVALID && (int)k == 99,
          "optimizer_kind_parse");
    castor_strategy_kind sk = (castor_strategy_kind)99;
    rc = castor_strategy_kind_parse(name, &sk);
    CHECK(rc == CASTOR_OK ? (int)sk >= 0 && sk <= 1 : rc == CASTOR_INVALID && (int)sk == 99,
          "strategy_kind_parse");
}

static void do_op(void)
{
    switch (pick(22)) {
    case 0:
        op_names();
        break;
    case 1:
        op_strategy_free();
        break;
    case 2:
        op_model_create();
        break;
    case 3:
        op_layers_spec();
        break;
    case 4:
        op_add_dense();
        break;
    case 5:
        op_add_layers();
        break;
    case 6:
        op_compile();
        break;
    case 7:
        op_model_free();
        break;
    case 8:
        op_dataset_create();
        break;
    case 9:
        op_dataset_split();
        break;
    case 10:
        op_dataset_free();
        break;
    case 11:
    case 12:
        op_fit();
        break;
    case 13:
        op_evaluate();
        break;
    case 14:
        op_predict();
        break;
    case 15:
        op_params();
        break;
    case 16:
        op_learning_rate();
        break;
    case 17:
        op_stats();
        break;
    case 18:
        op_stop_check();
        break;
    case 19:
        op_save();
        break;
    case 20:
        if (u8() & 1)
            op_damage();
        else
            op_load();
        break;
    default:
        switch (u8() % 5) {
        case 0:
        case 1:
            op_open();
            break;
        case 2:
            op_resume();
            break;
        default:
            op_strategy_create();
        }
    }
}

/* What castor.h says of every call on NULL, and of the names: checked once. */
static void static_checks(void)
{
    for (int code = -3; code < 20; code++)
        CHECK(castor_errstr(code) && castor_errstr(code)[0], "errstr(%d)", code);
    CHECK(castor_version_number() == CASTOR_VERSION_NUMBER, "version");
    CHECK(strcmp(castor_version(), CASTOR_VERSION_STRING) == 0, "version string");
    CHECK(strcmp(castor_activation_name((castor_activation)9), "unknown") == 0, "name");
    CHECK(strcmp(castor_optimizer_kind_name((castor_optimizer_kind)9), "unknown") == 0, "name");
    CHECK(strcmp(castor_strategy_kind_name((castor_strategy_kind)9), "unknown") == 0, "name");
    castor_activation a = CASTOR_ACT_TANH;
    CHECK(castor_activation_parse(NULL, &a) == CASTOR_INVALID && a == CASTOR_ACT_TANH, "parse");
    CHECK(castor_activation_parse("relu", NULL) == CASTOR_INVALID, "parse");
    CHECK(castor_activation_parse("ReLu", &a) == CASTOR_OK && a == CASTOR_ACT_RELU, "parse");
    CHECK(castor_strategy_create(NULL, CASTOR_STRATEGY_CENTRAL, "cpu", NULL) == CASTOR_MISUSE,
          "create(NULL)");
    CHECK(castor_model_create(NULL, 3) == CASTOR_MISUSE, "create(NULL)");
    float x = 0;
    int32_t y = 0;
    CHECK(castor_dataset_from_memory(NULL, &x, 1, 1, &y, NULL, 0) == CASTOR_MISUSE, "from(NULL)");
    CHECK(castor_model_add_dense(NULL, 3, CASTOR_ACT_RELU) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_add_layers(NULL, "3") == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_compile(NULL, NULL, CASTOR_LOSS_MSE, NULL, 0) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_fit(NULL, NULL, NULL, NULL) == CASTOR_MISUSE, "NULL");
    castor_metrics met;
    CHECK(castor_model_evaluate(NULL, NULL, 1, &met) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_predict(NULL, &x, 1, 1, &x) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_get_params(NULL, &x, 1) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_set_params(NULL, &x, 1) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_set_learning_rate(NULL, 0.1f) == CASTOR_MISUSE, "NULL");
    int fin;
    CHECK(castor_model_all_finite(NULL, &fin) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_set_stop_check(NULL, NULL, NULL) == CASTOR_MISUSE, "NULL");
    castor_run_stats st;
    CHECK(castor_model_run_stats(NULL, &st) == CASTOR_MISUSE, "NULL");
    castor_model_reset_run_stats(NULL);
    CHECK(castor_model_save(NULL, "x") == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_load(NULL, "x") == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_open(NULL, "x", NULL) == CASTOR_MISUSE, "NULL");
    castor_dataset *tail;
    CHECK(castor_dataset_split_tail(NULL, 1, &tail) == CASTOR_MISUSE, "NULL");
    char buf[8];
    CHECK(castor_model_layers_spec(NULL, buf, sizeof buf) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_learning_rate(NULL) == 0.0f, "NULL");
    CHECK(castor_strategy_replicas(NULL) == 0, "NULL");
    CHECK(errmsg_ok(castor_model_errmsg(NULL)) && errmsg_ok(castor_strategy_errmsg(NULL)) &&
              errmsg_ok(castor_dataset_errmsg(NULL)),
          "errmsg(NULL)");
    castor_model_free(NULL);
    castor_strategy_free(NULL);
    castor_dataset_free(NULL);
}

/* A directory of its own for each input, made as it starts and removed
 * as it ends (libFuzzer leaves with _Exit: no atexit would remove one kept
 * for the process; after a crash it stays, to tell why). */
static void make_dir(void)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/castor-fuzz-api-XXXXXX", base);
    if (!mkdtemp(dir))
        abort();
    for (int f = 0; f < NF; f++)
        snprintf(paths[f], sizeof paths[f], "%s/ck%d.safetensors", dir, f);
    snprintf(subdir, sizeof subdir, "%s/sub", dir);
    snprintf(link_path, sizeof link_path, "%s/link.safetensors", dir);
    if (mkdir(subdir, 0700) || symlink(strrchr(paths[NF - 1], '/') + 1, link_path))
        abort();
}

static void remove_dir(void)
{
    for (int f = 0; f < NF; f++)
        unlink(paths[f]);
    unlink(link_path);
    CHECK(rmdir(subdir) == 0 && rmdir(dir) == 0, "%s is not empty", dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    trace = getenv("FUZZ_API_TRACE") != NULL;
    openblas_set_num_threads(1);
    static_checks();
    return 0;
}

/* Nothing but the checkpoints may be left in the directory: a save writes
 * a temporary file and renames it, or removes it on failure. */
static void check_dir(void)
{
    DIR *dp = opendir(dir);
    if (!dp)
        abort();
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        int ours = strcmp(e->d_name, strrchr(subdir, '/') + 1) == 0 ||
                   strcmp(e->d_name, strrchr(link_path, '/') + 1) == 0;
        for (int f = 0; f < NF; f++)
            ours |= strcmp(e->d_name, strrchr(paths[f], '/') + 1) == 0;
        CHECK(ours, "%s left in the checkpoint directory", e->d_name);
    }
    closedir(dp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    in_p = data;
    in_n = size;
    in_i = 0;
    make_dir();
    for (int s = 0; s < NS; s++)
        strats[s].bound = -1;
    unsigned order = u8();
    for (int i = 0; i < MAX_OPS && in_i < in_n; i++)
        do_op();
    CHECK(n_runs == 0 && cb_depth == 0, "run stack");
    /* Everything freed, in an order the input picks. */
    for (int k = 0; k < 3; k++) {
        switch ((order + (unsigned)k) % 3) {
        case 0:
            for (int m = 0; m < NM; m++)
                model_free((m + (int)(order >> 2)) % NM);
            break;
        case 1:
            for (int s = 0; s < NS; s++)
                strat_free((s + (int)(order >> 4)) % NS);
            break;
        default:
            for (int d = 0; d < ND; d++)
                data_free(d);
        }
    }
    for (int f = 0; f < NF; f++)
        file_forget(f);
    check_dir();
    remove_dir();
    return 0;
}

/*
 * Strategies, models and datasets: made, given layers, compiled, split and freed,
 * with good arguments and bad ones.
 */
#include <math.h>
#include <string.h>

#include "tests/fuzz/api/harness.h"

/* ---- strategies --------------------------------------------------------------- */

void strat_free(int s)
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

void op_strategy_create(void)
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

void op_strategy_free(void)
{
    int s = pick(NS);
    /* Freeing a running model's strategy from its callback stops the call
     * (castor.h); the stack of calls keeps track. */
    strat_free(s);
}

/* ---- models -------------------------------------------------------------------- */

void model_free(int m)
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
hmodel *fresh_model(int m)
{
    if (models[m].h && (model_busy(m) || models[m].zombie))
        return NULL;
    model_free(m);
    return &models[m];
}

void op_model_create(void)
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
hmodel *some_model(int *slot)
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
hmodel *some_model_to_call(int *slot)
{
    hmodel *M = some_model(slot);
    return M && !M->open_failed ? M : NULL;
}

/* A strategy slot, or NS (NULL); with the byte's top bit, the first from
 * there that is free for a model. */
int some_strategy(void)
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

void op_add_dense(void)
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

void op_add_layers(void)
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


/* A learning rate for compile or set_learning_rate: mostly good, some refused. */
float pick_learning_rate(void)
{
    return PICKF(LRS);
}

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

void op_compile(void)
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

void op_model_free(void)
{
    model_free(pick(NM));
}

/* ---- datasets ------------------------------------------------------------------ */

void data_free(int d)
{
    if (data_busy(d))
        return;  /* castor.h: the data a running call reads must not be freed */
    castor_dataset_free(datas[d].h);
    memset(&datas[d], 0, sizeof datas[d]);
}

void op_dataset_create(void)
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

void op_dataset_split(void)
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

void op_dataset_free(void)
{
    data_free(pick(ND));
}

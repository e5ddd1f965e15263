/*
 * Device faults injected into training steps: every device operation, on
 * every replica, at every call a step makes, for both strategies. After the
 * failed step the model must either be as it was (the next step trains as
 * if nothing had happened) or refuse work until set_params restores it.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"
#include "device/cpu/cpu_streams.h"
#include "device/device.h"
#include "src/model.h"
#include "src/strategy.h"
#include "support.h"

#define F 6
#define C 3

enum { OP_H2D, OP_D2H, OP_D2D, OP_MEMSET, OP_GEMM, OP_BIAS_ADD, OP_BIAS_GRAD, OP_ACT_F,
       OP_ACT_B, OP_XENT, OP_MSE, OP_ADD, OP_OPTIM, OP_SYNC, OP_RECORD, OP_WAIT, OP_ALLOC,
       OP_EVENT, OP_N };
static const char *const op_names[OP_N] = {
    "copy_h2d", "copy_d2h", "copy_d2d", "memset0", "gemm", "bias_add", "bias_grad",
    "act_forward", "act_backward", "softmax_xent", "mse", "add", "optimizer_step",
    "synchronize", "event_record", "stream_wait", "alloc", "event_create"};

#define MAXDEV 8
static struct {
    cdev *dev;
    const cdev_iface *real;
    long calls[OP_N];
} inj[MAXDEV];
static int inj_n;
static cdev *fail_dev;
static int fail_op;
static long fail_at;  /* 1-based call of fail_op on fail_dev; 0: count only */
static int failed;
/* Asynchronous: the failing op is dropped, as queued work that faulted, and
 * the device's next synchronize reports it. */
static int async_mode;
static cdev *async_pending;

static int slot(cdev *dev)
{
    for (int i = 0; i < inj_n; i++)
        if (inj[i].dev == dev)
            return i;
    cr_assert_fail("unknown device");
    return -1;
}

/* Whether this call fails; counts it. */
static int hit(cdev *dev, int op, const cdev_iface **real)
{
    int i = slot(dev);
    *real = inj[i].real;
    long n = ++inj[i].calls[op];
    if (dev == fail_dev && op == fail_op && n == fail_at) {
        failed = 1;
        if (async_mode && op != OP_SYNC && op != OP_RECORD && op != OP_WAIT &&
            op != OP_ALLOC && op != OP_EVENT) {
            async_pending = dev;
            return -1;
        }
        return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected %s failure", dev->name,
                                 op_names[op]);
    }
    return CASTOR_OK;
}

#define WRAP(op, fn, params, args)                                                           \
    static int w_##fn params                                                                 \
    {                                                                                        \
        const cdev_iface *real_;                                                              \
        int rc = hit(dev, op, &real_);                                                       \
        if (rc == -1)                                                                        \
            return CASTOR_OK;                                                                \
        return rc ? rc : real_->fn args;                                                     \
    }
WRAP(OP_H2D, copy_h2d, (cdev *dev, int s, void *d, const void *h, size_t b), (dev, s, d, h, b))
WRAP(OP_D2H, copy_d2h, (cdev *dev, int s, void *h, const void *d, size_t b), (dev, s, h, d, b))
WRAP(OP_D2D, copy_d2d, (cdev *dev, int s, void *d, const void *x, size_t b), (dev, s, d, x, b))
WRAP(OP_MEMSET, memset0, (cdev *dev, int s, void *d, size_t b), (dev, s, d, b))
WRAP(OP_GEMM, gemm,
     (cdev *dev, int ta, int tb, int m, int n, int k, float al, const float *a, int lda,
      const float *b, int ldb, float be, float *c, int ldc),
     (dev, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc))
WRAP(OP_BIAS_ADD, bias_add, (cdev *dev, float *y, const float *b, int r, int c),
     (dev, y, b, r, c))
WRAP(OP_BIAS_GRAD, bias_grad, (cdev *dev, const float *dy, float *db, int r, int c),
     (dev, dy, db, r, c))
WRAP(OP_ACT_F, act_forward, (cdev *dev, castor_activation a, float *y, size_t n),
     (dev, a, y, n))
WRAP(OP_ACT_B, act_backward, (cdev *dev, castor_activation a, const float *y, float *dy,
     size_t n), (dev, a, y, dy, n))
WRAP(OP_XENT, softmax_xent,
     (cdev *dev, const float *l, const int32_t *lab, int r, int c, float g, float *dl, float *st),
     (dev, l, lab, r, c, g, dl, st))
WRAP(OP_MSE, mse,
     (cdev *dev, const float *p, const float *t, int r, int c, float g, float *dp, float *st),
     (dev, p, t, r, c, g, dp, st))
WRAP(OP_ADD, add, (cdev *dev, float *d, const float *s, size_t n), (dev, d, s, n))
WRAP(OP_OPTIM, optimizer_step,
     (cdev *dev, const castor_optimizer *o, float *p, const float *g, float *st, size_t n,
      int64_t step), (dev, o, p, g, st, n, step))
WRAP(OP_RECORD, event_record, (cdev *dev, cdev_event *e, int s), (dev, e, s))
WRAP(OP_WAIT, stream_wait, (cdev *dev, int s, cdev_event *e), (dev, s, e))
WRAP(OP_ALLOC, alloc, (cdev *dev, size_t b, void **d), (dev, b, d))
WRAP(OP_EVENT, event_create, (cdev *dev, cdev_event **e), (dev, e))

/* A failing synchronize has run the queued work (as a kernel that faulted
 * has run), and says it failed. */
static int w_synchronize(cdev *dev)
{
    int i = slot(dev);
    int rc = inj[i].real->synchronize(dev);
    long n = ++inj[i].calls[OP_SYNC];
    if (!rc && async_pending == dev) {
        async_pending = NULL;
        return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected failure of queued work",
                                 dev->name);
    }
    if (!rc && dev == fail_dev && fail_op == OP_SYNC && n == fail_at) {
        failed = 1;
        return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected synchronize failure",
                                 dev->name);
    }
    return rc;
}

static cdev_iface wrapped[MAXDEV];

/* A call that failed has waited for what it queued: nothing of it may run
 * later, over the buffers the next call uses. */
static void assert_nothing_queued(const castor_strategy *s, const char *what)
{
    for (int i = 0; i < s->n_replicas; i++)
        cr_assert_eq(castor__cpu_streams_pending(s->devs[i]->ctx), 0,
                     "%s: work left queued on replica %d", what, i);
}

static void inject(castor_strategy *s)
{
    inj_n = s->n_replicas;
    for (int i = 0; i < inj_n; i++) {
        cdev *d = s->devs[i];
        inj[i].dev = d;
        inj[i].real = d->iface;
        memset(inj[i].calls, 0, sizeof inj[i].calls);
        cdev_iface w = *d->iface;
        w.copy_h2d = w_copy_h2d;
        w.copy_d2h = w_copy_d2h;
        w.copy_d2d = w_copy_d2d;
        w.memset0 = w_memset0;
        w.gemm = w_gemm;
        w.bias_add = w_bias_add;
        w.bias_grad = w_bias_grad;
        w.act_forward = w_act_forward;
        w.act_backward = w_act_backward;
        w.softmax_xent = w_softmax_xent;
        w.mse = w_mse;
        w.add = w_add;
        w.optimizer_step = w_optimizer_step;
        w.synchronize = w_synchronize;
        w.event_record = w_event_record;
        w.stream_wait = w_stream_wait;
        w.alloc = w_alloc;
        w.event_create = w_event_create;
        wrapped[i] = w;
        d->iface = &wrapped[i];
    }
}

static void uninject(void)
{
    for (int i = 0; i < inj_n; i++)
        inj[i].dev->iface = inj[i].real;
    inj_n = 0;
    fail_dev = NULL;
    async_pending = NULL;
}

/* The calls each replica made since inject(), into counts, then uninject();
 * returns the number of replicas. */
static int take_counts(long counts[MAXDEV][OP_N])
{
    int nrep = inj_n;
    for (int i = 0; i < nrep; i++)
        memcpy(counts[i], inj[i].calls, sizeof counts[i]);
    uninject();
    return nrep;
}

/* Inject, failing the at-th call of op on dev (queued with async). */
static void inject_fault(castor_strategy *s, cdev *dev, int op, long at, int async)
{
    inject(s);
    fail_dev = dev;
    fail_op = op;
    fail_at = at;
    failed = 0;
    async_mode = async;
}

typedef struct scenario {
    castor_strategy_kind kind;
    const char *devices;
    int n;          /* samples */
    int batch;
    int warm_steps; /* before the faulty one */
    int async;
} scenario;

static castor_model *make(const scenario *sc, castor_strategy **s)
{
    cr_assert_eq(castor_strategy_create(s, sc->kind, sc->devices, NULL), CASTOR_OK, "%s",
                 castor_strategy_errmsg(*s));
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "5:tanh,3"), CASTOR_OK);
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    cr_assert_eq(castor_model_compile(m, *s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 7), CASTOR_OK,
                 "%s", castor_model_errmsg(m));
    return m;
}

static int fit_steps(castor_model *m, castor_dataset *ds, const scenario *sc, int steps)
{
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 1000;
    fo.batch_size = sc->batch;
    fo.max_steps = steps;
    return castor_model_fit(m, ds, &fo, NULL);
}

static float *params_of(castor_model *m)
{
    size_t n = castor_model_num_params(m);
    float *p = malloc(n * sizeof *p);
    cr_assert_eq(castor_model_get_params(m, p, n), CASTOR_OK, "%s", castor_model_errmsg(m));
    return p;
}

static void sweep(const scenario *sc)
{
    castor_dataset *ds = support_synthetic(3, sc->n, F, C);
    /* The reference: warm_steps + 2 steps with no fault. */
    castor_strategy *s = NULL;
    castor_model *m = make(sc, &s);
    cr_assert_eq(fit_steps(m, ds, sc, sc->warm_steps + 2), CASTOR_OK, "%s",
                 castor_model_errmsg(m));
    float *want = params_of(m);
    size_t np = castor_model_num_params(m);
    /* Count the calls one step makes. */
    castor_model_free(m);
    castor_strategy_free(s);
    m = make(sc, &s);
    cr_assert_eq(fit_steps(m, ds, sc, sc->warm_steps), CASTOR_OK);
    inject(s);
    long counts[MAXDEV][OP_N];
    cr_assert_eq(fit_steps(m, ds, sc, 1), CASTOR_OK, "%s", castor_model_errmsg(m));
    int nrep = take_counts(counts);
    castor_model_free(m);
    castor_strategy_free(s);

    int cases = 0;
    for (int rep = 0; rep < nrep; rep++)
        for (int op = 0; op < OP_N; op++)
            for (long at = 1; at <= counts[rep][op]; at++) {
                m = make(sc, &s);
                cr_assert_eq(fit_steps(m, ds, sc, sc->warm_steps), CASTOR_OK);
                float *before = params_of(m);  /* also the host's optimizer state */
                castor_run_stats rs0, rs1;
                castor_model_run_stats(m, &rs0);
                int64_t step0 = castor_model_step(m), sie0 = castor_model_step_in_epoch(m);
                int64_t ep0 = castor_model_epoch(m);
                inject_fault(s, s->devs[rep], op, at, sc->async);
                int rc = fit_steps(m, ds, sc, 1);
                uninject();
                char what[160];
                snprintf(what, sizeof what, "%s %s: %s #%ld on replica %d",
                         castor_strategy_kind_name(sc->kind), sc->devices, op_names[op], at, rep);
                cr_assert(failed, "%s: not reached", what);
                cr_assert_neq(rc, CASTOR_OK, "%s: fit succeeded", what);
                cr_assert(strstr(castor_model_errmsg(m), "injected"), "%s: message '%s'", what,
                          castor_model_errmsg(m));
                cr_assert_eq(castor_model_step(m), step0, "%s: step moved", what);
                assert_nothing_queued(s, what);
                cr_assert_eq(castor_model_step_in_epoch(m), sie0, "%s", what);
                cr_assert_eq(castor_model_epoch(m), ep0, "%s", what);
                castor_model_run_stats(m, &rs1);
                cr_assert_eq(rs1.steps, rs0.steps, "%s: run stats counted it", what);
                if (m->inconsistent) {
                    castor_metrics met;
                    cr_assert_eq(castor_model_evaluate(m, ds, sc->batch, &met), CASTOR_DEVICE,
                                 "%s", what);
                    cr_assert_eq(fit_steps(m, ds, sc, 1), CASTOR_DEVICE, "%s", what);
                    cr_assert_eq(castor_model_set_params(m, before, np), CASTOR_OK, "%s: %s",
                                 what, castor_model_errmsg(m));
                } else {
                    float *now = params_of(m);
                    cr_assert(memcmp(now, before, np * sizeof *now) == 0,
                              "%s: consistent but changed", what);
                    free(now);
                }
                castor_metrics met;
                cr_assert_eq(castor_model_evaluate(m, ds, sc->batch, &met), CASTOR_OK, "%s: %s",
                             what, castor_model_errmsg(m));
                cr_assert_eq(fit_steps(m, ds, sc, 2), CASTOR_OK, "%s: retry: %s", what,
                             castor_model_errmsg(m));
                float *got = params_of(m);
                cr_assert(memcmp(got, want, np * sizeof *got) == 0,
                          "%s: the retried steps differ from the reference", what);
                free(got);
                free(before);
                castor_model_free(m);
                castor_strategy_free(s);
                cases++;
            }
    cr_log_info("%s %s: %d faults", castor_strategy_kind_name(sc->kind), sc->devices, cases);
    free(want);
    castor_dataset_free(ds);
}

Test(faults, central_cpu3)
{
    scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu3)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu1)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu", 40, 9, 1, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu1x3)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 1, 0};
    sweep(&sc);
}
/* 10 samples in batches of 3 over 3 replicas: the last batch has 1 row,
 * replicas 1 and 2 none. */
Test(faults, central_cpu3_zero_rows)
{
    scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 10, 3, 3, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu3_zero_rows)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 10, 3, 3, 0};
    sweep(&sc);
}
Test(faults, mirrored_cpu1x3_zero_rows)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 10, 3, 3, 0};
    sweep(&sc);
}

Test(faults, central_cpu3_async)
{
    scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 1};
    sweep(&sc);
}
Test(faults, mirrored_cpu3_async)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 1};
    sweep(&sc);
}
Test(faults, mirrored_cpu1x3_async)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 1, 1};
    sweep(&sc);
}
Test(faults, mirrored_cpu1_async)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu", 40, 9, 1, 1};
    sweep(&sc);
}
Test(faults, central_cpu3_zero_rows_async)
{
    scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 10, 3, 3, 1};
    sweep(&sc);
}

/* ---- faults in the calls around the steps ---- */

enum { ACT_EVALUATE, ACT_PREDICT, ACT_GET, ACT_SET, ACT_SAVE, ACT_LOAD, ACT_EVAL_BIG, ACT_N };
static const char *const act_names[ACT_N] = {"evaluate", "predict", "get_params", "set_params",
                                             "save", "load", "evaluate in larger batches"};

static int act(int a, castor_model *m, castor_dataset *ds, const scenario *sc,
               const float *params, const char *path)
{
    size_t np = castor_model_num_params(m);
    castor_metrics met;
    int rc;
    switch (a) {
    case ACT_EVALUATE:
        return castor_model_evaluate(m, ds, sc->batch, &met);
    case ACT_PREDICT: {
        size_t n = castor_dataset_size(ds);
        float *out = malloc(n * C * sizeof *out);
        rc = castor_model_predict(m, castor_dataset_x(ds), n, sc->batch, out);
        free(out);
        return rc;
    }
    case ACT_GET: {
        float *p = malloc(np * sizeof *p);
        rc = castor_model_get_params(m, p, np);
        free(p);
        return rc;
    }
    case ACT_SET:
        return castor_model_set_params(m, params, np);
    case ACT_SAVE:
        return castor_model_save(m, path);
    case ACT_EVAL_BIG:
        return castor_model_evaluate(m, ds, 3 * sc->batch, &met);
    default:
        return castor_model_load(m, path);
    }
}

static void sweep_calls(const scenario *sc)
{
    castor_dataset *ds = support_synthetic(3, sc->n, F, C);
    char *dir = support_tmpdir();
    char path[4200], path2[4200];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    snprintf(path2, sizeof path2, "%s/b.safetensors", dir);
    castor_strategy *s = NULL;
    castor_model *m = make(sc, &s);
    cr_assert_eq(fit_steps(m, ds, sc, sc->warm_steps + 1), CASTOR_OK);
    float *want = params_of(m);
    size_t np = castor_model_num_params(m);
    castor_model_free(m);
    castor_strategy_free(s);
    int cases = 0;
    for (int a = 0; a < ACT_N; a++) {
        m = make(sc, &s);
        cr_assert_eq(fit_steps(m, ds, sc, sc->warm_steps), CASTOR_OK);
        cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
        /* Trained on since the host's copy was taken (mirrored). */
        cr_assert_eq(fit_steps(m, ds, sc, 1), CASTOR_OK);
        float *p = params_of(m);
        cr_assert_eq(castor_model_load(m, path), CASTOR_OK);
        /* The replicas hold what the host does; as if trained since (mirrored),
         * so that get_params and save read them back. */
        m->host_params_current = 0;
        inject(s);
        cr_assert_eq(act(a, m, ds, sc, p, path2), CASTOR_OK, "%s", castor_model_errmsg(m));
        long counts[MAXDEV][OP_N];
        int nrep = take_counts(counts);
        free(p);
        castor_model_free(m);
        castor_strategy_free(s);
        for (int rep = 0; rep < nrep; rep++)
            for (int op = 0; op < OP_N; op++)
                for (long at = 1; at <= counts[rep][op]; at++) {
                    m = make(sc, &s);
                    cr_assert_eq(fit_steps(m, ds, sc, sc->warm_steps), CASTOR_OK);
                    float *before = params_of(m);
                    int64_t step0 = castor_model_step(m);
                    m->host_params_current = 0;
                    inject_fault(s, s->devs[rep], op, at, sc->async);
                    int rc = act(a, m, ds, sc, before, path);
                    uninject();
                    char what[160];
                    snprintf(what, sizeof what, "%s %s %s: %s #%ld on replica %d",
                             castor_strategy_kind_name(sc->kind), sc->devices, act_names[a],
                             op_names[op], at, rep);
                    cr_assert(failed, "%s: not reached", what);
                    cr_assert_neq(rc, CASTOR_OK, "%s: succeeded", what);
                    /* A dropped copy may leave labels a kernel refuses first. */
                    cr_assert(sc->async || strstr(castor_model_errmsg(m), "injected"),
                              "%s: message '%s'", what, castor_model_errmsg(m));
                    cr_assert_eq(castor_model_step(m), step0, "%s: step moved", what);
                    assert_nothing_queued(s, what);
                assert_nothing_queued(s, what);
                    if (m->inconsistent) {
                        cr_assert(a == ACT_SET || a == ACT_LOAD, "%s: inconsistent", what);
                        cr_assert_eq(castor_model_set_params(m, before, np), CASTOR_OK,
                                     "%s: %s", what, castor_model_errmsg(m));
                    } else {
                        float *now = params_of(m);
                        cr_assert(memcmp(now, before, np * sizeof *now) == 0,
                                  "%s: consistent but changed", what);
                        free(now);
                    }
                    cr_assert_eq(fit_steps(m, ds, sc, 1), CASTOR_OK, "%s: retry: %s", what,
                                 castor_model_errmsg(m));
                    float *got = params_of(m);
                    cr_assert(memcmp(got, want, np * sizeof *got) == 0,
                              "%s: the next step differs from the reference", what);
                    free(got);
                    free(before);
                    castor_model_free(m);
                    castor_strategy_free(s);
                    cases++;
                }
    }
    cr_log_info("calls %s %s: %d faults", castor_strategy_kind_name(sc->kind), sc->devices,
                cases);
    support_rmrf(dir);
    free(dir);
    free(want);
    castor_dataset_free(ds);
}

Test(faults, calls_central_cpu3)
{
    scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 0};
    sweep_calls(&sc);
}
Test(faults, calls_central_cpu3_async)
{
    scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 1};
    sweep_calls(&sc);
}
Test(faults, calls_mirrored_cpu3)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 0};
    sweep_calls(&sc);
}
Test(faults, calls_mirrored_cpu3_async)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 1};
    sweep_calls(&sc);
}
Test(faults, calls_mirrored_cpu1x3_async)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 1, 1};
    sweep_calls(&sc);
}

/* ---- faults while compiling ---- */

static void sweep_compile(const scenario *sc)
{
    castor_strategy *s = NULL;
    castor_model *m = make(sc, &s);
    float *want = params_of(m);
    size_t np = castor_model_num_params(m);
    castor_model_free(m);
    castor_optimizer opt = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    inject(s);
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, "5:tanh,3"), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 7), CASTOR_OK);
    long counts[MAXDEV][OP_N];
    int nrep = take_counts(counts);
    castor_model_free(m);
    castor_strategy_free(s);
    int cases = 0;
    for (int rep = 0; rep < nrep; rep++)
        for (int op = 0; op < OP_N; op++)
            for (long at = 1; at <= counts[rep][op]; at++) {
                cr_assert_eq(castor_strategy_create(&s, sc->kind, sc->devices, NULL),
                             CASTOR_OK);
                cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
                cr_assert_eq(castor_model_add_layers(m, "5:tanh,3"), CASTOR_OK);
                inject_fault(s, s->devs[rep], op, at, sc->async);
                int rc = castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 7);
                uninject();
                char what[160];
                snprintf(what, sizeof what, "%s %s compile: %s #%ld on replica %d",
                         castor_strategy_kind_name(sc->kind), sc->devices, op_names[op], at,
                         rep);
                cr_assert(failed, "%s: not reached", what);
                cr_assert_neq(rc, CASTOR_OK, "%s: succeeded", what);
                cr_assert(strstr(castor_model_errmsg(m), "injected"), "%s: message '%s'", what,
                          castor_model_errmsg(m));
                for (int i = 0; i < s->n_replicas; i++)
                    cr_assert_eq(s->devs[i]->used, 0, "%s: %zu bytes left on replica %d", what,
                                 s->devs[i]->used, i);
                float p[1];
                cr_assert_eq(castor_model_get_params(m, p, 1), CASTOR_MISUSE, "%s", what);
                /* Compiled again on the same strategy, it is the model it would have been. */
                cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, &opt, 7),
                             CASTOR_OK, "%s: again: %s", what, castor_model_errmsg(m));
                float *got = params_of(m);
                cr_assert(memcmp(got, want, np * sizeof *got) == 0, "%s: differs", what);
                cr_assert_eq(castor_model_step(m), 0, "%s", what);
                cr_assert_eq(m->inconsistent, 0, "%s", what);
                free(got);
                castor_model_free(m);
                castor_strategy_free(s);
                cases++;
            }
    cr_log_info("compile %s %s: %d faults", castor_strategy_kind_name(sc->kind), sc->devices,
                cases);
    free(want);
}

Test(faults, compile_central_cpu3)
{
    scenario sc = {CASTOR_STRATEGY_CENTRAL, "cpu:3", 40, 9, 1, 0};
    sweep_compile(&sc);
}
Test(faults, compile_mirrored_cpu3)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 0};
    sweep_compile(&sc);
}
Test(faults, compile_mirrored_cpu3_async)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:3", 40, 9, 1, 1};
    sweep_compile(&sc);
}
Test(faults, compile_mirrored_cpu1x3)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 40, 9, 1, 0};
    sweep_compile(&sc);
}

/* A mirrored get_params that failed part-way left its first copy (replica 0's
 * variables into the host's) queued: a load after it placed the file's
 * values, and then that copy ran, ahead of replica 0's upload, and put the
 * old variables back on the host and on replica 0. */
Test(faults, a_failed_read_back_leaves_no_copy_behind)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu:2", 40, 8, 1, 0};
    castor_dataset *ds = support_synthetic(3, sc.n, F, C);
    char *dir = support_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    castor_strategy *s = NULL;
    castor_model *m = make(&sc, &s);
    cr_assert_eq(fit_steps(m, ds, &sc, 1), CASTOR_OK);
    float *saved = params_of(m);
    cr_assert_eq(castor_model_save(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(fit_steps(m, ds, &sc, 1), CASTOR_OK);
    size_t np = castor_model_num_params(m);
    float *p = malloc(np * sizeof *p);

    /* The second copy back (the optimizer state) fails as it is queued. */
    inject_fault(s, s->devs[0], OP_D2H, 2, 0);
    int rc = castor_model_get_params(m, p, np);
    uninject();
    cr_assert(failed);
    cr_assert_eq(rc, CASTOR_DEVICE, "%s", castor_model_errmsg(m));

    cr_assert_eq(castor_model_load(m, path), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert_eq(castor_model_get_params(m, p, np), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert(memcmp(p, saved, np * sizeof *p) == 0, "the loaded variables were overwritten");
    /* And every replica holds them: the host's copy is read back from replica 0. */
    m->host_params_current = 0;
    cr_assert_eq(castor_model_get_params(m, p, np), CASTOR_OK, "%s", castor_model_errmsg(m));
    cr_assert(memcmp(p, saved, np * sizeof *p) == 0, "replica 0 holds other variables");
    free(p);
    free(saved);
    castor_model_free(m);
    castor_strategy_free(s);
    support_rmrf(dir);
    free(dir);
    castor_dataset_free(ds);
}

/* One mirrored replica updates in the same phase as it computes: a failure
 * before the update was queued changed nothing, and the model was marked as
 * if it had (refusing work until set_params, which takes the optimizer
 * state back to the host's last copy of it). */
Test(faults, one_mirrored_replica_failing_before_its_update_stays_consistent)
{
    scenario sc = {CASTOR_STRATEGY_MIRRORED, "cpu", 40, 8, 2, 0};
    castor_dataset *ds = support_synthetic(3, sc.n, F, C);
    castor_strategy *s = NULL;
    castor_model *m = make(&sc, &s);
    cr_assert_eq(fit_steps(m, ds, &sc, sc.warm_steps + 1), CASTOR_OK);
    float *want = params_of(m);
    castor_model_free(m);
    castor_strategy_free(s);
    static const int ops[] = {OP_H2D, OP_GEMM, OP_XENT, OP_OPTIM};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        m = make(&sc, &s);
        cr_assert_eq(fit_steps(m, ds, &sc, sc.warm_steps), CASTOR_OK);
        inject_fault(s, s->devs[0], ops[i], 1, 0);
        int rc = fit_steps(m, ds, &sc, 1);
        uninject();
        cr_assert(failed);
        cr_assert_eq(rc, CASTOR_DEVICE, "%s", castor_model_errmsg(m));
        castor_metrics met;
        cr_assert_eq(castor_model_evaluate(m, ds, sc.batch, &met), CASTOR_OK, "%s: %s",
                     op_names[ops[i]], castor_model_errmsg(m));
        cr_assert_eq(fit_steps(m, ds, &sc, 1), CASTOR_OK, "%s", castor_model_errmsg(m));
        float *got = params_of(m);
        size_t np = castor_model_num_params(m);
        cr_assert(memcmp(got, want, np * sizeof *got) == 0, "%s: the step differs",
                  op_names[ops[i]]);
        free(got);
        castor_model_free(m);
        castor_strategy_free(s);
    }
    free(want);
    castor_dataset_free(ds);
}

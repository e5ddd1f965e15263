/* Device faults injected into a strategy's devices: see fault_inject.h. */
#include "fault_inject.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/cpu/cpu_streams.h"
#include "src/strategy.h"

const char *const fault_op_names[OP_N] = {
    "copy_h2d", "copy_d2h", "copy_d2d", "memset0", "gemm", "bias_add", "bias_grad",
    "act_forward", "act_backward", "softmax_xent", "mse", "add", "optimizer_step",
    "synchronize", "event_record", "stream_wait", "alloc", "event_create"};

/* Written between calls, by the thread that injects; during a call each
 * replica thread counts in its own device's slot only. */
static struct {
    cdev *dev;
    const cdev_iface *real;
    long calls[OP_N];
} inj[MAXDEV];
static int inj_n;
static cdev *fail_dev;
static int fail_op;
static long fail_at;  /* 1-based call of fail_op on fail_dev; 0: count only */
int fault_failed;
/* Asynchronous: the failing op is dropped, as queued work that faulted, and
 * the device's next synchronize reports it. Set on the failing replica's
 * thread while every replica's synchronize reads it: atomic. */
static int async_mode;
static _Atomic(cdev *) async_pending;

static int slot(cdev *dev)
{
    for (int i = 0; i < inj_n; i++)
        if (inj[i].dev == dev)
            return i;
    fprintf(stderr, "fault_inject: %s is not a wrapped device\n", dev->name);
    abort();
}

/* Whether this call fails; counts it. */
static int hit(cdev *dev, int op, const cdev_iface **real)
{
    int i = slot(dev);
    *real = inj[i].real;
    long n = ++inj[i].calls[op];
    if (dev == fail_dev && op == fail_op && n == fail_at) {
        fault_failed = 1;
        if (async_mode && op != OP_SYNC && op != OP_RECORD && op != OP_WAIT &&
            op != OP_ALLOC && op != OP_EVENT) {
            async_pending = dev;
            return -1;
        }
        return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected %s failure", dev->name,
                                 fault_op_names[op]);
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
    cdev *mine = dev;
    if (!rc && atomic_compare_exchange_strong(&async_pending, &mine, NULL))
        return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected failure of queued work",
                                 dev->name);
    if (!rc && dev == fail_dev && fail_op == OP_SYNC && n == fail_at) {
        fault_failed = 1;
        return castor__cdev_fail(dev, CASTOR_DEVICE, "%s: injected synchronize failure",
                                 dev->name);
    }
    return rc;
}

static cdev_iface wrapped[MAXDEV];

size_t fault_queued(const castor_strategy *s, int i)
{
    return castor__cpu_streams_pending(s->devs[i]->ctx);
}

void fault_inject(castor_strategy *s)
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

void fault_uninject(void)
{
    for (int i = 0; i < inj_n; i++)
        inj[i].dev->iface = inj[i].real;
    inj_n = 0;
    fail_dev = NULL;
    async_pending = NULL;
}

int fault_take_counts(long counts[MAXDEV][OP_N])
{
    int nrep = inj_n;
    for (int i = 0; i < nrep; i++)
        memcpy(counts[i], inj[i].calls, sizeof counts[i]);
    fault_uninject();
    return nrep;
}

void fault_arm(castor_strategy *s, cdev *dev, int op, long at, int async)
{
    fault_inject(s);
    fail_dev = dev;
    fail_op = op;
    fail_at = at;
    fault_failed = 0;
    async_mode = async;
}

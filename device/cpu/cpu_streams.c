/* The emulated device's streams: queues, events as vector clocks, and the
 * check that conflicting accesses on two streams are ordered (cpu_streams.h). */
#include "device/cpu/cpu_streams.h"

#include <stdlib.h>
#include <string.h>

/* Records beyond this many are first pruned of those every stream is
 * already ordered after (they can conflict with nothing any more). */
#define PRUNE_AT 1024
/* A repeated access (same bytes, stream and kind: a copy in a loop) moves
 * the last record of it forward rather than adding one, looked for this far
 * back: a timing loop of copies then checks against a few records, not
 * thousands. */
#define SAME_LOOKBACK 8

typedef struct access_rec {
    uintptr_t lo, hi;  /* [lo, hi) */
    int stream;
    int write;
    uint64_t epoch;    /* the operation's place on its stream (1-based) */
    const char *op;
} access_rec;

typedef struct op_queue {
    castor__cpu_op *ops;
    size_t head, len, cap;  /* ops[head..len) are still to run */
} op_queue;

struct castor__cpu_streams {
    op_queue q[CDEV_NUM_STREAMS];
    /* clock[s][t]: how many of stream t's entries stream s's next operation
     * is ordered after. clock[s][s] is the number queued on s. */
    uint64_t clock[CDEV_NUM_STREAMS][CDEV_NUM_STREAMS];
    uint64_t done[CDEV_NUM_STREAMS];  /* entries of each stream run (or dropped) */
    access_rec *recs;                 /* accesses since the last synchronize */
    size_t n_recs, cap_recs;
    int kept_rc;                      /* a failure of a flush, for the next sync */
    char kept_msg[sizeof(((cdev *)0)->errmsg)];
};

static const char *stream_name(int s)
{
    static const char *const names[CDEV_NUM_STREAMS] = {"compute", "h2d", "d2h"};
    return names[s];
}

castor__cpu_streams *castor__cpu_streams_new(void)
{
    return calloc(1, sizeof(castor__cpu_streams));
}

void castor__cpu_streams_free(castor__cpu_streams *st)
{
    if (!st)
        return;
    for (int s = 0; s < CDEV_NUM_STREAMS; s++)
        free(st->q[s].ops);
    free(st->recs);
    free(st);
}

static int ordered(const castor__cpu_streams *st, int stream, const access_rec *r)
{
    return r->stream == stream || st->clock[stream][r->stream] >= r->epoch;
}

static int conflict(cdev *dev, int stream, const char *op, const castor__cpu_access *a,
                    const access_rec *r)
{
    return castor__cdev_fail(
        dev, CASTOR_MISUSE,
        "%s: %s on the %s stream %s %zu bytes at %p that %s on the %s stream %s, with no event "
        "ordering the two: record an event after the one and stream_wait for it before the "
        "other (or synchronize)",
        dev->name, op, stream_name(stream), a->write ? "writes" : "reads", a->bytes, a->ptr,
        r->op, stream_name(r->stream), r->write ? "writes" : "reads");
}

static void prune(castor__cpu_streams *st)
{
    size_t kept = 0;
    for (size_t i = 0; i < st->n_recs; i++) {
        int all = 1;
        for (int s = 0; s < CDEV_NUM_STREAMS && all; s++)
            all = ordered(st, s, &st->recs[i]);
        if (!all)
            st->recs[kept++] = st->recs[i];
    }
    st->n_recs = kept;
}

/* items (*cap of them, elem bytes each, fewer than need) grown to hold
 * need: where they are now, or NULL (items untouched) when out of memory. */
static void *grow(void *items, size_t *cap, size_t need, size_t elem)
{
    size_t n = *cap ? 2 * *cap : 64;
    while (n < need)
        n *= 2;
    void *p = realloc(items, n * elem);
    if (p)
        *cap = n;
    return p;
}

static int room_for_records(castor__cpu_streams *st, int n)
{
    if (st->n_recs + (size_t)n <= st->cap_recs)
        return 1;
    if (st->n_recs >= PRUNE_AT) {
        prune(st);
        if (st->n_recs + (size_t)n <= st->cap_recs)
            return 1;
    }
    access_rec *p = grow(st->recs, &st->cap_recs, st->n_recs + (size_t)n, sizeof *p);
    return p ? (st->recs = p, 1) : 0;
}

static int room_for_op(op_queue *q)
{
    if (q->len < q->cap)
        return 1;
    castor__cpu_op *p = grow(q->ops, &q->cap, q->len + 1, sizeof *p);
    return p ? (q->ops = p, 1) : 0;
}

static void add_record(castor__cpu_streams *st, int stream, const char *op,
                       const castor__cpu_access *a, uint64_t epoch)
{
    uintptr_t lo = (uintptr_t)a->ptr, hi = lo + a->bytes;
    size_t stop = st->n_recs > SAME_LOOKBACK ? st->n_recs - SAME_LOOKBACK : 0;
    for (size_t i = st->n_recs; i-- > stop;) {
        access_rec *r = &st->recs[i];
        if (r->lo == lo && r->hi == hi && r->stream == stream && r->write == a->write) {
            r->epoch = epoch;  /* later on the same stream: the stronger constraint */
            r->op = op;
            return;
        }
    }
    st->recs[st->n_recs++] = (access_rec){lo, hi, stream, a->write, epoch, op};
}

int castor__cpu_streams_enqueue(cdev *dev, castor__cpu_streams *st, int stream,
                                const castor__cpu_op *op, const castor__cpu_access *acc,
                                int n_acc)
{
    for (int i = 0; i < n_acc; i++) {
        const castor__cpu_access *a = &acc[i];
        if (!a->bytes)
            continue;
        uintptr_t lo = (uintptr_t)a->ptr, hi = lo + a->bytes;
        for (size_t j = 0; j < st->n_recs; j++) {
            const access_rec *r = &st->recs[j];
            if (r->hi <= lo || hi <= r->lo || (!a->write && !r->write) || ordered(st, stream, r))
                continue;
            return conflict(dev, stream, op->name, a, r);
        }
    }
    op_queue *q = &st->q[stream];
    if (!room_for_op(q) || !room_for_records(st, n_acc))
        return castor__cdev_fail(dev, CASTOR_NOMEM, "%s: no host memory to queue %s", dev->name,
                                 op->name);
    uint64_t epoch = ++st->clock[stream][stream];
    q->ops[q->len++] = *op;
    for (int i = 0; i < n_acc; i++)
        if (acc[i].bytes)
            add_record(st, stream, op->name, &acc[i], epoch);
    return CASTOR_OK;
}

void castor__cpu_streams_record(castor__cpu_streams *st, int stream, cdev_event *ev)
{
    ev->recorded = 1;
    ev->stream = stream;
    ev->seq = st->clock[stream][stream];
    memcpy(ev->clock, st->clock[stream], sizeof ev->clock);
}

int castor__cpu_streams_wait(cdev *dev, castor__cpu_streams *st, int stream,
                             const cdev_event *ev)
{
    if (!ev->recorded || ev->stream == stream)
        return CASTOR_OK;  /* nothing to wait for, or already in stream order */
    castor__cpu_op wait = {.run = NULL, .name = "stream_wait", .wait_stream = ev->stream,
                           .wait_seq = ev->seq};
    int rc = castor__cpu_streams_enqueue(dev, st, stream, &wait, NULL, 0);
    if (rc)
        return rc;
    for (int t = 0; t < CDEV_NUM_STREAMS; t++)
        if (ev->clock[t] > st->clock[stream][t])
            st->clock[stream][t] = ev->clock[t];
    return CASTOR_OK;
}

/* Run every queued entry, each stream as far as its waits allow, the copy
 * streams first: a copy that lacks its wait then runs before the work it
 * should have waited for, and moves stale bytes. Waits point only at
 * entries queued before them, so every pass runs something. After a
 * failure the rest is dropped, unrun. */
static int run_all(cdev *dev, castor__cpu_streams *st)
{
    int rc = CASTOR_OK;
    for (;;) {
        int pending = 0, ran = 0;
        for (int s = CDEV_NUM_STREAMS - 1; s >= 0; s--) {
            op_queue *q = &st->q[s];
            while (q->head < q->len) {
                const castor__cpu_op *op = &q->ops[q->head];
                if (!op->run && !rc && st->done[op->wait_stream] < op->wait_seq)
                    break;
                if (op->run && !rc)
                    rc = op->run(dev, op);
                q->head++;
                st->done[s]++;
                ran = 1;
            }
            pending |= q->head < q->len;
        }
        if (!pending)
            break;
        if (!ran) {  /* cannot happen: waits only look back */
            rc = castor__cdev_fail(dev, CASTOR_ERROR, "%s: queued work waits in a cycle",
                                   dev->name);
            for (int s = 0; s < CDEV_NUM_STREAMS; s++) {
                st->done[s] += st->q[s].len - st->q[s].head;
                st->q[s].head = st->q[s].len;
            }
            break;
        }
    }
    /* Everything queued has run: every stream is now ordered after all of it. */
    for (int s = 0; s < CDEV_NUM_STREAMS; s++) {
        st->q[s].head = st->q[s].len = 0;
        for (int t = 0; t < CDEV_NUM_STREAMS; t++)
            st->clock[s][t] = st->clock[t][t];
    }
    st->n_recs = 0;
    return rc;
}

size_t castor__cpu_streams_pending(const castor__cpu_streams *st)
{
    size_t n = 0;
    for (int s = 0; s < CDEV_NUM_STREAMS; s++)
        n += st->q[s].len - st->q[s].head;
    return n;
}

void castor__cpu_streams_flush(cdev *dev, castor__cpu_streams *st)
{
    int rc = run_all(dev, st);
    if (rc && !st->kept_rc) {
        st->kept_rc = rc;
        memcpy(st->kept_msg, dev->errmsg, sizeof st->kept_msg);
    }
}

int castor__cpu_streams_sync(cdev *dev, castor__cpu_streams *st)
{
    int rc = run_all(dev, st);
    if (st->kept_rc) {  /* it came first */
        rc = st->kept_rc;
        memcpy(dev->errmsg, st->kept_msg, sizeof dev->errmsg);
        st->kept_rc = 0;
    }
    return rc;
}

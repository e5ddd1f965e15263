/*
 * The callbacks a running call makes (progress, stop check, log), which run calls
 * of their own, and the stack of running calls that tells which calls castor.h
 * allows from them.
 */
#include <math.h>
#include <string.h>

#include "tests/fuzz/api/harness.h"


void log_fn(void *user, castor_log_level level, const char *message)
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

int progress_fn(void *user, const castor_progress *p)
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

int stop_fn(void *user)
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
unsigned run_allowed(const hmodel *M, const run_ctx *rc, unsigned want)
{
    unsigned allowed = want ? want : B(CASTOR_OK);
    if (rc->stopped)
        allowed |= B(CASTOR_INTERRUPTED);
    if (M->compiled && small_budget(M->strat))
        allowed |= B(CASTOR_DEVICE_MEMORY);
    return allowed;
}

void run_push(run_ctx *rc)
{
    if (n_runs == (int)(sizeof runs / sizeof *runs))
        abort();
    runs[n_runs++] = rc;
}

/* After a running call returns: a model freed from its callbacks is gone. */
void run_pop(run_ctx *rc, int status)
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

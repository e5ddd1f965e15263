#include "optim.h"

#include <math.h>

#include "optim_kernels.h"

#include "src/util.h"

/* Floats per block: the kernels (optim_kernels.h) see a constant trip count
 * for every full block, so they vectorise; only the last partial block of a
 * range runs scalar. */
#define BLOCK 256

/* Below this many variables waking the host threads costs more than it saves. */
#define OPTIM_MIN_PARALLEL ((size_t)1 << 15)

CASTOR_API castor_optimizer castor_optimizer_defaults(castor_optimizer_kind kind)
{
    castor_optimizer opt = {
        .kind = kind,
        .learning_rate = kind == CASTOR_OPT_SGD ? 0.01f : 0.001f,
        .momentum = 0.0f,
        .nesterov = 0,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .epsilon = 1e-7f,
        .weight_decay = kind == CASTOR_OPT_ADAMW ? 0.004f : 0.0f,
    };
    return opt;
}

CASTOR_API const char *castor_optimizer_kind_name(castor_optimizer_kind kind)
{
    switch (kind) {
    case CASTOR_OPT_SGD:
        return "sgd";
    case CASTOR_OPT_ADAM:
        return "adam";
    case CASTOR_OPT_ADAMW:
        return "adamw";
    }
    return "unknown";
}

CASTOR_API int castor_optimizer_kind_parse(const char *name, castor_optimizer_kind *out)
{
    static const castor_optimizer_kind kinds[] = {CASTOR_OPT_SGD, CASTOR_OPT_ADAM,
                                                  CASTOR_OPT_ADAMW};
    if (!name || !out)
        return CASTOR_INVALID;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (castor__ascii_ieq(name, castor_optimizer_kind_name(kinds[i]))) {
            *out = kinds[i];
            return CASTOR_OK;
        }
    }
    return CASTOR_INVALID;
}

static int uses_momentum(const castor_optimizer *opt)
{
    return opt->kind == CASTOR_OPT_SGD && opt->momentum != 0.0f;
}

int castor__optim_slots(const castor_optimizer *opt)
{
    if (opt->kind == CASTOR_OPT_ADAM || opt->kind == CASTOR_OPT_ADAMW)
        return 2;
    return uses_momentum(opt) ? 1 : 0;
}

const char *castor__optim_slot_name(const castor_optimizer *opt, int slot)
{
    if (slot < 0 || slot >= castor__optim_slots(opt))
        return NULL;
    if (opt->kind == CASTOR_OPT_SGD)
        return "momentum";
    return slot == 0 ? "adam_m" : "adam_v";
}

/* Only the fields the kind reads are checked, so an SGD optimizer written as
 * {CASTOR_OPT_SGD, 0.1f} with the rest zero is valid. */
int castor__optim_validate(const castor_optimizer *opt, char *err, size_t errlen)
{
    if (opt->kind != CASTOR_OPT_SGD && opt->kind != CASTOR_OPT_ADAM &&
        opt->kind != CASTOR_OPT_ADAMW) {
        castor__errf(err, errlen, "optimizer kind %d is not sgd (0), adam (1) or adamw (2)",
                     (int)opt->kind);
        return CASTOR_INVALID;
    }
    const char *kind = castor_optimizer_kind_name(opt->kind);
    if (!(opt->learning_rate > 0.0f) || !isfinite(opt->learning_rate)) {
        castor__errf(err, errlen, "%s: learning_rate must be finite and > 0, not %g", kind,
                     (double)opt->learning_rate);
        return CASTOR_INVALID;
    }
    if (opt->kind == CASTOR_OPT_SGD) {
        if (!(opt->momentum >= 0.0f && opt->momentum < 1.0f)) {
            castor__errf(err, errlen, "sgd: momentum must be in [0, 1), not %g",
                         (double)opt->momentum);
            return CASTOR_INVALID;
        }
        return CASTOR_OK;
    }
    if (!(opt->beta1 >= 0.0f && opt->beta1 < 1.0f)) {
        castor__errf(err, errlen, "%s: beta1 must be in [0, 1), not %g", kind,
                     (double)opt->beta1);
        return CASTOR_INVALID;
    }
    if (!(opt->beta2 >= 0.0f && opt->beta2 < 1.0f)) {
        castor__errf(err, errlen, "%s: beta2 must be in [0, 1), not %g", kind,
                     (double)opt->beta2);
        return CASTOR_INVALID;
    }
    if (!(opt->epsilon > 0.0f) || !isfinite(opt->epsilon)) {
        castor__errf(err, errlen, "%s: epsilon must be finite and > 0, not %g", kind,
                     (double)opt->epsilon);
        return CASTOR_INVALID;
    }
    if (opt->kind == CASTOR_OPT_ADAMW &&
        (!(opt->weight_decay >= 0.0f) || !isfinite(opt->weight_decay))) {
        castor__errf(err, errlen, "adamw: weight_decay must be finite and >= 0, not %g",
                     (double)opt->weight_decay);
        return CASTOR_INVALID;
    }
    return CASTOR_OK;
}

int castor__optim_check_dropped(const castor_optimizer *opt, char *err, size_t errlen)
{
    const char *kind = castor_optimizer_kind_name(opt->kind);
    if (opt->kind != CASTOR_OPT_SGD && (opt->momentum != 0.0f || opt->nesterov)) {
        castor__errf(err, errlen, "%s: %s applies to sgd only (set it to 0)", kind,
                     opt->momentum != 0.0f ? "momentum" : "nesterov");
        return CASTOR_INVALID;
    }
    if (opt->kind != CASTOR_OPT_ADAMW && opt->weight_decay != 0.0f) {
        castor__errf(err, errlen, "%s: weight_decay applies to adamw only (set it to 0, or use "
                                  "adamw for decoupled weight decay)", kind);
        return CASTOR_INVALID;
    }
    return CASTOR_OK;
}

castor_optimizer castor__optim_normalized(const castor_optimizer *opt)
{
    castor_optimizer out = castor_optimizer_defaults(opt->kind);
    out.learning_rate = opt->learning_rate;
    if (opt->kind == CASTOR_OPT_SGD) {
        out.momentum = opt->momentum;
        out.nesterov = opt->nesterov;
        return out;
    }
    out.beta1 = opt->beta1;
    out.beta2 = opt->beta2;
    out.epsilon = opt->epsilon;
    if (opt->kind == CASTOR_OPT_ADAMW)
        out.weight_decay = opt->weight_decay;
    return out;
}

castor__optim_consts castor__optim_consts_make(const castor_optimizer *opt, int64_t step)
{
    /* Step 0 would divide by 1 - b1^0 = 0; the first step is 1. */
    double t = step < 1 ? 1.0 : (double)step;
    double lr = opt->learning_rate;
    castor__optim_consts c = {
        .kind = opt->kind,
        .momentum = uses_momentum(opt),
        .nesterov = opt->nesterov != 0,
        .lr = opt->learning_rate,
        .mu = opt->momentum,
        .one_minus_b1 = (float)(1.0 - (double)opt->beta1),
        .one_minus_b2 = (float)(1.0 - (double)opt->beta2),
        .alpha = (float)(lr * sqrt(1.0 - pow(opt->beta2, t)) / (1.0 - pow(opt->beta1, t))),
        .eps = opt->epsilon,
        .adam_state_floor = castor__adam_state_floor(opt->epsilon),
        .lr_wd = (float)(lr * (double)opt->weight_decay),
    };
    return c;
}

static void apply_consts(const castor__optim_consts *c, float *params, const float *grads,
                         float *state, size_t n, size_t begin, size_t end)
{
    size_t at = begin;
    for (; at < end && end - at >= BLOCK; at += BLOCK)
        castor__optim_chunk(c, params + at, grads + at, castor__optim_slot(c, state, n, 0, at),
                            castor__optim_slot(c, state, n, 1, at), BLOCK);
    if (at < end)
        castor__optim_chunk(c, params + at, grads + at, castor__optim_slot(c, state, n, 0, at),
                            castor__optim_slot(c, state, n, 1, at), end - at);
}

void castor__optim_apply_range(const castor_optimizer *opt, float *params, const float *grads,
                               float *state, size_t n, int64_t step, size_t begin, size_t end)
{
    castor__optim_consts c = castor__optim_consts_make(opt, step);
    apply_consts(&c, params, grads, state, n, begin, end);
}

typedef struct optim_job {
    const castor__optim_consts *consts;
    float *params;
    const float *grads;
    float *state;
    size_t n;
} optim_job;

static void optim_task(void *ctx, size_t begin, size_t end)
{
    const optim_job *job = ctx;
    apply_consts(job->consts, job->params, job->grads, job->state, job->n, begin, end);
}

void castor__optim_apply(castor__pool *pool, const castor_optimizer *opt, float *params,
                         const float *grads, float *state, size_t n, int64_t step)
{
    castor__optim_consts c = castor__optim_consts_make(opt, step);
    optim_job job = {&c, params, grads, state, n};
    castor__pool_for(pool, n, OPTIM_MIN_PARALLEL, optim_task, &job);
}

#include "optim.h"

#include <math.h>

#include "src/util.h"

/* Floats per block. The kernels below see a constant trip count for every
 * full block, which is what gcc -O2's "very cheap" vectoriser needs (it will
 * not vectorise a loop that needs a scalar epilogue); only the last partial
 * block of a range runs scalar. */
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

/* ---- the kernels: one pass over len variables, no calls, no aliasing ---- */

static inline void sgd_kernel(float *restrict p, const float *restrict g, size_t len, float lr)
{
    for (size_t i = 0; i < len; i++)
        p[i] -= lr * g[i];
}

static inline void momentum_kernel(float *restrict p, const float *restrict g,
                                   float *restrict vel, size_t len, float mu, float lr)
{
    for (size_t i = 0; i < len; i++) {
        vel[i] = mu * vel[i] - lr * g[i];
        p[i] += vel[i];
    }
}

static inline void nesterov_kernel(float *restrict p, const float *restrict g,
                                   float *restrict vel, size_t len, float mu, float lr)
{
    for (size_t i = 0; i < len; i++) {
        vel[i] = mu * vel[i] - lr * g[i];
        p[i] += mu * vel[i] - lr * g[i];
    }
}

/* optim.h's order, (lr * wd) * p. Keras multiplies (p * wd) * lr, which can
 * differ in the last bit; the device kernels follow optim.h. */
static inline void decay_kernel(float *restrict p, size_t len, float lr_wd)
{
    for (size_t i = 0; i < len; i++)
        p[i] -= lr_wd * p[i];
}

/* sqrtf here is inlined as one instruction; gcc vectorises it only when
 * -fno-math-errno is on, since the library call may set errno. */
static inline void adam_kernel(float *restrict p, const float *restrict g, float *restrict m,
                               float *restrict v, size_t len, float one_minus_b1,
                               float one_minus_b2, float alpha, float eps)
{
    for (size_t i = 0; i < len; i++) {
        m[i] += (g[i] - m[i]) * one_minus_b1;
        v[i] += (g[i] * g[i] - v[i]) * one_minus_b2;
        p[i] -= alpha * m[i] / (sqrtf(v[i]) + eps);
    }
}

/* What one call needs besides the buffers, worked out once per step. */
typedef struct step_consts {
    castor_optimizer_kind kind;
    int momentum, nesterov;
    float lr, mu;
    float one_minus_b1, one_minus_b2, alpha, eps;
    float lr_wd;
} step_consts;

static step_consts make_consts(const castor_optimizer *opt, int64_t step)
{
    /* Step 0 would divide by 1 - b1^0 = 0; the first step is 1. */
    double t = step < 1 ? 1.0 : (double)step;
    double lr = opt->learning_rate;
    step_consts c = {
        .kind = opt->kind,
        .momentum = uses_momentum(opt),
        .nesterov = opt->nesterov != 0,
        .lr = opt->learning_rate,
        .mu = opt->momentum,
        .one_minus_b1 = (float)(1.0 - (double)opt->beta1),
        .one_minus_b2 = (float)(1.0 - (double)opt->beta2),
        .alpha = (float)(lr * sqrt(1.0 - pow(opt->beta2, t)) / (1.0 - pow(opt->beta1, t))),
        .eps = opt->epsilon,
        .lr_wd = (float)(lr * (double)opt->weight_decay),
    };
    return c;
}

/* Inlined at both call sites, so the full blocks get a constant len. */
static inline __attribute__((always_inline)) void
update_block(const step_consts *c, float *p, const float *g, float *state, size_t n,
             size_t at, size_t len)
{
    switch (c->kind) {
    case CASTOR_OPT_SGD:
        if (!c->momentum)
            sgd_kernel(p + at, g + at, len, c->lr);
        else if (c->nesterov)
            nesterov_kernel(p + at, g + at, state + at, len, c->mu, c->lr);
        else
            momentum_kernel(p + at, g + at, state + at, len, c->mu, c->lr);
        break;
    case CASTOR_OPT_ADAM:
    case CASTOR_OPT_ADAMW:
        if (c->kind == CASTOR_OPT_ADAMW)  /* AdamW is Adam on the decayed variables */
            decay_kernel(p + at, len, c->lr_wd);
        adam_kernel(p + at, g + at, state + at, state + n + at, len, c->one_minus_b1,
                    c->one_minus_b2, c->alpha, c->eps);
        break;
    }
}

static void apply_consts(const step_consts *c, float *params, const float *grads, float *state,
                         size_t n, size_t begin, size_t end)
{
    size_t at = begin;
    for (; at < end && end - at >= BLOCK; at += BLOCK)
        update_block(c, params, grads, state, n, at, BLOCK);
    if (at < end)
        update_block(c, params, grads, state, n, at, end - at);
}

void castor__optim_apply_range(const castor_optimizer *opt, float *params, const float *grads,
                               float *state, size_t n, int64_t step, size_t begin, size_t end)
{
    step_consts c = make_consts(opt, step);
    apply_consts(&c, params, grads, state, n, begin, end);
}

typedef struct optim_job {
    const step_consts *consts;
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
    step_consts c = make_consts(opt, step);
    optim_job job = {&c, params, grads, state, n};
    castor__pool_for(pool, n, OPTIM_MIN_PARALLEL, optim_task, &job);
}

/* Model handles: layers, the flat parameter layout, compile. */
#include "model.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/optim.h"
#include "rng.h"
#include "strategy.h"
#include "util.h"

/* Widths and depths beyond these are typos, not models. */
#define MAX_LAYERS 1024

int castor__model_fail(castor_model *m, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->errmsg, sizeof m->errmsg, fmt, ap);
    va_end(ap);
    return code;
}

int castor__model_host_nonfinite(const castor_model *m)
{
    int flags = 0;
    if (!castor__all_finite(m->params.ptr, m->n_params))
        flags |= CASTOR__NONFINITE_PARAMS;
    if (!castor__all_finite(m->opt_state.ptr, (size_t)m->opt_slots * m->n_params))
        flags |= CASTOR__NONFINITE_STATE;
    return flags;
}

int castor__model_compiled(castor_model *m, const char *what)
{
    if (!m->compiled || !m->strategy)
        return castor__model_fail(m, CASTOR_MISUSE, "%s: the model is not compiled%s", what,
                                  m->strategy ? "" : " (or its strategy was freed)");
    return CASTOR_OK;
}

int castor__model_ready(castor_model *m, const char *what)
{
    int rc = castor__model_compiled(m, what);
    if (rc)
        return rc;
    if (m->inconsistent)
        return castor__model_fail(m, CASTOR_DEVICE,
                                  "%s: a device failed during an update and the replicas may "
                                  "disagree; %s",
                                  what, m->host_state_torn
                                            ? "load a checkpoint (the host's copy of the "
                                              "optimizer state is incomplete)"
                                            : "set the parameters again or load a checkpoint");
    return CASTOR_OK;
}

int castor__model_not_fitting(castor_model *m, const char *what)
{
    if (m->running)
        return castor__model_fail(m, CASTOR_MISUSE,
                                  "%s: called from inside %s, from its %s (which may read and "
                                  "save the model and set its learning rate, not run or "
                                  "change it otherwise)",
                                  what, m->running,
                                  strcmp(m->running, "fit") == 0
                                      ? "progress callback or stop check"
                                      : "stop check");
    return CASTOR_OK;
}

int castor_model_create(castor_model **out, int input_features)
{
    if (!out)
        return CASTOR_MISUSE;
    castor_model *m = calloc(1, sizeof *m);
    *out = m;
    if (!m)
        return CASTOR_NOMEM;
    if (input_features <= 0 || input_features > CASTOR_MAX_UNITS)
        return castor__model_fail(m, CASTOR_INVALID, "input features must be 1..%d, not %d",
                                  CASTOR_MAX_UNITS, input_features);
    m->input_features = input_features;
    return CASTOR_OK;
}

void castor__model_detach(castor_model *m)
{
    if (m->strategy) {
        castor__runtime_free(m);
        if (m->strategy->bound == m)
            m->strategy->bound = NULL;
    }
    castor__host_free(&m->params);
    castor__host_free(&m->opt_state);
    castor__host_free(&m->grads);
    m->strategy = NULL;
    m->compiled = 0;
}

void castor_model_free(castor_model *m)
{
    if (!m)
        return;
    /* From the running call's callback or stop check: that call still
     * holds m, and frees it as it returns (trainer.c's finish_running). */
    if (m->running) {
        m->free_asked = 1;
        return;
    }
    castor__model_detach(m);
    free(m->layers);
    free(m);
}

const char *castor_model_errmsg(const castor_model *m)
{
    if (!m)
        return "out of memory (no model handle)";
    return m->errmsg[0] ? m->errmsg : "no error";
}

int castor_model_add_dense(castor_model *m, int units, castor_activation act)
{
    if (!m)
        return CASTOR_MISUSE;
    if (m->compiled)
        return castor__model_fail(m, CASTOR_MISUSE, "cannot add layers to a compiled model");
    /* A failed castor_model_create still hands out the handle, for its
     * message: nothing is built on it. */
    if (m->input_features <= 0)
        return castor__model_fail(m, CASTOR_MISUSE,
                                  "the model was not created (%d input features)",
                                  m->input_features);
    if (units <= 0 || units > CASTOR_MAX_UNITS)
        return castor__model_fail(m, CASTOR_INVALID, "layer units must be 1..%d, not %d",
                                  CASTOR_MAX_UNITS, units);
    if ((unsigned)act > CASTOR_ACT_SIGMOID)
        return castor__model_fail(m, CASTOR_INVALID, "unknown activation %d", (int)act);
    if (m->n_layers >= MAX_LAYERS)
        return castor__model_fail(m, CASTOR_INVALID, "at most %d layers", MAX_LAYERS);
    if (m->n_layers == m->cap_layers) {
        int cap = m->cap_layers ? 2 * m->cap_layers : 4;
        castor__layer *grown = realloc(m->layers, (size_t)cap * sizeof *grown);
        if (!grown)
            return castor__model_fail(m, CASTOR_NOMEM, "out of memory");
        m->layers = grown;
        m->cap_layers = cap;
    }
    int in = m->n_layers ? m->layers[m->n_layers - 1].out : m->input_features;
    size_t weights, total;
    if (!castor__mul_ok((size_t)in, (size_t)units, &weights) ||
        (total = m->n_params + weights + (size_t)units) < m->n_params ||
        total > ((size_t)1 << 40))
        return castor__model_fail(m, CASTOR_INVALID, "the model is too large (%d x %d layer)",
                                  in, units);
    castor__layer *lay = &m->layers[m->n_layers++];
    lay->in = in;
    lay->out = units;
    lay->act = act;
    lay->w_off = m->n_params;
    lay->b_off = m->n_params + weights;
    m->n_params = total;
    return CASTOR_OK;
}

static int add_layers_from_spec(castor_model *m, const char *spec);

/* All of the spec's layers or none: a bad item later in the list must not
 * leave the earlier ones added, or fixing the spec and calling again would
 * build another network without a word. */
int castor_model_add_layers(castor_model *m, const char *spec)
{
    if (!m)
        return CASTOR_MISUSE;
    int n_layers = m->n_layers;
    size_t n_params = m->n_params;
    int rc = add_layers_from_spec(m, spec);
    if (rc) {
        m->n_layers = n_layers;
        m->n_params = n_params;
    }
    return rc;
}

static int add_layers_from_spec(castor_model *m, const char *spec)
{
    if (!spec)
        return castor__model_fail(m, CASTOR_MISUSE, "add_layers: spec is NULL");
    if (!*spec)
        return castor__model_fail(m, CASTOR_INVALID, "empty layer list (e.g. 128:relu,10)");
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item)
            return castor__model_fail(m, CASTOR_INVALID, "bad layer '%.*s' in '%s'",
                                      (int)(len < 40 ? len : 40), p, spec);
        memcpy(item, p, len);
        item[len] = '\0';
        char *colon = strchr(item, ':');
        castor_activation act = CASTOR_ACT_LINEAR;
        if (colon) {
            *colon = '\0';
            if (castor_activation_parse(colon + 1, &act))
                return castor__model_fail(m, CASTOR_INVALID,
                                          "unknown activation '%s' in '%s' (linear, relu, tanh, "
                                          "sigmoid)",
                                          colon + 1, spec);
        }
        char *num_end = NULL;
        errno = 0;
        long units = strtol(item, &num_end, 10);
        /* Digits only: strtol would also take leading blanks and a sign. */
        if (!isdigit((unsigned char)item[0]) || *num_end || errno || units <= 0 ||
            units > CASTOR_MAX_UNITS)
            return castor__model_fail(m, CASTOR_INVALID,
                                      "bad unit count '%s' in '%s' (a whole number 1..%d)", item,
                                      spec, CASTOR_MAX_UNITS);
        int rc = castor_model_add_dense(m, (int)units, act);
        if (rc)
            return rc;
        if (!end)
            break;
        p = end + 1;
        if (!*p)
            return castor__model_fail(m, CASTOR_INVALID, "trailing comma in '%s'", spec);
    }
    return CASTOR_OK;
}

void castor__model_init_params(const castor_model *m, float *params)
{
    castor__rng rng;
    castor__rng_seed(&rng, m->seed, CASTOR_RNG_INIT, 0);
    for (int l = 0; l < m->n_layers; l++) {
        const castor__layer *lay = &m->layers[l];
        /* Glorot uniform: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)). */
        float limit = (float)sqrt(6.0 / (double)(lay->in + lay->out));
        size_t n = (size_t)lay->in * (size_t)lay->out;
        float *w = params + lay->w_off;
        for (size_t i = 0; i < n; i++)
            w[i] = (2.0f * castor__rng_uniform(&rng) - 1.0f) * limit;
        memset(params + lay->b_off, 0, (size_t)lay->out * sizeof(float));
    }
}

int castor__strategy_refuses_model(const castor_strategy *s, const char *what, char *err,
                                   size_t errlen)
{
    if (!s->ready) {
        snprintf(err, errlen, "%s: the strategy was not created (%s)", what,
                 s->errmsg[0] ? s->errmsg : "castor_strategy_create failed");
        return CASTOR_MISUSE;
    }
    if (s->bound) {
        snprintf(err, errlen, "%s: %s", what,
                 s->bound->free_asked ? "the strategy's model is freed when its running call "
                                        "returns, not before: compile after that"
                                      : "the strategy already has a compiled model; free it "
                                        "first");
        return CASTOR_MISUSE;
    }
    return CASTOR_OK;
}

int castor_model_compile(castor_model *m, castor_strategy *s, castor_loss loss,
                         const castor_optimizer *optimizer, uint64_t seed)
{
    if (!m)
        return CASTOR_MISUSE;
    if (!s)
        return castor__model_fail(m, CASTOR_MISUSE, "compile needs a strategy");
    int rc = castor__model_not_fitting(m, "compile");
    if (rc)
        return rc;
    char why[CASTOR__MSG_MAX];
    if (!s->ready && castor__strategy_refuses_model(s, "compile", why, sizeof why))
        return castor__model_fail(m, CASTOR_MISUSE, "%s", why);
    if (m->compiled)
        return castor__model_fail(m, CASTOR_MISUSE, "the model is already compiled");
    if (m->input_features <= 0)
        return castor__model_fail(m, CASTOR_MISUSE,
                                  "compile: the model was not created (%d input features)",
                                  m->input_features);
    if (castor__strategy_refuses_model(s, "compile", why, sizeof why))
        return castor__model_fail(m, CASTOR_MISUSE, "%s", why);
    if (m->n_layers == 0)
        return castor__model_fail(m, CASTOR_INVALID, "the model has no layers");
    if (loss != CASTOR_LOSS_SOFTMAX_XENT && loss != CASTOR_LOSS_MSE)
        return castor__model_fail(m, CASTOR_INVALID, "unknown loss %d", (int)loss);
    const castor__layer *last = &m->layers[m->n_layers - 1];
    if (loss == CASTOR_LOSS_SOFTMAX_XENT && last->act != CASTOR_ACT_LINEAR)
        return castor__model_fail(m, CASTOR_INVALID,
                                  "softmax cross-entropy takes logits: the last layer must be "
                                  "linear, not %s",
                                  castor_activation_name(last->act));
    if (loss == CASTOR_LOSS_SOFTMAX_XENT && last->out < 2)
        return castor__model_fail(m, CASTOR_INVALID,
                                  "softmax cross-entropy needs at least 2 output units");
    castor_optimizer opt = optimizer ? *optimizer : castor_optimizer_defaults(CASTOR_OPT_ADAM);
    char err[256];
    if (castor__optim_validate(&opt, err, sizeof err) ||
        castor__optim_check_dropped(&opt, err, sizeof err))
        return castor__model_fail(m, CASTOR_INVALID, "%s", err);

    /* A model whose strategy was freed may be compiled again: it starts
     * afresh, so drop what the last compile left on the host and where its
     * training stood. */
    castor__host_free(&m->params);
    castor__host_free(&m->grads);
    castor__host_free(&m->opt_state);
    m->step = m->epoch = m->step_in_epoch = 0;
    m->opt_step = m->host_opt_step = 0;
    m->host_state_torn = 0;
    m->nonfinite = 0;
    m->epoch_batch = 0;
    m->epoch_samples = 0;
    m->epoch_shuffle = -1;
    m->target_epochs = 0;
    m->in_type = m->in_rank = 0;
    m->inconsistent = 0;

    m->loss = loss;
    m->opt = castor__optim_normalized(&opt);
    m->opt_slots = castor__optim_slots(&opt);
    m->seed = seed;
    m->strategy = s;
    if ((rc = castor__runtime_check_room(m))) {
        m->strategy = NULL;
        return rc;
    }
    size_t bytes = m->n_params * sizeof(float);
    /* What only training needs (the gradients, on the devices and the
     * host) waits for the first fit (castor__runtime_ensure_training): a
     * model compiled to evaluate and predict needs room for no more than
     * its variables. */
    if (castor__host_alloc(&m->params, bytes, s->use_cuda) ||
        castor__host_alloc(&m->opt_state, (size_t)m->opt_slots * bytes, s->use_cuda)) {
        castor__host_free(&m->params);
        castor__host_free(&m->opt_state);
        m->strategy = NULL;
        return castor__model_fail(m, CASTOR_NOMEM, "out of host memory for %zu parameters",
                                  m->n_params);
    }
    if (s->use_cuda && !m->params.locked)
        castor__log(s, CASTOR_LOG_WARN,
                    "CUDA could not pin host memory for the variables; their copies to and "
                    "from the GPUs will be slower");
    castor__model_init_params(m, m->params.ptr);
    m->host_params_current = 1;
    m->params_version = 1;
    rc = s->ops->prepare(m);
    if (rc) {
        castor__runtime_free(m);
        castor__host_free(&m->params);
        castor__host_free(&m->grads);
        castor__host_free(&m->opt_state);
        m->strategy = NULL;
        return rc;
    }
    s->bound = m;
    m->compiled = 1;
    castor__log(s, CASTOR_LOG_INFO, "compiled %d layers, %zu parameters, %s strategy",
                m->n_layers, m->n_params, s->ops->name);
    return CASTOR_OK;
}

int castor_model_num_layers(const castor_model *m)
{
    return m ? m->n_layers : 0;
}

size_t castor_model_num_params(const castor_model *m)
{
    return m ? m->n_params : 0;
}

int castor_model_input_features(const castor_model *m)
{
    return m ? m->input_features : 0;
}

int castor_model_output_units(const castor_model *m)
{
    return m && m->n_layers ? m->layers[m->n_layers - 1].out : 0;
}

int64_t castor_model_step(const castor_model *m)
{
    return m ? m->step : 0;
}

int castor_model_layers_spec(const castor_model *m, char *buf, size_t size)
{
    if (!m || !buf || size == 0)
        return CASTOR_MISUSE;
    size_t used = 0;
    buf[0] = '\0';
    for (int l = 0; l < m->n_layers; l++) {
        int w = snprintf(buf + used, size - used, "%s%d:%s", l ? "," : "", m->layers[l].out,
                         castor_activation_name(m->layers[l].act));
        if (w < 0 || (size_t)w >= size - used)
            return CASTOR_INVALID;
        used += (size_t)w;
    }
    return CASTOR_OK;
}

int castor_model_get_params(castor_model *m, float *dst, size_t count)
{
    if (!m)
        return CASTOR_MISUSE;
    if (!dst)
        return castor__model_fail(m, CASTOR_MISUSE, "get_params: dst is NULL");
    int rc = castor__model_ready(m, "get_params");
    if (rc)
        return rc;
    if (count != m->n_params)
        return castor__model_fail(m, CASTOR_INVALID, "get_params: count %zu, model has %zu",
                                  count, m->n_params);
    if ((rc = m->strategy->ops->pull(m)))
        return rc;
    memcpy(dst, m->params.ptr, count * sizeof(float));
    return CASTOR_OK;
}

int castor_model_all_finite(castor_model *m, int *finite)
{
    if (!m)
        return CASTOR_MISUSE;
    if (!finite)
        return castor__model_fail(m, CASTOR_MISUSE, "all_finite: finite is NULL");
    int rc = castor__model_ready(m, "all_finite");
    if (rc)
        return rc;
    if ((rc = m->strategy->ops->pull(m)))
        return rc;
    *finite = castor__model_host_nonfinite(m) == 0;
    return CASTOR_OK;
}

int castor_model_set_params(castor_model *m, const float *src, size_t count)
{
    if (!m)
        return CASTOR_MISUSE;
    if (!src)
        return castor__model_fail(m, CASTOR_MISUSE, "set_params: src is NULL");
    int rc;
    if ((rc = castor__model_compiled(m, "set_params")) ||
        (rc = castor__model_not_fitting(m, "set_params")))
        return rc;
    if (count != m->n_params)
        return castor__model_fail(m, CASTOR_INVALID, "set_params: count %zu, model has %zu",
                                  count, m->n_params);
    for (size_t i = 0; i < count; i++)
        if (!isfinite(src[i]))
            return castor__model_fail(m, CASTOR_INVALID, "set_params: value %zu is not finite",
                                      i);
    /* The optimizer state must be current before the push sends it back;
     * recovering, the host's copy is all there is, if it is whole. */
    if (m->inconsistent && m->host_state_torn)
        return castor__model_fail(m, CASTOR_DEVICE,
                                  "set_params: cannot recover the replicas: the host's copy of "
                                  "the optimizer state is incomplete (reading it back from "
                                  "replica 0 failed in an earlier get_params or save); load a "
                                  "checkpoint");
    rc = m->inconsistent ? CASTOR_OK : m->strategy->ops->pull(m);
    if (rc)
        return rc;
    /* Recovering, the state goes back to the host's copy, and with it the
     * steps it has taken: Adam's bias correction must count those. */
    m->opt_step = m->host_opt_step;
    memcpy(m->params.ptr, src, count * sizeof(float));
    /* The variables are finite now; a state loaded with NaN or inf stays.
     * Only what a load placed is flagged: a state that training made
     * infinite is no load's, and such a model trains on (castor.h). */
    m->nonfinite &= CASTOR__NONFINITE_STATE;
    m->params_version++;
    return m->strategy->ops->push(m);
}

size_t castor_model_device_peak_bytes(const castor_model *m)
{
    if (!m || !m->strategy)
        return 0;
    size_t peak = 0;
    for (int i = 0; i < m->strategy->n_replicas; i++)
        if (m->strategy->devs[i]->peak > peak)
            peak = m->strategy->devs[i]->peak;
    return peak;
}

int castor_model_set_learning_rate(castor_model *m, float learning_rate)
{
    if (!m)
        return CASTOR_MISUSE;
    int rc = castor__model_compiled(m, "set_learning_rate");
    if (rc)
        return rc;
    if (!(learning_rate > 0.0f) || !isfinite(learning_rate))
        return castor__model_fail(m, CASTOR_INVALID, "set_learning_rate: the learning rate "
                                  "must be finite and > 0, not %g", (double)learning_rate);
    /* Every update reads it afresh (host and devices alike): fit's progress
     * callback runs between steps, so the next step is the first at it. */
    m->opt.learning_rate = learning_rate;
    return CASTOR_OK;
}

float castor_model_learning_rate(const castor_model *m)
{
    return m && m->compiled ? m->opt.learning_rate : 0.0f;
}

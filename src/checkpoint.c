/*
 * Checkpoints: a model's variables, optimizer state and training position in
 * a safetensors file (src/safetensors.h).
 *
 * Tensors (all F32, little-endian, row-major), in this order in the file:
 *   dense_<l>.kernel            [in, out]   layer l's kernel (Keras's layout)
 *   dense_<l>.bias              [out]
 *   ... for every layer, then for every optimizer slot s (host/optim.h's
 *   names: "momentum" for SGD with momentum, "adam_m" and "adam_v" for
 *   Adam/AdamW), for every layer:
 *   dense_<l>.kernel.<s>        [in, out]
 *   dense_<l>.bias.<s>          [out]
 * so the data section is the flat parameter buffer followed by the flat
 * optimizer state (slot k of variable i at k*n + i), byte for byte.
 *
 * __metadata__ (strings, as safetensors requires):
 *   format          "castor-checkpoint-1"
 *   castor_version  the library that wrote it
 *   input_features, layers ("128:relu,10:linear"), loss ("softmax_xent", "mse")
 *   optimizer ("sgd", "adam", "adamw") and learning_rate, momentum, nesterov,
 *     beta1, beta2, epsilon, weight_decay (floats as %.9g: they read back
 *     exactly)
 *   seed, step, epoch, step_in_epoch, epoch_batch
 *   optimizer_step  the steps the optimizer state has taken (Adam's bias
 *                   correction counts them), where that is not step: only
 *                   after a mirrored model's set_params recovery took the
 *                   state back to an older copy. Optional: step where absent
 *   input_shape, input_type   each sample's shape ("28x28": the dimensions
 *                   after the first of the IDX image file, 1 to 3 of them,
 *                   their product input_features) and its IDX element type
 *                   ("ubyte", scaled to [0,1]; "sbyte", "int16", "int32",
 *                   "float32", "float64", taken as they are) of the data
 *                   the model was last fitted on. Optional: written where
 *                   that data came from IDX files; older files lack them
 *   epoch_samples, epoch_shuffle   the training samples the epoch in progress
 *                   is over and whether it is shuffled ("1"/"0"): with the
 *                   batch they fix its order, so fit refuses to finish it on
 *                   other data. Optional: files written before these keys
 *                   lack them, and such an epoch is not checked.
 *   target_epochs   the epoch count that the last fit to train a step was to
 *                   end at: the epochs completed when it began plus its
 *                   epochs (castor train: the run's --epochs, which a
 *                   resumed run takes when not given). Optional: files
 *                   written before it, and by a model never fitted, lack it
 *   rng             how the random streams follow from the seed: weights from
 *                   stream (seed, init), epoch e's shuffle from stream
 *                   (seed, shuffle, e) (src/rng.h), so seed and epoch are the
 *                   whole RNG state and nothing else needs saving
 *   strategy, devices, replicas   what trained it (informational: a
 *                   checkpoint loads on any strategy)
 *   blas_threads    OpenBLAS's thread count, where emulated CPU replicas
 *                   ran the GEMMs (informational: another count sums in
 *                   another order, so a run resumed with it goes on, but
 *                   not bit for bit); absent where every replica is a GPU
 *   crc32           zlib CRC-32 of the data section, 8 hex digits
 *
 * The metadata is read and checked in checkpoint_meta.c; this file lays the
 * tensors out, writes them and holds a file against a model.
 *
 * Loading checks everything before it changes anything: CASTOR_IO when the
 * file cannot be read, CASTOR_FORMAT when it is not a well-formed castor
 * checkpoint (bad safetensors, missing or bad metadata, CRC mismatch),
 * CASTOR_MISMATCH when it is well-formed but does not fit the model (input
 * features, layers, loss, optimizer kind or state slots, a tensor missing,
 * extra, or of another shape). Loading also takes the optimizer's
 * hyper-parameters and the seed from the file, so that training continues
 * exactly as it would have.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "checkpoint.h"
#include "host/optim.h"
#include "model.h"
#include "safetensors.h"
#include "strategy.h"
#include "util.h"

#define CKPT_RNG                                                                         \
    "xoshiro256** streams from seed (splitmix64-seeded); weights: stream (seed, init, 0); " \
    "shuffle of epoch e: stream (seed, shuffle, e); shuffle stream index = epoch"

/* ---- helpers ---------------------------------------------------------------- */

static uint32_t crc_update(uint32_t crc, const void *data, size_t len)
{
    const unsigned char *p = data;
    uLong c = crc;
    while (len) {
        uInt chunk = len > (1u << 30) ? (1u << 30) : (uInt)len;
        c = crc32(c, p, chunk);
        p += chunk;
        len -= chunk;
    }
    return (uint32_t)c;
}

/* ---- the tensors a model has ---------------------------------------------- */

typedef struct expect {
    char name[64];
    int rank;
    size_t shape[2];
    float *dst;        /* where the values live in the model */
    size_t count;
} expect;

/* The model's tensors in file order; *count = 2 * layers * (1 + slots). */
static expect *expected_tensors(const castor_model *m, size_t *count)
{
    size_t per = (size_t)m->n_layers * 2;
    size_t n = per * (size_t)(1 + m->opt_slots);
    expect *e = calloc(n ? n : 1, sizeof *e);
    if (!e)
        return NULL;
    float *params = m->params.ptr, *state = m->opt_state.ptr;
    size_t k = 0;
    for (int slot = -1; slot < m->opt_slots; slot++) {
        const char *sname = slot >= 0 ? castor__optim_slot_name(&m->opt, slot) : NULL;
        float *base = slot < 0 ? params : state + (size_t)slot * m->n_params;
        for (int l = 0; l < m->n_layers; l++) {
            const castor__layer *lay = &m->layers[l];
            expect *w = &e[k++], *b = &e[k++];
            snprintf(w->name, sizeof w->name, "dense_%d.kernel%s%s", l, sname ? "." : "",
                     sname ? sname : "");
            snprintf(b->name, sizeof b->name, "dense_%d.bias%s%s", l, sname ? "." : "",
                     sname ? sname : "");
            w->rank = 2;
            w->shape[0] = (size_t)lay->in;
            w->shape[1] = (size_t)lay->out;
            w->count = (size_t)lay->in * (size_t)lay->out;
            w->dst = base + lay->w_off;
            b->rank = 1;
            b->shape[0] = (size_t)lay->out;
            b->count = (size_t)lay->out;
            b->dst = base + lay->b_off;
        }
    }
    *count = n;
    return e;
}

/* "[784,128]" into buf. */
static const char *shape_text(const size_t *shape, int rank, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < rank && used < len; d++) {
        int w = snprintf(buf + used, len - used, "%s%zu", d ? "," : "[", shape[d]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    if (used < len)
        snprintf(buf + used, len - used, "%s", rank ? "]" : "[]");
    return buf;
}

/* ---- load ------------------------------------------------------------------------ */

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const castor__st_tensor *const *)a)->name,
                  (*(const castor__st_tensor *const *)b)->name);
}

static int cmp_key_tensor(const void *key, const void *elem)
{
    return strcmp((const char *)key, (*(const castor__st_tensor *const *)elem)->name);
}

/* Compare the file with the model; nothing is changed. On success *out_exp
 * (count *out_n) says where each expected tensor goes and its source. */
static int check_against_model(castor_model *m, const castor__st_file *f, const char *path,
                               const castor__ckpt_info *info, expect **out_exp,
                               const castor__st_tensor ***out_src, size_t *out_n)
{
    char *err = m->errmsg;
    size_t errlen = sizeof m->errmsg;
    if (info->input_features != m->input_features) {
        castor__errf(err, errlen, "%s: the checkpoint's model takes %d input features, this one "
                     "%d", path, info->input_features, m->input_features);
        return CASTOR_MISMATCH;
    }
    /* Normalise the file's layer list through the same parser ("10" and
     * "10:linear" are the same layer). */
    castor_model *scratch = NULL;
    int rc = castor_model_create(&scratch, info->input_features);
    if (!rc)
        rc = castor_model_add_layers(scratch, info->layers);
    if (rc == CASTOR_NOMEM) {  /* no fault of the file's layers: it blames none */
        castor_model_free(scratch);
        castor__errf(err, errlen, "%s: out of memory", path);
        return rc;
    }
    if (rc) {
        /* The model's message quotes the spec: the file's text, escaped too. */
        char shown[CASTOR__ST_SHOWN], why[256];
        castor__errf(err, errlen, "%s: bad layers '%s' in __metadata__: %s", path,
                     castor__st_printable(info->layers, shown, sizeof shown),
                     castor__st_printable(castor_model_errmsg(scratch), why, sizeof why));
        castor_model_free(scratch);
        return CASTOR_FORMAT;
    }
    size_t speclen = (size_t)(m->n_layers > scratch->n_layers ? m->n_layers : scratch->n_layers) *
                         40 + 16;
    char *mine = malloc(speclen), *theirs = malloc(speclen);
    if (!mine || !theirs || castor_model_layers_spec(m, mine, speclen) ||
        castor_model_layers_spec(scratch, theirs, speclen)) {
        free(mine);
        free(theirs);
        castor_model_free(scratch);
        castor__errf(err, errlen, "%s: out of memory", path);
        return CASTOR_NOMEM;
    }
    castor_model_free(scratch);
    if (strcmp(mine, theirs) != 0) {
        castor__errf(err, errlen, "%s: the checkpoint's layers are %.150s, the model's %.150s",
                     path, theirs, mine);
        free(mine);
        free(theirs);
        return CASTOR_MISMATCH;
    }
    free(mine);
    free(theirs);
    if (info->loss != m->loss) {
        castor__errf(err, errlen, "%s: the checkpoint's loss is %s, the model's %s", path,
                     castor__ckpt_loss_name(info->loss), castor__ckpt_loss_name(m->loss));
        return CASTOR_MISMATCH;
    }
    if (info->opt.kind != m->opt.kind) {
        castor__errf(err, errlen, "%s: the checkpoint's optimizer is %s, the model's %s", path,
                     castor_optimizer_kind_name(info->opt.kind),
                     castor_optimizer_kind_name(m->opt.kind));
        return CASTOR_MISMATCH;
    }
    if (castor__optim_slots(&info->opt) != m->opt_slots) {
        castor__errf(err, errlen, "%s: the checkpoint's %s keeps %d state slot(s) per variable "
                     "(momentum %g), the model's %d (momentum %g)", path,
                     castor_optimizer_kind_name(info->opt.kind), castor__optim_slots(&info->opt),
                     (double)info->opt.momentum, m->opt_slots, (double)m->opt.momentum);
        return CASTOR_MISMATCH;
    }

    size_t n = 0;
    expect *exp = expected_tensors(m, &n);
    const castor__st_tensor **sorted = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *sorted);
    const castor__st_tensor **src = malloc((n ? n : 1) * sizeof *src);
    unsigned char *used = calloc(f->n_tensors ? f->n_tensors : 1, 1);
    if (!exp || !sorted || !src || !used) {
        free(exp);
        free(sorted);
        free(src);
        free(used);
        castor__errf(err, errlen, "%s: out of memory", path);
        return CASTOR_NOMEM;
    }
    for (size_t i = 0; i < f->n_tensors; i++)
        sorted[i] = &f->tensors[i];
    qsort(sorted, f->n_tensors, sizeof *sorted, cmp_tensor_name);
    rc = CASTOR_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        const castor__st_tensor *const *hit =
            bsearch(exp[i].name, sorted, f->n_tensors, sizeof *sorted, cmp_key_tensor);
        if (!hit) {
            castor__errf(err, errlen, "%s: tensor %s is missing", path, exp[i].name);
            rc = CASTOR_MISMATCH;
            break;
        }
        const castor__st_tensor *t = *hit;
        int same = t->rank == exp[i].rank;
        for (int d = 0; same && d < t->rank; d++)
            same = t->shape[d] == exp[i].shape[d];
        if (!same) {
            char a[96], b[96];
            castor__errf(err, errlen, "%s: tensor %s has shape %s, the model expects %s", path,
                         exp[i].name, shape_text(t->shape, t->rank, a, sizeof a),
                         shape_text(exp[i].shape, exp[i].rank, b, sizeof b));
            rc = CASTOR_MISMATCH;
            break;
        }
        src[i] = t;
        used[t - f->tensors] = 1;
    }
    for (size_t i = 0; i < f->n_tensors && !rc; i++)
        if (!used[i]) {
            char shown[CASTOR__ST_SHOWN];
            castor__errf(err, errlen, "%s: unexpected tensor '%s' (the model has no such "
                         "variable or optimizer slot)", path,
                         castor__st_printable(f->tensors[i].name, shown, sizeof shown));
            rc = CASTOR_MISMATCH;
        }
    free(sorted);
    free(used);
    if (!rc) {
        uint32_t crc = crc_update((uint32_t)crc32(0L, Z_NULL, 0), f->data, f->data_len);
        if (crc != info->crc) {
            castor__errf(err, errlen, "%s: CRC-32 of the data section is %08" PRIx32 ", the "
                         "header says %08" PRIx32 ": the file is corrupt (or its tensors were "
                         "changed by a program that did not set __metadata__'s crc32 anew)",
                         path, crc, info->crc);
            rc = CASTOR_FORMAT;
        }
    }
    if (rc) {
        free(exp);
        free(src);
        return rc;
    }
    *out_exp = exp;
    *out_src = src;
    *out_n = n;
    return CASTOR_OK;
}

/* Load a parsed checkpoint into a compiled model: everything is checked
 * before anything changes. */
static int load_parsed(castor_model *m, const castor__st_file *f, const char *path)
{
    castor__ckpt_info info;
    int rc = castor__ckpt_read_info(f, path, &info, m->errmsg, sizeof m->errmsg);
    if (rc)
        return rc;
    expect *exp = NULL;
    const castor__st_tensor **src = NULL;
    size_t n = 0;
    if ((rc = check_against_model(m, f, path, &info, &exp, &src, &n)))
        return rc;

    /* From here on the file is known good: copy it in. */
    for (size_t i = 0; i < n; i++)
        if (exp[i].count)
            memcpy(exp[i].dst, f->data + src[i]->begin, exp[i].count * sizeof(float));
    free(exp);
    free(src);
    m->opt = castor__optim_normalized(&info.opt);
    m->seed = info.seed;
    m->step = info.step;
    m->opt_step = m->host_opt_step = info.optimizer_step;
    m->host_state_torn = 0;
    /* Taken as it is, for evaluate and predict; fit refuses it. */
    m->nonfinite = castor__model_host_nonfinite(m);
    m->epoch = info.epoch;
    m->step_in_epoch = info.step_in_epoch;
    m->epoch_batch = info.epoch_batch;
    m->epoch_samples = info.epoch_samples;
    m->epoch_shuffle = info.epoch_shuffle;
    m->target_epochs = info.target_epochs;
    m->in_type = info.input_type;
    m->in_rank = info.input_rank;
    memcpy(m->in_dims, info.input_dims, sizeof m->in_dims);
    m->host_params_current = 1;
    m->params_version++;
    rc = m->strategy->ops->push(m);
    if (rc) {
        char why[sizeof m->errmsg];
        snprintf(why, sizeof why, "%s", m->errmsg);
        return castor__model_fail(m, rc, "%s: loaded, but placing the variables on the "
                                  "replicas failed: %s", path, why);
    }
    return CASTOR_OK;
}

int castor_model_load(castor_model *m, const char *path)
{
    if (!m)
        return CASTOR_MISUSE;
    if (!path || !*path)
        return castor__model_fail(m, CASTOR_MISUSE, "load: no file name given");
    int rc;
    if ((rc = castor__model_compiled(m, "load")) || (rc = castor__model_not_fitting(m, "load")))
        return rc;
    castor__st_file f;
    rc = castor__st_read(path, &f, m->errmsg, sizeof m->errmsg);
    if (!rc)
        rc = load_parsed(m, &f, path);
    castor__st_free(&f);
    return rc;
}

/* The first tensor of layers x (variables, then each optimizer slot) that
 * f lacks, into name; 0 if it has them all, -1 out of memory. Looked up in
 * a sorted copy of the file's names: a hostile file of a million tensors
 * made a linear scan per expected name (up to 6144 of them) take minutes. */
static int first_missing(const castor_model *m, const castor__st_file *f,
                         const castor_optimizer *opt, char *name, size_t len)
{
    const castor__st_tensor **sorted = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *sorted);
    if (!sorted)
        return -1;
    for (size_t i = 0; i < f->n_tensors; i++)
        sorted[i] = &f->tensors[i];
    qsort(sorted, f->n_tensors, sizeof *sorted, cmp_tensor_name);
    int slots = castor__optim_slots(opt), which = 0;
    for (int slot = -1; slot < slots && !which; slot++) {
        const char *sname = slot >= 0 ? castor__optim_slot_name(opt, slot) : NULL;
        for (int l = 0; l < m->n_layers && !which; l++)
            for (int bias = 0; bias < 2 && !which; bias++) {
                snprintf(name, len, "dense_%d.%s%s%s", l, bias ? "bias" : "kernel",
                         sname ? "." : "", sname ? sname : "");
                if (!bsearch(name, sorted, f->n_tensors, sizeof *sorted, cmp_key_tensor))
                    which = slot >= 0 ? 2 : 1;
            }
    }
    free(sorted);
    return which;
}

/* Whether the file's tensors hold at least as many floats as the
 * architecture in its metadata needs (variables and optimizer slots); names
 * and shapes, and tensors to spare, are checked one by one after compile. */
static int check_size_claim(castor_model *m, const castor__st_file *f,
                            const castor_optimizer *opt, const char *path)
{
    uint64_t in_file = 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        in_file += f->tensors[i].count;  /* each <= the file's length: no overflow */
    uint64_t need = (uint64_t)m->n_params * (uint64_t)(1 + castor__optim_slots(opt));
    if (in_file >= need)
        return CASTOR_OK;
    /* Named, where a tensor is missing: a file of the variables alone (the
     * optimizer state dropped on export) said only "the tensors hold only
     * 259". */
    char missing[64];
    int which = first_missing(m, f, opt, missing, sizeof missing);
    if (which < 0)
        return castor__model_fail(m, CASTOR_NOMEM, "%s: out of memory", path);
    if (which)
        return castor__model_fail(m, CASTOR_FORMAT,
                                  "%s: tensor %s is missing%s (__metadata__ describes %zu "
                                  "parameters, %" PRIu64 " floats with the optimizer state; the "
                                  "tensors hold %" PRIu64 ")",
                                  path, missing,
                                  which == 2 ? ": a castor checkpoint carries the optimizer's "
                                               "state beside the variables"
                                             : "",
                                  m->n_params, need, in_file);
    return castor__model_fail(m, CASTOR_FORMAT,
                              "%s: __metadata__ describes %zu parameters (%" PRIu64
                              " floats with the optimizer state), but the tensors hold only "
                              "%" PRIu64,
                              path, m->n_params, need, in_file);
}

int castor_model_open(castor_model **out, const char *path, castor_strategy *strategy)
{
    if (!out)
        return CASTOR_MISUSE;
    *out = NULL;
    char err[CASTOR__MSG_MAX];
    castor__st_file f;
    castor__ckpt_info info;
    int rc;
    if (!path || !*path) {
        snprintf(err, sizeof err, "open: no file name given");
        rc = CASTOR_MISUSE;
    } else if (!strategy) {
        /* Before the file is read: it may be large, and would be refused. */
        snprintf(err, sizeof err, "%s: open needs a strategy to compile the model on", path);
        rc = CASTOR_MISUSE;
    } else if ((rc = castor__strategy_refuses_model(strategy, path, err, sizeof err))) {
        /* Before the file is read, too: it would be read whole, then refused. */
    } else {
        rc = castor__st_read(path, &f, err, sizeof err);
        if (!rc && (rc = castor__ckpt_read_info(&f, path, &info, err, sizeof err)))
            castor__st_free(&f);
    }
    if (rc) {
        /* A model only to carry the message. */
        castor_model *m = NULL;
        if (castor_model_create(&m, 1) == CASTOR_OK)
            castor__model_fail(m, rc, "%s", err);
        *out = m;
        return rc;
    }
    castor_model *m = NULL;
    rc = castor_model_create(&m, info.input_features);
    *out = m;
    if (!m) {
        castor__st_free(&f);
        return rc;
    }
    if (!rc)
        rc = castor_model_add_layers(m, info.layers);
    if (rc == CASTOR_NOMEM) {  /* no fault of the file's architecture: it blames none */
        castor__model_fail(m, rc, "%s: out of memory", path);
        castor__st_free(&f);
        return rc;
    }
    if (rc) {
        rc = CASTOR_FORMAT;  /* the file is wrong, not the caller's arguments */
        castor__st_printable(m->errmsg, err, sizeof err);  /* it quotes the file's spec */
        castor__model_fail(m, rc, "%s: bad architecture in __metadata__: %s", path, err);
        castor__st_free(&f);
        return rc;
    }
    /* The metadata alone decides how much compile allocates: a few bytes of
     * it could ask for gigabytes. Hold it to the tensors the file really
     * carries before allocating anything for it. */
    if ((rc = check_size_claim(m, &f, &info.opt, path))) {
        castor__st_free(&f);
        return rc;
    }
    rc = castor_model_compile(m, strategy, info.loss, &info.opt, info.seed);
    if (rc == CASTOR_INVALID) {
        /* Every value compile judges here is the file's (softmax
         * cross-entropy on a last layer that is not linear, or of 1 unit). */
        char why[sizeof m->errmsg];
        snprintf(why, sizeof why, "%s", m->errmsg);
        rc = castor__model_fail(m, CASTOR_FORMAT, "%s: bad model in __metadata__: %s", path,
                                why);
    }
    /* A file found bad after compile leaves only the message, as one found
     * bad before: no model of fresh weights holding the strategy. */
    if (!rc && (rc = load_parsed(m, &f, path)))
        castor__model_detach(m);
    castor__st_free(&f);
    return rc;
}

/* ---- save ------------------------------------------------------------------------ */

enum { META_MAX = 32 };

int castor_model_save(castor_model *m, const char *path)
{
    if (!m)
        return CASTOR_MISUSE;
    if (!path || !*path)
        return castor__model_fail(m, CASTOR_MISUSE, "save: no file name given");
    int rc = castor__model_ready(m, "save");
    if (rc)
        return rc;
    if ((rc = m->strategy->ops->pull(m)))
        return rc;

    size_t n = 0;
    expect *exp = expected_tensors(m, &n);
    castor__st_out *outs = calloc(n ? n : 1, sizeof *outs);
    size_t speclen = (size_t)m->n_layers * 40 + 16;
    char *spec = malloc(speclen);
    if (!exp || !outs || !spec || castor_model_layers_spec(m, spec, speclen)) {
        free(exp);
        free(outs);
        free(spec);
        return castor__model_fail(m, CASTOR_NOMEM, "%s: out of memory", path);
    }
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    for (size_t i = 0; i < n; i++) {
        outs[i].name = exp[i].name;
        outs[i].rank = exp[i].rank;
        outs[i].shape[0] = exp[i].shape[0];
        outs[i].shape[1] = exp[i].shape[1];
        outs[i].data = exp[i].dst;
        crc = crc_update(crc, exp[i].dst, exp[i].count * sizeof(float));
    }

    char vals[META_MAX][48];
    castor__st_kv meta[META_MAX];
    size_t k = 0;
#define META_S(name, str) (meta[k].key = (name), meta[k].value = (str), k++)
#define META_F(name, ...)                                                              \
    (snprintf(vals[k], sizeof vals[k], __VA_ARGS__), meta[k].key = (name),             \
     meta[k].value = vals[k], k++)
#define META_G(name, x)                                                                \
    (castor__format_g9(vals[k], sizeof vals[k], (double)(x)), meta[k].key = (name),    \
     meta[k].value = vals[k], k++)
    const castor_optimizer *o = &m->opt;
    META_S("format", CASTOR__CKPT_FORMAT);
    META_S("castor_version", castor_version());
    META_F("input_features", "%d", m->input_features);
    META_S("layers", spec);
    META_S("loss", castor__ckpt_loss_name(m->loss));
    META_S("optimizer", castor_optimizer_kind_name(o->kind));
    META_G("learning_rate", o->learning_rate);
    META_G("momentum", o->momentum);
    META_F("nesterov", "%d", o->nesterov ? 1 : 0);
    META_G("beta1", o->beta1);
    META_G("beta2", o->beta2);
    META_G("epsilon", o->epsilon);
    META_G("weight_decay", o->weight_decay);
    META_F("seed", "%" PRIu64, m->seed);
    META_F("step", "%" PRId64, m->step);
    if (m->opt_step != m->step)
        META_F("optimizer_step", "%" PRId64, m->opt_step);
    META_F("epoch", "%" PRId64, m->epoch);
    META_F("step_in_epoch", "%" PRId64, m->step_in_epoch);
    META_F("epoch_batch", "%d", m->epoch_batch);
    if (m->epoch_samples)
        META_F("epoch_samples", "%" PRIu64, m->epoch_samples);
    if (m->epoch_shuffle >= 0)
        META_F("epoch_shuffle", "%d", m->epoch_shuffle);
    if (m->target_epochs > 0)
        META_F("target_epochs", "%" PRId64, m->target_epochs);
    if (m->in_rank > 0 && castor__ckpt_idx_type_name(m->in_type)) {
        META_S("input_type", castor__ckpt_idx_type_name(m->in_type));
        size_t at = 0;
        for (int d = 0; d < m->in_rank && d < 3; d++)
            at += (size_t)snprintf(vals[k] + at, sizeof vals[k] - at, "%s%" PRIu32,
                                   d ? "x" : "", m->in_dims[d]);
        META_S("input_shape", vals[k]);
    }
    META_S("rng", CKPT_RNG);
    META_S("strategy", m->strategy->ops->name);
    META_S("devices", m->strategy->devices_spec);
    META_F("replicas", "%d", m->strategy->n_replicas);
    if (castor__strategy_cpu_replicas(m->strategy))
        META_F("blas_threads", "%d", castor__cdev_cpu_blas_threads());
    META_F("crc32", "%08" PRIx32, crc);
#undef META_S
#undef META_G
#undef META_F

    rc = castor__st_write(path, outs, n, meta, k, m->errmsg, sizeof m->errmsg);
    free(exp);
    free(outs);
    free(spec);
    return rc;
}

int64_t castor_model_epoch(const castor_model *m)
{
    return m ? m->epoch : 0;
}

int64_t castor_model_step_in_epoch(const castor_model *m)
{
    return m ? m->step_in_epoch : 0;
}

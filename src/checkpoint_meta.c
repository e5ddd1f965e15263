/* A checkpoint's metadata, read and checked (checkpoint.h). */
#include "checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/optim.h"
#include "util.h"

static const struct {
    int code;
    const char *name;
} idx_types[] = {{0x08, "ubyte"}, {0x09, "sbyte"}, {0x0B, "int16"},
                 {0x0C, "int32"}, {0x0D, "float32"}, {0x0E, "float64"}};

const char *castor__ckpt_idx_type_name(int type)
{
    for (size_t i = 0; i < sizeof idx_types / sizeof idx_types[0]; i++)
        if (idx_types[i].code == type)
            return idx_types[i].name;
    return NULL;
}

int castor__ckpt_idx_type_parse(const char *name)
{
    for (size_t i = 0; i < sizeof idx_types / sizeof idx_types[0]; i++)
        if (strcmp(idx_types[i].name, name) == 0)
            return idx_types[i].code;
    return 0;
}

const char *castor__ckpt_loss_name(castor_loss loss)
{
    return loss == CASTOR_LOSS_MSE ? "mse" : "softmax_xent";
}

static int loss_parse(const char *s, castor_loss *out)
{
    if (strcmp(s, "softmax_xent") == 0)
        *out = CASTOR_LOSS_SOFTMAX_XENT;
    else if (strcmp(s, "mse") == 0)
        *out = CASTOR_LOSS_MSE;
    else
        return -1;
    return 0;
}

/* The largest step, epoch or step in an epoch a checkpoint may hold. */
#define CKPT_MAX_POSITION 999999999999ull

/* A whole decimal number, digits only (no sign, no spaces), <= max. */
static int parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || !*s)
        return -1;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        unsigned d = (unsigned)(*p - '0');
        if (d > max || v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *s, float *out)
{
    if (!s || !strchr("+-.0123456789", *s) || !*s)
        return -1;
    char *end = NULL;
    errno = 0;
    float v = castor__strtof_c(s, &end);
    /* ERANGE on a finite result is a subnormal (or an underflow to 0, which
     * the optimizer's own checks then judge): a value like any other. */
    if (*end || v != v || v - v != 0.0f)
        return -1;
    *out = v;
    return 0;
}

static int need(const castor__st_file *f, const char *path, const char *key, const char **out,
                char *err, size_t errlen)
{
    *out = castor__st_meta_get(f, key);
    if (!*out) {
        castor__errf(err, errlen, "%s: not a complete castor checkpoint: __metadata__ has no "
                     "'%s'", path, key);
        return CASTOR_FORMAT;
    }
    return CASTOR_OK;
}

static int bad_value(const char *path, const char *key, const char *value, const char *want,
                     char *err, size_t errlen)
{
    char shown[CASTOR__ST_SHOWN];  /* the value is the file's text: escaped */
    castor__errf(err, errlen, "%s: __metadata__ '%s' is '%s', not %s", path, key,
                 castor__st_printable(value, shown, sizeof shown), want);
    return CASTOR_FORMAT;
}

int castor__ckpt_read_info(const castor__st_file *f, const char *path, castor__ckpt_info *info,
                           char *err, size_t errlen)
{
    memset(info, 0, sizeof *info);
    const char *v;
    uint64_t u;
    int rc;
    if (!castor__st_meta_get(f, "format")) {
        castor__errf(err, errlen, "%s: not a castor checkpoint (the safetensors __metadata__ has "
                     "no 'format')", path);
        return CASTOR_FORMAT;
    }
    v = castor__st_meta_get(f, "format");
    if (strcmp(v, CASTOR__CKPT_FORMAT) != 0) {
        char shown[CASTOR__ST_SHOWN];
        castor__errf(err, errlen, "%s: format '%s' is not %s (written by another program or "
                     "a newer castor?)", path, castor__st_printable(v, shown, sizeof shown),
                     CASTOR__CKPT_FORMAT);
        return CASTOR_FORMAT;
    }
    if ((rc = need(f, path, "input_features", &v, err, errlen)))
        return rc;
    if (parse_uint(v, INT_MAX, &u) || u == 0)
        return bad_value(path, "input_features", v, "a positive whole number", err, errlen);
    info->input_features = (int)u;
    if ((rc = need(f, path, "layers", &info->layers, err, errlen)))
        return rc;
    if ((rc = need(f, path, "loss", &v, err, errlen)))
        return rc;
    if (loss_parse(v, &info->loss))
        return bad_value(path, "loss", v, "softmax_xent or mse", err, errlen);

    if ((rc = need(f, path, "optimizer", &v, err, errlen)))
        return rc;
    castor_optimizer_kind kind;
    if (castor_optimizer_kind_parse(v, &kind))
        return bad_value(path, "optimizer", v, "sgd, adam or adamw", err, errlen);
    castor_optimizer opt = castor_optimizer_defaults(kind);
    static const char *const fkeys[] = {"learning_rate", "momentum", "beta1", "beta2",
                                        "epsilon", "weight_decay"};
    float *fvals[] = {&opt.learning_rate, &opt.momentum, &opt.beta1, &opt.beta2, &opt.epsilon,
                      &opt.weight_decay};
    for (size_t i = 0; i < sizeof fkeys / sizeof fkeys[0]; i++) {
        if ((rc = need(f, path, fkeys[i], &v, err, errlen)))
            return rc;
        if (parse_float(v, fvals[i]))
            return bad_value(path, fkeys[i], v, "a finite number", err, errlen);
    }
    if ((rc = need(f, path, "nesterov", &v, err, errlen)))
        return rc;
    if (parse_uint(v, 1, &u))
        return bad_value(path, "nesterov", v, "0 or 1", err, errlen);
    opt.nesterov = (int)u;
    char oerr[256];
    /* As compile judges them: settings another kind reads are not dropped
     * here either (castor writes them as 0). */
    if (castor__optim_validate(&opt, oerr, sizeof oerr) ||
        castor__optim_check_dropped(&opt, oerr, sizeof oerr)) {
        castor__errf(err, errlen, "%s: bad optimizer in __metadata__: %s", path, oerr);
        return CASTOR_FORMAT;
    }
    info->opt = opt;

    if ((rc = need(f, path, "seed", &v, err, errlen)))
        return rc;
    if (parse_uint(v, UINT64_MAX, &info->seed))
        return bad_value(path, "seed", v, "a whole number", err, errlen);
    static const char *const ikeys[] = {"step", "epoch", "step_in_epoch"};
    int64_t *ivals[] = {&info->step, &info->epoch, &info->step_in_epoch};
    for (size_t i = 0; i < 3; i++) {
        if ((rc = need(f, path, ikeys[i], &v, err, errlen)))
            return rc;
        /* Checkpoint names hold 12 digits of step, and a step counter near
         * INT64_MAX would overflow as training goes on. */
        if (parse_uint(v, CKPT_MAX_POSITION, &u))
            return bad_value(path, ikeys[i], v, "a whole number from 0 to 999999999999", err,
                             errlen);
        *ivals[i] = (int64_t)u;
    }
    /* Optional: written only where the optimizer state has taken fewer
     * steps than the model (after a mirrored recovery, see set_params). */
    info->optimizer_step = info->step;
    if ((v = castor__st_meta_get(f, "optimizer_step"))) {
        if (parse_uint(v, CKPT_MAX_POSITION, &u))
            return bad_value(path, "optimizer_step", v, "a whole number from 0 to 999999999999",
                             err, errlen);
        info->optimizer_step = (int64_t)u;
    }
    if ((rc = need(f, path, "epoch_batch", &v, err, errlen)))
        return rc;
    if (parse_uint(v, INT_MAX, &u))
        return bad_value(path, "epoch_batch", v, "a whole number >= 0", err, errlen);
    info->epoch_batch = (int)u;
    if (info->step_in_epoch > 0 && info->epoch_batch == 0)
        return bad_value(path, "epoch_batch", v, "a batch size (an epoch is in progress)", err,
                         errlen);
    /* Optional: older files lack them. */
    if ((v = castor__st_meta_get(f, "epoch_samples")) &&
        (parse_uint(v, UINT32_MAX, &info->epoch_samples) || info->epoch_samples == 0))
        return bad_value(path, "epoch_samples", v, "a positive whole number", err, errlen);
    /* An epoch's position is always short of its end (the step that ends
     * it starts the next at 0): one past it loaded, and then every fit
     * refused the model as trained on other data. */
    if (info->step_in_epoch > 0 && info->epoch_samples) {
        uint64_t steps = (info->epoch_samples + (uint64_t)info->epoch_batch - 1) /
                         (uint64_t)info->epoch_batch;
        if ((uint64_t)info->step_in_epoch >= steps) {
            char want[128];
            snprintf(want, sizeof want, "below %" PRIu64 ", the steps of an epoch of %" PRIu64
                     " samples in batches of %d", steps, info->epoch_samples, info->epoch_batch);
            return bad_value(path, "step_in_epoch", castor__st_meta_get(f, "step_in_epoch"),
                             want, err, errlen);
        }
    }
    info->epoch_shuffle = -1;
    if ((v = castor__st_meta_get(f, "epoch_shuffle"))) {
        if (parse_uint(v, 1, &u))
            return bad_value(path, "epoch_shuffle", v, "0 or 1", err, errlen);
        info->epoch_shuffle = (int)u;
    }
    /* Optional: older files lack it. A fit ends at or before its target,
     * so one below the epochs done is not what castor wrote. */
    if ((v = castor__st_meta_get(f, "target_epochs"))) {
        if (parse_uint(v, CKPT_MAX_POSITION, &u) || u == 0 || (int64_t)u < info->epoch)
            return bad_value(path, "target_epochs", v, "a whole number from the epoch (at "
                             "least 1) to 999999999999", err, errlen);
        info->target_epochs = (int64_t)u;
    }

    /* Optional, and together: what the model was trained on. */
    const char *shape = castor__st_meta_get(f, "input_shape");
    const char *type = castor__st_meta_get(f, "input_type");
    info->input_type = info->input_rank = 0;
    if (shape || type) {
        if (!shape || !type)
            return bad_value(path, shape ? "input_type" : "input_shape", "", "given with "
                             "the other (input_shape and input_type go together)", err, errlen);
        if (!(info->input_type = castor__ckpt_idx_type_parse(type)))
            return bad_value(path, "input_type", type, "ubyte, sbyte, int16, int32, float32 "
                             "or float64", err, errlen);
        uint64_t product = 1;
        const char *p = shape;
        int bad = 0;
        do {
            char *end;
            if (*p < '1' || *p > '9' || info->input_rank == 3) {
                bad = 1;
                break;
            }
            errno = 0;
            unsigned long long d = strtoull(p, &end, 10);
            if (errno || d > (uint64_t)INT_MAX / product) {
                bad = 1;
                break;
            }
            product *= d;
            info->input_dims[info->input_rank++] = (uint32_t)d;
            p = end;
        } while (*p == 'x' && *++p);
        if (bad || *p || product != (uint64_t)info->input_features)
            return bad_value(path, "input_shape", shape, "1 to 3 dimensions joined by 'x' "
                             "whose product is input_features", err, errlen);
    }

    /* A file written by another program (a Python script that edits a
     * castor file's weights) is told how to make it. */
    v = castor__st_meta_get(f, "crc32");
    if (!v) {
        castor__errf(err, errlen, "%s: not a complete castor checkpoint: __metadata__ has no "
                     "'crc32' (zlib's CRC-32 of the data section, as 8 hex digits)", path);
        return CASTOR_FORMAT;
    }
    size_t len = strlen(v);
    if (len != 8 || strspn(v, "0123456789abcdefABCDEF") != len)
        return bad_value(path, "crc32", v, "8 hex digits: zlib's CRC-32 of the data section",
                         err, errlen);
    info->crc = (uint32_t)strtoul(v, NULL, 16);
    return CASTOR_OK;
}

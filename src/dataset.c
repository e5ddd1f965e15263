/* castor_dataset: samples in memory, from IDX files or from the caller. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dataset.h"
#include "util.h"

static castor_dataset *dataset_new(void)
{
    return calloc(1, sizeof(castor_dataset));
}

static void dataset_clear(castor_dataset *ds)
{
    free(ds->x);
    free(ds->labels);
    free(ds->targets);
    ds->x = NULL;
    ds->labels = NULL;
    ds->targets = NULL;
    ds->n = 0;
}

void castor_dataset_free(castor_dataset *ds)
{
    if (!ds)
        return;
    dataset_clear(ds);
    free(ds);
}

const char *castor_dataset_errmsg(const castor_dataset *ds)
{
    if (!ds)
        return "out of memory (no dataset handle)";
    return ds->errmsg[0] ? ds->errmsg : "no error";
}

static int fail(castor_dataset *ds, int code)
{
    dataset_clear(ds);
    return code;
}

int castor_dataset_load_idx(castor_dataset **out, const char *images_path,
                            const char *labels_path)
{
    if (!out)
        return CASTOR_MISUSE;
    castor_dataset *ds = *out = dataset_new();
    if (!ds)
        return CASTOR_NOMEM;
    if (!images_path || !labels_path) {
        castor__errf(ds->errmsg, sizeof ds->errmsg, "load_idx: NULL path");
        return CASTOR_MISUSE;
    }
    castor__idx img, lab;
    int rc = castor__idx_read(images_path, 0, &img, ds->errmsg, sizeof ds->errmsg);
    if (rc)
        return rc;
    if (img.rank < 2) {
        castor__errf(ds->errmsg, sizeof ds->errmsg,
                     "%s: images need at least 2 dimensions (samples x features), file has 1",
                     images_path);
        castor__idx_free(&img);
        return CASTOR_FORMAT;
    }
    /* Labels cannot outnumber images, which bounds what the label file may claim. */
    if ((rc = castor__idx_read(labels_path, img.dims[0], &lab, ds->errmsg, sizeof ds->errmsg))) {
        castor__idx_free(&img);
        return rc;
    }
    if (lab.rank != 1 || lab.dims[0] != img.dims[0]) {
        castor__errf(ds->errmsg, sizeof ds->errmsg,
                     "%s: %u labels (rank %d) for %u images in %s", labels_path, lab.dims[0],
                     lab.rank, img.dims[0], images_path);
        castor__idx_free(&img);
        castor__idx_free(&lab);
        return CASTOR_FORMAT;
    }
    size_t n = img.dims[0], features = img.count / n;
    if (features > (1u << 24)) {
        castor__errf(ds->errmsg, sizeof ds->errmsg, "%s: %zu features per sample is too many",
                     images_path, features);
        castor__idx_free(&img);
        castor__idx_free(&lab);
        return CASTOR_FORMAT;
    }
    ds->labels = malloc(n * sizeof(int32_t));
    if (!ds->labels) {
        castor__idx_free(&img);
        castor__idx_free(&lab);
        castor__errf(ds->errmsg, sizeof ds->errmsg, "out of memory");
        return CASTOR_NOMEM;
    }
    int max_label = -1;
    for (size_t i = 0; i < n; i++) {
        float v = lab.values[i];
        if (!(v >= 0.0f && v < 65536.0f) || v != floorf(v)) {
            castor__errf(ds->errmsg, sizeof ds->errmsg,
                         "%s: label %zu is %g, not a class number 0..65535", labels_path, i,
                         (double)v);
            castor__idx_free(&img);
            castor__idx_free(&lab);
            return fail(ds, CASTOR_FORMAT);
        }
        ds->labels[i] = (int32_t)v;
        if (ds->labels[i] > max_label)
            max_label = ds->labels[i];
    }
    castor__idx_free(&lab);
    /* Pixels (unsigned bytes) are scaled to [0, 1]; other types kept as they are. */
    if (img.type == 0x08)
        for (size_t i = 0; i < img.count; i++)
            img.values[i] *= 1.0f / 255.0f;
    ds->x = img.values;
    ds->n = n;
    ds->features = (int)features;
    ds->num_classes = max_label + 1;
    return CASTOR_OK;
}

/* path/name or path/name.gz, whichever exists (plain first). */
static int find_file(const char *dir, const char *name, char *buf, size_t size)
{
    struct stat st;
    snprintf(buf, size, "%s/%s", dir, name);
    if (stat(buf, &st) == 0 && !S_ISDIR(st.st_mode))
        return 1;
    snprintf(buf, size, "%s/%s.gz", dir, name);
    return stat(buf, &st) == 0 && !S_ISDIR(st.st_mode);
}

int castor_dataset_load_mnist_dir(castor_dataset **out, const char *dir, const char *which)
{
    if (!out)
        return CASTOR_MISUSE;
    const char *prefix = NULL;
    if (which && strcmp(which, "train") == 0)
        prefix = "train";
    else if (which && strcmp(which, "test") == 0)
        prefix = "t10k";
    if (!dir || !prefix) {
        castor_dataset *ds = *out = dataset_new();
        if (!ds)
            return CASTOR_NOMEM;
        castor__errf(ds->errmsg, sizeof ds->errmsg,
                     "load_mnist_dir: need a directory and \"train\" or \"test\"");
        return CASTOR_INVALID;
    }
    char images[4096], labels[4096], iname[64], lname[64];
    snprintf(iname, sizeof iname, "%s-images-idx3-ubyte", prefix);
    snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte", prefix);
    int have_i = find_file(dir, iname, images, sizeof images);
    int have_l = find_file(dir, lname, labels, sizeof labels);
    if (!have_i || !have_l) {
        castor_dataset *ds = *out = dataset_new();
        if (!ds)
            return CASTOR_NOMEM;
        castor__errf(ds->errmsg, sizeof ds->errmsg,
                     "%s: missing %s[.gz]%s%s (for Fashion-MNIST install the Debian package "
                     "dataset-fashion-mnist)",
                     dir, !have_i ? iname : lname, !have_i && !have_l ? " and " : "",
                     !have_i && !have_l ? lname : "");
        return CASTOR_IO;
    }
    return castor_dataset_load_idx(out, images, labels);
}

int castor_dataset_from_memory(castor_dataset **out, const float *x, size_t n, int features,
                               const int32_t *labels, const float *targets, int target_dim)
{
    if (!out)
        return CASTOR_MISUSE;
    castor_dataset *ds = *out = dataset_new();
    if (!ds)
        return CASTOR_NOMEM;
    char *err = ds->errmsg;
    size_t es = sizeof ds->errmsg, xcount, tcount = 0;
    if (!x || n == 0 || features <= 0)
        return castor__errf(err, es, "from_memory: need samples (n > 0, features > 0, x set)"),
               CASTOR_INVALID;
    if (!labels == !targets)
        return castor__errf(err, es, "from_memory: give either labels or targets"),
               CASTOR_INVALID;
    if (targets && target_dim <= 0)
        return castor__errf(err, es, "from_memory: target_dim must be positive"), CASTOR_INVALID;
    if (n > UINT32_MAX || !castor__mul_ok(n, (size_t)features, &xcount) ||
        (targets && !castor__mul_ok(n, (size_t)target_dim, &tcount)))
        return castor__errf(err, es, "from_memory: too many samples"), CASTOR_INVALID;
    ds->x = malloc(xcount * sizeof(float));
    if (labels)
        ds->labels = malloc(n * sizeof(int32_t));
    if (targets)
        ds->targets = malloc(tcount * sizeof(float));
    if (!ds->x || (labels && !ds->labels) || (targets && !ds->targets))
        return castor__errf(err, es, "from_memory: out of memory"), fail(ds, CASTOR_NOMEM);
    memcpy(ds->x, x, xcount * sizeof(float));
    int max_label = -1;
    if (labels) {
        for (size_t i = 0; i < n; i++) {
            if (labels[i] < 0)
                return castor__errf(err, es, "from_memory: label %zu is negative (%d)", i,
                                    labels[i]),
                       fail(ds, CASTOR_INVALID);
            if (labels[i] > max_label)
                max_label = labels[i];
        }
        memcpy(ds->labels, labels, n * sizeof(int32_t));
    } else {
        memcpy(ds->targets, targets, tcount * sizeof(float));
        ds->target_dim = target_dim;
    }
    ds->n = n;
    ds->features = features;
    ds->num_classes = max_label + 1;
    return CASTOR_OK;
}

size_t castor_dataset_size(const castor_dataset *ds)
{
    return ds ? ds->n : 0;
}

int castor_dataset_features(const castor_dataset *ds)
{
    return ds ? ds->features : 0;
}

const float *castor_dataset_x(const castor_dataset *ds)
{
    return ds ? ds->x : NULL;
}

const int32_t *castor_dataset_labels(const castor_dataset *ds)
{
    return ds ? ds->labels : NULL;
}

int castor_dataset_split_tail(castor_dataset *ds, size_t count, castor_dataset **tail)
{
    if (!ds || !tail)
        return CASTOR_MISUSE;
    *tail = NULL;
    if (count == 0 || count >= ds->n) {
        castor__errf(ds->errmsg, sizeof ds->errmsg,
                     "split_tail: %zu samples cannot be split off %zu (need 0 < count < n)",
                     count, ds->n);
        return CASTOR_INVALID;
    }
    size_t keep = ds->n - count, f = (size_t)ds->features;
    int rc = castor_dataset_from_memory(tail, ds->x + keep * f, count, ds->features,
                                        ds->labels ? ds->labels + keep : NULL,
                                        ds->targets ? ds->targets + keep * (size_t)ds->target_dim
                                                    : NULL,
                                        ds->target_dim);
    if (rc) {
        castor__errf(ds->errmsg, sizeof ds->errmsg, "%s", castor_dataset_errmsg(*tail));
        castor_dataset_free(*tail);
        *tail = NULL;
        return rc;
    }
    /* The tail's classes may need as many outputs as the whole set did. */
    (*tail)->num_classes = ds->num_classes;
    ds->n = keep;
    return CASTOR_OK;
}

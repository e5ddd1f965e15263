/* castor_dataset: samples in memory, from IDX files or from the caller. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dataset.h"
#include "util.h"

/* Labels travel through the IDX reader as floats, which hold every integer
 * below 2^24 exactly; a larger int32 label could arrive rounded to another
 * class (2^24 + 1 becomes 2^24), so it is refused rather than changed. */
#define MAX_IDX_LABEL ((1 << 24) - 1)

static void dataset_clear(castor_dataset *ds)
{
    free(ds->x);
    free(ds->labels);
    free(ds->targets);
    ds->x = NULL;
    ds->labels = NULL;
    ds->targets = NULL;
    ds->n = 0;
    ds->features = 0;
    ds->num_classes = 0;
    ds->target_dim = 0;
    ds->idx_type = 0;
    ds->sample_rank = 0;
}

CASTOR_API void castor_dataset_free(castor_dataset *ds)
{
    if (!ds)
        return;
    dataset_clear(ds);
    free(ds);
}

CASTOR_API const char *castor_dataset_errmsg(const castor_dataset *ds)
{
    if (!ds)
        return "out of memory (no dataset handle could be made)";
    return ds->errmsg[0] ? ds->errmsg : "no error";
}

/* The handle goes out also on failure, so that the caller can read why. */
static int dataset_new(castor_dataset **out)
{
    *out = calloc(1, sizeof(castor_dataset));
    return *out ? CASTOR_OK : CASTOR_NOMEM;
}

static int load_idx_into(castor_dataset *ds, const char *images_path, const char *labels_path)
{
    char *err = ds->errmsg;
    size_t errlen = sizeof ds->errmsg;
    castor__idx img, lab;
    int32_t *labels = NULL;
    /* More features than a model takes is refused from the header, before
     * the data is read: a 2 MB gzip of 2 x 2^30 zeros took 11.7 s and 4.3 GB
     * to load before the model refused its width. */
    int rc = castor__idx_read_samples(images_path, 0, CASTOR_MAX_UNITS, &img, err, errlen);
    if (rc)
        return rc;
    if (img.rank < 2) {
        castor__errf(err, errlen,
                     "%s: images need at least 2 dimensions (samples x features), file has 1",
                     images_path);
        castor__idx_free(&img);
        return CASTOR_FORMAT;
    }
    size_t n = img.dims[0], features = img.count / n;
    /* Only float files can carry NaN or infinity; one would poison training
     * with no hint of where it came from. */
    if (img.type == 0x0D || img.type == 0x0E) {
        for (size_t i = 0; i < img.count; i++) {
            if (!isfinite(img.values[i])) {
                /* A float64 past float32's range is finite in the file; the
                 * file's own NaN or inf reads the same once converted. */
                castor__errf(err, errlen, "%s: sample %zu, value %zu is %g%s, not a finite "
                             "number%s", images_path, i / features, i % features,
                             castor__shown(img.values[i]), img.type == 0x0E ? " as float32" : "",
                             img.type == 0x0E ? " (a float64 value past +-3.4e38 becomes inf "
                                                "in castor's float32)" : "");
                castor__idx_free(&img);
                return CASTOR_FORMAT;
            }
        }
    }
    if ((rc = castor__idx_read(labels_path, 0, &lab, err, errlen))) {
        castor__idx_free(&img);
        return rc;
    }
    rc = CASTOR_FORMAT;
    if (lab.rank != 1) {
        castor__errf(err, errlen, "%s: a label file has 1 dimension, this one has %d",
                     labels_path, lab.rank);
        goto done;
    }
    if (lab.count != n) {
        castor__errf(err, errlen, "%s: %zu labels for the %zu images in %s", labels_path,
                     lab.count, n, images_path);
        goto done;
    }
    labels = malloc(n * sizeof(int32_t));
    if (!labels) {
        castor__errf(err, errlen, "%s: out of memory for %zu labels", labels_path, n);
        rc = CASTOR_NOMEM;
        goto done;
    }
    int32_t max_label = 0;
    for (size_t i = 0; i < n; i++) {
        float v = lab.values[i];
        if (!(v >= 0.0f && v <= (float)MAX_IDX_LABEL) || v != floorf(v)) {
            /* Whole-number labels whole ("16777216", not "1.67772e+07"),
             * and the likeliest cause of such a value: 1 written as a
             * little-endian int32 reads as 16777216, as float32 as 4.6e-41. */
            int multibyte = lab.type != 0x08 && lab.type != 0x09;
            int swapped = multibyte && (isnan(v) || fabsf(v) >= 256.0f ||
                                        (v != 0.0f && fabsf(v) < 1e-30f));
            castor__errf(err, errlen, "%s: sample %zu's label is %.10g, not a class number "
                         "0..%d%s", labels_path, i, castor__shown(v), MAX_IDX_LABEL,
                         swapped ? " (IDX numbers are big-endian: was the file written "
                                   "little-endian, as numpy's tofile does on x86?)" : "");
            goto done;
        }
        labels[i] = (int32_t)v;
        if (labels[i] > max_label)
            max_label = labels[i];
    }
    /* Unsigned bytes are pixels; every other type is taken as it is. */
    if (img.type == 0x08)
        for (size_t i = 0; i < img.count; i++)
            img.values[i] /= 255.0f;
    ds->x = img.values;
    img.values = NULL;
    ds->labels = labels;
    labels = NULL;
    ds->n = n;
    ds->features = (int)features;
    ds->num_classes = (int)max_label + 1;
    ds->idx_type = img.type;
    ds->sample_rank = img.rank - 1;
    for (int d = 1; d < img.rank; d++)
        ds->sample_dims[d - 1] = img.dims[d];
    rc = CASTOR_OK;
done:
    free(labels);
    castor__idx_free(&img);
    castor__idx_free(&lab);
    return rc;
}

CASTOR_API int castor_dataset_load_idx(castor_dataset **out, const char *images_path,
                                       const char *labels_path)
{
    if (!out)
        return CASTOR_MISUSE;
    if (dataset_new(out))
        return CASTOR_NOMEM;
    castor_dataset *ds = *out;
    if (!images_path || !labels_path || !*images_path || !*labels_path) {
        int images_bad = !images_path || !*images_path;
        const char *bad = images_bad ? images_path : labels_path;
        castor__errf(ds->errmsg, sizeof ds->errmsg, "load_idx: the %s path is %s",
                     images_bad ? "images" : "labels", bad ? "empty" : "NULL");
        return CASTOR_MISUSE;
    }
    return load_idx_into(ds, images_path, labels_path);
}

/* Where find_file looked. */
enum { FOUND_NONE, FOUND_FILE, FOUND_DIR, FOUND_DENIED };

/* Whether path names something other than a directory, a directory, or
 * nothing; FOUND_DENIED when its directory may not be searched (no x
 * permission), which is no fault of the file. What stat cannot look at for
 * another reason than its absence (a link into a place we may not search, a
 * loop of links) counts as a file: reading it says why. */
static int what_is(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            return FOUND_NONE;
        /* lstat looks at the entry itself: refused too, it is the directory. */
        if (e == EACCES && lstat(path, &st) != 0 && errno == EACCES)
            return FOUND_DENIED;
        return FOUND_FILE;
    }
    return S_ISDIR(st.st_mode) ? FOUND_DIR : FOUND_FILE;
}

/* dir/name or dir/name.gz into buf: the first that is not a directory (plain
 * first), FOUND_FILE; else the first that is a directory, FOUND_DIR; else
 * FOUND_NONE; FOUND_DENIED if dir may not be searched. -1 if the path does
 * not fit. */
static int find_file(const char *dir, const char *name, char *buf, size_t size)
{
    /* "dir/" as given needs no second slash in the paths that messages show. */
    size_t dlen = strlen(dir);
    const char *sep = dlen && dir[dlen - 1] == '/' ? "" : "/";
    int len = snprintf(buf, size, "%s%s%s.gz", dir, sep, name);
    if (len < 0 || (size_t)len >= size)
        return -1;
    buf[len - 3] = '\0';
    int plain = what_is(buf);
    if (plain == FOUND_FILE || plain == FOUND_DENIED)
        return plain;
    buf[len - 3] = '.';
    int gz = what_is(buf);
    if (gz == FOUND_FILE || gz == FOUND_DENIED)
        return gz;
    if (plain == FOUND_DIR)
        buf[len - 3] = '\0';
    return plain == FOUND_DIR || gz == FOUND_DIR ? FOUND_DIR : FOUND_NONE;
}

/* The Debian package's hint, for a directory that is Fashion-MNIST by its
 * name (its place, /usr/share/datasets/fashion-mnist, or a copy): a user's
 * own directory of other data gains nothing from it. */
static const char *fashion_hint(const char *dir)
{
    static const char name[] = "fashion-mnist";
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/')
        len--;
    size_t n = sizeof name - 1;
    if (len < n || strncmp(dir + len - n, name, n) != 0 || (len > n && dir[len - n - 1] != '/'))
        return "";
    return " (for Fashion-MNIST install the Debian package dataset-fashion-mnist)";
}

int castor__mnist_dir_find(const char *dir, const char *which, char *images, char *labels,
                           size_t size, char *err, size_t errlen)
{
    const char *prefix = NULL;
    /* In either case, as castor.h's names are. */
    if (which && castor__ascii_ieq(which, "train"))
        prefix = "train";
    else if (which && castor__ascii_ieq(which, "test"))
        prefix = "t10k";
    if (!dir || !*dir) {
        /* "" would look in the root directory. */
        castor__errf(err, errlen, "load_mnist_dir: the directory is %s", dir ? "empty" : "NULL");
        return CASTOR_MISUSE;
    }
    if (!which) {
        castor__errf(err, errlen, "load_mnist_dir: which set is NULL (\"train\" or \"test\")");
        return CASTOR_MISUSE;
    }
    if (!prefix) {
        castor__errf(err, errlen, "%s: which set is \"%s\"? it must be \"train\" or \"test\"",
                     dir, which);
        return CASTOR_INVALID;
    }
    /* A directory that is not there, or a file, is named as such: "missing
     * train-images-idx3-ubyte" would send the user looking for files. */
    struct stat dst;
    if (stat(dir, &dst) != 0) {
        int e = errno;
        char eb[128];  /* strerror's buffer is one for the process: not while others load */
        castor__errf(err, errlen, "%s: %s%s", dir, castor__strerror(e, eb, sizeof eb),
                     e == ENOENT ? fashion_hint(dir) : "");
        return CASTOR_IO;
    }
    if (!S_ISDIR(dst.st_mode)) {
        castor__errf(err, errlen, "%s: not a directory (give the directory of the IDX files)",
                     dir);
        return CASTOR_IO;
    }
    char iname[32], lname[32];
    snprintf(iname, sizeof iname, "%s-images-idx3-ubyte", prefix);
    snprintf(lname, sizeof lname, "%s-labels-idx1-ubyte", prefix);
    int have_images = find_file(dir, iname, images, size);
    int have_labels = find_file(dir, lname, labels, size);
    if (have_images < 0 || have_labels < 0) {
        castor__errf(err, errlen, "%.200s...: directory path too long", dir);
        return CASTOR_INVALID;
    }
    if (have_images == FOUND_DENIED || have_labels == FOUND_DENIED) {
        char eb[128];
        castor__errf(err, errlen, "%s: cannot look inside the directory: %s", dir,
                     castor__strerror(EACCES, eb, sizeof eb));
        return CASTOR_IO;
    }
    if (have_images == FOUND_DIR || have_labels == FOUND_DIR) {
        castor__errf(err, errlen, "%s: is a directory, not an IDX file",
                     have_images == FOUND_DIR ? images : labels);
        return CASTOR_IO;
    }
    if (!have_images || !have_labels) {
        castor__errf(err, errlen, "%s: missing %s[.gz]%s%s%s%s", dir,
                     !have_images ? iname : lname, !have_images && !have_labels ? " and " : "",
                     !have_images && !have_labels ? lname : "",
                     !have_images && !have_labels ? "[.gz]" : "", fashion_hint(dir));
        return CASTOR_IO;
    }
    return CASTOR_OK;
}

CASTOR_API int castor_dataset_load_mnist_dir(castor_dataset **out, const char *dir,
                                             const char *which)
{
    if (!out)
        return CASTOR_MISUSE;
    if (dataset_new(out))
        return CASTOR_NOMEM;
    castor_dataset *ds = *out;
    char images[4096], labels[4096];
    int rc = castor__mnist_dir_find(dir, which, images, labels, sizeof images, ds->errmsg,
                                    sizeof ds->errmsg);
    if (rc)
        return rc;
    return load_idx_into(ds, images, labels);
}

CASTOR_API int castor_dataset_from_memory(castor_dataset **out, const float *x, size_t n,
                                          int features, const int32_t *labels,
                                          const float *targets, int target_dim)
{
    if (!out)
        return CASTOR_MISUSE;
    if (dataset_new(out))
        return CASTOR_NOMEM;
    castor_dataset *ds = *out;
    char *err = ds->errmsg;
    size_t errlen = sizeof ds->errmsg;
    size_t x_count, target_count = 0, bytes;
    /* A NULL pointer argument is a misuse (castor.h), as predict's x is. */
    if (!x) {
        castor__errf(err, errlen, "from_memory: x is NULL");
        return CASTOR_MISUSE;
    }
    if (n == 0 || features <= 0) {
        castor__errf(err, errlen, "from_memory: need samples: n > 0 (is %zu), features > 0 (is %d)",
                     n, features);
        return CASTOR_INVALID;
    }
    if (features > CASTOR_MAX_UNITS) {
        castor__errf(err, errlen,
                     "from_memory: %d features per sample, more than a model takes (%d)",
                     features, CASTOR_MAX_UNITS);
        return CASTOR_INVALID;
    }
    if (!labels == !targets) {
        castor__errf(err, errlen, "from_memory: give labels or targets, exactly one of them");
        return CASTOR_INVALID;
    }
    if (targets && target_dim <= 0) {
        castor__errf(err, errlen, "from_memory: target_dim must be positive (is %d)", target_dim);
        return CASTOR_INVALID;
    }
    /* The trainer indexes samples with 32-bit permutations. */
    if (n > UINT32_MAX || !castor__mul_ok(n, (size_t)features, &x_count) ||
        !castor__mul_ok(x_count, sizeof(float), &bytes) ||
        (targets && (!castor__mul_ok(n, (size_t)target_dim, &target_count) ||
                     !castor__mul_ok(target_count, sizeof(float), &bytes)))) {
        castor__errf(err, errlen, "from_memory: %zu samples is too many", n);
        return CASTOR_INVALID;
    }
    int32_t max_label = -1;
    if (labels) {
        for (size_t i = 0; i < n; i++) {
            /* num_classes = max + 1 must fit in an int. */
            if (labels[i] < 0 || labels[i] == INT32_MAX) {
                castor__errf(err, errlen,
                             "from_memory: sample %zu's label is %ld, not a class number 0..%ld", i,
                             (long)labels[i], (long)INT32_MAX - 1);
                return CASTOR_INVALID;
            }
            if (labels[i] > max_label)
                max_label = labels[i];
        }
    }
    /* As load_idx refuses them: one NaN or infinity trains every variable
     * into NaN with no error and no hint of where it came from. */
    for (size_t i = 0; i < x_count; i++)
        if (!isfinite(x[i])) {
            castor__errf(err, errlen, "from_memory: sample %zu, feature %zu is %g, not a finite "
                         "number", i / (size_t)features, i % (size_t)features,
                         castor__shown(x[i]));
            return CASTOR_INVALID;
        }
    for (size_t i = 0; targets && i < target_count; i++)
        if (!isfinite(targets[i])) {
            castor__errf(err, errlen, "from_memory: sample %zu, target %zu is %g, not a finite "
                         "number", i / (size_t)target_dim, i % (size_t)target_dim,
                         castor__shown(targets[i]));
            return CASTOR_INVALID;
        }
    ds->x = malloc(x_count * sizeof(float));
    if (labels)
        ds->labels = malloc(n * sizeof(int32_t));
    else
        ds->targets = malloc(target_count * sizeof(float));
    if (!ds->x || (labels && !ds->labels) || (targets && !ds->targets)) {
        dataset_clear(ds);
        castor__errf(err, errlen, "from_memory: out of memory for %zu samples", n);
        return CASTOR_NOMEM;
    }
    memcpy(ds->x, x, x_count * sizeof(float));
    if (labels) {
        memcpy(ds->labels, labels, n * sizeof(int32_t));
        ds->num_classes = (int)max_label + 1;
    } else {
        memcpy(ds->targets, targets, target_count * sizeof(float));
        ds->target_dim = target_dim;
    }
    ds->n = n;
    ds->features = features;
    return CASTOR_OK;
}

int castor__dataset_one_hot(castor_dataset *ds, int units)
{
    if (!ds)
        return CASTOR_MISUSE;
    char *err = ds->errmsg;
    size_t errlen = sizeof ds->errmsg;
    if (atomic_load(&ds->in_use)) {
        castor__errf(err, errlen, "one_hot: the dataset is in use by castor_model_fit or "
                     "evaluate");
        return CASTOR_MISUSE;
    }
    if (!ds->labels) {
        castor__errf(err, errlen, "one_hot: the dataset has no class labels");
        return CASTOR_INVALID;
    }
    if (units <= 0 || ds->num_classes > units) {
        castor__errf(err, errlen, "one_hot: %d units for labels up to %d", units,
                     ds->num_classes - 1);
        return CASTOR_INVALID;
    }
    size_t count, bytes;
    if (!castor__mul_ok(ds->n, (size_t)units, &count) ||
        !castor__mul_ok(count, sizeof(float), &bytes)) {
        castor__errf(err, errlen, "one_hot: %zu samples of %d targets is too many", ds->n, units);
        return CASTOR_INVALID;
    }
    /* The samples stay where they are: only the labels are replaced. */
    float *targets = calloc(count ? count : 1, sizeof(float));
    if (!targets) {
        castor__errf(err, errlen, "one_hot: out of memory for %zu one-hot targets", ds->n);
        return CASTOR_NOMEM;
    }
    for (size_t i = 0; i < ds->n; i++)
        targets[i * (size_t)units + (size_t)ds->labels[i]] = 1.0f;
    free(ds->labels);
    ds->labels = NULL;
    ds->num_classes = 0;
    ds->targets = targets;
    ds->target_dim = units;
    return CASTOR_OK;
}

int castor__dataset_sample_shape(const castor_dataset *ds, uint32_t dims[3], int *idx_type)
{
    if (!ds)
        return 0;
    if (idx_type)
        *idx_type = ds->idx_type;
    if (dims)
        memcpy(dims, ds->sample_dims, sizeof ds->sample_dims);
    return ds->sample_rank;
}

CASTOR_API size_t castor_dataset_size(const castor_dataset *ds)
{
    return ds ? ds->n : 0;
}

CASTOR_API int castor_dataset_features(const castor_dataset *ds)
{
    return ds ? ds->features : 0;
}

CASTOR_API const float *castor_dataset_x(const castor_dataset *ds)
{
    return ds ? ds->x : NULL;
}

CASTOR_API const int32_t *castor_dataset_labels(const castor_dataset *ds)
{
    return ds ? ds->labels : NULL;
}

/* Give back memory the shrunk arrays no longer use; keeping the larger
 * block when realloc cannot is harmless. */
static void *shrink(void *block, size_t bytes)
{
    void *smaller = block ? realloc(block, bytes) : NULL;
    return smaller ? smaller : block;
}

CASTOR_API int castor_dataset_split_tail(castor_dataset *ds, size_t count, castor_dataset **tail)
{
    if (!ds)
        return CASTOR_MISUSE;
    if (!tail) {
        castor__errf(ds->errmsg, sizeof ds->errmsg, "split_tail: tail is NULL");
        return CASTOR_MISUSE;
    }
    *tail = NULL;
    if (atomic_load(&ds->in_use)) {
        castor__errf(ds->errmsg, sizeof ds->errmsg,
                     "split_tail: the dataset is in use by castor_model_fit or evaluate, whose "
                     "progress callback and stop check may read it, not change it");
        return CASTOR_MISUSE;
    }
    if (count == 0 || count >= ds->n) {
        castor__errf(ds->errmsg, sizeof ds->errmsg,
                     "split_tail: cannot split %zu of %zu samples off (need 0 < count < size)",
                     count, ds->n);
        return CASTOR_INVALID;
    }
    size_t keep = ds->n - count, features = (size_t)ds->features;
    size_t target_dim = (size_t)ds->target_dim;
    int rc = castor_dataset_from_memory(tail, ds->x + keep * features, count, ds->features,
                                        ds->labels ? ds->labels + keep : NULL,
                                        ds->targets ? ds->targets + keep * target_dim : NULL,
                                        ds->target_dim);
    if (rc) {
        castor__errf(ds->errmsg, sizeof ds->errmsg, "split_tail: %s", castor_dataset_errmsg(*tail));
        castor_dataset_free(*tail);
        *tail = NULL;
        return rc;
    }
    /* Outputs are sized for the whole set's classes, which the tail alone
     * may not all contain. */
    (*tail)->num_classes = ds->num_classes;
    (*tail)->idx_type = ds->idx_type;
    (*tail)->sample_rank = ds->sample_rank;
    memcpy((*tail)->sample_dims, ds->sample_dims, sizeof ds->sample_dims);
    ds->x = shrink(ds->x, keep * features * sizeof(float));
    if (ds->labels)
        ds->labels = shrink(ds->labels, keep * sizeof(int32_t));
    if (ds->targets)
        ds->targets = shrink(ds->targets, keep * target_dim * sizeof(float));
    ds->n = keep;
    return CASTOR_OK;
}

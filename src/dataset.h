/*
 * The in-memory dataset behind castor_dataset, and the IDX reader.
 *
 * Samples are rows of `features` floats; a classification set carries int32
 * labels, a regression set `target_dim` floats per sample.
 */
#ifndef CASTOR_DATASET_H
#define CASTOR_DATASET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "castor.h"
#include "src/util.h"

struct castor_dataset {
    size_t n;             /* samples */
    int features;         /* floats per sample */
    float *x;             /* n x features */
    int32_t *labels;      /* n class ids, or NULL */
    int num_classes;      /* max label + 1 (0 without labels) */
    float *targets;       /* n x target_dim, or NULL */
    int target_dim;
    /* What the IDX image file said of the samples (0 where they came from
     * memory): its element type code (castor__idx's type: only 0x08 is
     * scaled) and each sample's shape, the dimensions after the first. */
    int idx_type;
    int sample_rank;      /* 1..3, 0: unknown */
    uint32_t sample_dims[3];
    /* How many castor_model_fit calls read it now (training or validation
     * data): their progress callbacks must not split it under them. Atomic:
     * fits on separate models in separate threads may share a dataset,
     * which they only read. */
    atomic_int in_use;
    char errmsg[CASTOR__MSG_MAX];
};

/* Replaces ds's class labels by one-hot targets of `units` floats each (a
 * mean-squared-error model's), in place: the samples are not copied. Every
 * label must be below units (CASTOR_INVALID); on failure ds is unchanged and
 * its errmsg says why. */
int castor__dataset_one_hot(castor_dataset *ds, int units);

/* The IDX element type of ds's images (0x08 unsigned byte, ...; 0 for a
 * set made from memory) and each sample's shape into dims (at most 3):
 * the number of dimensions, 0 where unknown. For the command line, which
 * refuses a test set that was read otherwise than its training set. */
int castor__dataset_sample_shape(const castor_dataset *ds, uint32_t dims[3], int *idx_type);

/* Where castor_dataset_load_mnist_dir would read `which` ("train" or
 * "test") of dir: the images' and labels' paths into images and labels
 * (size bytes each), found without reading them; else a status and err
 * says what is missing (the message load_mnist_dir gives). So that a
 * caller needing both sets finds a missing one before loading the other. */
int castor__mnist_dir_find(const char *dir, const char *which, char *images, char *labels,
                           size_t size, char *err, size_t errlen);

/* One IDX file (http://yann.lecun.com/exdb/mnist/ format), plain or gzip.
 * The reader treats the file as untrusted: magic, type code, rank and every
 * dimension are checked, the element count against overflow and against the
 * bytes actually present, before anything is allocated for the data. */
typedef struct castor__idx {
    int type;             /* 0x08 ubyte, 0x09 sbyte, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64 */
    int rank;             /* 1..4 accepted */
    uint32_t dims[4];
    size_t count;         /* product of dims */
    float *values;        /* count values converted to float (malloc) */
} castor__idx;

/* Reads and validates; on failure writes "PATH: what is wrong" into err and
 * returns CASTOR_IO (cannot open/read) or CASTOR_FORMAT (bad contents).
 * max_count bounds the element count (0: 1<<31) so a lying header cannot
 * make us allocate gigabytes. */
int castor__idx_read(const char *path, size_t max_count, castor__idx *out, char *err,
                     size_t errlen);
/* Same, also refusing (CASTOR_FORMAT) a file whose samples (the elements
 * after the first dimension) hold more than max_sample elements each,
 * checked on the header, before the data is read (0: no bound). */
int castor__idx_read_samples(const char *path, size_t max_count, size_t max_sample,
                             castor__idx *out, char *err, size_t errlen);
/* Same, from bytes already in memory (used by the fuzz harness). name is used
 * in messages. The bytes are the decompressed file. */
int castor__idx_parse(const unsigned char *bytes, size_t len, const char *name,
                      size_t max_count, castor__idx *out, char *err, size_t errlen);
void castor__idx_free(castor__idx *idx);

#endif

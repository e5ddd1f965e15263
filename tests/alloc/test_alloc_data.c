/*
 * Data sets with each allocation failing in turn: from memory (labels and
 * targets), from IDX files (plain and gzip, and a directory of them; and a
 * gzip file of more values than the reader first makes room for), and
 * split_tail. A failed constructor hands out a handle (or none, when not
 * even that could be had) that says memory ran out, holds no samples and
 * frees cleanly; a failed split leaves the set whole; the call right after
 * succeeds with the samples it should have.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_sweep.h"
#include "castor.h"
#include "tests/support.h"

#define NS 12     /* samples */
#define ROWS 2    /* each a 2 x 3 image */
#define COLS 3
#define TAIL 4
/* A gzip file's size says nothing of its values: the reader makes room for
 * 65536 and grows. This many 28 x 28 images are more. */
#define NS_BIG 100
#define SIDE_BIG 28

enum { FROM_LABELS, FROM_TARGETS, IDX_PLAIN, IDX_GZ, IDX_GZ_BIG, MNIST_DIR, SPLIT, KINDS };
static const char *const kind_names[KINDS] = {
    "dataset_from_memory (labels)", "dataset_from_memory (targets)", "dataset_load_idx",
    "dataset_load_idx (gzip)", "dataset_load_idx (gzip, 78400 values)", "dataset_load_mnist_dir",
    "dataset_split_tail"};

typedef struct state {
    int kind;
    castor_dataset *ds, *tail;
    /* What the set holds (n samples of nf features), as the files and
     * arrays give it. */
    int n, nf;
    float *x, *targets;
    int32_t *labels;
    char images[SUPPORT_PATH_LEN], labels_path[SUPPORT_PATH_LEN], gz_images[SUPPORT_PATH_LEN],
        gz_labels[SUPPORT_PATH_LEN];
} state;

/* The samples as ubyte IDX files, plain and gzip, in support_dir, named as
 * load_mnist_dir looks for them (images gzip'd, labels plain); the big set
 * only gzip'd. */
static void write_files(state *st)
{
    int big = st->kind == IDX_GZ_BIG, rows = big ? SIDE_BIG : ROWS, cols = big ? SIDE_BIG : COLS;
    st->n = big ? NS_BIG : NS;
    st->nf = rows * cols;
    size_t values = (size_t)st->n * (size_t)st->nf;
    unsigned char *img = malloc(16 + values), *lab = malloc(8 + (size_t)st->n);
    unsigned char *labels = malloc((size_t)st->n);
    st->x = malloc(values * sizeof *st->x);
    st->targets = malloc(2 * (size_t)st->n * sizeof *st->targets);
    st->labels = malloc((size_t)st->n * sizeof *st->labels);
    cr_assert(img && lab && labels && st->x && st->targets && st->labels);
    uint32_t idims[3] = {(uint32_t)st->n, (uint32_t)rows, (uint32_t)cols};
    uint32_t ldims[1] = {(uint32_t)st->n};
    size_t ilen = support_idx_build_ubyte(img, 3, idims, values);
    for (int i = 0; i < st->n; i++)
        labels[i] = (unsigned char)(i % 3);
    size_t llen = support_idx_build(lab, 0x08, 1, ldims, labels, (size_t)st->n);
    if (!big) {
        support_write_in(st->images, "images-idx3-ubyte", img, ilen);
        support_write_in(st->labels_path, "train-labels-idx1-ubyte", lab, llen);
    }
    support_write_gz_in(st->gz_images, big ? "big-images.gz" : "train-images-idx3-ubyte.gz", img,
                        ilen);
    support_write_gz_in(st->gz_labels, big ? "big-labels.gz" : "labels-idx1-ubyte.gz", lab, llen);
    for (size_t i = 0; i < values; i++)
        st->x[i] = (float)(unsigned char)(i * 7) / 255.0f;
    for (int i = 0; i < st->n; i++) {
        st->labels[i] = i % 3;
        st->targets[2 * i] = (float)i;
        st->targets[2 * i + 1] = -(float)i;
    }
    free(img);
    free(lab);
    free(labels);
}

static int from_memory(castor_dataset **out, const state *st, int targets)
{
    return castor_dataset_from_memory(out, st->x, (size_t)st->n, st->nf,
                                      targets ? NULL : st->labels, targets ? st->targets : NULL,
                                      targets ? 2 : 0);
}

static void setup(void *arg)
{
    state *st = arg;
    if (st->kind == SPLIT)
        cr_assert_eq(from_memory(&st->ds, st, 0), CASTOR_OK);
}

static int call(void *arg)
{
    state *st = arg;
    switch (st->kind) {
    case FROM_LABELS:
    case FROM_TARGETS:
        return from_memory(&st->ds, st, st->kind == FROM_TARGETS);
    case IDX_PLAIN:
        return castor_dataset_load_idx(&st->ds, st->images, st->labels_path);
    case IDX_GZ:
    case IDX_GZ_BIG:
        return castor_dataset_load_idx(&st->ds, st->gz_images, st->gz_labels);
    case MNIST_DIR:
        return castor_dataset_load_mnist_dir(&st->ds, support_dir, "train");
    default:
        return castor_dataset_split_tail(st->ds, TAIL, &st->tail);
    }
}

static const char *errmsg(void *arg)
{
    return castor_dataset_errmsg(((state *)arg)->ds);
}

/* ds holds samples [first, first + n) of the set. */
static void assert_holds(const castor_dataset *ds, const state *st, int first, int n,
                         int targets, const char *what)
{
    cr_assert_eq(castor_dataset_size(ds), (size_t)n, "%s: %s has %zu samples, not %d",
                 alloc_where(), what, castor_dataset_size(ds), n);
    cr_assert_eq(castor_dataset_features(ds), st->nf, "%s: %s", alloc_where(), what);
    size_t nf = (size_t)st->nf;
    cr_assert_eq(memcmp(castor_dataset_x(ds), st->x + (size_t)first * nf,
                        (size_t)n * nf * sizeof(float)),
                 0, "%s: %s: the samples differ", alloc_where(), what);
    if (targets)
        cr_assert_null(castor_dataset_labels(ds), "%s: %s", alloc_where(), what);
    else
        cr_assert_eq(memcmp(castor_dataset_labels(ds), st->labels + first,
                            (size_t)n * sizeof(int32_t)), 0,
                     "%s: %s: the labels differ", alloc_where(), what);
}

static void check(void *arg, int rc)
{
    state *st = arg;
    int targets = st->kind == FROM_TARGETS;
    if (rc && st->kind == SPLIT) {
        cr_assert_null(st->tail, "%s: a failed split hands out a tail", alloc_where());
        assert_holds(st->ds, st, 0, st->n, 0, "the set a split failed on");
        rc = castor_dataset_split_tail(st->ds, TAIL, &st->tail);
        cr_assert_eq(rc, CASTOR_OK, "%s: split again: %s", alloc_where(),
                     castor_dataset_errmsg(st->ds));
    } else if (rc) {
        cr_assert_eq(castor_dataset_size(st->ds), 0, "%s: a failed load holds samples",
                     alloc_where());
        castor_dataset_free(st->ds);
        st->ds = NULL;
        rc = call(st);
        cr_assert_eq(rc, CASTOR_OK, "%s: again: %s", alloc_where(), errmsg(st));
    }
    if (st->kind == SPLIT) {
        assert_holds(st->ds, st, 0, st->n - TAIL, 0, "the split set");
        assert_holds(st->tail, st, st->n - TAIL, TAIL, 0, "the tail");
    } else {
        assert_holds(st->ds, st, 0, st->n, targets, "the set");
    }
}

static void teardown(void *arg)
{
    state *st = arg;
    castor_dataset_free(st->ds);
    castor_dataset_free(st->tail);
    st->ds = st->tail = NULL;
}

static void sweep(int kind)
{
    state *st = calloc(1, sizeof *st);
    cr_assert(st);
    st->kind = kind;
    write_files(st);
    alloc_case c = {kind_names[kind], st, setup, call, errmsg, check, teardown};
    alloc_sweep(&c);
    free(st->x);
    free(st->targets);
    free(st->labels);
    free(st);
}

TestSuite(alloc_data, .init = support_dir_init, .fini = support_dir_fini, .timeout = 120);

Test(alloc_data, from_memory)
{
    sweep(FROM_LABELS);
    sweep(FROM_TARGETS);
}

Test(alloc_data, load_idx)
{
    sweep(IDX_PLAIN);
    sweep(IDX_GZ);
    sweep(IDX_GZ_BIG);
    sweep(MNIST_DIR);
}

Test(alloc_data, split_tail)
{
    sweep(SPLIT);
}

/*
 * Data sets made by several application threads at once: the IDX reader
 * (plain and gzip, through zlib) and a missing directory's message, each
 * thread's data set equal, bit for bit, to one loaded alone.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "tsan.h"

enum { N = 50, ROWS = 4, COLS = 5, THREADS = 4 };

/* An IDX file: big-endian magic (type 0x08, ubyte) and dimensions, then
 * the bytes; gzip-compressed when gz. 0 when written. */
static int write_idx(const char *path, int gz, int rank, const uint32_t *dims,
                     const unsigned char *data, size_t len)
{
    unsigned char head[4 + 4 * 3] = {0, 0, 0x08, (unsigned char)rank};
    for (int d = 0; d < rank; d++)
        for (int b = 0; b < 4; b++)
            head[4 + 4 * d + b] = (unsigned char)(dims[d] >> (24 - 8 * b));
    size_t hlen = 4 + 4 * (size_t)rank;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        int ok = f && gzwrite(f, head, (unsigned)hlen) == (int)hlen &&
                 gzwrite(f, data, (unsigned)len) == (int)len;
        return f && gzclose(f) == Z_OK && ok ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(head, 1, hlen, f) == hlen && fwrite(data, 1, len, f) == len;
    return f && fclose(f) == 0 && ok ? 0 : -1;
}

typedef struct loaded {
    const char *dir;
    const char *which;      /* load_mnist_dir's set; NULL: load_idx of the test files */
    castor_dataset *ds;
    char missing[512];      /* the message for a directory that is not there */
} loaded;

static void *load_thread(void *arg)
{
    loaded *l = arg;
    int rc;
    if (l->which) {
        rc = castor_dataset_load_mnist_dir(&l->ds, l->dir, l->which);
    } else {
        char images[4200], labels[4200];
        snprintf(images, sizeof images, "%s/t10k-images-idx3-ubyte.gz", l->dir);
        snprintf(labels, sizeof labels, "%s/t10k-labels-idx1-ubyte", l->dir);
        rc = castor_dataset_load_idx(&l->ds, images, labels);
    }
    CHECK(rc == CASTOR_OK, "data: load %s: %s", l->which ? l->which : "idx",
          castor_dataset_errmsg(l->ds));
    char gone[4300];
    snprintf(gone, sizeof gone, "%s/gone", l->dir);
    castor_dataset *none = NULL;
    rc = castor_dataset_load_mnist_dir(&none, gone, "train");
    snprintf(l->missing, sizeof l->missing, "%d %s", rc, castor_dataset_errmsg(none));
    castor_dataset_free(none);
    return NULL;
}

static int same_data(const castor_dataset *a, const castor_dataset *b)
{
    size_t n = castor_dataset_size(a);
    int f = castor_dataset_features(a);
    return a && b && n == castor_dataset_size(b) && f == castor_dataset_features(b) &&
           tsan_same(castor_dataset_x(a), castor_dataset_x(b), n * (size_t)f) &&
           memcmp(castor_dataset_labels(a), castor_dataset_labels(b), n * sizeof(int32_t)) == 0;
}

void tsan_data_loading(void)
{
    char *dir = tsan_tmpdir();
    unsigned char pixels[N * ROWS * COLS], labels[N];
    for (int i = 0; i < N * ROWS * COLS; i++)
        pixels[i] = (unsigned char)(i * 37 + 11);
    for (int i = 0; i < N; i++)
        labels[i] = (unsigned char)(i % 3);
    const uint32_t idims[3] = {N, ROWS, COLS}, ldims[1] = {N};
    /* train plain, test with gzip images: both of the reader's paths. */
    static const struct {
        const char *images, *labels;
        int gz;
    } files[2] = {{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", 0},
                  {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte", 1}};
    for (int k = 0; k < 2; k++) {
        char ip[4200], lp[4200];
        snprintf(ip, sizeof ip, "%s/%s", dir, files[k].images);
        snprintf(lp, sizeof lp, "%s/%s", dir, files[k].labels);
        if (write_idx(ip, files[k].gz, 3, idims, pixels, sizeof pixels) ||
            write_idx(lp, 0, 1, ldims, labels, sizeof labels)) {
            CHECK(0, "data: cannot write the IDX files in %s", dir);
            goto out;
        }
    }
    loaded alone[3] = {{.dir = dir, .which = "train"}, {.dir = dir, .which = "test"},
                       {.dir = dir, .which = NULL}};
    for (int i = 0; i < 3; i++)
        load_thread(&alone[i]);
    CHECK(same_data(alone[0].ds, alone[1].ds) && same_data(alone[2].ds, alone[1].ds) &&
              castor_dataset_size(alone[0].ds) == N &&
              castor_dataset_features(alone[0].ds) == ROWS * COLS,
          "data: plain and gzip files of the same bytes give other data sets");
    /* The Fashion-MNIST package hint is for a directory named fashion-mnist. */
    const char *tail = "gone: No such file or directory";
    size_t got = strlen(alone[0].missing), want = strlen(tail);
    CHECK(strncmp(alone[0].missing, "5 ", 2) == 0 && got >= want &&
              strcmp(alone[0].missing + got - want, tail) == 0,
          "data: missing directory: '%s'", alone[0].missing);
    loaded par[THREADS * 3];
    for (int i = 0; i < THREADS * 3; i++)
        par[i] = (loaded){.dir = dir, .which = alone[i % 3].which};
    tsan_parallel(THREADS * 3, load_thread, par, sizeof *par);
    for (int i = 0; i < THREADS * 3; i++) {
        CHECK(same_data(par[i].ds, alone[i % 3].ds), "data: thread %d's data set differs from "
              "the one loaded alone", i);
        CHECK(strcmp(par[i].missing, alone[i % 3].missing) == 0, "data: thread %d: '%s'", i,
              par[i].missing);
        castor_dataset_free(par[i].ds);
    }
    for (int i = 0; i < 3; i++)
        castor_dataset_free(alone[i].ds);
out:
    tsan_rmdir(dir);
    free(dir);
}

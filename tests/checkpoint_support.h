/*
 * What the checkpoint suites (tests/test_checkpoint*.c) share: a small
 * synthetic data set and model, snapshots of everything a checkpoint holds,
 * file helpers, a fixture with a good checkpoint to load or spoil, and the
 * edits that spoil it.
 */
#ifndef CASTOR_TEST_CHECKPOINT_SUPPORT_H
#define CASTOR_TEST_CHECKPOINT_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"

#define N 101  /* 7 batches of 16 per epoch, the last one short */
#define F 12
#define C 3
#define LAYERS "16:tanh,8:relu,3"
#define BATCH 16

/* N rows of F features in C classes, each class lifting its own features. */
castor_dataset *ckpt_synthetic(void);
/* kind's defaults; SGD gets a learning rate of 0.05 and Nesterov momentum. */
castor_optimizer ckpt_make_opt(castor_optimizer_kind kind);
castor_strategy *ckpt_make_strategy(castor_strategy_kind kind, const char *devices);
/* F inputs, softmax cross-entropy, compiled on s. */
castor_model *ckpt_make_model(castor_strategy *s, const char *layers, castor_optimizer opt,
                         uint64_t seed);
/* steps shuffled steps of BATCH rows, across epochs as needed. */
void ckpt_train_steps(castor_model *m, const castor_dataset *ds, int64_t steps);

/* Everything a checkpoint holds, read out of a model. */
typedef struct snap {
    float *params, *state;
    size_t n, ns;
    int64_t step, epoch, step_in_epoch;
    int epoch_batch;
    uint64_t seed;
    castor_optimizer opt;
} snap;

snap ckpt_take(castor_model *m);
void ckpt_snap_free(snap *s);
/* a and b the same to the bit; what names the comparison in failures. */
void ckpt_assert_same(const snap *a, const snap *b, const char *what);

/* dir/name, malloc'd. */
char *ckpt_path_in(const char *dir, const char *name);
/* The whole file, malloc'd; its length in *len. */
unsigned char *ckpt_slurp(const char *path, size_t *len);
/* A file image from a header text (padded to 8) and data bytes. */
unsigned char *ckpt_image(const char *header, const void *data, size_t data_len, size_t *len);

typedef struct fixture {
    char *dir, *good, *bad;
    castor_dataset *ds;
    castor_strategy *s;
    castor_model *m;   /* the model a bad file is loaded into */
    snap before;
} fixture;

/* A good checkpoint (3 Adam steps, "16:tanh,8:relu,3"); a model trained
 * differently to load into. */
void ckpt_setup(fixture *fx);
void ckpt_teardown(fixture *fx);

/* A checkpoint split into its header text and data section. */
typedef struct parts {
    char *header;
    unsigned char *data;
    size_t data_len;
} parts;

/* The file at path split (the header's padding left out; ckpt_image() adds
 * it again); ckpt_parts_free it. */
parts ckpt_split_file(const char *path);
void ckpt_parts_free(parts *p);
/* Replace the one occurrence of `from` in the header with `to`. */
void ckpt_edit(parts *p, const char *from, const char *to);
/* Loading `path` fails with `code`, a message naming it and holding
 * `fragment`; the model is as it was; open fails the same way. */
void ckpt_expect_load_fails(fixture *fx, const char *path, int code, const char *fragment);
/* fx->bad: fx->good changed by mutate. */
void ckpt_write_bad(fixture *fx, void (*mutate)(parts *));
/* The good file changed by mutate: load and open both refuse it with code
 * and fragment (ckpt_expect_load_fails), and open's failed handle holds the
 * message and nothing else. */
void ckpt_corrupt_case(void (*mutate)(parts *), int code, const char *fragment);

#endif

/*
 * Checkpoint files as the command line handles them: names in a checkpoint
 * directory, the newest one, pruning old ones, creating the directory, and
 * the __metadata__ of a file (which the library has no getters for: the
 * loss, the optimizer and its hyper-parameters, the seed, the batch size of
 * the epoch in progress).
 *
 * Names: DIR/ckpt-<step as 12 digits>.safetensors, so that the lexical order
 * of the names is the order of the steps (up to 10^12 steps). Pruning
 * touches only names of exactly that form; any other file in DIR is left
 * alone.
 *
 * Writing and validating a file is the library's job (castor_model_save,
 * castor_model_open); cli_ckpt_read_meta is meant for a file the library
 * has just opened, but checks every size itself all the same.
 *
 * Functions that can fail write one line into err (no "castor: " prefix)
 * and return -1.
 */
#ifndef CASTOR_CLI_CKPT_H
#define CASTOR_CLI_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define CLI_PATH_MAX 4096
/* A layer spec as castor writes it: up to 1024 layers (src/model.c) of at
 * most "16777216:sigmoid," each. */
#define CLI_LAYERS_MAX (1024 * 24)

/* DIR/ckpt-<step>.safetensors into buf; -1 if it does not fit. */
int cli_ckpt_path(char *buf, size_t size, const char *dir, int64_t step);

/* The checkpoint with the largest step among DIR's regular files named
 * ckpt-<digits>.safetensors: 1 and its path in buf (its step in *step when
 * step is not NULL), 0 when there is none, -1 when DIR cannot be read. */
int cli_ckpt_newest(const char *dir, char *buf, size_t size, int64_t *step, char *err,
                    size_t errlen);
/* The same among the checkpoints of a step below `before`. */
int cli_ckpt_newest_before(const char *dir, int64_t before, char *buf, size_t size,
                           int64_t *step, char *err, size_t errlen);

/* Hold DIR for this process until it exits: an exclusive flock(2) on the
 * directory itself, so that no file of ours appears in it. Two runs writing
 * into one directory would overwrite each other's checkpoints (the same
 * step, the same name) and prune each other's as their own. Returns 1 with
 * the descriptor to keep open in *fd, 0 when another process holds DIR, -1
 * when DIR cannot be opened (err says why). A filesystem that cannot lock
 * gives 1 and *fd = -1: no worse than without the lock. */
int cli_ckpt_lock(const char *dir, int *fd, char *err, size_t errlen);

/* Delete the temporary files that writes of checkpoints cut short (kill -9,
 * a power cut) left in DIR: ckpt-<12 digits>.safetensors.tmp.<6 letters or
 * digits>, the names the library's atomic writer gives them. Only for a
 * DIR held with cli_ckpt_lock, where no write of ours is in progress.
 * Returns the number deleted, or -1 (err says which could not be). */
int cli_ckpt_remove_stale(const char *dir, char *err, size_t errlen);

/* Delete all but the newest `keep` checkpoints named as cli_ckpt_path names
 * them, never the file `spare` (the one just written). Returns the number
 * deleted, or -1 (err says which could not be). */
int cli_ckpt_prune(const char *dir, int keep, const char *spare, char *err, size_t errlen);

typedef struct cli_ckpt_meta {
    int input_features;
    char layers[CLI_LAYERS_MAX]; /* "128:relu,10:linear" */
    char loss[16];        /* "softmax_xent" or "mse" */
    char optimizer[16];   /* "sgd", "adam", "adamw" */
    double learning_rate, momentum, weight_decay;
    int nesterov;
    uint64_t seed;
    int64_t step, epoch, step_in_epoch;
    int epoch_batch;      /* the batch size of the last epoch trained */
    int64_t epoch_samples; /* the training samples it is over; 0: not in the file */
    int epoch_shuffle;    /* whether that epoch's order is shuffled; -1: not in the file */
    int64_t target_epochs; /* the --epochs of the run that wrote it; 0: not in the file */
    char strategy[32];    /* what wrote it: informational */
    char devices[128];
    int replicas;
    int blas_threads;     /* OpenBLAS's threads for CPU replicas; 0: none, or not in the file */
    /* The IDX element type code and sample shape of the data it was trained
     * on (input_type, input_shape); 0 and 0 where the file does not say. */
    int input_type, input_rank;
    uint32_t input_dims[3];
} cli_ckpt_meta;

int cli_ckpt_read_meta(const char *path, cli_ckpt_meta *out, char *err, size_t errlen);

/* A checkpoint in DIR (named as cli_ckpt_path names them, which pruning
 * deletes) that is not from the run `mine` describes: 1 and its path in
 * found when it is from another run (another seed, model, loss or
 * optimizer: err says which), 2 when its metadata cannot be read (err says
 * why), 0 when every one is the run's, -1 when DIR cannot be read. */
int cli_ckpt_find_foreign(const char *dir, const cli_ckpt_meta *mine, char *found, size_t size,
                          char *err, size_t errlen);

#endif

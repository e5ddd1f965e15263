/*
 * Pieces shared by the commands that run a model (train, eval, predict):
 * where the data lives, OpenBLAS's thread count, the library's log messages
 * and one-hot targets for MSE models. Errors are printed here (one line,
 * cli_errorf); the functions return an exit status, 0 to go on.
 */
#ifndef CASTOR_CLI_COMMON_H
#define CASTOR_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"

#define CLI_DEFAULT_FASHION_MNIST "/usr/share/datasets/fashion-mnist"

/* The --device-memory flag's row (a cli_flag), the same for every command. */
#define CLI_ROW_DEVICE_MEMORY                                                            \
    {"device-memory", "BYTES", "0: 1G per emulated CPU device, a GPU's free memory",     \
     "the device memory of each emulated CPU device, shared by the K\n"                  \
     "replicas of cpu:NxK, and of each GPU replica (the K replicas of\n"                 \
     "cuda:IxK share the GPU's free memory: a budget above a share is\n"                 \
     "held to it), with an optional K, M, G or T suffix (powers of\n"                    \
     "1024): 512M, 2G. Each replica holds the variables and a batch's\n"                 \
     "activations; to train, also the gradients, the backward pass's\n"                  \
     "share of the activations (about as much again) and, mirrored,\n"                   \
     "the optimizer state, which eval and predict need no room for"}

/* The directory for --data: "fashion-mnist" is $CASTOR_FASHION_MNIST, or
 * else CLI_DEFAULT_FASHION_MNIST; anything else is a directory. */
const char *cli_data_dir(const char *data);

/*
 * When --devices names emulated CPU devices and the environment gives
 * OpenBLAS no thread count (OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or
 * OMP_NUM_THREADS, a positive number), give it cores / (CPU replicas)
 * threads (at least one). Returns the count set, or 0 where it left
 * OpenBLAS alone.
 */
int cli_blas_threads(const char *devices);
/* OpenBLAS's thread count as --devices would use it: 0 where it names no
 * emulated CPU device (no GEMM of the run is OpenBLAS's). */
int cli_blas_threads_in_use(const char *devices);

/* The message, or the status's text where the handle has none. */
const char *cli_why(const char *msg, int rc);

/* The library's message about a file, less its leading "PATH: " (callers
 * print the path with the flag that named it). */
const char *cli_about_file(const char *msg, const char *path);

/* Flags with a bad value and files that do not fit give usage errors (2);
 * other failures runtime errors (1). */
int cli_exit_for(int rc);

/* A castor_log_fn for the commands without a progress display: warnings
 * and info on stderr; errors are left to the caller, which prints the
 * returned status's message once. user is unused. */
void cli_log_stderr(void *user, castor_log_level level, const char *message);

/* Every label of ds (if it has labels) in [0, units): 0, or CLI_EXIT_USAGE
 * after saying "WHAT: the WHICH set in WHERE has class C (sample I, classes
 * up to M) but the last layer has U units (WHY)"; where (the data
 * directory) may be NULL. */
int cli_check_labels(const castor_dataset *ds, int units, const char *which, const char *where,
                     const char *what, const char *why);
/* How a data set's IDX images were read: the element type code (0x08
 * unsigned bytes, scaled to [0,1]; the others taken as they are; 0:
 * unknown) and each sample's shape (rank 0: unknown). */
typedef struct cli_data_kind {
    int type;
    int rank;
    uint32_t dims[3];
} cli_data_kind;

cli_data_kind cli_data_kind_of(const castor_dataset *ds);
/* "28x28" into buf. */
void cli_shape_text(const cli_data_kind *k, char *buf, size_t size);

/* The WHICH ("test") set (ds, in dir) was read as `ref` was: 0, or
 * CLI_EXIT_USAGE after saying "the test set in DIR has samples of 16x49 where REF 28x28
 * ..." (of two shapes of more than one dimension each, for the same
 * features: a flat vector has no shape to differ) or that one set's pixels
 * are scaled to [0,1] and the other's taken as they are. ref_has ends the
 * sentence's subject: "the training set has", "--model M was trained on".
 * What either side does not know is not compared. */
int cli_check_data_kind(const castor_dataset *ds, const char *which, const char *dir,
                        const cli_data_kind *ref, const char *ref_has);

/* An MSE model regresses on one-hot targets, a unit per class: replace the
 * labels of *ds (when it has labels) by them, in place, after
 * cli_check_labels. what names the setting in the messages ("--loss mse",
 * "--model m.safetensors"). */
int cli_one_hot_targets(castor_dataset **ds, int units, const char *which, const char *where,
                        const char *what);

/*
 * mkdir -p: create dir and its missing parents (mode 0777 less the umask);
 * 0 if it is, or now is, a directory, else -1 and err says why. made (may
 * be NULL; made_len bytes) receives the topmost directory this call
 * created, "" when it created none, for cli_rmdir_made.
 */
int cli_mkdir_p(const char *dir, char *made, size_t made_len, char *err, size_t errlen);

/* Take back what cli_mkdir_p(dir) made: remove dir and its parents up to
 * and including made, each only if it is still empty (a run that failed
 * leaves no empty directory behind, and never removes anything else). */
void cli_rmdir_made(const char *dir, const char *made);

/* The end of a text report: flush stdout, so that a full disk or a closed
 * pipe is an error (CLI_EXIT_RUNTIME, printed with "CMD: " when cmd is not
 * NULL) and not a silent loss; 0 when it is all written. */
int cli_flush_results(const char *cmd);

#endif

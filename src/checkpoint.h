/*
 * A checkpoint's __metadata__ (the keys and their meaning: src/checkpoint.c),
 * read and checked on its own before the file is held against a model.
 */
#ifndef CASTOR_CHECKPOINT_H
#define CASTOR_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"
#include "safetensors.h"

#define CASTOR__CKPT_FORMAT "castor-checkpoint-1"

typedef struct castor__ckpt_info {
    int input_features;
    const char *layers;        /* points into the parsed file */
    castor_loss loss;
    castor_optimizer opt;
    uint64_t seed;
    int64_t step, epoch, step_in_epoch;
    int64_t optimizer_step;  /* step when the file does not give it */
    int epoch_batch;
    uint64_t epoch_samples;  /* 0: not in the file */
    int epoch_shuffle;       /* -1: not in the file */
    int64_t target_epochs;   /* 0: not in the file */
    int input_type;          /* IDX type code of input_type; 0: not in the file */
    int input_rank;          /* dimensions of input_shape; 0: not in the file */
    uint32_t input_dims[3];
    uint32_t crc;
} castor__ckpt_info;

/* Parse and check f's metadata into *info: CASTOR_FORMAT, said in err with
 * path, when a key is missing or its value is not what it must be. */
int castor__ckpt_read_info(const castor__st_file *f, const char *path, castor__ckpt_info *info,
                           char *err, size_t errlen);

/* The metadata's name of an IDX element type code ("ubyte", "sbyte",
 * "int16", "int32", "float32", "float64"; NULL for another code), and the
 * code of a name (0 for another name). */
const char *castor__ckpt_idx_type_name(int type);
int castor__ckpt_idx_type_parse(const char *name);

/* "softmax_xent" or "mse": the metadata's name of a loss. */
const char *castor__ckpt_loss_name(castor_loss loss);

#endif

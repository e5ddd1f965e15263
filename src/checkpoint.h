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
    uint32_t crc;
} castor__ckpt_info;

/* Parse and check f's metadata into *info: CASTOR_FORMAT, said in err with
 * path, when a key is missing or its value is not what it must be. */
int castor__ckpt_read_info(const castor__st_file *f, const char *path, castor__ckpt_info *info,
                           char *err, size_t errlen);

/* "softmax_xent" or "mse": the metadata's name of a loss. */
const char *castor__ckpt_loss_name(castor_loss loss);

#endif

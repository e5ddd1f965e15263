/*
 * libFuzzer harness: checkpoint loading (src/checkpoint.c) above the
 * safetensors parser: the metadata, the architecture and optimizer checks,
 * the tensor-by-tensor match against a compiled model, and castor_model_open
 * building a model from whatever architecture the file names.
 *
 * Invariants: a failed load leaves the model's variables as they were and
 * says why in one line; a successful one leaves every variable finite.
 * The model is made once and reused, as a long-running program would.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "castor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { FEATURES = 12 };

static castor_strategy *strategy;
static castor_model *model;
static size_t n_params;
static float *before, *after;

static void setup_once(void)
{
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = (size_t)64 << 20;  /* open() of a large claim fails here */
    castor_optimizer adam = castor_optimizer_defaults(CASTOR_OPT_ADAM);
    if (castor_strategy_create(&strategy, CASTOR_STRATEGY_CENTRAL, "cpu", &so) ||
        castor_model_create(&model, FEATURES) ||
        castor_model_add_layers(model, "16:tanh,8:relu,3") ||
        castor_model_compile(model, strategy, CASTOR_LOSS_SOFTMAX_XENT, &adam, 42))
        abort();
    n_params = castor_model_num_params(model);
    before = malloc(n_params * sizeof *before);
    after = malloc(n_params * sizeof *after);
    if (!before || !after)
        abort();
}

static void one_line(const char *msg)
{
    if (!msg || !msg[0] || strchr(msg, '\n'))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!model)
        setup_once();
    int fd = memfd_create("checkpoint", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    if (castor_model_get_params(model, before, n_params))
        abort();
    int rc = castor_model_load(model, path);
    if (castor_model_get_params(model, after, n_params))
        abort();
    if (rc) {
        one_line(castor_model_errmsg(model));
        if (memcmp(before, after, n_params * sizeof *after) != 0)
            abort();  /* a failed load changed the model */
    } else {
        for (size_t i = 0; i < n_params; i++)
            if (!isfinite(after[i]))
                abort();
    }

    /* open() on a strategy of its own: the architecture comes from the file. */
    castor_strategy *s = NULL;
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.device_memory_budget = (size_t)64 << 20;
    if (castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu", &so))
        abort();
    castor_model *m = NULL;
    if (castor_model_open(&m, path, s))
        one_line(castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    close(fd);
    return 0;
}

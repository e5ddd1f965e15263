/*
 * The threaded paths, for ThreadSanitizer (Criterion's runner cannot start
 * under TSan, so this is a plain program): central and mirrored training on
 * several emulated devices, and two application threads each driving their
 * own handles at once. Prints "N passed, M failed".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "castor.h"

static int failures, passes;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (cond) {                                                                          \
            passes++;                                                                        \
        } else {                                                                             \
            failures++;                                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                             \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
        }                                                                                    \
    } while (0)

static castor_dataset *make_data(unsigned seed)
{
    enum { N = 200, F = 10 };
    float *x = malloc(sizeof(float) * N * F);
    int32_t *y = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) {
        seed = seed * 1103515245u + 12345u;
        y[i] = (int32_t)((seed >> 16) % 3);
        for (int j = 0; j < F; j++) {
            seed = seed * 1103515245u + 12345u;
            x[i * F + j] = (float)((seed >> 16) & 0xff) / 255.0f + (j % 3 == y[i] ? 0.5f : 0.0f);
        }
    }
    castor_dataset *ds = NULL;
    castor_dataset_from_memory(&ds, x, N, F, y, NULL, 0);
    free(x);
    free(y);
    return ds;
}

/* Train briefly on ds; returns the final loss or -1 on failure. */
static double train_on(castor_strategy_kind kind, const char *devices, unsigned seed,
                       const castor_dataset *ds)
{
    castor_strategy *s = NULL;
    castor_model *m = NULL;
    double result = -1;
    castor_metrics met;
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 2;
    fo.batch_size = 30;
    castor_strategy_options so = CASTOR_STRATEGY_OPTIONS_INIT;
    so.host_threads = 2;
    if (castor_strategy_create(&s, kind, devices, &so) || castor_model_create(&m, 10) ||
        castor_model_add_layers(m, "16:relu,3") ||
        castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, seed) ||
        castor_model_fit(m, ds, &fo, NULL) || castor_model_evaluate(m, ds, 64, &met)) {
        fprintf(stderr, "train: %s / %s\n", castor_strategy_errmsg(s), castor_model_errmsg(m));
    } else {
        result = met.loss;
    }
    castor_model_free(m);
    castor_strategy_free(s);
    return result;
}

static double train(castor_strategy_kind kind, const char *devices, unsigned seed)
{
    castor_dataset *ds = make_data(seed);
    double result = train_on(kind, devices, seed, ds);
    castor_dataset_free(ds);
    return result;
}

static void *app_thread(void *arg)
{
    double *loss = arg;
    *loss = train(CASTOR_STRATEGY_MIRRORED, "cpu:2", 11);
    return NULL;
}

typedef struct shared_job {
    const castor_dataset *ds;
    double loss;
} shared_job;

/* Separate models and strategies, one dataset: fit only reads it. */
static void *shared_data_thread(void *arg)
{
    shared_job *job = arg;
    job->loss = train_on(CASTOR_STRATEGY_MIRRORED, "cpu:2", 11, job->ds);
    return NULL;
}

int main(void)
{
    double central = train(CASTOR_STRATEGY_CENTRAL, "cpu:3", 7);
    CHECK(central > 0, "central on cpu:3 trains");
    double mirrored = train(CASTOR_STRATEGY_MIRRORED, "cpu:3", 7);
    CHECK(mirrored > 0, "mirrored on cpu:3 trains");
    CHECK(central == mirrored, "central %.9g == mirrored %.9g", central, mirrored);
    /* Replicas sharing one emulated device: mirrored sums on it, replica 0
     * reading the others' buffers once they have synchronized. */
    double shared = train(CASTOR_STRATEGY_MIRRORED, "cpu:1x3", 7);
    CHECK(shared == central, "mirrored on cpu:1x3 %.9g == central on cpu:3 %.9g", shared, central);

    pthread_t t[2];
    double loss[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, app_thread, &loss[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    CHECK(loss[0] > 0 && loss[0] == loss[1], "two threads on separate handles: %.9g %.9g",
          loss[0], loss[1]);

    castor_dataset *ds = make_data(11);
    shared_job jobs[2] = {{ds, 0}, {ds, 0}};
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, shared_data_thread, &jobs[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    castor_dataset_free(ds);
    CHECK(jobs[0].loss == loss[0] && jobs[1].loss == loss[0],
          "two threads fitting on one dataset: %.9g %.9g (alone %.9g)", jobs[0].loss,
          jobs[1].loss, loss[0]);
    printf("%d passed, %d failed\n", passes, failures);
    return failures != 0;
}

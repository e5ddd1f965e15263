/*
 * The TSan program's shared pieces (Criterion's runner cannot start under
 * ThreadSanitizer, so tests/tsan/ is a plain program, one file per idea,
 * each giving main.c one function). Every check compares with a run made
 * alone, single-threaded where the library promises the same bits, so that
 * a wrong answer fails as surely as a race TSan reports.
 */
#ifndef CASTOR_TESTS_TSAN_H
#define CASTOR_TESTS_TSAN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "castor.h"

/* Counted atomically: checks run on several application threads at once. */
extern atomic_int tsan_passes, tsan_failures;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (cond) {                                                                          \
            atomic_fetch_add(&tsan_passes, 1);                                               \
        } else {                                                                             \
            atomic_fetch_add(&tsan_failures, 1);                                             \
            tsan_report(__FILE__, __LINE__, __VA_ARGS__);                                    \
        }                                                                                    \
    } while (0)

void tsan_report(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Features and classes of every data set here. */
#define TSAN_F 10
#define TSAN_C 3
/* Small enough to be quick under TSan; the big one has more variables than
 * the host's update and reduction hand to their threads (host/update.c,
 * host/reduce.c: 2^15), so that the host pool does work. */
#define TSAN_SMALL "16:relu,3"
#define TSAN_BIG "256:relu,128:relu,3"

/* n samples of TSAN_F features in TSAN_C classes; the same for a seed. */
castor_dataset *tsan_data(unsigned seed, int n);

typedef struct tsan_setup {
    castor_strategy_kind kind;
    const char *devices;
    const char *layers;
    int host_threads;
    unsigned seed;
} tsan_setup;

/* A compiled model (softmax cross-entropy, Adam) on a new strategy; NULL
 * with the reason reported when either fails. so may be NULL. */
castor_model *tsan_model(const tsan_setup *setup, const castor_strategy_options *so,
                         castor_strategy **s);
/* The model's variables (malloc'd), or NULL with the reason reported. */
float *tsan_params(castor_model *m);
/* Whether a and b hold the same n floats, bit for bit. */
int tsan_same(const float *a, const float *b, size_t n);
/* fit for max_steps steps (0: all of epochs) in batches of batch. */
int tsan_fit(castor_model *m, const castor_dataset *ds, int epochs, int batch, int max_steps);

/* Run fn(arg + i * stride) on n new threads at once and join them. */
void tsan_parallel(int n, void *(*fn)(void *), void *args, size_t stride);

/* A fresh directory under TMPDIR (malloc'd), and its removal with what is
 * in it (files only). */
char *tsan_tmpdir(void);
void tsan_rmdir(const char *dir);
/* Entries in dir other than . and .. */
int tsan_dir_entries(const char *dir);

/* The groups of checks, one per file. */
void tsan_data_loading(void);
void tsan_train(void);
void tsan_faults(void);
void tsan_callbacks(void);
void tsan_checkpoints(void);
void tsan_lifetimes(void);

#endif

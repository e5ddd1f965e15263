/*
 * The fuzz_api harness (tests/fuzz/fuzz_api.c says what it checks), split by
 * what each file holds; this header is theirs alone. One libFuzzer input runs
 * at a time, so the account lives in globals.
 */
#ifndef CASTOR_FUZZ_API_HARNESS_H
#define CASTOR_FUZZ_API_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "castor.h"

#define FAIL(...)                                                                      \
    do {                                                                               \
        fprintf(stderr, "fuzz_api: invariant broken at %s:%d: ", __FILE__, __LINE__);  \
        fprintf(stderr, __VA_ARGS__);                                                  \
        fprintf(stderr, "\n");                                                         \
        abort();                                                                       \
    } while (0)
#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "fuzz_api: invariant broken at %s:%d: %s: ", __FILE__,      \
                    __LINE__, #cond);                                                  \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

#define B(code) (1u << (code))
#define NS 2        /* strategy slots */
#define NM 3        /* model slots */
#define ND 3        /* dataset slots */
#define NF 2        /* checkpoint files */
#define MAX_L 8     /* layers the harness gives a model */
#define MAX_LF 32   /* layers a damaged checkpoint's may have */
#define MAX_N 9     /* samples a dataset may have */
#define MAX_F 8     /* features */
#define MAX_U 16    /* units a layer */
#define MAX_OPS 64
#define MAX_DEPTH 2 /* callbacks inside callbacks */
#define SMALL_BUDGET ((size_t)1 << 20)

#define PICKF(table) ((table)[pick((int)(sizeof(table) / sizeof *(table)))])

/* ---- the harness's account of the handles ------------------------------ */

/* The epoch a model has left part-way, as far as the harness knows it: what
 * a fit that goes on with it must give again (castor.h), and what a save
 * carries to a load. */
typedef struct epoch_state {
    int known;      /* 0: a load or open of a file of unknown making */
    int batch, shuffle;
    size_t samples; /* 0: not yet one */
} epoch_state;

typedef struct hstrat {
    castor_strategy *h;
    int ok;          /* created */
    int replicas, kind;
    size_t budget;   /* as given: 0 for the default */
    int log_level;   /* the log callback checks its levels against it */
    int bound;       /* model slot compiled on it, or -1 */
} hstrat;

typedef struct hmodel {
    castor_model *h;
    int created;      /* castor_model_create succeeded */
    int open_failed;  /* handed out by a failed open: errmsg and free only */
    int features;
    int nl, units[MAX_LF], acts[MAX_LF];
    size_t n_params;
    int compiled, strat;
    int loss, kind, slots;
    int sane;         /* finite data keeps it finite (see sane_opt) */
    /* What a load placed that is not finite, which fit refuses (castor.h):
     * in the variables (until set_params or a load), in the optimizer state
     * (until a load). 0, 1, or -1: unknown. Training that diverges sets
     * neither: such a model trains on. */
    int nf_params, nf_state;
    int64_t stats_steps;
    size_t last_peak;  /* device_peak_bytes last seen since compile or reset */
    epoch_state ep;   /* the epoch in progress */
    int zombie;       /* freed from a callback of its running call */
    int unknown;      /* opened from a damaged file: loss and optimizer unknown */
    int stop_check;   /* the harness's stop check is set */
} hmodel;

typedef struct hdata {
    castor_dataset *h;
    int ok;
    size_t n;
    int features, labels, num_classes, tdim;
    int32_t label[MAX_N];            /* what it was given, for evaluate's check */
    float target[MAX_N * MAX_U];
} hdata;

typedef struct hfile {
    int saved;        /* castor wrote it and it has not been changed since */
    unsigned char *bytes;  /* as castor wrote it */
    size_t len, header_end;
    int features, loss, kind, slots, sane, all_finite;
    char spec[MAX_LF * 24 + 1];
    int unknown;      /* saved by a model of unknown loss or optimizer */
    float *params;
    size_t n_params;
    float lr;
    int64_t step, epoch, step_in_epoch;
    epoch_state ep;
} hfile;

/* A call of fit, evaluate or predict that is running (its callbacks are). */
typedef struct run_ctx {
    int model;
    int train, val;  /* dataset slots it reads, or -1 */
    int is_fit;
    int progress_calls, stop_calls;
    int stopped;     /* a callback or stop check said stop */
    int stopped_by_check;
    int freed;       /* the model or its strategy was freed meanwhile */
    int64_t step0;
    int64_t spe;
    int64_t epoch0;  /* the model's epochs when fit started */
    int ends;        /* epoch ends its progress callback has seen */
    int epochs;
    int xent, has_val;
} run_ctx;

/* The model's training position. */
typedef struct position {
    int64_t step, epoch, sie;
    float lr;
} position;

/* input.c: the input, read a byte at a time (0 past its end) */
void input_start(const uint8_t *data, size_t size);
int input_left(void);
unsigned u8(void);
int pick(int n);
uint64_t u64(void);
float unit(void);

/* account.c: the harness's account of the handles, and the checks on it */
extern hstrat strats[NS];
extern hmodel models[NM];
extern hdata datas[ND];
extern run_ctx *runs[8];
extern int n_runs;
extern int cb_depth;
extern const int slot_ids[NM];
extern int trace;
int model_busy(int m);
void runs_freed(int m);
int strat_busy(int s);
int data_busy(int d);
int errmsg_ok(const char *msg);
void expect(int rc, unsigned want, const char *what, const char *msg);
const char *mmsg(const hmodel *M);
int small_budget(int s);
int out_units(const hmodel *M);
void sync_layers(hmodel *M);
float *get_params(hmodel *M);
void check_params_unchanged(hmodel *M, const float *before, size_t count, const char *what);
int opt_valid(const castor_optimizer *o);
int lr_sane(float lr);
int opt_sane(const castor_optimizer *o);
void model_detached(hmodel *M);
position position_of(const hmodel *M);
void check_stats(hmodel *M);
void check_finite(hmodel *M, const char *after);

/* callbacks.c: fit's progress callback, the stop check, the log callback, and the
 * stack of running calls */
void log_fn(void *user, castor_log_level level, const char *message);
int progress_fn(void *user, const castor_progress *p);
int stop_fn(void *user);
unsigned run_allowed(const hmodel *M, const run_ctx *rc, unsigned want);
void run_push(run_ctx *rc);
void run_pop(run_ctx *rc, int status);

/* handles.c: strategies, models and datasets made and freed */
void strat_free(int s);
void op_strategy_create(void);
void op_strategy_free(void);
void model_free(int m);
hmodel *fresh_model(int m);
void op_model_create(void);
hmodel *some_model(int *slot);
hmodel *some_model_to_call(int *slot);
int some_strategy(void);
void op_add_dense(void);
void op_add_layers(void);
void op_compile(void);
void op_model_free(void);
void data_free(int d);
void op_dataset_create(void);
void op_dataset_split(void);
void op_dataset_free(void);
float pick_learning_rate(void);

/* training.c: fit, evaluate and predict */
void op_fit(void);
void op_evaluate(void);
void op_predict(void);

/* variables.c: a model's variables, learning rate, run statistics, stop check
 * and layers */
void op_params(void);
void op_learning_rate(void);
void op_stats(void);
void op_stop_check(void);
void op_layers_spec(void);

/* checkpoints.c: save, load and open, the files and their directory */
extern hfile files[NF];
extern char dir[64], paths[NF][96];
extern char subdir[96], link_path[96];
void file_forget(int f);
void op_save(void);
void op_damage(void);
void op_load(void);
void op_open(void);
void make_dir(void);
void remove_dir(void);
void check_dir(void);

/* resume.c: training resumed from a checkpoint, against training straight through */
void op_resume(void);

/* fuzz_api.c: the calls an input picks */
void do_op(void);

#endif

/*
 * castor: neural-network training with central storage.
 *
 * One master copy of every variable lives in host memory (pinned, where the
 * devices are GPUs) and is updated on the CPU; one thread per device
 * replica uploads the weights,
 * computes gradients and hands them back. A mirrored strategy (a copy of the
 * variables per device, gradients all-reduced, update on the device) runs
 * beside it for comparison.
 *
 * This header is the whole public API: what is not declared here is not API.
 * Conventions (after SQLite and libuv):
 *   - every object is an opaque handle; constructors return a castor_status
 *     and hand the object out through an out-parameter, also on failure
 *     where one could be made, so that the caller can ask *_errmsg() why;
 *   - destroying NULL is a no-op;
 *   - each handle keeps the text of its last error (a call that succeeds
 *     leaves it as it was: read it right after a failure); castor_errstr()
 *     gives a static text for any status code. A function that takes its
 *     handle const (castor_model_layers_spec, castor_model_run_stats)
 *     writes no message: its status code is the whole answer;
 *   - a NULL handle, a NULL for another pointer that the function does not
 *     say may be NULL (an out-parameter, data, a file name, a device list, a
 *     layer spec), an empty file or directory name, or a call in the wrong
 *     order, is CASTOR_MISUSE (but see the *_parse functions); a bad value,
 *     an empty device list or layer spec among them (or a model compiled
 *     with no layers), is CASTOR_INVALID;
 *   - names (strategies, activations, optimizers, losses in the CLI) are
 *     matched without regard to case (ASCII); the *_parse functions return
 *     CASTOR_INVALID for an unknown or NULL name and for a NULL out, and
 *     leave *out alone; the *_name functions give "unknown" for a value out
 *     of range;
 *   - the library never prints and never exits: logging goes to the
 *     callback given in castor_strategy_options;
 *   - separate handles may be used from separate threads at once; one handle
 *     must not be used from two threads at once, except a dataset, which fit
 *     and evaluate only read: several models may read one at once. A model
 *     compiled on a strategy and that strategy count as one handle here
 *     (freeing the strategy detaches the model; freeing or compiling the
 *     model changes the strategy's hold on its devices): use them from one
 *     thread at a time. A strategy's worker threads do not survive fork():
 *     a child process creates its own strategies (a call on one made before
 *     the fork waits for ever for the parent's threads). One
 *     exception outside castor: it reads checkpoint headers with cJSON, whose
 *     error pointer (cJSON_GetErrorPtr) is one for the whole process and is
 *     written by every parse, castor's too; an application that reads it must
 *     not load checkpoints on another thread meanwhile (castor itself never
 *     reads it, and its own parses take turns);
 *   - with CUDA devices, a castor call may leave its thread's current CUDA
 *     device (cudaSetDevice) at one of the strategy's GPUs: an application
 *     that uses CUDA itself on that thread sets its device again after it.
 */
#ifndef CASTOR_H
#define CASTOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CASTOR_BUILDING) && defined(__GNUC__)
#define CASTOR_API __attribute__((visibility("default")))
#else
#define CASTOR_API
#endif

#define CASTOR_VERSION_MAJOR 0
#define CASTOR_VERSION_MINOR 1
#define CASTOR_VERSION_PATCH 0
#define CASTOR_VERSION_STRING "0.1.0"
#define CASTOR_VERSION_NUMBER                                                   \
    (CASTOR_VERSION_MAJOR * 10000 + CASTOR_VERSION_MINOR * 100 + CASTOR_VERSION_PATCH)

/* The version this library was built as; compare with CASTOR_VERSION_NUMBER. */
CASTOR_API int castor_version_number(void);
CASTOR_API const char *castor_version(void);

/* ---- status codes ---------------------------------------------------- */
typedef enum castor_status {
    CASTOR_OK = 0,
    CASTOR_ERROR = 1,          /* generic failure; see the handle's errmsg */
    CASTOR_NOMEM = 2,          /* host memory exhausted */
    CASTOR_MISUSE = 3,         /* API called wrongly (NULL handle, wrong order) */
    CASTOR_INVALID = 4,        /* a bad argument or option value */
    CASTOR_IO = 5,             /* a file could not be read or written */
    CASTOR_FORMAT = 6,         /* a file is malformed, truncated or corrupt */
    CASTOR_DEVICE = 7,         /* a device (CUDA, cuBLAS, NCCL) call failed */
    CASTOR_DEVICE_MEMORY = 8,  /* the device memory budget is exceeded */
    CASTOR_UNSUPPORTED = 9,    /* not available in this build or on this machine */
    CASTOR_INTERRUPTED = 10,   /* stopped on request (progress callback, stop check) */
    CASTOR_MISMATCH = 11,      /* data or a file does not match the model */
    CASTOR_NOT_DURABLE = 12    /* a file was written and is in place, but syncing its
                                  directory failed: it may not survive a crash */
} castor_status;

/* A static English text for a status code; never NULL. */
CASTOR_API const char *castor_errstr(int status);

/* ---- logging ----------------------------------------------------------- */
typedef enum castor_log_level {
    CASTOR_LOG_ERROR = 0,
    CASTOR_LOG_WARN = 1,
    CASTOR_LOG_INFO = 2,
    CASTOR_LOG_DEBUG = 3
} castor_log_level;

/* Called on the thread of the castor call that logs, with a message that
 * lasts until it returns. It must not call back into castor on the handles
 * involved in that call (free the strategy or model that is logging, say). */
typedef void (*castor_log_fn)(void *user, castor_log_level level, const char *message);

/* ---- strategy: where the variables live and which devices compute ------ */
typedef enum castor_strategy_kind {
    CASTOR_STRATEGY_CENTRAL = 0,  /* variables and optimizer on the host */
    CASTOR_STRATEGY_MIRRORED = 1  /* a copy per device, all-reduced gradients */
} castor_strategy_kind;

typedef struct castor_strategy_options {
    /* Device memory each emulated CPU device may use, in bytes; 0 means the
     * default (1 GiB). CUDA devices are limited by their own memory, or by
     * this value if it is non-zero and smaller. */
    size_t device_memory_budget;
    /* Host threads for the reduction and the optimizer, at most 1024; 0 = one
     * per core the process may use (fewer than are online under taskset, a
     * cpuset or a cgroup CPU quota such as docker --cpus). */
    int host_threads;
    /* Allow TF32 tensor-core math on CUDA devices (off: plain fp32); with
     * no CUDA device among the replicas a warning is logged. */
    int tf32;
    /* Messages at or below this level go to log_fn; WARN in
     * CASTOR_STRATEGY_OPTIONS_INIT (a zeroed struct says ERROR). One of the
     * four levels (else CASTOR_INVALID): for silence, a NULL log_fn. */
    castor_log_level log_level;
    castor_log_fn log_fn;  /* NULL: the library stays silent */
    void *log_user;
} castor_strategy_options;

#define CASTOR_STRATEGY_OPTIONS_INIT {0, 0, 0, CASTOR_LOG_WARN, NULL, NULL}

typedef struct castor_strategy castor_strategy;

/*
 * devices: a comma-separated list.
 *   "cpu"        one emulated CPU device
 *   "cpu:N"      N emulated CPU devices (N replicas)
 *   "cpu:NxK"    N emulated CPU devices, each shared by K replicas: the
 *                emulated twin of cuda:IxK, whose mirrored all-reduce runs
 *                on the device. The device's budget (device_memory_budget,
 *                or 1 GiB) is split between its K replicas, as a GPU's
 *                free memory is when no budget is given; a budget given for
 *                cuda:IxK is each replica's own, held to its even share of
 *                the GPU's free memory.
 *   "cuda"       every GPU
 *   "cuda:0,cuda:1"  the GPUs listed
 *   "cuda:0x4"   four logical replicas sharing GPU 0
 * Names in either ASCII case; an empty entry (",cpu", "cpu,") is an error,
 * as is a GPU named twice or more than 64 replicas in all.
 * options may be NULL for the defaults.
 */
CASTOR_API int castor_strategy_create(castor_strategy **out, castor_strategy_kind kind,
                                      const char *devices,
                                      const castor_strategy_options *options);
CASTOR_API void castor_strategy_free(castor_strategy *strategy);
CASTOR_API const char *castor_strategy_errmsg(const castor_strategy *strategy);
CASTOR_API int castor_strategy_replicas(const castor_strategy *strategy);
CASTOR_API castor_strategy_kind castor_strategy_get_kind(const castor_strategy *strategy);
/* "central" / "mirrored" */
CASTOR_API const char *castor_strategy_kind_name(castor_strategy_kind kind);
CASTOR_API int castor_strategy_kind_parse(const char *name, castor_strategy_kind *out);

/* ---- devices this build can see (castor info) ------------------------- */
typedef struct castor_device_info {
    char name[128];             /* "cpu" or the GPU's name */
    char kind[8];               /* "cpu" or "cuda" */
    int ordinal;
    size_t total_memory;        /* bytes */
    int compute_major, compute_minor;
    char pci_bus_id[32];
} castor_device_info;

/* Features compiled into this build, a static text: "openblas zlib cjson cuda
 * cublas nccl", or "openblas zlib cjson (no cuda)" without the CUDA backend. */
CASTOR_API const char *castor_build_features(void);
/* Number of CUDA GPUs present (0 with no driver, no GPU or no CUDA build).
 * If why is not NULL it receives a static text saying why there are none. */
CASTOR_API int castor_cuda_device_count(const char **why);
CASTOR_API int castor_cuda_device_info(int ordinal, castor_device_info *info);

/* ---- model --------------------------------------------------------------- */
typedef enum castor_activation {
    CASTOR_ACT_LINEAR = 0,
    CASTOR_ACT_RELU = 1,
    CASTOR_ACT_TANH = 2,
    CASTOR_ACT_SIGMOID = 3
} castor_activation;

typedef enum castor_loss {
    /* Softmax cross-entropy on integer class labels, from logits: the last
     * layer must be linear. */
    CASTOR_LOSS_SOFTMAX_XENT = 0,
    /* Mean squared error against float targets, averaged over outputs. */
    CASTOR_LOSS_MSE = 1
} castor_loss;

typedef enum castor_optimizer_kind {
    CASTOR_OPT_SGD = 0,
    CASTOR_OPT_ADAM = 1,
    CASTOR_OPT_ADAMW = 2
} castor_optimizer_kind;

/* Hyper-parameters; the defaults (castor_optimizer_defaults) are Keras's,
 * and so are the update rules (Adam adds epsilon to sqrt(v) before the bias
 * correction, as Keras does, not to sqrt(v_hat) as PyTorch does). compile
 * refuses (CASTOR_INVALID) a learning_rate that is not finite and > 0 (so
 * 0 too), a momentum outside [0, 1), beta1 or beta2 outside [0, 1), an
 * epsilon that is not finite and > 0, and a weight_decay that is not
 * finite and >= 0. Fields another kind reads are not checked, except that
 * compile refuses a non-zero momentum, nesterov or weight_decay on a kind
 * that would drop it.
 *
 * Optimizer state below FLT_MIN (1.2e-38) is stored as 0: subnormals slow
 * the host update many times over, and no update can show them. Adam and
 * AdamW with an epsilon under 2^-39 (1.8e-12) keep theirs, since there
 * sqrt(v) can matter next to epsilon. */
typedef struct castor_optimizer {
    castor_optimizer_kind kind;
    float learning_rate;  /* SGD 0.01, Adam/AdamW 0.001 */
    float momentum;       /* SGD only; 0 = plain SGD */
    int nesterov;         /* SGD only */
    float beta1;          /* Adam/AdamW: 0.9 */
    float beta2;          /* Adam/AdamW: 0.999 */
    float epsilon;        /* Adam/AdamW: 1e-7 */
    float weight_decay;   /* AdamW only: 0.004; decoupled, biases included:
                             w -= learning_rate * weight_decay * w before
                             the Adam step */
} castor_optimizer;

CASTOR_API castor_optimizer castor_optimizer_defaults(castor_optimizer_kind kind);
CASTOR_API const char *castor_optimizer_kind_name(castor_optimizer_kind kind);
CASTOR_API int castor_optimizer_kind_parse(const char *name, castor_optimizer_kind *out);
CASTOR_API const char *castor_activation_name(castor_activation act);
CASTOR_API int castor_activation_parse(const char *name, castor_activation *out);

typedef struct castor_model castor_model;

/* The most input features and units a layer takes (2^24). Datasets with
 * wider samples are refused as they load: no model could take them. */
#define CASTOR_MAX_UNITS (1 << 24)

/* A sequential model of dense layers taking input_features floats per
 * sample (1..CASTOR_MAX_UNITS). */
CASTOR_API int castor_model_create(castor_model **out, int input_features);
CASTOR_API void castor_model_free(castor_model *model);
CASTOR_API const char *castor_model_errmsg(const castor_model *model);
CASTOR_API int castor_model_add_dense(castor_model *model, int units, castor_activation act);
/* Parse "128:relu,10" (units[:activation], comma separated) into layers:
 * all of them, or on failure none. */
CASTOR_API int castor_model_add_layers(castor_model *model, const char *spec);

/*
 * Bind the model to a strategy: allocate the master variables (Glorot-uniform
 * kernels, zero biases, drawn from seed with the documented PRNG in
 * src/rng.c) and the optimizer state on the host, and each replica's copy
 * of the variables on its device. What only training needs on a device
 * (the gradients, a mirrored replica's optimizer state, the backward
 * pass's share of the activations) waits for the model's first
 * castor_model_fit: a model compiled (or opened) to evaluate and predict
 * needs device memory for its variables and a batch's activations, no
 * more. compile fails (CASTOR_DEVICE_MEMORY) when a device's budget cannot
 * hold the variables, its message saying what training needs besides.
 * One model per strategy at a time. A strategy freed before its model
 * detaches it: the model keeps its layers and refuses training, evaluation,
 * parameters and checkpoints (CASTOR_MISUSE) until compiled again, on
 * another strategy, which starts afresh (new variables, step 0).
 * optimizer may be NULL for Adam with its defaults.
 */
CASTOR_API int castor_model_compile(castor_model *model, castor_strategy *strategy,
                                    castor_loss loss, const castor_optimizer *optimizer,
                                    uint64_t seed);

CASTOR_API int castor_model_num_layers(const castor_model *model);
CASTOR_API size_t castor_model_num_params(const castor_model *model);
CASTOR_API int castor_model_input_features(const castor_model *model);
CASTOR_API int castor_model_output_units(const castor_model *model);
/* The layers as a spec string such as "128:relu,10:linear". A buf too small
 * gets as much as fits, NUL-terminated, and CASTOR_INVALID (at most 24
 * bytes a layer are needed); a NULL buf or size 0 is CASTOR_MISUSE. */
CASTOR_API int castor_model_layers_spec(const castor_model *model, char *buf, size_t size);
/* Copy the current variables (all kernels and biases, in the flat layout:
 * layer 0 kernel (in x out, row-major), layer 0 bias (out), layer 1 ...)
 * out of / into the model. count is in floats and must equal num_params.
 * set_params also recovers a mirrored model whose replicas may disagree
 * after a device failed mid-update; its optimizer state then goes back to
 * the host's last copy of it (taken at compile, load, or the last
 * get_params or save), as the replicas' own can no longer be trusted,
 * and so does the count of steps that state has taken, which Adam's bias
 * correction reads (castor_model_step goes on counting every step; a
 * checkpoint keeps both). A mirrored get_params or save that failed
 * (CASTOR_DEVICE) may have left that copy part old, part new: until a
 * get_params, save or load succeeds, such a recovery is refused
 * (CASTOR_DEVICE, the model still refusing work) and only
 * castor_model_load recovers the model. */
CASTOR_API int castor_model_get_params(castor_model *model, float *dst, size_t count);
CASTOR_API int castor_model_set_params(castor_model *model, const float *src, size_t count);
/* The optimizer's learning rate, changed from the next step on (finite and
 * > 0, else CASTOR_INVALID; before compile, CASTOR_MISUSE): a schedule set
 * from fit's progress callback (a decay at each epoch end, say), or a
 * resumed model trained on at another rate. Checkpoints and saves record
 * the rate in force. */
CASTOR_API int castor_model_set_learning_rate(castor_model *model, float learning_rate);
/* 0 when not compiled (before compile, or after its strategy was freed). */
CASTOR_API float castor_model_learning_rate(const castor_model *model);
/* *finite: 1 when every variable and every value of the optimizer state is
 * finite, 0 when one is NaN or infinite: the model has diverged, and no
 * training brings such a value back (Adam's v can overflow while the
 * variables stay finite). Reads them from the devices as get_params does,
 * without copying them out; may be called from fit's progress callback. */
CASTOR_API int castor_model_all_finite(castor_model *model, int *finite);
/* Optimizer steps taken so far. */
CASTOR_API int64_t castor_model_step(const castor_model *model);

/* ---- data ------------------------------------------------------------------ */
typedef struct castor_dataset castor_dataset;

/* Load an IDX image file and an IDX label file (plain or gzip); unsigned
 * byte pixels are scaled to [0,1], values of the other IDX types are taken
 * as they are. */
CASTOR_API int castor_dataset_load_idx(castor_dataset **out, const char *images_path,
                                       const char *labels_path);
/* Load a Fashion-MNIST/MNIST style directory: which is "train" or "test",
 * in either case (train-images-idx3-ubyte[.gz], t10k-images-idx3-ubyte[.gz],
 * ...; the plain file when both are there), read as castor_dataset_load_idx
 * reads them. */
CASTOR_API int castor_dataset_load_mnist_dir(castor_dataset **out, const char *dir,
                                             const char *which);
/* A dataset from memory (copied). labels (int32 class ids) or targets
 * (n x target_dim floats) is given, the other NULL (both or neither:
 * CASTOR_INVALID). */
CASTOR_API int castor_dataset_from_memory(castor_dataset **out, const float *x, size_t n,
                                          int features, const int32_t *labels,
                                          const float *targets, int target_dim);
CASTOR_API void castor_dataset_free(castor_dataset *ds);
CASTOR_API const char *castor_dataset_errmsg(const castor_dataset *ds);
CASTOR_API size_t castor_dataset_size(const castor_dataset *ds);
CASTOR_API int castor_dataset_features(const castor_dataset *ds);
/* The samples (size x features floats), valid until the dataset is freed or
 * split. */
CASTOR_API const float *castor_dataset_x(const castor_dataset *ds);
CASTOR_API const int32_t *castor_dataset_labels(const castor_dataset *ds); /* NULL if none */
/* Split off the last `count` samples (0 < count < size, else CASTOR_INVALID)
 * into a new dataset (for validation). On failure *tail is NULL, ds is as it
 * was and its errmsg says why. */
CASTOR_API int castor_dataset_split_tail(castor_dataset *ds, size_t count, castor_dataset **tail);

/* ---- training -------------------------------------------------------------- */
typedef struct castor_metrics {
    double loss;        /* mean loss per sample */
    double accuracy;    /* fraction correct; NaN for MSE models */
    size_t samples;
} castor_metrics;

typedef struct castor_progress {
    int epoch;              /* 0-based, counted in this fit call (castor_model_epoch
                             * gives the model's epochs in all) */
    int epochs;             /* this call's: the options' epochs */
    int64_t step_in_epoch;  /* steps done in this epoch */
    int64_t steps_per_epoch;
    int64_t global_step;    /* optimizer steps done in total */
    double loss;            /* running mean loss this epoch, over the samples
                             * this call trained (after a resume mid-epoch,
                             * not those trained before it) */
    double accuracy;        /* the same, the accuracy (NaN for MSE) */
    double seconds;         /* since fit started */
    int epoch_end;          /* 1 at the end of an epoch: val_* are set */
    double val_loss, val_accuracy; /* NaN when there is no validation data */
} castor_progress;

/* Return non-zero to stop training after the current step (fit then
 * returns CASTOR_INTERRUPTED with the model in a consistent state). The
 * callback may read the model (get_params, step, ...), save it and set its
 * learning rate (for the steps after this one); compile, fit,
 * evaluate, predict, set_params and load on the same model return
 * CASTOR_MISUSE until fit returns, and freeing the model or its strategy
 * makes fit stop with CASTOR_MISUSE (a model freed there is freed as fit
 * returns). The datasets fit reads (training and validation) may be read,
 * not split (CASTOR_MISUSE) nor freed. */
typedef int (*castor_progress_fn)(void *user, const castor_progress *progress);

typedef struct castor_fit_options {
    int epochs;             /* 1 */
    int batch_size;         /* global batch, split over the replicas: 32 */
    int shuffle;            /* 1 */
    const castor_dataset *validation; /* NULL: none */
    castor_progress_fn progress;      /* called after every step */
    void *progress_user;
    int64_t max_steps;      /* 0: no limit; stop after this many steps of this call */
} castor_fit_options;

#define CASTOR_FIT_OPTIONS_INIT {1, 32, 1, NULL, NULL, NULL, 0}

/* options may be NULL for the defaults; fit reads them once, as it starts
 * (changing them from the progress callback changes nothing in this fit).
 * Before its first step fit makes sure every device holds what the
 * largest batch it runs needs (validation's included), and the model's
 * first fit allocates what training needs there (castor_model_compile):
 * where a device's budget is too small, CASTOR_DEVICE_MEMORY, nothing
 * trained, with a message naming the bytes of the variables, the
 * gradients, a mirrored replica's optimizer state and the activations.
 * epochs counts epoch ends: an epoch left part-way, finished first (below),
 * is one of them, so fit then trains epochs - 1 whole epochs after it.
 * last_epoch (may be NULL) gets the metrics of the last epoch that ended in
 * this call, over the samples this call trained of it; {NaN, NaN, 0} when
 * none ended. An epoch left part-way (max_steps, a stop, a checkpoint taken
 * mid-epoch) is finished first, over the order of samples it started with:
 * fit returns CASTOR_MISMATCH, training nothing, unless the batch size, the
 * number of training samples and the shuffle flag are the epoch's. A model
 * loaded with variables or optimizer state that are not finite is refused
 * (CASTOR_INVALID; see castor_model_load). fit does not read the variables
 * back as it trains, so a model that diverges in it (or in an earlier fit)
 * trains on: a progress callback that sees a non-finite loss, or
 * castor_model_all_finite, can stop it. */
CASTOR_API int castor_model_fit(castor_model *model, const castor_dataset *train,
                                const castor_fit_options *options, castor_metrics *last_epoch);
/* evaluate and predict run batch_size samples at a time, split over the
 * replicas as fit's batches are (so at least one a replica). On the
 * devices they need the variables and a batch's activations: no gradients
 * nor optimizer state (after a fit, the activations keep the backward
 * pass's share, which the next fit would use). The replicas keep their
 * activation buffers (device memory, and host memory on emulated CPU
 * devices) for the largest batch any fit, evaluate or predict has run,
 * until the model is freed or compiled again (or its strategy freed): a
 * one-off call with a huge batch holds that memory as long. The model's
 * first fit is the exception: it gives back the forward-only buffers of an
 * earlier evaluate or predict and reserves for its own batches. */
CASTOR_API int castor_model_evaluate(castor_model *model, const castor_dataset *data,
                                     int batch_size, castor_metrics *out);
/* Outputs of the last layer (logits for a softmax cross-entropy model) for
 * n samples of input_features floats each, into out (n x output_units). */
CASTOR_API int castor_model_predict(castor_model *model, const float *x, size_t n,
                                    int batch_size, float *out);
/* A check that evaluate and predict make before each batch, and fit before
 * each step, the first included: when fn returns non-zero they stop with
 * CASTOR_INTERRUPTED. evaluate then leaves out alone and predict's out
 * holds the batches done before the stop; fit leaves the model as when its
 * progress callback stops it (possibly before any step), and its
 * validation pass at an epoch end runs whole, so that the epoch's end
 * reaches the callback. It is how a signal handler or another thread stops
 * a long call: fn, called on the call's thread, reads a flag they set (a
 * volatile sig_atomic_t, or an atomic). Set it before the call; NULL fn:
 * no check (the default); it stays set across compiles. fn may read the
 * model and save it, as fit's progress callback may: fit, evaluate,
 * predict, set_params, load and compile on the model, and splitting the
 * data being read, are CASTOR_MISUSE from it; the data must not be freed;
 * freeing the model or its strategy stops the call with CASTOR_MISUSE (a
 * model freed there is freed as the call returns). */
typedef int (*castor_stop_fn)(void *user);
CASTOR_API int castor_model_set_stop_check(castor_model *model, castor_stop_fn fn, void *user);

/* The most device memory any one replica has held since compile (or
 * castor_model_reset_run_stats, which starts the count again from what the
 * replicas hold then), in bytes. */
CASTOR_API size_t castor_model_device_peak_bytes(const castor_model *model);

/* What the model's training steps have cost since compile (or the last
 * reset): for benchmarks and for seeing where a step's time goes. Only the
 * steps' traffic is counted: not what compile, load, save, get_params,
 * set_params, all_finite, evaluate or predict move. */
typedef struct castor_run_stats {
    int64_t steps;              /* training steps counted */
    uint64_t bytes_h2d;         /* host-to-device bytes, all replicas */
    uint64_t bytes_d2h;         /* device-to-host bytes, all replicas */
    double seconds_replicas;    /* wall time of the replicas' part of the steps */
    double seconds_reduce;      /* mirrored: the replicas' gradients summed, on the
                                   host or by replica 0 on a device they share;
                                   central: 0 (summed within its update) */
    double seconds_update;      /* central: the sum and the optimizer, one pass on the
                                   host; mirrored: placing the reduced gradient
                                   (upload, copy of replica 0's sum, or NCCL
                                   all-reduce) and the device update */
    double seconds_total;       /* whole steps */
    size_t device_peak_bytes;   /* most device memory one replica has held */
    size_t host_bytes;          /* the model's own host buffers: the variables,
                                   the optimizer state, from the first fit the
                                   gradients' host buffers where the host sums
                                   them (central; mirrored through the host),
                                   and a batch's row statistics; pinned by CUDA
                                   where the strategy has a GPU, ordinary (not
                                   mlock'd) memory for emulated CPU devices,
                                   whose device memory, host memory too, is
                                   not counted here */
} castor_run_stats;

CASTOR_API int castor_model_run_stats(const castor_model *model, castor_run_stats *out);
CASTOR_API void castor_model_reset_run_stats(castor_model *model);

/* ---- checkpoints (safetensors) ------------------------------------------------
 * A checkpoint is a safetensors file: tensors "dense_0.kernel" (in x out,
 * row-major, F32), "dense_0.bias" (out), ..., the optimizer slots as
 * "dense_0.kernel.adam_m" etc., and in the header's __metadata__ the
 * architecture, loss, optimizer and hyper-parameters, seed, step, epoch and
 * position in the epoch, the epoch count the last fit was to end at
 * (target_epochs: the epochs done when it began plus its epochs; kept
 * through a load and save), strategy, devices and OpenBLAS thread count that
 * trained it, the sample shape and IDX element type of the data it was last
 * fitted on (where that came from IDX files), castor version and the CRC-32
 * of the data section. Files are
 * written atomically (temporary file, fsync, rename, fsync of the
 * directory, where it can be opened: not in one the process may write in
 * but not read): a crash leaves the old file or the new one. When that last
 * fsync fails (EIO), the new file is in place and whole, but the rename may
 * not survive a crash: castor_model_save returns CASTOR_NOT_DURABLE, which
 * a caller may take as saved but not yet safe. A path that is a
 * symbolic link is written through: the file it leads to is replaced (or
 * made), and the link stays.
 */

/* Save variables, optimizer state and training position. */
CASTOR_API int castor_model_save(castor_model *model, const char *path);
/* Load a checkpoint into a compiled model with the same layers, loss,
 * optimizer kind and optimizer state (SGD with momentum, or without):
 * variables, optimizer state and training position, and the optimizer's
 * hyper-parameters (learning rate, ...) and the seed, which replace those
 * given to compile, so that training goes on as it would have. On any
 * error the model is unchanged, but one: when a mirrored model's device
 * fails while the loaded values are placed on it (CASTOR_DEVICE), the
 * model holds the file's values on the host and, as after a failed update,
 * refuses work until a load or castor_model_set_params succeeds.
 * Values that are not finite (NaN, inf: what castor_model_save writes of a
 * model whose training diverged) are loaded as they are, so that evaluate,
 * predict and get_params can inspect such a model; castor_model_fit
 * refuses to train from them (CASTOR_INVALID) until finite values replace
 * them: castor_model_set_params for the variables (set_params itself takes
 * finite values only), a load for variables and optimizer state. */
CASTOR_API int castor_model_load(castor_model *model, const char *path);
/* Create and compile a model from a checkpoint's architecture on a strategy,
 * then load it (with no device memory for the gradients, as compile: a
 * model opened to evaluate and predict needs room for its variables and a
 * batch's activations alone). A failed open hands out a model that is not
 * compiled, for its message (free it; what else it holds is unspecified):
 * the strategy is left free for another model. */
CASTOR_API int castor_model_open(castor_model **out, const char *path,
                                 castor_strategy *strategy);
/* Epochs completed and steps done in the epoch in progress. */
CASTOR_API int64_t castor_model_epoch(const castor_model *model);
CASTOR_API int64_t castor_model_step_in_epoch(const castor_model *model);

#ifdef __cplusplus
}
#endif
#endif /* CASTOR_H */

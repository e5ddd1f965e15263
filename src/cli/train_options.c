/*
 * castor train's command line: one flag table drives both the parser and
 * --help, so the two cannot drift apart. Parsing fills a train_opts and
 * rejects the combinations of flags that make no sense before anything
 * expensive (devices, data) is touched.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "castor.h"
#include "args.h"
#include "cli.h"
#include "common.h"
#include "train.h"

/* ---- flags ------------------------------------------------------------- */

enum {
    F_DATA,
    F_LAYERS,
    F_LOSS,
    F_OPTIMIZER,
    F_LR,
    F_MOMENTUM,
    F_NESTEROV,
    F_WEIGHT_DECAY,
    F_EPOCHS,
    F_BATCH,
    F_VALIDATION_SPLIT,
    F_SEED,
    F_STRATEGY,
    F_DEVICES,
    F_DEVICE_MEMORY,
    F_HOST_THREADS,
    F_TF32,
    F_SAVE,
    F_CHECKPOINT_DIR,
    F_CHECKPOINT_EVERY,
    F_KEEP,
    F_RESUME,
    F_JSON,
    F_QUIET,
    F_VERBOSE,
    F_COUNT
};

static const cli_flag train_flags[F_COUNT + 1] = {
    [F_DATA] = {"data", "fashion-mnist|DIR", "fashion-mnist",
                "training and test data. 'fashion-mnist' is the directory\n"
                "$CASTOR_FASHION_MNIST, or else " CLI_DEFAULT_FASHION_MNIST ";\n"
                "DIR holds the four MNIST-style IDX files train-images-idx3-ubyte,\n"
                "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and\n"
                "t10k-labels-idx1-ubyte, each plain or gzip'd (.gz; the plain one\n"
                "if both are there). Unsigned-byte pixels are scaled to [0,1]; the\n"
                "other IDX types (signed byte, short, int, float, double) are taken\n"
                "as they are. An image may have any shape of up to 3 dimensions:\n"
                "its features are their product. The test set must be read as the\n"
                "training set is: a test set of another image shape (16x49 for\n"
                "28x28), or of unsigned bytes where training has another type (or\n"
                "the other way round), is refused (status 2)"},
    [F_LAYERS] = {"layers", "SPEC", "128:relu,10",
                  "the dense layers, comma separated, each UNITS[:ACTIVATION] with\n"
                  "ACTIVATION relu, tanh, sigmoid or linear (the default); with\n"
                  "--loss xent the last layer is linear with a unit per class"},
    [F_LOSS] = {"loss", "xent|mse", "xent",
                "xent: softmax cross-entropy on the class labels;\n"
                "mse: mean squared error against one-hot class targets (no accuracy)"},
    [F_OPTIMIZER] = {"optimizer", "sgd|adam|adamw", "adam",
                     "the optimizer, with Keras's semantics and defaults"},
    [F_LR] = {"lr", "X", "0.01 for sgd, 0.001 for adam and adamw",
              "the learning rate, > 0 and <= 1000"},
    [F_MOMENTUM] = {"momentum", "X", "0", "SGD momentum, 0 <= X < 1 (sgd only)"},
    [F_NESTEROV] = {"nesterov", NULL, NULL, "Nesterov momentum (sgd only)"},
    [F_WEIGHT_DECAY] = {"weight-decay", "X", "0.004",
                        "decoupled weight decay, 0 <= X <= 1 (adamw only): each step\n"
                        "first takes lr * X * w from every weight and bias w"},
    [F_EPOCHS] = {"epochs", "N", "10; with --resume, the checkpoint's run's",
                  "passes over the training data in all, 1 to 1000000"},
    [F_BATCH] = {"batch", "N", "256",
                 "the global batch size, split over the replicas: at least the\n"
                 "number of replicas, at most 16777216"},
    [F_VALIDATION_SPLIT] = {"validation-split", "N", "0",
                            "hold the last N training samples out of training and report\n"
                            "val_loss and val_acc on them after every epoch (N below the\n"
                            "number of training samples)"},
    [F_SEED] = {"seed", "N", "1",
                "seed of the initial weights and the shuffling, 0 to 2^64-1"},
    [F_STRATEGY] = {"strategy", "central|mirrored", "central",
                    "central: the master weights live in host memory (pinned for\n"
                    "GPUs) and the CPU updates them; mirrored: a copy per device,\n"
                    "gradients all-reduced, each device updates its copy"},
    [F_DEVICES] = {"devices", "LIST", "cpu",
                   "the replicas, comma separated: cpu, cpu:N (N emulated CPU\n"
                   "devices), cpu:1x2 (two replicas sharing one), cuda (every GPU),\n"
                   "cuda:0,cuda:1 (the GPUs listed), cuda:0x4 (four replicas\n"
                   "sharing GPU 0); at most 64 replicas in all"},
    [F_DEVICE_MEMORY] = CLI_ROW_DEVICE_MEMORY,
    [F_HOST_THREADS] = {"host-threads", "N", "0: one per core",
                        "host threads for the gradient reduction and the optimizer,\n"
                        "0 to 1024"},
    [F_TF32] = {"tf32", NULL, NULL, "allow TF32 tensor-core math on GPUs (off: plain fp32)"},
    [F_SAVE] = {"save", "FILE", NULL,
                "write the trained model to FILE (safetensors) at the end, atomically:\n"
                "a crash leaves the old file or the new one (a symbolic link is\n"
                "written through: the file it leads to is replaced); if it cannot be\n"
                "written (a full disk), the test results still come, then status 1"},
    [F_CHECKPOINT_DIR] = {"checkpoint-dir", "DIR", NULL,
                          "write checkpoints DIR/ckpt-<step, 12 digits>.safetensors (DIR is\n"
                          "created if missing) every --checkpoint-every, at the end of\n"
                          "training, and when a signal (SIGINT, SIGTERM, SIGHUP) stops it\n"
                          "after a step; DIR may hold no checkpoints but this run's own\n"
                          "past (resumed with --resume), and one run at a time writes into\n"
                          "it: another one given DIR meanwhile is refused"},
    [F_CHECKPOINT_EVERY] = {"checkpoint-every", "N|epoch", "epoch",
                            "a checkpoint at every N-th optimizer step of the model (1 to\n"
                            "2147483647; counted from its first step, a resumed run's too),\n"
                            "or at the end of every epoch (needs --checkpoint-dir)"},
    [F_KEEP] = {"keep", "K", "3",
                "keep the newest K checkpoints in --checkpoint-dir, 1 to 1000000: older\n"
                "ckpt-<12 digits>.safetensors are deleted once a newer one is written,\n"
                "and the temporary files (ckpt-<12 digits>.safetensors.tmp.XXXXXX) of\n"
                "writes cut short (kill -9) when a run starts; other files are never\n"
                "touched"},
    [F_RESUME] = {"resume", "DIR|FILE", NULL,
                  "continue from a checkpoint: FILE, or the newest ckpt-*.safetensors in\n"
                  "DIR, which when damaged is an error, not passed over for an older one\n"
                  "(see 'Resuming' below)"},
    [F_JSON] = {"json", NULL, NULL,
                "print the results as one JSON object, the last line of stdout"},
    [F_QUIET] = {"quiet", NULL, NULL,
                 "no progress display, no library warnings, no notes, no line at once\n"
                 "when a signal asks training to stop, and no warning that a resumed\n"
                 "run goes on with another strategy, replica count or OpenBLAS thread\n"
                 "count, or to the default --epochs (a checkpoint from an older\n"
                 "castor); a resume on another number of training samples and a\n"
                 "checkpoint that cannot be pruned still warn"},
    [F_VERBOSE] = {"verbose", NULL, NULL,
                   "describe the run on stderr, with the library's info messages"},
    [F_COUNT] = {NULL, NULL, NULL, NULL},
};

void castor_cli_train_usage(FILE *out)
{
    fprintf(out,
            "usage: castor train [flags]\n"
            "\n"
            "Train a dense network on an IDX data set, evaluate it on the test set and\n"
            "print a summary on stdout (progress goes to stderr).\n"
            "\n"
            "flags:\n");
    cli_print_flags(out, train_flags);
    fprintf(out,
            "  -h, --help\n"
            "      show this help\n"
            "\n"
            "example:\n"
            "  castor train --data fashion-mnist --layers 128:relu,10 --optimizer adam \\\n"
            "      --epochs 10 --batch 256 --strategy central --devices cpu:2 \\\n"
            "      --seed 1 --json\n"
            "\n"
            "With --json the last line of stdout is an object with test_accuracy,\n"
            "test_loss, train_loss, train_accuracy (over the last epoch's samples\n"
            "trained by this run: train_metric_samples, fewer than the epoch's when\n"
            "it resumed part-way), val_loss, val_accuracy, epochs, steps (this\n"
            "run's), global_step (the model's steps in all), seconds (wall time of\n"
            "training alone: the steps and the validation, not loading the data, the\n"
            "test set or writing checkpoints), samples_per_second (the training\n"
            "samples over those seconds), checkpoint_seconds (writing checkpoints),\n"
            "checkpoints (how many this run wrote), saved (the --save file or null),\n"
            "resumed_from (the checkpoint file resumed from, or null), strategy,\n"
            "devices, replicas, batch, params, device_peak_bytes (the most device\n"
            "memory one replica held: replicas sharing a device hold it each), and\n"
            "the run's settings: version, layers, optimizer, learning_rate, loss,\n"
            "data, train_samples, validation_samples, test_samples, seed and\n"
            "features (castor's build).\n"
            "\n"
            "Resuming (--resume): the model is rebuilt from the checkpoint on the\n"
            "--strategy and --devices of this command line. The file decides the\n"
            "layers, the loss, the optimizer and its hyper-parameters and the seed:\n"
            "--layers, --loss, --optimizer, --lr, --momentum, --nesterov,\n"
            "--weight-decay and --seed may be left out, and given with a value the\n"
            "file does not have they are an error (status 2). --batch defaults to the\n"
            "file's batch size, and --validation-split to what leaves as many training\n"
            "samples as the file's epochs had (the same --data assumed). An epoch in\n"
            "progress is finished over the samples it started with: the same batch\n"
            "size, --data and --validation-split.\n"
            "--epochs is the total for the whole run, the interrupted part included:\n"
            "training continues until that many epochs are done (a checkpoint that has\n"
            "done them all is only evaluated). Left out, it is the --epochs of the run\n"
            "that wrote the checkpoint, which castor records in it (target_epochs); a\n"
            "file from a castor that did not gets the default, 10, with a warning\n"
            "(not with --quiet). On the same machine, data, strategy, number of\n"
            "replicas and (for CPU replicas) OpenBLAS threads the result is bitwise\n"
            "the one of a run never interrupted; a resume with another strategy,\n"
            "replica count or OpenBLAS thread count warns.\n"
            "\n"
            "SIGINT, SIGTERM or SIGHUP stops training after the current step (the test\n"
            "evaluation after its current batch; one after its last batch lets the\n"
            "results print), which castor says at once on stderr unless --quiet;\n"
            "castor writes a checkpoint if --checkpoint-dir is set and a step was\n"
            "trained, says where (after training, also where --save wrote the model),\n"
            "and exits with status 130, 143 or 129. A signal castor was\n"
            "started with ignored stays ignored (nohup, or a shell's\n"
            "'castor train ... &' that ignores SIGINT).\n"
            "A second signal ends castor at once, writing nothing more: the steps since\n"
            "the newest checkpoint are lost (one that comes while a checkpoint or --save\n"
            "is being written takes effect once that file is whole).\n"
            "\n"
            "Training that diverges (a step's loss, or the variables or optimizer state\n"
            "about to be written or at the end, not finite) stops with status 1, naming\n"
            "the step; no checkpoint or --save of that model is written, and the older\n"
            "checkpoints stay.\n"
            "Exit status 1: the run failed (or another run is writing into\n"
            "--checkpoint-dir: try again once it has ended; or --save failed after\n"
            "training, and the results were printed all the same; or --save wrote\n"
            "the model, whole and in place, and the results were printed, but the\n"
            "fsync of its directory failed, so that it may not survive a crash); 2: a\n"
            "flag is wrong, or the data, a checkpoint or --checkpoint-dir does not\n"
            "fit the flags.\n");
}

/* ---- phase 1: the command line ------------------------------------------------ */

/* See train.h. */
int train_parse_args(train_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->data = "fashion-mnist";
    o->layers = "128:relu,10";
    o->loss = CASTOR_LOSS_SOFTMAX_XENT;
    o->optimizer = CASTOR_OPT_ADAM;
    o->epochs = CLI_EPOCHS_DEFAULT;
    o->batch = 256;
    o->seed = 1;
    o->strategy = CASTOR_STRATEGY_CENTRAL;
    o->devices = "cpu";
    o->checkpoint_every = CKPT_EVERY_EPOCH;
    o->keep = 3;

    cli_parser p;
    cli_parser_init(&p, "train", argc, argv);
    for (;;) {
        const char *v;
        int f = cli_next(&p, train_flags, &v);
        if (f == CLI_DONE)
            break;
        if (f == CLI_HELP) {
            castor_cli_train_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (f == CLI_FAIL)
            return CLI_EXIT_USAGE;
        const char *name = train_flags[f].name;
        int bad = 0;
        switch (f) {
        case F_DATA: o->data = v; break;
        case F_LAYERS:
            o->layers = v;
            o->layers_set = 1;
            break;
        case F_LOSS:
            o->loss_set = 1;
            if (strcasecmp(v, "xent") == 0)
                o->loss = CASTOR_LOSS_SOFTMAX_XENT;
            else if (strcasecmp(v, "mse") == 0)
                o->loss = CASTOR_LOSS_MSE;
            else {
                cli_errorf("--loss '%s': not a loss (xent or mse)", v);
                bad = 1;
            }
            break;
        case F_OPTIMIZER:
            o->optimizer_set = 1;
            if (castor_optimizer_kind_parse(v, &o->optimizer) != CASTOR_OK) {
                cli_errorf("--optimizer '%s': not an optimizer (sgd, adam or adamw)", v);
                bad = 1;
            }
            break;
        case F_LR:
            bad = cli_parse_double(name, v, 0.0, 1, 1000.0, 0, &o->lr);
            o->lr_set = 1;
            break;
        case F_MOMENTUM:
            bad = cli_parse_double(name, v, 0.0, 0, 1.0, 1, &o->momentum);
            o->momentum_set = 1;
            break;
        case F_NESTEROV: o->nesterov = 1; break;
        case F_WEIGHT_DECAY:
            bad = cli_parse_double(name, v, 0.0, 0, 1.0, 0, &o->weight_decay);
            o->weight_decay_set = 1;
            break;
        case F_EPOCHS:
            bad = cli_parse_int(name, v, 1, CLI_EPOCHS_MAX, &o->epochs);
            o->epochs_set = 1;
            break;
        case F_BATCH:
            bad = cli_parse_int(name, v, 1, 1 << 24, &o->batch);
            o->batch_set = 1;
            break;
        case F_VALIDATION_SPLIT:
            bad = cli_parse_int(name, v, 0, 0x7fffffff, &o->validation_split);
            o->validation_split_set = 1;
            break;
        case F_SEED:
            bad = cli_parse_u64(name, v, &o->seed);
            o->seed_set = 1;
            break;
        case F_STRATEGY:
            if (castor_strategy_kind_parse(v, &o->strategy) != CASTOR_OK) {
                cli_errorf("--strategy '%s': not a strategy (central or mirrored)", v);
                bad = 1;
            }
            break;
        case F_DEVICES: o->devices = v; break;
        case F_DEVICE_MEMORY: bad = cli_parse_size(name, v, &o->device_memory); break;
        case F_HOST_THREADS: bad = cli_parse_int(name, v, 0, 1024, &o->host_threads); break;
        case F_TF32: o->tf32 = 1; break;
        case F_SAVE: o->save = v; break;
        case F_CHECKPOINT_DIR: o->checkpoint_dir = v; break;
        case F_CHECKPOINT_EVERY:
            o->every_set = 1;
            if (strcasecmp(v, "epoch") == 0)
                o->checkpoint_every = CKPT_EVERY_EPOCH;
            else if (isdigit((unsigned char)v[0]) || v[0] == '-' || v[0] == '+')
                bad = cli_parse_int(name, v, 1, 0x7fffffff, &o->checkpoint_every);
            else {
                cli_errorf("--%s '%s': give a number of steps or 'epoch'", name, v);
                bad = 1;
            }
            break;
        case F_KEEP:
            bad = cli_parse_int(name, v, 1, 1000000, &o->keep);
            o->keep_set = 1;
            break;
        case F_RESUME: o->resume = v; break;
        case F_JSON: o->json = 1; break;
        case F_QUIET: o->quiet = 1; break;
        case F_VERBOSE: o->verbose = 1; break;
        default: break;
        }
        if (bad)
            return CLI_EXIT_USAGE;
    }

    /* Flags that mean nothing for the chosen optimizer are mistakes. A
     * resumed run without --optimizer has the file's: train_resume() compares
     * the flags with the file instead. */
    if (!o->resume || o->optimizer_set) {
        if (o->optimizer != CASTOR_OPT_SGD && (o->momentum_set || o->nesterov)) {
            cli_errorf("--%s applies to --optimizer sgd only, not %s",
                       o->momentum_set ? "momentum" : "nesterov",
                       castor_optimizer_kind_name(o->optimizer));
            return CLI_EXIT_USAGE;
        }
        if (o->optimizer != CASTOR_OPT_ADAMW && o->weight_decay_set) {
            cli_errorf("--weight-decay applies to --optimizer adamw only, not %s",
                       castor_optimizer_kind_name(o->optimizer));
            return CLI_EXIT_USAGE;
        }
    }
    if (!o->checkpoint_dir && (o->every_set || o->keep_set)) {
        cli_errorf("--%s needs --checkpoint-dir", o->every_set ? "checkpoint-every" : "keep");
        return CLI_EXIT_USAGE;
    }
    if (o->verbose && o->quiet) {
        cli_errorf("--verbose and --quiet contradict each other");
        return CLI_EXIT_USAGE;
    }
    return -1;
}

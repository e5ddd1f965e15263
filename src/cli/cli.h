/*
 * The castor command line: one function per subcommand.
 *
 * Each takes the subcommand's own argv (argv[0] is the subcommand's name)
 * and returns the process exit status: 0 success, 1 a runtime failure,
 * 2 a usage error, 128+signal when interrupted (see args.h).
 * The command line trains through include/castor.h alone; it borrows a few
 * internal helpers: the device-list parser (src/device_list.h: how many CPU
 * replicas --devices names, for OpenBLAS's thread count), the core count
 * (host/cores.h, for that and castor info), and from src/dataset.h one-hot
 * targets made in place and the look for a data directory's files; bench/
 * borrows more of them.
 */
#ifndef CASTOR_CLI_H
#define CASTOR_CLI_H

#include <stdio.h>

int castor_cli_train(int argc, char **argv);
int castor_cli_info(int argc, char **argv);
int castor_cli_eval(int argc, char **argv);
int castor_cli_predict(int argc, char **argv);
/* Implemented in bench/; main.c dispatches to it only when built with
 * CASTOR_HAVE_BENCH. */
int castor_cli_bench(int argc, char **argv);

/* The help texts (to out), shared by "castor help CMD" and "CMD --help". */
void castor_cli_usage(FILE *out);
void castor_cli_train_usage(FILE *out);
void castor_cli_info_usage(FILE *out);
void castor_cli_eval_usage(FILE *out);
void castor_cli_predict_usage(FILE *out);

#endif

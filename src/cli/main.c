/* castor: the program's entry point, which hands over to a subcommand. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "castor.h"
#include "args.h"
#include "cli.h"

void castor_cli_usage(FILE *out)
{
    fprintf(out,
            "usage: castor <command> [flags]\n"
            "\n"
            "Train dense neural networks with central storage: one master copy of the\n"
            "weights in host memory (pinned for GPUs), updated on the CPU, and one\n"
            "thread per device replica computing gradients (or a mirrored strategy to\n"
            "compare).\n"
            "\n"
            "commands:\n"
            "  train        train a model on an IDX data set and evaluate it on the test set\n"
            "  eval         evaluate a saved model on the test set\n"
            "  predict      print a saved model's predictions for the first test samples\n"
            "  info         show the version, the build's features, CPU cores and GPUs\n"
#ifdef CASTOR_HAVE_BENCH
            "  bench        measure central storage against mirrored and the hardware limits\n"
#endif
            "  version      print the version\n"
            "  help [CMD]   show this help, or the help of CMD\n"
            "\n"
            "flags:\n"
            "  -h, --help   show this help\n"
            "  --version    print the version and exit\n"
            "\n"
            "Run 'castor <command> --help' for the flags of a command.\n"
            "Exit status: 0 success, 1 failure, 2 usage error; train, stopped by\n"
            "SIGINT/SIGTERM/SIGHUP, exits 130/143/129 (the other commands are ended\n"
            "by the signal itself).\n");
}

static void version_usage(FILE *out)
{
    fprintf(out,
            "usage: castor version   (or: castor --version)\n"
            "\n"
            "Print castor's version, and warn if the library it runs with is not the one\n"
            "its header came from.\n");
}

static int print_version(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        version_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (argc > 1) {
        cli_errorf("%s takes no arguments, not '%s'", argv[0], argv[1]);
        return CLI_EXIT_USAGE;
    }
    printf("castor %s\n", castor_version());
    if (castor_version_number() != CASTOR_VERSION_NUMBER)
        fprintf(stderr, "castor: warning: built against castor.h %s but linked with library %s\n",
               CASTOR_VERSION_STRING, castor_version());
    return CLI_EXIT_OK;
}

static int help(int argc, char **argv)
{
    if (argc < 2) {
        castor_cli_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (argc > 2) {
        cli_errorf("help: too many arguments (usage: castor help [COMMAND])");
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0)
        castor_cli_train_usage(stdout);
    else if (strcmp(cmd, "info") == 0)
        castor_cli_info_usage(stdout);
    else if (strcmp(cmd, "eval") == 0)
        castor_cli_eval_usage(stdout);
    else if (strcmp(cmd, "predict") == 0)
        castor_cli_predict_usage(stdout);
#ifdef CASTOR_HAVE_BENCH
    else if (strcmp(cmd, "bench") == 0) {
        char *bench_argv[] = {(char *)"bench", (char *)"--help", NULL};
        return castor_cli_bench(2, bench_argv);
    }
#endif
    else if (strcmp(cmd, "version") == 0)
        version_usage(stdout);
    else if (strcmp(cmd, "help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0)
        castor_cli_usage(stdout);
    else {
        cli_errorf("help: unknown command '%s' (see 'castor --help')", cmd);
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        cli_errorf("no command given (see 'castor --help')");
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;

    if (strcmp(cmd, "train") == 0)
        return castor_cli_train(sub_argc, sub_argv);
    if (strcmp(cmd, "info") == 0)
        return castor_cli_info(sub_argc, sub_argv);
    if (strcmp(cmd, "eval") == 0)
        return castor_cli_eval(sub_argc, sub_argv);
    if (strcmp(cmd, "predict") == 0)
        return castor_cli_predict(sub_argc, sub_argv);
#ifdef CASTOR_HAVE_BENCH
    if (strcmp(cmd, "bench") == 0)
        return castor_cli_bench(sub_argc, sub_argv);
#endif
    if (strcmp(cmd, "help") == 0)
        return help(sub_argc, sub_argv);
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0)
        return help(sub_argc, sub_argv); /* castor --help train: as castor help train */
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0)
        return print_version(sub_argc, sub_argv);
    if (strncmp(cmd, "--help=", 7) == 0 || strncmp(cmd, "--version=", 10) == 0)
        cli_errorf("%.*s takes no value", (int)(strchr(cmd, '=') - cmd), cmd);
    else if (cmd[0] == '-')
        cli_errorf("unknown flag '%s' (see 'castor --help')", cmd);
    else
        cli_errorf("unknown command '%s' (see 'castor --help')", cmd);
    return CLI_EXIT_USAGE;
}

/* A standard descriptor the caller closed (2>&-) would be the next file
 * opened, a checkpoint say, and what is printed to it would land there:
 * each closed one is opened on /dev/null (the lowest free descriptor, so
 * in order each gets its own number). Returns whether stdout was closed. */
static int fill_closed_std_fds(void)
{
    int stdout_closed = 0;
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF)
            continue;
        stdout_closed |= fd == 1;
        int got = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (got >= 0 && got != fd)
            close(got);
    }
    return stdout_closed;
}

int main(int argc, char **argv)
{
    int stdout_closed = fill_closed_std_fds();
    /* A write past the file size limit (RLIMIT_FSIZE: ulimit -f, a job
     * system's) raises SIGXFSZ, which kills by default: mid-checkpoint, with
     * no message and the temporary file left behind. Ignored, the write
     * fails with EFBIG, which the file's writer reports and cleans up. */
    signal(SIGXFSZ, SIG_IGN);
    int rc = dispatch(argc, argv);
    /* Whatever a command printed (help, a version, a table) must have
     * reached stdout: a full disk, a closed pipe or a closed stdout is a
     * failure, not 0. */
    if (rc == CLI_EXIT_OK && (fflush(stdout) != 0 || ferror(stdout) || stdout_closed)) {
        cli_errorf("cannot write to stdout%s", stdout_closed ? ": it is closed" : "");
        rc = CLI_EXIT_RUNTIME;
    }
    return rc;
}

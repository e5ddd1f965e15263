/*
 * Flag parsing for the castor command line.
 *
 * Each subcommand describes its flags in a table of cli_flag; the same table
 * drives the parser (cli_next) and the --help text (cli_print_flags), so a
 * flag cannot be accepted without being documented, or the other way round.
 *
 * Errors are one line on stderr starting "castor: ", printed here; callers
 * only map the failure to an exit status.
 */
#ifndef CASTOR_CLI_ARGS_H
#define CASTOR_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit statuses of the castor program. */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_RUNTIME = 1, /* the work failed: data, devices, memory, ... */
    CLI_EXIT_USAGE = 2    /* the command line is wrong */
};

/* Print "castor: <message>" as one line on stderr (newlines in the message
 * are replaced by spaces so the error stays one line). */
void cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

typedef struct cli_flag {
    const char *name;    /* without the leading "--"; NULL ends the table */
    const char *metavar; /* "N", "X", ...; NULL for a switch that takes no value */
    const char *def;     /* the default as shown in --help; NULL: "off" for a switch */
    const char *help;    /* may contain '\n' for more lines */
} cli_flag;

typedef struct cli_parser {
    const char *cmd; /* "train", "info": used in messages */
    int argc;
    char **argv;
    int i; /* next argument */
} cli_parser;

enum {
    CLI_DONE = -1, /* no more arguments */
    CLI_HELP = -2, /* -h or --help */
    CLI_FAIL = -3  /* an error was printed: exit with CLI_EXIT_USAGE */
};

/* argv[0] is the subcommand's name; parsing starts at argv[1]. */
void cli_parser_init(cli_parser *p, const char *cmd, int argc, char **argv);

/*
 * The next flag: its index in flags, or CLI_DONE / CLI_HELP / CLI_FAIL.
 * Accepts "--name value" and "--name=value". *value is the value for a flag
 * with a metavar, NULL for a switch. A positional argument, an unknown flag,
 * a missing value, or a value given to a switch is an error.
 */
int cli_next(cli_parser *p, const cli_flag *flags, const char **value);

/* The flag table as --help text. */
void cli_print_flags(FILE *out, const cli_flag *flags);

/*
 * Strict number parsing: the whole string must be the number (no leading
 * blanks, no trailing characters), and it must lie in range. On failure an
 * error naming the flag is printed and -1 returned; 0 on success.
 */
int cli_parse_int(const char *flag, const char *s, int min, int max, int *out);
int cli_parse_u64(const char *flag, const char *s, uint64_t *out);
/* lo/hi bound the value; lo_open/hi_open make that bound exclusive.
 * NaN and infinities are always rejected. */
int cli_parse_double(const char *flag, const char *s, double lo, int lo_open, double hi,
                     int hi_open, double *out);
/* A byte count: digits with an optional K, M, G or T suffix (powers of 1024,
 * either case, optionally followed by "B" or "iB"): "512M", "2GiB", "1048576". */
int cli_parse_size(const char *flag, const char *s, size_t *out);

/* Monotonic seconds. */
double cli_now(void);

#endif

/* Flag parsing for the castor command line: see args.h. */
#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void cli_errorf(const char *fmt, ...)
{
    /* As long as it takes: a message may name several paths of up to
     * CLI_PATH_MAX bytes, and its reason comes last. */
    char fallback[1024], *buf = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&buf, fmt, ap) < 0)
        buf = NULL;
    va_end(ap);
    if (!buf) {
        va_start(ap, fmt);
        vsnprintf(fallback, sizeof fallback, fmt, ap);
        va_end(ap);
    }
    char *msg = buf ? buf : fallback;
    /* one line, whatever the message carries */
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    for (char *c = msg; *c; c++)
        if (*c == '\n' || *c == '\r' || *c == '\t')
            *c = ' ';
    fflush(stdout);
    fprintf(stderr, "castor: %s\n", msg);
    fflush(stderr);
    free(buf);
}

void cli_parser_init(cli_parser *p, const char *cmd, int argc, char **argv)
{
    p->cmd = cmd;
    p->argc = argc;
    p->argv = argv;
    p->i = 1;
}

int cli_next(cli_parser *p, const cli_flag *flags, const char **value)
{
    *value = NULL;
    if (p->i >= p->argc)
        return CLI_DONE;
    const char *arg = p->argv[p->i++];
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0)
        return CLI_HELP;
    /* A switch of every command, though not in its table. */
    if (strncmp(arg, "--help=", 7) == 0) {
        cli_errorf("%s: --help takes no value", p->cmd);
        return CLI_FAIL;
    }
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
        if (arg[0] == '-' && arg[1] != '\0')
            cli_errorf("%s: unknown flag '%s' (see 'castor %s --help')", p->cmd, arg, p->cmd);
        else
            cli_errorf("%s: unexpected argument '%s' (see 'castor %s --help')", p->cmd, arg,
                       p->cmd);
        return CLI_FAIL;
    }
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    for (int k = 0; flags[k].name; k++) {
        if (strlen(flags[k].name) != len || strncmp(flags[k].name, name, len) != 0)
            continue;
        if (!flags[k].metavar) {
            if (eq) {
                cli_errorf("%s: --%s takes no value", p->cmd, flags[k].name);
                return CLI_FAIL;
            }
            return k;
        }
        const char *v;
        if (eq) {
            v = eq + 1;
        } else {
            if (p->i >= p->argc) {
                cli_errorf("%s: --%s needs a value (%s)", p->cmd, flags[k].name,
                           flags[k].metavar);
                return CLI_FAIL;
            }
            v = p->argv[p->i];
            if (strncmp(v, "--", 2) == 0 && v[2] != '\0') {
                cli_errorf("%s: --%s needs a value (%s), got the flag '%s'", p->cmd,
                           flags[k].name, flags[k].metavar, v);
                return CLI_FAIL;
            }
            p->i++;
        }
        if (*v == '\0') {
            cli_errorf("%s: --%s needs a value (%s), got an empty string", p->cmd,
                       flags[k].name, flags[k].metavar);
            return CLI_FAIL;
        }
        *value = v;
        return k;
    }
    cli_errorf("%s: unknown flag '--%.*s' (see 'castor %s --help')", p->cmd, (int)len, name,
               p->cmd);
    return CLI_FAIL;
}

void cli_print_flags(FILE *out, const cli_flag *flags)
{
    for (int k = 0; flags[k].name; k++) {
        fprintf(out, "  --%s%s%s\n", flags[k].name, flags[k].metavar ? " " : "",
                flags[k].metavar ? flags[k].metavar : "");
        const char *h = flags[k].help;
        while (*h) {
            const char *nl = strchr(h, '\n');
            size_t n = nl ? (size_t)(nl - h) : strlen(h);
            fprintf(out, "      %.*s\n", (int)n, h);
            if (!nl)
                break;
            h = nl + 1;
        }
        fprintf(out, "      (default: %s)\n", flags[k].def ? flags[k].def : "off");
    }
}

static int starts_like_number(const char *s)
{
    /* strtol/strtod skip leading blanks; we do not. */
    return s && *s && !isspace((unsigned char)*s);
}

int cli_parse_int(const char *flag, const char *s, int min, int max, int *out)
{
    if (!starts_like_number(s)) {
        cli_errorf("--%s '%s': not an integer", flag, s ? s : "");
        return -1;
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0') {
        cli_errorf("--%s '%s': not an integer", flag, s);
        return -1;
    }
    if (errno == ERANGE || v < (long)min || v > (long)max) {
        cli_errorf("--%s %s: must be between %d and %d", flag, s, min, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_parse_u64(const char *flag, const char *s, uint64_t *out)
{
    /* strtoull accepts "-1" and wraps it around: insist on a digit first,
     * after an optional '+' (as cli_parse_int takes "+5"). */
    if (!s || !isdigit((unsigned char)s[*s == '+'])) {
        cli_errorf("--%s '%s': not a non-negative integer", flag, s ? s : "");
        return -1;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0') {
        cli_errorf("--%s '%s': not a non-negative integer", flag, s);
        return -1;
    }
    if (errno == ERANGE) {
        cli_errorf("--%s %s: must be at most %llu", flag, s, (unsigned long long)UINT64_MAX);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_double(const char *flag, const char *s, double lo, int lo_open, double hi,
                     int hi_open, double *out)
{
    if (!starts_like_number(s)) {
        cli_errorf("--%s '%s': not a number", flag, s ? s : "");
        return -1;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0') {
        cli_errorf("--%s '%s': not a number", flag, s);
        return -1;
    }
    if (!isfinite(v) || (errno == ERANGE && fabs(v) > 1.0)) {
        cli_errorf("--%s %s: not a finite number", flag, s);
        return -1;
    }
    /* The library holds these values as floats: one that only a double can
     * tell from zero would pass here and fail later, after the data loads. */
    if (v != 0.0 && (float)v == 0.0f) {
        cli_errorf("--%s %s: too close to 0 for a 32-bit float", flag, s);
        return -1;
    }
    /* And in range as the float it becomes: 0.9999999999 is 1.0f. */
    double vf = (double)(float)v;
    int below = lo_open ? !(v > lo && vf > lo) : !(v >= lo && vf >= lo);
    int above = hi_open ? !(v < hi && vf < hi) : !(v <= hi && vf <= hi);
    if (below || above) {
        cli_errorf("--%s %s: must be %s %g and %s %g", flag, s, lo_open ? ">" : ">=", lo,
                   hi_open ? "<" : "<=", hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_size(const char *flag, const char *s, size_t *out)
{
    if (!s || !isdigit((unsigned char)*s)) {
        cli_errorf("--%s '%s': not a byte count (digits with an optional K/M/G/T suffix)", flag,
                   s ? s : "");
        return -1;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE) {
        cli_errorf("--%s %s: too large", flag, s);
        return -1;
    }
    unsigned shift = 0;
    const char *suf = end;
    switch (*suf) {
    case 'k': case 'K': shift = 10; suf++; break;
    case 'm': case 'M': shift = 20; suf++; break;
    case 'g': case 'G': shift = 30; suf++; break;
    case 't': case 'T': shift = 40; suf++; break;
    default: break;
    }
    if (shift && (strcmp(suf, "iB") == 0 || strcmp(suf, "ib") == 0))
        suf += 2;
    else if (strcmp(suf, "B") == 0 || strcmp(suf, "b") == 0)
        suf += 1;
    if (*suf != '\0') {
        cli_errorf("--%s '%s': not a byte count (digits with an optional K/M/G/T suffix)", flag,
                   s);
        return -1;
    }
    if (v > (unsigned long long)(SIZE_MAX >> shift)) {
        cli_errorf("--%s %s: too large", flag, s);
        return -1;
    }
    *out = (size_t)v << shift;
    return 0;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Small helpers over cJSON for the machine-readable output: see json.h. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"

int cli_json_add(cJSON *obj, const char *key, cJSON *item)
{
    if (!item)
        return -1;
    if (!cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

int cli_json_append(cJSON *array, cJSON *item)
{
    if (!item)
        return -1;
    if (!cJSON_AddItemToArray(array, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

int cli_json_num(cJSON *obj, const char *key, double v)
{
    return cli_json_add(obj, key, isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull());
}

/* Integers are written as their exact digits: cJSON prints a double with
 * 15 significant digits when that reads back within DBL_EPSILON of it, so
 * --seed 9007199254740991 came out as 9.00719925474099e+15, another seed. */
static int add_digits(cJSON *obj, const char *key, const char *digits)
{
    return cli_json_add(obj, key, cJSON_CreateRaw(digits));
}

int cli_json_u64(cJSON *obj, const char *key, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    /* Past 2^53 a string: most JSON readers hold numbers in doubles. */
    return v <= (UINT64_C(1) << 53) ? add_digits(obj, key, buf) : cli_json_str(obj, key, buf);
}

int cli_json_float(cJSON *obj, const char *key, float v)
{
    /* The shortest decimal that reads back as v: 0.001f is 0.001, not the
     * 0.0010000000474974513 its double value would print as. */
    if (isfinite(v)) {
        char buf[32];
        for (int digits = 1; digits <= 9; digits++) {
            snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
            if (strtof(buf, NULL) == v)
                return cli_json_num(obj, key, strtod(buf, NULL));
        }
    }
    return cli_json_num(obj, key, (double)v);
}

int cli_json_int(cJSON *obj, const char *key, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return add_digits(obj, key, buf);
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if none starts
 * there: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_sequence(const unsigned char *p)
{
    if (p[0] < 0x80)
        return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;  /* the allowed range of the second byte */
    if (p[0] >= 0xC2 && p[0] <= 0xDF)
        n = 2;
    else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
        n = 3;
        if (p[0] == 0xE0)
            lo = 0xA0;
        else if (p[0] == 0xED)
            hi = 0x9F;
    } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
        n = 4;
        if (p[0] == 0xF0)
            lo = 0x90;
        else if (p[0] == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* v with every byte that is not part of valid UTF-8 replaced by U+FFFD:
 * JSON text is UTF-8, and a path may be any bytes. malloc'd, or NULL. */
static char *utf8_clean(const char *v)
{
    size_t len = strlen(v);
    char *out = malloc(3 * len + 1);
    if (!out)
        return NULL;
    const unsigned char *p = (const unsigned char *)v;
    char *o = out;
    while (*p) {
        size_t n = utf8_sequence(p);
        if (n) {
            memcpy(o, p, n);
            o += n;
            p += n;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            p++;
        }
    }
    *o = '\0';
    return out;
}

int cli_json_str(cJSON *obj, const char *key, const char *v)
{
    char *clean = v ? utf8_clean(v) : NULL;
    if (v && !clean)
        return -1;
    cJSON *item = clean ? cJSON_CreateString(clean) : cJSON_CreateNull();
    free(clean);
    return cli_json_add(obj, key, item);
}

int cli_json_bool(cJSON *obj, const char *key, int v)
{
    return cJSON_AddBoolToObject(obj, key, v ? 1 : 0) ? 0 : -1;
}

int cli_json_print_line(const cJSON *obj)
{
    char *text = cJSON_PrintUnformatted(obj);
    if (!text)
        return -1;
    int rc = (puts(text) < 0 || fflush(stdout) != 0) ? -1 : 0;
    cJSON_free(text);
    return rc;
}

int cli_json_emit(cJSON *obj, int failed, const char *cmd)
{
    const char *sep = cmd ? ": " : "";
    if (!obj || failed) {
        cJSON_Delete(obj);
        cli_errorf("%s%sout of memory writing the results", cmd ? cmd : "", sep);
        return CLI_EXIT_RUNTIME;
    }
    int rc = cli_json_print_line(obj);
    cJSON_Delete(obj);
    if (rc != 0) {
        cli_errorf("%s%scannot write the results to stdout", cmd ? cmd : "", sep);
        return CLI_EXIT_RUNTIME;
    }
    return 0;
}

/* Small helpers over cJSON for the machine-readable output (--json). */
#ifndef CASTOR_CLI_JSON_H
#define CASTOR_CLI_JSON_H

#include <stdint.h>

#include <cjson/cJSON.h>

/* Add a number; NaN and infinities become null (JSON has no NaN).
 * Return 0, or -1 when out of memory. */
int cli_json_num(cJSON *obj, const char *key, double v);
int cli_json_int(cJSON *obj, const char *key, int64_t v);
/* A number while a double holds it exactly (up to 2^53), else a string of
 * its digits (a seed, say), so that no digit is lost. */
int cli_json_u64(cJSON *obj, const char *key, uint64_t v);
/* A float as the shortest decimal that reads back as the same float. */
int cli_json_float(cJSON *obj, const char *key, float v);
int cli_json_str(cJSON *obj, const char *key, const char *v);
int cli_json_bool(cJSON *obj, const char *key, int v);
/* Add item under key to obj (cli_json_add) or at the end of array
 * (cli_json_append); item NULL (creating it failed) or a failed add gives
 * -1, and item is freed: nothing is lost or leaked on the way out. */
int cli_json_add(cJSON *obj, const char *key, cJSON *item);
int cli_json_append(cJSON *array, cJSON *item);
/* Print obj as one line on stdout; 0, or -1 on failure. */
int cli_json_print_line(const cJSON *obj);

/*
 * The last step of every --json report: print obj as one line and free it.
 * failed (or obj NULL) means building it ran out of memory. Errors are
 * printed here, prefixed "CMD: " when cmd is not NULL; returns 0 or
 * CLI_EXIT_RUNTIME. One place, so that every command fails the same way.
 */
int cli_json_emit(cJSON *obj, int failed, const char *cmd);

#endif

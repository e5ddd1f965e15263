/* Small helpers over cJSON for the machine-readable output: see json.h. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "args.h"

int cli_json_num(cJSON *obj, const char *key, double v)
{
    cJSON *item = isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull();
    if (!item)
        return -1;
    if (!cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

int cli_json_int(cJSON *obj, const char *key, int64_t v)
{
    /* cJSON numbers are doubles: exact up to 2^53, which covers counts of
     * bytes, steps and samples. */
    return cli_json_num(obj, key, (double)v);
}

int cli_json_str(cJSON *obj, const char *key, const char *v)
{
    cJSON *item = v ? cJSON_CreateString(v) : cJSON_CreateNull();
    if (!item)
        return -1;
    if (!cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
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

/* castor info: the version, the build's features, the CPU and the GPUs. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "castor.h"
#include "host/cores.h"
#include "args.h"
#include "cli.h"
#include "common.h"
#include "json.h"

enum { F_JSON, F_COUNT };

static const cli_flag info_flags[F_COUNT + 1] = {
    [F_JSON] = {"json", NULL, NULL, "print one JSON object instead of text"},
    [F_COUNT] = {NULL, NULL, NULL, NULL},
};

void castor_cli_info_usage(FILE *out)
{
    fprintf(out,
            "usage: castor info [--json]\n"
            "\n"
            "Show castor's version, the features compiled into this build, the CPU\n"
            "cores it may run on (taskset, a container's cpuset or its CPU quota\n"
            "may allow fewer than are online), and every GPU this build can use\n"
            "(name, memory, compute capability, PCI bus id), or why there is none.\n"
            "\n"
            "flags:\n");
    cli_print_flags(out, info_flags);
    fprintf(out, "  -h, --help\n      show this help\n");
}

/* The CPU's model name from /proc/cpuinfo, or "" where there is none. */
static void cpu_model(char *buf, size_t size)
{
    buf[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *colon = strchr(line, ':');
        if (!colon)
            continue;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        snprintf(buf, size, "%s", colon);
        size_t n = strlen(buf);
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
            buf[--n] = '\0';
        break;
    }
    fclose(f);
}

static double gib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

static int info_json(long cores, long online, const char *model)
{
    int rc = CLI_EXIT_RUNTIME;
    cJSON *root = cJSON_CreateObject();
    cJSON *gpus = NULL;
    if (!root)
        goto oom;
    if (cli_json_str(root, "version", castor_version()) ||
        cli_json_str(root, "features", castor_build_features()) ||
        cli_json_int(root, "cpu_cores", cores) || cli_json_int(root, "cpu_cores_online", online) ||
        cli_json_str(root, "cpu_model", model))
        goto oom;
    const char *why = NULL;
    int count = castor_cuda_device_count(&why);
    gpus = cJSON_AddArrayToObject(root, "gpus");
    if (!gpus)
        goto oom;
    for (int i = 0; i < count; i++) {
        castor_device_info info;
        memset(&info, 0, sizeof info);
        cJSON *g = cJSON_CreateObject();
        if (!g)
            goto oom;
        cJSON_AddItemToArray(gpus, g);
        int st = castor_cuda_device_info(i, &info);
        if (cli_json_int(g, "ordinal", i))
            goto oom;
        if (st != CASTOR_OK) {
            if (cli_json_str(g, "error", castor_errstr(st)))
                goto oom;
            continue;
        }
        char cc[32];
        snprintf(cc, sizeof cc, "%d.%d", info.compute_major, info.compute_minor);
        if (cli_json_str(g, "name", info.name) ||
            cli_json_int(g, "memory_bytes", (int64_t)info.total_memory) ||
            cli_json_str(g, "compute_capability", cc) ||
            cli_json_str(g, "pci_bus_id", info.pci_bus_id))
            goto oom;
    }
    if (count <= 0 && cli_json_str(root, "no_gpu_reason", why ? why : "unknown"))
        goto oom;
    if (cli_json_print_line(root) == 0)
        rc = CLI_EXIT_OK;
    else
        cli_errorf("info: cannot write the output");
    cJSON_Delete(root);
    return rc;
oom:
    cJSON_Delete(root);
    cli_errorf("info: out of memory");
    return CLI_EXIT_RUNTIME;
}

int castor_cli_info(int argc, char **argv)
{
    int json = 0;
    cli_parser p;
    cli_parser_init(&p, "info", argc, argv);
    for (;;) {
        const char *value;
        int f = cli_next(&p, info_flags, &value);
        if (f == CLI_DONE)
            break;
        if (f == CLI_HELP) {
            castor_cli_info_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (f == CLI_FAIL)
            return CLI_EXIT_USAGE;
        if (f == F_JSON)
            json = 1;
    }

    /* The cores castor's threads may run on, as the library and castor
     * bench count them (bench.json's cpu_cores): under taskset, a
     * container's cpuset or its CPU quota fewer than are online. */
    long cores = castor__cpu_count(), online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < cores)
        online = cores;
    char model[256];
    cpu_model(model, sizeof model);
    if (json)
        return info_json(cores, online, model);

    printf("castor %s\n", castor_version());
    printf("features: %s\n", castor_build_features());
    char of[64] = "";
    if (online != cores)
        snprintf(of, sizeof of, " of the %ld online", online);
    printf("cpu: %ld core%s%s%s%s%s\n", cores, cores == 1 ? "" : "s", of, model[0] ? " (" : "",
           model, model[0] ? ")" : "");

    const char *why = NULL;
    int count = castor_cuda_device_count(&why);
    if (count <= 0) {
        printf("no GPU: %s\n", why && why[0] ? why : "none found");
        return cli_flush_results("info");
    }
    printf("gpus: %d\n", count);
    for (int i = 0; i < count; i++) {
        castor_device_info info;
        memset(&info, 0, sizeof info);
        int st = castor_cuda_device_info(i, &info);
        if (st != CASTOR_OK) {
            printf("  cuda:%d  (no details: %s)\n", i, castor_errstr(st));
            continue;
        }
        printf("  cuda:%d  %s  %.1f GiB  compute %d.%d  pci %s\n", i, info.name,
               gib(info.total_memory), info.compute_major, info.compute_minor,
               info.pci_bus_id[0] ? info.pci_bus_id : "?");
    }
    return cli_flush_results("info");
}

/* Pieces shared by train, eval and predict: see common.h. */
#include "common.h"

#include <cblas.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "ckpt.h"
#include "host/cores.h"
#include "src/dataset.h"
#include "src/device_list.h"

const char *cli_data_dir(const char *data)
{
    if (strcmp(data, "fashion-mnist") != 0)
        return data;
    const char *env = getenv("CASTOR_FASHION_MNIST");
    return env && env[0] ? env : CLI_DEFAULT_FASHION_MNIST;
}

/* Emulated CPU replicas named by a --devices list, read by the library's
 * own parser; 0 for a list it refuses (it says why when it opens them). */
static long cpu_replicas(const char *devices)
{
    castor__device_entry entries[CASTOR__MAX_REPLICAS];
    int n = 0;
    long total = 0;
    if (castor__device_list_parse(devices, entries, &n, NULL, 0) != CASTOR_OK)
        return 0;
    for (int i = 0; i < n; i++)
        total += entries[i].cuda ? 0 : (long)entries[i].replicas * entries[i].shared;
    return total;
}

/* Whether the environment sets OpenBLAS's thread count, read as OpenBLAS
 * reads it (driver/others/openblas_env.c): the first of these that atoi
 * gives a positive count. An empty or zero value is no setting there. */
static int blas_threads_from_env(void)
{
    static const char *const names[] = {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                                        "OMP_NUM_THREADS"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && atoi(v) > 0)
            return 1;
    }
    return 0;
}

int cli_blas_threads(const char *devices)
{
    long replicas = cpu_replicas(devices);
    if (replicas <= 0 || blas_threads_from_env())
        return 0;
    /* The cores this process may run on (taskset, a container's cpuset or
     * CPU quota), as the library counts them: not every core online. */
    long threads = castor__cpu_count() / replicas;
    if (threads < 1)
        threads = 1;
    if (threads > 1024)
        threads = 1024;
    /* OpenBLAS's pool is process-wide: every CPU replica's GEMMs at once with
     * a thread per core each would oversubscribe the cores, so share them. */
    openblas_set_num_threads((int)threads);
    return (int)threads;
}

int cli_blas_threads_in_use(const char *devices)
{
    return cpu_replicas(devices) > 0 ? openblas_get_num_threads() : 0;
}

const char *cli_why(const char *msg, int rc)
{
    return msg && msg[0] ? msg : castor_errstr(rc);
}

const char *cli_about_file(const char *msg, const char *path)
{
    size_t n = strlen(path);
    if (msg && strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ' && msg[n + 2])
        return msg + n + 2;
    return msg;
}

int cli_exit_for(int rc)
{
    return rc == CASTOR_INVALID || rc == CASTOR_MISMATCH ? CLI_EXIT_USAGE : CLI_EXIT_RUNTIME;
}

void cli_log_stderr(void *user, castor_log_level level, const char *message)
{
    (void)user;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    if (level == CASTOR_LOG_ERROR)
        return;
    fprintf(stderr, "castor: %s: %s\n", (unsigned)level < 4 ? names[level] : "log",
            message ? message : "");
}

int cli_check_labels(const castor_dataset *ds, int units, const char *which, const char *where,
                     const char *what, const char *why)
{
    if (!ds || !castor_dataset_labels(ds))
        return 0;
    size_t n = castor_dataset_size(ds), first = n;
    const int32_t *labels = castor_dataset_labels(ds);
    int32_t top = 0;
    for (size_t i = 0; i < n; i++) {
        if ((labels[i] < 0 || labels[i] >= units) && first == n)
            first = i;
        if (labels[i] > top)
            top = labels[i];
    }
    if (first == n)
        return 0;
    /* The first sample past the units says where to look; the largest
     * class, how many units the data needs. */
    char up_to[64] = "";
    if (top != labels[first])
        snprintf(up_to, sizeof up_to, ", classes up to %d", (int)top);
    cli_errorf("%s: the %s set%s%s has class %d (sample %zu%s) but the last layer has %d unit%s "
               "(%s)",
               what, which, where ? " in " : "", where ? where : "", (int)labels[first], first,
               up_to, units, units == 1 ? "" : "s", why);
    return CLI_EXIT_USAGE;
}

int cli_one_hot_targets(castor_dataset **ds, int units, const char *which, const char *where,
                        const char *what)
{
    if (!*ds || !castor_dataset_labels(*ds))
        return 0;
    int rc = cli_check_labels(*ds, units, which, where, what,
                              "one-hot targets need one per class");
    if (rc)
        return rc;
    /* In place: a copy of the samples would double the data's memory. */
    rc = castor__dataset_one_hot(*ds, units);
    if (rc != CASTOR_OK) {
        cli_errorf("%s: cannot make the %s set's one-hot targets: %s", what, which,
                   cli_why(castor_dataset_errmsg(*ds), rc));
        return CLI_EXIT_RUNTIME;
    }
    return 0;
}

cli_data_kind cli_data_kind_of(const castor_dataset *ds)
{
    cli_data_kind k;
    memset(&k, 0, sizeof k);
    k.rank = castor__dataset_sample_shape(ds, k.dims, &k.type);
    return k;
}

void cli_shape_text(const cli_data_kind *k, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int d = 0; d < k->rank && d < 3 && at < size; d++) {
        int n = snprintf(buf + at, size - at, "%s%lu", d ? "x" : "", (unsigned long)k->dims[d]);
        if (n < 0)
            break;
        at += (size_t)n;
    }
}

static const char *type_text(int type)
{
    switch (type) {
    case 0x08: return "unsigned bytes, scaled to [0,1]";
    case 0x09: return "signed bytes, taken as they are";
    case 0x0B: return "16-bit integers, taken as they are";
    case 0x0C: return "32-bit integers, taken as they are";
    case 0x0D: return "float32 values, taken as they are";
    case 0x0E: return "float64 values, taken as they are";
    default: return "values of an unknown type";
    }
}

int cli_check_data_kind(const castor_dataset *ds, const char *which, const char *dir,
                        const cli_data_kind *ref, const char *ref_has)
{
    cli_data_kind k = cli_data_kind_of(ds);
    if (k.type && ref->type && (k.type == 0x08) != (ref->type == 0x08)) {
        cli_errorf("the %s set in %s holds %s, where %s %s: the model would see its samples "
                   "on another scale",
                   which, dir, type_text(k.type), ref_has, type_text(ref->type));
        return CLI_EXIT_USAGE;
    }
    /* A side with fewer than two dimensions other than 1 is a flat vector:
     * no layout to differ in (64, 1x64 and 64x1 are one). */
    int k_dims = 0, ref_dims = 0;
    for (int d = 0; d < k.rank && d < 3; d++)
        k_dims += k.dims[d] != 1;
    for (int d = 0; d < ref->rank && d < 3; d++)
        ref_dims += ref->dims[d] != 1;
    if (k_dims < 2 || ref_dims < 2)
        return 0;
    uint64_t count = 1, ref_count = 1;
    for (int d = 0; d < k.rank && d < 3; d++)
        count *= k.dims[d];
    for (int d = 0; d < ref->rank && d < 3; d++)
        ref_count *= ref->dims[d];
    if (count != ref_count)  /* other features: the caller's message says so */
        return 0;
    /* The same layout but for dimensions of 1 (1x28x28, one channel, and
     * 28x28 hold their values in the same order) is the same data. */
    int a = 0, b = 0;
    for (;;) {
        while (a < k.rank && a < 3 && k.dims[a] == 1)
            a++;
        while (b < ref->rank && b < 3 && ref->dims[b] == 1)
            b++;
        int a_end = a >= k.rank || a >= 3, b_end = b >= ref->rank || b >= 3;
        if (a_end || b_end) {
            if (a_end && b_end)
                return 0;
            break;
        }
        if (k.dims[a++] != ref->dims[b++])
            break;
    }
    char shape[64], ref_shape[64];
    cli_shape_text(&k, shape, sizeof shape);
    cli_shape_text(ref, ref_shape, sizeof ref_shape);
    cli_errorf("the %s set in %s has samples of %s where %s %s: the same %llu features in "
               "another layout, not the same kind of data",
               which, dir, shape, ref_has, ref_shape, (unsigned long long)count);
    return CLI_EXIT_USAGE;
}

int cli_flush_results(const char *cmd)
{
    if (fflush(stdout) == 0)
        return 0;
    cli_errorf("%s%scannot write the results to stdout", cmd ? cmd : "", cmd ? ": " : "");
    return CLI_EXIT_RUNTIME;
}

int cli_mkdir_p(const char *dir, char *made, size_t made_len, char *err, size_t errlen)
{
    char path[CLI_PATH_MAX];
    if (made && made_len)
        made[0] = '\0';
    int n = snprintf(path, sizeof path, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof path) {
        snprintf(err, errlen, "%s: path too long", dir);
        return -1;
    }
    /* Each parent in turn, then the directory itself. */
    for (char *c = path + 1;; c++) {
        if (*c != '/' && *c != '\0')
            continue;
        char keep = *c;
        *c = '\0';
        if (mkdir(path, 0777) == 0) {
            if (made && made_len && !made[0])
                snprintf(made, made_len, "%s", path);
        } else if (errno != EEXIST) {
            snprintf(err, errlen, "cannot create the directory %s: %s", path, strerror(errno));
            return -1;
        }
        *c = keep;
        if (keep == '\0')
            break;
        while (c[1] == '/')
            c++;
    }
    struct stat st;
    if (stat(dir, &st) != 0) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a directory", dir);
        return -1;
    }
    return 0;
}

void cli_rmdir_made(const char *dir, const char *made)
{
    char path[CLI_PATH_MAX];
    if (!made || !made[0] || snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return;
    /* made is a prefix of dir as cli_mkdir_p spelled it, ending at a
     * component: walk up from dir, a component at a time, down to it. */
    size_t n = strlen(path), made_n = strlen(made);
    for (;;) {
        while (n > 1 && path[n - 1] == '/')
            path[--n] = '\0';
        if (n < made_n || rmdir(path) != 0 || n == made_n)
            return;
        while (n > 0 && path[n - 1] != '/')
            n--;
        path[n] = '\0';
    }
}

#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *support_fashion_dir(void)
{
    const char *env = getenv("CASTOR_FASHION_MNIST");
    const char *dir = env && *env ? env : "/usr/share/datasets/fashion-mnist";
    char path[4096];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", dir);
        if (stat(path, &st) != 0)
            return NULL;
    }
    return dir;
}

char *support_tmpdir(void)
{
    char tmpl[] = "/tmp/castor-test-XXXXXX";
    char *dir = mkdtemp(tmpl);
    return dir ? strdup(dir) : NULL;
}

void support_rmrf(const char *path)
{
    if (!path)
        return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) {
        /* best effort: a leftover temp dir is not a test failure */
    }
}

int support_write_file(const char *path, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = len ? fwrite(bytes, 1, len, f) : 0;
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

double support_max_rel_err(const float *a, const float *b, size_t n, double floor, size_t *where)
{
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double den = fabs((double)b[i]);
        if (den < floor)
            den = floor;
        double e = fabs((double)a[i] - (double)b[i]) / den;
        if (e > worst || isnan(e)) {
            worst = isnan(e) ? INFINITY : e;
            at = i;
        }
    }
    if (where)
        *where = at;
    return worst;
}

#include "support.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <limits.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "castor.h"
#include "src/rng.h"

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
    const char *tmp = getenv("TMPDIR");
    char tmpl[PATH_MAX];
    if (snprintf(tmpl, sizeof tmpl, "%s/castor-test-XXXXXX", tmp && tmp[0] ? tmp : "/tmp") >=
        (int)sizeof tmpl)
        return NULL;
    char *dir = mkdtemp(tmpl);
    return dir ? strdup(dir) : NULL;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Best effort: a leftover temporary directory is not a test failure. No
 * shell, so any character in the path is fine. */
void support_rmrf(const char *path)
{
    if (path)
        (void)nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
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

char *support_dir;

void support_dir_init(void)
{
    support_dir = support_tmpdir();
    cr_assert(support_dir, "no temporary directory");
}

void support_dir_fini(void)
{
    support_rmrf(support_dir);
    free(support_dir);
    support_dir = NULL;
}

const char *support_path_in(char *buf, const char *name)
{
    snprintf(buf, SUPPORT_PATH_LEN, "%s/%s", support_dir, name);
    return buf;
}

const char *support_write_in(char *path, const char *name, const void *bytes, size_t len)
{
    support_path_in(path, name);
    cr_assert_eq(support_write_file(path, bytes, len), 0, "cannot write %s", path);
    return path;
}

size_t support_put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return 4;
}

unsigned char *support_gzip(const void *bytes, size_t len, size_t *out_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    cr_assert_eq(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&zs, (uLong)len) + 64;
    unsigned char *out = malloc(cap);
    cr_assert(out);
    zs.next_in = (Bytef *)(uintptr_t)bytes;
    zs.avail_in = (uInt)len;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    cr_assert_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
    *out_len = cap - zs.avail_out;
    deflateEnd(&zs);
    return out;
}

castor_dataset *support_synthetic(uint64_t seed, int n, int features, int classes)
{
    float *x = malloc(sizeof(float) * (size_t)n * (size_t)features);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    cr_assert(x && y, "out of host memory");
    castor__rng rng;
    castor__rng_seed(&rng, seed, 9, 0);
    for (int i = 0; i < n; i++) {
        y[i] = (int32_t)castor__rng_below(&rng, (uint64_t)classes);
        for (int j = 0; j < features; j++)
            x[(size_t)i * features + j] =
                castor__rng_uniform(&rng) + (j % classes == y[i] ? 0.7f : 0.0f);
    }
    castor_dataset *ds = NULL;
    cr_assert_eq(castor_dataset_from_memory(&ds, x, (size_t)n, features, y, NULL, 0), CASTOR_OK);
    free(x);
    free(y);
    return ds;
}

size_t support_idx_build(unsigned char *buf, int type, int rank, const uint32_t *dims,
                         const void *payload, size_t payload_len)
{
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = (unsigned char)type;
    buf[3] = (unsigned char)rank;
    size_t p = 4;
    for (int i = 0; i < rank; i++)
        p += support_put_be32(buf + p, dims[i]);
    if (payload_len)
        memcpy(buf + p, payload, payload_len);
    return p + payload_len;
}

size_t support_idx_build_ubyte(unsigned char *buf, int rank, const uint32_t *dims,
                               size_t data_len)
{
    size_t p = support_idx_build(buf, 0x08, rank, dims, NULL, 0);
    for (size_t i = 0; i < data_len; i++)
        buf[p++] = (unsigned char)(i * 7);
    return p;
}

const char *support_write_gz_in(char *path, const char *name, const void *bytes, size_t len)
{
    size_t gz_len;
    unsigned char *gz = support_gzip(bytes, len, &gz_len);
    support_write_in(path, name, gz, gz_len);
    free(gz);
    return path;
}

double support_activation(castor_activation a, double z)
{
    switch (a) {
    case CASTOR_ACT_RELU: return z > 0 ? z : 0;
    case CASTOR_ACT_TANH: return tanh(z);
    case CASTOR_ACT_SIGMOID: return 1.0 / (1.0 + exp(-z));
    default: return z;
    }
}

castor_model *support_central_model(castor_strategy **s, const char *devices, int features,
                                    const char *layers, uint64_t seed)
{
    cr_assert_eq(castor_strategy_create(s, CASTOR_STRATEGY_CENTRAL, devices, NULL), CASTOR_OK);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, features), CASTOR_OK);
    cr_assert_eq(castor_model_add_layers(m, layers), CASTOR_OK);
    cr_assert_eq(castor_model_compile(m, *s, CASTOR_LOSS_SOFTMAX_XENT, NULL, seed), CASTOR_OK);
    return m;
}

/* Helpers shared by the Criterion suites. */
#ifndef CASTOR_TEST_SUPPORT_H
#define CASTOR_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#include "castor.h"

/* Directory holding the Fashion-MNIST IDX files (env CASTOR_FASHION_MNIST or
 * the Debian location); NULL if absent. */
const char *support_fashion_dir(void);
/* A fresh temporary directory (removed by the caller with support_rmrf). */
char *support_tmpdir(void);
void support_rmrf(const char *path);
/* A temporary directory per test, for suites that write files: give the
 * suite .init = support_dir_init, .fini = support_dir_fini. */
extern char *support_dir;
void support_dir_init(void);
void support_dir_fini(void);
/* support_dir/name into buf (SUPPORT_PATH_LEN bytes); returns buf. */
#define SUPPORT_PATH_LEN 4200
const char *support_path_in(char *buf, const char *name);
/* Writes bytes to support_dir/name, its path in path (SUPPORT_PATH_LEN
 * bytes); fails the test if it cannot. Returns path. */
const char *support_write_in(char *path, const char *name, const void *bytes, size_t len);
/* An IDX file in buf: the header for `type` (0x08 ubyte, 0x0D float, ...)
 * and dims, then payload_len bytes of payload (none if NULL); its length. */
size_t support_idx_build(unsigned char *buf, int type, int rank, const uint32_t *dims,
                         const void *payload, size_t payload_len);
/* A ubyte IDX file: the header, then data_len bytes counting by 7. */
size_t support_idx_build_ubyte(unsigned char *buf, int rank, const uint32_t *dims,
                               size_t data_len);
/* bytes gzipped into support_dir/name, its path in path (SUPPORT_PATH_LEN
 * bytes); returns path. */
const char *support_write_gz_in(char *path, const char *name, const void *bytes, size_t len);
/* v big-endian into p[0..4); returns 4. */
size_t support_put_be32(unsigned char *p, uint32_t v);
/* bytes as one gzip member, in a malloc'd buffer of *out_len bytes. */
unsigned char *support_gzip(const void *bytes, size_t len, size_t *out_len);
/* Write bytes to a file; returns 0 on success. */
int support_write_file(const char *path, const void *bytes, size_t len);
/* n samples of `features` values in `classes` classes, each class lifting
 * the features j with j % classes == class by 0.7 over uniform noise; the
 * same for the same seed. */
struct castor_dataset;
struct castor_dataset *support_synthetic(uint64_t seed, int n, int features, int classes);
/* A model of `features` inputs and `layers` (softmax cross-entropy, default
 * SGD), compiled central on `devices` with `seed`; *s its strategy. */
castor_model *support_central_model(castor_strategy **s, const char *devices, int features,
                                    const char *layers, uint64_t seed);
/* Largest |a-b| / max(|b|, floor), and the index where it is. */
double support_max_rel_err(const float *a, const float *b, size_t n, double floor, size_t *where);
/* An activation's value at z, in double: the references' forward pass. */
double support_activation(castor_activation a, double z);

#endif

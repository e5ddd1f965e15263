/* Helpers shared by the Criterion suites. */
#ifndef CASTOR_TEST_SUPPORT_H
#define CASTOR_TEST_SUPPORT_H

#include <stddef.h>

/* Directory holding the Fashion-MNIST IDX files (env CASTOR_FASHION_MNIST or
 * the Debian location); NULL if absent. */
const char *support_fashion_dir(void);
/* A fresh temporary directory (removed by the caller with support_rmrf). */
char *support_tmpdir(void);
void support_rmrf(const char *path);
/* Write bytes to a file; returns 0 on success. */
int support_write_file(const char *path, const void *bytes, size_t len);
/* Largest |a-b| / max(|b|, floor), and the index where it is. */
double support_max_rel_err(const float *a, const float *b, size_t n, double floor, size_t *where);

#endif

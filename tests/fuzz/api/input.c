/*
 * The input, read a byte at a time: each byte picks a call or an argument, and
 * past the end every read is 0, so that any input is a whole run.
 */
#include "tests/fuzz/api/harness.h"

static const uint8_t *in_p;
static size_t in_n, in_i;

void input_start(const uint8_t *data, size_t size)
{
    in_p = data;
    in_n = size;
    in_i = 0;
}

int input_left(void)
{
    return in_i < in_n;
}


unsigned u8(void)
{
    return in_i < in_n ? in_p[in_i++] : 0;
}

int pick(int n)
{
    return (int)(u8() % (unsigned)n);
}

uint64_t u64(void)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)u8() << (8 * i);
    return v;
}

/* A value in [-1, 1]. */
float unit(void)
{
    return (float)((int)u8() - 128) / 128.0f;
}

/*
 * The emulated device's streams, held to CUDA's rules rather than to what a
 * synchronous emulation happens to allow.
 *
 * Work is queued, not run: it runs when the host synchronizes (or frees
 * memory), in an order that the streams and events allow, the copy streams
 * first. So a host that reads a copy's destination before synchronizing
 * reads what was there before, and one that changes a copy's source
 * before synchronizing sends the new bytes, on every run, as a GPU may.
 *
 * And every operation names the memory it reads and writes: one that
 * touches bytes that an operation on another stream wrote (or reads bytes
 * it writes) with no event ordering the two is refused when it is queued,
 * with CASTOR_MISUSE naming both. Vector clocks decide "ordered": each
 * stream knows how far into every other stream its waits have taken it.
 * This is how code that is only ever run on emulated devices is kept honest
 * about the stream_wait a GPU needs.
 */
#ifndef CASTOR_CPU_STREAMS_H
#define CASTOR_CPU_STREAMS_H

#include <stddef.h>
#include <stdint.h>

#include "device/device.h"

/* A queued operation: its function and its arguments, by value (as a
 * kernel launch captures them). */
typedef struct castor__cpu_op castor__cpu_op;
typedef int (*castor__cpu_run_fn)(cdev *dev, const castor__cpu_op *op);

#define CASTOR__CPU_OP_ARGS 96

struct castor__cpu_op {
    castor__cpu_run_fn run;  /* NULL: a wait for wait_stream to reach wait_seq */
    const char *name;
    int wait_stream;
    uint64_t wait_seq;
    _Alignas(max_align_t) unsigned char args[CASTOR__CPU_OP_ARGS];
};

/* Memory an operation reads or writes: [ptr, ptr + bytes). */
typedef struct castor__cpu_access {
    const void *ptr;
    size_t bytes;
    int write;
} castor__cpu_access;

/* Where an event was recorded: the stream, how much of it was queued, and
 * what that stream had been ordered after. */
struct cdev_event {
    const cdev *dev;
    int recorded;
    int stream;
    uint64_t seq;
    uint64_t clock[CDEV_NUM_STREAMS];
};

typedef struct castor__cpu_streams castor__cpu_streams;

castor__cpu_streams *castor__cpu_streams_new(void);
/* Drops whatever is still queued, unrun. */
void castor__cpu_streams_free(castor__cpu_streams *st);
/* Entries queued and not yet run, on every stream (the tests ask it). */
size_t castor__cpu_streams_pending(const castor__cpu_streams *st);

/*
 * Queue op on stream after checking its accesses against every operation
 * queued since the last synchronize: CASTOR_MISUSE (nothing queued) for an
 * access unordered against a conflicting one on another stream, or
 * CASTOR_NOMEM.
 */
int castor__cpu_streams_enqueue(cdev *dev, castor__cpu_streams *st, int stream,
                                const castor__cpu_op *op, const castor__cpu_access *acc,
                                int n_acc);
void castor__cpu_streams_record(castor__cpu_streams *st, int stream, cdev_event *ev);
/* stream's later work waits for what ev marks (nothing if never recorded). */
int castor__cpu_streams_wait(cdev *dev, castor__cpu_streams *st, int stream,
                             const cdev_event *ev);
/* Run everything queued; the first failure (of this run or one kept from a
 * run forced by castor__cpu_streams_flush) is returned, its message in
 * dev->errmsg, and the work queued after it is dropped. */
int castor__cpu_streams_sync(cdev *dev, castor__cpu_streams *st);
/* Run everything queued, keeping a failure for the next sync: what freeing
 * memory does, since a free cannot fail (cudaFree waits for the device too). */
void castor__cpu_streams_flush(cdev *dev, castor__cpu_streams *st);

#endif

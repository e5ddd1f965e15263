/* Replacing a file whole or not at all: see atomic_file.h. */
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "castor.h"
#include "util.h"

#define TMP_SUFFIX CASTOR__ATOMIC_TMP_SUFFIX

/* Fill the six X's after tmp[prefix_len] + ".tmp." and create the file
 * exclusively (mkstemp would make it 0600 whatever the umask says). */
static int create_temporary(char *tmp, size_t prefix_len, mode_t mode)
{
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    char *x = tmp + prefix_len + 5;
    for (int attempt = 0; attempt < 1000; attempt++) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
            /* No entropy yet: time, process and attempt, mixed (splitmix64).
             * O_EXCL keeps a guessed name from doing harm. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 42) ^
                (uint64_t)(uintptr_t)&ts ^ ((uint64_t)attempt << 20);
            r += 0x9E3779B97F4A7C15ull;
            r = (r ^ (r >> 30)) * 0xBF58476D1CE4E5B9ull;
            r = (r ^ (r >> 27)) * 0x94D049BB133111EBull;
            r ^= r >> 31;
        }
        for (int i = 0; i < 6; i++, r /= 62)
            x[i] = digits[r % 62];
        int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

static void release(castor__atomic_file *af)
{
    if (af->fd >= 0)
        close(af->fd);
    af->fd = -1;
    free(af->path);
    free(af->tmp);
    free(af->dir);
    af->path = af->tmp = af->dir = NULL;
}

int castor__atomic_abort(castor__atomic_file *af, const char *what, char *err, size_t errlen)
{
    int e = errno;
    char eb[128];
    if (af->fd >= 0) {
        close(af->fd);
        af->fd = -1;
    }
    if (af->created)
        unlink(af->tmp);
    /* The reason before the temporary file's name, which matters less. */
    if (what)
        castor__errf(err, errlen, "%s: %s: %s (the temporary file %s)", af->path, what,
                     castor__strerror(e, eb, sizeof eb), af->tmp);
    release(af);
    return CASTOR_IO;
}

char *castor__atomic_target(const char *path, int *rc, char *err, size_t errlen)
{
    char eb[128];
    char *cur = strdup(path);
    if (!cur) {
        *rc = CASTOR_NOMEM;
        castor__errf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    /* 40, SYMLOOP_MAX on Linux: open() follows as many and fails on one
     * more, so the path after the 40th is still looked at. */
    for (int hops = 0;; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode))
            return cur;
        if (hops == 40)
            break;
        char target[PATH_MAX];
        ssize_t n = readlink(cur, target, sizeof target);
        if (n < 0 || (size_t)n >= sizeof target) {
            int e = n < 0 ? errno : ENAMETOOLONG;
            castor__errf(err, errlen, "%s: cannot read the symbolic link %s: %s", path, cur,
                         castor__strerror(e, eb, sizeof eb));
            free(cur);
            *rc = CASTOR_IO;
            return NULL;
        }
        target[n] = '\0';
        const char *slash = strrchr(cur, '/');
        size_t keep = target[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
        char *next = malloc(keep + (size_t)n + 1);
        if (!next) {
            free(cur);
            *rc = CASTOR_NOMEM;
            castor__errf(err, errlen, "%s: out of memory", path);
            return NULL;
        }
        memcpy(next, cur, keep);
        memcpy(next + keep, target, (size_t)n + 1);
        free(cur);
        cur = next;
    }
    castor__errf(err, errlen, "%s: %s", path, castor__strerror(ELOOP, eb, sizeof eb));
    free(cur);
    *rc = CASTOR_IO;
    return NULL;
}

/* castor__atomic_begin once the path is no symbolic link. */
static int begin_at(castor__atomic_file *af, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            castor__errf(err, errlen, "%s: is a directory", path);
            return CASTOR_IO;
        }
        if (!S_ISREG(st.st_mode)) {
            castor__errf(err, errlen, "%s: exists and is not a regular file", path);
            return CASTOR_IO;
        }
        /* The temporary file is made 0600, so that no one the old file
         * does not allow can open it meanwhile, then given them. */
        af->mode = st.st_mode & 07777;
        af->keep_mode = 1;
    }
    size_t plen = strlen(path);
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    /* The name less the room for the suffix, so that the temporary file's
     * name fits NAME_MAX where the file's own does. */
    size_t keep = plen - dir_len;
    if (keep > NAME_MAX - (sizeof TMP_SUFFIX - 1))
        keep = NAME_MAX - (sizeof TMP_SUFFIX - 1);
    af->path = strdup(path);
    af->tmp = malloc(dir_len + keep + sizeof TMP_SUFFIX);
    af->dir = malloc(plen + 2);
    if (!af->path || !af->tmp || !af->dir) {
        release(af);
        castor__errf(err, errlen, "%s: out of memory", path);
        return CASTOR_NOMEM;
    }
    memcpy(af->tmp, path, dir_len + keep);
    memcpy(af->tmp + dir_len + keep, TMP_SUFFIX, sizeof TMP_SUFFIX);
    if (!slash)
        strcpy(af->dir, ".");
    else if (slash == path)
        strcpy(af->dir, "/");
    else {
        memcpy(af->dir, path, (size_t)(slash - path));
        af->dir[slash - path] = '\0';
    }
    af->fd = create_temporary(af->tmp, dir_len + keep, af->keep_mode ? 0600 : 0666);
    if (af->fd < 0)
        return castor__atomic_abort(af, "cannot create the temporary file", err, errlen);
    af->created = 1;
    if (af->keep_mode && fchmod(af->fd, af->mode) != 0)
        return castor__atomic_abort(af, "cannot set the permissions of the temporary file", err,
                                    errlen);
    return CASTOR_OK;
}

int castor__atomic_begin(castor__atomic_file *af, const char *path, char *err, size_t errlen)
{
    memset(af, 0, sizeof *af);
    af->fd = -1;
    /* A symbolic link is written through, as open() would: the file it
     * leads to is replaced (its temporary file beside it, so the rename
     * stays in one directory) and the link stays. Renaming over the link
     * would put a plain file in its place and leave its target stale. */
    int rc = CASTOR_OK;
    char *target = castor__atomic_target(path, &rc, err, errlen);
    if (!target)
        return rc;
    rc = begin_at(af, target, err, errlen);
    free(target);
    return rc;
}

int castor__atomic_write(castor__atomic_file *af, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t w = write(af->fd, p, chunk);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int castor__atomic_commit(castor__atomic_file *af, char *err, size_t errlen)
{
    if (fsync(af->fd) != 0)
        return castor__atomic_abort(af, "fsync failed", err, errlen);
    int fd = af->fd;
    af->fd = -1;
    if (close(fd) != 0)
        return castor__atomic_abort(af, "close failed", err, errlen);
    if (rename(af->tmp, af->path) != 0)
        return castor__atomic_abort(af, "cannot rename the temporary file over it", err, errlen);
    /* The rename is durable once the directory is. A filesystem that cannot
     * fsync a directory (EINVAL) has nothing more to do, nor has a process
     * that may write in the directory but not read it (a drop box, mode
     * -wx), which cannot open it: the rename stands, atomic, and its
     * durability is the filesystem's. Such a file was reported unwritten
     * (CASTOR_IO) though it was in place. */
    int dfd = open(af->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 && errno == EACCES) {
        release(af);
        return CASTOR_OK;
    }
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL)) {
        /* The file is in place, whole: only the rename's durability is in
         * doubt. CASTOR_IO said it was not written, and callers told users
         * it was saved nowhere while it was there. */
        int e = errno;
        char eb[128];
        if (dfd >= 0)
            close(dfd);
        castor__errf(err, errlen, "%s: written, but %s %s%s: %s (it may not survive a crash)",
                     af->path, dfd >= 0 ? "fsync of its directory" : "its directory", af->dir,
                     dfd >= 0 ? " failed" : " cannot be opened to sync it",
                     castor__strerror(e, eb, sizeof eb));
        release(af);
        return CASTOR_NOT_DURABLE;
    }
    close(dfd);
    release(af);
    return CASTOR_OK;
}

int castor__atomic_write_file(const char *path, const void *data, size_t len, char *err,
                              size_t errlen)
{
    castor__atomic_file af;
    int rc = castor__atomic_begin(&af, path, err, errlen);
    if (rc)
        return rc;
    if (castor__atomic_write(&af, data, len) != 0)
        return castor__atomic_abort(&af, "write failed", err, errlen);
    return castor__atomic_commit(&af, err, errlen);
}

/*
 * Replacing a file whole or not at all: the bytes go to a temporary file
 * beside it, which is synced and renamed over it, and the directory synced
 * after (where it can be opened: not one we may write in but not read). A
 * failure at any point leaves the old file (or none) and no temporary file
 * behind. Used for checkpoints and the bench's results.
 */
#ifndef CASTOR_ATOMIC_FILE_H
#define CASTOR_ATOMIC_FILE_H

#include <stddef.h>
#include <sys/types.h>

/* What a file's name gets for its temporary file: ".tmp." and six random
 * letters or digits (the CLI's checkpoint cleanup recognises them). */
#define CASTOR__ATOMIC_TMP_SUFFIX ".tmp.XXXXXX"
#define CASTOR__ATOMIC_TMP_SUFFIX_LEN (sizeof CASTOR__ATOMIC_TMP_SUFFIX - 1)

typedef struct castor__atomic_file {
    int fd;       /* write here between begin and commit */
    char *path;   /* the file replaced */
    char *tmp;    /* the temporary file: path's name (cut to fit NAME_MAX) + ".tmp.XXXXXX" */
    char *dir;    /* path's directory, synced after the rename */
    int created;  /* tmp exists: abort removes it */
    int keep_mode;
    mode_t mode;
} castor__atomic_file;

/*
 * Start replacing path; a symbolic link there is followed, as open()
 * would, and the file it leads to is the one replaced (the link stays, and
 * errors name that file). A new file gets what open() makes of 0666 (the
 * umask, or the directory's default ACL); an existing one keeps its
 * permissions. CASTOR_OK, or CASTOR_IO / CASTOR_NOMEM with "PATH: why" in
 * err (a directory or another non-regular file at path is refused).
 */
int castor__atomic_begin(castor__atomic_file *af, const char *path, char *err, size_t errlen);

/* The file castor__atomic_begin replaces for path: path, or where the
 * symbolic link path leads, followed link by link as open() would (a
 * relative target read from its link's directory; the last target may not
 * exist yet). A malloc'd path, or NULL with *rc (CASTOR_IO, CASTOR_NOMEM)
 * and "PATH: why" in err. */
char *castor__atomic_target(const char *path, int *rc, char *err, size_t errlen);

/* Write all of data to af (EINTR and short writes handled): 0, or -1 with errno. */
int castor__atomic_write(castor__atomic_file *af, const void *data, size_t len);

/* Sync, close and rename over the path, then sync the directory; releases
 * af whatever happens. CASTOR_OK, or CASTOR_IO with "PATH: why" in err (the
 * old file, or none, at path), or CASTOR_NOT_DURABLE when the file is in
 * place but the directory's fsync failed (or it could not be opened for
 * another reason than EACCES): it may not survive a crash. */
int castor__atomic_commit(castor__atomic_file *af, char *err, size_t errlen);

/* Give up: remove the temporary file and release af. what and the current
 * errno become "PATH: WHAT: REASON (the temporary file TMP)" in err (what
 * may be NULL: then err is left alone). Returns CASTOR_IO. */
int castor__atomic_abort(castor__atomic_file *af, const char *what, char *err, size_t errlen);

/* path replaced by len bytes of data, as above. */
int castor__atomic_write_file(const char *path, const void *data, size_t len, char *err,
                              size_t errlen);

#endif

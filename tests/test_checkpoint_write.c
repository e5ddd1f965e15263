/*
 * How a checkpoint file is written (src/atomic_file.c): whole or not at all,
 * the old file kept when a write fails, no temporary file left behind,
 * names up to NAME_MAX, and symbolic links written through.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "castor.h"
#include "checkpoint_support.h"
#include "src/model.h"
#include "src/strategy.h"
#include "support.h"

/* Names in dir other than "." and ".."; *count of them. */
static int dir_entries(const char *dir, const char *skip)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            (!skip || strcmp(e->d_name, skip)))
            count++;
    closedir(d);
    return count;
}

Test(checkpoint, failed_save_leaves_old_file)
{
    fixture fx;
    ckpt_setup(&fx);
    size_t len0;
    unsigned char *old = ckpt_slurp(fx.good, &len0);

    /* a directory that does not exist */
    char *nodir = ckpt_path_in(fx.dir, "no/such/dir/x.safetensors");
    cr_assert_eq(castor_model_save(fx.m, nodir), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), nodir), "%s", castor_model_errmsg(fx.m));
    free(nodir);
    /* a path that is a directory */
    char *sub = ckpt_path_in(fx.dir, "sub");
    cr_assert_eq(mkdir(sub, 0755), 0);
    cr_assert_eq(castor_model_save(fx.m, sub), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), sub), "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(sub, NULL), 0);
    support_rmrf(sub);
    free(sub);

    /* a write that fails half-way (file size limit: EFBIG) over the old file */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit saved, small;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
    small = saved;
    small.rlim_cur = 1000;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = castor_model_save(fx.m, fx.good);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &saved), 0);
    cr_assert_eq(rc, CASTOR_IO, "save under a 1000-byte limit: %d %s", rc,
                 castor_model_errmsg(fx.m));
    cr_assert(strstr(castor_model_errmsg(fx.m), fx.good), "%s", castor_model_errmsg(fx.m));
    size_t len1;
    unsigned char *now = ckpt_slurp(fx.good, &len1);
    cr_assert(len0 == len1 && memcmp(old, now, len0) == 0, "the old checkpoint changed");
    free(now);
    /* no temporary file left behind: only good.safetensors */
    cr_assert_eq(dir_entries(fx.dir, NULL), 1);

    /* a save that works replaces it, and the old one loaded is the old state */
    cr_assert_eq(castor_model_save(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(fx.dir, NULL), 1);
    struct stat st;
    cr_assert_eq(stat(fx.good, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0644);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, fx.good, ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu")),
                 CASTOR_OK);
    cr_assert_eq(castor_model_step(m), 2);
    castor_strategy *ms = m->strategy;
    castor_model_free(m);
    castor_strategy_free(ms);
    free(old);
    ckpt_teardown(&fx);
}

/* A save to a symbolic link writes the file it leads to, as open() would,
 * and leaves the link: renaming over the link put a plain file in its
 * place and left the file the user keeps the model in stale. */
Test(checkpoint, save_writes_through_a_symbolic_link)
{
    fixture fx;
    ckpt_setup(&fx);
    char *store = ckpt_path_in(fx.dir, "store");
    cr_assert_eq(mkdir(store, 0755), 0);
    char *real = ckpt_path_in(fx.dir, "store/model.safetensors");
    char *link1 = ckpt_path_in(fx.dir, "link1.safetensors");
    char *link2 = ckpt_path_in(fx.dir, "link2.safetensors");
    /* link2 -> link1 -> store/model.safetensors (relative, read from each
     * link's directory), which does not exist yet */
    cr_assert_eq(symlink("store/model.safetensors", link1), 0);
    cr_assert_eq(symlink("link1.safetensors", link2), 0);
    cr_assert_eq(castor_model_save(fx.m, link2), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    struct stat st;
    cr_assert_eq(lstat(link2, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the link was replaced by a plain file");
    cr_assert_eq(lstat(link1, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "the inner link was replaced by a plain file");
    cr_assert_eq(lstat(real, &st), 0);
    cr_assert(S_ISREG(st.st_mode));
    size_t want_len, got_len;
    unsigned char *want = ckpt_slurp(real, &want_len);
    cr_assert_eq(castor_model_save(fx.m, fx.bad), CASTOR_OK);
    unsigned char *got = ckpt_slurp(fx.bad, &got_len);
    cr_assert(want_len == got_len && memcmp(want, got, want_len) == 0,
              "the file behind the links is not the model's");
    /* a save over it through the link replaces the target's contents */
    cr_assert_eq(castor_model_save(fx.m, link1), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(lstat(link1, &st), 0);
    cr_assert(S_ISLNK(st.st_mode));
    cr_assert_eq(dir_entries(store, NULL), 1);  /* no temporary file left */
    free(want);
    free(got);

    /* a loop of links is refused, naming the path given */
    char *loop = ckpt_path_in(fx.dir, "loop.safetensors");
    cr_assert_eq(symlink("loop.safetensors", loop), 0);
    cr_assert_eq(castor_model_save(fx.m, loop), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), loop), "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(lstat(loop, &st), 0);
    cr_assert(S_ISLNK(st.st_mode));
    /* a link to a directory is refused as the directory is */
    char *to_dir = ckpt_path_in(fx.dir, "to_dir.safetensors");
    cr_assert_eq(symlink("store", to_dir), 0);
    cr_assert_eq(castor_model_save(fx.m, to_dir), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), "is a directory"), "%s",
              castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(store, NULL), 1);
    free(loop);
    free(to_dir);
    free(store);
    free(real);
    free(link1);
    free(link2);
    ckpt_teardown(&fx);
}

/* As many links as open() follows (40 on Linux) are followed, one more is
 * ELOOP: a chain of 40 was refused, the last link never looked at. */
Test(checkpoint, save_follows_as_many_links_as_open)
{
    fixture fx;
    ckpt_setup(&fx);
    char name[32], prev[32] = "model.safetensors";
    char *path = NULL;
    for (int i = 1; i <= 41; i++) {
        snprintf(name, sizeof name, "l%d", i);
        free(path);
        path = ckpt_path_in(fx.dir, name);
        cr_assert_eq(symlink(prev, path), 0);
        snprintf(prev, sizeof prev, "%s", name);
        if (i == 40)
            cr_assert_eq(castor_model_save(fx.m, path), CASTOR_OK, "%s",
                         castor_model_errmsg(fx.m));
    }
    cr_assert_eq(castor_model_save(fx.m, path), CASTOR_IO);
    cr_assert(strstr(castor_model_errmsg(fx.m), "Too many levels of symbolic links"), "%s",
              castor_model_errmsg(fx.m));
    char *real = ckpt_path_in(fx.dir, "model.safetensors");
    struct stat st;
    cr_assert_eq(lstat(real, &st), 0);
    cr_assert(S_ISREG(st.st_mode));
    free(real);
    free(path);
    ckpt_teardown(&fx);
}

Test(checkpoint, a_file_name_near_name_max_saves)
{
    /* The temporary file was the name + ".tmp.XXXXXX": past NAME_MAX for
     * names of 245..255 bytes, which the file system itself takes. */
    fixture fx;
    ckpt_setup(&fx);
    char name[NAME_MAX + 1];
    memset(name, 'n', NAME_MAX);
    memcpy(name + NAME_MAX - strlen(".safetensors"), ".safetensors", strlen(".safetensors"));
    name[NAME_MAX] = '\0';
    char *path = ckpt_path_in(fx.dir, name);
    cr_assert_eq(castor_model_save(fx.m, path), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(castor_model_load(fx.m, path), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    /* again, over the file: and nothing else is left in the directory */
    cr_assert_eq(castor_model_save(fx.m, path), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(dir_entries(fx.dir, NULL), 2, "good.safetensors and the long one");
    free(path);
    ckpt_teardown(&fx);
}

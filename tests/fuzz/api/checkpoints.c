/*
 * Checkpoints: save, damage, load and open against what the harness knows of
 * each file, in a directory of its own for each input.
 */
#include <dirent.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/api/harness.h"

/* ---- checkpoints --------------------------------------------------------------------- */

hfile files[NF];
char dir[64], paths[NF][96];
/* A directory (no file can be written there) and a symbolic link to the
 * last checkpoint file, which a save writes through (castor.h). */
char subdir[96], link_path[96];

void file_forget(int f)
{
    free(files[f].bytes);
    free(files[f].params);
    memset(&files[f], 0, sizeof files[f]);
}

static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            unsigned char *grown = realloc(buf, cap);
            if (!grown)
                abort();
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0)
            break;
    }
    fclose(fp);
    *len = n;
    return buf;
}

/* How the file differs from what castor wrote there: 0 the same, 1 shorter,
 * 2 a byte of the data section changed, 3 a byte of the header changed;
 * -1 unknown. */
static int file_damage(int f)
{
    const hfile *F = &files[f];
    if (!F->saved)
        return -1;
    size_t len = 0;
    unsigned char *now = read_all(paths[f], &len);
    if (!now)
        return -1;
    /* A changed header may say anything (other tensor names, another CRC):
     * it decides, whatever else changed too. */
    int header = 0, data = 0;
    size_t common = len < F->len ? len : F->len;
    for (size_t i = 0; i < common; i++)
        if (now[i] != F->bytes[i])
            *(i < F->header_end ? &header : &data) = 1;
    free(now);
    if (header)
        return 3;
    if (len != F->len)
        return len < F->len ? 1 : -1;
    return data ? 2 : 0;
}

static const char *bad_path(unsigned b)
{
    static char missing[128];
    switch (b & 3) {
    case 0:
        return NULL;
    case 1:
        return "";
    case 2:
        return subdir;
    default:
        snprintf(missing, sizeof missing, "%s/no-such-dir/x.safetensors", dir);
        return missing;
    }
}

/* The path a save, load or open is given and the file it names: mostly
 * checkpoint file f itself, or the last one through its link; with a byte's
 * top four bits, a bad path (*bad). */
static const char *pick_path(int *f, int *bad)
{
    *f = pick(NF);
    unsigned b = u8();
    *bad = (b & 0xf0) == 0xf0;
    if (*bad)
        return bad_path(b);
    return (b & 0x0c) == 0x0c && *f == NF - 1 ? link_path : paths[*f];
}

/* What a save or load is called with: a model that takes calls, a path
 * (pick_path), and a compiled model's variables as they were before. */
typedef struct checkpoint_call {
    int m, f, bad;
    hmodel *M;
    const char *path;
    float *params;  /* NULL when not compiled; the caller frees it */
} checkpoint_call;

static int pick_checkpoint_call(checkpoint_call *c)
{
    c->M = some_model_to_call(&c->m);
    if (!c->M)
        return 0;
    c->path = pick_path(&c->f, &c->bad);
    c->params = c->M->compiled ? get_params(c->M) : NULL;
    return 1;
}

void op_save(void)
{
    checkpoint_call c;
    if (!pick_checkpoint_call(&c))
        return;
    hmodel *M = c.M;
    int f = c.f, bad = c.bad;
    const char *path = c.path;
    float *params = c.params;
    int finite = 1;
    if (M->compiled)
        expect(castor_model_all_finite(M->h, &finite), B(CASTOR_OK), "all_finite", mmsg(M));
    position p = position_of(M);
    unsigned want = !M->compiled || !path || !*path ? B(CASTOR_MISUSE)
                    : bad ? B(CASTOR_IO) : B(CASTOR_OK);
    int rc = castor_model_save(M->h, path);
    expect(rc, want, "save", mmsg(M));
    struct stat st;
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode), "the link is gone");
    if (rc != CASTOR_OK) {
        free(params);
        return;
    }
    file_forget(f);
    hfile *F = &files[f];
    F->bytes = read_all(paths[f], &F->len);
    CHECK(F->bytes && F->len >= 8, "the saved file");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | F->bytes[i];
    CHECK(hlen <= F->len - 8, "header length");
    F->header_end = 8 + (size_t)hlen;
    F->saved = 1;
    F->unknown = M->unknown;
    F->features = M->features;
    F->loss = M->loss;
    F->kind = M->kind;
    F->slots = M->slots;
    F->sane = M->sane;
    F->all_finite = finite;
    CHECK(castor_model_layers_spec(M->h, F->spec, sizeof F->spec) == CASTOR_OK, "spec");
    F->params = params;
    F->n_params = M->n_params;
    F->lr = p.lr;
    F->step = p.step;
    F->epoch = p.epoch;
    F->step_in_epoch = p.sie;
    F->ep = M->ep;
}

void op_damage(void)
{
    int f = pick(NF);
    size_t len = 0;
    unsigned char *now = read_all(paths[f], &len);
    if (!now)
        return;
    unsigned how = u8();
    size_t at = (size_t)u8() | (size_t)u8() << 8;
    if (how & 1) {
        if (len)
            len = at % len;  /* shorter */
    } else if (len) {
        unsigned char mask = (unsigned char)(u8() | 1);
        now[at % len] ^= mask;
    }
    FILE *fp = fopen(paths[f], "wb");
    if (!fp)
        abort();
    if (len && fwrite(now, 1, len, fp) != len)
        abort();
    fclose(fp);
    free(now);
}

/* The model against a file castor wrote and nobody changed. */
static int file_matches(const hmodel *M, const hfile *F)
{
    char spec[sizeof F->spec];
    if (castor_model_layers_spec(M->h, spec, sizeof spec) != CASTOR_OK)
        return 0;
    return M->features == F->features && strcmp(spec, F->spec) == 0 && M->loss == F->loss &&
           M->kind == F->kind && M->slots == F->slots;
}

/* After a load or open of a file castor wrote: the model is the file's. */
static void check_loaded(hmodel *M, const hfile *F, const char *what)
{
    float *p = get_params(M);
    CHECK(memcmp(p, F->params, F->n_params * sizeof *p) == 0, "%s: the variables differ from "
          "those saved", what);
    free(p);
    position now = position_of(M);
    CHECK(now.step == F->step && now.epoch == F->epoch && now.sie == F->step_in_epoch,
          "%s: step %lld epoch %lld in %lld; saved %lld %lld %lld", what, (long long)now.step,
          (long long)now.epoch, (long long)now.sie, (long long)F->step, (long long)F->epoch,
          (long long)F->step_in_epoch);
    CHECK(now.lr == F->lr, "%s: learning rate %g, saved %g", what, (double)now.lr,
          (double)F->lr);
    M->sane = F->sane;
    M->nf_params = 0;
    for (size_t i = 0; i < F->n_params; i++)
        M->nf_params |= !isfinite(F->params[i]);
    M->nf_state = F->all_finite ? 0 : M->nf_params ? -1 : 1;
    M->ep = F->ep;
}

/* What a load or open may return of the file at path (file_damage's
 * `damage`), when nothing else refuses it: 0 for one castor wrote and
 * nobody changed. A shorter file or a changed data section is refused as
 * CASTOR_FORMAT, or as `damaged` (the call's own word for it); a changed
 * header may say anything but that the call is misused. */
static unsigned file_refusal(const char *path, int bad, int damage, unsigned damaged)
{
    if (bad)
        return B(CASTOR_IO) | B(CASTOR_FORMAT);
    if (damage < 0)  /* no file, or one of unknown making */
        return access(path, F_OK) != 0 ? B(CASTOR_IO) : ~0u;
    if (damage == 1 || damage == 2)
        return B(CASTOR_FORMAT) | damaged;
    if (damage == 3)
        return ~0u & ~B(CASTOR_MISUSE);
    return 0;
}

/* A load or open of a file of unknown making: what the model holds is not
 * known, only what castor.h lets one ask it. */
static void model_of_unknown_making(hmodel *M)
{
    M->sane = 0;
    M->nf_params = M->nf_state = -1;
    M->ep.known = 0;
}

void op_load(void)
{
    checkpoint_call c;
    if (!pick_checkpoint_call(&c))
        return;
    int damage = c.bad ? -1 : file_damage(c.f);
    const hfile *F = &files[c.f];
    hmodel *M = c.M;
    int m = c.m, bad = c.bad;
    const char *path = c.path;
    float *before = c.params;
    position p0 = position_of(M);
    unsigned want;
    if (!M->compiled || model_busy(m) || !path || !*path)
        want = B(CASTOR_MISUSE);
    else if ((want = file_refusal(path, bad, damage, B(CASTOR_MISMATCH))) != 0)
        ;
    else if (M->unknown || F->unknown)
        want = B(CASTOR_OK) | B(CASTOR_MISMATCH);
    else
        want = file_matches(M, F) ? B(CASTOR_OK) : B(CASTOR_MISMATCH);
    int rc = castor_model_load(M->h, path);
    expect(rc, want, "load", mmsg(M));
    if (rc == CASTOR_OK) {
        if (damage == 0) {
            check_loaded(M, F, "load");
        } else {
            model_of_unknown_making(M);
            float lr = castor_model_learning_rate(M->h);
            CHECK(lr > 0 && isfinite(lr), "loaded learning rate %g", (double)lr);
        }
    } else if (before) {
        /* castor.h: on any error the model is unchanged. */
        check_params_unchanged(M, before, M->n_params, "a failed load");
        position p1 = position_of(M);
        CHECK(p0.step == p1.step && p0.epoch == p1.epoch && p0.sie == p1.sie &&
                  p0.lr == p1.lr,
              "a failed load moved the model: step %lld epoch %lld in %lld lr %g, was %lld "
              "%lld %lld %g",
              (long long)p1.step, (long long)p1.epoch, (long long)p1.sie, (double)p1.lr,
              (long long)p0.step, (long long)p0.epoch, (long long)p0.sie, (double)p0.lr);
    }
    free(before);
}

void op_open(void)
{
    int m = pick(NM);
    int s = some_strategy();
    int f, bad;
    const char *path = pick_path(&f, &bad);
    hmodel *M = fresh_model(m);
    if (!M)
        return;
    hstrat *S = s < NS && strats[s].h ? &strats[s] : NULL;
    int damage = bad ? -1 : file_damage(f);
    const hfile *F = &files[f];
    /* What the file says, then what the strategy does; castor.h leaves
     * which comes first open's (the file is read before the model is
     * compiled). */
    unsigned want;
    if (!path || !*path || !S)
        want = B(CASTOR_MISUSE);
    else if ((want = file_refusal(path, bad, damage, B(CASTOR_DEVICE_MEMORY))) == 0)
        want = B(CASTOR_OK) | (small_budget(s) ? B(CASTOR_DEVICE_MEMORY) : 0);
    if (S && (!S->ok || S->bound >= 0))
        want = (want & ~B(CASTOR_OK) & ~B(CASTOR_DEVICE_MEMORY)) | B(CASTOR_MISUSE);
    castor_model *h = (castor_model *)&h;
    int rc = castor_model_open(&h, path, S ? S->h : NULL);
    M->h = h;
    if (rc != CASTOR_OK) {
        expect(rc, want, "open", castor_model_errmsg(h));
        M->open_failed = 1;
        if (!h)
            memset(M, 0, sizeof *M);
        return;
    }
    expect(rc, want, "open", castor_model_errmsg(h));
    CHECK(h, "open handed out no model");
    M->created = 1;
    M->compiled = 1;
    M->strat = s;
    S->bound = m;
    M->features = castor_model_input_features(h);
    sync_layers(M);
    M->stats_steps = 0;
    if (damage == 0) {
        CHECK(M->features == F->features, "features");
        M->loss = F->loss;
        M->kind = F->kind;
        M->slots = F->slots;
        M->unknown = F->unknown;
        check_loaded(M, F, "open");
        check_stats(M);
    } else {
        model_of_unknown_making(M);
        M->loss = -1;
        M->kind = -1;
        M->slots = -1;
        M->unknown = 1;
    }
}

/* ---- the checkpoint directory ------------------------------------------ */

/* A directory of its own for each input, made as it starts and removed
 * as it ends (libFuzzer leaves with _Exit: no atexit would remove one kept
 * for the process; after a crash it stays, to tell why). */
void make_dir(void)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/castor-fuzz-api-XXXXXX", base);
    if (!mkdtemp(dir))
        abort();
    for (int f = 0; f < NF; f++)
        snprintf(paths[f], sizeof paths[f], "%s/ck%d.safetensors", dir, f);
    snprintf(subdir, sizeof subdir, "%s/sub", dir);
    snprintf(link_path, sizeof link_path, "%s/link.safetensors", dir);
    if (mkdir(subdir, 0700) || symlink(strrchr(paths[NF - 1], '/') + 1, link_path))
        abort();
}

void remove_dir(void)
{
    for (int f = 0; f < NF; f++)
        unlink(paths[f]);
    unlink(link_path);
    CHECK(rmdir(subdir) == 0 && rmdir(dir) == 0, "%s is not empty", dir);
}

/* Nothing but the checkpoints may be left in the directory: a save writes
 * a temporary file and renames it, or removes it on failure. */
void check_dir(void)
{
    DIR *dp = opendir(dir);
    if (!dp)
        abort();
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        int ours = strcmp(e->d_name, strrchr(subdir, '/') + 1) == 0 ||
                   strcmp(e->d_name, strrchr(link_path, '/') + 1) == 0;
        for (int f = 0; f < NF; f++)
            ours |= strcmp(e->d_name, strrchr(paths[f], '/') + 1) == 0;
        CHECK(ours, "%s left in the checkpoint directory", e->d_name);
    }
    closedir(dp);
}

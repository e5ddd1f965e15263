/*
 * Checkpoints that must not be trusted: corrupt and truncated files,
 * architecture and optimizer mismatches, metadata that lies about sizes and
 * positions, and file text that reaches messages. A failed load or open
 * leaves the model as it was.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "castor.h"
#include "checkpoint_support.h"
#include "support.h"

/* ---- corrupt files --------------------------------------------------------------------- */

/* A checkpoint split into its header text and data section. */
typedef struct parts {
    char *header;
    unsigned char *data;
    size_t data_len;
} parts;

static parts split_file(const char *path)
{
    size_t len;
    unsigned char *b = ckpt_slurp(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | b[i];
    cr_assert(hl <= len - 8);
    parts p;
    p.header = malloc(hl + 1);
    memcpy(p.header, b + 8, hl);
    p.header[hl] = '\0';
    for (size_t h = hl; h && p.header[h - 1] == ' '; h--)
        p.header[h - 1] = '\0';  /* the padding; ckpt_image() adds it again */
    p.data_len = len - 8 - (size_t)hl;
    p.data = malloc(p.data_len ? p.data_len : 1);
    memcpy(p.data, b + 8 + hl, p.data_len);
    free(b);
    return p;
}

static void parts_free(parts *p)
{
    free(p->header);
    free(p->data);
}

/* Replace the one occurrence of `from` in the header with `to`. */
static void edit(parts *p, const char *from, const char *to)
{
    char *at = strstr(p->header, from);
    cr_assert(at, "'%s' not in the header", from);
    cr_assert(!strstr(at + 1, from), "'%s' is in the header twice", from);
    size_t len = strlen(p->header) - strlen(from) + strlen(to);
    char *h = malloc(len + 1);
    size_t pre = (size_t)(at - p->header);
    memcpy(h, p->header, pre);
    strcpy(h + pre, to);
    strcat(h, at + strlen(from));
    free(p->header);
    p->header = h;
}

/* Put the data section's CRC into the header (after edits to the data). */
static void fix_crc(parts *p)
{
    char *at = strstr(p->header, "\"crc32\":\"");
    cr_assert(at);
    char hex[9];
    snprintf(hex, sizeof hex, "%08lx", crc32(0, p->data, (uInt)p->data_len));
    memcpy(at + 9, hex, 8);
}

static void write_parts(const parts *p, const char *path)
{
    size_t len;
    unsigned char *b = ckpt_image(p->header, p->data, p->data_len, &len);
    cr_assert_eq(support_write_file(path, b, len), 0);
    free(b);
}

/* Loading `path` fails with `code`, a message naming it and holding
 * `fragment`; the model is as it was; open fails the same way. */
static void expect_load_fails(fixture *fx, const char *path, int code, const char *fragment)
{
    int rc = castor_model_load(fx->m, path);
    const char *msg = castor_model_errmsg(fx->m);
    cr_assert_eq(rc, code, "load gave %d (%s), expected %d", rc, msg, code);
    cr_assert(strstr(msg, path), "the message does not name the file: %s", msg);
    cr_assert(strstr(msg, fragment), "'%s' not in: %s", fragment, msg);
    cr_assert(!strchr(msg, '\n'), "not one line: %s", msg);
    snap after = ckpt_take(fx->m);
    ckpt_assert_same(&fx->before, &after, "after a failed load");
    ckpt_snap_free(&after);
    /* and training still works on it */
    ckpt_train_steps(fx->m, fx->ds, 1);
    castor_model_free(fx->m);
    fx->m = ckpt_make_model(fx->s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 9);
    ckpt_train_steps(fx->m, fx->ds, 2);
}

/* fx->bad: fx->good changed by mutate. */
static void write_bad(fixture *fx, void (*mutate)(parts *))
{
    parts p = split_file(fx->good);
    mutate(&p);
    write_parts(&p, fx->bad);
    parts_free(&p);
}

static void corrupt_case(void (*mutate)(parts *), int code, const char *fragment)
{
    fixture fx;
    ckpt_setup(&fx);
    write_bad(&fx, mutate);
    expect_load_fails(&fx, fx.bad, code, fragment);
    /* open() reports the same problem */
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, fx.bad, s), code);
    cr_assert(m && strstr(castor_model_errmsg(m), fx.bad), "%s", castor_model_errmsg(m));
    /* The failed handle carries the message, nothing more: the strategy
     * takes another model while it lives (a file found bad after compile
     * left a model of fresh weights bound to it, which trained and saved). */
    castor_model *ok = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 1);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    cr_assert_eq(castor_model_fit(m, fx.ds, &fo, NULL), CASTOR_MISUSE);
    cr_assert_eq(castor_model_save(m, fx.bad), CASTOR_MISUSE);
    castor_model_free(ok);
    castor_model_free(m);
    castor_strategy_free(s);
    ckpt_teardown(&fx);
}

/* A fixture whose model has loaded the good file as mutate edited it
 * (ckpt_teardown it). */
static void load_edited(fixture *fx, void (*mutate)(parts *))
{
    ckpt_setup(fx);
    write_bad(fx, mutate);
    cr_assert_eq(castor_model_load(fx->m, fx->bad), CASTOR_OK, "%s", castor_model_errmsg(fx->m));
}

/* The good file edited by mutate loads (at the given step, unless it is
 * negative), and is saved again: the parts of what that save wrote. */
static parts load_and_save_again(void (*mutate)(parts *), int64_t step)
{
    fixture fx;
    load_edited(&fx, mutate);
    if (step >= 0)
        cr_assert_eq(castor_model_step(fx.m), step);
    cr_assert_eq(castor_model_save(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    parts p = split_file(fx.good);
    ckpt_teardown(&fx);
    return p;
}

Test(checkpoint, good_file_loads)
{
    fixture fx;
    ckpt_setup(&fx);
    cr_assert_eq(castor_model_load(fx.m, fx.good), CASTOR_OK, "%s", castor_model_errmsg(fx.m));
    cr_assert_eq(castor_model_step(fx.m), 3);
    ckpt_teardown(&fx);
}

Test(checkpoint, truncated_file)
{
    fixture fx;
    ckpt_setup(&fx);
    size_t len;
    unsigned char *b = ckpt_slurp(fx.good, &len);
    cr_assert_eq(support_write_file(fx.bad, b, len - 10), 0);
    expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "truncated");
    cr_assert_eq(support_write_file(fx.bad, b, 6), 0);
    expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "truncated");
    free(b);
    ckpt_teardown(&fx);
}

Test(checkpoint, empty_file)
{
    fixture fx;
    ckpt_setup(&fx);
    cr_assert_eq(support_write_file(fx.bad, "", 0), 0);
    expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "empty file");
    ckpt_teardown(&fx);
}

Test(checkpoint, directory_as_file)
{
    fixture fx;
    ckpt_setup(&fx);
    expect_load_fails(&fx, fx.dir, CASTOR_IO, "directory");
    ckpt_teardown(&fx);
}

Test(checkpoint, missing_file)
{
    fixture fx;
    ckpt_setup(&fx);
    expect_load_fails(&fx, fx.bad, CASTOR_IO, "No such file");
    castor_model *m = NULL;
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    cr_assert_eq(castor_model_open(&m, fx.bad, s), CASTOR_IO);
    cr_assert(m && strstr(castor_model_errmsg(m), fx.bad), "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    ckpt_teardown(&fx);
}

Test(checkpoint, header_length_past_end)
{
    fixture fx;
    ckpt_setup(&fx);
    size_t len;
    unsigned char *b = ckpt_slurp(fx.good, &len);
    uint64_t hl = len;  /* more than follows it */
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hl >> (8 * i));
    cr_assert_eq(support_write_file(fx.bad, b, len), 0);
    expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "header length");
    free(b);
    ckpt_teardown(&fx);
}

static void not_json(parts *p) { p->header[1] = 'x'; }
static void wrong_dtype(parts *p)
{
    edit(p, "\"dense_0.kernel\":{\"dtype\":\"F32\"", "\"dense_0.kernel\":{\"dtype\":\"F64\"");
}
static void swapped_shape(parts *p)
{
    edit(p, "\"dense_0.kernel\":{\"dtype\":\"F32\",\"shape\":[12,16]",
         "\"dense_0.kernel\":{\"dtype\":\"F32\",\"shape\":[16,12]");
}
static void overlapping(parts *p)
{
    /* the bias moved back by 16 bytes onto the kernel; its old end leaves a hole too */
    edit(p, "\"data_offsets\":[768,832]", "\"data_offsets\":[752,816]");
}
static void out_of_range(parts *p)
{
    edit(p, "\"data_offsets\":[0,768]", "\"data_offsets\":[1000000,1000768]");
}
static void flipped_byte(parts *p) { p->data[p->data_len / 2] ^= 0x10; }
static void renamed_tensor(parts *p) { edit(p, "\"dense_1.bias\":", "\"dense_1.b\":"); }
/* One more F32 tensor of one zero, named json_name (as JSON string text),
 * at the end of the header and the data; the CRC made right again. */
static void append_tensor(parts *p, const char *json_name)
{
    char entry[160];
    snprintf(entry, sizeof entry, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[1],"
             "\"data_offsets\":[%zu,%zu]}}", json_name, p->data_len, p->data_len + 4);
    size_t hl = strlen(p->header);
    cr_assert_eq(p->header[hl - 1], '}');
    p->header[hl - 1] = '\0';
    char *h = malloc(hl + strlen(entry) + 1);
    strcpy(h, p->header);
    strcat(h, entry);
    free(p->header);
    p->header = h;
    p->data = realloc(p->data, p->data_len + 4);
    memset(p->data + p->data_len, 0, 4);
    p->data_len += 4;
    fix_crc(p);
}
static void extra_tensor(parts *p) { append_tensor(p, "dense_9.kernel"); }
static void bad_step(parts *p)
{
    char *at = strstr(p->header, "\"step\":\"");
    cr_assert(at);
    at[8] = '-';
}
static void other_layers(parts *p) { edit(p, "\"layers\":\"16:tanh,", "\"layers\":\"16:relu,"); }
static void other_optimizer(parts *p)
{
    edit(p, "\"optimizer\":\"adam\"", "\"optimizer\":\"adamw\"");
}
static void no_format(parts *p) { edit(p, "\"format\":", "\"formax\":"); }
static void other_loss(parts *p) { edit(p, "\"loss\":\"softmax_xent\"", "\"loss\":\"mse\""); }
static void other_input_features(parts *p)
{
    edit(p, "\"input_features\":\"12\"", "\"input_features\":\"13\"");
}
static void crc_of_nine_digits(parts *p) { edit(p, "\"crc32\":\"", "\"crc32\":\"0"); }
static void rate_after_a_blank(parts *p)
{
    edit(p, "\"learning_rate\":\"", "\"learning_rate\":\" ");
}

Test(checkpoint, header_not_json) { corrupt_case(not_json, CASTOR_FORMAT, "not valid JSON"); }

Test(checkpoint, wrong_dtype) { corrupt_case(wrong_dtype, CASTOR_FORMAT, "dtype 'F64'"); }

Test(checkpoint, shape_mismatch)
{
    corrupt_case(swapped_shape, CASTOR_MISMATCH,
                 "tensor dense_0.kernel has shape [16,12], the model expects [12,16]");
}

Test(checkpoint, overlapping_offsets) { corrupt_case(overlapping, CASTOR_FORMAT, "overlap"); }

Test(checkpoint, out_of_range_offsets)
{
    corrupt_case(out_of_range, CASTOR_FORMAT, "past the end");
}

Test(checkpoint, flipped_data_byte) { corrupt_case(flipped_byte, CASTOR_FORMAT, "CRC-32"); }

Test(checkpoint, missing_tensor)
{
    corrupt_case(renamed_tensor, CASTOR_MISMATCH, "dense_1.bias is missing");
}

Test(checkpoint, extra_tensor)
{
    corrupt_case(extra_tensor, CASTOR_MISMATCH, "unexpected tensor 'dense_9.kernel'");
}

Test(checkpoint, bad_metadata_value) { corrupt_case(bad_step, CASTOR_FORMAT, "'step'"); }

static void zero_features(parts *p)
{
    edit(p, "\"input_features\":\"12\"", "\"input_features\":\"0\"");
}

/* No model has 0 inputs: the file is wrong, not the model it is loaded into. */
Test(checkpoint, zero_input_features)
{
    corrupt_case(zero_features, CASTOR_FORMAT, "'input_features' is '0'");
}

/* The last tensor of the data section (the last bias's Adam v) one element
 * longer, its data there to match: only its shape is wrong. */
static void longer_last_bias(parts *p)
{
    const char *name = "\"dense_2.bias.adam_v\":{\"dtype\":\"F32\",\"shape\":[3],";
    char *at = strstr(p->header, name);
    cr_assert(at, "%s", p->header);
    size_t begin, end;
    cr_assert_eq(sscanf(at + strlen(name), "\"data_offsets\":[%zu,%zu]}", &begin, &end), 2);
    cr_assert_eq(end, p->data_len, "the last tensor in the data section");
    char from[160], to[160];
    snprintf(from, sizeof from, "%s\"data_offsets\":[%zu,%zu]", name, begin, end);
    snprintf(to, sizeof to, "\"dense_2.bias.adam_v\":{\"dtype\":\"F32\",\"shape\":[4],"
             "\"data_offsets\":[%zu,%zu]", begin, end + 4);
    edit(p, from, to);
    p->data = realloc(p->data, p->data_len + 4);
    memset(p->data + p->data_len, 0, 4);
    p->data_len += 4;
    fix_crc(p);
}

/* A rank-1 tensor's one dimension is compared too. */
Test(checkpoint, bias_of_another_length)
{
    corrupt_case(longer_last_bias, CASTOR_MISMATCH,
                 "tensor dense_2.bias.adam_v has shape [4], the model expects [3]");
}

static void bad_optimizer_step(parts *p)
{
    edit(p, "\"seed\":", "\"optimizer_step\":\"x\",\"seed\":");
}

Test(checkpoint, bad_optimizer_step)
{
    corrupt_case(bad_optimizer_step, CASTOR_FORMAT, "'optimizer_step' is 'x'");
}

static void optimizer_step_behind(parts *p)
{
    edit(p, "\"seed\":", "\"optimizer_step\":\"1\",\"seed\":");
}

/* The optimizer state's own step count (behind the model's after a mirrored
 * recovery: Adam's bias correction counts it) is what load takes and save
 * writes back, not the model's step in its place. */
Test(checkpoint, optimizer_step_behind_the_step_survives_load_and_save)
{
    parts p = load_and_save_again(optimizer_step_behind, 3);
    cr_assert(strstr(p.header, "\"optimizer_step\":\"1\""), "%s", p.header);
    parts_free(&p);
}

/* zlib's CRC-32 is 8 hex digits: a ninth (a leading 0 that strtoul reads
 * to the same value) is not what castor writes. */
Test(checkpoint, crc_of_nine_digits)
{
    corrupt_case(crc_of_nine_digits, CASTOR_FORMAT, "'crc32' is '0");
}

/* A number is the number alone: strtof would skip the blank before it. */
Test(checkpoint, float_after_a_blank)
{
    corrupt_case(rate_after_a_blank, CASTOR_FORMAT, "'learning_rate' is ' ");
}

/* input_shape and input_type (the data a model was trained on) go together,
 * name an IDX type, and multiply out to input_features (F = 12). */
static void shape_without_type(parts *p)
{
    edit(p, "\"seed\":", "\"input_shape\":\"3x4\",\"seed\":");
}
static void unknown_input_type(parts *p)
{
    edit(p, "\"seed\":", "\"input_shape\":\"3x4\",\"input_type\":\"float16\",\"seed\":");
}
static void shape_of_other_features(parts *p)
{
    edit(p, "\"seed\":", "\"input_shape\":\"3x3\",\"input_type\":\"ubyte\",\"seed\":");
}
static void shape_of_four_dims(parts *p)
{
    edit(p, "\"seed\":", "\"input_shape\":\"1x3x2x2\",\"input_type\":\"ubyte\",\"seed\":");
}

Test(checkpoint, bad_input_shape_or_type)
{
    corrupt_case(shape_without_type, CASTOR_FORMAT, "'input_type'");
    corrupt_case(unknown_input_type, CASTOR_FORMAT, "'input_type' is 'float16'");
    corrupt_case(shape_of_other_features, CASTOR_FORMAT, "'input_shape' is '3x3'");
    corrupt_case(shape_of_four_dims, CASTOR_FORMAT, "'input_shape' is '1x3x2x2'");
}

static void zero_epoch_samples(parts *p)
{
    edit(p, "\"epoch_samples\":\"101\"", "\"epoch_samples\":\"0\"");
}
static void two_epoch_shuffle(parts *p)
{
    edit(p, "\"epoch_shuffle\":\"1\"", "\"epoch_shuffle\":\"2\"");
}
/* An epoch in progress (the good file is 3 steps into its first) needs
 * the batch size it was started with: fit refuses to finish it with any
 * other, so 0 would make the file unresumable, not merely unusual. */
static void zero_epoch_batch(parts *p)
{
    edit(p, "\"epoch_batch\":\"16\"", "\"epoch_batch\":\"0\"");
}
/* The good file is at step 3 of 7 (101 samples in batches of 16). */
static void step_past_the_epoch(parts *p)
{
    edit(p, "\"step_in_epoch\":\"3\"", "\"step_in_epoch\":\"7\"");
}
static void last_step_of_the_epoch(parts *p)
{
    edit(p, "\"step_in_epoch\":\"3\"", "\"step_in_epoch\":\"6\"");
}
/* As written before these keys existed. */
static void no_epoch_order(parts *p)
{
    edit(p, "\"epoch_samples\":", "\"comment_a\":");
    edit(p, "\"epoch_shuffle\":", "\"comment_b\":");
}

/* The good file's fit was to run 1000 epochs (checkpoint_support.c). */
static void zero_target_epochs(parts *p)
{
    edit(p, "\"target_epochs\":\"1000\"", "\"target_epochs\":\"0\"");
}
static void target_below_the_epoch(parts *p)
{
    edit(p, "\"target_epochs\":\"1000\"", "\"target_epochs\":\"1\"");
    edit(p, "\"epoch\":\"0\"", "\"epoch\":\"2\"");
}
static void no_target_epochs(parts *p)
{
    edit(p, "\"target_epochs\":", "\"comment_c\":");
}

Test(checkpoint, bad_target_epochs)
{
    corrupt_case(zero_target_epochs, CASTOR_FORMAT, "'target_epochs' is '0'");
    corrupt_case(target_below_the_epoch, CASTOR_FORMAT, "'target_epochs' is '1'");
}

/* Files written before the key lack it: they load, and save without it. */
Test(checkpoint, target_epochs_absent_from_older_files)
{
    parts p = load_and_save_again(no_target_epochs, -1);
    cr_assert_null(strstr(p.header, "target_epochs"), "%s", p.header);
    parts_free(&p);
}

Test(checkpoint, bad_epoch_order)
{
    corrupt_case(zero_epoch_samples, CASTOR_FORMAT, "'epoch_samples' is '0'");
    corrupt_case(two_epoch_shuffle, CASTOR_FORMAT, "'epoch_shuffle' is '2'");
    corrupt_case(zero_epoch_batch, CASTOR_FORMAT, "'epoch_batch' is '0'");
    /* It loaded, and then every fit refused the model ("is this the
     * dataset it was trained on?"). */
    corrupt_case(step_past_the_epoch, CASTOR_FORMAT,
                 "'step_in_epoch' is '7', not below 7, the steps of an epoch of 101 samples in "
                 "batches of 16");
}

Test(checkpoint, the_last_step_of_an_epoch_loads_and_finishes_it)
{
    fixture fx;
    load_edited(&fx, last_step_of_the_epoch);
    cr_assert_eq(castor_model_step_in_epoch(fx.m), 6);
    castor_dataset *same = support_synthetic(5, N, F, C);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.max_steps = 1;
    cr_assert_eq(castor_model_fit(fx.m, same, &fo, NULL), CASTOR_OK, "%s",
                 castor_model_errmsg(fx.m));
    cr_assert_eq(castor_model_step_in_epoch(fx.m), 0, "the one step left ends the epoch");
    castor_dataset_free(same);
    ckpt_teardown(&fx);
}

Test(checkpoint, epoch_order_absent_from_older_files)
{
    fixture fx;
    load_edited(&fx, no_epoch_order);
    cr_assert_eq(castor_model_step_in_epoch(fx.m), 3);
    /* Nothing to hold the epoch in progress to: it goes on over other data. */
    castor_dataset *other = support_synthetic(5, N + 40, F, C);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.shuffle = 0;
    cr_assert_eq(castor_model_fit(fx.m, other, &fo, NULL), CASTOR_OK, "%s",
                 castor_model_errmsg(fx.m));
    castor_dataset_free(other);
    ckpt_teardown(&fx);
}

/* With no order recorded the epoch in progress may go on over other data,
 * but not over data whose epoch it has already passed the end of: fit
 * refuses an epoch of 3 steps to a model at step 3 (one that took it for
 * an epoch to finish ran no step and returned CASTOR_OK). */
Test(checkpoint, older_files_at_the_end_of_the_data_epoch_are_refused)
{
    fixture fx;
    load_edited(&fx, no_epoch_order);
    cr_assert_eq(castor_model_step_in_epoch(fx.m), 3);
    castor_dataset *three_steps = support_synthetic(5, 3 * BATCH, F, C);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.batch_size = BATCH;
    fo.shuffle = 0;
    cr_assert_eq(castor_model_fit(fx.m, three_steps, &fo, NULL), CASTOR_MISMATCH, "%s",
                 castor_model_errmsg(fx.m));
    cr_assert(strstr(castor_model_errmsg(fx.m), "at step 3 of an epoch of 3 steps"), "%s",
              castor_model_errmsg(fx.m));
    castor_dataset_free(three_steps);
    ckpt_teardown(&fx);
}

Test(checkpoint, not_a_castor_checkpoint)
{
    corrupt_case(no_format, CASTOR_FORMAT, "not a castor checkpoint");
}

Test(checkpoint, architecture_mismatch)
{
    fixture fx;
    ckpt_setup(&fx);
    write_bad(&fx, other_layers);
    expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "layers");
    write_bad(&fx, other_optimizer);
    expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "optimizer is adamw");
    /* Metadata alone, the tensors as they were: only its own check refuses
     * a file of another loss, or of another input width. */
    write_bad(&fx, other_loss);
    expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "loss is mse");
    write_bad(&fx, other_input_features);
    expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "takes 13 input features");
    /* a model of another width */
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = ckpt_make_model(s, "32:tanh,8:relu,3", ckpt_make_opt(CASTOR_OPT_ADAM), 1);
    cr_assert_eq(castor_model_load(m, fx.good), CASTOR_MISMATCH);
    cr_assert(strstr(castor_model_errmsg(m), "16:tanh"), "%s", castor_model_errmsg(m));
    castor_model_free(m);
    castor_strategy_free(s);
    ckpt_teardown(&fx);
}

Test(checkpoint, load_needs_compiled_model)
{
    castor_model *m = NULL;
    cr_assert_eq(castor_model_create(&m, F), CASTOR_OK);
    cr_assert_eq(castor_model_load(m, "/nonexistent.safetensors"), CASTOR_MISUSE);
    cr_assert_eq(castor_model_save(m, "/tmp/x.safetensors"), CASTOR_MISUSE);
    cr_assert_eq(castor_model_load(NULL, "x"), CASTOR_MISUSE);
    cr_assert_eq(castor_model_open(NULL, "x", NULL), CASTOR_MISUSE);
    cr_assert_eq(castor_model_epoch(NULL), 0);
    castor_model_free(m);
    /* open with no strategy read the whole file first, then said "compile
     * needs a strategy", naming neither the call nor the file. */
    m = NULL;
    cr_assert_eq(castor_model_open(&m, "/nonexistent.safetensors", NULL), CASTOR_MISUSE);
    cr_assert_str_eq(castor_model_errmsg(m),
                     "/nonexistent.safetensors: open needs a strategy to compile the model on");
    castor_model_free(m);
}

/* open on a strategy that has a model read and parsed the whole file, then
 * refused it (CASTOR_MISUSE): the strategy is checked first. A file that
 * is not there shows it: it said "cannot open" (CASTOR_IO) before. */
Test(checkpoint, open_on_a_taken_strategy_refuses_before_reading)
{
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *held = ckpt_make_model(s, "4:relu,3", ckpt_make_opt(CASTOR_OPT_SGD), 1);
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, "/nonexistent.safetensors", s), CASTOR_MISUSE, "%s",
                 castor_model_errmsg(m));
    cr_assert_str_eq(castor_model_errmsg(m), "/nonexistent.safetensors: the strategy already "
                     "has a compiled model; free it first");
    castor_model_free(m);
    castor_model_free(held);
    castor_strategy_free(s);
}

/* ---- metadata that lies about sizes and positions (review findings) ---------------------- */

static void huge_step(parts *p)
{
    char *at = strstr(p->header, "\"step\":\"");
    cr_assert(at);
    char *end = strchr(at + 8, '"');
    size_t old = (size_t)(end - (at + 8));
    char *h = malloc(strlen(p->header) + 32);
    memcpy(h, p->header, (size_t)(at + 8 - p->header));
    strcpy(h + (at + 8 - p->header), "9223372036854775807");
    strcat(h, at + 8 + old);
    free(p->header);
    p->header = h;
}
static void nesterov_seven(parts *p) { edit(p, "\"nesterov\":\"0\"", "\"nesterov\":\"7\""); }
static void huge_input(parts *p)
{
    edit(p, "\"input_features\":\"12\"", "\"input_features\":\"20000000\"");
}

Test(checkpoint, step_past_what_a_checkpoint_name_holds)
{
    /* INT64_MAX passed before, and training on from it overflowed. */
    corrupt_case(huge_step, CASTOR_FORMAT, "'step'");
}

Test(checkpoint, nesterov_must_be_0_or_1)
{
    /* '7' passed the bounded parse before: (max - digit) wrapped. */
    corrupt_case(nesterov_seven, CASTOR_FORMAT, "'nesterov'");
}

/* The fixture's optimizer is Adam: settings that only another kind reads. */
static void adam_with_momentum(parts *p) { edit(p, "\"momentum\":\"0\"", "\"momentum\":\"0.9\""); }
static void adam_with_decay(parts *p)
{
    edit(p, "\"weight_decay\":\"0\"", "\"weight_decay\":\"0.004\"");
}
static void adam_with_nesterov(parts *p) { edit(p, "\"nesterov\":\"0\"", "\"nesterov\":\"1\""); }

Test(checkpoint, settings_the_optimizer_would_drop_are_a_format_error)
{
    /* compile refuses them: open failed with CASTOR_INVALID (the CLI's usage
     * error) and a message without the file's name, while load took the
     * same file and dropped them without a word. */
    corrupt_case(adam_with_momentum, CASTOR_FORMAT, "momentum applies to sgd only");
    corrupt_case(adam_with_decay, CASTOR_FORMAT, "weight_decay applies to adamw only");
    corrupt_case(adam_with_nesterov, CASTOR_FORMAT, "nesterov applies to sgd only");
}

/* castor_model_open on fx.good changed by mutate fails with CASTOR_FORMAT,
 * naming the file, with fragment in the message; the strategy is left free
 * for a model at once (nothing was compiled onto it). */
static void open_case(void (*mutate)(parts *), const char *fragment)
{
    fixture fx;
    ckpt_setup(&fx);
    write_bad(&fx, mutate);
    castor_strategy *s = ckpt_make_strategy(CASTOR_STRATEGY_CENTRAL, "cpu");
    castor_model *m = NULL;
    cr_assert_eq(castor_model_open(&m, fx.bad, s), CASTOR_FORMAT, "%s",
                 castor_model_errmsg(m));
    const char *msg = castor_model_errmsg(m);
    cr_assert(strstr(msg, fx.bad) && strstr(msg, fragment), "%s", msg);
    castor_model_free(m);
    castor_model *ok = ckpt_make_model(s, LAYERS, ckpt_make_opt(CASTOR_OPT_ADAM), 1);
    castor_model_free(ok);
    castor_strategy_free(s);
    ckpt_teardown(&fx);
}

static void wider_first_layer(parts *p)
{
    edit(p, "\"layers\":\"16:tanh,", "\"layers\":\"4096:tanh,");
}

Test(checkpoint, open_bad_input_features_is_a_format_error)
{
    open_case(huge_input, "bad architecture");
}

Test(checkpoint, open_holds_the_metadata_to_the_tensors_before_allocating)
{
    /* A few bytes of metadata asking for a much larger model: open refuses
     * it from the tensors' sizes before compile allocates for it. */
    open_case(wider_first_layer, "the tensors hold");
}

/* Models compile refuses for softmax cross-entropy: the file is wrong, not
 * the caller (open gave compile's CASTOR_INVALID without the file's name,
 * which the CLI's eval reports as a usage error). */
static void relu_logits(parts *p) { edit(p, ",3:linear\"", ",3:relu\""); }
static void one_class(parts *p) { edit(p, ",3:linear\"", ",1:linear\""); }

Test(checkpoint, open_a_model_compile_refuses_is_a_format_error)
{
    open_case(relu_logits, "the last layer must be linear");
    open_case(one_class, "at least 2 output units");
}

/* Text from the file reaches messages escaped: no terminal control codes. */
static void escape_in_format(parts *p)
{
    edit(p, "\"format\":\"castor-checkpoint-1\"", "\"format\":\"\\u001b[2J\\u001b[31mpwned\\n\"");
}
static void escape_in_tensor_name(parts *p) { append_tensor(p, "x\\u001b[31m\\r"); }

static void expect_escaped(void (*mutate)(parts *), int code)
{
    fixture fx;
    ckpt_setup(&fx);
    write_bad(&fx, mutate);
    int rc = castor_model_load(fx.m, fx.bad);
    const char *msg = castor_model_errmsg(fx.m);
    cr_assert_eq(rc, code, "%s", msg);
    for (const char *c = msg; *c; c++)
        cr_assert((unsigned char)*c >= 0x20 && *c != 0x7f, "control byte %#x in: %s",
                  (unsigned char)*c, msg);
    cr_assert(strstr(msg, "\\x1b"), "the escape is shown as text: %s", msg);
    ckpt_teardown(&fx);
}

Test(checkpoint, file_text_in_messages_is_escaped)
{
    expect_escaped(escape_in_format, CASTOR_FORMAT);
    expect_escaped(escape_in_tensor_name, CASTOR_MISMATCH);
}

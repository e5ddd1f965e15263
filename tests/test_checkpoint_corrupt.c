/*
 * Checkpoints that must not be trusted: corrupt and truncated files,
 * architecture and optimizer mismatches, metadata that lies about sizes and
 * settings, and file text that reaches messages. A failed load or open
 * leaves the model as it was. (Metadata that misstates where the run stands:
 * test_checkpoint_bad_position.c; the edits both make: checkpoint_support.h.)
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

/* Put the data section's CRC into the header (after edits to the data). */
static void fix_crc(parts *p)
{
    char *at = strstr(p->header, "\"crc32\":\"");
    cr_assert(at);
    char hex[9];
    snprintf(hex, sizeof hex, "%08lx", crc32(0, p->data, (uInt)p->data_len));
    memcpy(at + 9, hex, 8);
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
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "truncated");
    cr_assert_eq(support_write_file(fx.bad, b, 6), 0);
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "truncated");
    free(b);
    ckpt_teardown(&fx);
}

Test(checkpoint, empty_file)
{
    fixture fx;
    ckpt_setup(&fx);
    cr_assert_eq(support_write_file(fx.bad, "", 0), 0);
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "empty file");
    ckpt_teardown(&fx);
}

Test(checkpoint, directory_as_file)
{
    fixture fx;
    ckpt_setup(&fx);
    ckpt_expect_load_fails(&fx, fx.dir, CASTOR_IO, "directory");
    ckpt_teardown(&fx);
}

Test(checkpoint, missing_file)
{
    fixture fx;
    ckpt_setup(&fx);
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_IO, "No such file");
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
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_FORMAT, "header length");
    free(b);
    ckpt_teardown(&fx);
}

static void not_json(parts *p) { p->header[1] = 'x'; }
static void wrong_dtype(parts *p)
{
    ckpt_edit(p, "\"dense_0.kernel\":{\"dtype\":\"F32\"", "\"dense_0.kernel\":{\"dtype\":\"F64\"");
}
static void swapped_shape(parts *p)
{
    ckpt_edit(p, "\"dense_0.kernel\":{\"dtype\":\"F32\",\"shape\":[12,16]",
              "\"dense_0.kernel\":{\"dtype\":\"F32\",\"shape\":[16,12]");
}
static void overlapping(parts *p)
{
    /* the bias moved back by 16 bytes onto the kernel; its old end leaves a hole too */
    ckpt_edit(p, "\"data_offsets\":[768,832]", "\"data_offsets\":[752,816]");
}
static void out_of_range(parts *p)
{
    ckpt_edit(p, "\"data_offsets\":[0,768]", "\"data_offsets\":[1000000,1000768]");
}
static void flipped_byte(parts *p) { p->data[p->data_len / 2] ^= 0x10; }
static void renamed_tensor(parts *p) { ckpt_edit(p, "\"dense_1.bias\":", "\"dense_1.b\":"); }
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
static void other_layers(parts *p)
{
    ckpt_edit(p, "\"layers\":\"16:tanh,", "\"layers\":\"16:relu,");
}
static void other_optimizer(parts *p)
{
    ckpt_edit(p, "\"optimizer\":\"adam\"", "\"optimizer\":\"adamw\"");
}
static void no_format(parts *p) { ckpt_edit(p, "\"format\":", "\"formax\":"); }
static void other_loss(parts *p) { ckpt_edit(p, "\"loss\":\"softmax_xent\"", "\"loss\":\"mse\""); }
static void other_input_features(parts *p)
{
    ckpt_edit(p, "\"input_features\":\"12\"", "\"input_features\":\"13\"");
}
static void crc_of_nine_digits(parts *p) { ckpt_edit(p, "\"crc32\":\"", "\"crc32\":\"0"); }
static void rate_after_a_blank(parts *p)
{
    ckpt_edit(p, "\"learning_rate\":\"", "\"learning_rate\":\" ");
}

Test(checkpoint, header_not_json) { ckpt_corrupt_case(not_json, CASTOR_FORMAT, "not valid JSON"); }

Test(checkpoint, wrong_dtype) { ckpt_corrupt_case(wrong_dtype, CASTOR_FORMAT, "dtype 'F64'"); }

Test(checkpoint, shape_mismatch)
{
    ckpt_corrupt_case(swapped_shape, CASTOR_MISMATCH,
                      "tensor dense_0.kernel has shape [16,12], the model expects [12,16]");
}

Test(checkpoint, overlapping_offsets) { ckpt_corrupt_case(overlapping, CASTOR_FORMAT, "overlap"); }

Test(checkpoint, out_of_range_offsets)
{
    ckpt_corrupt_case(out_of_range, CASTOR_FORMAT, "past the end");
}

Test(checkpoint, flipped_data_byte) { ckpt_corrupt_case(flipped_byte, CASTOR_FORMAT, "CRC-32"); }

Test(checkpoint, missing_tensor)
{
    ckpt_corrupt_case(renamed_tensor, CASTOR_MISMATCH, "dense_1.bias is missing");
}

Test(checkpoint, extra_tensor)
{
    ckpt_corrupt_case(extra_tensor, CASTOR_MISMATCH, "unexpected tensor 'dense_9.kernel'");
}

Test(checkpoint, bad_metadata_value) { ckpt_corrupt_case(bad_step, CASTOR_FORMAT, "'step'"); }

static void zero_features(parts *p)
{
    ckpt_edit(p, "\"input_features\":\"12\"", "\"input_features\":\"0\"");
}

/* No model has 0 inputs: the file is wrong, not the model it is loaded into. */
Test(checkpoint, zero_input_features)
{
    ckpt_corrupt_case(zero_features, CASTOR_FORMAT, "'input_features' is '0'");
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
    ckpt_edit(p, from, to);
    p->data = realloc(p->data, p->data_len + 4);
    memset(p->data + p->data_len, 0, 4);
    p->data_len += 4;
    fix_crc(p);
}

/* A rank-1 tensor's one dimension is compared too. */
Test(checkpoint, bias_of_another_length)
{
    ckpt_corrupt_case(longer_last_bias, CASTOR_MISMATCH,
                      "tensor dense_2.bias.adam_v has shape [4], the model expects [3]");
}

/* zlib's CRC-32 is 8 hex digits: a ninth (a leading 0 that strtoul reads
 * to the same value) is not what castor writes. */
Test(checkpoint, crc_of_nine_digits)
{
    ckpt_corrupt_case(crc_of_nine_digits, CASTOR_FORMAT, "'crc32' is '0");
}

/* A number is the number alone: strtof would skip the blank before it. */
Test(checkpoint, float_after_a_blank)
{
    ckpt_corrupt_case(rate_after_a_blank, CASTOR_FORMAT, "'learning_rate' is ' ");
}

/* input_shape and input_type (the data a model was trained on) go together,
 * name an IDX type, and multiply out to input_features (F = 12). */
static void shape_without_type(parts *p)
{
    ckpt_edit(p, "\"seed\":", "\"input_shape\":\"3x4\",\"seed\":");
}
static void unknown_input_type(parts *p)
{
    ckpt_edit(p, "\"seed\":", "\"input_shape\":\"3x4\",\"input_type\":\"float16\",\"seed\":");
}
static void shape_of_other_features(parts *p)
{
    ckpt_edit(p, "\"seed\":", "\"input_shape\":\"3x3\",\"input_type\":\"ubyte\",\"seed\":");
}
static void shape_of_four_dims(parts *p)
{
    ckpt_edit(p, "\"seed\":", "\"input_shape\":\"1x3x2x2\",\"input_type\":\"ubyte\",\"seed\":");
}

Test(checkpoint, bad_input_shape_or_type)
{
    ckpt_corrupt_case(shape_without_type, CASTOR_FORMAT, "'input_type'");
    ckpt_corrupt_case(unknown_input_type, CASTOR_FORMAT, "'input_type' is 'float16'");
    ckpt_corrupt_case(shape_of_other_features, CASTOR_FORMAT, "'input_shape' is '3x3'");
    ckpt_corrupt_case(shape_of_four_dims, CASTOR_FORMAT, "'input_shape' is '1x3x2x2'");
}

Test(checkpoint, not_a_castor_checkpoint)
{
    ckpt_corrupt_case(no_format, CASTOR_FORMAT, "not a castor checkpoint");
}

Test(checkpoint, architecture_mismatch)
{
    fixture fx;
    ckpt_setup(&fx);
    ckpt_write_bad(&fx, other_layers);
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "layers");
    ckpt_write_bad(&fx, other_optimizer);
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "optimizer is adamw");
    /* Metadata alone, the tensors as they were: only its own check refuses
     * a file of another loss, or of another input width. */
    ckpt_write_bad(&fx, other_loss);
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "loss is mse");
    ckpt_write_bad(&fx, other_input_features);
    ckpt_expect_load_fails(&fx, fx.bad, CASTOR_MISMATCH, "takes 13 input features");
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

/* ---- metadata that lies about sizes and settings (review findings) ----------------------- */

static void nesterov_seven(parts *p) { ckpt_edit(p, "\"nesterov\":\"0\"", "\"nesterov\":\"7\""); }
static void huge_input(parts *p)
{
    ckpt_edit(p, "\"input_features\":\"12\"", "\"input_features\":\"20000000\"");
}

Test(checkpoint, nesterov_must_be_0_or_1)
{
    /* '7' passed the bounded parse before: (max - digit) wrapped. */
    ckpt_corrupt_case(nesterov_seven, CASTOR_FORMAT, "'nesterov'");
}

/* The fixture's optimizer is Adam: settings that only another kind reads. */
static void adam_with_momentum(parts *p)
{
    ckpt_edit(p, "\"momentum\":\"0\"", "\"momentum\":\"0.9\"");
}
static void adam_with_decay(parts *p)
{
    ckpt_edit(p, "\"weight_decay\":\"0\"", "\"weight_decay\":\"0.004\"");
}
static void adam_with_nesterov(parts *p)
{
    ckpt_edit(p, "\"nesterov\":\"0\"", "\"nesterov\":\"1\"");
}

Test(checkpoint, settings_the_optimizer_would_drop_are_a_format_error)
{
    /* compile refuses them: open failed with CASTOR_INVALID (the CLI's usage
     * error) and a message without the file's name, while load took the
     * same file and dropped them without a word. */
    ckpt_corrupt_case(adam_with_momentum, CASTOR_FORMAT, "momentum applies to sgd only");
    ckpt_corrupt_case(adam_with_decay, CASTOR_FORMAT, "weight_decay applies to adamw only");
    ckpt_corrupt_case(adam_with_nesterov, CASTOR_FORMAT, "nesterov applies to sgd only");
}

/* castor_model_open on fx.good changed by mutate fails with CASTOR_FORMAT,
 * naming the file, with fragment in the message; the strategy is left free
 * for a model at once (nothing was compiled onto it). */
static void open_case(void (*mutate)(parts *), const char *fragment)
{
    fixture fx;
    ckpt_setup(&fx);
    ckpt_write_bad(&fx, mutate);
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
    ckpt_edit(p, "\"layers\":\"16:tanh,", "\"layers\":\"4096:tanh,");
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
static void relu_logits(parts *p) { ckpt_edit(p, ",3:linear\"", ",3:relu\""); }
static void one_class(parts *p) { ckpt_edit(p, ",3:linear\"", ",1:linear\""); }

Test(checkpoint, open_a_model_compile_refuses_is_a_format_error)
{
    open_case(relu_logits, "the last layer must be linear");
    open_case(one_class, "at least 2 output units");
}

/* Text from the file reaches messages escaped: no terminal control codes. */
static void escape_in_format(parts *p)
{
    ckpt_edit(p, "\"format\":\"castor-checkpoint-1\"",
              "\"format\":\"\\u001b[2J\\u001b[31mpwned\\n\"");
}
static void escape_in_tensor_name(parts *p) { append_tensor(p, "x\\u001b[31m\\r"); }

static void expect_escaped(void (*mutate)(parts *), int code)
{
    fixture fx;
    ckpt_setup(&fx);
    ckpt_write_bad(&fx, mutate);
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

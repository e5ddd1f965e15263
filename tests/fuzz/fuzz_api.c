/*
 * libFuzzer harness: the public API (castor.h, nothing else of castor's)
 * driven through call sequences decoded from the input. A few strategies,
 * models, datasets and checkpoint files live in slots; each input byte
 * picks the next call and its arguments, good ones and bad ones, and fit's
 * progress callback and the stop check run calls of their own (the running
 * model's among them: what castor.h allows there, and what it says is
 * CASTOR_MISUSE there).
 *
 * Besides ASan, UBSan and LSan, what castor.h promises is checked, and a
 * broken promise aborts: a failure's message is never empty nor "no error";
 * the status of a call whose outcome the header decides is that one (the
 * harness keeps its own account of each handle: compiled or not, on which
 * strategy, the epoch in progress, ...); set_params then get_params, and
 * save then load or open, give the same bytes back; a load that fails
 * leaves the model as it was; a fit at a sane rate on finite data leaves
 * finite variables; run_stats counts the steps taken; a stop check or
 * progress callback that says stop stops the call where the header says.
 *
 * Kept tiny (at most 9 samples of 8 features, 16 units a layer) so that an
 * input runs in milliseconds.
 *
 * This file is the entry point and the choice of call; the rest is in
 * tests/fuzz/api/ (make fuzz builds them with it), a file an idea: the input
 * (input.c), the account and its checks (account.c), the callbacks and the
 * running calls (callbacks.c), the calls on strategies, models and datasets
 * (handles.c), training (training.c), variables (variables.c), checkpoints
 * (checkpoints.c), resuming (resume.c), and harness.h between them.
 */
#include <string.h>

#include "tests/fuzz/api/harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);
/* OpenBLAS reads OPENBLAS_NUM_THREADS as it loads, before the setenv below. */
void openblas_set_num_threads(int num_threads);

/* ---- the calls an input picks, and the entry points ----------------------------- */

static void op_names(void)
{
    int code = (int)u8() - 64;
    const char *s = castor_errstr(code);
    CHECK(s && s[0], "errstr(%d)", code);
    char name[8];
    for (size_t i = 0; i < sizeof name - 1; i++)
        name[i] = (char)u8();
    name[sizeof name - 1] = '\0';
    castor_activation a = (castor_activation)99;
    int rc = castor_activation_parse(name, &a);
    CHECK(rc == CASTOR_OK ? (int)a >= 0 && a <= 3 : rc == CASTOR_INVALID && (int)a == 99,
          "activation_parse");
    castor_optimizer_kind k = (castor_optimizer_kind)99;
    rc = castor_optimizer_kind_parse(name, &k);
    CHECK(rc == CASTOR_OK ? (int)k >= 0 && k <= 2 : rc == CASTOR_INVALID && (int)k == 99,
          "optimizer_kind_parse");
    castor_strategy_kind sk = (castor_strategy_kind)99;
    rc = castor_strategy_kind_parse(name, &sk);
    CHECK(rc == CASTOR_OK ? (int)sk >= 0 && sk <= 1 : rc == CASTOR_INVALID && (int)sk == 99,
          "strategy_kind_parse");
}

void do_op(void)
{
    switch (pick(22)) {
    case 0:
        op_names();
        break;
    case 1:
        op_strategy_free();
        break;
    case 2:
        op_model_create();
        break;
    case 3:
        op_layers_spec();
        break;
    case 4:
        op_add_dense();
        break;
    case 5:
        op_add_layers();
        break;
    case 6:
        op_compile();
        break;
    case 7:
        op_model_free();
        break;
    case 8:
        op_dataset_create();
        break;
    case 9:
        op_dataset_split();
        break;
    case 10:
        op_dataset_free();
        break;
    case 11:
    case 12:
        op_fit();
        break;
    case 13:
        op_evaluate();
        break;
    case 14:
        op_predict();
        break;
    case 15:
        op_params();
        break;
    case 16:
        op_learning_rate();
        break;
    case 17:
        op_stats();
        break;
    case 18:
        op_stop_check();
        break;
    case 19:
        op_save();
        break;
    case 20:
        if (u8() & 1)
            op_damage();
        else
            op_load();
        break;
    default:
        switch (u8() % 5) {
        case 0:
        case 1:
            op_open();
            break;
        case 2:
            op_resume();
            break;
        default:
            op_strategy_create();
        }
    }
}

/* What castor.h says of every call on NULL, and of the names: checked once. */
static void static_checks(void)
{
    for (int code = -3; code < 20; code++)
        CHECK(castor_errstr(code) && castor_errstr(code)[0], "errstr(%d)", code);
    CHECK(castor_version_number() == CASTOR_VERSION_NUMBER, "version");
    CHECK(strcmp(castor_version(), CASTOR_VERSION_STRING) == 0, "version string");
    CHECK(strcmp(castor_activation_name((castor_activation)9), "unknown") == 0, "name");
    CHECK(strcmp(castor_optimizer_kind_name((castor_optimizer_kind)9), "unknown") == 0, "name");
    CHECK(strcmp(castor_strategy_kind_name((castor_strategy_kind)9), "unknown") == 0, "name");
    castor_activation a = CASTOR_ACT_TANH;
    CHECK(castor_activation_parse(NULL, &a) == CASTOR_INVALID && a == CASTOR_ACT_TANH, "parse");
    CHECK(castor_activation_parse("relu", NULL) == CASTOR_INVALID, "parse");
    CHECK(castor_activation_parse("ReLu", &a) == CASTOR_OK && a == CASTOR_ACT_RELU, "parse");
    CHECK(castor_strategy_create(NULL, CASTOR_STRATEGY_CENTRAL, "cpu", NULL) == CASTOR_MISUSE,
          "create(NULL)");
    CHECK(castor_model_create(NULL, 3) == CASTOR_MISUSE, "create(NULL)");
    float x = 0;
    int32_t y = 0;
    CHECK(castor_dataset_from_memory(NULL, &x, 1, 1, &y, NULL, 0) == CASTOR_MISUSE, "from(NULL)");
    CHECK(castor_model_add_dense(NULL, 3, CASTOR_ACT_RELU) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_add_layers(NULL, "3") == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_compile(NULL, NULL, CASTOR_LOSS_MSE, NULL, 0) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_fit(NULL, NULL, NULL, NULL) == CASTOR_MISUSE, "NULL");
    castor_metrics met;
    CHECK(castor_model_evaluate(NULL, NULL, 1, &met) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_predict(NULL, &x, 1, 1, &x) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_get_params(NULL, &x, 1) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_set_params(NULL, &x, 1) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_set_learning_rate(NULL, 0.1f) == CASTOR_MISUSE, "NULL");
    int fin;
    CHECK(castor_model_all_finite(NULL, &fin) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_set_stop_check(NULL, NULL, NULL) == CASTOR_MISUSE, "NULL");
    castor_run_stats st;
    CHECK(castor_model_run_stats(NULL, &st) == CASTOR_MISUSE, "NULL");
    castor_model_reset_run_stats(NULL);
    CHECK(castor_model_save(NULL, "x") == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_load(NULL, "x") == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_open(NULL, "x", NULL) == CASTOR_MISUSE, "NULL");
    castor_dataset *tail;
    CHECK(castor_dataset_split_tail(NULL, 1, &tail) == CASTOR_MISUSE, "NULL");
    char buf[8];
    CHECK(castor_model_layers_spec(NULL, buf, sizeof buf) == CASTOR_MISUSE, "NULL");
    CHECK(castor_model_learning_rate(NULL) == 0.0f, "NULL");
    CHECK(castor_strategy_replicas(NULL) == 0, "NULL");
    CHECK(errmsg_ok(castor_model_errmsg(NULL)) && errmsg_ok(castor_strategy_errmsg(NULL)) &&
              errmsg_ok(castor_dataset_errmsg(NULL)),
          "errmsg(NULL)");
    castor_model_free(NULL);
    castor_strategy_free(NULL);
    castor_dataset_free(NULL);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    trace = getenv("FUZZ_API_TRACE") != NULL;
    openblas_set_num_threads(1);
    static_checks();
    return 0;
}


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_start(data, size);
    make_dir();
    for (int s = 0; s < NS; s++)
        strats[s].bound = -1;
    unsigned order = u8();
    for (int i = 0; i < MAX_OPS && input_left(); i++)
        do_op();
    CHECK(n_runs == 0 && cb_depth == 0, "run stack");
    /* Everything freed, in an order the input picks. */
    for (int k = 0; k < 3; k++) {
        switch ((order + (unsigned)k) % 3) {
        case 0:
            for (int m = 0; m < NM; m++)
                model_free((m + (int)(order >> 2)) % NM);
            break;
        case 1:
            for (int s = 0; s < NS; s++)
                strat_free((s + (int)(order >> 4)) % NS);
            break;
        default:
            for (int d = 0; d < ND; d++)
                data_free(d);
        }
    }
    for (int f = 0; f < NF; f++)
        file_forget(f);
    check_dir();
    remove_dir();
    return 0;
}

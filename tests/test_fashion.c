/* The real data: the demo model on Fashion-MNIST reaches 0.85 test accuracy. */
#include <criterion/criterion.h>

#include "castor.h"
#include "support.h"

Test(fashion, central_cpu2_accuracy, .timeout = 240)
{
    const char *dir = support_fashion_dir();
    cr_assert(dir, "Fashion-MNIST is missing: install the Debian package dataset-fashion-mnist "
                   "(scripts/install-deps) or set CASTOR_FASHION_MNIST");
    castor_dataset *train = NULL, *test = NULL;
    cr_assert_eq(castor_dataset_load_mnist_dir(&train, dir, "train"), CASTOR_OK, "%s",
                 castor_dataset_errmsg(train));
    cr_assert_eq(castor_dataset_load_mnist_dir(&test, dir, "test"), CASTOR_OK, "%s",
                 castor_dataset_errmsg(test));
    castor_strategy *s = NULL;
    cr_assert_eq(castor_strategy_create(&s, CASTOR_STRATEGY_CENTRAL, "cpu:2", NULL), CASTOR_OK);
    castor_model *m = NULL;
    castor_model_create(&m, castor_dataset_features(train));
    castor_model_add_layers(m, "128:relu,10");
    cr_assert_eq(castor_model_compile(m, s, CASTOR_LOSS_SOFTMAX_XENT, NULL, 1), CASTOR_OK);
    castor_fit_options fo = CASTOR_FIT_OPTIONS_INIT;
    fo.epochs = 4;
    fo.batch_size = 256;
    cr_assert_eq(castor_model_fit(m, train, &fo, NULL), CASTOR_OK, "%s", castor_model_errmsg(m));
    castor_metrics ev;
    cr_assert_eq(castor_model_evaluate(m, test, 1000, &ev), CASTOR_OK);
    cr_assert(ev.accuracy >= 0.85, "test accuracy %.4f < 0.85", ev.accuracy);
    castor_model_free(m);
    castor_strategy_free(s);
    castor_dataset_free(train);
    castor_dataset_free(test);
}

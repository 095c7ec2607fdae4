"""The train half of the quality gate on a real Keras network."""
import numpy as np
import pytest

from sparkdeep.pipelines.evaluate import QualityGateError
from sparkdeep.pipelines.train import check_finite
from sparkdeep.transformers.keras import network
from sparkdeep.transformers.keras_estimator import DistributedKerasModel
from sparkdeep.transformers.keras_models import mlp_binary_classifier


def test_a_network_with_nan_weights_fails_the_gate():
    # Issue 11.5: training with an infinite learning rate gave NaN weights, saved and served.
    net = mlp_binary_classifier(4, hidden_units=[3], dropout=0.0)
    history = [{"epoch": 1, "loss": 0.69, "auc": 0.5}]
    check_finite(DistributedKerasModel(kerasBytes=network.keras_to_bytes(net),
                                   trainingSummary={"history": history}))
    weights = net.get_weights()
    weights[0] = np.full_like(weights[0], np.nan)
    net.set_weights(weights)
    nan_model = DistributedKerasModel(kerasBytes=network.keras_to_bytes(net), trainingSummary={"history": history})
    with pytest.raises(QualityGateError, match=r"weights not finite: .*kernel \(12 of 12 values\)"):
        check_finite(nan_model)


@pytest.mark.parametrize("rows, num_proc, expected", [
    (235_000, 2, 1024),  # the flights' training rows: capped
    (43_000, 2, 256),    # diamonds: 38.7k per rank after validation / 64 = 302 -> 256
    (43_000, 1, 512),
    (3_000, 2, 16 * 2),  # a tiny table: the floor, 32
    (0, 2, 32),
])
def test_batch_size_zero_is_chosen_from_the_row_count(rows, num_proc, expected):
    from sparkdeep.pipelines.train import auto_batch_size
    batch = auto_batch_size(rows, num_proc, 0.1)
    assert batch == expected
    if 32 < batch < 1024:  # at least 64 updates per rank per epoch, and not twice the batch
        per_rank = rows * 0.9 / num_proc
        assert per_rank / batch >= 64 > per_rank / (2 * batch)


def test_the_estimator_takes_an_explicit_batch_or_one_from_the_rows(repo_root):
    import os

    from sparkdeep.config import load_config
    from sparkdeep.pipelines.train import keras_estimator
    base = load_config(os.path.join(repo_root, "conf"), env="local")
    assert base.train.batch_size == 0
    assert keras_estimator(base.train, task="binary", seed=1, rows=43_000).getBatchSize() == 256
    with pytest.raises(ValueError, match="needs the training row count"):
        keras_estimator(base.train, task="binary", seed=1)
    ci = load_config(os.path.join(repo_root, "conf"), env="ci")
    assert keras_estimator(ci.train, task="binary", seed=1, rows=43_000).getBatchSize() == ci.train.batch_size == 128


def test_the_network_settings_reach_the_tabular_builder(repo_root):
    """train.numeric_embedding and train.ensemble (issue 26) become the builder's args; the
    defaults are the ablation's winner: periodic features, one network."""
    import os

    from sparkdeep.config import load_config
    from sparkdeep.pipelines.train import keras_estimator
    from sparkdeep.transformers.keras_models import TABULAR_BUILDERS
    conf = os.path.join(repo_root, "conf")
    layout = {"numeric_dim": 3, "cardinalities": [4, 5]}
    base = load_config(conf)
    args = keras_estimator(base.train, task="binary", seed=1, rows=1000, layout=layout).getModelArgs()
    assert (args["numeric_embedding"], args["ensemble"]) == ("periodic", 0)
    cfg = load_config(conf, overrides=["train.numeric_embedding=none", "train.ensemble=4"])
    est = keras_estimator(cfg.train, task="multiclass", seed=1, rows=1000, layout=layout, classes=["a", "b", "c"])
    assert est.getOrDefault(est.modelBuilder) == TABULAR_BUILDERS["multiclass"]
    assert (est.getModelArgs()["numeric_embedding"], est.getModelArgs()["ensemble"]) == ("none", 4)
    for bad in ("train.numeric_embedding=fourier", "train.ensemble=-1"):
        with pytest.raises(Exception, match=bad.split("=")[0]):
            load_config(conf, overrides=[bad])


def test_the_train_job_s_parameter_server_estimator_takes_the_rate_as_given(repo_root):
    """train.scale_learning_rate (default true) is the synchronous strategies' rule; the job
    does not pass it to parameter_server, whose estimator would refuse it."""
    import os

    from sparkdeep.config import load_config
    from sparkdeep.pipelines.train import keras_estimator
    conf = os.path.join(repo_root, "conf")
    ps = load_config(conf, env="ci", overrides=["train.strategy=parameter_server"])
    est = keras_estimator(ps.train, task="binary", seed=1, rows=1000)
    assert est.getOrDefault(est.strategy) == "parameter_server" and not est.isSet(est.scaleLearningRate)
    est._check_strategy_params()  # no error
    sync = keras_estimator(load_config(conf, env="ci").train, task="binary", seed=1, rows=1000)
    assert sync.isSet(sync.scaleLearningRate) and sync.getOrDefault(sync.scaleLearningRate) is True

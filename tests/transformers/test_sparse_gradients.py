"""Embedding tables of any size: a table larger than a batch's lookups keeps its gradient
sparse, and every strategy trains with it, its replicas identical, its update the dense one's.

The in-process tests take optimizer steps both ways (sparse slices, merged, against the
dense tensor) on tables of 10, 10^3 and 10^5 rows; the Spark ones train two ranks of every
strategy on a column of 10^5 levels."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from sparkdeep.registry import Choices
from sparkdeep.transformers.keras import strategies
from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator

LEVELS = (10, 1_000, 100_000)


def _net(levels: int, seed: int = 0, hidden: int = 8):
    import keras

    from sparkdeep.transformers.keras_models import tabular_binary_classifier
    keras.utils.set_random_seed(seed)
    return tabular_binary_classifier(3, numeric_dim=2, cardinalities=[levels], hidden_units=(hidden,), dropout=0.0)


def _batch(levels: int, rows: int = 64, seed: int = 1):
    rng = np.random.default_rng(seed)
    # Repeated indices on purpose: a row looked up several times in one batch.
    idx = rng.integers(0, min(levels, 8), rows)
    x = np.column_stack([rng.normal(size=(rows, 2)), idx]).astype("float32")
    y = (idx % 2).astype("float32")
    return x, y, np.ones(rows, "float32")


def test_merged_slices_equal_the_dense_tensor_of_their_table():
    import tensorflow as tf
    values = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    g = tf.IndexedSlices(values, tf.constant([3, 0, 3, 3]), tf.constant([5, 2]))
    m = strategies.merge_slices(g)
    assert sorted(m.indices.numpy().tolist()) == [0, 3]
    np.testing.assert_array_equal(tf.convert_to_tensor(m).numpy(), tf.convert_to_tensor(g).numpy())


@pytest.mark.parametrize("levels, sparse_tables", [(10, 0), (1_000, 1), (100_000, 1)])
def test_a_table_stays_sparse_only_when_its_slices_are_smaller_than_it(levels, sparse_tables):
    import tensorflow as tf
    net = _net(levels)
    x, y, w = _batch(levels)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.binary_crossentropy(y[:, None], net(x)))
    grads = strategies.merged(tape.gradient(loss, net.trainable_variables))
    sparse = [g for g in strategies.dense_gradients(grads, lookups=len(y)) if isinstance(g, tf.IndexedSlices)]
    # The table holds levels x width numbers (10 x 6, 10^3 x 24, 10^5 x 24); a batch's
    # slices 64 x (width + 1) at most.
    assert len(sparse) == sparse_tables
    # A batch of 4,096 rows looks up more than the 10^3-row table holds: dense.
    big_batch = [g for g in strategies.dense_gradients(grads, lookups=4096) if isinstance(g, tf.IndexedSlices)]
    assert len(big_batch) == (1 if levels == 100_000 else 0)


@pytest.mark.parametrize("levels", LEVELS)
def test_an_adam_step_on_merged_sparse_gradients_equals_the_dense_step(levels):
    """The step the ranks run (Steps: merged slices, one fused graph call), on sparse
    gradients, against the same step with every gradient densified first."""
    import keras
    import tensorflow as tf

    from sparkdeep.transformers.keras.rank_loop import Steps

    def train(densify: bool):
        net = _net(levels)
        opt = keras.optimizers.Adam(learning_rate=0.05)
        opt.build(net.trainable_variables)

        def reduce(gs):
            return [tf.convert_to_tensor(g) for g in gs] if densify else strategies.dense_gradients(gs, lookups=64)
        steps = Steps(net, opt, keras.losses.get("binary_crossentropy"), "binary", reduce=reduce)
        for seed in range(3):
            steps.fused(*(tf.convert_to_tensor(a) for a in _batch(levels, seed=seed)))
        return [v.numpy() for v in net.trainable_variables]

    for sparse, dense in zip(train(False), train(True)):
        np.testing.assert_allclose(sparse, dense, rtol=1e-5, atol=1e-6)


def test_accumulated_sparse_gradients_add_as_the_dense_ones_do():
    import tensorflow as tf
    a = tf.IndexedSlices(tf.constant([[1.0], [2.0]]), tf.constant([0, 2]), tf.constant([4, 1]))
    b = tf.IndexedSlices(tf.constant([[3.0], [4.0]]), tf.constant([2, 3]), tf.constant([4, 1]))
    total = strategies.scale_gradients(strategies.add_gradients([a], [b]), 0.5)[0]
    assert isinstance(total, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(total).numpy().ravel(), [0.5, 0.0, 2.5, 2.0])


# -- two ranks of every strategy on a column of 10^5 levels ------------------------------

@pytest.fixture(scope="module")
def many_levels(spark):
    """2,000 rows: two numbers and one category of 10^5 levels (an ID, Zipf-like: a few
    frequent), the label a function of the category's parity and the first number."""
    rng = np.random.default_rng(7)
    n = 2_000
    ids = np.minimum(rng.zipf(1.3, n), 100_000) - 1
    nums = rng.normal(size=(n, 2))
    label = ((ids % 2) ^ (nums[:, 0] > 0)).astype(float)
    rows = [(i, float(label[i]), Vectors.dense([nums[i, 0], nums[i, 1], float(ids[i])])) for i in range(n)]
    return spark.createDataFrame(rows, ["id", "label", "features"]).cache()


def _fit(df, strategy: str):
    extra = {"localSteps": 2} if strategy == "local_sgd" else {}
    return DistributedKerasEstimator(
        featuresCol="features", labelCol="label", numProc=2, epochs=1, batchSize=64, learningRate=0.01,
        warmupEpochs=0.0, seed=5, metrics=["auc"], strategy=strategy, model=_net(100_000, hidden=16),
        **extra).fit(df)  # one network, built once with a seed: every strategy starts from the same weights


@pytest.fixture(scope="module")
def fitted_many(many_levels):
    return {name: _fit(many_levels, name) for name in Choices.STRATEGIES}


@pytest.mark.slow
def test_every_strategy_trains_on_a_column_of_a_hundred_thousand_levels(fitted_many):
    for name, model in fitted_many.items():
        s = model.trainingSummary
        assert s["history"] and np.isfinite(s["history"][-1]["loss"]), name
        if name != "parameter_server":  # the synchronous ones end with one set of weights
            assert len({r["weights_digest"] for r in s["ranks"]}) == 1, f"{name}: replicas differ"


@pytest.mark.slow
def test_horovod_s_sparse_reduction_ends_where_the_dense_collective_one_does(fitted_many):
    """Same rows, seeds and shards: Horovod all-gathers the big table's slices, TensorFlow's
    collective all-reduces it dense; the trained weights agree to float tolerance."""
    horovod = fitted_many["horovod"].keras_model().get_weights()
    dense = fitted_many["collective"].keras_model().get_weights()
    for a, b in zip(horovod, dense):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    # Horovod sent the table's slices, not the table: far fewer bytes than the dense strategy.
    sent = {n: fitted_many[n].trainingSummary["ranks"][0]["allreduce_bytes"] for n in ("horovod", "collective")}
    assert sent["horovod"] * 20 < sent["collective"], sent

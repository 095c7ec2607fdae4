"""The tabular networks' embeddings: one ``ColumnEmbeddings`` layer with a shared table per
embedding width, checked against a numpy reference, and cheap to build, save and load at
thousands of categorical columns."""
import io
import json
import os
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from sparkdeep.transformers.keras import network
from sparkdeep.transformers.keras_models import (embedding_dim, tabular_binary_classifier, tabular_classifier,
                                                 tabular_regressor)

# Mixed widths, with columns of one width not next to each other (the output goes back to column order).
CARDS = [2, 3, 40, 7, 300, 3, 2, 41, 1000]
NUMERIC = 3


def tables_by_width(net) -> dict:
    layer = net.get_layer("embeddings")
    out = {}
    for w in layer.weights:
        table = np.asarray(w.numpy())
        assert table.shape[1] not in out, "one table per embedding width"
        out[table.shape[1]] = table
    return out


def reference_embeddings(tables: dict, cards, x_idx: np.ndarray, cap: int = 24) -> np.ndarray:
    """Column i's vector: row offset_i + clip(index, 0, card_i - 1) of its width's table, where
    offset_i sums the cardinalities of the earlier columns of the same width."""
    dims = [embedding_dim(c, cap) for c in cards]
    offsets, seen = [], {}
    for c, d in zip(cards, dims):
        offsets.append(seen.get(d, 0))
        seen[d] = seen.get(d, 0) + c
    cols = []
    for i, (c, d) in enumerate(zip(cards, dims)):
        idx = np.clip(x_idx[:, i], 0, c - 1).astype(int)
        cols.append(tables[d][offsets[i] + idx])
    return np.concatenate(cols, axis=1)


def rows(rng, n, cards):
    numbers = rng.normal(size=(n, NUMERIC))
    idx = np.stack([rng.integers(0, c, size=n) for c in cards], axis=1).astype("float64")
    idx[0] = [c - 1 for c in cards]  # every column's unseen/null bucket
    idx[1, :3] = [-5.0, 1e6, 2.7]  # out of range below and above, a non-integer index
    idx[2] = 1e9
    return np.concatenate([numbers, idx], axis=1).astype("float32")


def test_the_network_matches_a_numpy_reference_of_its_shared_tables():
    import keras
    keras.utils.set_random_seed(7)
    net = tabular_binary_classifier(input_dim=NUMERIC + len(CARDS), numeric_dim=NUMERIC, cardinalities=CARDS,
                                    hidden_units=(8,), normalization="none")
    tables = tables_by_width(net)
    assert sorted(tables) == sorted({embedding_dim(c) for c in CARDS})
    # The tables hold every column's rows, at the widths the per-column Embeddings had.
    for width, table in tables.items():
        assert table.shape[0] == sum(c for c in CARDS if embedding_dim(c) == width)
    x = rows(np.random.default_rng(0), 16, CARDS)
    emb = reference_embeddings(tables, CARDS, x[:, NUMERIC:].astype("float64"))
    features = np.concatenate([x[:, :NUMERIC], emb], axis=1)
    body = keras.Model(net.inputs, net.get_layer("numeric_and_embeddings").output)
    got = np.asarray(body.predict(x, verbose=0))
    assert got.shape == (16, NUMERIC + sum(embedding_dim(c) for c in CARDS))
    np.testing.assert_allclose(got, features, rtol=0, atol=1e-7)
    assert not got[0, NUMERIC:].any(), "unseen/null buckets start at zero"
    # The whole network: Dense + ReLU, then the sigmoid unit.
    k0, b0 = net.get_layer("dense_0").get_weights()
    k1, b1 = net.get_layer("probabilities").get_weights()
    h = np.maximum(features @ k0 + b0, 0.0)
    expected = 1.0 / (1.0 + np.exp(-(h @ k1 + b1)))
    np.testing.assert_allclose(np.asarray(net.predict(x, verbose=0)), expected, rtol=1e-5, atol=1e-6)


def test_every_columns_unseen_bucket_starts_at_zero_and_the_other_rows_do_not():
    import keras
    keras.utils.set_random_seed(1)
    net = tabular_classifier(input_dim=NUMERIC + len(CARDS), num_classes=3, numeric_dim=NUMERIC,
                             cardinalities=CARDS, hidden_units=(4,))
    tables = tables_by_width(net)
    seen = {}
    for c in CARDS:
        d = embedding_dim(c)
        start = seen.get(d, 0)
        seen[d] = start + c
        block = tables[d][start:start + c]
        assert not block[-1].any(), f"the unseen bucket of a cardinality-{c} column is not zero"
        assert np.abs(block[:-1]).min(axis=1).all() and np.abs(block[:-1]).max() <= 0.05


def test_the_layer_keeps_each_columns_width_and_the_validation_errors():
    net = tabular_regressor(input_dim=NUMERIC + len(CARDS), numeric_dim=NUMERIC, cardinalities=CARDS,
                            hidden_units=(5,), embedding_cap=8, target_mean=3.0, target_scale=2.0)
    layer = net.get_layer("embeddings")
    assert layer.get_config()["dims"] == [embedding_dim(c, 8) for c in CARDS]
    assert net.get_layer("dense_0").get_weights()[0].shape == (NUMERIC + sum(embedding_dim(c, 8) for c in CARDS), 5)
    json.dumps(layer.get_config())  # JSON only
    numbers_only = tabular_binary_classifier(input_dim=4, numeric_dim=4, hidden_units=(2,))
    assert not any(type(lay).__name__ == "ColumnEmbeddings" for lay in numbers_only.layers)
    only_cats = tabular_binary_classifier(input_dim=2, numeric_dim=0, cardinalities=[5, 6], hidden_units=(2,))
    assert only_cats.predict(np.array([[1.0, 5.0]], dtype="float32"), verbose=0).shape == (1, 1)
    with pytest.raises(ValueError, match="input_dim = numeric_dim"):
        tabular_binary_classifier(input_dim=5, numeric_dim=3, cardinalities=[4])
    with pytest.raises(ValueError, match="cardinality >= 2"):
        tabular_binary_classifier(input_dim=4, numeric_dim=3, cardinalities=[1])
    with pytest.raises(ValueError, match="normalization must be"):
        tabular_binary_classifier(input_dim=4, numeric_dim=3, cardinalities=[4], normalization="group")
    with pytest.raises(ValueError, match="target_scale must be > 0"):
        tabular_regressor(input_dim=4, numeric_dim=3, cardinalities=[4], target_scale=0.0)


@pytest.fixture(scope="module")
def wide():
    """5,000 categorical columns (cardinalities 2..300) and 10 numbers: built, saved, loaded."""
    import keras
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    cards = [int(c) for c in rng.integers(2, 301, size=5000)]
    t0 = time.perf_counter()
    net = tabular_binary_classifier(input_dim=10 + len(cards), numeric_dim=10, cardinalities=cards)
    t1 = time.perf_counter()
    data = network.keras_to_bytes(net)
    t2 = time.perf_counter()
    back = network.keras_from_bytes(data)
    t3 = time.perf_counter()
    print(f"\n5000 categorical columns: build {t1 - t0:.2f}s, save {t2 - t1:.2f}s, load {t3 - t2:.2f}s, "
          f"{len(data) / 1e6:.1f} MB, {len(net.layers)} layers")
    return cards, net, data, back


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_thousands_of_columns_make_a_few_layers_and_a_few_tables(wide):
    cards, net, data, back = wide
    assert len(net.layers) < 40 and len(back.layers) == len(net.layers)
    embeddings = net.get_layer("embeddings")
    assert len(embeddings.weights) == len({embedding_dim(c) for c in cards}) <= 23
    assert net.get_layer("dense_0").get_weights()[0].shape[0] == 10 + sum(embedding_dim(c) for c in cards)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        config = json.loads(z.read("config.json"))
    layer_cfg = next(lay for lay in config["config"]["layers"] if lay["class_name"] == "ColumnEmbeddings")
    assert layer_cfg["registered_name"] == "sparkdeep>ColumnEmbeddings"
    assert layer_cfg["config"]["cardinalities"] == cards


def test_the_reloaded_wide_network_predicts_as_the_original(wide):
    cards, net, _, back = wide
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(size=(32, 10)), rng.integers(-2, 320, size=(32, len(cards)))],
                       axis=1).astype("float32")
    for a, b in zip(net.get_weights(), back.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(net.predict(x, verbose=0)), np.asarray(back.predict(x, verbose=0)))


def test_a_fresh_process_loads_the_layer_in_safe_mode(tmp_path):
    """A Horovod rank or an executor is a fresh interpreter that never imported the builders:
    ``keras_from_bytes`` must register the layer itself."""
    import keras
    keras.utils.set_random_seed(2)
    net = tabular_binary_classifier(input_dim=NUMERIC + len(CARDS), numeric_dim=NUMERIC, cardinalities=CARDS,
                                    hidden_units=(4,))
    x = rows(np.random.default_rng(3), 8, CARDS)
    (tmp_path / "model.keras").write_bytes(network.keras_to_bytes(net))
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np\n"
            "from sparkdeep.transformers.keras.network import keras_from_bytes\n"
            "assert 'sparkdeep.transformers.keras_models' not in sys.modules\n"
            "net = keras_from_bytes(open(sys.argv[1] + '/model.keras', 'rb').read())\n"
            "np.save(sys.argv[1] + '/y.npy', net.predict(np.load(sys.argv[1] + '/x.npy'), verbose=0))\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.asarray(net.predict(x, verbose=0)))


def test_safe_mode_still_refuses_a_class_nobody_registered(tmp_path):
    """Registering our layer opens nothing else: an archive naming another module's class
    (here os.system) is refused, not imported."""
    net = tabular_binary_classifier(input_dim=5, numeric_dim=3, cardinalities=[4, 5], hidden_units=(2,))
    data = network.keras_to_bytes(net)
    src, dst = tmp_path / "a.keras", tmp_path / "b.keras"
    src.write_bytes(data)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            body = zin.read(item.filename)
            if item.filename == "config.json":
                body = body.replace(b'"sparkdeep>ColumnEmbeddings"', b'"evil>system"').replace(
                    b'"sparkdeep.transformers._keras_layers"', b'"os"')
            zout.writestr(item, body)
    with pytest.raises(Exception, match="Could not locate"):
        network.keras_from_bytes(dst.read_bytes())


def test_a_saved_stage_with_the_layer_loads_through_the_model_store(spark, tmp_path):
    from sparkdeep import model_store
    from sparkdeep.transformers.keras_estimator import DistributedKerasModel
    net = tabular_binary_classifier(input_dim=NUMERIC + len(CARDS), numeric_dim=NUMERIC, cardinalities=CARDS,
                                    hidden_units=(4,))
    stage = DistributedKerasModel(kerasBytes=network.keras_to_bytes(net))
    stage.save(str(tmp_path / "stage"))
    loaded = model_store.load(spark, str(tmp_path / "stage"))
    assert loaded.kerasBytes == stage.kerasBytes
    x = rows(np.random.default_rng(4), 4, CARDS)
    np.testing.assert_array_equal(np.asarray(network.keras_from_bytes(loaded.kerasBytes).predict(x, verbose=0)),
                                  np.asarray(net.predict(x, verbose=0)))


def test_a_network_saved_with_one_embedding_per_column_still_loads():
    """Networks trained before the shared tables (one built-in Embedding per column, sliced
    and clipped by ops) load and predict as saved."""
    import keras
    from keras import ops
    cards = [3, 40]
    inputs = keras.Input(shape=(2 + len(cards),), name="features")
    parts = [inputs[:, :2]]
    for i, card in enumerate(cards):
        idx = ops.cast(ops.clip(inputs[:, 2 + i], 0, card - 1), "int32")
        parts.append(keras.layers.Embedding(card, embedding_dim(card), name=f"embedding_{i}")(idx))
    x = keras.layers.Concatenate(name="numeric_and_embeddings")(parts)
    out = keras.layers.Dense(1, activation="sigmoid", name="probabilities")(x)
    old = keras.Model(inputs, out, name="tabular_binary_classifier")
    back = network.keras_from_bytes(network.keras_to_bytes(old))
    assert [type(lay).__name__ for lay in back.layers].count("Embedding") == 2
    x = np.array([[0.1, -0.2, 2.0, 39.0], [0.1, -0.2, 7.0, 1e6]], dtype="float32")
    np.testing.assert_array_equal(np.asarray(back.predict(x, verbose=0)), np.asarray(old.predict(x, verbose=0)))

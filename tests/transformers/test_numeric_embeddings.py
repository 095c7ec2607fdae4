"""Issue 26's network layers: periodic numeric embeddings (PLR) and the parameter-efficient
ensemble (TabM-mini), checked against numpy references, trained member by member, and
saved and loaded in safe mode in a fresh process with identical scores."""
import os
import subprocess
import sys

import numpy as np
import pytest

from sparkdeep.transformers.keras import network
from sparkdeep.transformers.keras_models import (ENSEMBLE_MEAN, tabular_binary_classifier, tabular_classifier,
                                                 tabular_regressor)

CARDS = [4, 3]
NUMERIC = 3


def rows(n, seed=0):
    rng = np.random.default_rng(seed)
    numbers = rng.normal(size=(n, NUMERIC)) * [1.0, 5.0, 100.0]  # the last far outside the clip
    idx = np.stack([rng.integers(0, c, size=n) for c in CARDS], axis=1)
    return np.concatenate([numbers, idx], axis=1).astype("float32")


def test_periodic_embeddings_match_a_numpy_reference():
    import keras

    from sparkdeep.transformers._keras_layers import PeriodicEmbeddings
    keras.utils.set_random_seed(3)
    layer = PeriodicEmbeddings(NUMERIC, frequencies=5, dim=4, scale=0.3, clip=3.0)
    x = rows(16)[:, :NUMERIC]
    got = np.asarray(layer(x))
    c, w, b = (np.asarray(v.numpy()) for v in (layer.coefficients, layer.kernel, layer.bias))
    clipped = x / np.sqrt(1 + (x / 3.0) ** 2)
    assert np.abs(clipped).max() < 3.0
    v = 2 * np.pi * clipped[:, :, None] * c[None]
    feats = np.concatenate([np.cos(v), np.sin(v)], axis=-1)
    want = np.maximum(np.einsum("bnk,nkd->bnd", feats, w) + b, 0).reshape(len(x), -1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert got.shape == (16, NUMERIC * 4)


@pytest.mark.parametrize("bad", [dict(features=0), dict(features=2, dim=0), dict(features=2, scale=0.0),
                                 dict(features=2, clip=-1.0)])
def test_periodic_embeddings_refuse_bad_settings(bad):
    from sparkdeep.transformers._keras_layers import PeriodicEmbeddings
    with pytest.raises(ValueError, match="PeriodicEmbeddings"):
        PeriodicEmbeddings(**bad)


def test_bad_network_choices_are_named():
    with pytest.raises(ValueError, match="numeric_embedding"):
        tabular_binary_classifier(input_dim=5, numeric_dim=3, cardinalities=CARDS, numeric_embedding="fourier")
    with pytest.raises(ValueError, match="ensemble"):
        tabular_binary_classifier(input_dim=5, numeric_dim=3, cardinalities=CARDS, ensemble=-2)


def test_an_ensemble_is_the_mean_of_members_that_share_the_hidden_layers():
    import keras
    keras.utils.set_random_seed(5)
    k = 4
    net = tabular_classifier(input_dim=5, num_classes=3, numeric_dim=3, cardinalities=CARDS, hidden_units=(8,),
                             numeric_embedding="periodic", ensemble=k, dropout=0.0)
    single = tabular_classifier(input_dim=5, num_classes=3, numeric_dim=3, cardinalities=CARDS, hidden_units=(8,),
                                numeric_embedding="periodic", dropout=0.0)
    # Members cost an adapter vector and a head each, not a network each.
    extra = net.count_params() - single.count_params()
    width = net.get_layer("ensemble_adapter").weights[0].shape[1]
    assert extra == k * width + (k - 1) * (8 * 3 + 3)
    x = rows(10)
    members = keras.Model(net.inputs, net.get_layer(ENSEMBLE_MEAN).input)(x)
    assert tuple(members.shape) == (10, k, 3)
    np.testing.assert_allclose(np.asarray(net(x)), np.asarray(members).mean(axis=1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(net(x)).sum(axis=1), 1.0, rtol=1e-5)
    # The members differ (random-sign adapters), so their mean is an ensemble, not k copies.
    assert np.abs(np.asarray(members)[:, 0] - np.asarray(members)[:, 1]).max() > 1e-4


def test_each_member_is_trained_on_its_own_loss():
    import keras
    import tensorflow as tf

    from sparkdeep.transformers.keras.rank_loop import column_target, objective
    keras.utils.set_random_seed(6)
    net = tabular_regressor(input_dim=5, numeric_dim=3, cardinalities=CARDS, hidden_units=(8,), ensemble=3,
                            dropout=0.0, target_mean=10.0, target_scale=2.0)
    x, y, w = rows(12), np.linspace(5, 15, 12).astype("float32"), np.linspace(0.5, 2, 12).astype("float32")
    loss, pred = objective(net, keras.losses.get("mse"), column_target)(x, y, w)
    members = np.asarray(keras.Model(net.inputs, net.get_layer(ENSEMBLE_MEAN).input)(x))[:, :, 0]
    # Mean over rows and members of each member's weighted squared error ...
    want = np.mean((members - y[:, None]) ** 2 * w[:, None])
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    # ... which is more than the mean's error by the members' spread: not the loss of the mean.
    assert float(loss) > np.mean((members.mean(axis=1) - y) ** 2 * w) + 1e-6
    np.testing.assert_allclose(np.asarray(pred)[:, 0], members.mean(axis=1), rtol=1e-5)
    # A single network's objective is the plain weighted loss.
    single = tabular_regressor(input_dim=5, numeric_dim=3, cardinalities=CARDS, hidden_units=(8,), dropout=0.0)
    loss1, pred1 = objective(single, keras.losses.get("mse"), column_target)(x, y, w)
    np.testing.assert_allclose(float(loss1), np.mean((np.asarray(pred1)[:, 0] - y) ** 2 * w), rtol=1e-5)
    assert isinstance(loss1, tf.Tensor)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_fresh_process_loads_each_new_layer_in_safe_mode_and_scores_identically(tmp_path):
    import keras
    keras.utils.set_random_seed(8)
    nets = {"binary": tabular_binary_classifier(input_dim=5, numeric_dim=3, cardinalities=CARDS, hidden_units=(6,),
                                                numeric_embedding="periodic", ensemble=3),
            "multiclass": tabular_classifier(input_dim=5, num_classes=4, numeric_dim=3, cardinalities=CARDS,
                                             hidden_units=(6,), numeric_embedding="periodic", ensemble=2),
            "regression": tabular_regressor(input_dim=5, numeric_dim=3, cardinalities=CARDS, hidden_units=(6,),
                                            numeric_embedding="periodic", ensemble=4, target_mean=3.0,
                                            target_scale=7.0)}
    x = rows(9, seed=1)
    np.save(tmp_path / "x.npy", x)
    for name, net in nets.items():
        (tmp_path / f"{name}.keras").write_bytes(network.keras_to_bytes(net))
    code = ("import sys, numpy as np\n"
            "from sparkdeep.transformers.keras.network import keras_from_bytes\n"
            "assert 'sparkdeep.transformers.keras_models' not in sys.modules\n"
            "x = np.load(sys.argv[1] + '/x.npy')\n"
            "for name in ('binary', 'multiclass', 'regression'):\n"
            "    net = keras_from_bytes(open(f'{sys.argv[1]}/{name}.keras', 'rb').read())\n"
            "    np.save(f'{sys.argv[1]}/{name}.npy', net.predict(x, verbose=0))\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, net in nets.items():
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), np.asarray(net.predict(x, verbose=0)))

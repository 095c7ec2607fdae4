"""Embedding tables split by rows across the ranks (``shardEmbeddingsAbove``): the same
training as replicated tables, 1/N of the table and its slots per rank, resume after a
kill, and a saved model that knows nothing of the split."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import Vectors

from sparkdeep.distributed import RankFailedError
from sparkdeep.transformers._faults import FAIL_AT_EPOCH_ENV
from sparkdeep.transformers.keras import sharding
from sparkdeep.transformers.keras.network import keras_from_bytes, keras_to_bytes
from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator

from ._roundtrip import transform_in_new_process

LEVELS = 600  # the table: 601 rows (with the unseen/null bucket) x 24 = 57,696 bytes
ABOVE = 10_000


def _net(seed: int = 0):
    import keras

    from sparkdeep.transformers.keras_models import tabular_binary_classifier
    keras.utils.set_random_seed(seed)
    return tabular_binary_classifier(3, numeric_dim=2, cardinalities=[LEVELS + 1], hidden_units=(16,), dropout=0.0)


def test_only_tables_above_the_size_are_planned_and_each_rank_holds_its_interleaved_rows():
    net = _net()
    (plan,) = sharding.plan_tables(net, ABOVE)
    assert (plan.rows, plan.width, plan.bytes) == (LEVELS + 1, 24, (LEVELS + 1) * 24 * 4)
    assert sharding.plan_tables(net, plan.bytes) == [] and sharding.plan_tables(net, 0) == []
    assert [sharding.shard_rows(601, r, 2) for r in (0, 1)] == [301, 300]
    assert sum(sharding.shard_rows(10, r, 3) for r in range(3)) == 10


@pytest.fixture(scope="module")
def ids(spark):
    """6,000 rows: two numbers and an ID of 600 levels whose latent effect decides most of
    the label (an embedding must learn it); 1 row in 5 held out, by row."""
    rng = np.random.default_rng(11)
    n = 6_000
    level = rng.integers(0, LEVELS, n)
    effect = rng.normal(size=LEVELS)
    nums = rng.normal(size=(n, 2))
    label = (effect[level] + 0.5 * nums[:, 0] + rng.normal(scale=0.5, size=n) > 0).astype(float)
    rows = [(i, float(label[i]), Vectors.dense([nums[i, 0], nums[i, 1], float(level[i])])) for i in range(n)]
    df = spark.createDataFrame(rows, ["id", "label", "features"])
    return df.where("id % 5 != 0").cache(), df.where("id % 5 = 0").cache()


def _estimator(**kw):
    base = dict(featuresCol="features", labelCol="label", numProc=2, epochs=3, batchSize=128, learningRate=0.01,
                warmupEpochs=0.0, seed=5, metrics=["auc"], lrSchedule="constant", validationFraction=0.1,
                earlyStoppingPatience=0, model=_net())
    base.update(kw)
    return DistributedKerasEstimator(**base)


def _auc(model, df):
    scored = model.transform(df).withColumn("p", vector_to_array("probability")[1])
    return BinaryClassificationEvaluator(rawPredictionCol="p", labelCol="label").evaluate(scored)


@pytest.fixture(scope="module")
def fits(ids):
    train, _ = ids
    return {"replicated": _estimator().fit(train), "sharded": _estimator(shardEmbeddingsAbove=ABOVE).fit(train)}


@pytest.mark.slow
def test_a_sharded_fit_reaches_the_replicated_fit_s_held_out_auc(fits, ids):
    _, test = ids
    rep, sh = _auc(fits["replicated"], test), _auc(fits["sharded"], test)
    assert rep > 0.75, rep  # the IDs carry the label: an embedding that learnt nothing scores about 0.64
    assert abs(sh - rep) < 0.01, (sh, rep)
    hist = {k: [h["loss"] for h in m.trainingSummary["history"]] for k, m in fits.items()}
    np.testing.assert_allclose(hist["sharded"], hist["replicated"], rtol=0.02)


@pytest.mark.slow
def test_each_rank_holds_its_half_of_the_table_and_of_its_slots(fits):
    table = (LEVELS + 1) * 24 * 4
    rep = fits["replicated"].trainingSummary["ranks"]
    sh = fits["sharded"].trainingSummary["ranks"]
    assert all(r["sharded"] is None for r in rep)
    for r in sh:
        (held,) = r["sharded"]
        assert held["rows"] == LEVELS + 1 and held["rows_held"] == sharding.shard_rows(LEVELS + 1, r["rank"], 2)
    # Measured on the rank: its variables (weights, Adam's two slots) against a replica's.
    for a, b in zip(rep, sh):
        saved = a["variable_bytes"] - b["variable_bytes"]
        assert 3 * table * 0.49 <= saved <= 3 * table * 0.51, (a["variable_bytes"], b["variable_bytes"])
    # The replicated weights (all but the split rows) ended identical on both ranks.
    assert len({r["weights_digest"] for r in sh}) == 1
    # A step's all-to-all traffic is counted.
    assert all(b["allreduce_bytes"] > 0 for b in sh)


@pytest.mark.slow
def test_the_saved_model_holds_the_whole_table_and_scores_as_trained_here_and_in_a_new_process(fits, ids, tmp_path):
    from sparkdeep.transformers._keras_layers import ColumnEmbeddings
    from sparkdeep.transformers.keras_estimator import DistributedKerasModel
    _, test = ids
    model = fits["sharded"]
    (layer,) = [x for x in model.keras_model().layers if isinstance(x, ColumnEmbeddings)]
    assert type(layer) is ColumnEmbeddings and [tuple(t.shape) for t in layer.tables] == [(LEVELS + 1, 24)]
    path = str(tmp_path / "sharded")
    model.save(path)
    again = DistributedKerasModel.load(path)

    def scores_of(scored):
        return scored.select("id", vector_to_array("probability")[1].alias("p")).toPandas() \
            .sort_values("id")["p"].to_numpy()

    def scores(m):
        return scores_of(m.transform(test))
    np.testing.assert_array_equal(scores(model), scores(again))
    # The same network as the replicated fit's, to float rounding.
    np.testing.assert_allclose(scores(model), scores(fits["replicated"]), atol=1e-4)
    # A fresh Python process, which never saw the split, loads and scores it the same.
    fresh = transform_in_new_process(model, test.select("id", "features"), tmp_path, ["id", "probability"])
    np.testing.assert_allclose(scores_of(fresh), scores(model), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_a_sharded_fit_killed_after_an_epoch_resumes_as_if_uninterrupted(fits, ids, tmp_path, monkeypatch):
    """Rank 1 dies after epoch 2's checkpoint, mid-run for rank 0; the refit resumes from
    epoch 2 with each rank's rows and slots of the table back from the whole checkpoint."""
    train, _ = ids
    # Patience that never stops 3 epochs, so the checkpoint also holds the best weights.
    est = _estimator(shardEmbeddingsAbove=ABOVE, runId="sharded-kill", checkpointDir=str(tmp_path),
                     earlyStoppingPatience=3)
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, "1:2:exit")
    with pytest.raises(RankFailedError):
        est.fit(train)
    monkeypatch.delenv(FAIL_AT_EPOCH_ENV)
    model = est.fit(train)
    s = model.trainingSummary
    assert s["resumed_from_epoch"] == 2 and [h["epoch"] for h in s["history"]] == [1, 2, 3]
    whole = fits["sharded"].trainingSummary["history"]
    np.testing.assert_allclose([h["loss"] for h in s["history"]], [h["loss"] for h in whole], rtol=1e-3)
    np.testing.assert_allclose(s["history"][-1]["val_loss"], whole[-1]["val_loss"], rtol=1e-3)


def test_a_strategy_other_than_horovod_refuses_to_shard(ids):
    train, _ = ids
    with pytest.raises(ValueError, match=r"shardEmbeddingsAbove=1000 \(.*\) applies to strategy='horovod' only, "
                                         r"not strategy='collective'"):
        _estimator(strategy="collective", shardEmbeddingsAbove=1000).fit(train)
    with pytest.raises(ValueError, match="shardEmbeddingsAbove must be >= 0 bytes"):
        _estimator(shardEmbeddingsAbove=-1).fit(train)


def test_an_ensemble_network_splits_into_a_graph_of_its_own_with_the_same_weights():
    """The rank's network is a copy: an ensemble's members view (the loss of each member)
    must find its mean layer's input in that copy, not in the whole network's graph."""
    import keras

    from sparkdeep.transformers.keras.rank_loop import objective
    from sparkdeep.transformers.keras_models import tabular_binary_classifier
    keras.utils.set_random_seed(1)
    net = tabular_binary_classifier(6, numeric_dim=2, cardinalities=[501, 41, 9, 1001], hidden_units=(16,),
                                    ensemble=4)
    shards = sharding.RankShards(sharding.plan_tables(net, 2000), hvd=None, rank=1, size=2)
    assert [(p.rows, p.width) for p in shards.plans] == [(41, 13), (1502, 24)]
    split = shards.load(keras_to_bytes(net))
    objective(split, keras.losses.get("binary_crossentropy"), lambda y: y[:, None])  # raised before
    whole = {v.path: v.numpy() for v in net.weights}
    for v in split.weights:
        if shards.is_local(v):
            continue
        np.testing.assert_array_equal(v.numpy(), whole[v.path])
    tables = [tuple(t.shape) for t in next(x for x in split.layers if x.name == "embeddings").tables]
    assert tables == [(9, 5), (20, 13), (751, 24)]


def test_the_archive_plans_as_the_built_network_and_the_driver_puts_every_ranks_rows_back():
    """A rank plans from the archive's config alone and builds only its rows; the driver's
    assemble gives the whole network back, weight for weight, and refuses a short part."""
    import keras
    net = _net(3)
    data = keras_to_bytes(net)
    assert sharding.plan_archive(data, ABOVE) == sharding.plan_tables(net, ABOVE)
    assert sharding.plan_archive(data, 0) == []
    parts = []
    for rank in (0, 1):
        shards = sharding.RankShards(sharding.plan_archive(data, ABOVE), hvd=None, rank=rank, size=2)
        mine = shards.load(data)
        (table,) = [v for v in mine.weights if shards.is_local(v)]
        assert tuple(table.shape) == (sharding.shard_rows(LEVELS + 1, rank, 2), 24)
        parts.append(shards.result_weights(mine))
    whole = keras_from_bytes(sharding.assemble(data, parts, ABOVE))
    for a, b in zip(whole.get_weights(), net.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert isinstance(whole.get_layer("embeddings"), keras.layers.Layer)
    with pytest.raises(ValueError, match=r"rank 1 returned \(301, 24\) float32 of .*expected \(300, 24\)"):
        sharding.assemble(data, [parts[0], parts[0]], ABOVE)


def _served(monkeypatch, server, rank: int) -> None:
    """Rank ``rank``'s requests answered by ``server`` directly (no launch around them)."""
    import io
    monkeypatch.setattr(sharding, "fetch", lambda source, key, split: np.load(
        io.BytesIO(server(rank, f"{source} {key} {int(split)}")), allow_pickle=False))


def test_the_ranks_start_from_an_archive_without_the_table_and_the_driver_serves_each_its_rows(monkeypatch):
    """Nothing of a split table is shipped to every rank: the archive they start from holds
    it with no rows, and each rank gets its own rows from the driver, the same values as
    cut from the whole table; anything else asked is refused."""
    net = _net(4)
    data = keras_to_bytes(net)
    plans = sharding.plan_archive(data, ABOVE)
    server = sharding.TableServer(data, plans, 2)
    skeleton = server.rank_archive()
    table = (LEVELS + 1) * 24 * 4
    assert len(skeleton) < len(data) - 0.9 * table, (len(skeleton), len(data))
    assert sharding.plan_archive(skeleton, ABOVE) == plans
    whole = net.get_layer("embeddings").tables[0].numpy()
    for rank in (0, 1):
        _served(monkeypatch, server, rank)
        mine = sharding.RankShards(plans, hvd=None, rank=rank, size=2).load(skeleton)
        np.testing.assert_array_equal(mine.get_layer("embeddings").tables[0].numpy(), whole[rank::2])
        others = {v.path: v.numpy() for v in net.weights}
        for v in mine.weights:  # the rest comes whole in the archive
            if v is not mine.get_layer("embeddings").tables[0]:
                np.testing.assert_array_equal(v.numpy(), others[v.path])
    for bad, why in (("model /layers/dense/vars/0 1", "does not serve"), ("optimizer v0 1", "does not serve"),
                     ("model /layers/column_embeddings/vars/0 2", "not '<source> <key> 0|1'")):
        with pytest.raises(ValueError, match=why):
            server(0, bad)
    with pytest.raises(ValueError, match="rank 2 asked"):
        server(2, "model /layers/column_embeddings/vars/0 1")


def _shares(data: bytes, slots=None, best: bool = False) -> list:
    """Each of 2 ranks' checkpoint share of the network ``data``, its Adam slots of the split
    table set to its rows of ``slots`` when given."""
    import keras
    plans, out = sharding.plan_archive(data, ABOVE), []
    for rank in (0, 1):
        shards = sharding.RankShards(plans, hvd=None, rank=rank, size=2)
        mine = shards.load(data)
        opt = keras.optimizers.Adam()
        opt.build(mine.trainable_variables)
        for v in opt.variables:
            if slots is not None and shards._rows_of(v) is not None:
                v.assign(slots[rank::2])
        out.append(shards.checkpoint_part(mine, opt, best=mine.get_weights() if best else None))
    return out


def test_a_checkpoint_is_put_together_on_the_driver_from_every_rank_s_share():
    """Each rank hands its rows of the table and of its slots; the driver's files are the
    whole network's, slot for slot, and a missing share is refused."""
    import io
    net = _net(5)
    data = keras_to_bytes(net)
    slots_whole = np.random.default_rng(0).normal(size=(LEVELS + 1, 24)).astype("float32")
    parts = _shares(data, slots_whole, best=True)
    files = dict(sharding.assemble_checkpoint(data, parts))
    assert sorted(files) == ["best.npz", "model.keras", "optimizer.npz"]
    for a, b in zip(keras_from_bytes(files["model.keras"]).get_weights(), net.get_weights()):
        np.testing.assert_array_equal(a, b)
    with np.load(io.BytesIO(files["optimizer.npz"])) as opt_saved:
        whole_slots = [opt_saved[k] for k in opt_saved.files if opt_saved[k].shape == (LEVELS + 1, 24)]
    assert len(whole_slots) == 2 and all((s == slots_whole).all() for s in whole_slots)
    table = next(i for i, v in enumerate(net.weights) if v is net.get_layer("embeddings").tables[0])
    with np.load(io.BytesIO(files["best.npz"])) as best:
        np.testing.assert_array_equal(best[f"w{table}"], net.get_weights()[table])
    with pytest.raises(ValueError, match=r"rank 1 returned \(301, 24\)"):
        dict(sharding.assemble_checkpoint(data, [parts[0], parts[0]]))


def test_the_driver_names_an_epoch_complete_only_with_every_rank_s_share(tmp_path):
    """A state.json without every rank's share is refused (the last complete epoch stays the
    checkpoint), shares of an epoch that never completed are dropped, and close leaves nothing."""
    import json
    import os

    from sparkdeep.transformers.keras.checkpoints import CheckpointStore, read_checkpoint
    net = _net(6)
    data = keras_to_bytes(net)
    parts = _shares(data)
    folder = str(tmp_path / "ck")
    store = CheckpointStore(folder, network=data, size=2, assemble=sharding.assemble_checkpoint)

    def state(epoch):
        return json.dumps({"completed_epochs": epoch, "history": [], "files": f"epoch-{epoch:04d}"}).encode()
    for rank in (0, 1):
        store(rank, f"epoch-0001/part-{rank:04d}.npz", parts[rank])
    store(0, "state.json", state(1))
    assert read_checkpoint(folder)["completed_epochs"] == 1
    store(0, "epoch-0002/part-0000.npz", parts[0])  # rank 1's share of epoch 2 never comes
    with pytest.raises(ValueError, match=r"epoch-0002: shares came from ranks \[0\], not all 2"):
        store(0, "state.json", state(2))
    again = read_checkpoint(folder)
    assert again["completed_epochs"] == 1
    for a, b in zip(keras_from_bytes(again["model_bytes"]).get_weights(), net.get_weights()):
        np.testing.assert_array_equal(a, b)
    store(1, "epoch-0003/part-0001.npz", parts[1])  # a later epoch: epoch 2's orphan share goes
    assert sorted(store._parts) == ["epoch-0003"]
    with pytest.raises(ValueError, match="not part of a checkpoint"):
        store(1, "epoch-0003/part-0000.npz", parts[0])  # a share under another rank's number
    spill = store._spill
    store.close()
    assert not os.path.exists(spill)


def _with_weights(data: bytes, edit) -> bytes:
    """The archive ``data`` with ``edit(h5py.File)`` applied to its weights file."""
    import io
    import zipfile

    import h5py
    src = zipfile.ZipFile(io.BytesIO(data))
    weights = io.BytesIO(src.read("model.weights.h5"))
    with h5py.File(weights, "a") as fh:
        edit(fh)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, weights.getvalue() if info.filename == "model.weights.h5" else src.read(info))
    return out.getvalue()


def test_a_rank_refuses_an_archive_whose_table_points_outside_it_or_holds_more_than_the_layer(tmp_path, monkeypatch):
    """A rank's own read of its rows keeps Keras' safe-mode checks: a table stored in a file
    outside the archive, an extra variable or a table of another shape is refused, as the
    whole load refuses it, instead of being read into the network."""
    net = _net(2)
    data = keras_to_bytes(net)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not a weight" * 20_000)
    vars_ = "layers/column_embeddings/vars"

    def external(fh):
        shape = fh[f"{vars_}/0"].shape
        del fh[f"{vars_}/0"]
        fh[vars_].create_dataset("0", shape=shape, dtype="<f4", external=[(str(outside), 0, int(np.prod(shape)) * 4)])

    def extra(fh):
        fh[f"{vars_}/1"] = np.zeros((3, 3), "f4")

    def reshaped(fh):
        del fh[f"{vars_}/0"]
        fh[f"{vars_}/0"] = np.zeros((LEVELS + 1, 12), "f4")

    for edit, why in ((external, "external Dataset"), (extra, "expected 1 variables"), (reshaped, r"\(601, 12\)")):
        bad = _with_weights(data, edit)
        if edit is not reshaped:  # Keras' own whole load refuses these two alike
            with pytest.raises(ValueError, match=why):
                keras_from_bytes(bad)
        with pytest.raises(ValueError, match=why):
            sharding.RankShards(sharding.plan_archive(bad, ABOVE), hvd=None, rank=1, size=2).load(bad)
        # The driver, which serves the ranks their rows, refuses it as well.
        with pytest.raises(ValueError, match=why):
            server = sharding.TableServer(bad, sharding.plan_archive(bad, ABOVE), 2)
            skeleton = server.rank_archive()
            server(1, f"model /{vars_}/0 1")
            _served(monkeypatch, server, 1)
            sharding.RankShards(sharding.plan_archive(bad, ABOVE), hvd=None, rank=1, size=2).load(skeleton)

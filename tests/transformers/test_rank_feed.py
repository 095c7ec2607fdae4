"""The rank side without Horovod: the spilled shard, the streamed feed, the step plan, the
epoch loop with an identity all-reduce, and the typed spec (issue 14, parts 1 and 5)."""
import numpy as np
import pyarrow as pa
import pytest

from sparkdeep.transformers.keras.feed import (TRAIN, VALIDATION, Prefetch, ShardFeed, ShardSpill, plan_steps,
                                               read_index)


def _batches(n, width=3, start=0, size=1000, split_every=0):
    """Arrow batches as the launcher delivers them: features list<float>, label = row id."""
    for lo in range(start, start + n, size):
        ids = np.arange(lo, min(lo + size, start + n))
        feats = pa.array([[float(i)] * width for i in ids], pa.list_(pa.float32()))
        cols = [feats, pa.array(ids.astype("float32")), pa.array(np.full(len(ids), 2.0, "float32"))]
        names = ["features", "label", "weight"]
        if split_every:
            cols.append(pa.array((ids % split_every) == 0))
            names.append("is_validation")
        yield pa.RecordBatch.from_arrays(cols, names=names)


def _spill(folder, n, **kw):
    spill = ShardSpill(split_col="is_validation" if kw.get("split_every") else None,
                       chunk_rows=kw.pop("chunk_rows", 128)).open(str(folder))
    for b in _batches(n, **kw):
        spill.write(b)
    return spill.close()


def test_a_shard_many_times_the_buffer_streams_every_row_once_per_epoch_reshuffled(tmp_path):
    counts = _spill(tmp_path, 5000)
    assert counts == {TRAIN: 5000, VALIDATION: 0}
    assert max(read_index(str(tmp_path))[TRAIN]["chunks"]) == 128
    feed = ShardFeed(str(tmp_path), batch_size=64, buffer_rows=500, seed=7, weight=True)
    plan = plan_steps([feed.rows], 64)
    orders = []
    for epoch in range(3):
        batches = list(feed.epoch(epoch, plan.steps))
        assert len(batches) == plan.steps == 79
        assert all(len(b[1]) == 64 for b in batches[:-1]) and len(batches[-1][1]) == 5000 - 78 * 64
        ids = np.concatenate([b[1] for b in batches])
        assert sorted(ids.astype(int).tolist()) == list(range(5000))  # each row exactly once
        x, _, w = batches[0]
        assert x.shape == (64, 3) and (x[:, 0] == batches[0][1]).all() and (w == 2.0).all()
        orders.append(ids)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    # Rows are mixed across the shard, not read in file order.
    assert np.abs(np.corrcoef(np.arange(5000), orders[0])[0, 1]) < 0.5
    # Bounded: never more than the window plus one chunk held, 10x less than the shard.
    assert feed.max_window_rows <= 500 + 128


def test_fewer_steps_than_rows_reads_only_what_it_needs_and_the_rest_is_the_trim(tmp_path):
    _spill(tmp_path, 1000)
    plan = plan_steps([1000, 300], 64)
    assert (plan.steps, plan.rows_per_epoch, plan.trimmed_per_epoch) == (5, [320, 300], [680, 0])
    feed = ShardFeed(str(tmp_path), batch_size=64, buffer_rows=200, seed=1)
    batches = list(feed.epoch(0, plan.steps))
    assert [len(b[1]) for b in batches] == [64] * 5
    assert len(set(np.concatenate([b[1] for b in batches]).tolist())) == 320
    assert feed.max_window_rows < 200 + 128 + 64


def test_plan_steps_equal_for_every_rank_with_accumulation_and_empty_ranks_named():
    plan = plan_steps([1000, 370], 64, accumulation=4)
    assert (plan.steps, plan.updates) == (4, 1)
    assert plan.rows_per_epoch == [256, 256] and plan.trimmed_per_epoch == [744, 114]
    # Fewer batches than one accumulation group: a clear error, not an empty feed mid-epoch.
    with pytest.raises(ValueError, match=r"accumulationSteps=4 needs 4 batches per epoch.*holds 1 batch"):
        plan_steps([10, 10], 64, accumulation=4)
    with pytest.raises(ValueError, match=r"rank\(s\) 1 got no training rows"):
        plan_steps([5, 0], 8)
    with pytest.raises(ValueError, match="must be >= 1"):
        plan_steps([5], 0)


def test_validation_rows_go_to_their_own_file_and_stream_in_order(tmp_path):
    counts = _spill(tmp_path, 1000, split_every=4)
    assert counts == {TRAIN: 750, VALIDATION: 250}
    val = ShardFeed(str(tmp_path), VALIDATION, batch_size=32, buffer_rows=64, seed=0)
    ids = np.concatenate([b[1] for b in val.sequential(chunk=100)])
    assert ids.astype(int).tolist() == list(range(0, 1000, 4))
    train = ShardFeed(str(tmp_path), TRAIN, batch_size=32, buffer_rows=64, seed=0)
    got = np.concatenate([b[1] for b in train.epoch(0, plan_steps([750], 32).steps)]).astype(int)
    assert sorted(got.tolist()) == [i for i in range(1000) if i % 4]


def test_an_unusable_shard_is_named_for_its_own_rank_with_the_right_advice():
    from sparkdeep.transformers.keras.feed import shard_problem
    counts = [{TRAIN: 5, VALIDATION: 1}, {TRAIN: 0, VALIDATION: 3}, {TRAIN: 0, VALIDATION: 0}]
    assert shard_problem(counts, 0) is None
    assert "rank 1 got no training rows: all 3 of its rows are validation rows" in shard_problem(counts, 1)
    assert "rank 2 got no training rows: the input has 5 training rows for 3 ranks; lower numProc" in \
        shard_problem(counts, 2)


def test_the_window_bound_holds_for_a_buffer_smaller_than_a_batch(tmp_path):
    _spill(tmp_path, 500, chunk_rows=16)
    feed = ShardFeed(str(tmp_path), batch_size=32, buffer_rows=1, seed=2)
    ids = np.concatenate([b[1] for b in feed.epoch(0, plan_steps([500], 32).steps)])
    assert sorted(ids.astype(int).tolist()) == list(range(500))
    assert feed.max_window_rows <= max(1, 32) + 16
    feed.close()


def test_an_empty_partition_spills_nothing_and_the_plan_names_it(tmp_path):
    assert ShardSpill().open(str(tmp_path)).close() == {TRAIN: 0, VALIDATION: 0}
    with pytest.raises(ValueError, match=r"rank\(s\) 0 got no training rows"):
        plan_steps([0, 10], 4)


def test_prefetch_keeps_order_and_hands_errors_to_the_consumer():
    assert list(Prefetch(iter(range(50)), depth=2)) == list(range(50))

    def broken():
        yield 1
        raise OSError("disk gone")
    it = Prefetch(broken())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)


def logistic_steps_and_feed(folder: str, n: int = 2000, **steps_kw):
    """A one-layer logistic model's :class:`Steps` (``steps_kw``: metrics, reduce) and a
    feed of ``n`` spilled rows of 4 features (batches of 50), as a rank would stream them."""
    import keras

    from sparkdeep.transformers.keras.rank_loop import Steps
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("float32")
    spill = ShardSpill(chunk_rows=100).open(folder)
    spill.write(pa.RecordBatch.from_arrays(
        [pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4).cast(pa.list_(pa.float32())), pa.array(y)],
        names=["features", "label"]))
    spill.close()
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))
    optimizer = keras.optimizers.Adam(0.05)
    optimizer.build(model.trainable_variables)
    steps = Steps(model, optimizer, keras.losses.get("binary_crossentropy"), "binary", **steps_kw)
    return steps, ShardFeed(folder, batch_size=50, buffer_rows=300, seed=3)


def test_the_epoch_loop_trains_without_horovod(tmp_path):
    """run_epoch with an identity all-reduce: the same loop a rank runs, in one process."""
    from sparkdeep.transformers.keras.rank_loop import run_epoch
    n = 2000
    steps, feed = logistic_steps_and_feed(str(tmp_path), n)
    plan = plan_steps([feed.rows], 50, accumulation=2)
    losses = []
    for epoch in range(3):
        done = run_epoch(steps, Prefetch(feed.epoch(epoch, plan.steps)), updates=plan.updates, accumulation=2,
                         allreduce=lambda g: g, set_lr=lambda: 0.05)
        assert done["rows"] == n and done["batches"] == plan.steps == 40
        losses.append(done["loss"])
    assert losses[-1] < losses[0] * 0.7


def test_the_rank_spec_is_typed_and_checked():
    from sparkdeep.transformers.keras.contract import RankSpec
    good = dict(model_bytes=b"k", task="binary", loss="binary_crossentropy", optimizer="adam", learning_rate=0.01,
                scale_lr=True, warmup_epochs=1.0, lr_schedule="cosine", epochs=2, schedule_epochs=2,
                batch_size=32, accumulation_steps=1, compression="none", metrics=("auc",), early_stopping_patience=0,
                seed=1, threads=1, has_weight=False, has_validation=True, shuffle_buffer_rows=1024, strategy="horovod",
                local_steps=1, measure_wait=False, shard_embeddings_above=0)
    spec = RankSpec(**good)
    assert "model_bytes" not in spec.describe() and spec.describe()["batch_size"] == 32
    with pytest.raises(ValueError, match="shuffle_buffer_rows must be >= 1"):
        RankSpec(**{**good, "shuffle_buffer_rows": 0})
    with pytest.raises(TypeError):
        RankSpec(**{k: v for k, v in good.items() if k != "epochs"})  # no silent default


def test_checkpoints_are_stored_epoch_by_epoch_and_read_back(tmp_path):
    """Rank 0's files, as the driver's CheckpointStore writes them: an epoch's files, then
    state.json naming them; an older epoch goes once a newer one is complete."""
    import json
    from sparkdeep.transformers.keras.checkpoints import CheckpointStore, read_checkpoint
    folder = str(tmp_path / "run")
    store = CheckpointStore(folder)
    assert read_checkpoint(folder) is None
    for epoch in (1, 2):
        store(0, f"epoch-{epoch:04d}/model.keras", b"model %d" % epoch)
        store(0, f"epoch-{epoch:04d}/optimizer.npz", b"opt %d" % epoch)
        if epoch == 2:  # killed before state.json: the last complete epoch is still 1
            assert read_checkpoint(folder)["model_bytes"] == b"model 1"
        store(0, "state.json", json.dumps({"completed_epochs": epoch, "history": [],
                                           "files": f"epoch-{epoch:04d}"}).encode())
    got = read_checkpoint(folder)
    assert (got["completed_epochs"], got["model_bytes"], got["optimizer_bytes"]) == (2, b"model 2", b"opt 2")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["epoch-0002", "state.json"]
    for rank, name in ((1, "state.json"), (0, "../escape.keras"), (0, "epoch-1/model.keras"), (0, "x.py")):
        with pytest.raises(ValueError, match="not part of a checkpoint"):
            store(rank, name, b"")
    # The layout before epoch folders: the files beside state.json.
    old = tmp_path / "old"
    old.mkdir()
    (old / "state.json").write_text(json.dumps({"completed_epochs": 3, "history": [{"epoch": 3}]}))
    (old / "model.keras").write_bytes(b"m")
    (old / "optimizer.npz").write_bytes(b"o")
    assert read_checkpoint(str(old))["completed_epochs"] == 3

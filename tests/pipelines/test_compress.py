"""The compress step (``pipelines/compress.py``, ``jobs/compress.py``): variants of the
promoted network saved beside the run, measured against it, a JSON report and a plot; off
by default.

The promoted pipeline is an assembler and a seeded, briefly fitted MLP (no ranks);
``prune`` runs without fine-tuning here (fine-tuning on the ranks is tested in
``tests/transformers/test_compress.py``).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.feature import VectorAssembler

from sparkdeep import delta_io, model_store
from sparkdeep.config import load_config
from sparkdeep.jobs import compress as compress_job
from sparkdeep.paths import Paths, read_json, tree_digest, write_json
from sparkdeep.pipelines import compress
from sparkdeep.registry import Models, Tables
from sparkdeep.transformers.keras.model import DistributedKerasModel
from sparkdeep.transformers.keras.network import keras_from_bytes, keras_to_bytes

WIDTH = 8
COLS = [f"x{i}" for i in range(WIDTH)]


def _rows(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, WIDTH))
    return x, (x[:, 0] - x[:, 1] + 0.3 * rng.normal(size=n) > 0).astype("float64")


@pytest.fixture(scope="module")
def promoted(spark, repo_root, tmp_path_factory):
    import keras

    from sparkdeep.transformers.keras_models import mlp_binary_classifier
    out = str(tmp_path_factory.mktemp("compress") / "output")
    cfg = load_config(os.path.join(repo_root, "conf"), overrides=[
        f"output_dir={out}", "compress.enabled=true", "compress.variants=[int8, bfloat16, prune]",
        "compress.fine_tune_epochs=0", "compress.sparsity=0.6"])
    paths = Paths.under(out)
    key = cfg.dataset.key_column
    keras.utils.set_random_seed(5)
    net = mlp_binary_classifier(WIDTH, hidden_units=(64, 32), dropout=0.0)
    net.compile(optimizer="adam", loss="binary_crossentropy")
    x, y = _rows(1000, 1)
    net.fit(x.astype("float32"), y.astype("float32"), epochs=5, batch_size=64, verbose=0)
    stage = DistributedKerasModel(kerasBytes=keras_to_bytes(keras_from_bytes(keras_to_bytes(net))))
    stage._set(task="binary")
    folder = paths.model(Models.PIPELINE, "r1")
    PipelineModel([VectorAssembler(inputCols=COLS, outputCol="features"), stage]).write().save(folder)
    refs = {}
    for table, (n, seed) in {Tables.TRAIN: (1000, 1), Tables.HOLDOUT: (400, 2)}.items():
        xs, ys = _rows(n, seed)
        df = spark.createDataFrame([(i, *map(float, xs[i]), float(ys[i])) for i in range(n)], [key, *COLS, "label"])
        refs[table] = delta_io.write(df, paths.table(table)).version
    write_json(paths.latest, {"run_id": "r1", "models": {Models.PIPELINE: {"path": folder,
                                                                          "digest": tree_digest(folder)}},
                              "tables": refs})
    return cfg, paths


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_compress_writes_each_variant_and_the_report(spark, promoted):
    cfg, paths = promoted
    report = compress.compress_promoted(spark, cfg, paths)
    names = [r["variant"] for r in report["variants"]]
    assert names == ["original", "int8", "bfloat16", "prune"]
    rows = {r["variant"]: r for r in report["variants"]}
    assert report["metric"] == "auc" and rows["original"]["metric_difference"] == 0
    for name in ("int8", "bfloat16"):
        assert rows[name]["keras_bytes"] < rows["original"]["keras_bytes"], name
        assert abs(rows[name]["metric_difference"]) < 0.02, name
    assert rows["prune"]["keras_gzip_bytes"] < rows["original"]["keras_gzip_bytes"]
    assert min(rows["prune"]["compressed"]["kernel_sparsity"].values()) >= 0.6 - 1e-3
    for r in report["variants"]:
        assert r["parameters"] > 0 and r["transform_rows_per_s"] > 0 and r["predict_rows_per_s"] > 0
        assert r["server_rows_per_s"] > 0, r.get("server_error")
        assert r["metrics"]["rows"] == 400
    saved = model_store.load_pipeline(spark, rows["int8"]["path"])
    assert saved.stages[-1].trainingSummary["compressed"]["mode"] == "int8"
    assert read_json(report["report_json"])["variants"][1]["variant"] == "int8"
    assert os.path.getsize(report["plot"]) > 1000
    assert "| int8 |" in compress.table(report)

    from mlflow.tracking import MlflowClient

    from sparkdeep import tracking
    logged = tracking.log_compress(cfg, paths, report["run_id"], report, [report["report_json"], report["plot"]])
    client = MlflowClient(logged["uri"])
    metrics = client.get_run(logged["mlflow_run_id"]).data.metrics
    assert metrics["compress_int8_keras_bytes"] == rows["int8"]["keras_bytes"]
    assert metrics["compress_prune_metric_difference"] == pytest.approx(rows["prune"]["metric_difference"])
    files = {f.path for f in client.list_artifacts(logged["mlflow_run_id"], "compress")}
    assert {"compress/compress.json", "compress/compress.png"} <= files


def test_the_job_is_off_by_default(tmp_path, capsys):
    assert compress_job.main(["--output-dir", str(tmp_path)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "compress.enabled is false" in err[0]


def test_the_job_reads_the_output_folders_data_set_and_refuses_another(repo_root, tmp_path):
    import argparse

    from sparkdeep.config import ConfigError
    (tmp_path / "dataset.json").write_text('{"name": "hmda", "spec_file": "/nowhere/hmda.yaml"}')
    args = argparse.Namespace(conf_dir=os.path.join(repo_root, "conf"), env=None, overrides=[], dataset=None,
                              output_dir=str(tmp_path))
    assert compress_job.load_for_output(args).dataset.name == "hmda"  # the spec file gone: by its name
    with pytest.raises(ConfigError, match="holds data set 'hmda'"):
        compress_job.load_for_output(argparse.Namespace(**{**vars(args), "dataset": "diamonds_cut"}))

"""Compress: smaller variants of the promoted network, each measured against it.

:func:`compress_promoted` loads the promoted scoring pipeline (``models/latest.json``,
its digest checked as the export checks it), builds each variant of its network
(``transformers/keras/compress.py``: ``int8``, ``int4``, ``float8``, ``bfloat16``,
``prune``, ``distill``), swaps it into a copy of the pipeline, saves that copy under
``runs/<run id>/compress/<variant>/`` (a ``PipelineModel``, loadable through
``model_store`` like the original) and measures, for the original and every variant:

- ``keras_bytes`` (the ``.keras`` archive; Keras stores it uncompressed, so pruning's zeros
  show only in ``keras_gzip_bytes``) and ``folder_bytes`` (the saved pipeline);
- ``parameters`` (every weight, quantization scales left out);
- ``transform_rows_per_s`` (the pipeline's ``transform`` over the holdout, written to
  Spark's ``noop`` sink, the best of 3 passes after a first one, ``transform_first_s``, which
  also starts the Python workers and loads the network in each) and ``predict_rows_per_s``
  (``model.predict`` on the holdout's features as one float32 array, batch 1024, best of 3
  after a warm-up call, in a fresh Python process);
- ``peak_rss_bytes``: the peak resident memory that loading the network and predicting
  added to that process (Linux's ``VmHWM``); ``weights_bytes``, its weights in memory;
- the held-out metrics (``pipelines/evaluate.py``'s) and the gate metric's difference
  from the original's.

The report goes to ``runs/<run id>/reports/compress.json`` and a size-against-quality
plot beside it (``compress.png``).
"""
from __future__ import annotations

import logging
import os
import time
import zlib
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: Rows of the holdout ``model.predict`` is timed on (the whole holdout up to this).
PREDICT_ROWS = 100_000


def network_index(pipeline_model) -> int:
    """The index of the pipeline's one ``DistributedKerasModel`` stage."""
    from sparkdeep.transformers.keras.model import DistributedKerasModel

    at = [i for i, s in enumerate(pipeline_model.stages) if isinstance(s, DistributedKerasModel)]
    if len(at) != 1:
        raise ValueError(f"the pipeline holds {len(at)} DistributedKerasModel stages; compressing needs exactly one "
                         "trained network")
    return at[0]


def with_network(pipeline_model, stage):
    """A copy of ``pipeline_model`` with its network stage replaced by ``stage``."""
    from pyspark.ml import PipelineModel

    stages = list(pipeline_model.stages)
    stages[network_index(pipeline_model)] = stage
    return PipelineModel(stages)


def features_of(pipeline_model, df):
    """``df`` through the stages before the network: the rows the network reads."""
    from pyspark.ml import PipelineModel

    at = network_index(pipeline_model)
    return PipelineModel(list(pipeline_model.stages[:at])).transform(df) if at else df


def build_variant(name: str, stage, train_rows, cfg_compress, train_args: dict[str, Any]):
    """The variant ``name`` of network ``stage`` (``train_rows``: its features and ``label``,
    for the variants trained on the ranks)."""
    from sparkdeep.registry import Columns
    from sparkdeep.transformers.keras import compress

    if name in compress.QUANTIZE_MODES:
        return compress.quantize(stage, name)
    if name == "prune":
        return compress.prune(stage, train_rows, sparsity=cfg_compress.sparsity, labelCol=Columns.LABEL,
                              epochs=cfg_compress.fine_tune_epochs, **train_args)
    if name == "distill":
        return compress.distill(stage, train_rows, labelCol=Columns.LABEL, alpha=cfg_compress.alpha,
                                hiddenUnits=list(cfg_compress.student_units) or None,
                                epochs=cfg_compress.distill_epochs, **train_args)
    raise ValueError(f"unknown compress variant {name!r}")


def _folder_bytes(path: str) -> int | None:
    from sparkdeep import storage
    if not storage.is_local(path):
        return None
    root = storage.local(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files
               if not f.endswith(".crc"))


#: Run in a fresh Python process by :func:`predict_measure`: argv = the .keras file, the
#: features (.npy), the repeats. Prints one JSON line.
_PREDICT_CODE = """
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import keras  # noqa: F401 - imported before the baseline below, as TensorFlow is
import tensorflow  # noqa: F401
from sparkdeep.transformers.keras.network import keras_from_bytes

def rss(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None

x = np.load(sys.argv[2])
with open(sys.argv[1], "rb") as fh:
    data = fh.read()
before = rss("VmHWM")  # Python, TensorFlow and Keras imported, the rows read
net = keras_from_bytes(data)
net.predict(x[:1024], batch_size=1024, verbose=0)
best = float("inf")
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter()
    net.predict(x, batch_size=1024, verbose=0)
    best = min(best, time.perf_counter() - t0)
after = rss("VmHWM")
print(json.dumps({"predict_rows_per_s": round(len(x) / best, 1),
                  "peak_rss_bytes": None if before is None else after - before,
                  "weights_bytes": int(sum(np.asarray(w).nbytes for w in net.weights))}))
"""


def predict_measure(data: bytes, x: np.ndarray, repeat: int = 3) -> dict:
    """In a fresh Python process: ``model.predict`` rows/s on ``x`` (batch 1024, best of
    ``repeat`` after a warm-up call), the peak resident memory that loading the network and
    predicting added to the process (Linux's ``VmHWM``; ``None`` elsewhere), and the bytes
    of its weights in memory. A fresh process, so that no variant pays for another's
    allocations or for what the driver already holds."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model_path, x_path = os.path.join(tmp, "model.keras"), os.path.join(tmp, "x.npy")
        with open(model_path, "wb") as fh:
            fh.write(data)
        np.save(x_path, np.ascontiguousarray(x, dtype="float32"))
        done = subprocess.run([sys.executable, "-c", _PREDICT_CODE, model_path, x_path, str(repeat)],
                              capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"measuring model.predict failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Holdout rows the server's scorer is timed on, in requests of ``SERVER_BATCH`` rows.
SERVER_ROWS, SERVER_BATCH = 640, 64


def server_measure(pipeline_model, holdout, repeat: int = 3) -> dict:
    """Rows/s through the HTTP server's scorer (``pipelines/scoring.Scorer``: the variant
    exported, one traced graph) on the first :data:`SERVER_ROWS` holdout rows as raw
    records under the source's names, :data:`SERVER_BATCH` rows a call, best of ``repeat``
    (no HTTP: ``bench/serving_bench.py`` measures what HTTP adds). A variant the export
    cannot take gets ``None`` and the reason, logged: the other figures still count."""
    import tempfile

    from sparkdeep.names import ORIGINAL_NAME
    from sparkdeep.pipelines import export as ex
    from sparkdeep.pipelines.scoring import Scorer

    with tempfile.TemporaryDirectory() as tmp:
        try:
            ex.export_pipeline(pipeline_model, os.path.join(tmp, "export"), raw_schema=ex.raw_schema_of(holdout.schema))
            scorer = Scorer(ex.load_export(os.path.join(tmp, "export")))
        except Exception as exc:  # noqa: BLE001 - reported in the row, the step goes on
            log.warning("[compress] the server's scorer cannot take this variant: %s", exc)
            return {"server_rows_per_s": None, "server_error": str(exc)[:500]}
        source = {f.name: (f.metadata or {}).get(ORIGINAL_NAME, f.name) for f in holdout.schema.fields}
        names = [e["name"] for e in scorer.model.schema["inputs"]]
        records = holdout.limit(SERVER_ROWS).toPandas().rename(columns=source)[names].to_dict("records")
        batches = [records[i:i + SERVER_BATCH] for i in range(0, len(records), SERVER_BATCH)]
        scorer.score(batches[0])  # traces the graph once
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            for batch in batches:
                scorer.score(batch)
            best = min(best, time.perf_counter() - t0)
    return {"server_rows_per_s": round(len(records) / best, 1)}


def measure(name: str, pipeline_model, path: str, holdout, x: np.ndarray, *, key: str, task: str,
            classes: list[str] | None, repeat: int = 3, rows: int | None = None) -> dict:
    """One row of the report (see the module docstring); ``rows``: the holdout's count, if
    known (the step counts its cached holdout once for every variant)."""
    from sparkdeep.pipelines.evaluate import predictions_frame, task_metrics
    from sparkdeep.transformers.keras import compress

    stage = pipeline_model.stages[network_index(pipeline_model)]
    data = stage.kerasBytes
    scored = pipeline_model.transform(holdout)
    rows = holdout.count() if rows is None else rows
    # The first pass starts the Python workers and loads the network in each: timed apart;
    # then the best of ``repeat`` passes (the machine may be shared).
    t0 = time.perf_counter()
    scored.write.format("noop").mode("overwrite").save()
    first_s = time.perf_counter() - t0
    transform_s = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        scored.write.format("noop").mode("overwrite").save()
        transform_s = min(transform_s, time.perf_counter() - t0)
    metrics = task_metrics(predictions_frame(scored, name, key=key, task=task, classes=classes), task, classes)
    return {"variant": name, "path": path, "keras_bytes": len(data), "keras_gzip_bytes": len(zlib.compress(data, 6)),
            "folder_bytes": _folder_bytes(path), "parameters": compress.parameter_count(stage.keras_model()),
            "transform_rows_per_s": round(rows / transform_s, 1), "transform_first_s": round(first_s, 2),
            **predict_measure(data, x, repeat), **server_measure(pipeline_model, holdout, repeat),
            "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float))},
            "compressed": stage.trainingSummary.get("compressed")}


def plot(rows: list[dict], metric: str, path: str) -> str:
    """Size on disk against the held-out metric, one labelled point per variant (PNG)."""
    from matplotlib.figure import Figure

    from sparkdeep import storage
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for r in rows:
        size, value = r["keras_bytes"] / 1024, r["metrics"].get(metric)
        ax.scatter([size], [value])
        ax.annotate(r["variant"], (size, value), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(".keras size (KiB)")
    ax.set_ylabel(f"held-out {metric}")
    ax.set_title("Smaller variants of the network")
    fig.tight_layout()
    local = storage.local(path) if storage.is_local(path) else None
    if local is None:
        raise ValueError(f"the compress plot is written with local files; {path} is not local")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    fig.savefig(local, dpi=100)
    return path


def compress_promoted(spark, cfg, paths, *, train_args: dict[str, Any] | None = None) -> dict:
    """Build, save and measure ``cfg.compress.variants`` of the promoted network; write the
    report. ``train_args`` go to the estimator that fine-tunes (``prune``) or trains
    (``distill``) on the ranks (default: the train config's ``num_proc``, ``batch_size``
    (256 when 0), ``learning_rate`` / 10 for fine-tuning, ``seed``)."""
    from sparkdeep import delta_io, model_store, storage, tasks
    from sparkdeep.paths import read_json, tree_digest, write_json
    from sparkdeep.pipelines.evaluate import classes_of
    from sparkdeep.registry import Columns, Models, Tables
    from sparkdeep.transformers.keras.compress import UnsupportedVariant

    latest = read_json(paths.latest)
    if not latest or Models.PIPELINE not in latest.get("models", {}):
        raise FileNotFoundError(f"no promoted model to compress: {paths.latest} is missing or names no "
                                f"{Models.PIPELINE!r} model; run the train and evaluate steps first")
    ref, run_id = latest["models"][Models.PIPELINE], latest["run_id"]
    if tree_digest(ref["path"]) != ref["digest"]:
        raise ValueError(f"the promoted model at {ref['path']} is not the one run {run_id!r} recorded: it was "
                         "replaced since; refusing to compress it")
    original = model_store.load_pipeline(spark, ref["path"])
    stage = original.stages[network_index(original)]
    task = stage._task(stage.keras_model())
    tables = latest.get("tables", {})
    holdout = delta_io.read(spark, paths.table(Tables.HOLDOUT), tables.get(Tables.HOLDOUT)).cache()
    holdout_rows = holdout.count()
    classes = classes_of(holdout) if task == "multiclass" else None
    key = cfg.dataset.key_column if cfg.dataset is not None else Columns.KEY
    fcol = stage.getFeaturesCol()
    feats = features_of(original, holdout).select(fcol).limit(PREDICT_ROWS).collect()
    x = np.array([np.asarray(r[0].toArray() if hasattr(r[0], "toArray") else r[0], dtype="float32")
                  for r in feats], dtype="float32")
    t = cfg.train
    args = {"numProc": t.num_proc, "batchSize": t.batch_size or 256, "seed": cfg.seed, **(train_args or {})}
    needs_rows = {"prune", "distill"} & set(cfg.compress.variants)
    train_rows = None
    if needs_rows:
        train = delta_io.read(spark, paths.table(Tables.TRAIN), tables.get(Tables.TRAIN))
        train_rows = features_of(original, train).select(fcol, Columns.LABEL)
    out_root = storage.join(paths.root, "runs", run_id, "compress")
    rows = [measure("original", original, ref["path"], holdout, x, key=key, task=task, classes=classes,
                    rows=holdout_rows)]
    skipped = {}
    for name in cfg.compress.variants:
        t0 = time.perf_counter()
        # Fine-tuning starts from trained weights: a tenth of the training rate.
        extra = {"learningRate": t.learning_rate / 10} if name == "prune" else {"learningRate": t.learning_rate}
        try:
            variant = build_variant(name, stage, train_rows, cfg.compress, {**args, **extra, **(train_args or {})})
        except UnsupportedVariant as e:
            skipped[name] = str(e)
            log.warning("[compress] %s: skipped: %s", name, e)
            continue
        build_s = time.perf_counter() - t0
        pipeline = with_network(original, variant)
        path = storage.join(out_root, name)
        pipeline.write().overwrite().save(path)
        row = measure(name, model_store.load_pipeline(spark, path), path, holdout, x, key=key, task=task,
                      classes=classes, rows=holdout_rows)
        rows.append({**row, "build_s": round(build_s, 2)})
        log.info("[compress] %s: %s bytes, %s parameters, %s",
                 name, row['keras_bytes'], row['parameters'], row['metrics'])
    gate, higher = tasks.gate_metric(cfg.gate.metric, task)
    base = rows[0]["metrics"].get(gate)
    for r in rows:
        value = r["metrics"].get(gate)
        r["metric"] = gate
        r["metric_difference"] = None if value is None or base is None else value - base
        for k in ("keras_bytes", "parameters", "transform_rows_per_s", "predict_rows_per_s", "server_rows_per_s"):
            r[f"{k}_ratio"] = round(r[k] / rows[0][k], 3) if rows[0].get(k) and r.get(k) is not None else None
    report = {"run_id": run_id, "source": ref["path"], "task": task, "metric": gate, "higher_is_better": higher,
              "holdout_rows": holdout_rows, "predict_rows": len(x), "variants": rows, "skipped": skipped}
    report["report_json"] = write_json(paths.run_report(run_id, "compress"), report)
    report["plot"] = plot(rows, gate, paths.run_report(run_id, "compress", "png"))
    holdout.unpersist()
    return report


def table(report: dict) -> str:
    """The report as a Markdown table."""
    lines = ["| variant | .keras KiB | gzip KiB | parameters | transform rows/s | predict rows/s | server rows/s "
             f"| peak RSS MiB | {report['metric']} | difference |", "|" + "---|" * 10]
    for r in report["variants"]:
        rss, diff, server = r.get("peak_rss_bytes"), r.get("metric_difference"), r.get("server_rows_per_s")
        value = r["metrics"].get(report["metric"], float("nan"))
        lines.append(f"| {r['variant']} | {r['keras_bytes'] / 1024:.1f} | {r['keras_gzip_bytes'] / 1024:.1f} | "
                     f"{r['parameters']} | {r['transform_rows_per_s']:.0f} | {r['predict_rows_per_s']:.0f} | "
                     f"{'' if server is None else f'{server:.0f}'} | "
                     f"{'' if rss is None else f'{rss / 2**20:.1f}'} | {value:.4f} | "
                     f"{'' if diff is None else f'{diff:+.4f}'} |")
    return "\n".join(lines)


__all__ = ["build_variant", "compress_promoted", "features_of", "measure", "network_index", "predict_measure",
           "server_measure", "table", "with_network"]

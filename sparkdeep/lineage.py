"""What a model was trained on, and getting exactly that back by Delta time travel.

The train step stores, in the saved Keras stage's metadata (``trainingSummary``
-> ``training_inputs``), each Delta table on the path to its training data with the
version read, plus a fingerprint of the training table: its row count and an
order-independent sum of a 64-bit hash of every row. :func:`reproduce` reads those
versions back (``versionAsOf``) and checks the fingerprint, so "the same input" is
verified, not assumed. Time travel needs the table's old files: VACUUM with a retention
shorter than the model's age removes them (Delta's default keeps 7 days of files and
30 days of log; raise ``delta.deletedFileRetentionDuration`` to keep models reproducible
longer).
"""
from __future__ import annotations

import json

from pyspark.sql import DataFrame, functions as F

from sparkdeep import model_store
from sparkdeep.registry import Tables


def fingerprint(df: DataFrame) -> dict:
    """Row count and an order-independent content hash (sum of xxhash64 over all columns)."""
    row = df.select(F.count(F.lit(1)).alias("n"),
                    F.sum(F.xxhash64(*df.columns).cast("decimal(38,0)")).alias("h")).first()
    return {"rows": int(row["n"]), "xxhash64_sum": str(row["h"] if row["h"] is not None else 0)}


def training_inputs(spark, model_path: str) -> dict:
    """The ``training_inputs`` recorded in a saved pipeline (or a saved Keras stage)."""
    model = model_store.load(spark, model_path)
    # By attribute, not isinstance: core does not import sparkdeep.transformers.
    stages = [s for s in getattr(model, "stages", [model]) if hasattr(s, "trainingSummary")]
    if not stages:
        raise ValueError(f"{model_path} holds no DistributedKerasModel stage")
    summary = stages[-1].trainingSummary
    inputs = summary.get("training_inputs")
    if not inputs:
        raise ValueError(f"{model_path} records no training_inputs (saved before lineage was kept?)")
    return inputs


def reproduce(spark, inputs: dict, table: str = Tables.TRAIN_PREPARED) -> tuple[DataFrame, dict]:
    """The recorded version of ``table`` by time travel, checked against the recorded fingerprint."""
    from sparkdeep import delta_io
    ref = inputs["tables"][table]
    df = delta_io.read(spark, ref["path"], version=ref["version"])
    want = inputs.get("fingerprint") if table == inputs.get("trained_on") else None
    got = fingerprint(df)
    if want is not None and got != want:
        raise ValueError(f"{ref['path']}@v{ref['version']} no longer matches the training input "
                         f"(recorded {json.dumps(want)}, read {json.dumps(got)})")
    return df, {"table": table, **ref, "fingerprint": got, "verified": want is not None}

"""Score: load the saved pipelines in this new process and score the holdout table in batch.

``predictions`` holds the network's; ``baseline_predictions`` every baseline's, told
apart by the ``model`` column (one pass of the saved baselines pipeline scores them all).
"""
from __future__ import annotations

import logging

from pyspark import StorageLevel

from sparkdeep import delta_io, model_store
from sparkdeep.pipelines import baselines as bl
from sparkdeep.pipelines.evaluate import classes_of, predictions_frame
from sparkdeep.registry import Columns, Models, Tables
from sparkdeep.transformers.columns import wide_plans

log = logging.getLogger(__name__)


def score_step(spark, cfg, paths, run) -> dict:
    spec = cfg.dataset
    holdout = run.read(spark, Tables.HOLDOUT)
    classes = classes_of(holdout) if spec.task == "multiclass" else None
    out = {"holdout_version": run.inputs[Tables.HOLDOUT]["version"], "rows_in": holdout.count(), "tables": {}}
    for name, table in ((Models.PIPELINE, Tables.PREDICTIONS), (Models.BASELINE, Tables.BASELINE_PREDICTIONS)):
        model = model_store.load_pipeline(spark, run.model_input(name))
        with wide_plans(spark):  # MLlib's per-column stages plan in linear time at width
            scored = model.transform(holdout)
        if name == Models.PIPELINE:
            frame = predictions_frame(scored, "keras", key=spec.key_column, task=spec.task, classes=classes)
        else:
            names = bl.names_in(model)
            if not names:
                raise ValueError(f"the saved baseline model at {run.model_input(name)} holds no baseline "
                                 "(saved by an older version?): rerun the train step")
            out["baselines"] = names
            # One pass of the front and the models, whatever the number of baselines.
            scored = scored.select(spec.key_column, *[c for c in scored.columns if c == Columns.LABEL or c.endswith(
                (bl.PREDICTION, bl.PROBABILITY, bl.RAW))]).persist(StorageLevel.MEMORY_AND_DISK)
            frame = None
            for b in names:
                one = predictions_frame(bl.model_frame(scored, b, spec.task), b, key=spec.key_column,
                                        task=spec.task, classes=classes)
                frame = one if frame is None else frame.unionByName(one)
        if spec.key and spec.key != spec.key_column:
            # The key under the source's name, as the user knows it (Delta takes it with
            # column mapping); the tables above keep the internal name.
            frame = frame.withColumnRenamed(spec.key_column, spec.key)
            ref = run.write(frame, table, column_mapping=True)
        else:
            ref = run.write(frame, table)
        scored.unpersist()
        out["tables"][table] = ref.as_dict()
        out[f"rows_out_{table}"] = delta_io.read(spark, ref.path, ref.version).count()
    log.info("[score] %s holdout rows scored -> %s predictions (keras), %s (%s baselines: %s)",
             out['rows_in'], out['rows_out_predictions'], out['rows_out_baseline_predictions'], len(out['baselines']),
             ', '.join(out['baselines']))
    return out

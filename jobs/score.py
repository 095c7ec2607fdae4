"""Score: load the saved pipelines in this new process and score the holdout table in batch."""
from __future__ import annotations

import sys

from sparkdeep import delta_io, model_store
from sparkdeep.pipelines.evaluate import classes_of, predictions_frame

from sparkdeep.jobs._common import main_for


def step(spark, cfg, paths, run) -> dict:
    spec = cfg.dataset
    holdout = run.read(spark, "holdout")
    classes = classes_of(holdout) if spec.task == "multiclass" else None
    out = {"holdout_version": run.inputs["holdout"]["version"], "rows_in": holdout.count(), "tables": {}}
    baseline = "linreg" if spec.task == "regression" else "logreg"
    for name, table in (("pipeline", "predictions"), ("baseline", "baseline_predictions")):
        model = model_store.load_pipeline(spark, run.model_input(name))
        scored = predictions_frame(model.transform(holdout), "keras" if name == "pipeline" else baseline,
                                   key=spec.key_column, task=spec.task, classes=classes)
        ref = run.write(scored, table)
        out["tables"][table] = ref.as_dict()
        out[f"rows_out_{table}"] = delta_io.read(spark, ref.path, ref.version).count()
    print(f"[score] {out['rows_in']} holdout rows scored -> {out['rows_out_predictions']} predictions "
          f"(keras), {out['rows_out_baseline_predictions']} (baseline)", flush=True)
    return out


main = main_for("score", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

"""Train: Keras on Horovod ranks + the logistic baseline; save both whole pipelines."""
from __future__ import annotations

import sys

from pyspark.ml import PipelineModel

from sparkdeep import delta_io
from sparkdeep.pipelines import train as tr

from sparkdeep.jobs._common import main_for


def fit_models(spark, cfg, paths) -> tuple[PipelineModel, PipelineModel, dict]:
    """Fit Keras (Horovod) and the baseline; return both whole pipelines, unsaved."""
    table = paths.table("train_prepared")
    version = delta_io.version_of(spark, table)
    train = delta_io.read(spark, table, version=version)
    prepare_model = PipelineModel.load(paths.model("prepare"))

    t = cfg.train
    estimator = tr.keras_estimator(num_proc=t.num_proc, epochs=t.epochs, batch_size=t.batch_size,
                                   learning_rate=t.learning_rate, hidden_units=t.hidden_units,
                                   dropout=t.dropout, seed=cfg.seed)
    keras_model = estimator.fit(train)
    baseline = tr.logistic_baseline(train)
    summary = keras_model.trainingSummary
    timings = summary["timings_s"]
    print(f"[train] {t.num_proc} Horovod ranks, {t.epochs} epochs: launch to first step "
          f"{timings['launch_to_first_step']:.1f}s, training {timings['training']:.1f}s, "
          f"fit total {timings['fit_total']:.1f}s", flush=True)
    report = {"rows_in": train.count(), "train_prepared_version": version, "keras": summary,
              "models": {"pipeline": paths.model("pipeline"), "baseline": paths.model("baseline")}}
    return (tr.scoring_pipeline(prepare_model, keras_model),
            tr.scoring_pipeline(prepare_model, baseline), report)


def step(spark, cfg, paths) -> dict:
    keras_pipeline, baseline_pipeline, report = fit_models(spark, cfg, paths)
    keras_pipeline.write().overwrite().save(paths.model("pipeline"))
    baseline_pipeline.write().overwrite().save(paths.model("baseline"))
    return report


main = main_for("train", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

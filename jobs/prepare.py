"""Prepare: split train/holdout, fit the reduction pipeline, write the prepared training table."""
from __future__ import annotations

import sys

from sparkdeep import delta_io, names
from sparkdeep.registry import Models, Tables
from sparkdeep.pipelines import prepare as prep
from sparkdeep.transformers.columns import wide_plans

from sparkdeep.jobs._common import main_for

#: How many per-column lines the console shows (the report has them all).
LISTED = 20


def step(spark, cfg, paths, run) -> dict:
    spec = cfg.dataset
    key = spec.key_column
    table = run.read(spark, spec.table)
    categorical, numeric = prep.feature_columns(table, key)
    originals = names.originals(table.schema)  # {internal: source name} of renamed columns
    shown = {c: originals.get(c, c) for c in table.columns}  # every column, for names.display
    train, holdout = prep.split_train_holdout(table, cfg.prepare.holdout_fraction, cfg.seed, key)
    # Before any write or fit: an empty split, or a column no stage can learn from, is named
    # here, not minutes later deep in a fit or in evaluate.
    profile = prep.column_profile(train, categorical, numeric)
    for part, empty in ((Tables.HOLDOUT, holdout.limit(1).count() == 0), ("training split", profile["rows"] == 0)):
        if empty:
            raise ValueError(f"the {part} is empty: {table.count()} usable rows in {spec.table!r} and "
                             f"prepare.holdout_fraction {cfg.prepare.holdout_fraction}; use more rows (is "
                             f"data.sample_fraction {cfg.data.sample_fraction} too small for this table?) or "
                             "another holdout_fraction")
    categorical, numeric, left_out = prep.usable_features(profile, categorical, numeric, where=spec.file)
    for c, why in list(left_out.items())[:LISTED]:
        print(f"[prepare] left out {names.display(c, shown)!r}: {why}", flush=True)
    if len(left_out) > LISTED:
        print(f"[prepare] ... and {len(left_out) - LISTED} more columns left out (all in the prepare report)", flush=True)
    if not categorical and not numeric:
        raise ValueError(f"no usable feature column in {spec.table!r}: every one is left out ({left_out})")
    train_ref = run.write(train, Tables.TRAIN)
    holdout_ref = run.write(holdout, Tables.HOLDOUT)
    train = delta_io.read(spark, train_ref.path, train_ref.version).cache()

    pipeline = prep.build_prepare_pipeline(
        task=spec.task, categorical=categorical, numeric=numeric, key=key,
        majority_ratio=cfg.prepare.majority_ratio,
        selector_top_fraction=cfg.prepare.selector_top_fraction,
        max_correlation=cfg.prepare.max_correlation, pca_k=cfg.prepare.pca_k,
        pca_variance_target=cfg.prepare.pca_variance_target, seed=cfg.seed,
        encoding=cfg.prepare.encoding, pca=cfg.prepare.pca, numeric_buckets=cfg.prepare.numeric_buckets,
        originals=originals)
    with wide_plans(spark):  # MLlib's per-column stages plan in linear time at width
        model = pipeline.fit(train)
        prepared = prep.prepared_training_data(model, train, key)
    run.save_model(model, Models.PREPARE)
    prepared_ref = run.write(prepared.repartition(4), Tables.TRAIN_PREPARED)
    rows_train = profile["rows"] if prep.sampler_of(model) is None else None
    train.unpersist()

    report = prep.prepare_report(model, rows_train, shown)
    s = report["sampler"]
    report.update({
        "rows_train": s["rows_in"], "rows_train_prepared": s["rows_out"],
        "rows_holdout": delta_io.read(spark, holdout_ref.path, holdout_ref.version).count(),
        "dataset": spec.name, "task": spec.task,
        "tables": {spec.table: run.inputs[spec.table],
                   Tables.TRAIN: train_ref.as_dict(), Tables.HOLDOUT: holdout_ref.as_dict(),
                   Tables.TRAIN_PREPARED: prepared_ref.as_dict()},
    })
    how = "after rebalancing" if s.get("stage") else "(not rebalanced)"
    print(f"[prepare] train {s['rows_in']} rows -> {s['rows_out']} {how}; holdout {report['rows_holdout']}",
          flush=True)
    for sel in report["selection"]:
        kept = sel["selected_names"]
        print(f"[prepare] {sel['stage']}: {sel['input_features']} -> {sel['selected']} features "
              f"({', '.join(kept[:8])}{', ...' if len(kept) > 8 else ''})", flush=True)
    report["encoding"] = cfg.prepare.encoding
    report["left_out"] = {names.display(c, shown): why for c, why in left_out.items()}
    layout = prep.embedding_layout(model)
    if layout:
        report["embedding_layout"] = _embedding_layout(layout, shown)
    if "pca_k" in report:
        total = report["pca_explained_variance_total"]
        print(f"[prepare] CenteredPCA k={report['pca_k']} explains {total} of the variance: "
              f"{report.get('pca_explained_variance')}", flush=True)
        target = cfg.prepare.pca_variance_target
        if total is not None and total < target:
            report["warnings"] = [f"PCA keeps {total:.3f} of the variance, below prepare.pca_variance_target "
                                  f"{target}: raise prepare.pca_k (0 = the smallest k reaching the target) or "
                                  "turn PCA off (prepare.pca=false); bench/RESULTS.md has what it cost here"]
            print(f"[prepare] WARNING: {report['warnings'][0]}", flush=True)
    return report


def _embedding_layout(layout: dict, shown: dict) -> dict:
    """The layout under the source's names, printed with at most LISTED columns."""
    labels = names.display_all(layout["categorical"], shown)
    bins = sum(c.endswith(" (bins)") for c in layout["categorical"])
    pairs = ", ".join(f"{c} {n}" for c, n in zip(labels[:LISTED], layout["cardinalities"][:LISTED]))
    print(f"[prepare] embeddings for {len(labels) - bins} categorical columns and {bins} "
          f"numbers' quantile bins; indices (values + 1 for unseen/null): {pairs}"
          + (f", ... ({len(labels) - LISTED} more, in the prepare report)" if len(labels) > LISTED else ""),
          flush=True)
    return {**layout, "categorical": labels}


main = main_for("prepare", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

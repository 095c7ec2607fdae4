"""Ingest: the dataset spec's source -> Delta ``<name>`` (usable rows) and ``<name>_rejected``.

Every check that can stop the step (spec against source, drift, labels, key uniqueness)
runs before anything is written, so a failed ingest leaves the output folder as it was.
"""
from __future__ import annotations

import sys

from pyspark import StorageLevel
from pyspark.sql import functions as F

from sparkdeep import delta_io
from sparkdeep.paths import write_json
from sparkdeep.pipelines import ingest as ing

from sparkdeep.jobs._common import main_for


def step(spark, cfg, paths, run) -> dict:
    # Spark parses only the CSV columns a query needs, and then sees fewer malformed lines:
    # every pass here must judge a line the same way, so pruning is off while ingesting.
    with ing.whole_csv_lines(spark):
        try:
            return _step(spark, cfg, paths, run)
        except ing.SourceError as exc:
            if cfg.dataset.file in str(exc):
                raise
            raise ing.SourceError(f"{exc} (dataset spec {cfg.dataset.file})") from None


def _step(spark, cfg, paths, run) -> dict:
    spec = cfg.dataset
    # A spec is data, not code: its filter may only compute from the row (Spark's parser
    # reads it, nothing runs), checked before the source is touched, and again against the
    # source's columns (a bare name that is no column would be a session variable or a call).
    ing.check_filter(spark, spec)
    ing.claim_output(paths, spec)
    record = ing.schema_record_path(paths.table(""), spec)
    source = ing.read_source(spark, spec, ing.read_recorded_schema(record))
    ing.check_filter(spark, spec, source.df.columns)
    categorical, numeric, left_out = ing.resolve_features(spec, source)
    ok = F.col(ing.CORRUPT).isNull() if ing.CORRUPT in source.df.columns else F.lit(True)
    plan = ing.label_plan(spec, source, ok)
    # Kept for the key check, the counts and both writes: one pass over the source instead
    # of four (a builtin loader's joins ran again on each). On the executors' local disk,
    # not in memory: a memory cache is built inside the key check's tasks and starved their
    # hash aggregation (10x rows with a 3g JVM failed with AGGREGATE_OUT_OF_MEMORY; on disk
    # it passes, and takes the same time at 1x: bench/RESULTS.md).
    renamed = ing.internal_names(spec, categorical, numeric)
    classified = ing.classify_rows(spec, source, categorical, numeric, plan,
                                   cfg.data.sample_fraction, cfg.seed, renamed).persist(StorageLevel.DISK_ONLY)
    try:
        report = _write(spark, cfg, paths, run, spec, record, source, categorical, numeric, left_out, plan,
                        classified)
        report["renamed_columns"] = renamed
        if renamed:
            shown = ", ".join(f"{k!r} -> {v!r}" for k, v in list(renamed.items())[:5])
            print(f"[ingest] {len(renamed)} column name(s) Delta or MLlib cannot take are stored under internal "
                  f"names ({shown}{', ...' if len(renamed) > 5 else ''}); the saved model accepts either, and "
                  "reports show the source names", flush=True)
        return report
    finally:
        classified.unpersist()


def _write(spark, cfg, paths, run, spec, record, source, categorical, numeric, left_out, plan,
           classified) -> dict:
    usable, rejected = ing.split_classified(classified, spec.key_column)
    if spec.key:
        ing.check_key_unique(usable, spec.key_column, spec)
    # One aggregation: the rows by reason, and the usable rows by class (a label with one
    # class stops the step here, before anything is written).
    by_class = F.when(F.col("reason").isNull(), F.col(ing.LABEL)) if plan["task"] != "regression" else F.lit(None)
    counts, class_counts = {}, {}
    for r in classified.groupBy("reason", by_class.alias("_class")).count().collect():
        counts[r["reason"]] = counts.get(r["reason"], 0) + int(r["count"])
        if r["reason"] is None and r["_class"] is not None:
            class_counts[r["_class"]] = int(r["count"])
    # The full source is counted on its own; a sample's input is the rows the sample kept.
    rows_in = source.df.count() if cfg.data.sample_fraction >= 1.0 else sum(counts.values())
    if not counts.get(None):  # checked before any write: a failed ingest leaves the output as it was
        filtered = counts.get("__filtered__", 0)
        by_reason = {k: v for k, v in counts.items() if k not in (None, "__filtered__")}
        raise ValueError(
            f"no usable rows in {spec.source.path or spec.source.table or spec.source.loader} "
            f"({spec.file}): {rows_in} rows read, {filtered} left out by the filter {spec.filter!r}, "
            f"rejected: {by_reason or 'none'}" + (f"; sample_fraction {cfg.data.sample_fraction} kept "
                                                 f"{sum(counts.values())}" if cfg.data.sample_fraction < 1 else ""))
    ing.check_label_classes(spec, plan, class_counts,
                            {k: v for k, v in counts.items() if k not in (None, "__filtered__")},
                            counts.get("__filtered__", 0))

    out = run.write(usable, spec.table)
    rej = run.write(rejected.coalesce(1), spec.rejected_table)
    written = delta_io.read(spark, out.path, out.version)
    report = ing.ingest_report(rows_in, dict(counts), written, plan)
    written_rejected = delta_io.read(spark, rej.path, rej.version).count()
    written_usable = written.count()
    if report["rows_usable"] != written_usable or report["rows_rejected"] != written_rejected:
        raise RuntimeError(f"ingest wrote {written_usable} usable and {written_rejected} rejected rows, "
                           f"but classified {report['rows_usable']} and {report['rows_rejected']}")
    if not report["accounted"]:
        raise RuntimeError(f"ingest lost rows: {report['rows_in']} in, {report['rows_usable']} usable + "
                           f"{report['rows_rejected']} rejected + {report['rows_filtered']} filtered")
    write_json(record, source.declared.jsonValue())
    ing.claim_output(paths, spec, write=True)
    report.update({
        "dataset": spec.name, "task": spec.task, "spec_file": spec.file,
        "source": {"format": spec.source.format, "path": spec.source.path, "table": spec.source.table,
                   "loader": spec.source.loader, "version": source.version,
                   "declared_from": source.declared_from, **source.notes},
        "features": {"categorical": categorical, "numeric": numeric, "left_out": left_out},
        "new_columns_ignored": source.new_columns,
        "label": {"column": spec.label.column, **{k: v for k, v in plan.items() if k != "task"}},
        "tables": {spec.table: out.as_dict(), spec.rejected_table: rej.as_dict()},
        "sample_fraction": cfg.data.sample_fraction,
    })
    print(f"[ingest] {spec.name}: {report['rows_in']} rows read: {report['rows_usable']} usable, "
          f"{report['rows_rejected']} rejected {_top(report['rejected_by_reason'])}, "
          f"{report['rows_filtered']} left out by the filter", flush=True)
    if plan.get("class_0_values"):
        more = "" if plan["class_0_values_listed_all"] else ", ..."
        print(f"[ingest] label {spec.label.column!r}: class 1 = {list(spec.label.positive)}; class 0 = every other "
              f"value: {plan['class_0_values']}{more} (set label.negative to reject values in neither list)",
              flush=True)
    print(f"[ingest] features: {len(categorical)} categorical, {len(numeric)} numeric"
          + (f"; left out {len(left_out)}: {ing.listed(sorted(left_out), 10)}" if left_out else "")
          + (f"; new source columns ignored: {ing.listed(source.new_columns, 10)}" if source.new_columns else ""),
          flush=True)
    return report


def _top(counts: dict, at_most: int = 10) -> str:
    """The ``at_most`` largest counts (a wide table can reject rows for thousands of reasons:
    one per column; the report has them all)."""
    if len(counts) <= at_most:
        return str(counts)
    top = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:at_most])
    return f"{top} and {len(counts) - at_most} more reasons (in the ingest report)"


main = main_for("ingest", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

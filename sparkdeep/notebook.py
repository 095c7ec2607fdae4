"""What a notebook needs from the library, so that notebooks hold no logic of their own.

    from sparkdeep import notebook
    spark, cfg, paths = notebook.start(master="local[2]", env="local")   # or master="spark://host:7077"
    notebook.show(report.pca_figure(...))

``start`` loads the same layered config as the jobs (``conf/base`` + ``--env`` overlay +
overrides), sets the master (the one setting that moves a notebook from a local session
to a cluster; ``None`` keeps the cluster's own when the notebook server already runs
inside one, e.g. a Spark-attached Jupyter) and builds the session with Delta on.
"""
from __future__ import annotations

import os

from sparkdeep.config import Config, default_conf_dir, load_config
from sparkdeep.logs import install_default
from sparkdeep.paths import Paths


def start(master: str | None = "local[2]", env: str | None = None, output_dir: str | None = None,
          overrides: list[str] | tuple[str, ...] = (), conf_dir: str | None = None,
          app_name: str = "sparkdeep-notebook"):
    """Config, then a SparkSession for this notebook; returns ``(spark, cfg, paths)``. The
    notebook shows sparkdeep's lines as a job prints them (:func:`sparkdeep.logs.install_default`)."""
    install_default()
    sets = list(overrides)
    if master:
        sets.append(f"spark.master={master}")
    if output_dir:
        sets.append(f"output_dir={output_dir}")
    cfg: Config = load_config(conf_dir or default_conf_dir(), env=env, overrides=sets)
    from sparkdeep.session import builder
    spark = builder(cfg.spark, app_name=app_name).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark, cfg, Paths.under(cfg.output_dir)


def show(fig) -> None:
    """Display a matplotlib figure as a PNG in the notebook (no pyplot backend needed)."""
    import io
    from IPython.display import Image, display
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    display(Image(data=buf.getvalue()))


def setting(name: str, default: str) -> str:
    """A notebook parameter from the environment (``SPARKDEEP_<NAME>``), else ``default``."""
    return os.environ.get(f"SPARKDEEP_{name.upper()}", default)

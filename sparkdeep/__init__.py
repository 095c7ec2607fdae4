"""sparkdeep: Spark data reduction and Horovod-on-Spark Keras training, one MLlib pipeline."""
__version__ = "0.1.0"

from sparkdeep import logs as _logs  # noqa: E402 - the package's logger, set up once

_logs.install_default()

"""sparkdeep: Spark data reduction and Horovod-on-Spark Keras training, one MLlib pipeline."""
__version__ = "0.1.0"

import logging as _logging

# A library installs no handler: the jobs, the ranks and the notebook helper install the
# console one (sparkdeep.logs.install_default); an application that imports sparkdeep
# routes the lines with its own logging set-up.
_logging.getLogger("sparkdeep").addHandler(_logging.NullHandler())

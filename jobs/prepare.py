"""Prepare: split train/holdout, fit the reduction pipeline, write the prepared training table."""
from __future__ import annotations

import sys

from sparkdeep.jobs._common import main_for
from sparkdeep.pipelines.prepare import prepare_step as step

main = main_for("prepare", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

"""Evaluate: held-out metrics of Keras vs MLlib's usual models, fit times, counts and timings.

The task comes from the predictions table itself (its ``probability`` column), the class
names from its ``label`` metadata: this step needs no data-set knowledge.
"""
from __future__ import annotations

import sys

from sparkdeep.jobs._common import main_for
from sparkdeep.pipelines.evaluate import evaluate_step as step

main = main_for("evaluate", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

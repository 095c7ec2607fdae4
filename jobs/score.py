"""Score: load the saved pipelines in this new process and score the holdout table in batch.

``predictions`` holds the network's; ``baseline_predictions`` every baseline's, told
apart by the ``model`` column (one pass of the saved baselines pipeline scores them all).
"""
from __future__ import annotations

import sys

from sparkdeep.jobs._common import main_for
from sparkdeep.pipelines.score import score_step as step

main = main_for("score", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

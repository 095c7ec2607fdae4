"""Ingest: the dataset spec's source -> Delta ``<name>`` (usable rows) and ``<name>_rejected``.

Every check that can stop the step (spec against source, drift, labels, key uniqueness)
runs before anything is written, so a failed ingest leaves the output folder as it was.
"""
from __future__ import annotations

import sys

from sparkdeep.jobs._common import main_for
from sparkdeep.pipelines.ingest import ingest_step as step

main = main_for("ingest", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())

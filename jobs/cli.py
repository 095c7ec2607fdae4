"""The ``sparkdeep`` command: one subcommand per job.

``sparkdeep run`` runs the five steps in one process (the pipeline job); ``sparkdeep
<step>`` runs one (``ingest``, ``prepare``, ``train``, ``score``, ``evaluate``), and the
other jobs are ``tune``, ``export``, ``serve``, ``compress`` and ``reproduce``. Everything
after the subcommand is that job's own options (``sparkdeep train --help``); each is also
``python -m sparkdeep.jobs.<job>``, as a ``spark-submit`` of the module runs it.

Examples
--------
>>> from sparkdeep.jobs.cli import JOBS
>>> JOBS["run"]
'pipeline'
>>> sorted(JOBS) == sorted({"run", "ingest", "prepare", "train", "score", "evaluate", "tune", "export",
...                         "serve", "compress", "reproduce"})
True
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys

#: Subcommand -> the job module under ``sparkdeep.jobs`` that runs it.
JOBS: dict[str, str] = {
    "run": "pipeline",
    "ingest": "ingest", "prepare": "prepare", "train": "train", "score": "score", "evaluate": "evaluate",
    "tune": "tune", "export": "export", "serve": "serve", "compress": "compress", "reproduce": "reproduce",
}


def _summary(module: str) -> str:
    """The first line of a job module's docstring, read without importing the module (an
    import would start TensorFlow or Spark's imports for a ``--help``)."""
    spec = importlib.util.find_spec(f"sparkdeep.jobs.{module}")
    with open(spec.origin, encoding="utf-8") as fh:
        doc = ast.get_docstring(ast.parse(fh.read())) or ""
    return doc.strip().splitlines()[0].replace("``", "") if doc.strip() else ""


def usage() -> str:
    """The command's help: its subcommands, each with its job's one-line summary."""
    width = max(map(len, JOBS))
    lines = ["usage: sparkdeep <command> [options]   (sparkdeep <command> --help for its options)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {_summary(module)}" for name, module in JOBS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``sparkdeep <command> [options]``; returns the job's exit status (2: an unknown command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in JOBS:
        print(f"sparkdeep: unknown command {name!r}; the commands are {', '.join(JOBS)}", file=sys.stderr)
        return 2
    job = importlib.import_module(f"sparkdeep.jobs.{JOBS[name]}")
    importlib.import_module("sparkdeep.jobs._common").invoked_as(JOBS[name], name)  # loaded by the job already
    return job.main(rest)


if __name__ == "__main__":
    sys.exit(main())

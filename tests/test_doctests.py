"""Every example in the shipped docstrings runs as a doctest (numpydoc ``Examples`` and
inline ``>>>`` lines). An example that needs a Spark session or a trained model says
``# doctest: +SKIP``, or runs on the test run's session, given to it as ``spark`` (as
pyspark.ml's own doctests do); the rest must print what they show."""
import doctest
import glob
import importlib
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Source folder -> the package it installs as (pyproject.toml's package-dir).
PACKAGES = {"sparkdeep": "sparkdeep", "jobs": "sparkdeep.jobs", "pipelines": "sparkdeep.pipelines",
            "transformers": "sparkdeep.transformers", "conf": "sparkdeep.conf"}


def modules_with_examples() -> list[str]:
    found = []
    for folder, package in PACKAGES.items():
        for path in sorted(glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True)):
            if ">>>" not in open(path, encoding="utf-8").read():
                continue
            rel = os.path.relpath(path, os.path.join(REPO, folder))[:-3].replace(os.sep, ".")
            found.append(package if rel == "__init__" else f"{package}.{rel.removesuffix('.__init__')}")
    return found


def test_the_modules_with_examples_are_found():
    names = modules_with_examples()
    assert {"sparkdeep.dataset", "sparkdeep.conf", "sparkdeep.jobs.cli"} <= set(names), names


@pytest.mark.parametrize("module", modules_with_examples())
def test_docstring_examples_run(spark, module):
    result = doctest.testmod(importlib.import_module(module), extraglobs={"spark": spark},
                             optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{module}: {result.failed} of {result.attempted} examples failed"

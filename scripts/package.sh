#!/usr/bin/env bash
# Build what a cluster needs to run the jobs: dist/sparkdeep-<version>-py3-none-any.whl
# (pip install it into the cluster's Python) and dist/sparkdeep-<version>.zip, the same
# files as a --py-files archive (Spark puts .zip files, not .whl, on executors' sys.path).
# Prints the zip's path. Rebuilds only when a source file is newer than the zip.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
VPY=${VPY:-$ROOT/.venv/bin/python}
version=$("$VPY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
zip=dist/sparkdeep-$version.zip
# One build at a time (parallel test workers, two submits at once): the others wait, then reuse it.
mkdir -p dist
exec 9>dist/.build.lock
flock 9
newer=$( [[ -f $zip ]] && find sparkdeep jobs pipelines transformers conf pyproject.toml -newer "$zip" \( -name '*.py' -o -name '*.yaml' -o -name pyproject.toml \) | head -1 || echo rebuild)
if [[ -n $newer ]]; then
  rm -rf build dist/sparkdeep-"$version"*
  "$VPY" -m pip wheel --quiet --no-deps --no-build-isolation -w dist . >&2
  cp "dist/sparkdeep-$version-py3-none-any.whl" "$zip"
  rm -rf build sparkdeep.egg-info  # the build's metadata in the checkout would shadow the installed one
fi
echo "$ROOT/$zip"

"""The README stays short and its links resolve; the docs site builds with warnings as
errors; every public class and function of the library's stage and job packages has a
docstring and its module a page in the API reference."""
import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_LIMIT = 15_000
ISSUE = re.compile(r"\bissues? \d+", re.IGNORECASE)
# [text](target) and ![alt](target), with an optional "title" after the target.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
# The packages whose modules the API reference documents (docs/api/*.md).
DOCUMENTED = ("sparkdeep.transformers", "sparkdeep.transformers.keras", "sparkdeep.jobs")


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_docs_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a page left out of the nav, an
    API block whose module griffe cannot find or a docstring it cannot parse fails it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr}\n{done.stdout}"
    warnings = [line for line in (done.stderr + done.stdout).splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "api" / "keras" / "index.html").is_file()
    # The docstrings' reST roles (:func:`x`) show as code, not as typed.
    raw = [str(p.relative_to(tmp_path)) for p in (tmp_path / "api").rglob("*.html")
           if re.search(r":(func|class|meth|mod|data|attr):(`|<code>)", p.read_text(encoding="utf-8"))]
    assert not raw, raw


def test_readme_is_short():
    size = README.stat().st_size
    assert size < README_LIMIT, f"README.md is {size} bytes (limit {README_LIMIT}): move reference material to docs/"


def test_no_issue_numbers_in_readme_or_docs():
    """Which ticket asked for something belongs in git; the pages say what is."""
    for path in [README, *doc_pages()]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not ISSUE.search(line), f"{path.relative_to(REPO)}:{n}: {line.strip()}"


def test_readme_links_resolve():
    targets = LINK.findall(README.read_text(encoding="utf-8"))
    assert targets, "no links found in README.md"
    missing = []
    for target in targets:
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = target.split("#", 1)[0]
        if path and not (README.parent / path).exists():
            missing.append(target)
    assert not missing, f"README.md links to missing files: {missing}"


def test_link_pattern_reads_markdown_links():
    text = 'see [a](docs/a.md), ![img](docs/b.png "t"), [web](https://x.org) and [top](#up)'
    assert LINK.findall(text) == ["docs/a.md", "docs/b.png", "https://x.org", "#up"]


def documented_modules() -> list[str]:
    """Every module of the documented packages (the packages themselves included)."""
    names = []
    for package in DOCUMENTED:
        names.append(package)
        pkg = importlib.import_module(package)
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.ispkg]
    return names


def api_blocks() -> set[str]:
    """The modules named by ``::: module`` blocks of docs/api/*.md."""
    found = set()
    for path in sorted((DOCS / "api").glob("*.md")):
        found.update(re.findall(r"^:::\s*([\w.]+)\s*$", path.read_text(encoding="utf-8"), re.MULTILINE))
    return found


def test_every_module_is_in_the_api_reference():
    missing = [m for m in documented_modules() if m not in api_blocks()]
    assert not missing, f"add a '::: <module>' block to docs/api/*.md for: {missing}"


def own_docstring(obj) -> str:
    """``obj``'s docstring as written: a class's ``__doc__`` is its own (never inherited), but
    ``dataclasses`` makes one from the signature when there is none."""
    doc = (obj.__doc__ or "").strip()
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        if doc == obj.__name__ + str(inspect.signature(obj)).replace(" -> None", ""):
            return ""
    return doc


def test_own_docstring_sees_through_dataclasses():
    @dataclasses.dataclass
    class Bare:
        x: int

    @dataclasses.dataclass
    class Written:
        """Said."""
        x: int

    assert own_docstring(Bare) == "" and own_docstring(Written) == "Said."


def test_every_public_class_and_function_has_a_docstring():
    undocumented = []
    for name in documented_modules():
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue  # imported, documented where it is defined
            if not own_docstring(obj):
                undocumented.append(f"{name}.{attr}")
    assert not undocumented, f"public classes and functions without a docstring: {undocumented}"

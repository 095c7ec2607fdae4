"""Dependencies point one way: sparkdeep core imports nothing from pipelines/ or
transformers/, and nothing below the dataset spec names a data set."""
import ast
import glob
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_core_imports_nothing_from_pipelines_or_transformers():
    for path in glob.glob(os.path.join(REPO, "sparkdeep", "*.py")):
        bad = {m for m in imports(path) if m.startswith(("sparkdeep.pipelines", "sparkdeep.transformers"))}
        assert not bad, f"{os.path.relpath(path, REPO)} imports {sorted(bad)}"


def test_no_step_names_a_data_set():
    """Only the examples' loaders and the shipped specs know the flights or the diamonds."""
    allowed = {os.path.join("pipelines", "flights.py"), os.path.join("pipelines", "examples.py")}
    for folder in ("jobs", "pipelines", "transformers", "sparkdeep"):
        for path in glob.glob(os.path.join(REPO, folder, "*.py")):
            rel = os.path.relpath(path, REPO)
            if rel in allowed:
                continue
            text = open(path).read().lower()
            for word in ("flight", "arr_delay", "diamond", "p_delayed"):
                assert word not in text, f"{rel} mentions {word!r}"

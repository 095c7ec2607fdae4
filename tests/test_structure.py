"""Dependencies point one way: sparkdeep core imports nothing from pipelines/ or
transformers/, and nothing below the dataset spec names a data set."""
import ast
import glob
import os
import re

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


def sources(folder: str) -> list[str]:
    """Every ``.py`` file under ``folder``, subpackages included."""
    return sorted(glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True))


def test_core_imports_nothing_from_pipelines_or_transformers():
    for path in sources("sparkdeep"):
        bad = {m for m in imports(path) if m.startswith(("sparkdeep.pipelines", "sparkdeep.transformers"))}
        assert not bad, f"{os.path.relpath(path, REPO)} imports {sorted(bad)}"


def named_modules(path: str, prefixes: tuple[str, ...]) -> list[int]:
    """Lines of ``path`` whose string constants (docstrings aside) name a module under
    ``prefixes``: an import by name, which the import graph does not show."""
    tree = ast.parse(open(path).read())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs and any(p in n.value for p in prefixes)]


def test_core_names_no_module_above_it_as_a_string():
    """The allow-list of saved classes is the packages' to register (an entry point), not
    core's to spell out: a class name in a string is a dependency too."""
    above = ("sparkdeep.pipelines", "sparkdeep.transformers", "sparkdeep.jobs")
    for path in sources("sparkdeep"):
        lines = named_modules(path, above)
        assert not lines, f"{os.path.relpath(path, REPO)}:{lines} names a module of {above} in a string"


def test_only_the_serve_job_imports_the_http_server():
    """The scorer and the row rules live in pipelines/scoring.py: the MLflow model, compress
    and the benchmarks reach them without the HTTP module (and its Starlette imports)."""
    for folder in ("jobs", "pipelines", "transformers", "sparkdeep"):
        for path in sources(folder):
            rel = os.path.relpath(path, REPO)
            if rel != os.path.join("jobs", "serve.py"):
                assert "sparkdeep.pipelines.serve" not in imports(path), f"{rel} imports the HTTP server module"


def test_no_step_names_a_data_set():
    """Only the examples' loaders and the shipped specs know the flights or the diamonds."""
    allowed = {os.path.join("pipelines", "flights.py"), os.path.join("pipelines", "examples.py")}
    for folder in ("jobs", "pipelines", "transformers", "sparkdeep"):
        for path in sources(folder):
            rel = os.path.relpath(path, REPO)
            if rel in allowed:
                continue
            text = open(path).read().lower()
            for word in ("flight", "arr_delay", "diamond", "p_delayed"):
                assert word not in text, f"{rel} mentions {word!r}"


def test_shipped_code_names_no_issue_numbers():
    """Why a line is there belongs in the line's comment; which ticket asked for it, in git."""
    pattern = re.compile(r"\bissue[ -]?\d+", re.IGNORECASE)
    for folder in ("jobs", "pipelines", "transformers", "sparkdeep"):
        for path in sources(folder):
            for n, line in enumerate(open(path), 1):
                assert not pattern.search(line), f"{os.path.relpath(path, REPO)}:{n} names an issue: {line.strip()}"


LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def eager_log_calls(path: str) -> list[int]:
    """Lines of ``log.<level>(...)`` calls whose message is built before the call (an
    f-string, ``+`` or ``%``): the logger formats ``"%s"`` arguments only when the record is
    emitted, and keeps the message's template for handlers that group by it."""
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in LOG_METHODS and isinstance(node.func.value, ast.Name)
                and node.func.value.id in {"log", "logger", "_log"} and node.args):
            msg = node.args[1] if node.func.attr == "log" and len(node.args) > 1 else node.args[0]
            if isinstance(msg, ast.JoinedStr) or (isinstance(msg, ast.BinOp)
                                                  and isinstance(msg.op, (ast.Add, ast.Mod))):
                found.append(node.lineno)
    return found


def test_log_calls_format_lazily():
    eager = [f"{os.path.relpath(path, REPO)}:{n}" for folder in ("jobs", "pipelines", "transformers", "sparkdeep")
             for path in sources(folder) for n in eager_log_calls(path)]
    assert not eager, f"log calls that format their message themselves (pass %s arguments): {eager}"


def test_the_lazy_log_check_sees_each_eager_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('log.info(f"a {x}")\nlog.info("a " + x)\nlog.info("a %s" % x)\nlog.info("a %s", x)\n'
                    'log.log(20, f"a {x}")\nprint(f"a {x}")\n')
    assert eager_log_calls(str(path)) == [1, 2, 3, 5]


#: Where a strategy is declared and implemented: the only modules that may name one to decide.
STRATEGY_HOMES = {"sparkdeep/registry.py", "transformers/keras/strategies.py", "transformers/keras/horovod_ring.py",
                  "transformers/keras/tf_collective.py", "transformers/keras/local_sgd.py",
                  "transformers/keras/parameter_server.py"}


def strategy_comparisons(path: str) -> list[int]:
    """Lines that compare something with a strategy's name (``strategy == "local_sgd"``,
    ``s in ("horovod", ...)``): a rule about strategies decided outside their declarations."""
    from sparkdeep.registry import STRATEGY_RULES

    def names_one(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in STRATEGY_RULES
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(names_one(e) for e in node.elts)

    def other(node) -> bool:
        """``"horovod" in sys.modules`` asks about an import, ``backend == "horovod"`` about a
        launch backend (which shares the name): neither is a strategy."""
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return name == "modules" or "backend" in name
    return [node.lineno for node in ast.walk(ast.parse(open(path).read(), path))
            if isinstance(node, ast.Compare) and not any(other(n) for n in (node.left, *node.comparators))
            and any(names_one(n) for n in (node.left, *node.comparators))]


def test_what_a_strategy_takes_is_decided_by_its_declaration_only():
    found = [f"{rel}:{n}" for folder in ("jobs", "pipelines", "transformers", "sparkdeep")
             for path in sources(folder) if (rel := os.path.relpath(path, REPO)) not in STRATEGY_HOMES
             for n in strategy_comparisons(path)]
    assert not found, f"strategy names compared outside sparkdeep/registry.py's STRATEGY_RULES: {found}"


def test_the_strategy_check_sees_a_comparison(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('if s == "local_sgd": pass\nif s in ("horovod", "x"): pass\nok = "horovod" in sys.modules\n'
                    'name = "collective"\nif backend != "horovod": pass\n')
    assert strategy_comparisons(str(path)) == [1, 2]


#: Where each source folder is installed (pyproject's package mapping).
PACKAGES = {"sparkdeep": "sparkdeep", "jobs": "sparkdeep.jobs", "pipelines": "sparkdeep.pipelines",
            "transformers": "sparkdeep.transformers"}


def module_graph() -> dict[str, set[str]]:
    """{module: the project's modules it imports}, counting imports inside functions too (a
    lazy import hides a loop from the interpreter, not from a reader)."""
    mods = {}
    for folder, top in PACKAGES.items():
        for path in sources(folder):
            parts = os.path.relpath(path, os.path.join(REPO, folder))[:-3].split(os.sep)
            pkg = ".".join([top] + parts[:-1])
            mods[pkg if parts[-1] == "__init__" else f"{pkg}.{parts[-1]}"] = (path, pkg)
    graph = {}
    for mod, (path, pkg) in mods.items():
        found = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod and t not in PACKAGES.values():
                    found.add(t)
        graph[mod] = found
    return graph


def test_no_module_imports_itself_through_others():
    graph = module_graph()
    assert "sparkdeep.config" in graph and "sparkdeep.dataset" in graph["sparkdeep.config"]

    def reaches(start, goal, seen):
        for nxt in graph[start]:
            if nxt == goal:
                return [nxt]
            if nxt not in seen:
                seen.add(nxt)
                path = reaches(nxt, goal, seen)
                if path:
                    return [nxt] + path
        return None

    for mod in sorted(graph):
        loop = reaches(mod, mod, set())
        assert loop is None, "import loop: " + " -> ".join([mod] + loop)


#: The run's methods that take a table or model name.
NAMED = {"read", "write", "save_model", "model_input", "written_version", "written_model", "from_this_run",
         "reproduce"}


def test_table_and_model_names_come_from_the_registry():
    from sparkdeep.registry import Models, Tables
    names = set(Tables.ALL) | set(Models.ALL)
    # Names that are only ever tables or models: refused anywhere as a literal.
    unique = names - {"train", "prepare", "pipeline"}  # also step and command names
    checked = 0
    for folder in ("jobs", "pipelines", "sparkdeep"):
        for path in sources(folder):
            rel = os.path.relpath(path, REPO)
            if rel == os.path.join("sparkdeep", "registry.py"):
                continue
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Constant) and node.value in unique:
                    raise AssertionError(f"{rel}:{node.lineno} names {node.value!r}: use sparkdeep.registry")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in NAMED:
                    checked += 1
                    args = list(node.args) + [k.value for k in node.keywords]
                    lits = [a.value for a in args if isinstance(a, ast.Constant) and a.value in names]
                    assert not lits, f"{rel}:{node.lineno} passes {lits[0]!r} to {node.func.attr}: use sparkdeep.registry"
                if isinstance(node, ast.keyword) and node.arg == "evaluated" and isinstance(node.value, ast.Constant):
                    raise AssertionError(f"{rel}:{node.value.lineno} names a table as a literal: use sparkdeep.registry")
    assert checked > 10  # the check saw the steps' reads and writes


def test_a_job_module_logs_under_sparkdeep_also_when_run_as_main():
    """``python -m sparkdeep.jobs.X`` makes the module ``__main__``: a logger named after
    ``__name__`` there is outside the ``sparkdeep`` logger and its lines are lost."""
    offenders = [os.path.relpath(p, REPO) for p in sources("jobs") if not os.path.basename(p).startswith("_")
                 and "getLogger(__name__)" in open(p, encoding="utf-8").read()]
    assert offenders == []

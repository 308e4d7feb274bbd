"""The layout's promises: no import cycle among modules, nothing importing upward between packages, logic
packages free of heavy imports, a light `--help`, small modules, energy, search and deploy in wings behind their
faces, a versioned summary.json, and no storage password in what a run writes."""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.search.storage import redact_text, redact_url, url_without_password

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "modelopt", "lm_eval", "pynvml", "transformers")


def _imported_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys; print('HEAVY=' + json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    line = next(x for x in reversed(out.stdout.splitlines()) if x.startswith("HEAVY="))
    return json.loads(line.removeprefix("HEAVY="))


@pytest.mark.parametrize("package", ["search", "report", "recipe"])
def test_logic_packages_import_no_heavy_library(package):
    modules = sorted(_module_name(p) for p in (ROOT / "advisor" / package).rglob("*.py"))
    code = "; ".join(f"import {m}" for m in modules)
    assert _imported_after(code) == []


def test_help_imports_no_torch():
    code = ("import sys; sys.argv = ['advisor', '--help']\nfrom advisor.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    assert _imported_after(code) == []


def test_search_help_imports_no_torch():
    code = ("import sys; sys.argv = ['advisor', 'search', '--help']\nfrom advisor.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    assert "torch" not in _imported_after(code)


#: the packages (and top-level modules) of advisor, bottom to top: each imports only from its own layer or
#: below. Data (records and rules), the model's description, the logic (search, report: torch-free), the edge
#: (heavy libraries, the GPU), the orchestration of one command per workflow, the CLI and the test fakes.
LAYERS = (
    ("errors", "versions", "files", "gpu_memory_error", "interrupts"),
    ("formats",),
    ("plan", "recipe", "serving", "engines"),
    ("estimate",),
    ("models",),
    ("search", "report"),
    ("calibration", "quantize", "accuracy", "energy", "deploy"),
    ("workflows",),
    ("cli", "testing", "testing_vllm", "testing_engines"),
    ("console",),  # the `advisor` script: the command line, loaded once SIGTERM is handled
)
#: the one module whose imports inside functions may reach above its layer: the engine table, whose builders import
#: their engine's module when that engine is chosen (never when the table is read; advisor/engines.py says why).
#: test_only_the_engine_builders_defer_imports pins what those functions may be.
DEFERRING = "advisor.engines"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _import_graph() -> dict[str, set[str]]:
    """advisor's modules -> the advisor modules each imports, module-level and inside functions alike (but the engine
    table's builders, :data:`DEFERRING`; ``from package import module`` counts as the module)."""
    modules = {_module_name(p): p for p in (ROOT / "advisor").rglob("*.py")}

    def known(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        tree = ast.parse(path.read_text())
        deferred = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)} \
            if name == DEFERRING else set()
        for node in ast.walk(tree):
            if id(node) in deferred:
                continue
            if isinstance(node, ast.Import):
                deps |= {known(a.name) for a in node.names if a.name.split(".")[0] == "advisor"}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                source = ".".join(p for p in (base, node.module or "") if p)
                if source.split(".")[0] == "advisor":
                    deps |= {known(f"{source}.{a.name}") if f"{source}.{a.name}" in modules else known(source)
                             for a in node.names}
        graph[name] = deps - {name}
    return graph


def test_no_import_cycle_among_modules():
    try:
        tuple(graphlib.TopologicalSorter(_import_graph()).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_nothing_imports_upward_between_packages():
    layer = {package: i for i, packages in enumerate(LAYERS) for package in packages}
    graph = _import_graph()
    unplaced = {_package(m) for m in graph} - set(layer) - {""}
    assert unplaced == set(), f"give these packages a layer in LAYERS: {sorted(unplaced)}"
    upward = [f"{m} -> {d}" for m, deps in graph.items() for d in deps
              if _package(m) and _package(d) and layer[_package(d)] > layer[_package(m)]]
    assert upward == []


#: packages split into wings (subpackages whose ``__init__`` is their face, the rest private ``_`` modules): the most
#: top-level modules (``__init__`` included) and, where bounded, the most modules of one wing (its face included);
#: whether tests and benchmarks too reach the wings only through their faces (energy's tests still open its private
#: modules to patch and probe them).
WINGED = {"energy": (8, None, False), "search": (10, 10, True), "deploy": (10, 10, True)}


def _private_wing(module: str, package: str) -> str | None:
    """The wing whose private module ``module`` (``advisor.<package>.<wing>._name...``) is, else None."""
    parts = module.split(".")
    if len(parts) >= 4 and parts[:2] == ["advisor", package] and parts[3].startswith("_"):
        return ".".join(parts[:3])
    return None


def _inside(module: str, wing: str) -> bool:
    return module == wing or module.startswith(f"{wing}.")


def _script_imports(package: str) -> list[tuple[str, str]]:
    """(file:line, module) for every import of advisor.<package> in tests/ and benchmarks/ (``from X import name``
    counts as ``X.name``, so that importing a private module from its wing's face counts too)."""
    found = []
    for path in (p for d in ("tests", "benchmarks") for p in (ROOT / d).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found += [(f"{path.relative_to(ROOT)}:{node.lineno}", n) for n in names
                      if n.split(".")[:2] == ["advisor", package]]
    return found


@pytest.mark.parametrize("package", sorted(WINGED))
def test_winged_packages_have_few_top_level_modules_and_their_wings_keep_their_private_modules(package):
    most_top, most_in_wing, scripts_too = WINGED[package]
    top = sorted(p.name for p in (ROOT / "advisor" / package).glob("*.py"))
    assert len(top) <= most_top, top
    wings = [d for d in (ROOT / "advisor" / package).iterdir() if (d / "__init__.py").exists()]
    if most_in_wing is not None:
        crowded = {d.name: n for d in wings if (n := len(list(d.glob("*.py")))) > most_in_wing}
        assert crowded == {}
    reaching_in = [f"{m} -> {d}" for m, deps in _import_graph().items() for d in deps
                   if (wing := _private_wing(d, package)) and not _inside(m, wing)]
    if scripts_too:
        reaching_in += [f"{where} -> {m}" for where, m in _script_imports(package) if _private_wing(m, package)]
    assert reaching_in == []


def test_only_the_meter_imports_pynvml():
    importers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "advisor").rglob("*.py")
                       if any(isinstance(n, ast.Import | ast.ImportFrom) and "pynvml" in
                              {*(a.name.split(".")[0] for a in n.names), (getattr(n, "module", None) or "")}
                              for n in ast.walk(ast.parse(p.read_text()))))
    assert importers == ["advisor/energy/meter/_nvml.py"]


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "advisor").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_redaction_of_storage_urls():
    url = "postgresql+psycopg2://advisor:s3cr%40t@db.example:5432/studies"
    assert redact_url(url) == "postgresql+psycopg2://advisor:***@db.example:5432/studies"
    assert url_without_password(url) == "postgresql+psycopg2://advisor@db.example:5432/studies"
    assert "s3cr" not in redact_text(f"cannot open {url}: refused", url)
    assert redact_url("sqlite:///runs/q/study.db") == "sqlite:///runs/q/study.db"


def test_run_file_never_holds_the_password(tmp_path):
    from advisor.recipe import validate_recipe
    from advisor.workflows.search import write_run_file

    recipe = validate_recipe({"name": "r", "out": str(tmp_path),
                              "storage": "postgresql://advisor:hunter2@127.0.0.1:5432/advisor"})
    recipe.run_dir.mkdir(parents=True)
    write_run_file(recipe)
    text = (recipe.run_dir / "recipe.json").read_text()
    assert "hunter2" not in text and "postgresql://advisor@127.0.0.1:5432/advisor" in text


def _old_summary(tmp_path: Path) -> Path:
    """A summary.json as written before schema_version existed (format version 1)."""
    run = tmp_path / "old"
    run.mkdir()
    rec = {"plan_id": "abc", "label": "all-fp8", "formats": {"layers.0.qkv": "fp8"}, "kl": 0.01}
    (run / "summary.json").write_text(json.dumps({
        "tool": "precision-advisor", "version": "0.1.0", "recommendation": rec, "trials": [rec],
        "accuracy_budget": {"max_kl": 0.05}, "recipe": {}, "workloads": []}))
    return run


@pytest.mark.parametrize("command", ["show", "recheck"])
def test_previous_summary_version_is_refused_clearly(tmp_path, command):
    run = _old_summary(tmp_path)
    args = {"show": ["show", str(run)],
            "recheck": ["recheck", "--recommendation", str(run / "summary.json"), "--model", str(tmp_path)]}[command]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Error:" in res.output and "schema version 1" in res.output and "advisor report" in res.output
    assert "Traceback" not in res.output


def _advisor_imports() -> list[tuple[str, int, str, str | None]]:
    """(file, line, module, name) for every `import advisor...` / `from advisor... import name`, function-level too."""
    found = []
    files = [p for d in ("advisor", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")
             if "studies" not in p.parts]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "advisor":
                found += [(str(path.relative_to(ROOT)), node.lineno, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), node.lineno, a.name, None) for a in node.names
                          if a.name.split(".")[0] == "advisor"]
    return found


def test_every_advisor_import_resolves():
    """A module moved or a name renamed leaves no stale import behind, not even inside a function
    that only a GPU run or a benchmark reaches."""
    import importlib

    stale = []
    for path, line, module, name in _advisor_imports():
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            stale.append(f"{path}:{line} {module}: {exc}")
            continue
        if name and name != "*" and not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                stale.append(f"{path}:{line} {module}.{name}")
    assert stale == []


def test_only_the_engine_builders_defer_imports():
    """The functions of advisor/engines.py that import an advisor module are exactly the builders its entries name,
    each importing one builder of one engine module (deploy/, energy/) and returning what it builds."""
    from advisor.engines import ENGINE_TABLE

    tree = ast.parse((ROOT / "advisor" / "engines.py").read_text())
    builders = {f.__name__ for e in ENGINE_TABLE.values() for f in (e.tier, e.checkpoint_tier) if f is not None}
    importing = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                 and any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(f))}
    assert set(importing) == builders
    for f in importing.values():
        assert [type(n) for n in f.body if not isinstance(n, ast.Expr)] == [ast.ImportFrom, ast.Return], f.name
        module = next(n for n in f.body if isinstance(n, ast.ImportFrom)).module or ""
        assert module.split(".")[:2] in (["advisor", "deploy"], ["advisor", "energy"]), f.name


def _advisor_nodes(skip: str = ""):
    """(path relative to the root, node) for every AST node of advisor/ (``skip``: a module left out)."""
    for path in sorted((ROOT / "advisor").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel != skip:
            yield from ((rel, node) for node in ast.walk(ast.parse(path.read_text())))


def test_the_engines_are_named_in_one_place():
    """No module but advisor/engines.py lists engines (a tuple, list, set, dict or Literal of two or more of their
    names or titles) or asks for one by name (a comparison with one): the others read the table, its names and what
    each engine can do, so that adding an engine is its entry and its module."""
    from advisor.engines import ENGINE_TABLE

    words = {w for e in ENGINE_TABLE.values() for w in (e.name, e.title)}
    found = []
    for rel, node in _advisor_nodes(skip="advisor/engines.py"):
        if isinstance(node, ast.Compare):
            parts, most = [node.left, *node.comparators], 0
        elif isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            parts, most = (node.keys if isinstance(node, ast.Dict) else node.elts), 1
        else:
            continue
        named = [p.value for p in parts if isinstance(p, ast.Constant) and p.value in words]
        if len(named) > most:
            found.append(f"{rel}:{node.lineno} {named}")
    assert found == []


def test_no_member_of_an_energy_tier_is_discovered_at_run_time():
    """Every member of a measured tier (the contract, advisor.search.measured._contract) and of a predicted one
    (advisor.estimate.PredictedModel) is declared: nothing asks getattr/hasattr whether a tier has one."""
    from advisor.estimate import PredictedModel
    from advisor.search.measured import MeasuredTier

    members = {m for cls in (MeasuredTier, PredictedModel) for m in (*dir(cls), *cls.__annotations__)
               if not m.startswith("_")}
    assert {"gpu_uuid", "open_for", "forget", "measure_rounds", "measure_points", "decode_step", "prefill"} <= members
    found = [f"{rel}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})" for rel, node in _advisor_nodes()
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
             and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
             and isinstance(node.args[1], ast.Constant) and node.args[1].value in members]
    assert found == []

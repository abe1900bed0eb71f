"""No import circle anywhere in zoo/, counting what import-linter does not see: imports inside functions,
under ``if TYPE_CHECKING:``, and ``importlib.import_module`` with a literal name. A circle is broken by
giving the lower module what it reads, never by hiding the import."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT


def module_names(root: Path) -> dict[str, Path]:
    """``{"zoo.lab.finished.runs": path}`` for every module and package of ``root`` (a package by its __init__)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``module`` imports anywhere in its source (parent packages left out:
    importing ``zoo.lab.x`` runs ``zoo.lab``'s __init__ either way)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                targets = [node.args[0].value]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(f"{target}."):
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_zoo_imports_itself_back_by_any_route():
    known = module_names(ROOT / "zoo")
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert circles(graph) == []


def test_the_check_sees_imports_inside_functions_type_checking_and_importlib(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import importlib\nimportlib.import_module('pkg.a')\n")
    known = module_names(package)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_import_zoo_reads_no_torch_and_a_registry_brings_the_built_in_parts():
    """``import zoo`` names every public name without importing them (PEP 562): no torch until one is used."""
    import subprocess
    import sys

    code = (
        "import sys, zoo; assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'rmsnorm' in zoo.NORMS.names() and 'torch' in sys.modules; "
        "assert zoo.ConfigError.__module__ == 'zoo.core.errors'; print(sorted(zoo.available()))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(["attn", "mlp", "norm", "placement", "pos", "residual"]))


def test_the_sweep_callbacks_every_run_process_builds_import_no_plotting_or_fitting():
    """Hydra builds every callback of conf/config.yaml in every process it starts (each single run, each launcher
    worker): their modules import neither matplotlib nor scipy, about a second of each run's start-up, which only
    the report at a sweep's end needs."""
    import subprocess
    import sys

    from omegaconf import OmegaConf

    targets = [c["_target_"] for c in OmegaConf.load(ROOT / "conf" / "config.yaml").hydra.callbacks.values()]
    assert "zoo.lab.reports.callback.ReportCallback" in targets
    modules = sorted({target.rpartition(".")[0] for target in targets})
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; "
        "print(sorted(m for m in ('matplotlib', 'scipy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"a callback's module imports {done.stdout.strip()}"


def answers_without_torch(module: str, function: str, argv: list[str]) -> tuple[bool, str]:
    """Run ``module.function()`` with ``argv`` in a fresh interpreter: (torch stayed out, what it printed)."""
    import subprocess
    import sys

    code = (
        f"import sys, contextlib, io, importlib; sys.argv = {argv!r}\n"
        f"out = io.StringIO()\n"
        f"with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        f"    try:\n        getattr(importlib.import_module({module!r}), {function!r})()\n"
        f"    except SystemExit as exit:\n        print(exit.code if isinstance(exit.code, str) else '')\n"
        f"print('torch' not in sys.modules); print(out.getvalue())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, (module, done.stderr)
    first, _, printed = done.stdout.partition("\n")
    return first == "True", printed


def test_every_command_answers_help_and_refuses_a_misspelt_key_before_torch():
    """--help of every console script, and zoo-train's refusal of an unknown key or option, import no torch."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        module, function = target.split(":")
        clean, printed = answers_without_torch(module, function, [name, "--help"])
        assert clean and "usage" in printed.lower(), (name, printed[:300])
    train = scripts["zoo-train"].split(":")
    for argv, says in [
        (["zoo-train", "nrom=rmsnorm"], "unknown key 'nrom'; did you mean 'norm'?"),
        (["zoo-train", "norm=rmsnrom"], "unknown norm; did you mean 'rmsnorm'?"),
    ]:
        clean, printed = answers_without_torch(*train, argv)
        assert clean and says in printed, (argv, printed[:300])


def test_the_lab_is_rooms_of_small_modules_each_saying_what_it_owns():
    """zoo/lab: at most 8 modules at its top and 12 in a room; in all of zoo/, no module over 500 lines,
    no function over 60, and each module opens with a docstring saying what it owns."""
    lab = ROOT / "zoo" / "lab"
    top = [p.name for p in lab.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 8, top
    for room in (p for p in lab.iterdir() if (p / "__init__.py").exists()):
        modules = [p.name for p in room.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= 12, (room.name, modules)
    for path in (ROOT / "zoo").rglob("*.py"):
        source = path.read_text()
        tree = ast.parse(source)
        where = path.relative_to(ROOT)
        assert len(source.splitlines()) <= 500, f"{where}: {len(source.splitlines())} lines"
        assert ast.get_docstring(tree), f"{where}: no docstring saying what it owns"
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 60, f"{where}:{node.lineno} {node.name}: {length} lines"

"""The floors of CONTRIBUTING.md, checked on the code: imports only point down, no import cycle,
and the bottom floors stay free of the heavy libraries of the floors above them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# (module prefix, floor), most specific first. Keep in step with CONTRIBUTING.md.
FLOORS = [
    ("synthlab_generators", 0),
    ("synthlab.errors", 1),
    ("synthlab.serialize", 1),
    ("synthlab.files", 1),
    ("synthlab.progress", 1),
    ("synthlab.models", 2),
    ("synthlab.data", 3),
    ("synthlab.scaling", 4),
    ("synthlab.training", 5),
    ("synthlab.evaluation", 5),
    ("synthlab.ouroboros", 5),
    ("synthlab.claims", 6),
    ("synthlab.sweeps", 6),
    ("synthlab.plots", 7),
    ("synthlab.report", 7),
    ("synthlab.cli", 8),
    ("synthlab.__main__", 8),
    ("synthlab", 1),  # the package itself: the version and the error type (+ lazy re-exports, see _imports)
]
FORBIDDEN = {0: {"torch", "pandas", "synthlab", "transformers"}, 1: {"torch", "pandas"}, 4: {"torch", "transformers"}}


def _modules() -> dict[str, Path]:
    found = {}
    for folder in (ROOT / "synthlab", ROOT / "generators" / "synthlab_generators"):  # each named as it imports
        for path in folder.rglob("*.py"):
            parts = [folder.name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _floor(module: str) -> int:
    return next(floor for prefix, floor in FLOORS if module == prefix or module.startswith(prefix + "."))


def _imports(module: str, path: Path) -> set[str]:
    """Every module this one imports, anywhere in the file (functions included), resolved to the
    longest known module name; third-party imports as their top-level name.

    The package facade `synthlab` counts its module-level imports only: its module `__getattr__`
    re-exports the API of higher floors (`synthlab.load_model`) on first use, which `import
    synthlab` does not pay for (the facade is no module the floors build on)."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    top = [s for s in tree.body if not isinstance(s, ast.FunctionDef)] if module == "synthlab" else [tree]
    for node in (n for statement in top for n in ast.walk(statement)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            parts = name.split(".")
            while parts and ".".join(parts) not in MODULES and len(parts) > 1:
                parts.pop()
            out.add(".".join(parts))
    out.discard(module)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_floors(module):
    floor = _floor(module)
    for target in GRAPH[module]:
        if target in MODULES:
            assert _floor(target) <= floor, f"{module} (floor {floor}) imports {target} (floor {_floor(target)})"
        else:
            assert target.split(".")[0] not in FORBIDDEN.get(floor, set()), f"{module} imports {target}"


def test_no_import_cycle():
    internal = {m: {t for t in targets if t in MODULES} for m, targets in GRAPH.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(internal[module]):
            if target.startswith(module + "."):  # a package importing its own submodules is no cycle
                continue
            if state.get(target) == 1 and not module.startswith(target + "."):
                raise AssertionError("import cycle: " + " -> ".join(path + [target]))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(internal):
        if module not in state:
            visit(module, [module])


def test_no_module_is_long():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 450}
    assert not long, f"split these modules: {long}"


# Processes that start without some heavy libraries: the reasons the library's function-local
# imports give. A case runs its steps in order in one fresh process, each checked after it runs.
_WORKER = "import synthlab.sweeps.executor, synthlab.sweeps.lab_runner\nfrom synthlab.sweeps import experiments\n"
LIGHT_PROCESSES = {
    "the command line": [
        ("import synthlab.cli", {"torch", "pandas", "scipy", "matplotlib", "transformers", "filelock"})
    ],
    "synthlab fit --plot": [("import synthlab.plots", {"torch", "scipy", "matplotlib", "seaborn", "transformers"})],
    "a sweep's worker, then its summary": [
        (
            _WORKER + "for name in experiments.available():\n    experiments.load(name)",
            {"pandas", "scipy", "matplotlib", "transformers"},
        ),
        ("import synthlab.report.markdown", {"matplotlib", "seaborn", "transformers"}),
    ],
}


@pytest.mark.parametrize("case", sorted(LIGHT_PROCESSES))
def test_processes_start_without_the_heavy_libraries_they_do_not_use(case):
    steps = LIGHT_PROCESSES[case]
    code = "".join(
        f"{step}\nprint(*sorted(set({sorted(heavy)}) & set(__import__('sys').modules)), sep=',')\n"
        for step, heavy in steps
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert {step: found for (step, _), found in zip(steps, loaded) if found} == {}


def test_one_training_engine():
    """Backward, clipping and the optimizer step of training live in synthlab.training.engine alone: both
    trainers (the lab's, OUROBOROS) go through its `step`."""
    calls = (".backward(", "clip_grad_norm_(", "optimizer.step(")
    elsewhere = {
        m: [c for c in calls if c in p.read_text()] for m, p in MODULES.items() if m != "synthlab.training.engine"
    }
    assert not {m: c for m, c in elsewhere.items() if c}
    for trainer in ("synthlab.training.trainer", "synthlab.ouroboros.train"):
        assert "synthlab.training.engine" in GRAPH[trainer], trainer


def test_no_lab_type_in_the_task_package():
    """The generators define their own error (TaskError) and nothing of the lab's."""
    for module, path in MODULES.items():
        if module.startswith("synthlab_generators"):
            classes = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}
            assert not classes & {"SynthlabError"}, module

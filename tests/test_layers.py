"""The layering contract (pyproject.toml, [tool.importlinter]; docs/architecture.md) holds, and
it would catch a violation: the same contract run on a copy of the code with one upward import
added must break. Also: every module of envforge sits in a layer, and the sandbox runner imports
only the standard library (it runs inside the sandbox, where nothing else is installed)."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("envforge", "sandbox", "trainers")
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True, no_logo=True))")


def lint(root: Path) -> subprocess.CompletedProcess:
    try:
        import importlinter  # noqa: F401
    except ImportError:
        pytest.fail("import-linter is not installed: pip install -c constraints.txt -e '.[dev]'")
    # import-linter puts its working folder first on sys.path: the code under `root` is linted
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, capture_output=True, text=True,
                          timeout=120)


def contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["importlinter"]["contracts"]


def test_the_layering_contract_holds():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout, r.stdout


def copy_code(tmp_path: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.mark.parametrize("module, line, broken", [
    # a lower layer importing a higher one, lazily inside a function (still a dependency)
    ("envforge.contract", "def _late():\n    from envforge.gate import static\n", "envforge layers"),
    # the gate importing a stage above it
    ("envforge.gate.schema", "from envforge.synth import families\n", "envforge layers"),
    # synth and identify are independent siblings
    ("envforge.identify", "import envforge.synth.classify\n", "envforge layers"),
    # torch below trainers
    ("sandbox.pool", "def _gpu():\n    import torch\n", "torch, transformers, peft, trl only in trainers"),
])
def test_a_violation_breaks_the_contract(tmp_path, module, line, broken):
    root = copy_code(tmp_path)
    path = root.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + line, encoding="utf-8")
    r = lint(root)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 broken" in r.stdout and f"{broken} BROKEN" in r.stdout, r.stdout


def test_every_envforge_module_is_in_a_layer():
    """A new top-level module of envforge must be placed in the contract, or it escapes it."""
    layers = next(c for c in contracts() if c["id"] == "layers")["layers"]
    placed = set()
    for layer in layers:
        for name in layer.replace("|", " ").replace(":", " ").split():
            placed.add(name.strip("()"))
    found = {f"envforge.{p.stem}" for p in (ROOT / "envforge").glob("*.py") if p.stem != "__init__"}
    found |= {f"envforge.{p.parent.name}" for p in (ROOT / "envforge").glob("*/__init__.py")}
    assert sorted(found - placed) == []
    assert {"sandbox", "trainers"} <= placed


def test_the_sandbox_runner_imports_only_the_standard_library():
    tree = ast.parse((ROOT / "sandbox" / "runner.py").read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    # pyseccomp: loaded only when the host asks for the seccomp filter (--seccomp)
    assert sorted(names - set(sys.stdlib_module_names) - {"pyseccomp"}) == []

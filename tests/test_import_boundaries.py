"""The module boundaries of the design: who may import whom.

learner never imports rollout or playwright; rollout never imports jax, flax,
optax or orbax (a CPU rollout node needs only the browser and HTTP); shared
imports neither side.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "learner": {"rollout", "playwright"},
    "rollout": {"jax", "jaxlib", "flax", "optax", "orbax", "learner"},
    "shared": {"jax", "jaxlib", "flax", "optax", "orbax", "playwright", "learner", "rollout"},
}


def imported_roots(path: Path, package: str) -> set[str]:
    """Top-level package of every import in a file, relative imports resolved to ``package``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                roots.add(package)
            elif node.module:
                roots.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            roots.add(str(node.args[0].value).split(".")[0])
    return roots


def sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_static_imports_respect_the_boundaries(package):
    files = sources(package)
    assert files, f"{package}/ has no modules"
    violations = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in files
        for name in sorted(imported_roots(path, package) & FORBIDDEN[package])
    ]
    assert not violations, "\n".join(violations)


def test_the_checker_sees_every_import_form(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import jax.numpy\nfrom flax import nnx\nimport importlib\n"
        "def f():\n    import optax\n"
        "importlib.import_module('playwright.async_api')\nfrom . import wire\n"
    )
    roots = imported_roots(probe, "shared")
    assert {"jax", "flax", "optax", "playwright", "shared"} <= roots


@pytest.mark.parametrize("package", ["rollout", "shared"])
def test_importing_a_package_loads_no_forbidden_module(package):
    """Transitive imports through third-party code count too: import every module and look."""
    modules = [
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in sources(package)
        if "__main__" not in p.name
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted({{n.split('.')[0] for n in sys.modules}} & set({sorted(FORBIDDEN[package])!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"importing {package} loaded {out.stdout.strip()}"

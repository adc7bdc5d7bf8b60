"""bench/ and tests/ depend one way only: the benchmarks stand on the test kit (tests/kit/:
servers, stacks, processes, seeding), and nothing under tests/ imports bench/ or starts one of
its commands. The benchmarks' own tests (their logic, and a smoke run of each command) live
beside them in bench/tests/, which the one test command runs too.
"""

from __future__ import annotations

import ast
import itertools
import tomllib

from tests.kit.processes import REPO_ROOT

IMPORTERS = ("import_module", "__import__")


def is_bench(module: str) -> bool:
    return module.split(".")[0] == "bench"


def imported_by_call(node: ast.Call) -> list[str]:
    """``importlib.import_module("x")``, ``import_module("x")``, ``__import__("x")``: ["x"]."""
    func = node.func
    called = (func.attr if isinstance(func, ast.Attribute)
              else func.id if isinstance(func, ast.Name) else "")
    first = node.args[0] if node.args else None
    if called in IMPORTERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return [first.value]
    return []


def run_with_dash_m(node: ast.List | ast.Tuple) -> list[str]:
    """A command line written as a list: the module after each ``"-m"``."""
    words = [element.value if isinstance(element, ast.Constant) else None for element in node.elts]
    return [after for before, after in itertools.pairwise(words)
            if before == "-m" and isinstance(after, str)]


def uses_of_bench(source: str, name: str) -> list[str]:
    """Each place a module imports bench or runs one of its modules, as ``name:line module``."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module or ""]
        elif isinstance(node, ast.Call):
            modules = imported_by_call(node)
        elif isinstance(node, ast.List | ast.Tuple):
            modules = run_with_dash_m(node)
        found += [f"{name}:{node.lineno} {module}" for module in modules if is_bench(module)]
    return found


def test_no_module_under_tests_imports_or_runs_bench():
    modules = sorted((REPO_ROOT / "tests").rglob("*.py"))
    assert len(modules) > 100  # the walk found the suite
    offenders = [use for path in modules
                 for use in uses_of_bench(path.read_text(), str(path.relative_to(REPO_ROOT)))]
    assert offenders == []


def test_the_check_finds_each_way_of_using_bench():
    """The check above can fail: each form it looks for, in a module written here."""
    sample = "\n".join([
        "import bench.harness",
        "from bench.chaos import partitions",
        "import importlib",
        "importlib.import_module('bench.hosts')",
        "run = ['python', '-m', 'bench.throughput', '--quick']",
        # Not uses: the allowed direction, the product's bench.* kinds, prose.
        "from tests.kit import servers",
        "kind = 'bench.noop'",
        "'''python -m bench.chaos judges the same'''",
    ])
    found = sorted(use.split(" ", 1)[1] for use in uses_of_bench(sample, "sample.py"))
    assert found == ["bench.chaos", "bench.harness", "bench.hosts", "bench.throughput"]


def test_the_one_test_command_runs_the_benchmarks_tests_too():
    """`pytest` with no argument (the README's command) collects bench/tests/ beside tests/."""
    settings = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert settings["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests", "bench/tests"]
    assert (REPO_ROOT / "bench" / "tests" / "__init__.py").is_file()

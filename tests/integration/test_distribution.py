"""One import name: the wheel built from this repository installs the package ``spacejobs`` and
nothing else at the top level, so an application whose own modules are called ``models``,
``tasks`` and ``celeryconfig`` (as a Flask-SQLAlchemy + Celery app's often are) imports them
and Space Jobs side by side.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.kit.processes import REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "-q", "-w", str(out), str(REPO_ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("spacejobs-*.whl")
    return found


def test_the_wheel_installs_the_one_top_level_name_spacejobs(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"spacejobs"}
    # The rooms, their SQL and templates, are inside it.
    for needed in ("spacejobs/__init__.py", "spacejobs/models/jobs/store.sql",
                   "spacejobs/models/db/schema/60_claim_and_lease.sql",
                   "spacejobs/tasks/celery_app.py", "spacejobs/webapp/templates/base.html",
                   "spacejobs/celeryconfig.py", "spacejobs/models/db/migrations/versions/FROZEN",
                   "spacejobs/testing/database.sql"):
        assert needed in names, needed
    with zipfile.ZipFile(wheel) as archive:
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt")))
    assert b"spacejobs = spacejobs.webapp.cli:main" in entry_points


def test_an_app_with_its_own_models_tasks_and_celeryconfig_imports_spacejobs_beside_them(
        wheel: Path, tmp_path: Path):
    """The trial the adoption issue reported: the app's models.py broke `import` of ours."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # a pure wheel installs by unpacking into a site directory
    # Space Jobs' dependencies from this virtualenv, but not its own code (the editable install's
    # import hook lives in a .pth file of that directory, which a plain path entry does not run).
    dependencies = sysconfig.get_paths()["purelib"]
    app = tmp_path / "app"
    app.mkdir()
    (app / "models.py").write_text("MINE = 'the app models'\n")
    (app / "tasks.py").write_text("MINE = 'the app tasks'\n")
    (app / "celeryconfig.py").write_text("MINE = 'the app celeryconfig'\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path[1:1] = [{str(site)!r}, {dependencies!r}]
        import celeryconfig, models, tasks
        import spacejobs
        from spacejobs.models.jobs import store
        from spacejobs.tasks import celery_app
        print(models.MINE, tasks.MINE, celeryconfig.MINE, spacejobs.__file__, store.__file__,
              celery_app.app.main, sep="|")
    """)
    done = subprocess.run([sys.executable, "-S", "-c", script], cwd=app, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    mine_models, mine_tasks, mine_config, face, store_file, celery_name = done.stdout.strip().split("|")
    assert (mine_models, mine_tasks, mine_config) == ("the app models", "the app tasks",
                                                      "the app celeryconfig")
    assert face.startswith(str(site)) and store_file.startswith(str(site))
    assert celery_name == "spacejobs"


def test_no_module_of_ours_imports_the_old_top_level_names():
    """Inside the repository the folders are still importable as top-level packages (the root is
    on sys.path): a module imported both ways would be two modules, with two registries."""
    import ast
    import os

    skipped = {".venv", "build", "site", ".git", "perf", "__pycache__", ".pytest_cache"}
    ours = []
    for folder, dirs, files in os.walk(REPO_ROOT):  # not into spacejobs/'s links
        dirs[:] = [d for d in dirs if d not in skipped and not (Path(folder) / d).is_symlink()]
        ours += [Path(folder) / f for f in files if f.endswith(".py")]
    # The example application is an app of its own: its `models` is its own module, which is the
    # point of the example.
    example_app = REPO_ROOT / "docs" / "examples" / "flask_app"
    offenders = []
    for path in ours:
        if path.is_relative_to(example_app):
            continue
        name = str(path.relative_to(REPO_ROOT))
        for node in ast.walk(ast.parse(path.read_text(), name)):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                       else [])
            offenders += [f"{name}:{node.lineno} {module}" for module in modules
                          if module.split(".")[0] in ("models", "tasks", "webapp", "celeryconfig")]
    assert offenders == []

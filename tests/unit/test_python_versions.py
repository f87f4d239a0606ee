"""Python 3.11, 3.12 and 3.13 stay supported (issue #30), checked in seconds inside the default suite.

CI runs the suite on 3.11 only. For each supported version with an interpreter on this machine (pyenv's, or
``python3.X`` on PATH), these tests check that:
- pyproject.toml (requires-python, classifiers) and the README's Quick start name the same versions;
- every .py file of the repository compiles on it, with compiler warnings (invalid escapes, ...) as errors,
  and imports no standard-library module that it no longer ships (on the running version too: not every
  file is imported by a test);
- (versions other than the running one) the dependency declarations are the ones that
  ``python -m benchmarks.python_versions`` verified on it with a fresh-venv install and the fast tier
  (benchmarks/python_versions.json); when they changed since, pip must still resolve them for that
  interpreter (a dry run, ~20-60 s, only then), and a warning asks for a rerun of that script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from benchmarks.python_versions import (
    REPO,
    SCRIPT_ENV,
    SUPPORTED,
    declared,
    find_python,
    load_record,
    resolve_command,
)

RUNNING = "{}.{}".format(*sys.version_info[:2])
OTHERS = [v for v in SUPPORTED if v != RUNNING]
CODE_DIRS = ("swarmnode", "benchmarks", "tests", "protocol")

# Run by the other interpreter: compile each file (warnings are errors), and list the standard-library
# modules it imports that this interpreter lacks although the one running the suite has them.
_CHECK = r"""
import ast, json, sys, warnings
job = json.load(sys.stdin)
problems = []
for path in job["files"]:
    source = open(path, encoding="utf-8").read()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            tree = compile(source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
            compile(tree, path, "exec", dont_inherit=True)
        except (SyntaxError, Warning) as exc:
            problems.append(f"{path}:{getattr(exc, 'lineno', '?')}: {type(exc).__name__}: {exc}")
            continue
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        for name in names:
            top = name.split(".")[0]
            if top in job["stdlib"] and top not in sys.stdlib_module_names:
                problems.append(f"{path}:{node.lineno}: imports {top}, which this Python no longer ships")
print(json.dumps(problems))
"""


def _interpreter(version: str) -> Path:
    python = Path(sys.executable) if version == RUNNING else find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} here (pyenv versions or python{version} on PATH)")
    return python


def test_pyproject_and_the_readme_name_the_same_supported_versions():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    major, last = SUPPORTED[-1].split(".")
    assert project["requires-python"] == f">={SUPPORTED[0]},<{major}.{int(last) + 1}"
    listed = sorted(
        c.rsplit(" ", 1)[1]
        for c in project["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    )
    assert listed == sorted(SUPPORTED)
    readme = (REPO / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for version in SUPPORTED:
        assert version in quick_start, f"the README's Quick start does not name Python {version}"
    assert RUNNING in SUPPORTED, f"the suite runs on Python {RUNNING}, which pyproject.toml does not support"


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_code_compiles_on_each_supported_python(version):
    python = _interpreter(version)
    files = sorted(str(p) for d in CODE_DIRS for p in (REPO / d).rglob("*.py"))
    job = {"files": files, "stdlib": sorted(sys.stdlib_module_names)}
    out = subprocess.run(
        [str(python), "-I", "-c", _CHECK], input=json.dumps(job), capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    problems = json.loads(out.stdout)
    assert problems == [], f"Python {version} ({python}):\n" + "\n".join(problems)


@pytest.mark.parametrize("version", OTHERS)
def test_the_dependencies_were_verified_on_each_supported_python_or_still_resolve(version, tmp_path):
    spec = declared()
    verified = load_record().get("versions", {}).get(version, {})
    changed = [key for key in spec if verified.get(key) != spec[key]]
    if not changed:
        return  # a fresh-venv install and the fast tier passed on this version with these declarations
    if os.environ.get(SCRIPT_ENV):
        pytest.skip("benchmarks.python_versions is installing and testing this version itself")
    python = _interpreter(version)
    out = subprocess.run(
        resolve_command(python, tmp_path / "report.json"), capture_output=True, text=True, timeout=600
    )
    errors = "\n".join(line for line in out.stderr.splitlines() if "is ignored: it is neither" not in line)
    assert out.returncode == 0, (
        f"the declared dependencies ({', '.join(changed)} changed since the last fresh-venv check) do not "
        f"resolve on Python {version} ({python}):\n{errors[-4000:]}"
    )
    warnings.warn(
        f"{', '.join(changed)} changed since the fresh-venv check on Python {version}; they still resolve, "
        "but run `python -m benchmarks.python_versions` to install and test them there",
        stacklevel=1,
    )

"""A fresh-venv install and the fast test tier on each supported Python (issue #30).

    python -m benchmarks.python_versions                        # 3.12 and 3.13 (CI itself runs 3.11)
    python -m benchmarks.python_versions --versions 3.11 3.12 3.13 --keep

For each version it finds the interpreter (pyenv's versions first, then ``pythonX.Y`` on PATH), makes a
fresh venv in a temporary folder, runs the README's ``pip install`` steps (read from the README's test
command, so they cannot drift from it), then the fast tier ``python -m pytest tests/unit``, and prints how
long each took. When a version passes, ``benchmarks/python_versions.json`` records what was verified on it:
the dependency declarations of pyproject.toml, the torch pin, the times and the versions pip installed.
``tests/unit/test_python_versions.py`` (in the default suite) compares pyproject.toml with that record and
re-resolves the dependencies on each supported interpreter when they changed since. Needs the package
registry and ~5.5 GB of disk per venv while it runs (on 3.12/3.13 the plain ``torch==2.13.0`` from PyPI is
the CUDA build, ~3 GB); 5-6 minutes per version on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_suffix(".json")
# The supported Pythons: pyproject's requires-python, its classifiers and the README's Quick start say the
# same (tests/unit/test_python_versions.py checks that they agree).
SUPPORTED = ("3.11", "3.12", "3.13")
FAST_TIER = ("tests/unit",)
# set for the fast tier run by this script: the default suite's dependency re-resolution is then redundant
SCRIPT_ENV = "SWARMNODE_PYTHON_VERSIONS_RUN"


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def find_python(version: str) -> Path | None:
    """An interpreter for ``version`` ("3.12"): the newest pyenv build of it, else ``python3.12`` on PATH.

    pyenv's shims are skipped: they answer only for the version pyenv has selected."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = sorted(
        (
            p
            for p in root.glob(f"versions/{version}.*/bin/python{version}")
            if re.fullmatch(r"[\d.]+", p.parts[-3])
        ),
        key=lambda p: _numbers(p.parts[-3]),
        reverse=True,
    )
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and "shims" not in Path(folder).parts:
            candidates.append(Path(folder) / f"python{version}")
    for candidate in candidates:
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        try:
            out = subprocess.run(
                [str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    return None


def readme_test_command() -> str:
    for line in (REPO / "README.md").read_text().splitlines():
        if ".venv/bin/python -m pytest" in line and "pip install" in line:
            return line.strip()
    raise RuntimeError(
        "README.md has no test command (a line with the pip steps and `.venv/bin/python -m pytest`)"
    )


def readme_pip_steps() -> list[list[str]]:
    """The README's ``.venv/bin/pip install ...`` steps, in order, as argument lists."""
    steps = [shlex.split(part) for part in readme_test_command().split(" && ")]
    steps = [s for s in steps if s[:2] == [".venv/bin/pip", "install"]]
    if not steps:
        raise RuntimeError("README.md's test command has no `.venv/bin/pip install` step")
    return steps


def torch_pin() -> str:
    """``torch==X`` as the README's test command installs it first."""
    for step in readme_pip_steps():
        for arg in step:
            if arg.startswith("torch=="):
                return arg
    raise RuntimeError("README.md's test command installs no pinned torch")


def declared() -> dict:
    """What a version's check covers: requires-python, the runtime and test dependencies, the torch pin."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {
        "requires_python": project["requires-python"],
        "requirements": [
            r.strip() for r in project["dependencies"] + project["optional-dependencies"]["test"]
        ],
        "torch": torch_pin(),
    }


def load_record() -> dict:
    try:
        return json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {"versions": {}}


def resolve_command(python: Path, report: Path) -> list[str]:
    """pip's dry-run resolution of the declared dependencies for ``python`` (no venv, installs nothing;
    ``--report`` also exempts it from PEP 668's externally-managed refusal)."""
    spec = declared()
    return [
        str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        "--disable-pip-version-check", "--report", str(report), spec["torch"], *spec["requirements"],
    ]  # fmt: skip


def _run(cmd: list[str], log: Path, env: dict | None = None) -> tuple[int, float]:
    start = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n$ {shlex.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    return rc, time.monotonic() - start


def _tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def check_version(version: str, workdir: Path) -> dict:
    """Fresh venv, the README's pip steps, the fast tier; the numbers and the outcome."""
    python = find_python(version)
    if python is None:
        return {"ok": False, "why": f"no Python {version} found (pyenv versions or python{version} on PATH)"}
    venv = workdir / f"venv{version.replace('.', '')}"
    log = workdir / f"python{version}.log"
    print(f"python {version}: {python} -> {venv} (log {log})", flush=True)
    full = [str(python), "-c", "import platform; print(platform.python_version())"]
    result: dict = {"python": subprocess.run(full, capture_output=True, text=True).stdout.strip()}
    rc, install_s = _run([str(python), "-m", "venv", str(venv)], log)
    for step in readme_pip_steps():
        if rc != 0:
            break
        rc, seconds = _run([str(venv / "bin" / "pip"), *step[1:]], log)
        install_s += seconds
    result["install_s"] = round(install_s)
    if rc != 0:
        return {**result, "ok": False, "why": f"install failed (exit {rc}):\n{_tail(log)}"}
    print(f"python {version}: installed in {install_s:.0f} s; fast tier ...", flush=True)
    env = {**os.environ, SCRIPT_ENV: "1"}
    tier = [str(venv / "bin" / "python"), "-m", "pytest", *FAST_TIER, "-q", "-p", "no:cacheprovider"]
    rc, seconds = _run(tier, log, env=env)
    summary = next(
        (ln for ln in reversed(log.read_text().splitlines()) if re.search(r"\d+ (passed|failed)", ln)), "?"
    )
    result.update(fast_tier_s=round(seconds), fast_tier=summary.strip("= "))
    if rc != 0:
        return {**result, "ok": False, "why": f"fast tier failed (exit {rc}):\n{_tail(log)}"}
    listing = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format=json"], capture_output=True, text=True
    )
    result["packages"] = {p["name"].lower(): p["version"] for p in json.loads(listing.stdout or "[]")}
    return {**result, "ok": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", default=["3.12", "3.13"], choices=SUPPORTED)
    parser.add_argument(
        "--workdir", type=Path, help="where to make the run's folder (default: the system's temp folder)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the venvs (~5.5 GB each) and logs")
    parser.add_argument("--no-record", action="store_true", help=f"do not update {RECORD.name}")
    args = parser.parse_args(argv)

    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="swarmnode-pyversions-", dir=args.workdir))  # ours alone to remove
    spec = declared()
    record = load_record()
    results = {}
    try:
        for version in args.versions:
            results[version] = check_version(version, workdir)
            res = results[version]
            if res["ok"]:
                print(
                    f"python {version}: OK  install {res['install_s']} s, fast tier {res['fast_tier_s']} s "
                    f"({res['fast_tier']})",
                    flush=True,
                )
                if not args.no_record:
                    today = datetime.date.today().isoformat()
                    record.setdefault("versions", {})[version] = {"date": today, **spec, **res}
                    del record["versions"][version]["ok"]
                    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            else:
                print(f"python {version}: FAILED  {res['why']}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"venvs and logs kept in {workdir}")
    print("\nversion  install  fast tier  result")
    for version, res in results.items():
        install, tier = f"{res.get('install_s', '-')} s", f"{res.get('fast_tier_s', '-')} s"
        print(
            f"{version:8} {install:8} {tier:10} {'OK' if res['ok'] else 'FAILED'}  {res.get('fast_tier', '')}"
        )
    return 0 if results and all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

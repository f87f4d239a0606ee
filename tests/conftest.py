"""Suite-wide test selection (tests marked ``slow`` stay out of the default run) and /tmp hygiene.

The default ``pytest`` is what CI runs and must stay within minutes on 2 cores; long soak, chaos and fuzz
runs carry ``@pytest.mark.slow``. They are deselected unless the command line picks tests by marker
itself (``pytest -m slow``, ``pytest -m "slow and not gpu"``): any ``-m`` expression takes over.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers.stranded_sockets import remove_stranded_sockets

# fixtures shared by several test files: the verifier tests' banks, the learner tests' tiny models
pytest_plugins = ("tests.helpers.verify_world", "tests.helpers.tiny_policies")

_STARTED = pytest.StashKey[float]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.time()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Leave /tmp as the run found it: the crash tests' SIGKILLs strand socket files there."""
    started = session.config.stash.get(_STARTED, None)
    if started is not None:
        remove_stranded_sockets(since=started)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("markexpr"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]

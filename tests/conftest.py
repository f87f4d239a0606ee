"""Suite-wide test selection: tests marked ``slow`` stay out of the default run.

The default ``pytest`` is what CI runs and must stay within minutes on 2 cores; long soak, chaos and fuzz
runs carry ``@pytest.mark.slow``. They are deselected unless the command line picks tests by marker
itself (``pytest -m slow``, ``pytest -m "slow and not gpu"``): any ``-m`` expression takes over.
"""

from __future__ import annotations

import pytest

# fixtures shared by several test files: the verifier tests' banks, the learner tests' tiny models
pytest_plugins = ("tests.helpers.verify_world", "tests.helpers.tiny_policies")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("markexpr"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]

"""The backend conformance suite: the adapter SPI's contract as reusable pytest checks.

An adapter author runs it by writing one test module that imports the checks and defines a
``harness`` fixture returning a :class:`Harness` for their adapter (a fresh cluster per test)::

    # tests/conformance/test_myadapter_conformance.py
    import pytest

    from dispatch.conformance import *  # noqa: F403  (the checks: test_conformance_*)
    from dispatch.conformance import MemoryHarness  # or your own Harness


    @pytest.fixture
    def harness():
        return MemoryHarness()  # each check closes it when it ends (``close`` must be idempotent)

Needs pytest and pytest-asyncio (the checks are marked ``@pytest.mark.asyncio``). ``import *`` brings
only the ``test_conformance_*`` functions (``__all__``); import :class:`Harness`, :class:`BaseHarness`,
:data:`INJECTABLE` and :class:`MemoryHarness` by name. A check of an optional protocol is skipped when
the backend does not implement it or its capabilities say the cluster lacks it; a check needing an
event the harness cannot inject is skipped. See ``docs/conformance.md``.
"""

from dispatch.conformance.checks import *  # noqa: F403
from dispatch.conformance.checks import __all__ as _checks
from dispatch.conformance.harness import INJECTABLE as INJECTABLE
from dispatch.conformance.harness import BaseHarness as BaseHarness
from dispatch.conformance.harness import Harness as Harness
from dispatch.conformance.harness import MemoryHarness as MemoryHarness

__all__ = list(_checks)

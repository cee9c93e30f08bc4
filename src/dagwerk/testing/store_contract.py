"""The store contract suite: every contract test in one importable module.

A backend's test module runs the whole suite by importing it and providing a
``store`` fixture that returns a fresh, empty store implementing the seed's
``DagStore``, ``DagWaitStore``, ``DagRetryStore`` and ``OutputResolver``,
their extensions ``WaitResponseStore``, ``DelayedRetryStore`` and
``NodeRerunStore``, ``DagRunStore`` and the queue (``DagQueueStore``); the
tests of the other extensions expect what the built-in stores offer::

    import pytest
    from dagwerk.testing.store_contract import *  # noqa: F401,F403

    @pytest.fixture
    def store():
        return MyStore()

    @pytest.fixture
    def make_store():
        return MyStore  # called with keyword settings: clock, max_deliveries, ...

The tests use only the public protocols and the orchestration functions, so
an application's own store runs the same suite as the bundled backends.
"""

from __future__ import annotations

from dagwerk.testing.contract_attempts import *  # noqa: F403
from dagwerk.testing.contract_backstop import *  # noqa: F403
from dagwerk.testing.contract_batch import *  # noqa: F403
from dagwerk.testing.contract_batch_ack import *  # noqa: F403
from dagwerk.testing.contract_budgets import *  # noqa: F403
from dagwerk.testing.contract_children import *  # noqa: F403
from dagwerk.testing.contract_claims import *  # noqa: F403
from dagwerk.testing.contract_durable import *  # noqa: F403
from dagwerk.testing.contract_fastpath import *  # noqa: F403
from dagwerk.testing.contract_fencing import *  # noqa: F403
from dagwerk.testing.contract_finalisation import *  # noqa: F403
from dagwerk.testing.contract_frontier import *  # noqa: F403
from dagwerk.testing.contract_logs import *  # noqa: F403
from dagwerk.testing.contract_orchestration import *  # noqa: F403
from dagwerk.testing.contract_outbox import *  # noqa: F403
from dagwerk.testing.contract_policies import *  # noqa: F403
from dagwerk.testing.contract_queue import *  # noqa: F403
from dagwerk.testing.contract_retention import *  # noqa: F403
from dagwerk.testing.contract_retry import *  # noqa: F403
from dagwerk.testing.contract_run_outputs import *  # noqa: F403
from dagwerk.testing.contract_schedules import *  # noqa: F403
from dagwerk.testing.contract_snapshots import *  # noqa: F403
from dagwerk.testing.contract_states import *  # noqa: F403
from dagwerk.testing.contract_tracebacks import *  # noqa: F403
from dagwerk.testing.contract_views import *  # noqa: F403
from dagwerk.testing.contract_waiting import *  # noqa: F403
from dagwerk.testing.contract_workers import *  # noqa: F403

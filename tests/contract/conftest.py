"""Shared configuration of the store contract tests.

Each backend module in this directory imports the suite from
``dagwerk.testing.store_contract`` and defines its own ``store`` fixture.
The suite's tests live in an installed package, so pytest's assertion
rewriting is registered for it here (before the backend modules import it)
to keep failure messages informative.
"""

from __future__ import annotations

import sys

import pytest

if not any(name.startswith("dagwerk.testing") for name in sys.modules):
    pytest.register_assert_rewrite("dagwerk.testing")

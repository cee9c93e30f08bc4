"""Test support shipped with dagwerk.

``dagwerk.testing.store_contract`` is the store contract suite: plain pytest
tests over a ``store`` fixture, grouped by topic in the ``contract_*``
modules. ``dagwerk.testing.helpers`` holds the pipeline builders, the fake
worker and the forwarding proxy the suite is written with. Importing this
package needs pytest only when the suite itself is imported.
"""

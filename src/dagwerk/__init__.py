"""dagwerk: durable DAG workflows.

The seed engine API lives in submodules at the seed's paths
(``dagwerk.models``, ``dagwerk.orchestrator``, ...). The batteries
(``Engine``, the CLI) are added by later layers.
"""

__version__ = "0.1.0"

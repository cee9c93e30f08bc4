"""The run frontier of the in-memory store (``RunFrontierStore``)."""

from __future__ import annotations

from collections.abc import Sequence

from dagwerk.constants import NodeDisposition
from dagwerk.store import LaunchProgress, RunFrontier

from ._base import MemoryStoreBase


class FrontierMixin(MemoryStoreBase):
    def get_run_frontier(
        self, run_id: str, node_indices: Sequence[int], *, count_complete: bool = False
    ) -> RunFrontier | None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return None
            launches: dict[int, LaunchProgress] = {}
            for index in node_indices:
                launch = run.launches.get(index) if type(index) is int else None
                if launch is not None:
                    launches[index] = LaunchProgress(
                        launch_id=launch.launch_id,
                        node_index=index,
                        generation=launch.generation,
                        disposition=launch.disposition,
                        complete=launch.complete,
                    )
            has_failure = bool(run.failed_tasks) or any(
                launch.disposition is NodeDisposition.FAILED for launch in run.launches.values()
            )
            return RunFrontier(
                status=run.status,
                node_count=len(run.nodes),
                complete_nodes=run.settled_nodes if count_complete else None,
                has_failure=has_failure,
                launches=launches,
            )

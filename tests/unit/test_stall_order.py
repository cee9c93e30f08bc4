"""The stall diagnosis walks nodes in rounds of topological order, in time
linear in the nodes (no rescan of every unplaced node per round)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from dagwerk.stall import _topological


def _rounds_by_rescan(deps: Sequence[tuple[int, ...]]) -> list[int]:
    """The definition: each round places every unplaced node whose
    dependencies are all placed, in index order; when none is, the lowest
    unplaced index."""
    order: list[int] = []
    placed: set[int] = set()
    remaining = list(range(len(deps)))
    while remaining:
        progress = [i for i in remaining if all(d in placed for d in deps[i])]
        placed.update(progress or remaining[:1])
        order.extend(progress or remaining[:1])
        remaining = [i for i in remaining if i not in placed]
    return order


def test_a_chain_listed_backwards_is_walked_from_its_root() -> None:
    deps = [(1,), (2,), (3,), ()]
    assert _topological(deps) == [3, 2, 1, 0]


def test_each_round_is_in_index_order() -> None:
    # Round 1: 1 and 3 (no dependencies); round 2: 0, 2 and 4.
    deps = [(3,), (), (1,), (), (1, 3)]
    assert _topological(deps) == [1, 3, 0, 2, 4]


def test_cycles_and_unknown_dependencies_fall_back_to_the_lowest_unplaced_index() -> None:
    deps = [(1,), (0,), (0, 1), (9,), (3, 3)]
    assert _topological(deps) == _rounds_by_rescan(deps) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", range(40))
def test_the_order_matches_the_definition_on_random_graphs(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randint(0, 40)
    deps = [
        tuple(rng.randrange(count + 2) for _ in range(rng.randint(0, 3)))  # some out of range
        if rng.random() < 0.3
        else tuple(rng.sample(range(i), min(i, rng.randint(0, 3))))  # acyclic edges
        for i in range(count)
    ]
    assert _topological(deps) == _rounds_by_rescan(deps)

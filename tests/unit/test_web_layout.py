"""The run page's DAG layout: layers by longest path, order by barycentre,
escaped SVG; and the bind rule of ``dagwerk serve``."""

from __future__ import annotations

import pytest

from dagwerk.web.layout import (
    dag_svg,
    gantt_svg,
    layers_by_longest_path,
    layout,
    order_by_barycentre,
)
from dagwerk.web.security import UnsafeBindError, check_bind, is_loopback, session_value


def test_a_node_sits_one_layer_after_its_deepest_source() -> None:
    #  0 -> 1 -> 2 -> 3,  0 -> 3 (a shortcut does not pull 3 left)
    sources = [[], [0], [1], [2, 0]]
    assert layers_by_longest_path(sources) == [0, 1, 2, 3]
    assert layers_by_longest_path([[], [], [0, 1]]) == [0, 0, 1]


def test_a_long_chain_does_not_recurse() -> None:
    sources: list[list[int]] = [[]] + [[i] for i in range(5_000)]
    assert layers_by_longest_path(sources)[-1] == 5_000


def test_barycentre_order_uncrosses_edges() -> None:
    # Roots a(0), b(1); c(2) reads b, d(3) reads a: drawn as given, c-b and
    # d-a cross; by barycentre d comes first.
    sources: list[list[int]] = [[], [], [1], [0]]
    rows = order_by_barycentre(layers_by_longest_path(sources), sources)
    assert rows == [[0, 1], [3, 2]]
    placed = layout(sources)
    assert placed[3][1] < placed[2][1] and placed[0][0] < placed[3][0]


def test_the_svg_escapes_every_text() -> None:
    svg = str(dag_svg(["<script>x</script>"], [[]], {0: "failed"}, {0: "1 <b>failed</b>"}))
    assert "<script>x" not in svg and "&lt;script&gt;x" in svg
    assert "&lt;b&gt;failed" in svg and 'class="node state-failed"' in svg
    bars = str(gantt_svg([("<i>n</i>", 10.0, 12.0, 3, "done")], now=20.0))
    assert "<i>n" not in bars and "3 attempts" in bars


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.3.2.1"])
def test_loopback_hosts_serve_without_a_token(host: str) -> None:
    assert is_loopback(host)
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.org", "::"])
def test_other_hosts_need_a_token(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(UnsafeBindError) as raised:
        check_bind(host, None)
    assert raised.value.field == "host"
    check_bind(host, "x" * 16)
    with pytest.raises(UnsafeBindError) as weak:
        check_bind(host, "x" * 15)
    assert weak.value.field == "DAGWERK_UI_TOKEN" and weak.value.limit == 16


def test_the_session_cookie_is_not_the_token() -> None:
    token = "t" * 20
    assert token not in session_value(token) and session_value(token) != session_value("u" * 20)

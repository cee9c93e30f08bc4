"""Every asset of the dashboard ships in the wheel: the package-data globs of
pyproject.toml match each template and static file, and the pages load
nothing from elsewhere (no CDN)."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import dagwerk.web

ROOT = Path(__file__).resolve().parents[2]
WEB = Path(dagwerk.web.__file__).parent


def _assets() -> list[Path]:
    return [p for folder in ("templates", "static") for p in (WEB / folder).iterdir()]


def test_package_data_covers_every_template_and_static_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["dagwerk"]
    assets = _assets()
    assert assets
    for path in assets:
        relative = path.relative_to(WEB.parent).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in globs), relative


def test_the_pages_load_only_their_own_assets() -> None:
    for path in _assets():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), path.name
        assert "@import" not in text and "cdn" not in text.lower(), path.name

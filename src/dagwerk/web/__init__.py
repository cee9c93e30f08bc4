"""The web dashboard and HTTP API of ``dagwerk serve``: :func:`create_app`
builds the ASGI application over an :class:`~dagwerk.Engine`."""

from __future__ import annotations

from dagwerk.web.actions import ServedPipelines
from dagwerk.web.app import WebSettings, create_app
from dagwerk.web.security import TOKEN_ENV, UnsafeBindError, check_bind

__all__ = [
    "TOKEN_ENV",
    "ServedPipelines",
    "UnsafeBindError",
    "WebSettings",
    "check_bind",
    "create_app",
]

"""Exceptions shared by the proxy's modules."""

from __future__ import annotations


class UpstreamError(Exception):
    """The upstream backend answered an injected command unexpectedly or went away."""

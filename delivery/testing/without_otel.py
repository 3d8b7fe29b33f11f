"""Importing this module makes every later ``opentelemetry`` import fail with
``ModuleNotFoundError``, as it does where the ``[otel]`` extra is not installed: to check (and
measure) that delivery runs without OpenTelemetry and never imports it. Import it first (a
``sitecustomize``, or the first line of a script); a module imported before stays imported."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["WithoutOpenTelemetry"]


class WithoutOpenTelemetry(importlib.abc.MetaPathFinder):
    """The finder that refuses ``opentelemetry`` and its submodules."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if not any(isinstance(finder, WithoutOpenTelemetry) for finder in sys.meta_path):
    sys.meta_path.insert(0, WithoutOpenTelemetry())

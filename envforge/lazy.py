"""A package whose API loads on first use (PEP 562), so that importing one light module of it
(its ``config``, say, as the command line does at start) does not load the rest.

    API = {"SynthConfig": "config", "synthesize": "synthesizer"}   # name -> its module
    __all__ = list(API)
    __getattr__, __dir__ = lazy_api(__name__, API)
"""
from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_api(package: str, api: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """The ``__getattr__`` and ``__dir__`` of PACKAGE, whose name N is ``package.<api[N]>.N``."""
    namespace = import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in api:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(import_module(f"{package}.{api[name]}"), name)
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *api})

    return __getattr__, __dir__

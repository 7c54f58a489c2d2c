"""Settings: one config dataclass per stage, whose fields carry their default, help and bounds.

    @dataclass
    class GateSettings(Settings):
        seeds: int = setting(50, "Seeds per dynamic property.", low=2)

A setting is written once. ``Settings.__post_init__`` checks every field against the bounds and
choices its ``setting()`` declares, then runs the class's own ``check()`` for rules that relate
fields; both raise :class:`~envforge.errors.ConfigError`, which names the field
(``GateSettings.seeds must be at least 2, got 1``). The command line builds its options from the
same fields (``envforge.cli.option``), so a default or a help text exists once, and it reports a
``ConfigError`` under the flag the user typed (``--seeds must be at least 2, got 1``).

Standard library only: every layer may import this module.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import MISSING, asdict
from typing import Any, Iterable

from envforge.errors import ConfigError


def setting(default: Any = MISSING, help: str = "", *, low: float | None = None,
            high: float | None = None, above: float | None = None,
            choices: Iterable[str] | None = None, optional: bool = False,
            factory: Any = MISSING, flag: str | None = None) -> Any:
    """A dataclass field with its help and bounds: ``low <= value <= high``, ``value > above``,
    ``value in choices``. ``optional``: None is also allowed (and means what the help says).
    ``flag``: the command-line flag that sets it, where it is not ``--name-with-dashes``.
    A default that comes from the paper says so in its help."""
    meta = {"help": help, "low": low, "high": high, "above": above,
            "choices": tuple(choices) if choices is not None else None,
            "optional": optional or default is None, "flag": flag}
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _num(x: float) -> str:
    """A bound as a person reads it: an integer whole (2**63 - 1, not 9.22337e+18), else ``:g``."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def bounds_problem(meta: dict, value: Any) -> str | None:
    """What is wrong with VALUE for a field with this metadata (None: nothing)."""
    if value is None and meta.get("optional"):
        return None
    choices = meta.get("choices")
    if choices is not None:
        return None if value in choices else f"must be one of {', '.join(choices)}, got {value!r}"
    parts = value if isinstance(value, (tuple, list)) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in parts):
        return f"must be a finite number, got {value!r}"
    low, high, above = meta.get("low"), meta.get("high"), meta.get("above")
    if low is None and high is None and above is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {value!r}"
    if above is not None and not value > above:
        return f"must be greater than {_num(above)}, got {value!r}"
    if low is not None and high is not None and not low <= value <= high:
        return f"must be from {_num(low)} to {_num(high)}, got {value!r}"
    if low is not None and value < low:
        return f"must be at least {_num(low)}, got {value!r}"
    if high is not None and value > high:
        return f"must be at most {_num(high)}, got {value!r}"
    return None


class Settings:
    """Base of the config dataclasses: bounds checked on construction, ``to_dict()``."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            problem = bounds_problem(f.metadata, getattr(self, f.name))
            if problem:
                self.fail(f.name, problem)
        self.check()

    def check(self) -> None:
        """Rules that relate fields, or that bounds cannot say; call ``self.fail``."""

    def fail(self, name: str, problem: str) -> None:
        raise ConfigError(type(self).__name__, name, problem)

    def to_dict(self) -> dict:
        return asdict(self)


def field_of(cls: type, name: str) -> dataclasses.Field:
    """The dataclass field NAME of CLS (a clear error for a misspelt name)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise AttributeError(f"{cls.__name__} has no setting {name!r}")


def flag_of(cls: type, name: str) -> str:
    """The command-line flag that sets NAME of CLS (``--name-with-dashes`` unless it declares one)."""
    return field_of(cls, name).metadata.get("flag") or "--" + name.replace("_", "-")


def named(cls: type, name: str) -> str:
    """NAME of CLS as a message names it: with its flag where that is not the name with dashes
    (``learning_rate (--lr)``), so that both a Python caller and a command-line user find it."""
    flag = field_of(cls, name).metadata.get("flag")
    return f"{name} ({flag})" if flag else name


def default_of(cls: type, name: str) -> Any:
    f = field_of(cls, name)
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


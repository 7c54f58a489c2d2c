"""One progress protocol for every stage.

A stage that takes long accepts ``progress: Progress | None``: a callable it gives one
:class:`Step` at a time, from whichever thread does the work (so a display must be thread-safe).
Stages never print and never draw; the command line decides how to show steps (a spinner and a
bar on a terminal, nothing in --json mode). ``str(step)`` is always a line for a person.

- ``text``: what is happening now ("static audit", "attempt 2/5: gate");
- ``item``: which item of a batch the step is about (a capability, an env), or None;
- ``done``/``total``: items finished so far and in all, on the step that finishes an item;
- ``record``: the stage's own typed record when it has one (e.g. one iteration's statistics).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Step:
    text: str
    item: str | None = None
    done: int | None = None
    total: int | None = None
    record: Any = None

    def __str__(self) -> str:
        return f"{self.item}: {self.text}" if self.item else self.text


Progress = Callable[[Step], None]


def steady(shown: int, estimate: int, done: int) -> int:
    """The total to show for a count whose total is an estimate: ``shown`` kept until the count
    reaches it or ``estimate`` is more than 10% off it (a display begins a count afresh, its ETA
    too, whenever the total changes, so a total that moved with every step would have none)."""
    return estimate if shown <= done or abs(estimate - shown) > 0.1 * shown else shown


def reporter(progress: Progress | None, item: str | None = None) -> Callable[[str], None]:
    """A ``say(text)`` that sends ``Step(text, item)`` to PROGRESS (does nothing without one)."""
    if progress is None:
        return lambda text: None
    return lambda text: progress(Step(text, item))

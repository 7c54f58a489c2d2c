"""Error types shared by every stage. Each names the boundary it comes from, so that the CLI can
map it to an exit code and a message that says what to fix: 2 when what was asked cannot be done
as given (``UsageError``, ``ConfigError``, ``InputError``: a wrong option, or a missing or malformed
file), 1 when the work itself failed (the sandbox, the env's code, the model). The rule is in
docs/configuration.md."""
from __future__ import annotations

#: control characters (C0 but tab and newline, DEL, C1) as visible escapes: text from an env, a
#: sandbox or a model must not drive the terminal it is printed on (an escape sequence can set
#: the window title, clear the screen, write the clipboard)
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7f, 0xa0)] if c not in (0x09, 0x0a)}


def printable(text: str) -> str:
    """``text`` with its control characters written as ``\\xNN`` (tab and newline kept)."""
    return text.translate(_CONTROLS)


class EnvforgeError(Exception):
    """Base class. ``str(err)`` is a complete message for a person: what was wrong, and the fix."""
    exit_code = 1


class UsageError(EnvforgeError):
    """The command line asked for something that cannot be done as asked (exit 2)."""
    exit_code = 2


class ConfigError(UsageError, ValueError):
    """A setting of a config dataclass is out of its bounds (exit 2). ``owner`` is the class,
    ``field`` the setting, ``problem`` what is wrong with its value; the CLI rewords the message
    with the flag that sets the field. Also a ``ValueError``, for callers of the Python API."""

    def __init__(self, owner: str, field: str, problem: str):
        super().__init__(f"{owner}.{field} {problem}")
        self.owner, self.field, self.problem = owner, field, problem


class ActionError(UsageError, ValueError):
    """An action given to ``env.step`` is not an assistant message (outside the action space)."""


class InputError(EnvforgeError):
    """A file or folder the user named is missing, unreadable or has the wrong shape (exit 2,
    like every problem with what was asked: see docs/configuration.md)."""
    exit_code = 2


class TargetError(InputError):
    """A target folder or schema file is missing or malformed."""


class SandboxError(EnvforgeError):
    """Base of everything that goes wrong at the sandbox boundary."""


class SandboxUnavailable(SandboxError):
    """The requested sandbox backend cannot run on this machine; the message says why and how."""


class SandboxTimeout(SandboxError):
    """A call into the sandbox did not answer within its time limit; the sandbox was killed."""


class SandboxCrashed(SandboxError):
    """The sandboxed process died (killed by a limit, a signal, or its own exit)."""


class SandboxProtocolError(SandboxError):
    """The sandbox answered something that is not the protocol (too large, not JSON, wrong id)."""


class ClusterError(EnvforgeError):
    """The Ray cluster failed the run: its head cannot be reached, or work was lost on more
    nodes than the retries cover (``envforge.executor``)."""


class EnvCallError(EnvforgeError):
    """The env's own code raised (or broke the contract) inside the sandbox. The sandbox lives on,
    so this is not a ``SandboxError``: the two boundaries are caught apart, in any order.

    ``kind`` is "env" (an exception in env code), "json" (a value that is not JSON) or "contract"
    (wrong arity of a returned tuple, missing attribute); ``type`` is the exception class name.
    """

    def __init__(self, kind: str, type_: str, message: str, traceback: str = ""):
        type_, message, traceback = printable(type_), printable(message), printable(traceback)
        super().__init__(f"{type_}: {message}" if type_ else message)
        self.kind, self.type, self.message, self.traceback = kind, type_, message, traceback

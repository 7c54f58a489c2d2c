"""The static stage of the gate: audit the source of ``env.py`` without running any of it.

``audit_static(source)`` parses the file once, indexes its nodes by type in one walk, then runs one
small check per rule, in order: imports, builtins, dunders, entropy sources, the contract's shape.
Every finding names the line it was seen on, and a rejected env gets all the findings it earned.
It never raises: bytes that are not UTF-8, binary files, empty files and syntax errors are findings.

The audit is by reachability, since blocking names cannot win: an allowed module is used only
through the names MODULE_NAMES lists for it, and is never a value itself; dunder and frame
attributes are never read, and underscore attributes only when the file defines them; no
attribute is looked up by a run-time string (getattr with a computed name, str.format on a string
that is not one of the file's literals, string.Formatter, operator.attrgetter); no evaluator of
string annotations (typing.get_type_hints, functools.singledispatch); no class pattern with
positional sub-patterns on a class that is not a builtin; no metaclass; no wall clock or
unseeded randomness through any alias. Each rule's finding says what it stops.
What it does not: code that loops forever, allocates without bound or misbehaves at run time; the
sandbox and the dynamic checks own those. A static audit of Python is a filter, not a proof.

RestrictedPython (run-time guards) is not used yet: docs/gate.md says why and how it would fit.
"""
from __future__ import annotations

import ast
import math
import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field

from envforge import contract as C
from envforge.contract import Finding, error, warning

_ALLOWED = ", ".join(sorted(C.ALLOWED_IMPORTS))
#: Frame, generator and code internals that reach globals without a dunder.
_FRAME_ATTRS = frozenset({
    "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "f_globals", "f_locals",
    "f_back", "f_builtins", "f_code", "tb_frame", "tb_next", "co_code", "func_globals", "func_code",
})
#: Modules that allowed modules import at top level (typing.sys, enum.bltns, fractions.operator).
_MODULE_ATTRS = frozenset({
    "sys", "os", "builtins", "bltns", "types", "inspect", "codecs", "contextlib", "copyreg",
    "warnings", "operator", "importlib", "subprocess", "io", "gc",
})
#: Forbidden builtin names that are also common method names (``re.compile``, ``zipfile.open``).
_COMMON_METHODS = frozenset({
    "compile", "open", "input", "help", "exit", "quit", "copyright", "credits", "license",
})
#: typing's evaluators run strings as code with the builtins in scope (``x: "open"`` -> open).
_EVALUATORS = frozenset({
    "typing.get_type_hints", "typing.ForwardRef", "typing.evaluate_forward_ref"})
_DUNDER_STRING = re.compile(
    r"__(?:subclasses|globals|builtins|import|class|mro|bases|base|dict|code|getattribute|closure"
    r"|func|self|loader|spec|reduce|reduce_ex)__")
_FORMAT_WALK = re.compile(r"\{[^{}]*\.(?:__|" + "|".join(sorted(_FRAME_ATTRS)) + ")")

#: What env.py may use each allowed module through: an allow-list, so that whatever else a module
#: lets code reach at run time (typing.sys, statistics.random, string.Formatter's getattr by
#: string, functools.singledispatch's and typing.get_type_hints' evaluation of annotations,
#: NormalDist.samples' OS entropy, dataclasses.make_dataclass's exec) stays out of reach. A
#: module itself is never a value: it may appear only as ``module.NAME`` with NAME listed here.
MODULE_NAMES: dict[str, frozenset[str]] = {m: frozenset(n.split()) for m, n in {
    "json": "dumps loads JSONDecodeError",
    "random": "Random",
    "math": "acos acosh asin asinh atan atan2 atanh cbrt ceil comb copysign cos cosh degrees dist e "
            "erf erfc exp exp2 expm1 fabs factorial floor fmod frexp fsum gamma gcd hypot inf isclose "
            "isfinite isinf isnan isqrt lcm ldexp lgamma log log10 log1p log2 modf nan nextafter perm "
            "pi pow prod radians remainder sin sinh sqrt tan tanh tau trunc ulp",
    "re": "compile search match fullmatch findall finditer sub subn split escape error Pattern Match "
          "A ASCII I IGNORECASE M MULTILINE S DOTALL X VERBOSE NOFLAG",
    "string": "ascii_letters ascii_lowercase ascii_uppercase digits hexdigits octdigits punctuation "
              "printable whitespace capwords Template",
    "itertools": "accumulate batched chain combinations combinations_with_replacement compress count "
                 "cycle dropwhile filterfalse groupby islice pairwise permutations product repeat "
                 "starmap takewhile tee zip_longest",
    "collections": "Counter OrderedDict defaultdict deque namedtuple ChainMap UserDict UserList "
                   "UserString abc",
    "collections.abc": "Iterable Iterator Sequence MutableSequence Mapping MutableMapping Set "
                       "MutableSet Collection Container Hashable Sized Callable",
    "copy": "copy deepcopy",
    "dataclasses": "dataclass field fields asdict astuple replace is_dataclass FrozenInstanceError "
                   "InitVar KW_ONLY MISSING",
    "typing": "Any Optional Union List Dict Tuple Set FrozenSet Callable Iterable Iterator Sequence "
              "Mapping MutableMapping NamedTuple TypedDict Literal Final ClassVar TypeVar Generic "
              "Protocol cast overload NoReturn Annotated DefaultDict Counter Deque TYPE_CHECKING "
              "Type Self Never NotRequired Required TypeAlias",
    "enum": "Enum IntEnum StrEnum Flag IntFlag auto unique",
    "functools": "reduce partial cached_property total_ordering wraps cmp_to_key",
    "statistics": "mean fmean median median_low median_high median_grouped mode multimode stdev "
                  "pstdev variance pvariance geometric_mean harmonic_mean quantiles StatisticsError",
    "decimal": "Decimal Context localcontext InvalidOperation DivisionByZero "
               "DecimalException ROUND_05UP ROUND_CEILING ROUND_DOWN ROUND_FLOOR ROUND_HALF_DOWN "
               "ROUND_HALF_EVEN ROUND_HALF_UP ROUND_UP",
    "fractions": "Fraction",
    "datetime": "date datetime timedelta timezone time MINYEAR MAXYEAR",
    "textwrap": "wrap fill dedent indent shorten TextWrapper",
    "hashlib": "md5 sha1 sha224 sha256 sha384 sha512 sha3_256 sha3_512 blake2b blake2s",
}.items()}
#: Attribute prefixes of frame, generator, coroutine, traceback and code objects (f_globals,
#: gi_frame, tb_frame, co_consts, ...): walks from a value to the globals or the caller's frame.
_FRAME_PREFIXES = ("f_", "gi_", "cr_", "ag_", "tb_", "co_")


def _frame_names() -> frozenset[str]:
    """The public attribute names of this Python's frames, generators, coroutines, async
    generators, tracebacks and code objects: never allowed, even when env.py defines them (a
    file that sets ``self.gi_frame`` must not thereby allow ``g.gi_frame``)."""
    import sys

    def gen():
        yield

    async def coro():
        pass

    async def agen():
        yield

    try:
        raise ValueError
    except ValueError as e:
        tb = e.__traceback__
    c, a = coro(), agen()
    objects = (sys._getframe(), gen(), c, a, tb, gen.__code__)
    names = {n for o in objects for n in dir(o) if n.startswith(_FRAME_PREFIXES)}
    c.close()
    return frozenset(names) | _FRAME_ATTRS


_FRAME_NAMES = _frame_names()
#: functools caches' statistics: hits and misses count every call in the process, a counter no
#: episode owns (the state probe leaves a pure function's memo alone, so its counts are read here)
_CACHE_STATS = frozenset({"cache_info", "cache_parameters"})
#: Clock readers, on whatever value they are reached through (``D = datetime.date; D.today()``).
_CLOCK_ATTRS = frozenset({"now", "today", "utcnow"})
#: The public API of namedtuple, spelled with one underscore.
_NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
#: Types whose class pattern ``case int(x)`` matches the subject itself (no attribute is read).
_SELF_MATCHING = frozenset({"bool", "bytearray", "bytes", "dict", "float", "frozenset", "int",
                            "list", "set", "str", "tuple"})


#: CPython 3.11's AST conversion keeps its recursion depth in global state: two threads parsing at
#: once can fail with "SystemError: AST constructor recursion depth mismatch". Everything in
#: envforge that parses Python holds this lock: ``parse`` below, and the gate's hypothesis runs
#: (hypothesis parses sources through ``inspect.getsource``).
PARSE_LOCK = threading.RLock()


def parse(source: str, filename: str = "env.py") -> ast.Module:
    """``ast.parse`` that is safe to call from several threads at once."""
    with PARSE_LOCK:
        return ast.parse(source, filename=filename)


@dataclass
class StaticResult:
    """The static stage's findings, and what it learnt of the env's shape."""
    findings: list[Finding] = field(default_factory=list)
    shape: dict = field(default_factory=lambda: {
        "capability": None, "skills": None, "has_env": False, "max_turns": None,
        "docstring": False, "tools": None})
    text: str | None = None  # the source as decoded (BOM dropped); None when it is not text

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)


def audit_static(source: str | bytes, filename: str = "env.py") -> StaticResult:
    """Audit ``source`` (the text or bytes of ``env.py``) without running it. Never raises."""
    result = StaticResult()
    try:
        _audit(source, filename, result)
    except Exception as exc:  # a gate fails closed on its input: a finding, never a crash
        result.findings.append(error("input", f"{filename}: the static audit could not analyse "
                                     f"this file ({type(exc).__name__}: {exc})"))
    seen, unique = set(), []
    for f in result.findings:
        if (f.check, f.severity, f.message) not in seen:
            seen.add((f.check, f.severity, f.message))
            unique.append(f)
    result.findings = unique
    return result


def _audit(source: str | bytes, filename: str, result: StaticResult) -> None:
    text = result.text = _decode(source, filename, result.findings)
    if text is None:
        return
    if not text.strip():
        result.findings.append(error("contract.shape", f"{filename} is empty: write the env as "
                                     "ENV_CONTRACT.md says (CAPABILITY, class Env)"))
        return
    size = len(text.encode("utf-8"))
    if size > C.MAX_SOURCE_BYTES:
        result.findings.append(error("static.size", f"{filename} is {size:,} bytes; the limit is "
                                     f"{C.MAX_SOURCE_BYTES:,}: split data out or generate less"))
        if size > 10 * C.MAX_SOURCE_BYTES:
            return  # far too large to be worth parsing
    try:
        tree = parse(text, filename=filename)
    except SyntaxError as exc:
        result.findings.append(error("static.syntax", f"line {exc.lineno}, column {exc.offset}: "
                                     f"{exc.msg}", actual=(exc.text or "").strip()[:120] or None))
        return
    except (RecursionError, MemoryError):
        result.findings.append(error("static.syntax", "the code is nested too deeply to parse"))
        return
    m = _Module(tree)
    for rule in (check_imports, check_reach, check_builtins, check_dunders, check_entropy,
                 check_lookups, check_format_values, check_regexes):
        found = sorted(rule(m), key=lambda pair: (pair[0].lineno, pair[0].col_offset))
        result.findings += [f for _, f in found]
    result.findings += check_shape(m, result.shape)


def _decode(source: str | bytes, filename: str, findings: list[Finding]) -> str | None:
    """The source as text, or None after adding an "input" finding saying why it is not text."""
    if not isinstance(source, (str, bytes, bytearray, memoryview)):
        findings.append(error("input", f"{filename}: expected the source as str or bytes, got "
                              f"{type(source).__name__}"))
        return None
    try:
        data = source.encode("utf-8") if isinstance(source, str) else bytes(source)
    except UnicodeEncodeError as exc:
        findings.append(error("input", f"{filename} is not valid Unicode text: {exc.reason} at "
                              f"offset {exc.start}"))
        return None
    nul, newline = data.find(b"\0"), b"\n"
    if nul >= 0:
        findings.append(error("input", f"{filename} is a binary file, not Python source: NUL "
                              f"byte at line {data.count(newline, 0, nul) + 1} (offset {nul})"))
        return None
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        findings.append(error("input", f"{filename} is not UTF-8 text: byte 0x{data[exc.start]:02x}"
                              f" at line {data.count(newline, 0, exc.start) + 1} (offset "
                              f"{exc.start}) cannot be decoded; save it as UTF-8"))
        return None


class _Module:
    """One parsed env: its nodes by type, import aliases, and every name that resolves to one."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.nodes: dict[type, list] = defaultdict(list)
        self.parent: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            if hasattr(node, "lineno"):
                self.nodes[type(node)].append(node)
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
        self.modules: dict[str, str] = {}  # local name -> the allowed module it is bound to
        for node in self.nodes[ast.Import]:
            for a in node.names:
                self.modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for node in self.nodes[ast.ImportFrom]:
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULE_NAMES and not node.level:
                    self.modules[a.asname or a.name] = f"{node.module}.{a.name}"
        # attribute names this file defines itself (self._x = ..., def _f, class-level names)
        self.defined_attrs = {n.attr for n in self.nodes[ast.Attribute] if not isinstance(n.ctx, ast.Load)}
        self.defined_attrs |= {n.args[1].value for n in self.nodes[ast.Call]
                               if isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr")
                               and len(n.args) > 1 and isinstance(n.args[1], ast.Constant)
                               and isinstance(n.args[1].value, str)}
        self.defined = set(self.defined_attrs)
        self.defined |= {n.name for t in (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                         for n in self.nodes[t]}
        for cls in self.nodes[ast.ClassDef]:
            for stmt in cls.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else (
                    [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
                self.defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        self.aliases: dict[str, str] = {}  # local name -> the dotted name it was imported as
        for node in self.nodes[ast.Import]:
            for a in node.names:
                top = a.name.split(".")[0]
                self.aliases[a.asname or top] = a.name if a.asname else top
        for node in self.nodes[ast.ImportFrom]:
            for a in node.names:
                if node.module and not node.level and a.name != "*":
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        self.called = {id(n.func) for n in self.nodes[ast.Call]}
        self.getattrs = [n for n in self.nodes[ast.Call] if isinstance(n.func, ast.Name)
                         and n.func.id in C.ATTRIBUTE_BUILTINS]
        self.attr_consts = {id(n.args[1]) for n in self.getattrs if _const_name(n) is not None}
        self.refs = [(n, d) for t in (ast.Name, ast.Attribute, ast.Call) for n in self.nodes[t]
                     if (d := self.dotted(n))]

    def literal_bindings(self) -> dict[str, list]:
        """Names bound only at module or class level -> every value bound to them there (a name
        also bound anywhere else, or stored as an attribute, is left out: its value is unknown)."""
        if not hasattr(self, "_bindings"):
            self._bindings: dict[str, list] = defaultdict(list)
            bodies = [(self.tree.body, True)] + [(c.body, False) for c in self.nodes[ast.ClassDef]]
            for body, module_level in bodies:  # a class's annotated names may be init fields
                for s in body:
                    targets = s.targets if isinstance(s, ast.Assign) else (
                        [s.target] if isinstance(s, ast.AnnAssign) and s.value and module_level else [])
                    for t in targets:
                        if isinstance(t, ast.Name):
                            self._bindings[t.id].append(s.value)
            stores = defaultdict(int)
            for n in self.nodes[ast.Name]:
                if not isinstance(n.ctx, ast.Load):
                    stores[n.id] += 1
            for name in list(self._bindings):
                if stores[name] != len(self._bindings[name]) or name in self.defined_attrs:
                    del self._bindings[name]
        return self._bindings

    def dotted(self, node: ast.AST) -> str | None:
        """``r.choice`` -> "random.choice" when ``import random as r``; getattr(m, "x") is m.x."""
        parts = []
        while True:
            if isinstance(node, ast.Attribute):
                parts.append(node.attr)
                node = node.value
            elif isinstance(node, ast.Call) and _is_getattr(node) and _const_name(node):
                parts.append(_const_name(node))
                node = node.args[0]
            elif isinstance(node, ast.Name) and node.id in self.aliases:
                return ".".join([self.aliases[node.id], *reversed(parts)])
            else:
                return None


def _is_getattr(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id in C.ATTRIBUTE_BUILTINS


def _const_name(call: ast.Call) -> str | None:
    """The attribute name of ``getattr(obj, "name", ...)`` when it is a plain string literal."""
    if len(call.args) >= 2 and not any(isinstance(a, ast.Starred) for a in call.args[:2]):
        arg = call.args[1]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
    return None


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _internal(name: str) -> bool:
    return (name.startswith("_") and not _is_dunder(name)) or name in _MODULE_ATTRS


def attr_problem(m: "_Module", name: str) -> str | None:
    """Why env code may not read the attribute ``name`` of a value (None when it may): dunders
    and frame/code internals reach globals and frames; an underscore name the file does not
    define reaches a library's internals (``Random._randbelow`` is harmless, ``random._inst`` is
    the unseeded generator; the allow-list covers modules, this rule every other value)."""
    if _is_dunder(name):
        return f"the dunder attribute '.{name}'"
    if name in _FRAME_NAMES:
        return f"the frame/code internal '.{name}'"
    if name in _CACHE_STATS:
        return f"a cache's statistics '.{name}' (a process-wide counter every episode moves)"
    if name in m.defined:
        return None
    if name.startswith(_FRAME_PREFIXES):
        return f"the frame/code internal '.{name}'"
    if name.startswith("_") and name not in _NAMEDTUPLE_API:
        return f"the internal attribute '.{name}', which env.py does not define"
    return None


def _literal_strings(m: "_Module", node: ast.AST) -> list[str] | None:
    """The string literals ``node`` can only be: a literal, a module/class-level name bound
    only to literals (or to a list/tuple of them), an item or ``rng.choice`` of such a list."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else None
    if isinstance(node, (ast.List, ast.Tuple, ast.Dict)):
        parts = [_literal_strings(m, e) for e in (node.values if isinstance(node, ast.Dict) else node.elts)]
        return None if any(p is None for p in parts) else [x for p in parts for x in p]
    if isinstance(node, ast.Subscript):
        return _literal_strings(m, node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "choice" \
            and len(node.args) == 1:
        return _literal_strings(m, node.args[0])
    if isinstance(node, ast.Name) and (passed := _passed_literals(m, node)) is not None:
        return passed
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = node.id if isinstance(node, ast.Name) else node.attr
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name)
                                                    and node.value.id in ("self", "cls")):
            return None
        values = m.literal_bindings().get(name)
        if not values:
            return None
        parts = [_literal_strings(m, v) for v in values]
        return None if any(p is None for p in parts) else [x for p in parts for x in p]
    return None


def _passed_literals(m: "_Module", node: ast.Name) -> list[str] | None:
    """When ``node`` is a parameter of the function it is in, and every call of that function in
    the file passes it literals: those literals (``def f(fmt): fmt.format(...)`` with
    ``f("A-{}")``). None when the function is also used as a value, or a call passes anything else."""
    fn = m.parent.get(id(node))
    while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.Lambda)):
        fn = m.parent.get(id(fn))
    if not isinstance(fn, ast.FunctionDef) or any(
            isinstance(n, ast.Name) and n.id == node.id and not isinstance(n.ctx, ast.Load)
            for n in ast.walk(fn)):
        return None
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if node.id not in params:
        return None
    index, out = params.index(node.id), []
    for ref in m.nodes[ast.Name] + m.nodes[ast.Attribute]:
        if (ref.id if isinstance(ref, ast.Name) else ref.attr) != fn.name or not isinstance(ref.ctx, ast.Load):
            continue
        call = m.parent.get(id(ref))
        if not (isinstance(call, ast.Call) and call.func is ref):
            return None  # the function is passed around: its callers are unknown
        at = index - (1 if isinstance(ref, ast.Attribute) and params[:1] in (["self"], ["cls"]) else 0)
        arg = next((k.value for k in call.keywords if k.arg == node.id), None)
        if arg is None and 0 <= at < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:at + 1]):
            arg = call.args[at]
        texts = _literal_strings(m, arg) if arg is not None else None
        if texts is None:
            return None
        out += texts
    return out or None


_FIELD_ATTR = re.compile(r"\.([^.\[\]!:]+)")


def _format_fields(text: str) -> list[str]:
    """The attribute names that ``text.format(...)`` would read (``{0.name}`` -> ["name"])."""
    import string
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f]
    except ValueError:
        return []
    return [a for f in fields for a in _FIELD_ATTR.findall(f)]


def _at(check: str, node: ast.AST, text: str, make=error) -> tuple[ast.AST, Finding]:
    return node, make(check, f"line {node.lineno}: {text}")


def _named(node: ast.AST, dotted: str) -> str:
    """How the source spells a reference, and what it resolves to when that differs."""
    spelled = _spelled(node)
    return repr(spelled) if spelled == dotted else f"{spelled!r} ({dotted})"


def _spelled(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- rules


def check_imports(m: _Module):
    """Only allow-listed modules, imported by name; no reaching into their internals."""
    not_allowed = (f"env.py may import only: {_ALLOWED} (I/O and process access are the "
                   "sandbox's, not the env's)")
    for node in m.nodes[ast.Import]:
        for a in node.names:
            if a.name.split(".")[0] not in C.ALLOWED_IMPORTS:
                yield _at("static.import", node,
                          f"import of {a.name!r} is not allowed; {not_allowed}")
            elif a.name not in MODULE_NAMES:
                yield _at("static.import", node, f"import of the submodule {a.name!r} is not "
                          f"allowed (it reaches an allowed module's internals); import "
                          f"{a.name.split('.')[0]} and use its public names")
    for node in m.nodes[ast.ImportFrom]:
        mod = node.module or ""
        if node.level:
            yield _at("static.import", node, f"relative import 'from {'.' * node.level}{mod} "
                      "import ...' is not allowed; env.py is one file: import only the "
                      "allow-listed modules")
            continue
        if mod.split(".")[0] not in C.ALLOWED_IMPORTS:
            yield _at("static.import", node, f"import of {mod!r} is not allowed; {not_allowed}")
            continue
        for a in node.names:
            if a.name == "*":
                yield _at("static.import", node, f"star import 'from {mod} import *' is not "
                          "allowed: import the names you use explicitly")
            elif a.name.startswith("_") or a.name in _MODULE_ATTRS:
                yield _at("static.import", node, f"'from {mod} import {a.name}' reaches into the "
                          "internals of an allowed module; use only its public API")
            elif (a.name not in MODULE_NAMES.get(mod, ()) and f"{mod}.{a.name}" not in MODULE_NAMES
                  and not _reported(mod, a.name)):
                yield _at("static.import", node, _not_listed(mod, a.name))
    for node, d in m.refs:
        if not isinstance(node, ast.Name) and _internal(d.rsplit(".", 1)[-1]):
            yield _at("static.import", node, f"{_named(node, d)} reaches into the "
                      "internals of an allowed module; use only its public API")


def _reported(mod: str, name: str) -> bool:
    """Whether a more specific rule names ``mod.name`` (internals, evaluators, entropy)."""
    return (_internal(name) or f"{mod}.{name}" in _EVALUATORS
            or mod == "random" and name in C.RANDOM_GLOBAL_FUNCTIONS)


#: functools' process-wide caches (a fourth red team kept state in an lru_cache's entries, a dict
#: it handed out and changed, and leaked memory through an unbounded memo of every text)
_PROCESS_CACHES = frozenset({"functools.lru_cache", "functools.cache"})


def _not_listed(mod: str, name: str) -> str:
    if f"{mod}.{name}" in _PROCESS_CACHES:
        return (f"{mod}.{name} keeps what it returns for the whole process: its entries are state no "
                "episode owns and the gate cannot read (a dict it hands out can be changed and counted "
                "across episodes), and it grows with every new argument (training never repeats a "
                "seed); build an episode's data in reset, on self, or keep a table built once at import")
    names = MODULE_NAMES.get(mod)
    allowed = ", ".join(sorted(names)) if names else "nothing (it is not an allowed module)"
    return (f"{mod}.{name} is not among the names env.py may use from {mod} (what a module lets "
            f"code reach at run time is what is audited); allowed: {allowed}")


def check_reach(m: _Module):
    """A module is never a value: each use of a module name is ``module.NAME`` with NAME on the
    module's allow-list (MODULE_NAMES). Binding, passing, returning or storing a module, or any
    other name of it, would let code reach what the allow-list keeps out (typing.sys.modules)."""
    for node in m.nodes[ast.Name]:
        mod = m.modules.get(node.id)
        if mod is None or not isinstance(node.ctx, ast.Load) or mod.split(".")[0] not in C.ALLOWED_IMPORTS:
            continue
        at = node
        while True:
            parent = m.parent.get(id(at))
            if not (isinstance(parent, ast.Attribute) and parent.value is at):
                yield _at("static.import", node, f"the module {mod} is used as a value in "
                          f"{_spelled(parent if isinstance(parent, ast.expr) else node)!r}; a module "
                          f"may only be used as {mod}.NAME with an allowed NAME (a module value "
                          "reaches everything it imports)")
                break
            if f"{mod}.{parent.attr}" in MODULE_NAMES:
                mod, at = f"{mod}.{parent.attr}", parent
                continue
            if parent.attr not in MODULE_NAMES.get(mod, ()) and not _reported(mod, parent.attr):
                yield _at("static.import", parent, _not_listed(mod, parent.attr))
            break


def check_builtins(m: _Module):
    """No forbidden builtins in any spelling; getattr & co only with a literal, plain name."""
    bound = {n.id for n in m.nodes[ast.Name] if not isinstance(n.ctx, ast.Load)}
    bound |= {n.arg for n in m.nodes[ast.arg]}
    for node in m.nodes[ast.Name]:
        name = node.id
        if name in C.FORBIDDEN_BUILTINS:
            yield _at("static.builtin", node, f"{name!r} is a forbidden builtin (code execution, "
                      "I/O or scope introspection); env.py may not name it, not even to alias or "
                      "shadow it (rename the variable if it is yours)")
        elif name in C.ATTRIBUTE_BUILTINS and id(node) not in m.called:
            yield _at("static.builtin", node, f"{name} may only be called directly, as "
                      f"{name}(obj, \"name\"); passing it around hides which attribute is reached")
        elif (name in C.PROCESS_DEPENDENT_BUILTINS and isinstance(node.ctx, ast.Load)
              and name not in bound):
            yield _at("static.builtin", node, f"{name}() depends on the process (memory addresses,"
                      " PYTHONHASHSEED): keep it out of observations, rewards and infos",
                      make=warning)
    for node in m.nodes[ast.Attribute]:
        if (node.attr in C.FORBIDDEN_BUILTINS and not _is_dunder(node.attr)
                and node.attr not in _COMMON_METHODS):
            yield _at("static.builtin", node, f"{_spelled(node)!r} reaches the forbidden builtin "
                      f"{node.attr!r} as an attribute")
    for node in m.getattrs:
        name = _const_name(node)
        if name is None or node.keywords:
            yield _at("static.builtin", node, f"{_spelled(node)}: string-built attribute names "
                      f"are not allowed; call {node.func.id} with a string literal, e.g. "
                      f"{node.func.id}(obj, \"name\")")
        elif name in C.FORBIDDEN_BUILTINS:
            yield _at("static.builtin", node, f"{_spelled(node)} looks up the forbidden builtin "
                      f"{name!r} by name")
    for node in m.nodes[ast.ImportFrom]:
        for a in node.names:
            if f"{node.module}.{a.name}" in _EVALUATORS and not node.level:
                yield _at("static.builtin", node, f"{node.module}.{a.name} evaluates strings as code "
                          "with the builtins in scope; env.py may not import it")
    for node, d in m.refs:
        if d in _EVALUATORS:
            yield _at("static.builtin", node, f"{d} evaluates strings as code with the builtins "
                      "in scope; env.py may not use it")


def check_dunders(m: _Module):
    """No dunder or frame attributes, in code or in strings, and no type() with 3 arguments."""
    fix = "use the object's public API instead (dunder walks are how sandbox escapes start)"
    for node in m.nodes[ast.Attribute]:
        if _is_dunder(node.attr) and not (
                node.attr == "__init__" and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "super"):
            yield _at("static.dunder", node, f"access to dunder attribute '.{node.attr}' in "
                      f"{_spelled(node)!r} is not allowed (only super().__init__ is); {fix}")
        elif (isinstance(node.ctx, ast.Load) and not _is_dunder(node.attr) and not _through_module(m, node)
              and (problem := attr_problem(m, node.attr))):
            yield _at("static.dunder", node, f"{_spelled(node)!r} reads {problem}; {fix}")
    for node in m.nodes[ast.MatchClass]:  # `case object(__class__=c)` reads an attribute
        for name in node.kwd_attrs:
            if problem := attr_problem(m, name):
                yield _at("static.dunder", node, f"the pattern {name}=... in a case clause reads "
                          f"{problem}; {fix}")
        if node.patterns and not (isinstance(node.cls, ast.Name) and node.cls.id in _SELF_MATCHING
                                  and len(node.patterns) == 1):
            yield _at("static.dunder", node, f"the class pattern {_spelled(node)} has positional "
                      "sub-patterns: they read the attributes the class's __match_args__ names, "
                      "chosen at run time; use keyword patterns (case C(attr=x)) or isinstance")
    for node in m.nodes[ast.ClassDef]:
        for kw in node.keywords:
            if kw.arg == "metaclass":
                yield _at("static.dunder", node, f"class {node.name} sets metaclass=: a metaclass "
                          "runs code at class creation and redefines isinstance and attribute "
                          "lookup; env.py may not use one")
    for node in m.nodes[ast.Name]:
        if (_is_dunder(node.id) and node.id not in C.ALLOWED_DUNDER_NAMES
                and node.id not in C.FORBIDDEN_BUILTINS):
            yield _at("static.dunder", node, f"the dunder name {node.id!r} is not allowed; only "
                      f"{', '.join(sorted(C.ALLOWED_DUNDER_NAMES))} may be used as names")
    for node in m.getattrs:
        name = _const_name(node)
        on_module = isinstance(node.args[0], ast.Name) and node.args[0].id in m.modules
        if name and not (on_module and not _is_dunder(name)) and (problem := attr_problem(m, name)):
            yield _at("static.dunder", node, f"{_spelled(node)} reaches {problem} by name; {fix}")
    for node in m.nodes[ast.Constant]:
        if isinstance(node.value, str) and id(node) not in m.attr_consts:
            hit = _DUNDER_STRING.search(node.value) or _FORMAT_WALK.search(node.value)
            if hit:
                text = node.value if len(node.value) <= 60 else node.value[:57] + "..."
                yield _at("static.dunder", node, f"the string {text!r} contains "
                          f"{hit.group(0)!r}: format-string attribute walks and string-built "
                          "lookups of dunders are not allowed")
    for node in m.nodes[ast.Call]:
        if isinstance(node.func, ast.Name) and node.func.id == "type" and (
                len(node.args) != 1 or node.keywords or isinstance(node.args[0], ast.Starred)):
            yield _at("static.dunder", node, f"{_spelled(node)}: type() with 3 arguments creates "
                      "a class at run time; write a class statement (use type(x) only to read a "
                      "type)")


def check_lookups(m: _Module):
    """No attribute lookups by a run-time string: ``str.format``/``format_map`` read the
    attributes their fields name (``"{0.gi_frame}"``), so the format string must be one of the
    file's literals, and its fields pass the attribute rules."""
    for node in m.nodes[ast.Call]:
        f = node.func
        if not (isinstance(f, ast.Attribute) and f.attr in ("format", "format_map")):
            continue
        texts = _literal_strings(m, f.value)
        if texts is None:
            yield _at("static.dunder", node, f"{_spelled(node)}: .{f.attr}() on a string that is "
                      "not one of the file's literals can read attributes named at run time "
                      "(\"{0.attr}\"); use an f-string, or call it on a string literal")
            continue
        for text in texts:
            for name in _format_fields(text):
                if problem := attr_problem(m, name):
                    yield _at("static.dunder", node, f"{_spelled(node)}: the format field "
                              f".{name} reads {problem}")


def _maybe_none(node: ast.AST) -> bool:
    """Whether ``node`` can be None as written: ``None``, ``seed or None``, ``x if c else None``
    (random.Random(None) seeds from the OS, and seed 0 is falsy)."""
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, ast.BoolOp):
        return any(_maybe_none(v) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _maybe_none(node.body) or _maybe_none(node.orelse)
    return False


def _own(node: ast.Attribute) -> bool:
    """Whether ``node`` is ``self.NAME`` or ``cls.NAME``."""
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def check_format_values(m: _Module):
    """``.format``/``.format_map`` only called, never used as a value: ``partial(str.format)``,
    ``map("{}".format, ...)`` or a bound ``f = s.format`` reach a format call that check_lookups
    cannot see, whose fields (``{0.x.__globals__}``) read attributes named at run time."""
    called = {id(n.func) for n in m.nodes[ast.Call]}
    for node in m.nodes[ast.Attribute]:
        if node.attr in ("format", "format_map") and id(node) not in called:
            yield _at("static.dunder", node, f"{_spelled(node)} uses .{node.attr} as a value: a "
                      "format call reached that way can read attributes its fields name at run "
                      "time; call .format() directly on a string literal, or use an f-string")


#: a group without groups inside, quantified without a bound (``(...)+``, ``(...)*``, ``(...){2,}``)
_QUANTIFIED_GROUP = re.compile(r"(?<!\\)\((?:\?:)?((?:\\.|\[(?:\\.|[^\]])*\]|[^()\\])*)\)(?:[+*]|\{\d*,\})")
_ATOM = re.compile(r"(\\.|\[(?:\\.|[^\]])*\]|[^\\\[|])([+*?]|\{\d*(?:,\d*)?\})?\??")


def _ambiguous(pattern: str) -> bool:
    """Whether ``pattern`` repeats a group every atom of which is optional or repeated, one at
    least repeated (``(-+)+``, ``(a*)*``, ``([\\w.-]+\\s?)+``): such a group can split a run of
    characters in exponentially many ways, and a string that fails at its end tries them all. A
    group with a required atom (``(\\d+,)*``, ``(?:ab)+``) splits one way."""
    for g in _QUANTIFIED_GROUP.finditer(pattern):
        body = g.group(1)
        if not body or "|" in body:
            continue
        atoms = _ATOM.findall(body)
        if atoms and all(q for _, q in atoms) and any(q[:1] in ("+", "*") or q.endswith(",}") for _, q in atoms):
            return True
    return False


#: what a piece of a pattern the file does not show stands for: a required character (a field
#: filled at run time, ``re.escape(word)``), so that ``(?:{word}\s*)+`` is not read as ``(?:\s*)+``
_UNKNOWN = "\x00"


def _pattern_texts(m: _Module, node: ast.AST) -> list[str]:
    """The strings a pattern argument can be, as far as the file says without running it: a
    literal; a name bound (anywhere in the file) to such an expression; pieces joined by ``+``,
    an f-string or ``"sep".join([...])`` (a red team built a backtracking pattern from named
    pieces with ``+``). A piece not known stands for a required character; at most 64 strings,
    and a budget of 2,000 nodes looked at per pattern (a file of ``a = a + a`` lines doubles
    the work at each line)."""
    budget, memo = [2000], {}

    def texts(node: ast.AST, depth: int) -> list[str]:
        budget[0] -= 1
        if budget[0] < 0 or depth > 8:
            return [_UNKNOWN]
        if id(node) in memo:
            return memo[id(node)]
        memo[id(node)] = [_UNKNOWN]  # a name bound to itself ends here
        memo[id(node)] = out = look(node, depth)[:64] or [_UNKNOWN]
        return out

    def joined(parts: list[list[str]]) -> list[str]:
        out = [""]
        for part in parts:
            out = [a + b for a in out for b in part][:64]
        return out

    def look(node: ast.AST, depth: int) -> list[str]:
        if isinstance(node, ast.Constant):
            return [node.value] if isinstance(node.value, str) else []
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            values = [a.value for a in m.nodes[ast.Assign] if any(
                (x.id if isinstance(x, ast.Name) else x.attr) == name
                for x in a.targets if isinstance(x, (ast.Name, ast.Attribute)))][:8]
            return [t for v in values for t in texts(v, depth + 1)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return joined([texts(node.left, depth + 1), texts(node.right, depth + 1)])
        if isinstance(node, ast.JoinedStr):
            return joined([texts(v.value if isinstance(v, ast.FormattedValue) else v, depth + 1)
                           for v in node.values])
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
                and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)
                and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))):
            sep = node.func.value.value
            return joined([[(sep if i else "") + t for t in texts(e, depth + 1)]
                           for i, e in enumerate(node.args[0].elts)])
        return []

    return [t for t in texts(node, 0) if t != _UNKNOWN]


def check_regexes(m: _Module):
    """No ambiguous repeated group in a pattern given to ``re.*`` as a literal or through a name
    bound to one (``(-+)+$``, ``(a*)*``, ``([\\w.-]+\\s?)+``): on a long run of one character,
    or words that fail at the end, they backtrack exponentially, a step that never returns."""
    for node in m.nodes[ast.Call]:
        d = m.dotted(node.func) or ""
        if not d.startswith("re.") or not node.args:
            continue
        for text in _pattern_texts(m, node.args[0]):
            if _ambiguous(text):
                yield _at("bounded", node, f"{_spelled(node)}: the pattern {text[:60]!r} repeats a "
                          "group that can match the same characters in many ways (a quantifier inside "
                          "a quantified group, nothing required between), which backtracks "
                          "exponentially on a long run; make the repeated part match one way")
                break


def _through_module(m: _Module, node: ast.Attribute) -> bool:
    """Whether ``node`` is ``module.NAME`` (check_reach owns those)."""
    return isinstance(node.value, ast.Name) and node.value.id in m.modules


def check_entropy(m: _Module):
    """No unseeded randomness and no wall clock: randomness only from random.Random(seed)."""
    use_rng = "make rng = random.Random(seed) in reset and draw from rng"
    for node in m.nodes[ast.ImportFrom]:
        for a in node.names:
            if node.module == "random" and not node.level and a.name in C.RANDOM_GLOBAL_FUNCTIONS:
                yield _at("static.entropy", node, f"'from random import {a.name}' imports "
                          f"random.{a.name}, which uses the shared unseeded generator; {use_rng}")
    for node, d in m.refs:
        mod, _, name = d.rpartition(".")
        if mod == "random" and name in C.RANDOM_GLOBAL_FUNCTIONS:
            yield _at("static.entropy", node, f"{_named(node, d)} uses the shared unseeded "
                      f"generator (or the OS); {use_rng}")
    for node in m.nodes[ast.Attribute]:
        own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if node.attr in _CLOCK_ATTRS and not (own and node.attr in m.defined):
            d = m.dotted(node)
            yield _at("static.entropy", node, f"{_named(node, d) if d else repr(_spelled(node))} reads "
                      f"the wall clock (whatever it is reached through); no wall clock in an env: derive dates from the "
                      "seed (a fixed base date plus rng offsets)")
    for node in m.nodes[ast.Call]:
        seed = node.args[0] if node.args else next((k.value for k in node.keywords), None)
        unseeded = (seed is None or isinstance(seed, ast.Starred) or _maybe_none(seed)
                    or any(k.arg is None for k in node.keywords))  # Random(**{}): unseen seed
        if m.dotted(node.func) == "random.Random" and unseeded:
            yield _at("static.entropy", node, f"{_spelled(node)} makes a random.Random with no "
                      f"seed, so the OS seeds it; {use_rng}")
        elif (isinstance(node.func, ast.Attribute) and node.func.attr == "seed" and unseeded
              and not (_own(node.func) and "seed" in m.defined)):  # self.seed = ... disarms nothing
            yield _at("static.entropy", node, f"{_spelled(node)} re-seeds a generator from the "
                      f"OS; {use_rng}")


def check_shape(m: _Module, shape: dict) -> list[Finding]:
    """CAPABILITY, SKILLS, class Env with tools/reset/step/solve, max_turns, the docstring."""
    out = []
    values, _ = _bindings(m.tree.body)
    classes = {s.name: s for s in m.tree.body if isinstance(s, ast.ClassDef)}
    cap = values.get("CAPABILITY")
    if cap is None:
        out.append(error("contract.shape", "CAPABILITY is missing: add a module-level "
                         "CAPABILITY = \"<the capability this env trains>\""))
    elif isinstance(cap, ast.Constant) and isinstance(cap.value, str) and cap.value.strip():
        shape["capability"] = cap.value
    else:
        out.append(error("contract.shape", f"line {cap.lineno}: CAPABILITY must be a non-empty "
                         f"string literal, got {_spelled(cap)}"))
    if (skills := values.get("SKILLS")) is not None:
        problems = _skills_problems(skills)
        out += [error("contract.shape", f"line {skills.lineno}: SKILLS {p}; it must be a dict "
                      "literal of sub-skill name -> positive weight") for p in problems]
        if not problems:
            shape["skills"] = ast.literal_eval(skills)
    env = classes.get("Env")
    shape["has_env"] = env is not None
    if env is None:
        out.append(error("contract.shape", "no module-level class Env: define class Env with "
                         "tools, reset(self, seed), step(self, action) and solve(self, seed)"))
    else:
        out += _env_problems(env, classes, shape, values)
    doc = ast.get_docstring(m.tree)
    shape["docstring"] = doc is not None
    if doc is None:
        out.append(warning("contract.shape", "no module docstring: the contract wants one naming "
                           "the capability, with a 'Why it transfers:' rationale"))
    elif "why it transfers" not in doc.lower():
        out.append(warning("contract.shape", "the module docstring has no 'Why it transfers:' "
                           "rationale (3-5 sentences on why training here helps on the target)"))
    return out


def _bindings(stmts: list[ast.stmt]) -> tuple[dict, dict]:
    """Names assigned (name -> value node) and functions defined by a list of statements."""
    values, funcs = {}, {}
    for s in stmts:
        if isinstance(s, ast.Assign):
            values.update({t.id: s.value for t in s.targets if isinstance(t, ast.Name)})
        elif isinstance(s, ast.AnnAssign) and s.value and isinstance(s.target, ast.Name):
            values[s.target.id] = s.value
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs[s.name] = s
    return values, funcs


def _skills_problems(node: ast.expr) -> list[str]:
    if not isinstance(node, ast.Dict):
        return [f"is {_spelled(node)}, not a dict literal"]
    if not node.keys:
        return ["is empty (omit SKILLS, or name at least one sub-skill)"]
    problems = []
    for k, v in zip(node.keys, node.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value):
            problems.append(f"has the key {_spelled(k) if k else '**...'}, not a non-empty string")
            continue
        w = v.value if isinstance(v, ast.Constant) else None
        if not (isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0
                and math.isfinite(w)):
            problems.append(f"gives {k.value!r} the weight {_spelled(v)}, not a positive number")
    return problems


def _env_problems(env: ast.ClassDef, classes: dict, shape: dict, module: dict) -> list[Finding]:
    """Env's tools, methods and max_turns, looked up through base classes defined in this file
    (``module``: the module-level names). ``shape["tools"]`` gets the tools when they are a
    literal, directly or through a module-level name; else the dynamic stage reads them."""
    order, todo = [], [env]
    while todo:  # the class, then its bases in this file (depth first; a cycle stops)
        cls = todo.pop(0)
        if cls not in order:
            order.append(cls)
            todo += [classes[b.id] for b in cls.bases
                     if isinstance(b, ast.Name) and b.id in classes]
    values, funcs = {}, {}
    for cls in reversed(order):  # the most derived definition wins
        v, f = _bindings(cls.body)
        values.update(v)
        funcs.update(f)
    out = []
    if "tools" not in values:
        out.append(error("contract.shape", f"line {env.lineno}: class Env has no tools class "
                         "attribute: add tools = [...] (the OpenAI function schemas it offers)"))
    else:
        tools = values["tools"]
        tools = module.get(tools.id) if isinstance(tools, ast.Name) else tools
        try:
            tools = ast.literal_eval(tools) if tools is not None else None
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            tools = None
        shape["tools"] = tools if isinstance(tools, list) else None
    for name, params in C.ENV_METHODS.items():
        want = f"{name}(self, {', '.join(params)})"
        fn = funcs.get(name)
        if fn is None:
            out.append(error("contract.shape", f"line {env.lineno}: class Env has no method "
                             f"{want}"))
        elif isinstance(fn, ast.AsyncFunctionDef) or _bad_signature(fn.args, len(params)):
            out.append(error("contract.shape", f"line {fn.lineno}: Env.{name}"
                             f"({ast.unparse(fn.args)}) does not fit the contract: it must be a "
                             f"plain def {want} (extra parameters only with defaults)"))
    turns = values.get("max_turns")
    if turns is None:
        shape["max_turns"] = C.DEFAULT_MAX_TURNS
        return out
    try:
        value = ast.literal_eval(turns)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return out  # computed at import: the dynamic stage reads it
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= C.MAX_TURNS_LIMIT:
        shape["max_turns"] = value
    else:
        out.append(error("contract.shape", f"line {turns.lineno}: max_turns = {_spelled(turns)};"
                         f" it must be an int from 1 to {C.MAX_TURNS_LIMIT}"))
    return out


def _bad_signature(args: ast.arguments, n: int) -> bool:
    """True unless the function takes self plus ``n`` positional parameters (extras defaulted)."""
    positional = len(args.posonlyargs) + len(args.args)
    required = positional - len(args.defaults)
    too_few = positional < n + 1 and args.vararg is None
    return too_few or required > n + 1 or any(d is None for d in args.kw_defaults)

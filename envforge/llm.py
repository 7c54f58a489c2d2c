"""A small client for any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp
server), shared by the LLM stages (the LLM labeller of ``identify``, the synthesizer).

- Endpoint and key from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (or arguments); the model is
  always named by the caller (``--model``). A local server without a key gets a placeholder key.
- Retries with exponential backoff (and the server's ``Retry-After``) on 408, 409, 429, 5xx,
  timeouts and dropped connections; other errors (401 wrong key, 404 wrong URL or model, 400)
  fail at once with an :class:`LLMError` that says what to fix.
- An on-disk cache keyed by the sha256 of the request content (model, messages, parameters; not
  the endpoint or key): a re-run makes no calls and an interrupted run resumes where it stopped.
  Each entry is written atomically (a temporary file renamed into place), so a killed run never
  leaves a half-written entry.
- :meth:`LLMClient.complete`: the reply with the token usage the endpoint reported (kept in the
  cache entry too, so a cached re-run still knows what the answer cost) and whether it was cached.
- :meth:`LLMClient.chat_json`: a JSON reply checked against a JSON Schema; a reply that is not
  JSON or breaks the schema is answered with the problem and asked again (a bounded number of
  times). :func:`run_concurrently` maps calls over a thread pool, reporting progress.

The ``openai`` SDK is imported when the first client is made, never at ``import envforge``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from envforge.contract import canonical_json
from envforge.errors import EnvforgeError, UsageError
from envforge.progress import Progress, Step

PLACEHOLDER_KEY = "EMPTY"  # what local OpenAI-compatible servers accept when they check no key
RETRY_STATUSES = (408, 409, 429)  # and every 5xx


class LLMError(EnvforgeError):
    """The LLM endpoint could not be used: wrong key, wrong URL or model, or it kept failing."""


def default_cache_dir() -> Path:
    """``$ENVFORGE_CACHE/llm``, else ``$XDG_CACHE_HOME/envforge/llm``, else ``~/.cache/envforge/llm``."""
    if os.environ.get("ENVFORGE_CACHE"):
        return Path(os.environ["ENVFORGE_CACHE"]) / "llm"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "envforge" / "llm"


def request_key(request: dict) -> str:
    """The cache key of a request: sha256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(request).encode()).hexdigest()


@dataclass
class Completion:
    """One reply: its text, the endpoint's ``usage`` (prompt/completion/total tokens; None when
    the endpoint reports none) and whether it came from the cache."""
    content: str
    usage: dict | None = None
    cached: bool = False


@dataclass
class LLMStats:
    calls: int = 0        # requests that reached the server and were answered 200
    cache_hits: int = 0
    retries: int = 0      # attempts repeated after a 429, 5xx, timeout or dropped connection


class LLMClient:
    """Chat completions with retries and a content-addressed cache. Thread-safe.

    ``cache_dir=None`` uses :func:`default_cache_dir`; ``cache=False`` turns the cache off.
    ``rate_limit`` spaces requests to the server (not cache hits) at most that many per second.
    """

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float = 120.0, max_retries: int = 5, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, cache_dir: str | Path | None = None,
                 cache: bool = True, rate_limit: float | None = None):
        if not model:
            raise UsageError("no model given: name the model the endpoint serves with --model")
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if not base_url and not api_key:
            raise UsageError("no LLM endpoint configured: set OPENAI_API_KEY to use api.openai.com, "
                             "or OPENAI_BASE_URL (e.g. http://localhost:8000/v1 for vLLM) for an "
                             "OpenAI-compatible server")
        try:
            import openai
        except ImportError:
            raise UsageError("the LLM stages need the openai package: pip install openai") from None
        self._openai = openai
        self.model = model
        self.base_url = base_url or "https://api.openai.com/v1"
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.cache_dir = (Path(cache_dir) if cache_dir else default_cache_dir()) if cache else None
        self.stats = LLMStats()
        self._lock = threading.Lock()
        self._interval = 1.0 / rate_limit if rate_limit else 0.0
        self._next_slot = 0.0
        self._client = openai.OpenAI(api_key=api_key or PLACEHOLDER_KEY, base_url=self.base_url,
                                     timeout=timeout_s, max_retries=0)

    # ------------------------------------------------------------------ the one call

    def chat(self, messages: list[dict], **params: Any) -> str:
        """The assistant's reply text to ``messages`` (from the cache when this exact request
        was answered before). ``params`` are passed to the API (temperature, max_tokens, ...)."""
        return self.complete(messages, **params).content

    def complete(self, messages: list[dict], **params: Any) -> Completion:
        """Like :meth:`chat`, with the reply's token usage and whether it was cached."""
        request = {"model": self.model, "messages": messages, **params}
        key = request_key(request)
        cached = self._cache_get(key)
        if cached is not None:
            with self._lock:
                self.stats.cache_hits += 1
            return Completion(cached["response"]["content"], cached.get("usage"), cached=True)
        content, usage = self._call(request)
        self._cache_put(key, request, content, usage)
        return Completion(content, usage)

    def chat_json(self, messages: list[dict], schema: dict, *, repairs: int = 2,
                  prepare: Callable[[Any], Any] | None = None, **params: Any) -> tuple[Any, str | None]:
        """Ask for a JSON reply that satisfies ``schema``; on a reply that is not JSON or breaks
        the schema, answer with the problem and ask again, up to ``repairs`` times. ``prepare``
        maps the parsed reply before the check (to accept harmless variants).

        Returns the last (prepared) reply, None if none parsed, and the problem that remains
        (None when the reply is valid). Every exchange is cached like :meth:`chat`.
        """
        obj, problem = None, None
        for _ in range(repairs + 1):
            text = self.chat(messages, **params)
            try:
                obj = parse_json_reply(text)
                if prepare is not None:
                    obj = prepare(obj)
                problem = schema_problem(obj, schema)
            except ValueError as e:
                obj, problem = None, str(e)
            if problem is None:
                return obj, None
            messages = messages + [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"That reply cannot be used: {problem}. Reply again "
                                            "with only the JSON object."}]
        return obj, problem

    def _call(self, request: dict) -> tuple[str, dict | None]:
        oa = self._openai
        for attempt in range(self.max_retries + 1):
            self._wait_for_slot()
            try:
                resp = self._client.chat.completions.create(**request)
            except (oa.APIStatusError, oa.APIConnectionError) as e:  # timeouts are connection errors
                status = getattr(e, "status_code", None)
                if status is not None and status not in RETRY_STATUSES and status < 500:
                    raise self._fatal(e) from None
                if attempt == self.max_retries:
                    raise LLMError(f"{self.base_url}: {_why(e)} on {attempt + 1} attempts; "
                                   "lower --concurrency, check that the server is up, or retry "
                                   "later (answers so far are cached)") from None
                with self._lock:
                    self.stats.retries += 1
                time.sleep(self._delay(attempt, e))
                continue
            with self._lock:
                self.stats.calls += 1
            choices = getattr(resp, "choices", None)
            if not choices:
                raise LLMError(f"{self.base_url} answered with no choices; is it an OpenAI-compatible "
                               "chat-completions endpoint?")
            return choices[0].message.content or "", _usage(resp)
        raise AssertionError("unreachable")

    def _fatal(self, e: Exception) -> LLMError:
        status = getattr(e, "status_code", None)
        if status == 401:
            return LLMError(f"{self.base_url} rejected the API key (HTTP 401): set OPENAI_API_KEY "
                            "to a key this endpoint accepts")
        if status == 404:
            return LLMError(f"{self.base_url} answered 404 for model {self.model!r}: check "
                            f"OPENAI_BASE_URL (it usually ends in /v1) and --model ({_detail(e)})")
        return LLMError(f"{self.base_url} answered HTTP {status}: {_detail(e)}")

    def _wait_for_slot(self) -> None:
        if not self._interval:
            return
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next_slot)
            self._next_slot = slot + self._interval
        if slot > now:
            time.sleep(slot - now)

    def _delay(self, attempt: int, err: Exception) -> float:
        retry_after = None
        response = getattr(err, "response", None)
        if response is not None:
            try:
                retry_after = float(response.headers.get("retry-after"))
            except (TypeError, ValueError):
                retry_after = None
        base = min(self.max_backoff_s, self.backoff_s * 2 ** attempt)
        if retry_after is not None and 0 <= retry_after <= self.max_backoff_s:
            return max(retry_after, 0.0)
        return base * (0.5 + random.random() / 2)

    # ------------------------------------------------------------------ the cache

    def _path(self, key: str) -> Path:
        assert self.cache_dir is not None
        return self.cache_dir / key[:2] / f"{key}.json"

    def _cache_get(self, key: str) -> dict | None:
        """The cache entry for ``key`` when it holds a reply, else None."""
        if self.cache_dir is None:
            return None
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
            if isinstance(entry["response"]["content"], str):
                return entry
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def _cache_put(self, key: str, request: dict, content: str, usage: dict | None = None) -> None:
        if self.cache_dir is None:
            return
        entry = {"key": key, "request": request, "response": {"content": content},
                 "base_url": self.base_url, "time": time.time()}
        if usage is not None:
            entry["usage"] = usage
        atomic_write(self._path(key), json.dumps(entry, ensure_ascii=False))


@functools.cache
def umask() -> int:
    """The process's umask (read from /proc where it can be, since setting it to read it races
    with threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (making its folder) through a temporary file renamed into
    place, so that a killed run leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; the file gets the user's umask
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _usage(resp: Any) -> dict | None:
    """The token counts of a chat-completions response, when the endpoint reported them."""
    usage = getattr(resp, "usage", None)
    if usage is None:
        return None
    out = {k: getattr(usage, k, None) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    out = {k: v for k, v in out.items() if isinstance(v, int)}
    return out or None


def parse_json_reply(text: str) -> Any:
    """The JSON value in a model's reply (tolerates a code fence or prose around an object)."""
    s = (text or "").strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", s, re.S)
    if fence:
        s = fence.group(1).strip()
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        pass
    start, end = s.find("{"), s.rfind("}")
    if start >= 0 and end > start:
        try:
            return json.loads(s[start:end + 1])
        except json.JSONDecodeError:
            pass
    raise ValueError("the reply is not valid JSON")


def schema_problem(value: Any, schema: dict) -> str | None:
    """What is wrong with ``value`` under ``schema`` (up to 5 errors), or None."""
    import jsonschema
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    if not errors:
        return None
    return "; ".join(f"{'/'.join(map(str, e.path)) or 'reply'}: {e.message}" for e in errors[:5])


def run_concurrently(fn: Callable[[Any], Any], items: Sequence, concurrency: int,
                     progress: Progress | None = None, text: str = "") -> list:
    """``fn`` over ``items`` on ``concurrency`` threads; results in the order of ``items``. The
    first exception cancels the calls not yet started, waits for those in flight (their answers
    are cached) and is raised. ``progress`` gets ``Step(text, done=k, total=len(items))`` as
    each call finishes."""
    results: list = [None] * len(items)
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
    try:
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for done, fut in enumerate(as_completed(futures), 1):
            results[futures[fut]] = fut.result()
            if progress is not None:
                progress(Step(text, None, done, len(items)))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results


def _detail(err: Exception) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        if inner.get("message"):
            return str(inner["message"])
    return str(getattr(err, "message", err))


def _why(err: Exception) -> str:
    status = getattr(err, "status_code", None)
    if status:
        return f"HTTP {status}"
    return "timed out" if "Timeout" in type(err).__name__ else "could not connect"

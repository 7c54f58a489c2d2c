"""The settings of ``envforge synth`` (``envforge.synth.synthesize``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envforge.settings import Settings, setting

SYNTHESIZERS = ("auto", "template", "openai")


@dataclass
class SynthConfig(Settings):
    """Settings of ``envforge synth``. Defaults marked *paper* come from TRACE."""
    synthesizer: str = setting("auto", "auto: openai when OPENAI_BASE_URL/OPENAI_API_KEY and a "
                               "model are set, else the offline template synthesizer.",
                               choices=SYNTHESIZERS)
    model: str | None = setting(None, "The model the endpoint serves (endpoint and key from "
                                "OPENAI_BASE_URL / OPENAI_API_KEY).")
    attempts: int = setting(5, "LLM: attempts per capability, the first and its repairs (paper: "
                            "regenerate up to 5 times).", low=1, high=50)
    out_dir: str | Path = setting("generated_envs", "Folder of env folders (<out>/<slug>/env.py, "
                                  "manifest.json, report.json).")
    force: bool = setting(False, "Overwrite an env the gate accepted before.")
    seeds: int = setting(50, "Gate: seeds per dynamic property.", low=2, high=10_000)
    backend: str = setting("auto", "Gate: sandbox for the dynamic checks (as for audit).",
                           choices=("auto", "process", "docker"))
    concurrency: int = setting(4, "Capabilities synthesized at once.", low=1, high=64)
    temperature: float = setting(0.2, "LLM: sampling temperature.", low=0, high=2)
    max_tokens: int | None = setting(None, "LLM: the most tokens per reply.", low=1)
    timeout_s: float = setting(300.0, "LLM: seconds one request may take (then it is retried).",
                               low=1, high=3600)
    max_retries: int = setting(5, "LLM: retries of a 429/5xx/timeout.", low=0)
    cache_dir: str | None = setting(None, "LLM: cache folder (default ~/.cache/envforge/llm).")
    cache: bool = setting(True, "LLM: read and write the cache.")
    price_per_1k: tuple[float, float] | None = setting(None, "USD per 1,000 prompt and completion "
                                                       "tokens, for the manifest's cost.")

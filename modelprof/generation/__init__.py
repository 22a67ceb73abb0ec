"""Language models as they are run: prefill and decode, the KV cache, tokens per second."""

from __future__ import annotations

from modelprof.generation.compare import compare_generation
from modelprof.generation.profile import profile_generation
from modelprof.generation.report import GenerationReport

__all__ = ["GenerationReport", "compare_generation", "profile_generation"]

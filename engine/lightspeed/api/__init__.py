"""The Python API: LLM (sync), AsyncLLM, SamplingParams, outputs."""

from .async_llm import AsyncLLM
from .llm import LLM
from .outputs import CompletionOutput, Logprob, RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams, StructuredOutputParams

__all__ = ["LLM", "AsyncLLM", "CompletionOutput", "Logprob", "RequestOutput", "RequestOutputKind",
           "SamplingParams", "StructuredOutputParams"]

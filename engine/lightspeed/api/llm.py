"""LLM: the synchronous Python API. It runs one AsyncLLM on an asyncio loop in a background thread
and waits on it, so sync and async users share one code path.

    llm = LLM()                                      # default model, or LLM("path/or/file.gguf", dtype=...)
    outs = llm.generate(["Hello", "Bonjour"], SamplingParams(max_tokens=32, temperature=0))
    for out in llm.generate_stream("Hello", SamplingParams(max_tokens=32)):  # cumulative outputs
        ...
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=32))
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from .async_llm import AsyncLLM, PromptType
from .outputs import RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams

_END = object()
_STREAM_BUFFER = 4  # outputs generate_stream holds for a slow consumer before the pump waits


class LLM:
    def __init__(self, model: str | None = None, *, dtype: str = "auto", **engine_args: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lightspeed-llm-loop", daemon=True)
        self._thread.start()
        try:
            self._engine: AsyncLLM = self._call(self._make(model, dtype, engine_args))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(model, dtype, engine_args) -> AsyncLLM:
        return AsyncLLM(model, dtype=dtype, **engine_args)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- public API ------------------------------------------------------------------------------
    @property
    def engine(self) -> AsyncLLM:
        return self._engine

    def get_tokenizer(self) -> Any:
        return self._engine.get_tokenizer()

    def stats(self) -> dict[str, Any]:
        return self._engine.stats()

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids) concurrently; outputs in prompt order."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        return self._call(self._generate_all(prompts, params, use_tqdm))

    async def _generate_all(self, prompts: list, params: list[SamplingParams],
                            use_tqdm: bool = False) -> list[RequestOutput]:
        progress = None
        if use_tqdm:
            from tqdm import tqdm

            progress = tqdm(total=len(prompts), desc="requests", unit="req")

        async def one(prompt, p: SamplingParams) -> RequestOutput:
            final = None
            async for out in self._engine.generate(prompt, dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)):
                final = out
            if progress is not None:
                progress.update(1)
            return final

        tasks = [asyncio.ensure_future(one(pr, pa)) for pr, pa in zip(prompts, params, strict=True)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            if progress is not None:
                progress.close()

    def generate_stream(self, prompt: PromptType, sampling_params: SamplingParams | None = None,
                        request_id: str | None = None) -> Iterator[RequestOutput]:
        """Yield RequestOutputs for one prompt as they come (kind from sampling_params.output_kind).
        A consumer slower than the engine gets merged outputs, never a growing backlog: the pump takes
        the next output only once the consumer has room for it (at most _STREAM_BUFFER queued)."""
        results: queue.Queue = queue.Queue()
        room = threading.Semaphore(_STREAM_BUFFER)

        async def pump() -> None:
            loop = asyncio.get_running_loop()
            try:
                async for out in self._engine.generate(prompt, sampling_params, request_id):
                    if not room.acquire(blocking=False):
                        await loop.run_in_executor(None, room.acquire)
                    results.put(out)
            except BaseException as e:  # handed to the caller's thread
                results.put(e)
            finally:
                results.put(_END)

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                item = results.get()
                room.release()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not future.done():
                future.cancel()  # the consumer stopped early: aborts the request
            room.release()  # a pump waiting for room wakes up and sees the cancellation

    def chat(self, messages: list[dict] | Sequence[list[dict]], sampling_params: SamplingParams | None = None, *,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             tools: list[dict] | None = None) -> list[RequestOutput]:
        """Render one conversation (or a list of them) with the tokenizer's chat template and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [{"prompt_token_ids": self._engine.apply_chat_template(
            conv, chat_template=chat_template, add_generation_prompt=add_generation_prompt, tools=tools)}
            for conv in conversations]
        return self.generate(prompts, sampling_params)

    def shutdown(self) -> None:
        """Stop the engine core process and the background loop (idempotent)."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _as_prompt_list(prompts) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and isinstance(prompts[0], int):
        return [prompts]  # one prompt of token ids
    return prompts


def _as_params_list(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"{len(params)} sampling params for {n} prompts")
    return params

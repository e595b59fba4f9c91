"""AsyncLLM: the asynchronous Python API over one engine core process.

    llm = AsyncLLM()                                  # default model (SmolLM2-135M-Instruct)
    async for out in llm.generate("Hello", SamplingParams(max_tokens=32), request_id="r1"):
        print(out.outputs[0].text)                   # cumulative text by default

What generate yields is chosen by `SamplingParams.output_kind`: CUMULATIVE (default; every
RequestOutput carries everything so far), DELTA (only what is new since the last yield),
FINAL_ONLY (one output at the end). Leaving the `async for` early (break, cancellation, client
disconnect) aborts the request in the core and frees its KV pages at once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..config import EngineConfig
from ..core import messages as m
from ..core.client import EngineCoreClient
from ..core.errors import EngineDeadError
from ..envs import ENVS
from ..frontend.detokenizer import StepDetokenizer
from ..frontend.output_processor import RequestGroup, SequenceState
from ..frontend.preflight import check_engine_config
from ..frontend.tokenizer import (
    apply_chat_template,
    byte_level_tokenizer,
    check_vocab,
    eos_token_ids,
    load_tokenizer,
    resolve_model_path,
    tokenizer_source,
)
from .outputs import RequestOutput
from .sampling_params import SamplingParams

log = logging.getLogger("lightspeed")

PromptType = str | Sequence[int] | dict


class AsyncLLM:
    """Asynchronous engine client. Construct it anywhere; use it from one asyncio event loop."""

    def __init__(self, model: str | None = None, *, config: EngineConfig | None = None, **engine_args: Any):
        if config is None:
            config = EngineConfig(model=model, **engine_args)
        elif model is not None or engine_args:
            raise ValueError("pass either config=EngineConfig(...) or model/engine arguments, not both")
        if config.model is None:
            config = config.replace(model=resolve_model_path(None))
        self.config = config
        check_engine_config(config)
        self._core = EngineCoreClient(config)   # the core loads the model while we load the tokenizer
        try:
            source = tokenizer_source(config)
            tokenizer = load_tokenizer(source) if source is not None else None
            self.engine_info: m.Ready = self._core.wait_ready()
            if tokenizer is None:  # a dummy model without tokenizer files
                tokenizer = byte_level_tokenizer(self.engine_info.vocab_size)
            check_vocab(tokenizer, self.engine_info.vocab_size, source)
        except BaseException:
            self._core.close()
            raise
        self.tokenizer = tokenizer
        self.eos_token_ids = list(dict.fromkeys(
            [*self.engine_info.eos_token_ids, *eos_token_ids(self.tokenizer, config.model)]))
        # Detokenisation of big steps runs here, off the event loop (see frontend/detokenizer.py).
        self._detok_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="detok")
        self._detok = StepDetokenizer(self.tokenizer, self._detok_pool)
        self._seqs: dict[str, tuple[RequestGroup, SequenceState]] = {}
        self._groups: dict[str, RequestGroup] = {}
        self._output_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead: EngineDeadError | None = None
        self._stats: m.EngineStats | None = None
        self._closed = False
        try:  # constructed inside a running loop (gateway, LLM): start listening now, so stats flow
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            self._ensure_output_task()

    # -- public API ------------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self.engine_info.max_model_len

    @property
    def model_name(self) -> str:
        return str(self.config.model)

    @property
    def engine_pid(self) -> int:
        return self._core.pid

    @property
    def is_running(self) -> bool:
        return not self._closed and self._dead is None and self._core.is_alive()

    @property
    def errored(self) -> bool:
        return self._dead is not None or (not self._closed and not self._core.is_alive())

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> list[int]:
        return apply_chat_template(self.tokenizer, messages, **kwargs)

    async def generate(self, prompt: PromptType, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, *, priority: int = 0,
                       session_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream RequestOutputs for one prompt (text, token ids, or {"prompt"/"prompt_token_ids": ...}).
        `session_id` names the conversation: the scheduler keeps its cached prefix longer under
        eviction pressure (EngineConfig.session_retention)."""
        params = sampling_params or SamplingParams()
        group = self._add_request(prompt, params, request_id, priority, session_id)
        try:
            while True:
                await group.event.wait()
                group.event.clear()
                if group.error is not None:
                    raise group.error
                out = group.build_output()
                if out is not None:
                    yield out
                    if out.finished:
                        return
                elif group.finished:
                    return
        finally:
            self._release(group)

    async def abort(self, request_id: str | Sequence[str]) -> None:
        """Abort requests by id; their generators finish with finish_reason "abort"."""
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            group = self._groups.get(rid)
            if group is None:
                continue
            for seq in group.seqs:
                seq.finish("abort")
                group.touch(seq.index)
            self._abort_in_core([s.engine_id for s in group.seqs])

    def stats(self) -> dict[str, Any]:
        """Latest metrics snapshot of the core (running, waiting, kv_usage, prefix hits, ...) plus client counts."""
        snap: dict[str, Any] = {f: getattr(self._stats, f) for f in m.EngineStats.__struct_fields__} if self._stats else {}
        snap.update(num_client_requests=len(self._groups), engine_alive=self.is_running,
                    max_model_len=self.max_model_len, num_device_pages=self.engine_info.num_device_pages)
        return snap

    def shutdown(self) -> None:
        """Stop the engine core process and release sockets (idempotent)."""
        if self._closed:
            return
        self._closed = True
        task = self._output_task
        if task is not None and not task.done():
            try:
                on_its_loop = asyncio.get_running_loop() is task.get_loop()
            except RuntimeError:
                on_its_loop = False
            if on_its_loop:  # cancel its socket poll now, before the sockets close under it
                task.cancel()
            else:
                task.get_loop().call_soon_threadsafe(task.cancel)
        self._fail_all(EngineDeadError("the engine was shut down"))
        self._core.close()
        self._detok_pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:  # the core client's finalizer does the real work
        pass

    # -- internals ---------------------------------------------------------------------------------
    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer(prompt).input_ids)
        ids = [int(t) for t in prompt]
        return None, ids

    def _check_alive(self) -> None:
        if self._closed:
            raise EngineDeadError("the engine was shut down")
        if self._dead is not None:
            raise self._dead

    def _add_request(self, prompt: PromptType, params: SamplingParams, request_id: str | None,
                     priority: int, session_id: str | None = None) -> RequestGroup:
        self._check_alive()
        self._ensure_output_task()
        prompt_text, prompt_ids = self._tokenize(prompt)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        request_id = request_id or f"req-{uuid.uuid4().hex[:16]}"
        if request_id in self._groups:
            raise ValueError(f"request id {request_id!r} is already running")
        if params.max_tokens is None:
            max_tokens = max(1, self.max_model_len - len(prompt_ids))
        else:
            max_tokens = params.max_tokens
        seqs, messages = [], []
        for i in range(params.n):
            engine_id = request_id if params.n == 1 else f"{request_id}#{i}"
            seqs.append(SequenceState(engine_id, i, params, self.tokenizer, prompt_ids))
            seed = None if params.seed is None else params.seed + i
            messages.append(m.AddRequest(engine_id, prompt_ids, self._spec(params, max_tokens, seed), priority,
                                         session_id))
        group = RequestGroup(request_id, prompt_text, prompt_ids, params, seqs)
        self._groups[request_id] = group
        for seq in seqs:
            self._seqs[seq.engine_id] = (group, seq)
        for msg in messages:
            self._core.send(msg)
        return group

    def _spec(self, p: SamplingParams, max_tokens: int, seed: int | None) -> m.SamplingSpec:
        kind, spec = p.structured_output.kind_and_spec() if p.structured_output is not None else (None, None)
        return m.SamplingSpec(
            max_tokens=max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=max(p.top_k, 0), min_p=p.min_p,
            seed=seed, min_tokens=p.min_tokens, presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty, repetition_penalty=p.repetition_penalty,
            logit_bias=p.logit_bias or None, logprobs=p.logprobs, stop_token_ids=list(p.stop_token_ids),
            eos_token_ids=self.eos_token_ids, ignore_eos=p.ignore_eos, structured_kind=kind,
            structured_spec=spec)

    def _release(self, group: RequestGroup) -> None:
        if self._groups.get(group.request_id) is not group:
            return
        del self._groups[group.request_id]
        live = [s.engine_id for s in group.seqs if s.finish_reason is None]
        for s in group.seqs:
            self._seqs.pop(s.engine_id, None)
        if live:  # the consumer left early: free the core's resources now
            self._abort_in_core(live)

    def _abort_in_core(self, engine_ids: list[str]) -> None:
        if engine_ids and self._dead is None and not self._closed:
            try:
                self._core.send(m.AbortRequests(engine_ids))
            except EngineDeadError:
                pass

    def _ensure_output_task(self) -> None:
        loop = asyncio.get_running_loop()
        if self._output_task is None or self._output_task.done():
            if self._loop is not None and self._loop is not loop and self._groups:
                raise RuntimeError("AsyncLLM is in use from another event loop")
            self._loop = loop
            self._output_task = loop.create_task(self._output_loop())

    async def _output_loop(self) -> None:
        poll_s = ENVS.engine_poll_interval_s
        try:
            while not self._closed:
                msg = await self._core.poll_output(poll_s)
                if msg is None:
                    if not self._core.is_alive():
                        raise EngineDeadError(
                            f"engine core (pid {self._core.pid}) died with exit code {self._core.proc.returncode}")
                    continue
                if isinstance(msg, m.StepOutputs):
                    await self._on_step(msg)
                elif isinstance(msg, m.RequestErrors):
                    for engine_id, error in msg.errors.items():
                        entry = self._seqs.get(engine_id)
                        if entry is not None:
                            entry[0].fail(ValueError(error))
                elif isinstance(msg, m.EngineFailure):
                    raise EngineDeadError(f"engine core failed:\n{msg.message}")
        except EngineDeadError as e:
            self._dead = e
            log.error("%s", e)
            self._fail_all(e)
        except asyncio.CancelledError:
            pass

    def _fail_all(self, error: BaseException) -> None:
        for group in list(self._groups.values()):
            if not group.finished:
                group.fail(error)

    async def _on_step(self, msg: m.StepOutputs) -> None:
        if msg.stats is not None:
            self._stats = msg.stats
        seqs, live = self._seqs, []
        cached, by_tier = msg.num_cached_tokens or {}, msg.cached_tokens_by_tier or {}
        for engine_id, token in zip(msg.request_ids, msg.token_ids, strict=True):
            entry = seqs.get(engine_id)
            if entry is None or entry[1].finish_reason is not None:
                continue  # aborted, released by its consumer, or stopped by a stop string
            if engine_id in cached:
                entry[0].note_cached(cached[engine_id], by_tier.get(engine_id))
            live.append((engine_id, token, *entry))
        decoded = [x for x in live if x[3].detok is not None]
        texts = iter(await self._detok.decode([x[3].detok for x in decoded], [x[1] for x in decoded]))
        lps, stopped = msg.logprobs or {}, []
        for engine_id, token, group, seq in live:
            text = next(texts) if seq.detok is not None else None
            if seq.finish_reason is not None:
                continue  # aborted while the step was being decoded
            if seq.append(token, lps.get(engine_id), text):
                stopped.append(engine_id)   # a stop string: the core still thinks it runs
            group.touch(seq.index)
        for engine_id, reason in (msg.finished or {}).items():
            entry = seqs.get(engine_id)
            if entry is not None:
                entry[1].finish(reason)
                entry[0].touch(entry[1].index)
        if stopped:
            self._abort_in_core([e for e in stopped if e not in (msg.finished or {})])


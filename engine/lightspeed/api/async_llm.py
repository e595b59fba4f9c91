"""AsyncLLM: the asynchronous Python API over one engine core process.

    llm = AsyncLLM()                                  # default model (SmolLM2-135M-Instruct)
    async for out in llm.generate("Hello", SamplingParams(max_tokens=32), request_id="r1"):
        print(out.outputs[0].text)                   # cumulative text by default

What generate yields is chosen by `SamplingParams.output_kind`: CUMULATIVE (default; every
RequestOutput carries everything so far), DELTA (only what is new since the last yield),
FINAL_ONLY (one output at the end). Leaving the `async for` early (break, cancellation, client
disconnect) aborts the request in the core and frees its KV pages at once.

Faults: a request the core rejects raises ValueError, one that fails while running raises
RequestFailedError; both end that request only. If the core dies every request raises
EngineDeadError, and `restart()` starts a fresh core (the gateway's supervisor calls it). Sends
never block the event loop: when the core's input queue is full they wait for room, and no more
requests are in flight than the core will queue (`max_num_seqs + max_queued_requests`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from ..config import EngineConfig
from ..core import messages as m
from ..core.client import EngineCoreClient
from ..core.errors import EngineDeadError, RequestFailedError
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
        if config.data_parallel_size > 1 and config.data_parallel_rank is None:
            raise ValueError("data_parallel_size > 1: serve with `lightspeed serve --data-parallel-size N` (the server "
                             "routes requests between the cores), or start one AsyncLLM per config of "
                             "lightspeed.data_parallel_configs(config)")
        self._start(config)
        self._finish_start()

    @classmethod
    def start_many(cls, configs: Sequence[EngineConfig]) -> list[AsyncLLM]:
        """One AsyncLLM per config, their engine cores started at once and then awaited: data-parallel
        cores that step together meet at their rendezvous while they load (see data_parallel_configs)."""
        llms: list[AsyncLLM] = []
        try:
            for config in configs:
                llm = cls.__new__(cls)
                llm._start(config)
                llms.append(llm)
            for llm in llms:
                llm._finish_start()
        except BaseException:
            for llm in llms:
                llm._core.close()
            raise
        return llms

    def _start(self, config: EngineConfig) -> None:
        if config.model is None:
            config = config.replace(model=resolve_model_path(None))
        self.config = config
        check_engine_config(config)
        self._core = EngineCoreClient(config)   # the core loads the model while we load the tokenizer

    def _finish_start(self) -> None:
        config = self.config
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
        # Engine requests sent and not yet released: the core never holds more than it will queue.
        self._num_in_flight = 0
        self._max_in_flight = config.max_num_seqs + config.max_queued_requests
        self._room = asyncio.Event()
        self._sends: set[asyncio.Task] = set()  # aborts waiting for room in the core's input queue
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
        group, messages = self._prepare(prompt, params, request_id, priority, session_id)
        await self._wait_for_room(len(messages))
        self._register(group)
        try:
            for msg in messages:
                await self._send(msg)
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
        """Stop the engine core process and release sockets (idempotent; from any thread)."""
        if self._closed:
            return
        loop = self._loop
        if loop is not None and loop.is_running() and not _on_loop(loop):
            # The loop watches the core's socket: let it close it, or it raises on a dead descriptor.
            asyncio.run_coroutine_threadsafe(self._shutdown_on_loop(), loop).result(timeout=60)
            return
        self._shutdown_here()

    async def _shutdown_on_loop(self) -> None:
        self._shutdown_here()

    def _shutdown_here(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._output_task is not None and not self._output_task.done():
            self._output_task.cancel()  # cancel its socket poll now, before the sockets close under it
        self._fail_all(EngineDeadError("the engine was shut down"))
        self._core.close()
        self._detok_pool.shutdown(wait=False, cancel_futures=True)

    async def stop_core(self) -> None:
        """Stop the engine core (what is left of a dead one, or a live one) and start none: its
        requests fail with EngineDeadError, as new ones do until `restart()` returns. Idempotent.
        Cores that share one rendezvous (data parallel with experts across them) must all be stopped
        before any is started again: a new rank would otherwise reach the old rank 0's store while
        that process is still going down, and hang in the rendezvous."""
        if self._closed:
            raise EngineDeadError("the engine was shut down")
        self._dead = self._dead or EngineDeadError("the engine core is restarting")
        self._fail_all(self._dead)
        task = self._output_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._core.aclose()

    async def restart(self) -> None:
        """Replace a dead engine core with a fresh one (same config and tokenizer). Requests of the old
        core have failed with EngineDeadError; new ones fail the same way until this returns."""
        await self.stop_core()
        core = EngineCoreClient(self.config)
        try:
            info = await asyncio.get_running_loop().run_in_executor(None, core.wait_ready)
        except BaseException:
            core.close()
            raise
        self._core, self.engine_info, self._stats = core, info, None
        self._output_task, self._dead = None, None
        self._ensure_output_task()

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

    def _prepare(self, prompt: PromptType, params: SamplingParams, request_id: str | None, priority: int,
                 session_id: str | None = None) -> tuple[RequestGroup, list[m.AddRequest]]:
        """Tokenise and check a request (ValueError); nothing is registered or sent yet."""
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
        return RequestGroup(request_id, prompt_text, prompt_ids, params, seqs), messages

    def _register(self, group: RequestGroup) -> None:
        self._check_alive()
        if group.request_id in self._groups:
            raise ValueError(f"request id {group.request_id!r} is already running")
        self._groups[group.request_id] = group
        for seq in group.seqs:
            self._seqs[seq.engine_id] = (group, seq)
        self._num_in_flight += len(group.seqs)

    async def _wait_for_room(self, n: int) -> None:
        """Back-pressure: wait while the core already holds as many requests as it will queue."""
        while self._num_in_flight and self._num_in_flight + n > self._max_in_flight:
            self._room.clear()
            await self._room.wait()
            self._check_alive()

    async def _send(self, msg: m.AddRequest | m.AbortRequests) -> None:
        """Send without blocking the loop: while the core's input queue is full, wait for room."""
        while True:
            self._check_alive()
            try:
                self._core.send(msg)
                return
            except zmq.Again:
                await asyncio.sleep(_SEND_RETRY_S)

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
        self._num_in_flight -= len(group.seqs)
        self._room.set()
        if live:  # the consumer left early: free the core's resources now
            self._abort_in_core(live)

    def _abort_in_core(self, engine_ids: list[str]) -> None:
        if not engine_ids or self._dead is not None or self._closed:
            return
        msg = m.AbortRequests(engine_ids)
        try:
            self._core.send(msg)
        except EngineDeadError:
            pass
        except zmq.Again:  # the core's input is full: an abort must not be lost, so send it when there is room
            task = asyncio.get_running_loop().create_task(self._send(msg))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    def _ensure_output_task(self) -> None:
        loop = asyncio.get_running_loop()
        if self._output_task is None or self._output_task.done():
            if self._loop is not None and self._loop is not loop and self._groups:
                raise RuntimeError("AsyncLLM is in use from another event loop")
            self._loop = loop
            self._output_task = loop.create_task(self._output_loop())

    async def _output_loop(self) -> None:
        """Deliver the core's messages until it dies or we close. An error that belongs to one request
        fails that request; one that belongs to no request is logged; neither ends delivery."""
        poll_s = ENVS.engine_poll_interval_s
        core = self._core
        try:
            while not self._closed:
                try:
                    msg = await core.poll_output(poll_s)
                except (zmq.ZMQError, OSError) as e:
                    raise EngineDeadError(f"lost the connection to the engine core ({e})") from None
                except Exception as e:  # msgspec.DecodeError and kin: one unreadable message
                    log.error("ignored an unreadable message from the engine core: %s", e)
                    continue
                if msg is None:
                    if not core.is_alive():
                        raise EngineDeadError(
                            f"engine core (pid {core.pid}) died with exit code {core.proc.returncode}")
                    continue
                try:
                    await self._dispatch(msg)
                except EngineDeadError:
                    raise
                except Exception as e:  # a bug on our side of one message: its requests fail, delivery goes on
                    log.exception("failed to deliver a message from the engine core")
                    self._fail_named(msg, RequestFailedError(f"output delivery failed: {type(e).__name__}"))
        except EngineDeadError as e:
            self._dead = e
            log.error("%s", e)
            self._fail_all(e)
        except asyncio.CancelledError:
            pass

    async def _dispatch(self, msg) -> None:
        if isinstance(msg, m.StepOutputs):
            await self._on_step(msg)
        elif isinstance(msg, m.RequestErrors):
            for engine_id, error in msg.errors.items():
                self._fail_seq(engine_id, ValueError(error))
            for engine_id, error in msg.failed.items():
                self._fail_seq(engine_id, RequestFailedError(error), "error")
        elif isinstance(msg, m.EngineFailure):
            log.error("engine core failed:\n%s", msg.message)  # the traceback is for the log only
            raise EngineDeadError(f"the engine core failed: {msg.reason} (see the log)" if msg.reason
                                  else "the engine core failed (see the log)")

    def _fail_seq(self, engine_id: str, error: BaseException, reason: str | None = None) -> None:
        entry = self._seqs.get(engine_id)
        if entry is None:
            return
        group, seq = entry
        if reason is not None:
            seq.finish(reason)
        group.fail(error)
        others = [s.engine_id for s in group.seqs if s.finish_reason is None and s is not seq]
        self._abort_in_core(others)  # the request as a whole failed: its other choices stop too

    def _fail_named(self, msg, error: BaseException) -> None:
        """Fail every request a core message names (so none waits for what that message carried)."""
        names = set(getattr(msg, "request_ids", ()) or ())
        for field in ("finished", "errors", "failed"):
            names.update(getattr(msg, field, None) or ())
        for engine_id in names:
            entry = self._seqs.get(engine_id)
            if entry is not None and entry[1].finish_reason is None:
                self._fail_seq(engine_id, error, "error")

    def _fail_all(self, error: BaseException) -> None:
        for group in list(self._groups.values()):
            if not group.finished:
                group.fail(error)

    async def _on_step(self, msg: m.StepOutputs) -> None:
        if msg.stats is not None:
            self._stats = msg.stats
        seqs, live = self._seqs, []
        cached, by_tier = msg.num_cached_tokens or {}, msg.cached_tokens_by_tier or {}
        # With speculative decoding a request's several tokens of one step come in a row: they
        # are decoded as one push and appended in order.
        for engine_id, token in zip(msg.request_ids, msg.token_ids, strict=True):
            if live and live[-1][0] == engine_id:
                live[-1][1].append(token)
                continue
            entry = seqs.get(engine_id)
            if entry is None or entry[1].finish_reason is not None:
                continue  # aborted, released by its consumer, or stopped by a stop string
            if engine_id in cached:
                entry[0].note_cached(cached[engine_id], by_tier.get(engine_id))
            live.append((engine_id, [token], *entry))
        decoded = [x for x in live if x[3].detok is not None]
        lps, stopped = msg.logprobs or {}, []
        try:
            texts = iter(await self._detok.decode([x[3].detok for x in decoded], [x[1] for x in decoded]))
        except Exception as e:  # the step's detokenisation failed: its requests fail, delivery goes on
            log.error("detokenising a step failed", exc_info=e)
            for engine_id, *_ in decoded:
                self._fail_seq(engine_id, RequestFailedError(f"detokenising the output failed ({type(e).__name__})"),
                               "error")
                stopped.append(engine_id)
            live, texts = [x for x in live if x[3].detok is None], iter(())
        for engine_id, tokens, group, seq in live:
            text = next(texts) if seq.detok is not None else None
            if seq.finish_reason is not None:
                continue  # aborted while the step was being decoded
            try:
                if _append_step(seq, tokens, lps.get(engine_id), text):
                    stopped.append(engine_id)   # a stop string: the core still thinks it runs
            except Exception as e:  # this request fails, delivery goes on
                log.error("request %s failed while its output was processed", engine_id, exc_info=e)
                self._fail_seq(engine_id, RequestFailedError(f"processing the output failed ({type(e).__name__})"),
                               "error")
                stopped.append(engine_id)
                continue
            group.touch(seq.index)
        for engine_id, reason in (msg.finished or {}).items():
            entry = seqs.get(engine_id)
            if entry is not None:
                entry[1].finish(reason)
                entry[0].touch(entry[1].index)
        if stopped:
            self._abort_in_core([e for e in stopped if e not in (msg.finished or {})])


def _append_step(seq, tokens: list[int], logprobs: list | None, text: str | None) -> bool:
    """Append one step's tokens of a request (several with speculative decoding) with their
    logprobs; the step's text goes with its last token. True when a stop string ended it."""
    logprobs = logprobs or [None] * len(tokens)
    for token, logprob in zip(tokens[:-1], logprobs, strict=False):
        seq.append(token, logprob, "" if text is not None else None)
    return seq.append(tokens[-1], logprobs[len(tokens) - 1] if len(logprobs) >= len(tokens) else None, text)


_SEND_RETRY_S = 0.005  # how often a send retries while the core's input queue is full


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False

"""End-to-end through the engine core process on a tiny random Llama (SmolLM2's tokenizer)."""

import asyncio
import os
import re
import time

import pytest
from lightspeed import LLM, EngineDeadError, RequestOutputKind, SamplingParams, StructuredOutputParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_dir, default_model_path):
    engine = LLM(tiny_model_dir, load_format="dummy", tokenizer=default_model_path, kv_cache_memory="32MiB",
                 max_num_seqs=16, max_model_len=256, page_size=16, chunked_prefill_size=64, num_threads=1)
    yield engine
    engine.shutdown()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


def _wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_greedy_is_deterministic_and_batch_independent(llm):
    prompts = ["The quick brown fox", "Hello", "One two three four five six seven eight nine ten"]
    alone = [llm.generate(p, GREEDY)[0] for p in prompts]
    batched = llm.generate(prompts, GREEDY)
    for a, b in zip(alone, batched, strict=False):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert len(a.outputs[0].token_ids) == 12 and a.outputs[0].finish_reason == "length"
        assert a.outputs[0].text == llm.get_tokenizer().decode(a.outputs[0].token_ids, skip_special_tokens=True)
    assert batched[1].prompt == "Hello" and batched[1].prompt_token_ids == llm.get_tokenizer()("Hello").input_ids


def test_token_id_prompts_and_long_prompt_chunked(llm):
    ids = list(range(100, 300))  # 200 tokens: several 64-token prefill chunks
    out = llm.generate([ids], GREEDY)[0]
    again = llm.generate({"prompt_token_ids": ids}, GREEDY)[0]
    assert out.prompt is None and out.prompt_token_ids == ids
    assert out.outputs[0].token_ids == again.outputs[0].token_ids
    assert again.num_cached_tokens >= 192  # 12 full pages reused from the prefix cache


def test_seeded_sampling_is_reproducible(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)
    a = llm.generate("Once upon a time", p)[0].outputs[0].token_ids
    b = llm.generate("Once upon a time", p)[0].outputs[0].token_ids
    c = llm.generate("Once upon a time", SamplingParams(temperature=1.0, seed=99, max_tokens=16,
                                                       ignore_eos=True))[0].outputs[0].token_ids
    assert a == b and a != c
    # Seeds are per request: the same seeded request inside a different batch gives the same tokens.
    batch = llm.generate(["Once upon a time", "filler prompt"], [p, SamplingParams(temperature=1.0, max_tokens=16)])
    assert batch[0].outputs[0].token_ids == a


def test_n_completions_share_the_prompt(llm):
    outs = llm.generate("Tell me", SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True))
    assert len(outs) == 1 and [c.index for c in outs[0].outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1


def test_stop_strings(llm):
    full = llm.generate("A B C D", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    text = full.text
    assert len(text) > 8
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = llm.generate("A B C D", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop]))[0]
    out = cut.outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    kept = llm.generate("A B C D", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=stop,
                                                  include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == text[: text.index(stop) + len(stop)]
    assert len(out.token_ids) < 24


def test_logprobs_and_logit_bias_and_min_tokens(llm):
    out = llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=5, logprobs=3, ignore_eos=True))[0].outputs[0]
    assert len(out.logprobs) == 5
    for token, entry in zip(out.token_ids, out.logprobs, strict=False):
        assert entry[token].rank == 1 and entry[token].logprob <= 0.0 and len(entry) >= 3
        assert max(e.logprob for e in entry.values()) == entry[token].logprob
    biased = llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=4, logit_bias={4242: 100.0},
                                               ignore_eos=True))[0].outputs[0]
    assert biased.token_ids == [4242] * 4
    eos = llm.get_tokenizer().eos_token_id
    early = llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=20, logit_bias={eos: 100.0}))[0].outputs[0]
    assert early.token_ids == [eos] and early.finish_reason == "stop"
    late = llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=20, min_tokens=5,
                                             logit_bias={eos: 100.0}))[0].outputs[0]
    assert len(late.token_ids) == 6 and late.token_ids[-1] == eos and eos not in late.token_ids[:5]
    rep = llm.generate("Hi", SamplingParams(temperature=0.0, max_tokens=8, repetition_penalty=1.3,
                                            frequency_penalty=1.0, ignore_eos=True))[0].outputs[0]
    assert len(rep.token_ids) == 8


def test_structured_output_regex(llm):
    p = SamplingParams(temperature=1.0, seed=3, max_tokens=10, structured_output=StructuredOutputParams(regex="[0-9]{3}"))
    out = llm.generate("Three digits:", p)[0].outputs[0]
    assert re.fullmatch("[0-9]{3}", out.text), out.text
    assert out.finish_reason == "stop"
    obj = llm.generate("JSON:", SamplingParams(temperature=0.0, max_tokens=4,
                                              structured_output=StructuredOutputParams(json_object=True)))[0]
    assert obj.outputs[0].text.lstrip().startswith("{")


def test_random_weights_close_a_bounded_json_schema(llm):
    """Whitespace between JSON elements is bounded (JSON_MAX_WHITESPACE): unbounded, random weights
    spend every token on whitespace inside the object and it never closes."""
    import json

    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
              "properties": {"name": {"type": "string", "maxLength": 6},
                             "age": {"type": "integer", "minimum": 0, "maximum": 99},
                             "city": {"enum": ["Paris", "Oslo"]}}}
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=80,
                             structured_output=StructuredOutputParams(json_schema=schema)) for seed in range(4)]
    for out in llm.generate(["A person:"] * 4, params):
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop", text
        value = json.loads(text)
        assert set(value) == {"name", "age", "city"} and value["city"] in ("Paris", "Oslo"), value
        assert re.search(r"\s{17}", text) is None, text


def test_bad_requests_fail_alone(llm):
    good = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate([[5, 6, 10**7]], good)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[7] * 300], good)
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("x", SamplingParams(logit_bias={10**7: 1.0}))
    with pytest.raises(ValueError, match="regex|structured"):
        llm.generate("x", SamplingParams(structured_output=StructuredOutputParams(regex="(unclosed")))
    with pytest.raises(ValueError, match="top_p"):
        llm.generate("x", SamplingParams(top_p=0.0))

    async def mixed():
        engine = llm.engine
        async def run(prompt):
            async for out in engine.generate(prompt, good):
                last = out
            return last
        return await asyncio.gather(run([1, 2, 3]), run([1, 10**7]), run("still fine"), return_exceptions=True)

    ok1, bad, ok2 = llm._call(mixed())
    assert isinstance(bad, ValueError)
    assert len(ok1.outputs[0].token_ids) == 4 and len(ok2.outputs[0].token_ids) == 4


def test_streaming_cumulative_and_delta(llm):
    outs = list(llm.generate_stream("Stream me", SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)))
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 10
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    assert lengths == sorted(lengths) and not any(o.finished for o in outs[:-1])
    deltas = list(llm.generate_stream("Stream me", SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                                                                   output_kind=RequestOutputKind.DELTA)))
    assert sum((d.outputs[0].token_ids for d in deltas), []) == outs[-1].outputs[0].token_ids
    assert "".join(d.outputs[0].text for d in deltas) == outs[-1].outputs[0].text


def test_chat(llm):
    out = llm.chat([{"role": "user", "content": "Hello!"}], SamplingParams(temperature=0.0, max_tokens=3))[0]
    assert llm.get_tokenizer().decode(out.prompt_token_ids).endswith("<|im_start|>assistant\n")
    assert 1 <= len(out.outputs[0].token_ids) <= 3


def test_abort_frees_pages(tiny_model_dir, default_model_path):
    llm = LLM(tiny_model_dir, load_format="dummy", tokenizer=default_model_path, kv_cache_memory="8MiB",
              max_model_len=256, enable_prefix_cache=False, num_threads=1)
    try:
        engine = llm.engine

        def wait_stats(pred, timeout=10.0):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                s = llm.stats()
                if s and "free_device_pages" in s and pred(s):
                    return s
                time.sleep(0.05)
            raise AssertionError(f"stats never satisfied the condition: {llm.stats()}")

        idle = wait_stats(lambda s: s["num_running"] == 0)
        total_free = idle["free_device_pages"]

        async def start_then_abort():
            stream = engine.generate(list(range(50, 150)), SamplingParams(max_tokens=200, ignore_eos=True),
                                     request_id="victim")
            seen = 0
            async for out in stream:
                seen = len(out.outputs[0].token_ids)
                if seen >= 3:
                    await engine.abort("victim")
            return out

        last = llm._call(start_then_abort())
        assert last.finished and last.outputs[0].finish_reason == "abort"
        assert 3 <= len(last.outputs[0].token_ids) < 200
        wait_stats(lambda s: s["num_running"] == 0 and s["free_device_pages"] == total_free)

        # A consumer that walks away (break) also frees everything.
        def walk_away():
            for out in llm.generate_stream(list(range(10, 90)), SamplingParams(max_tokens=200, ignore_eos=True)):
                if len(out.outputs[0].token_ids) >= 2:
                    break
        walk_away()
        wait_stats(lambda s: s["num_running"] == 0 and s["free_device_pages"] == total_free)
    finally:
        llm.shutdown()


def test_engine_death_fails_requests_and_shutdown_leaves_no_orphan(tiny_model_dir, default_model_path):
    llm = LLM(tiny_model_dir, load_format="dummy", tokenizer=default_model_path, kv_cache_memory="8MiB",
              max_model_len=256, num_threads=1)
    pid = llm.engine.engine_pid
    assert _pid_alive(pid)
    stream = llm.generate_stream("die", SamplingParams(max_tokens=10_000 - 1, ignore_eos=True))
    next(stream)
    os.kill(pid, 9)
    with pytest.raises(EngineDeadError):
        for _ in stream:
            pass
    with pytest.raises(EngineDeadError):
        llm.generate("after death", GREEDY)
    llm.shutdown()
    assert _wait_gone(pid)


def test_shutdown_and_killed_client_leave_no_orphan(tiny_model_dir, default_model_path, tmp_path):
    import subprocess
    import sys

    llm = LLM(tiny_model_dir, load_format="dummy", tokenizer=default_model_path, kv_cache_memory="8MiB",
              max_model_len=256, num_threads=1)
    pid = llm.engine.engine_pid
    llm.shutdown()
    assert _wait_gone(pid)
    # A client killed with SIGKILL cannot clean up: the core must notice and exit by itself.
    script = tmp_path / "client.py"
    script.write_text(
        "import os, sys\nfrom lightspeed import LLM\n"
        f"llm = LLM({tiny_model_dir!r}, load_format='dummy', tokenizer={default_model_path!r}, "
        "kv_cache_memory='8MiB', max_model_len=256, num_threads=1)\n"
        "print(llm.engine.engine_pid, flush=True)\nsys.stdin.read()\n")
    client = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    core_pid = int(client.stdout.readline())
    assert _pid_alive(core_pid)
    client.kill()
    client.wait()
    assert _wait_gone(core_pid)
    # A script that simply ends without shutdown(): the finalizer stops the core at exit.
    script.write_text(script.read_text().replace("sys.stdin.read()", "llm.generate('bye')"))
    done = subprocess.run([sys.executable, str(script)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _wait_gone(int(done.stdout.split()[0]), timeout=5)


def test_session_id_is_a_hint_only(llm):
    """A request that names its session gets the same tokens (the hint only changes eviction order)."""
    prompt = list(range(40, 90))

    async def both():
        outs = []
        for session in (None, "conversation-1"):
            outs.append([out async for out in llm.engine.generate(prompt, GREEDY, session_id=session)][-1])
        return [out.outputs[0].token_ids for out in outs]

    plain, in_session = llm._call(both())
    assert plain == in_session and len(plain) == 12

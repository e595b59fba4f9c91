"""Start-up as a user meets it: dummy models serve text out of the box, vocabularies are checked,
and every start-up mistake is one ValueError line (checked in the caller before the core starts,
or reported by the core without its traceback)."""

import json
import time

import pytest
import torch
from lightspeed import LLM, AsyncLLM, EngineConfig, SamplingParams
from lightspeed.frontend.detokenizer import IncrementalDetokenizer
from lightspeed.frontend.tokenizer import byte_level_tokenizer, check_vocab, load_tokenizer, tokenizer_source

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def test_byte_level_fallback_encodes_any_text_and_decodes_any_id():
    tokenizer = byte_level_tokenizer(300)
    assert len(tokenizer) == 300
    text = "héllo wörld 😀 日本語\n\ttabs"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode()) and tokenizer.decode(ids) == text
    assert tokenizer.decode([299]) == "<|reserved_299|>"
    detok = IncrementalDetokenizer(tokenizer, [])
    assert "".join(detok.step([t]) for t in ids) == text  # multi-byte characters split across ids
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered == "<|user|>\nhi\n<|assistant|>\n"
    with pytest.raises(ValueError, match="too few"):
        byte_level_tokenizer(128)


def test_tokenizer_source_of_dummy_models(tmp_path, default_model_path):
    def config(model, **kw):
        return EngineConfig(model=model, load_format="dummy", **kw)

    assert tokenizer_source(config("tiny-llama")) is None  # a preset
    (tmp_path / "config.json").write_text("{}")
    assert tokenizer_source(config(str(tmp_path))) is None  # config only
    assert tokenizer_source(config(str(tmp_path / "config.json"))) is None
    assert tokenizer_source(config("tiny-llama", tokenizer=default_model_path)) == default_model_path
    (tmp_path / "tokenizer.json").write_text("{}")
    assert tokenizer_source(config(str(tmp_path))) == str(tmp_path)
    assert tokenizer_source(EngineConfig(model=default_model_path)) == default_model_path


def test_vocab_check_names_both_sizes(default_model_path):
    with pytest.raises(ValueError, match=r"49152 tokens but the model's vocabulary has 256.*--tokenizer"):
        check_vocab(load_tokenizer(default_model_path), 256, default_model_path)
    check_vocab(byte_level_tokenizer(256), 256, None)


def test_folder_without_tokenizer_files_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("kwargs,message", [
    ({"model": "/nonexistent/model"}, "does not exist"),
    ({"model": "Qwen/Qwen3-0.6B"}, "looks like a Hugging Face hub id"),
    ({"model": "no-such-preset", "load_format": "dummy"}, "nor a preset"),
])
def test_model_mistakes_fail_before_the_core_starts(kwargs, message):
    started = time.monotonic()
    with pytest.raises(ValueError, match=message):
        AsyncLLM(**kwargs)
    assert time.monotonic() - started < 5  # no engine core was started and waited for


def test_folder_without_weights_names_the_missing_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match=r"has no \*\.safetensors weights"):
        AsyncLLM(model=str(tmp_path))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_a_gpu_is_a_value_error():
    with pytest.raises(ValueError, match="no CUDA GPU"):
        AsyncLLM(model="tiny-llama", load_format="dummy", device="cuda")


def test_core_start_up_errors_are_one_line():
    with pytest.raises(ValueError) as info:
        LLM("tiny-llama", load_format="dummy", kv_cache_memory="64KiB", max_model_len=512, num_threads=1)
    message = str(info.value)
    assert "KV cache budget" in message and "Traceback" not in message and "\n" not in message


def test_mismatched_tokenizer_is_refused_at_start_up(default_model_path):
    with pytest.raises(ValueError, match="vocabulary has 256"):
        LLM("tiny-llama", load_format="dummy", tokenizer=default_model_path, kv_cache_memory="4MiB",
            num_threads=1)


@pytest.fixture(scope="module")
def preset_llm():
    engine = LLM("tiny-llama", load_format="dummy", kv_cache_memory="4MiB", num_threads=1, page_size=16)
    yield engine
    engine.shutdown()


def test_a_preset_serves_text_and_chat_out_of_the_box(preset_llm):
    out = preset_llm.generate(["hello there"], GREEDY)[0]
    assert len(out.outputs[0].token_ids) == 8 and isinstance(out.outputs[0].text, str)
    assert out.prompt_token_ids == list(b"hello there")
    chat = preset_llm.chat([{"role": "user", "content": "hi"}], GREEDY)[0]
    assert len(chat.outputs[0].token_ids) == 8
    # Structured output compiles its grammar from the same fallback tokenizer, in the core.
    from lightspeed import StructuredOutputParams

    shaped = preset_llm.generate(["x"], SamplingParams(max_tokens=6, temperature=0,
                                                       structured_output=StructuredOutputParams(regex="[ab]{6}")))[0]
    assert set(shaped.outputs[0].text) <= {"a", "b"} and len(shaped.outputs[0].text) == 6


def test_idle_kv_usage_counts_cached_pages_as_free(preset_llm):
    prompt = list(range(32, 32 + 5 * 16))  # five full pages stay in the prefix cache
    preset_llm.generate([prompt], GREEDY)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the core sends a fresh snapshot at least every second when idle
        stats = preset_llm.stats()
        if stats.get("num_running") == 0 and stats.get("kv_usage") == 0.0 and stats.get("cached_device_pages"):
            break
        time.sleep(0.2)
    assert stats["kv_usage"] == 0.0 and stats["cached_device_pages"] >= 5, stats
    assert stats["num_prefill_tokens"] >= len(prompt)

from types import SimpleNamespace

import pytest
from lightspeed.frontend.detokenizer import IncrementalDetokenizer, StopStringChecker
from lightspeed.frontend.tokenizer import apply_chat_template, eos_token_ids, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    return load_tokenizer(default_model_path)


def test_incremental_detokenizer_matches_full_decode(tokenizer):
    prompt = tokenizer("Translate:").input_ids
    text = " Héllo wörld 😀 日本語, naïve café!\n\tTabs  and  spaces."
    ids = tokenizer(text, add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer, prompt)
    streamed = "".join(detok.step([t]) for t in ids)
    assert streamed == tokenizer.decode(ids)


def test_slow_path_window_decoding(tokenizer):
    # A tokenizer without a fast backend goes through the window algorithm.
    slow = SimpleNamespace(decode=tokenizer.decode)
    ids = tokenizer(" multi-byte 😀 and 日本", add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(slow, [])
    assert "".join(detok.step([t]) for t in ids) == tokenizer.decode(ids)


def test_stop_strings():
    chk = StopStringChecker(["STOP", "\n\n"], include_stop_str_in_output=False)
    assert chk.check("hello ST", 2) is None
    assert chk.check("hello STOP and more", 12) == ("hello ", "STOP")
    assert chk.check("a\n\nb", 1) == ("a", "\n\n")
    inc = StopStringChecker(["STOP"], include_stop_str_in_output=True)
    assert inc.check("xxSTOPyy", 4) == ("xxSTOP", "STOP")
    assert chk.safe_len("abcdefST", finished=False) == len("abcdefST") - 3
    assert chk.safe_len("abc", finished=True) == 3
    assert StopStringChecker([], False).check("anything", 3) is None


def test_chat_template_and_eos(tokenizer, default_model_path):
    ids = apply_chat_template(tokenizer, [{"role": "user", "content": "hi"}])
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>") and text.rstrip().endswith("<|im_start|>assistant")
    assert tokenizer.eos_token_id in eos_token_ids(tokenizer, default_model_path)
    with pytest.raises(ValueError):
        load_tokenizer("/nonexistent/model")


def _kimi_style_folder(tokenizer, folder):
    """SmolLM2's tokenizer dressed as Kimi-K2's: `auto_map` to remote tokenizer code that must never
    run (it would write a marker file), a tiktoken.model beside it."""
    import json

    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    config["tokenizer_class"] = "TikTokenTokenizer"
    config_path.write_text(json.dumps(config))
    marker = folder / "remote_code_ran"
    (folder / "tokenization_kimi.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (folder / "tiktoken.model").write_text("IQ== 0\n")
    return marker


def test_remote_code_tokenizer_loads_its_tokenizer_json_without_running_code(tokenizer, tmp_path):
    marker = _kimi_style_folder(tokenizer, tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = "Hello, wörld"
    assert loaded(text).input_ids == tokenizer(text).input_ids
    assert loaded.chat_template == tokenizer.chat_template and loaded.eos_token_id == tokenizer.eos_token_id
    assert not marker.exists()


def test_remote_code_tokenizer_without_tokenizer_json_is_refused(tokenizer, tmp_path):
    marker = _kimi_style_folder(tokenizer, tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"remote code \(tiktoken.model, auto_map -> tokenization_kimi"
                                         r".TikTokenTokenizer.*does not execute remote code"):
        load_tokenizer(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("num_seqs", [3, 40])  # below and above the worker-thread threshold
def test_step_detokenizer_batches_a_step_across_sequences(tokenizer, num_seqs):
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from lightspeed.frontend.detokenizer import OFFLOAD_MIN_TOKENS, StepDetokenizer

    texts = [" Héllo wörld 😀 日本語, naïve café!", "<|im_end|> special <|im_start|>x", " tabs\t\tand  spaces\n"]
    outputs = [tokenizer(texts[i % 3] * (1 + i % 2), add_special_tokens=False).input_ids for i in range(num_seqs)]
    prompt = tokenizer("Translate:").input_ids
    detoks = [IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=i % 4 != 3) for i in range(num_seqs)]
    threads = set()
    pool = ThreadPoolExecutor(max_workers=1, initializer=lambda: threads.add(threading.current_thread().name))
    step_detok = StepDetokenizer(tokenizer, pool)
    streamed = [""] * num_seqs

    async def run():
        for step in range(max(map(len, outputs))):
            live = [i for i in range(num_seqs) if step < len(outputs[i])]
            pieces = await step_detok.decode([detoks[i] for i in live], [outputs[i][step] for i in live])
            for i, piece in zip(live, pieces, strict=True):
                streamed[i] += piece

    asyncio.run(run())
    for i in range(num_seqs):
        assert streamed[i] == tokenizer.decode(outputs[i], skip_special_tokens=i % 4 != 3)
    assert bool(threads) == (num_seqs >= OFFLOAD_MIN_TOKENS)  # big steps decode in the worker thread
    pool.shutdown()

"""Speculative decoding end to end in the engine: outputs with each drafter are exactly those
without (greedy: token for token on SmolLM2's real weights over a code-editing conversation;
sampled: the same tokens for a seed, under every sampling transform, and the same distribution
over seeds), under the synchronous and the overlapped loop."""

import json

import numpy as np
import pytest
import torch
from conftest_models import TINY_LLAMA
from engine_driver import Run, make_engine, run_until_idle, submit
from lightspeed.core import messages as m
from lightspeed.core.messages import SamplingSpec
from spec_helpers import write_random_eagle3_head

CODE = '''def add(a, b):
    """Return the sum of a and b."""
    return a + b


def scale(values, factor):
    return [v * factor for v in values]
'''
TURNS = [f"Here is utils.py:\n```python\n{CODE}```\nRename `add` to `plus` and print the whole file.",
         "Now also add a docstring to `scale` and print the file again."]
GREEDY = SamplingSpec(max_tokens=20, temperature=0.0, ignore_eos=True)
SMOL = dict(load_format="auto", kv_cache_memory="48MiB", max_model_len=1024)


def _conversation(engine, tokenizer) -> dict[str, list[int]]:
    """Two turns of one agent session: turn 2's prompt holds turn 1's answer (suffix drafting
    may match it across requests of the session)."""
    from lightspeed import apply_chat_template

    messages = [{"role": "system", "content": "You are a coding assistant. Answer with code only."}]
    outputs = {}
    for turn, text in enumerate(TURNS):
        messages.append({"role": "user", "content": text})
        prompt = apply_chat_template(tokenizer, messages)
        assert engine.add_request(m.AddRequest(f"t{turn}", prompt, GREEDY, session_id="session-1")) is None
        outputs[f"t{turn}"] = run_until_idle(engine).tokens[f"t{turn}"]
        messages.append({"role": "assistant", "content": tokenizer.decode(outputs[f"t{turn}"])})
    return outputs


@pytest.fixture(scope="module")
def smol(default_model_path, tmp_path_factory):
    from lightspeed import load_tokenizer
    from lightspeed.loader import load_model

    tokenizer = load_tokenizer(default_model_path)
    baseline = _conversation(make_engine(default_model_path, async_scheduling=False, **SMOL), tokenizer)
    _, config = load_model(default_model_path, progress=False)
    head = write_random_eagle3_head(tmp_path_factory.mktemp("eagle3") / "head", config)
    return default_model_path, tokenizer, baseline, head


@pytest.mark.parametrize("method, overlap", [("ngram", True), ("ngram", False), ("ngram_gpu", True),
                                             ("ngram_gpu", False), ("suffix", True), ("eagle3", True)])
def test_greedy_outputs_equal_without_speculation_on_real_weights(smol, method, overlap):
    path, tokenizer, baseline, head = smol
    config = {"method": method, "num_speculative_tokens": 4}
    if method == "eagle3":  # a random head: exactness, not acceptance; fewer chained passes on CPU
        config.update(model=str(head), num_speculative_tokens=2)
    engine = make_engine(path, async_scheduling=overlap, speculative_config=config, **SMOL)
    assert _conversation(engine, tokenizer) == baseline
    stats = engine.stats()
    assert stats.spec_num_draft_tokens > 0
    assert sum(n * c for n, c in enumerate(stats.spec_acceptance_lengths)) == \
        stats.spec_num_drafts + stats.spec_num_accepted_tokens
    if method != "eagle3":  # the model re-quotes the file: lookup drafts are accepted
        assert stats.spec_num_accepted_tokens > 0
    # The scheduler's KV bookkeeping survived every shift.
    engine.scheduler.check_invariants()


def test_host_drafters_collect_each_step_before_planning_the_next(smol):
    # n-gram / suffix drafts proposed behind a step in flight build on a guess of its outcome; the
    # engine steps one at a time with them even when async scheduling is on (grammars do the same).
    path, tokenizer, baseline, _ = smol
    engine = make_engine(path, async_scheduling=True, speculative_config={"method": "ngram",
                         "num_speculative_tokens": 4}, **SMOL)
    assert engine.runner.needs_host_tokens()
    prompt = [1, 2, 3]
    submit(engine, "a", prompt, GREEDY)
    run = run_until_idle(engine)
    assert run.overlapped_steps == 0 and len(run.tokens["a"]) == GREEDY.max_tokens


def test_device_ngram_drafts_keep_steps_overlapped_and_accept_like_the_host_drafter(smol):
    # ngram_gpu drafts on the device after each verification: the loop keeps overlapping, and its
    # drafts continue the true tokens, so acceptance does not fall as host drafts behind a step do.
    path, tokenizer, baseline, _ = smol
    accepted = {}
    for method, overlap in (("ngram", False), ("ngram_gpu", True)):
        engine = make_engine(path, async_scheduling=overlap, speculative_config={"method": method,
                             "num_speculative_tokens": 4}, **SMOL)
        assert engine.runner.needs_host_tokens() == (method == "ngram")
        assert _conversation(engine, tokenizer) == baseline
        stats = engine.stats()
        accepted[method] = stats.spec_num_accepted_tokens / max(1, stats.spec_num_draft_tokens)
    submit(engine, "a", [1, 2, 3], GREEDY)
    assert run_until_idle(engine).overlapped_steps > 0
    assert accepted["ngram_gpu"] >= 0.8 * accepted["ngram"] > 0, accepted


# A vocabulary restricted to 4 tokens by logit bias (the rest are ~e^-30 less likely), with a
# prompt that cycles through them: prompt lookup drafts the cycle, and acceptance is frequent.
CYCLE = [101, 102, 103, 104]
BIAS = {101: 30.0, 102: 29.0, 103: 28.5, 104: 27.0}
PEAKED = {101: 30.0, 102: 28.5, 103: 27.0, 104: 26.0}  # mostly 101: drafts of its own repeats hold
PROMPT = CYCLE * 12


@pytest.fixture(scope="module")
def small_vocab_model_dir(tmp_path_factory):
    """The tiny random Llama with a 1024-token vocabulary: the CPU sampler sorts every row's
    logits, so sampling hundreds of sequences stays quick."""
    folder = tmp_path_factory.mktemp("tiny-llama-1k")
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, "vocab_size": 1024}))
    return str(folder)


def _sampled(seed: int, **overrides) -> SamplingSpec:
    return SamplingSpec(**{"max_tokens": 12, "temperature": 1.0, "seed": seed, "logit_bias": BIAS,
                           "ignore_eos": True, **overrides})


TRANSFORMS = dict(top_k=3, top_p=0.95, min_p=0.01, presence_penalty=0.4, frequency_penalty=0.3,
                  repetition_penalty=1.2, min_tokens=6, stop_token_ids=[104], ignore_eos=False, eos_token_ids=[2])


def _run_seeds(engine, seeds, **overrides) -> Run:
    for seed in seeds:
        submit(engine, f"s{seed}", PROMPT, _sampled(seed, **overrides))
    return run_until_idle(engine)


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
NGRAM_GPU = {**NGRAM, "method": "ngram_gpu"}


@pytest.mark.parametrize("model, config, overlap", [
    ("tiny", NGRAM, False),
    ("tiny", NGRAM, True),
    ("tiny", NGRAM_GPU, True),
    ("tiny", {"method": "suffix", "num_speculative_tokens": 5}, True),
    ("tiny-deepseek-v3", {"method": "mtp", "num_speculative_tokens": 2}, True),
], ids=["ngram-sync", "ngram-overlap", "ngram_gpu-overlap", "suffix-overlap", "mtp-overlap"])
@pytest.mark.parametrize("overrides", [{}, TRANSFORMS], ids=["plain", "every-transform"])
def test_seeded_sampling_gives_the_same_tokens(small_vocab_model_dir, model, config, overlap, overrides):
    """The verifier's draw at each position is the engine's draw there without drafts."""
    name = small_vocab_model_dir if model == "tiny" else model
    seeds = range(8)
    overrides = {"logit_bias": PEAKED, **overrides}
    plain = _run_seeds(make_engine(name, max_num_seqs=8), seeds, **overrides)
    engine = make_engine(name, max_num_seqs=8, speculative_config=config, async_scheduling=overlap)
    spec = _run_seeds(engine, seeds, **overrides)
    assert spec.tokens == plain.tokens and spec.finished == plain.finished
    # Drafts are accepted (so the penalties' draft counts matter) where this workload lets them:
    # random MTP weights draft nothing useful; penalties make the overlapped guesses miss.
    if (config is NGRAM and not (overlap and overrides)) or config is NGRAM_GPU:
        assert engine.stats().spec_num_accepted_tokens > 0


def _chi_square_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample chi-square test of homogeneity of counts a, b over the same cells."""
    use = (a + b) > 0
    a, b = a[use].astype(float), b[use].astype(float)
    total = a + b
    ea, eb = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    stat = float(((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum())
    return float(torch.special.gammaincc(torch.tensor((use.sum() - 1) / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_sampled_outputs_follow_the_distribution_without_speculation(small_vocab_model_dir):
    """Different seeds for the two arms, so agreement is about distributions, not equal draws:
    per-position token counts and the joint of the first two positions, chi-square."""
    n = 400
    plain = _run_seeds(make_engine(small_vocab_model_dir, max_num_seqs=64), range(n, 2 * n), max_tokens=4)
    engine = make_engine(small_vocab_model_dir, max_num_seqs=64, speculative_config=NGRAM, async_scheduling=False)
    spec = _run_seeds(engine, range(n), max_tokens=4)
    assert engine.stats().spec_num_accepted_tokens > n // 4
    index = {t: i for i, t in enumerate(CYCLE)}

    def counts(run: Run, position: int) -> np.ndarray:
        return np.bincount([index[t[position]] for t in run.tokens.values()], minlength=4)

    for position in range(4):
        assert _chi_square_p(counts(spec, position), counts(plain, position)) > 1e-3, position

    def pairs(run: Run) -> np.ndarray:
        return np.bincount([4 * index[t[0]] + index[t[1]] for t in run.tokens.values()], minlength=16)

    assert _chi_square_p(pairs(spec), pairs(plain)) > 1e-3


def test_logprobs_are_those_of_the_kept_tokens(small_vocab_model_dir):
    def run(config):
        engine = make_engine(small_vocab_model_dir, speculative_config=config, async_scheduling=False)
        got = {"tokens": [], "logprobs": []}
        # long enough for drafts to be accepted between the drafter's back-offs (random weights)
        submit(engine, "a", PROMPT, _sampled(5, logprobs=2, max_tokens=40))
        while engine.has_work() or engine.has_pending_copies():
            out = engine.step()
            got["tokens"] += out.token_ids
            for entries in (out.logprobs or {}).values():
                got["logprobs"] += [(e.logprob, e.rank, e.top_ids) for e in entries]
        return engine, got

    _, plain = run(None)
    engine, spec = run(NGRAM)
    assert spec["tokens"] == plain["tokens"] and len(spec["logprobs"]) == 40
    for (lp_a, rank_a, top_a), (lp_b, rank_b, top_b) in zip(spec["logprobs"], plain["logprobs"], strict=True):
        assert rank_a == rank_b and top_a == top_b and abs(lp_a - lp_b) < 1e-4
    assert engine.stats().spec_num_accepted_tokens > 0


def test_device_drafts_fill_the_draft_slots_and_are_accepted(tiny_model_dir):
    """A stand-in model drafter that proposes the true greedy continuation: every draft of the
    device path (drafts gathered into the plan, provisional rows, verification) is accepted."""
    prompt = list(range(10, 50))
    plain = _run_one(make_engine(tiny_model_dir), prompt)["a"]
    engine = _oracle_engine(tiny_model_dir, prompt, plain)
    spec = run_until_idle(engine).tokens["a"]
    assert spec == plain
    stats = engine.stats()
    assert stats.spec_num_accepted_tokens >= stats.spec_num_draft_tokens * 0.8 > 0


def test_device_drafts_behind_a_partly_rejected_row_are_still_verified(tiny_model_dir):
    """Under overlap the row behind an in-flight row that rejected drafts moves down on the
    device; device drafts made after that verification continue its true last token, so they
    are verified, not voided (drafting the true next token, then wrong ones: every drafting row
    keeps exactly 2 tokens)."""
    prompt = list(range(10, 50))
    plain = _run_one(make_engine(tiny_model_dir), prompt)["a"]
    engine = _oracle_engine(tiny_model_dir, prompt, plain, right=1, async_scheduling=True)
    run = run_until_idle(engine)
    assert run.tokens["a"] == plain and run.overlapped_steps > 0
    lengths = engine.stats().spec_acceptance_lengths
    assert lengths[2] >= 5 and lengths[1] <= 1, lengths  # the last rows may be cut by max_tokens


def _run_one(engine, prompt):
    submit(engine, "a", prompt, GREEDY)
    return run_until_idle(engine).tokens


def _oracle_engine(model_dir, prompt, answer, right=None, **overrides):
    from lightspeed.spec.decoder import SpecDecoder
    from lightspeed.spec.model_drafter import ModelDrafter

    class Oracle(ModelDrafter):
        """Drafts the known answer after each row's last kept token (on the device, no host sync)."""

        def __init__(self, k, runner):
            self.k, self.lookahead, self.method = k, k, "oracle"
            self.drafts = torch.zeros(runner.sampling.temperature.shape[0], k, dtype=torch.int64)
            self.enabled = np.zeros(self.drafts.shape[0], dtype=bool)
            self._counts = np.zeros(self.drafts.shape[0], dtype=np.int32)
            self.sequence = torch.tensor(prompt + answer + [0] * (k + 2))

        def run(self, plan, t, tokens, accepted, keep, hidden=None):
            nd = int(plan.num_decodes)
            rows = np.concatenate([np.arange(nd), plan.sample_batch_rows[int(plan.num_decode_tokens):]])
            kept = torch.as_tensor(plan.query_start_loc[:nd].astype(np.int64)) + (accepted - 1 if accepted is not None
                                                                                 else 0)
            last = torch.cat([kept, torch.as_tensor(plan.logits_indices[int(plan.num_decode_tokens):].astype(np.int64))])
            after = t.positions[last] + 2  # the token after the bonus token
            index = (after[:, None] + torch.arange(self.k)).clamp(max=self.sequence.shape[0] - 1)
            drafts = self.sequence[index]
            if right is not None:  # only the first `right` drafts are the answer's tokens
                drafts[:, right:] = (drafts[:, right:] + 1) % 256
            self.drafts[torch.as_tensor(plan.req_slots[rows].astype(np.int64))] = drafts

    engine = make_engine(model_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 3}, **overrides)
    runner = engine.runner
    oracle = Oracle(3, runner)
    runner.spec = SpecDecoder(runner.spec.config, oracle, max_num_seqs=oracle.drafts.shape[0],
                              device=torch.device("cpu"), page_size=engine.config.page_size)
    submit(engine, "a", prompt, GREEDY)
    return engine


def test_speculative_metrics_reach_engine_stats(small_vocab_model_dir):
    engine = make_engine(small_vocab_model_dir, speculative_config=NGRAM, async_scheduling=False)
    _run_seeds(engine, range(4), max_tokens=8)
    stats = engine.stats()
    assert stats.spec_num_drafts > 0 and 0 < stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens
    assert len(stats.spec_acceptance_lengths) == 3 + 2 and stats.spec_acceptance_lengths[0] == 0
    plain = make_engine(small_vocab_model_dir).stats()
    assert plain.spec_num_drafts == 0 and plain.spec_acceptance_lengths == []



@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_failing_speculative_step_fails_its_requests_and_the_engine_carries_on(tiny_model_dir, overlap):
    """A launch that fails on a plan with draft rows: its stand-in result still advances the
    scheduler (every speculative row needs an accepted count), its requests fail alone."""
    engine = make_engine(tiny_model_dir, async_scheduling=overlap,
                         speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    runner, n = engine.runner, engine.config.num_request_slots
    draft_args, forward, calls = runner.draft_args, runner.forward, []

    def forced_drafts():
        calls.append(1)
        if len(calls) == 3:  # both requests decode by now: a plan whose rows carry drafts
            return {"num_draft_tokens": np.full(n, 2, np.int32), "draft_token_ids": np.zeros((n, 3), np.int32)}
        return draft_args()

    def failing(plan, tensors):
        if plan.num_decode_tokens > plan.num_decodes:
            raise RuntimeError("injected fault in a speculative step")
        return forward(plan, tensors)

    runner.draft_args, runner.forward = forced_drafts, failing
    for name, prompt in (("a", list(range(3, 40))), ("b", list(range(100, 105)))):
        submit(engine, name, prompt, GREEDY)
    run = run_until_idle(engine)
    assert run.finished == {"a": "error", "b": "error"}
    assert engine._guard.num_failed_steps == 1
    stats = engine.scheduler.stats()
    assert stats["free_device_pages"] + stats["cached_device_pages"] == engine.built.num_device_pages - 1
    engine.scheduler.check_invariants()
    runner.forward = forward
    prompt = list(range(7, 60))
    assert _run_one(engine, prompt)["a"] == _run_one(make_engine(tiny_model_dir), prompt)["a"]


def test_decode_rows_with_drafts_beside_a_prefill_stay_within_the_decode_kernel_limit(small_vocab_model_dir,
                                                                                    monkeypatch):
    """Found on the H200 (16 agentic conversations with n-gram drafts): with decode rows of 1 + k
    tokens and a prefill chunk in one step, the bound `decode tokens - decode rows + 1` passed the
    Triton decode kernel's 16 query tokens per row, and the step failed. Decode attention is now
    told the longest decode row from the host plan."""
    import lightspeed.layers.attention as attention

    calls = []
    real = attention.ops.attention_decode

    def spy(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, *, max_query_len, **kw):
        lens = torch.diff(query_start_loc).tolist()
        calls.append((max_query_len, max(lens), len(lens), q.shape[0]))
        return real(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, max_query_len=max_query_len, **kw)

    monkeypatch.setattr(attention.ops, "attention_decode", spy)
    k = NGRAM["num_speculative_tokens"]
    engine = make_engine(small_vocab_model_dir, max_num_seqs=16, max_num_batched_tokens=128,
                         speculative_config=NGRAM, async_scheduling=False)
    for seed in range(12):
        submit(engine, f"s{seed}", PROMPT, _sampled(seed, max_tokens=24))
    done = 0

    def late_prompts(engine, run):  # long prompts arrive while the others decode with drafts
        nonlocal done
        if run.steps in (3, 6) and done < 2:
            submit(engine, f"long{done}", list(range(3, 200)), _sampled(100 + done, max_tokens=4))
            done += 1

    run = run_until_idle(engine, on_step=late_prompts)
    assert all(len(run.tokens[f"s{seed}"]) == 24 for seed in range(12)) and len(run.tokens["long1"]) == 4
    # the case that failed: several drafting rows, more decode tokens than 16 + rows - 1
    assert any(tokens - rows + 1 > 16 and longest > 1 for _, longest, rows, tokens in calls)
    assert all(longest <= bound <= 1 + k for bound, longest, _, _ in calls)


def test_eagle3_on_a_model_shorter_than_its_default_feature_layers(tiny_model_dir, tmp_path):
    """Found on the H200: a 2-layer target gives the default feature layers (2, L/2, L-3) as (1, 1, 0);
    the forward kept each layer once (2H wide) while the head's fc takes 3H, so every drafting step
    failed. Each listed layer now contributes once per listing."""
    from lightspeed.models import ModelConfig

    head = write_random_eagle3_head(tmp_path / "head", ModelConfig.from_pretrained(tiny_model_dir))
    prompt = list(range(5, 40)) * 2
    plain = make_engine(tiny_model_dir)
    submit(plain, "a", prompt, GREEDY)
    engine = make_engine(tiny_model_dir, speculative_config={"method": "eagle3", "model": str(head),
                                                            "num_speculative_tokens": 3})
    assert engine.runner.model.model.aux_hidden_layers == (1, 1, 0)
    submit(engine, "a", prompt, GREEDY)
    run = run_until_idle(engine)
    assert not run.errors and run.tokens["a"] == run_until_idle(plain).tokens["a"]
    assert engine.stats().spec_num_draft_tokens > 0

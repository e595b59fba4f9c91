import pytest
import torch
from lightspeed_kernel import ops
from lightspeed_kernel.reference import rng


def _params(rows, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed0=0, offset=0):
    return dict(
        temperature=torch.full((rows,), float(temperature)),
        top_k=torch.full((rows,), top_k, dtype=torch.int32),
        top_p=torch.full((rows,), float(top_p)),
        min_p=torch.full((rows,), float(min_p)),
        seeds=torch.arange(seed0, seed0 + rows, dtype=torch.int64),
        offsets=torch.full((rows,), offset, dtype=torch.int64),
    )


def _sample(logits, **p):
    return ops.sample(logits, p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["seeds"], p["offsets"])


def _py_mix32(x):
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def test_rng_matches_uint32_arithmetic():
    # the int64 tensor arithmetic equals plain uint32 math (what a Triton kernel computes)
    values = [0, 1, 2, 12345, 0xFFFFFFFF, 0x80000000, 0xDEADBEEF]
    got = rng.mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [_py_mix32(v) for v in values]
    seeds = [0, 7, -1, 2**62 + 3, -(2**40)]
    offsets = [0, 1, 2**33, 5, 99]
    u = rng.uniform(torch.tensor(seeds), torch.tensor(offsets), 6)
    for row, (seed, offset) in enumerate(zip(seeds, offsets, strict=True)):
        s, o = seed & (2**64 - 1), offset & (2**64 - 1)
        key = _py_mix32((s & 0xFFFFFFFF) ^ 0x9E3779B9)
        key = _py_mix32(key ^ (s >> 32))
        key = _py_mix32(key ^ (o & 0xFFFFFFFF))
        key = _py_mix32(key ^ (o >> 32))
        for token in range(6):
            bits = _py_mix32(_py_mix32(token ^ key) ^ 0x85EBCA6B)
            assert u[row, token].item() == (2 * (bits >> 9) + 1) / 2**24


def test_rng_uniform_statistics():
    u = rng.uniform(torch.arange(64), torch.zeros(64, dtype=torch.int64), 4096)
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    hist = torch.histc(u, bins=16, min=0, max=1) / u.numel()
    assert (hist - 1 / 16).abs().max() < 0.005


def test_greedy_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(12, 1000)
    p = _params(12, temperature=0.0, top_k=5, top_p=0.5)
    assert torch.equal(_sample(logits, **p), logits.argmax(-1))


def test_seed_reproducible_and_offset_sensitive():
    torch.manual_seed(1)
    logits = torch.randn(64, 500)
    first = _sample(logits, **_params(64))
    assert torch.equal(first, _sample(logits.clone(), **_params(64)))
    other_offset = _sample(logits, **_params(64, offset=1))
    other_seed = _sample(logits, **_params(64, seed0=1000))
    assert (first != other_offset).sum() > 40 and (first != other_seed).sum() > 40
    # a row's draw does not depend on the rest of the batch
    alone = _sample(logits[5:6], **{k: v[5:6] for k, v in _params(64).items()})
    assert alone.item() == first[5].item()
    assert first.dtype == torch.int64


def test_mixed_rows_in_one_batch():
    logits = torch.randn(3, 50)
    p = _params(3)
    p["temperature"] = torch.tensor([0.0, 1.0, 0.7])
    p["top_k"] = torch.tensor([0, 1, 0], dtype=torch.int32)
    got = _sample(logits, **p)
    assert got[0] == logits[0].argmax() and got[1] == logits[1].argmax()  # top_k = 1 is greedy too
    assert ops.sample(
        torch.zeros(0, 5),
        *(torch.zeros(0),) * 1,
        torch.zeros(0, dtype=torch.int32),
        torch.zeros(0),
        torch.zeros(0),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
    ).shape == (0,)


PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


@pytest.mark.parametrize(
    "kw,allowed",
    [
        (dict(top_k=3), {0, 1, 2}),
        (dict(top_k=1), {0}),
        (dict(top_p=0.7), {0, 1}),
        (dict(top_p=0.8), {0, 1}),
        (dict(top_p=0.81), {0, 1, 2}),
        (dict(min_p=0.5), {0, 1}),
        (dict(min_p=0.2), {0, 1, 2}),
        (dict(top_p=0.6), {0, 1}),
        (dict(top_k=2, top_p=0.6), {0}),  # top-p over the renormalised top-2: 0.625, 0.375
        (dict(), {0, 1, 2, 3}),
    ],
)
def test_filters_mask_exactly(kw, allowed):
    rows = 4000
    logits = PROBS.log().repeat(rows, 1)
    drawn = set(_sample(logits, **_params(rows, **kw)).tolist())
    assert drawn == allowed


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_frequencies(temperature):
    torch.manual_seed(2)
    logits = torch.randn(8) * 1.5
    rows = 40000
    drawn = _sample(logits.repeat(rows, 1), **_params(rows, temperature=temperature))
    freq = torch.bincount(drawn, minlength=8).double() / rows
    expected = torch.softmax(logits.double() / temperature, -1)
    # 4.5 standard errors of a binomial proportion
    assert ((freq - expected).abs() <= 4.5 * (expected * (1 - expected) / rows).sqrt() + 1e-4).all()


def test_apply_penalties_against_loop():
    torch.manual_seed(3)
    rows, vocab = 4, 30
    logits = torch.randn(rows, vocab) * 3
    counts = torch.randint(0, 3, (rows, vocab), dtype=torch.int32)
    prompt = torch.rand(rows, vocab) < 0.3
    presence = torch.tensor([0.0, 0.5, 1.0, 0.0])
    frequency = torch.tensor([0.0, 0.2, 0.0, 0.7])
    repetition = torch.tensor([1.0, 1.3, 2.0, 0.8])
    expected = logits.clone()
    for s in range(rows):
        for v in range(vocab):
            x = expected[s, v].item()
            if prompt[s, v] or counts[s, v] > 0:
                x = x / repetition[s].item() if x > 0 else x * repetition[s].item()
            x -= frequency[s].item() * counts[s, v].item()
            x -= presence[s].item() * (1.0 if counts[s, v] > 0 else 0.0)
            expected[s, v] = x
    got = ops.apply_penalties(logits.clone(), counts, prompt, presence, frequency, repetition)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("top_n", [0, 1, 5])
def test_compute_logprobs(top_n):
    torch.manual_seed(4)
    logits = torch.randn(3, 40)
    ids = torch.tensor([0, 17, 39])
    token_lp, top_ids, top_lp = ops.compute_logprobs(logits, ids, top_n)
    ref = torch.log_softmax(logits.double(), -1)
    torch.testing.assert_close(token_lp.double(), ref[torch.arange(3), ids], rtol=1e-6, atol=1e-6)
    assert top_ids.shape == (3, top_n) and top_lp.shape == (3, top_n)
    if top_n:
        assert torch.equal(top_ids, ref.argsort(-1, descending=True)[:, :top_n])
        assert (top_lp[:, :-1] >= top_lp[:, 1:]).all()


@pytest.mark.gpu
def test_same_tokens_on_cpu_and_gpu():
    torch.manual_seed(5)
    logits = torch.randn(256, 4096) * 2
    p = _params(256, temperature=0.8, top_k=50, top_p=0.95, min_p=0.01)
    cpu = _sample(logits, **p)
    gpu = _sample(logits.cuda(), **{k: v.cuda() for k, v in p.items()})
    assert torch.equal(cpu, gpu.cpu())
    u_cpu = rng.uniform(p["seeds"], p["offsets"], 4096)
    assert torch.equal(u_cpu, rng.uniform(p["seeds"].cuda(), p["offsets"].cuda(), 4096).cpu())


def test_ties_at_the_top_k_cut_are_kept():
    # probabilities 0.4, 0.2, 0.2, 0.2: top_k = 2 keeps all three tied tokens, and top-p then sees
    # their whole mass (0.4 + 0.2 before the last tie = 0.8 < 0.85) whatever order sort() chose
    logits = torch.tensor([0.4, 0.2, 0.2, 0.2]).log().repeat(3000, 1)
    drawn = set(_sample(logits, **_params(3000, top_k=2)).tolist())
    assert drawn == {0, 1, 2, 3}
    drawn = set(_sample(logits, **_params(3000, top_k=2, top_p=0.55)).tolist())
    assert drawn == {0, 1, 2, 3}
    drawn = set(_sample(logits, **_params(3000, top_k=1, top_p=0.55)).tolist())
    assert drawn == {0}

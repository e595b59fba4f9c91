import pytest
import torch
from lightspeed_kernel.reference import sampling as ref
from lightspeed_kernel.triton import sampling


def _params(s, device, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    full = lambda v, dt: torch.full((s,), v, dtype=dt, device=device)  # noqa: E731
    return (
        full(temperature, torch.float32),
        full(top_k, torch.int32),
        full(top_p, torch.float32),
        full(min_p, torch.float32),
        torch.arange(s, dtype=torch.int64, device=device) * 7919 - 3,
        torch.arange(s, dtype=torch.int64, device=device) + (1 << 33),
    )


@pytest.mark.parametrize("s,v", [(0, 10), (1, 1), (3, 37), (4, 300)])
def test_penalties_match_reference(device, s, v):
    logits = torch.randn(s, v, device=device) * 3
    counts = torch.randint(0, 3, (s, v), dtype=torch.int32, device=device)
    prompt = torch.rand(s, v, device=device) < 0.3
    pres, freq = torch.rand(s, device=device), torch.rand(s, device=device)
    rep = 1 + torch.rand(s, device=device)
    want = ref.apply_penalties(logits.clone(), counts, prompt, pres, freq, rep)
    got = sampling.apply_penalties(logits, counts, prompt, pres, freq, rep)
    assert got.data_ptr() == logits.data_ptr()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


CASES = [
    {"temperature": 0.0},
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 1.0, "min_p": 0.1},
    {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.02},
    {"temperature": 1.0, "top_k": 1},
    {"temperature": 1.0, "top_p": 0.0},
]


@pytest.mark.parametrize("params", CASES)
@pytest.mark.parametrize("s,v", [(1, 1), (5, 50), (3, 700)])
def test_sample_matches_reference_exactly(device, params, s, v):
    logits = torch.randn(s, v, device=device) * 2
    args = _params(s, device, **params)
    want = ref.sample(logits, *args)
    got = sampling.sample(logits, *args)
    assert got.dtype == torch.int64
    assert torch.equal(got, want)


def test_sample_mixed_rows_and_reproducible(device):
    s, v = 6, 400
    logits = torch.randn(s, v, device=device)
    temp = torch.tensor([0.0, 1.0, 0.5, 1.2, 1.0, 2.0], device=device)
    top_k = torch.tensor([0, 0, 10, 0, 3, 50], dtype=torch.int32, device=device)
    top_p = torch.tensor([1.0, 0.95, 1.0, 0.5, 1.0, 0.7], device=device)
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.0, 0.01], device=device)
    seeds = torch.tensor([1, 2, 3, -4, 5, 1 << 40], dtype=torch.int64, device=device)
    offsets = torch.tensor([0, 5, 9, 2, 0, 7], dtype=torch.int64, device=device)
    args = (temp, top_k, top_p, min_p, seeds, offsets)
    got = sampling.sample(logits, *args)
    assert torch.equal(got, ref.sample(logits, *args))
    assert torch.equal(got, sampling.sample(logits, *args))
    # the seed and the offset both move the draw (over many rows, nearly always)
    many = torch.randn(64, v, device=device)
    ones = torch.ones(64, device=device)
    base = (ones, torch.zeros(64, dtype=torch.int32, device=device), ones, 0 * ones)
    ids = torch.arange(64, dtype=torch.int64, device=device)
    a = sampling.sample(many, *base, ids, ids)
    assert not torch.equal(a, sampling.sample(many, *base, ids + 1, ids))
    assert not torch.equal(a, sampling.sample(many, *base, ids, ids + 1))


@pytest.mark.parametrize("s,v,top_n", [(0, 10, 2), (1, 1, 1), (3, 50, 5), (2, 300, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs(device, s, v, top_n, dtype):
    logits = (torch.randn(s, v, device=device) * 3).to(dtype)
    tokens = torch.randint(0, v, (s,), device=device)
    got = sampling.compute_logprobs(logits, tokens, top_n)
    want = ref.compute_logprobs(logits, tokens, top_n)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("s,v", [(0, 10), (1, 1), (3, 37), (2, 4096), (3, 4097), (2, 9000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_matches_argmax(device, s, v, dtype):
    logits = (torch.randn(s, v, device=device) * 3).to(dtype)
    assert torch.equal(sampling.greedy(logits), logits.argmax(dim=-1))
    buf = torch.full((s + 2,), -7, dtype=torch.int64, device=device)  # into a view of a larger buffer
    view = buf[:s]
    assert sampling.greedy(logits, out=view) is view
    assert torch.equal(buf[:s], logits.argmax(dim=-1)) and (buf[s:] == -7).all()


def test_greedy_ties_nan_and_signed_zero(device):
    v = 9000  # three chunks
    logits = torch.full((6, v), -5.0, device=device)
    logits[0, [7000, 100, 4500]] = 3.0  # a tie across chunks: the first index wins
    logits[1, [8000, 5000]] = float("nan")  # NaN is the largest, first NaN wins
    logits[1, 10] = float("inf")
    logits[2, :] = float("-inf")  # all -inf: index 0
    logits[3, :] = 0.0
    logits[3, :5000] = -1.0
    logits[3, 4999] = -0.0  # -0.0 ties with the 0.0 after it, and comes first
    logits[4, 4095:4097] = 9.0  # the tie straddles a chunk boundary
    logits[5, v - 1] = 1.0  # the last column
    logits[5, 3] = -float("nan")  # a negative NaN is a NaN too
    got = sampling.greedy(logits)
    assert torch.equal(got, logits.argmax(dim=-1)), (got, logits.argmax(dim=-1))
    assert got.tolist() == [100, 5000, 0, 4999, 4095, 3]
    strided = torch.randn(8, 2 * v, device=device)[:, ::2]
    assert torch.equal(sampling.greedy(strided), strided.argmax(dim=-1))


@pytest.mark.gpu
def test_sampling_gpu_vocab_sizes():
    s, v = 64, 151936
    logits = torch.randn(s, v, device="cuda") * 4
    for params in CASES:
        args = _params(s, "cuda", **params)
        got, want = sampling.sample(logits, *args), ref.sample(logits, *args)
        # exp/log of the GPU differ from torch's by an ulp: a flip needs two races within ~1e-6
        assert (got == want).float().mean() >= 62 / 64, params
    counts = torch.randint(0, 2, (s, v), dtype=torch.int32, device="cuda")
    prompt = torch.rand(s, v, device="cuda") < 0.01
    p = torch.rand(s, device="cuda")
    want = ref.apply_penalties(logits.clone(), counts, prompt, p, p, 1 + p)
    torch.testing.assert_close(sampling.apply_penalties(logits, counts, prompt, p, p, 1 + p), want)
    assert torch.equal(sampling.greedy(logits), logits.argmax(dim=-1))
    tokens = torch.randint(0, v, (s,), device="cuda")
    got, want = sampling.compute_logprobs(logits, tokens, 20), ref.compute_logprobs(logits, tokens, 20)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    assert torch.equal(got[1], want[1])

import pytest
import torch
from lightspeed_kernel import ops


def _naive_route(logits, top_k, scoring, renormalize, bias=None, groups=None, topk_groups=None, scale=1.0):
    # one token at a time, plain Python lists
    weights, ids = [], []
    for row in logits.double():
        scores = torch.softmax(row, -1) if scoring == "softmax" else torch.sigmoid(row)
        choice = (scores + bias.double()) if bias is not None else scores
        allowed = list(range(len(row)))
        if groups:
            size = len(row) // groups
            group_scores = []
            for g in range(groups):
                vals = sorted(choice[g * size : (g + 1) * size].tolist(), reverse=True)
                group_scores.append(sum(vals[:2]) if bias is not None else vals[0])
            best = sorted(range(groups), key=lambda g: -group_scores[g])[:topk_groups]  # noqa: B023
            allowed = [e for e in allowed if e // size in best]
        chosen = sorted(allowed, key=lambda e: -choice[e].item())[:top_k]
        w = [scores[e].item() for e in chosen]
        if renormalize:
            w = [x / sum(w) for x in w]
        weights.append([x * scale for x in w])
        ids.append(chosen)
    return torch.tensor(weights, dtype=torch.float64).view(-1, top_k), torch.tensor(ids).view(-1, top_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens", [0, 1, 9])
def test_topk(dtype, scoring, renormalize, tokens):
    torch.manual_seed(tokens)
    logits = torch.randn(tokens, 16, dtype=dtype)
    weights, ids = ops.moe_topk(logits, 4, scoring=scoring, renormalize=renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (tokens, 4)
    exp_w, exp_ids = _naive_route(logits, 4, scoring, renormalize)
    assert torch.equal(ids.long(), exp_ids)
    torch.testing.assert_close(weights.double(), exp_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_bias", [True, False])
def test_grouped_topk_deepseek(with_bias):
    torch.manual_seed(1)
    logits = torch.randn(7, 64)
    bias = torch.randn(64) * 0.5 if with_bias else None
    scoring = "sigmoid" if with_bias else "softmax"
    weights, ids = ops.moe_topk(
        logits,
        6,
        scoring=scoring,
        correction_bias=bias,
        num_groups=8,
        topk_groups=3,
        routed_scaling_factor=2.5,
    )
    exp_w, exp_ids = _naive_route(logits, 6, scoring, True, bias, 8, 3, 2.5)
    assert torch.equal(ids.long(), exp_ids)
    torch.testing.assert_close(weights.double(), exp_w, rtol=1e-5, atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.full((7,), 2.5))
    assert all(len({e // 8 for e in row}) <= 3 for row in ids.tolist())


def test_bias_steers_choice_but_not_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    weights, ids = ops.moe_topk(logits, 1, scoring="sigmoid", correction_bias=bias, renormalize=False)
    assert ids.item() == 3
    assert weights.item() == pytest.approx(torch.sigmoid(torch.tensor(-1.0)).item())


def _naive_experts(x, w13, w2, weights, ids, act):
    x, w13, w2 = x.double(), w13.double(), w2.double()
    inter = w2.shape[-1]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            h = w13[e] @ x[t]
            gate = (
                torch.nn.functional.silu(h[:inter]) if act == "silu" else torch.nn.functional.gelu(h[:inter])
            )
            out[t] += w * (w2[e] @ (gate * h[inter:]))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [0, 1, 11])
@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_fused_experts(dtype, tokens, activation):
    torch.manual_seed(tokens)
    num_experts, hidden, inter = 8, 32, 24
    x = torch.randn(tokens, hidden, dtype=dtype)
    w13 = (torch.randn(num_experts, 2 * inter, hidden) / 6).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter) / 5).to(dtype)
    weights, ids = ops.moe_topk(torch.randn(tokens, num_experts), 2)
    got = ops.fused_experts(x, w13, w2, weights, ids, activation=activation)
    assert got.shape == x.shape and got.dtype == dtype
    tol = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(
        got.double(), _naive_experts(x, w13, w2, weights, ids, activation), rtol=tol, atol=tol
    )


def _block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] -> (e4m3 [..., N, K], fp32 scale per 128x128 block [..., ceil(N/128), ceil(K/128)])."""
    *lead, n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    padded = torch.zeros(*lead, nb * 128, kb * 128)
    padded[..., :n, :k] = w.float()
    blocks = padded.view(*lead, nb, 128, kb, 128)
    scale = blocks.abs().amax(dim=(-3, -1)).clamp(min=1e-10) / 448.0
    q = (blocks / scale[..., :, None, :, None]).view(*lead, nb * 128, kb * 128)[..., :n, :k]
    return q.to(torch.float8_e4m3fn).contiguous(), scale


def _naive_fp8_experts(x, w13, s13, w2, s2, weights, ids):
    # per token, float64: activations quantised per 128 columns (amax / 448), weights dequantised per block
    def deq(q, s):
        n, k = q.shape
        return q.double() * s.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]

    def quant(v):
        out = torch.empty_like(v)
        for g in range(0, v.shape[0], 128):
            part = v[g : g + 128]
            scale = max(part.abs().max().item(), 1e-10) / 448.0
            out[g : g + 128] = (part / scale).float().to(torch.float8_e4m3fn).double() * scale
        return out

    inter = w2.shape[-1]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            h = deq(w13[e], s13[e]) @ quant(x[t].double())
            h = torch.nn.functional.silu(h[:inter]) * h[inter:]
            out[t] += w * (deq(w2[e], s2[e]) @ quant(h))
    return out


@pytest.mark.parametrize("tokens", [0, 1, 7])
def test_fused_experts_fp8_matches_naive_and_bf16(tokens):
    torch.manual_seed(10 + tokens)
    num_experts, hidden, inter = 4, 200, 128  # hidden: a ragged 128-column block
    x = torch.randn(tokens, hidden)
    w13_f, w2_f = torch.randn(num_experts, 2 * inter, hidden) / 14, torch.randn(num_experts, hidden, inter) / 11
    (w13, s13), (w2, s2) = _block_quantize(w13_f), _block_quantize(w2_f)
    weights, ids = ops.moe_topk(torch.randn(tokens, num_experts), 2)
    got = ops.fused_experts_fp8(x, w13, s13, w2, s2, weights, ids)
    assert got.shape == x.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _naive_fp8_experts(x, w13, s13, w2, s2, weights, ids),
                               rtol=1e-4, atol=1e-4)
    if tokens:  # e4m3 weights and activations stay within a few percent of the unquantised experts
        exact = ops.fused_experts(x, w13_f, w2_f, weights, ids)
        assert ((got - exact).norm() / exact.norm()).item() < 0.08


def test_fused_experts_skips_negative_ids():
    # Expert parallelism: ids of experts held by other ranks are -1 and contribute nothing; the
    # sum over two disjoint halves of the experts is the full result.
    torch.manual_seed(3)
    num_experts, hidden, inter, tokens = 8, 16, 12, 9
    x = torch.randn(tokens, hidden)
    w13, w2 = torch.randn(num_experts, 2 * inter, hidden) / 4, torch.randn(num_experts, hidden, inter) / 4
    weights, ids = ops.moe_topk(torch.randn(tokens, num_experts), 3)
    full = ops.fused_experts(x, w13, w2, weights, ids)
    halves = []
    for start in (0, 4):
        local = ids - start
        local = torch.where((local >= 0) & (local < 4), local, -1)
        halves.append(ops.fused_experts(x, w13[start:start + 4], w2[start:start + 4], weights, local))
    torch.testing.assert_close(halves[0] + halves[1], full, rtol=1e-5, atol=1e-5)
    none = ops.fused_experts(x, w13, w2, weights, torch.full_like(ids, -1))
    assert torch.equal(none, torch.zeros_like(x))

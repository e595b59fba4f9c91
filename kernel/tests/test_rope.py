import math

import pytest
import torch
from lightspeed_kernel import ops

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    "yarn_deepseek": {
        "type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
    },
}


def _hf_inv_freq(scaling, rot_dim, base):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = (
        {"rope_type": "default", "rope_theta": base} if scaling is None else dict(scaling, rope_theta=base)
    )
    params["rope_type"] = params.pop("type", params.get("rope_type"))
    config = transformers.LlamaConfig(
        hidden_size=rot_dim * 4,
        num_attention_heads=4,
        head_dim=rot_dim,
        max_position_embeddings=131072,
        rope_parameters=params,
    )
    if scaling is None:
        return 1.0 / base ** (torch.arange(0, rot_dim, 2).float() / rot_dim), 1.0
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None)


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_cache_matches_transformers(kind):
    rot_dim, base, max_pos = 128, 500000.0, 300
    inv_freq, attention_factor = _hf_inv_freq(SCALINGS[kind], rot_dim, base)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq.float())
    expected = torch.cat([freqs.cos(), freqs.sin()], -1) * attention_factor
    cache = ops.rope_cos_sin_cache(rot_dim, max_pos, base, SCALINGS[kind])
    assert cache.shape == (max_pos, rot_dim) and cache.dtype == torch.float32
    torch.testing.assert_close(cache, expected, rtol=1e-5, atol=1e-5)


def test_deepseek_mscale():
    cache = ops.rope_cos_sin_cache(64, 4, 10000.0, SCALINGS["yarn_deepseek"])
    expected = ops.yarn_get_mscale(40.0, 1.0) / ops.yarn_get_mscale(40.0, 0.707)
    assert math.isclose(cache[0, 0].item(), expected, rel_tol=1e-6)  # cos(0) * attention factor
    assert ops.yarn_get_mscale(1.0) == 1.0
    with pytest.raises(ValueError, match="unsupported"):
        ops.rope_cos_sin_cache(64, 4, 10000.0, {"rope_type": "longrope"})


def _naive_rope(x, positions, cache, is_neox):
    # pairs (i, i + r/2) for NeoX, (2i, 2i + 1) for GPT-J, each rotated by angle pos * freq_i
    x = x.double().clone()
    half = cache.shape[1] // 2
    for t, pos in enumerate(positions.tolist()):
        for i in range(half):
            c, s = cache[pos, i].double(), cache[pos, half + i].double()
            a, b = (i, i + half) if is_neox else (2 * i, 2 * i + 1)
            xa, xb = x[t, :, a].clone(), x[t, :, b].clone()
            x[t, :, a], x[t, :, b] = xa * c - xb * s, xb * c + xa * s
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("tokens,head_dim,rot_dim", [(0, 64, 64), (1, 64, 64), (6, 64, 32), (5, 128, 64)])
def test_apply_rope(dtype, is_neox, tokens, head_dim, rot_dim):
    torch.manual_seed(tokens)
    cache = ops.rope_cos_sin_cache(rot_dim, 50, 10000.0)
    positions = torch.randint(0, 50, (tokens,))
    q = torch.randn(tokens, 6, head_dim, dtype=dtype)
    k = torch.randn(tokens, 2, head_dim, dtype=dtype)
    expected_q = _naive_rope(q, positions, cache, is_neox)
    expected_k = _naive_rope(k, positions, cache, is_neox)
    got_q, got_k = ops.apply_rope(positions, q.clone(), k.clone(), cache, is_neox=is_neox)
    torch.testing.assert_close(got_q.double(), expected_q, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(got_k.double(), expected_k, rtol=TOL[dtype], atol=TOL[dtype])
    assert torch.equal(got_q[..., rot_dim:], q[..., rot_dim:])  # partial rotary leaves the tail alone


def test_neox_matches_transformers_apply():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cache = ops.rope_cos_sin_cache(64, 40, 10000.0, SCALINGS["llama3"])
    positions = torch.arange(3, 40, 5)
    q, k = torch.randn(len(positions), 4, 64), torch.randn(len(positions), 2, 64)
    cos = torch.cat([cache[positions, :32]] * 2, -1)[None]
    sin = torch.cat([cache[positions, 32:]] * 2, -1)[None]
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    got_q, got_k = ops.apply_rope(positions, q.clone(), k.clone(), cache)
    torch.testing.assert_close(got_q, hf_q[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, hf_k[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_non_contiguous_views_rotate_in_place():
    cache = ops.rope_cos_sin_cache(16, 8, 10000.0)
    qkv = torch.randn(3, 4 * 16)
    q, k = qkv[:, :32].view(3, 2, 16), qkv[:, 32:48].view(3, 1, 16)
    positions = torch.tensor([0, 3, 7])
    expected = _naive_rope(q, positions, cache, True)
    got_q, _ = ops.apply_rope(positions, q, k, cache)
    torch.testing.assert_close(got_q.double(), expected, rtol=1e-5, atol=1e-5)

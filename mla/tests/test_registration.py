"""The plugin is found through its entry point and wins in the PLUGIN band."""

from importlib import metadata

import pytest
import torch

lk = pytest.importorskip("lightspeed_kernel")


def test_entry_point_declared():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="lightspeed_kernel.plugins")}
    assert eps.get("mla") == "lightspeed_mla.registration:register"


def test_plugin_loaded_and_wins_plugin_band_on_nvidia():
    status = {s.name: s for s in lk.REGISTRY.ensure_plugins()}
    assert "mla" in status and status["mla"].error is None
    for mode in ("decode", "prefill"):
        chosen = lk.select_kernel("mla", mode, torch.bfloat16, platform=lk.Platform.parse("sm_90"))
        assert chosen.name == f"mla_{mode}_triton"
        assert lk.Priority.PLUGIN <= chosen.spec.priority <= lk.Priority.PLUGIN + 3
    explanation = lk.explain("mla", "decode", torch.bfloat16, platform=lk.Platform.parse("sm_90"),
                             features=["fp8_kv", "fold_sq"], traits={"page_size": 64})
    assert explanation.selected == "mla_decode_triton"
    decode = lk.select_kernel("mla", "decode", torch.bfloat16, platform=lk.Platform.parse("sm_90")).impl
    assert callable(decode.plan) and callable(decode.run)


def test_cpu_falls_back_to_reference_that_runs():
    chosen = lk.select_kernel("mla", "decode", torch.bfloat16, platform=lk.CPU)
    assert chosen.name == "mla_decode_reference" and chosen.spec.priority < lk.Priority.PORTABLE
    from lightspeed_mla import MLACache

    cache = MLACache.empty(1, 16, "bf16")
    cache.packed.normal_()
    q = torch.randn(2, 4, 576).to(torch.bfloat16)
    out, lse = chosen.impl(q, cache, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([5]), torch.tensor([0, 2]),
                           0.05, return_lse=True)
    assert out.shape == (2, 4, 512) and torch.isfinite(lse).all()


def test_store_mode_and_fp32_references():
    """The references take fp32 (exact CPU parity tests of MLA models); Triton wants bf16."""
    from lightspeed_mla import MLACache

    assert lk.select_kernel("mla", "store", torch.bfloat16, platform=lk.Platform.parse("sm_90")).name == \
        "mla_store_triton"
    store = lk.select_kernel("mla", "store", torch.float32, platform=lk.CPU)
    decode = lk.select_kernel("mla", "decode", torch.float32, platform=lk.CPU, features=["fp8_kv"])
    prefill = lk.select_kernel("mla", "prefill", torch.float32, platform=lk.CPU, traits={"head_dim_qk": 96})
    assert (store.name, decode.name, prefill.name) == \
        ("mla_store_reference", "mla_decode_reference", "mla_prefill_reference")
    with pytest.raises(lk.KernelSelectionError):  # the Triton prefill only has the 192/128 head dims
        lk.select_kernel("mla", "prefill", torch.bfloat16, platform=lk.Platform.parse("sm_90"),
                         traits={"head_dim_qk": 96}, override="mla_prefill_triton")
    packed = torch.zeros(2, 4, 576, dtype=torch.float32)
    cache = MLACache("bf16", packed[..., :512], packed[..., 512:], None, packed)
    latent, rope = torch.randn(3, 512, dtype=torch.float64).float(), torch.randn(3, 64)
    store.impl(latent, rope, torch.tensor([4, 5, -1]), cache)
    assert torch.equal(packed[1, :2, :512], latent[:2]) and torch.equal(packed[1, :2, 512:], rope[:2])
    q = torch.randn(2, 3, 576)
    out = decode.impl(q, cache, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([6]),
                      torch.tensor([0, 2]), 0.1)
    assert out.dtype == torch.float32 and out.shape == (2, 3, 512)


def test_register_is_idempotent():
    from lightspeed_mla.registration import KERNEL_NAMES, register

    before = sorted(s.name for s in lk.list_kernels("mla"))
    register()
    assert sorted(s.name for s in lk.list_kernels("mla")) == before
    assert {n for names in KERNEL_NAMES.values() for n in names} <= set(before)

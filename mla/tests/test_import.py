"""The package imports, and its references run, without Triton and without the kernel registry."""

import subprocess
import sys

SCRIPT = r"""
import sys
sys.modules["triton"] = None  # an import of triton now raises ImportError
sys.modules["lightspeed_kernel"] = None
import torch
import lightspeed_mla as m
assert not m._triton.HAS_TRITON
cache = m.MLACache.empty(2, 16, "fp8")
m.pack_kv_reference(torch.randn(5, 512), torch.randn(5, 64), torch.arange(5), cache)
q = torch.randn(1, 4, 576).bfloat16()
out, lse = m.mla_decode_reference(q, cache, torch.tensor([[0]]), torch.tensor([5]), torch.tensor([0, 1]), 0.1)
assert out.shape == (1, 4, 512) and torch.isfinite(lse).all()
try:
    m.pack_kv(torch.randn(5, 512), torch.randn(5, 64), torch.arange(5), cache)
except RuntimeError as e:
    assert "Triton" in str(e)
else:
    raise AssertionError("pack_kv ran without Triton")
print("ok")
"""


def test_imports_without_triton_or_registry():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"

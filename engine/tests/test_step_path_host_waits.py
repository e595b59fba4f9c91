"""The step path never makes the host wait for the device.

`device_tensor[i] = python_number` is such a copy: torch wraps the number in a 0-dim CPU tensor and
copies it from pageable memory, which makes the host wait until the step in flight is done. Under
the overlapped loop that wait is invisible on a CPU run and costly on a GPU (on the H200 at 128
concurrent, binding each new request's sampling row that way was 47% of the engine core's time,
`bench/results/h200_vs_vllm_2026-12-02_0110/`). On CPU the same pattern shows up as an `aten.copy_`
whose source is 0-dim, which is what these tests look for while whole requests run, together with
the ops that read a device value back (`.item()`, `nonzero`, boolean-mask indexing).
"""

from __future__ import annotations

import traceback

import pytest
import torch
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec
from torch.utils._python_dispatch import TorchDispatchMode

# Ops whose result size or value the host must read from the device: each one waits for the GPU.
READS_BACK = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
              torch.ops.aten.masked_select.default)


def _waits(func, args) -> bool:
    if func in READS_BACK:
        return True
    if func is torch.ops.aten.index.Tensor:  # a boolean mask index is a nonzero inside
        return any(i is not None and i.dtype == torch.bool for i in args[1])
    # a 0-dim source is a Python number wrapped on the host (see the module note)
    return (func is torch.ops.aten.copy_.default and args[1].dim() == 0) or \
        (func is torch.ops.aten.index_put_.default and args[2].dim() == 0)


class HostWaits(TorchDispatchMode):
    """Records every op that would make the host wait for the device, at the innermost engine frame."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _waits(func, args):
            frame = next((f for f in reversed(traceback.extract_stack()) if "/lightspeed/" in f.filename), None)
            self.found.append(f"{frame.filename}:{frame.lineno} {frame.line}" if frame else "?")
        return func(*args, **kwargs)


SPECS = {
    "greedy": SamplingSpec(max_tokens=6, temperature=0.0),
    "sampled": SamplingSpec(max_tokens=6, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=7),
    "penalised": SamplingSpec(max_tokens=6, temperature=0.7, presence_penalty=0.5, frequency_penalty=0.3,
                              repetition_penalty=1.2, logit_bias={5: 2.0, 9: -1.0}),
    "min_tokens": SamplingSpec(max_tokens=6, temperature=0.0, min_tokens=4, eos_token_ids=[2], stop_token_ids=[3]),
}


@pytest.mark.parametrize("speculative", [None, {"method": "ngram_gpu", "num_speculative_tokens": 3}])
def test_requests_of_every_sampling_kind_bind_and_run_without_scalar_copies(tiny_model_dir, speculative):
    engine = make_engine(tiny_model_dir, async_scheduling=True, speculative_config=speculative)
    # Warm-up outside the recording: first-use initialisation is not the step path.
    submit(engine, "warm", [1, 2, 3], SPECS["greedy"])
    run_until_idle(engine)
    recorder = HostWaits()
    with recorder:
        for name, spec in SPECS.items():
            submit(engine, name, [4, 5, 6, 7, 8, 4, 5, 6], spec)
        run = run_until_idle(engine)
    assert set(run.finished) == set(SPECS), run.errors
    assert recorder.found == [], "host waits on the step path:\n" + "\n".join(recorder.found)


def test_the_recorder_sees_the_pattern_it_guards_against():
    table = torch.zeros(4)
    recorder = HostWaits()
    with recorder:
        table[1] = 0.5          # the stalling spelling
        table[2].fill_(0.5)     # the one the engine uses
        table[table > 0.1]      # a boolean mask: the host learns its size from the device
        table[torch.tensor([0, 2])]
    assert len(recorder.found) == 2

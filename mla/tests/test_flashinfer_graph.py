"""FlashInfer's MLA decode on the plan / bind / run contract (lightspeed_mla/flashinfer_graph.py): a graph
plan re-planned on the host step after step into its fixed buffers equals the reference every step, over
the stand-in of flashinfer_standin.py on the CPU (whose runs read the schedule and kv_indices as they are
when they run: running the captured work again is a replay) and over the real library in a CUDA graph on
a GPU (pytest -m gpu); eager step plans; what goes to Triton instead; what a graph plan refuses."""

import contextlib

import lightspeed_kernel as lk
import numpy as np
import pytest
import torch
from flashinfer_standin import BatchMLAPagedAttentionWrapper as StandIn
from flashinfer_standin import install
from lightspeed_kernel.ops import HostLengths
from lightspeed_mla import MLADecodePlan, flashinfer_graph, mla_decode_reference
from lightspeed_mla import flashinfer_mla as fim
from mla_helpers import make_paged_cache, rel_err

HOPPER = lk.Platform.parse("sm_90")
SCALE = 192 ** -0.5
STEPS = 6


def _op(lib):
    reg = lk.KernelRegistry(load_plugins=None)
    fim.register(reg, page_sizes=(16, 32, 64), load=lambda: lib)
    return reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, traits={"kv_dtype": "bf16"}).impl


class _Batch:
    """A graph's static inputs, as the engine's CUDA-graph runner keeps them: `rows` live requests padded
    to `size` rows of q tokens each (padding rows: q keys), a page table as wide as the longest request
    can grow, seq_lens rewritten in place every step."""

    def __init__(self, page_size, q_len, heads, rows, size, final_lens, device, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.page_size, self.q_len, self.heads, self.rows, self.size = page_size, q_len, heads, rows, size
        self.final = list(final_lens) + [q_len] * (size - rows)
        self.cache, table = make_paged_cache("bf16", page_size, self.final, device=device, generator=self.g)
        self.max_pages = table.shape[1]
        self.page_table = table.contiguous()
        self.qsl_host = np.arange(size + 1, dtype=np.int32) * q_len
        self.query_start_loc = torch.from_numpy(self.qsl_host).to(device)
        self.seq_lens = torch.full((size,), q_len, dtype=torch.int32, device=device)
        self.q = torch.zeros(size * q_len, heads, 576, dtype=torch.bfloat16, device=device)
        self.out = torch.zeros(size * q_len, heads, 512, dtype=torch.bfloat16, device=device)

    def step(self, t: int) -> HostLengths:
        """Step t of STEPS: every live request grows towards its final length (some cross pages); new q."""
        lens = [max(self.q_len, n - (STEPS - 1 - t) * (3 + 7 * (b % 3))) for b, n in enumerate(self.final)]
        lens[self.rows:] = [self.q_len] * (self.size - self.rows)
        host = np.asarray(lens, dtype=np.int32)
        self.seq_lens.copy_(torch.from_numpy(host))
        self.q.copy_(torch.randn(self.q.shape, generator=self.g).to(self.q))
        return HostLengths(self.qsl_host, host)

    def reference(self):
        return mla_decode_reference(self.q, self.cache, self.page_table, self.seq_lens, self.query_start_loc, SCALE)[0]


def _device_work(op, plan, batch: _Batch, layers: int = 2):
    """What the engine captures for one step: the bind, then every layer's run."""
    op.bind(plan, batch.query_start_loc, batch.seq_lens, batch.page_table)
    for _ in range(layers):
        op.run(plan, batch.q, batch.cache, batch.page_table, batch.out)


@contextlib.contextmanager
def _capturing(monkeypatch, on=True):
    with monkeypatch.context() as m:
        for module in (fim, flashinfer_graph):
            m.setattr(module, "_capturing", lambda device: on)
        yield


@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("heads", [16, 128])
def test_graph_plan_replanned_each_step_equals_the_reference(monkeypatch, page_size, q_len, heads):
    lib = install(monkeypatch)
    op = _op(lib)
    batch = _Batch(page_size, q_len, heads, rows=3, size=4, final_lens=[5 * page_size + 3, 2 * page_size, 77],
                   device="cpu", seed=page_size + q_len + heads)
    bound = np.full(batch.size, batch.max_pages * page_size, dtype=np.int32)
    ws = torch.empty(1 << 16, dtype=torch.uint8)
    plan = op.plan(ws, batch.qsl_host, bound, heads, page_size=page_size, softmax_scale=SCALE, captured=True)
    assert isinstance(plan, flashinfer_graph.FlashInferGraphPlan) and StandIn.log == [("plan", "fa2")]
    buffers = [t.data_ptr() for t in (plan.qo_indptr, plan.kv_indptr, plan.kv_len, plan.kv_indices)]
    with _capturing(monkeypatch):  # the capture: device work only; a plan inside it would raise
        _device_work(op, plan, batch)
    for t in range(STEPS):
        lengths = batch.step(t)
        StandIn.log.clear()
        plan.replan(lengths)  # what the graph runner does before each replay
        batch.out.fill_(float("nan"))
        with _capturing(monkeypatch):
            _device_work(op, plan, batch)  # the replay
        assert StandIn.log == [("plan", "fa2"), ("run", "fa2"), ("run", "fa2")]
        assert torch.equal(batch.out, batch.reference()), t
    assert [t.data_ptr() for t in (plan.qo_indptr, plan.kv_indptr, plan.kv_len, plan.kv_indices)] == buffers
    assert plan.wrapper.plans == 1 + STEPS  # one wrapper: the reserving plan, then one a step
    # The test can fail: a replay without the step's replan computes with the last plan's lengths.
    batch.seq_lens[0] -= 2
    with _capturing(monkeypatch):
        _device_work(op, plan, batch)
    assert not torch.equal(batch.out[:q_len], batch.reference()[:q_len])


def test_graph_plan_refuses_a_changed_layout_and_planning_under_capture(monkeypatch):
    op = _op(install(monkeypatch))
    batch = _Batch(16, 1, 16, rows=2, size=2, final_lens=[40, 9], device="cpu", seed=1)
    bound = np.full(2, batch.max_pages * 16, dtype=np.int32)
    ws = torch.empty(1 << 16, dtype=torch.uint8)
    plan = op.plan(ws, batch.qsl_host, bound, 16, page_size=16, softmax_scale=SCALE, captured=True)
    with pytest.raises(ValueError, match="planned for 2 rows of 2 tokens"):
        plan.replan(HostLengths(np.array([0, 1, 3]), np.array([9, 9])))  # 3 tokens: another layout
    with pytest.raises(ValueError, match="more pages"):
        plan.replan(HostLengths(batch.qsl_host, np.array([16 * batch.max_pages + 1, 1])))
    with _capturing(monkeypatch), pytest.raises(RuntimeError, match="capture"):
        plan.replan(batch.step(0))
    with _capturing(monkeypatch), pytest.raises(RuntimeError, match="outside CUDA-graph capture"):
        op.plan(ws, batch.qsl_host, bound, 16, page_size=16, softmax_scale=SCALE, captured=True)
    with pytest.raises(ValueError, match="without an LSE"):
        op.run(plan, batch.q, batch.cache, batch.page_table, batch.out, torch.empty(2, 16))
    with pytest.raises(ValueError, match="planned for FlashInfer"):  # an fp32 query at run
        op.run(plan, batch.q.float(), batch.cache, batch.page_table, batch.out)


def test_standin_keeps_graph_mode_rules(monkeypatch):
    """The stand-in refuses what FlashInfer's CUDA-graph mode refuses (so the adapter's tests can fail)."""
    lib = install(monkeypatch)
    i32 = dict(dtype=torch.int32)
    ws, csr = torch.empty(8, dtype=torch.uint8), lambda b: (torch.arange(b + 1, **i32), torch.arange(b + 1, **i32),
                                                            torch.zeros(b, **i32) + 1)
    args = dict(num_heads=16, head_dim_ckv=512, head_dim_kpe=64, page_size=16, causal=True, sm_scale=0.1,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, query_layout="packed",
                kv_cache_layout="split")
    reserved = [torch.zeros(3, **i32), torch.zeros(3, **i32), torch.zeros(8, **i32), torch.zeros(2, **i32)]
    w = lib.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True, qo_indptr=reserved[0], kv_indptr=reserved[1],
                                          kv_indices=reserved[2], kv_len_arr=reserved[3], backend="fa2")
    qo, kv, lens = csr(2)
    w.plan(metadata=lib.MLAPlanMetadata.csr(qo, kv, reserved[2], lens), **args)  # kv_indices: its own buffer
    with pytest.raises(AssertionError, match="capacity"):  # another batch size
        qo3, kv3, lens3 = csr(3)
        w.plan(metadata=lib.MLAPlanMetadata.csr(qo3, kv3, reserved[2], lens3), **args)
    with pytest.raises(AssertionError, match="overlaps"):  # a source over another reserved buffer
        w.plan(metadata=lib.MLAPlanMetadata.csr(qo, kv, reserved[3], lens), **args)
    with pytest.raises(AssertionError, match="captured launch"):  # 4 tokens x 16 heads a row: one cluster -> two
        qo5 = torch.tensor([0, 5, 10], **i32)
        w.plan(metadata=lib.MLAPlanMetadata.csr(qo5, kv, reserved[2], lens * 0 + 5), **args)
    bare = lib.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True, backend="fa2")
    with pytest.raises(AssertionError, match="reserved"):
        bare.plan(metadata=lib.MLAPlanMetadata.csr(qo, kv, reserved[2], lens), **args)


def test_eager_step_plans_bind_a_copy_and_plan_per_step(monkeypatch):
    lib = install(monkeypatch)
    op = _op(lib)
    batch = _Batch(32, 4, 16, rows=3, size=3, final_lens=[100, 40, 200], device="cpu", seed=2)
    ws = torch.empty(1 << 16, dtype=torch.uint8)
    template = op.plan(ws, batch.qsl_host, np.full(3, batch.max_pages * 32), 16, page_size=32, softmax_scale=SCALE)
    assert isinstance(template, flashinfer_graph.FlashInferStepPlan) and StandIn.log == []  # nothing kept per shape
    wrappers = []
    for t in range(3):
        lengths = batch.step(t)
        step = op.bind(template, batch.query_start_loc, batch.seq_lens, batch.page_table)
        assert step is not template and template.kv_indices is None
        with pytest.raises(RuntimeError, match="before the step's replan"):
            op.run(step, batch.q, batch.cache, batch.page_table, batch.out)
        step.replan(lengths)
        op.run(step, batch.q, batch.cache, batch.page_table, batch.out)
        assert torch.equal(batch.out, batch.reference())
        wrappers.append(step.wrapper)
    assert len({id(w) for w in wrappers}) == 3  # a fresh wrapper each step (held here)


@pytest.mark.parametrize("change", ["fp8", "24_heads", "work_items"])
def test_what_flashinfer_cannot_take_plans_on_triton(monkeypatch, change):
    op = _op(install(monkeypatch))
    heads = 24 if change == "24_heads" else 16
    if change == "work_items":
        monkeypatch.setattr(fim, "MAX_WORK_ITEMS", 3)
    ws = torch.empty(1 << 22, dtype=torch.uint8)
    qsl, lens = np.array([0, 16, 32]), np.array([64, 64])
    plan = op.plan(ws, qsl, lens, heads, page_size=16, softmax_scale=SCALE,
                   cache_kind="fp8" if change == "fp8" else "bf16", captured=True)
    assert isinstance(plan, MLADecodePlan) and StandIn.log == []
    seq_lens, qsl_dev = torch.tensor([50, 64], dtype=torch.int32), torch.from_numpy(qsl.astype(np.int32))
    bound = op.bind(plan, qsl_dev, seq_lens, torch.zeros(2, 4, dtype=torch.int32))
    assert bound.seq_lens is seq_lens and bound.query_start_loc is qsl_dev  # Triton reads them on the device


def test_triton_fallback_runs(monkeypatch):
    """A Triton plan through the op's bind / run equals the reference (interpreter on the CPU)."""
    op = _op(install(monkeypatch))
    cache, table = make_paged_cache("fp8", 16, [40, 17], generator=torch.Generator().manual_seed(3))
    qsl, lens = torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([40, 17], dtype=torch.int32)
    q = torch.randn(3, 16, 576, generator=torch.Generator().manual_seed(4)).bfloat16()
    ws = torch.empty(1 << 22, dtype=torch.uint8)
    plan = op.plan(ws, qsl.numpy(), np.array([64, 64]), 16, page_size=16, softmax_scale=SCALE, cache_kind="fp8")
    out = torch.empty(3, 16, 512, dtype=torch.bfloat16)
    op.run(op.bind(plan, qsl, lens, table), q, cache, table, out)
    assert rel_err(out, mla_decode_reference(q, cache, table, lens, qsl, SCALE)[0]) < 1.5e-2


# --------------------------------------------------------------------------------------------------
# the real library in a CUDA graph (pytest -m gpu; FlashInfer's MLA JIT-compiles at the first plan)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("heads", [16, 128])
def test_real_graph_replay_after_replan_equals_the_reference(page_size, q_len, heads):
    lib = pytest.importorskip("flashinfer.mla")
    op = _op(lib)
    # 5 live rows (1 token up to long contexts) padded to 8, as the runner pads a batch of 5.
    finals = [q_len + 3, page_size + 1, 3 * page_size - 1, 4097, 20000]
    batch = _Batch(page_size, q_len, heads, rows=5, size=8, final_lens=finals, device="cuda", seed=page_size + heads)
    bound = np.full(batch.size, batch.max_pages * page_size, dtype=np.int32)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    plan = op.plan(ws, batch.qsl_host, bound, heads, page_size=page_size, softmax_scale=SCALE, captured=True)
    assert isinstance(plan, flashinfer_graph.FlashInferGraphPlan)
    plan.replan(batch.step(0))
    _device_work(op, plan, batch)  # warm-up outside the capture, as the runner does
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _device_work(op, plan, batch)
    for t in range(STEPS):
        plan.replan(batch.step(t))
        batch.out.fill_(float("nan"))
        graph.replay()
        assert rel_err(batch.out, batch.reference()) < 1.5e-2, (t, page_size, q_len, heads)

"""Build a ModelRunner from an EngineConfig: device, dtype, model, KV pools sized to the budget."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..envs import ENVS
from ..kv import build_kv_cache, device_kv_budget, kv_layout_for, resolve_kv_dtype
from .cpu_graph import build_cpu_graph_runner
from .cuda_graph import build_cuda_graph_runner
from .model_runner import ModelRunner
from .sampling_state import table_bytes

log = logging.getLogger("lightspeed.runner")

_DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                "half": "float16", "float32": "float32", "fp32": "float32", "float": "float32"}
_CPU_HOST_CACHE_DEFAULT = 256 << 20
_HOST_RAM_RESERVE = 8 << 30  # never pinned by the default host tier (default_host_cache_bytes)
# EOS ids a request may carry (the model's and its tokenizer's: a handful in practice).
MAX_EOS_TOKEN_IDS = 16
# Bytes being written to disk at once: a fraction of a second of an NVMe drive, so a disk hit's reads
# (on their own threads) never wait long for the device behind queued writes.
_DISK_WRITE_BYTES_IN_FLIGHT = 256 << 20
_MAX_DISK_WRITES = 4096  # small pages: the plan's disk-write buffers are sized by this bound


@dataclass
class BuiltRunner:
    runner: ModelRunner               # or distributed.DriverRunner (same interface) over several ranks
    model_config: object              # lightspeed.models.ModelConfig
    max_model_len: int
    num_device_pages: int
    num_host_pages: int               # 0: no host tier
    max_write_through_pages: int      # host-tier pages in flight at once (the scheduler's bound)
    device: torch.device
    dtype: torch.dtype
    kv_dtype: torch.dtype
    num_disk_pages: int = 0           # disk-tier slots, slot 0 included; 0: no disk tier
    max_disk_write_pages: int = 1     # disk writes in flight at once (the scheduler's bound)
    quantization: str = "none"        # the weight scheme "auto" resolved to


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA GPU is available here (use device 'cpu' or 'auto')")
    return resolved


def resolve_quantization(quantization: str | None, device: torch.device, load_format: str,
                         model: str | None, parallel: bool = False) -> str:
    """The scheme `load_model` gets ("none" for no quantisation at load). Unset / "auto": "gguf" for a
    GGUF file on the CPU when the native kernels are there (the rule and its measurement:
    engine/README.md "Quantisation"), else "none" (FP8 checkpoints still load as FP8). The
    weight-only schemes run on the CPU kernels only: on a GPU they would dequantise every weight at
    every step. With several ranks (`parallel`) the weights load unquantised: the weight-only
    layers are not sharded by the placement compiler in this version."""
    if quantization in ("int8", "int4", "gguf") and parallel:
        raise ValueError(f"quantization={quantization!r} with several tensor/expert-parallel ranks is not supported "
                         f"in this version (leave it unset: the ranks load the weights unquantised)")
    if quantization in (None, "auto"):
        if device.type != "cpu" or load_format == "dummy" or parallel:
            return "none"
        from lightspeed_kernel.cpu import NATIVE_AVAILABLE

        from ..loader import resolve_model_files

        if model is None:
            from ..model_files import default_model

            model = default_model()
        is_gguf = resolve_model_files(model, load_format).load_format == "gguf"
        return "gguf" if is_gguf and NATIVE_AVAILABLE else "none"
    if quantization in ("int8", "int4", "gguf") and device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on the CPU kernels only; on {device} leave it unset "
                         f"or use fp8")
    return quantization


def default_cpu_threads() -> int:
    """One torch thread per physical core this process may run on: OpenMP threads sharing a core
    (SMT siblings) or outnumbering the cores spin against each other and collapse throughput."""
    import psutil

    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = psutil.cpu_count(logical=False) or logical
    return max(1, min(physical, logical))


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """"auto" -> bfloat16 on GPU, float32 on CPU (the CPU references are exact in fp32)."""
    if dtype == "auto":
        return "bfloat16" if device.type == "cuda" else "float32"
    return _DTYPE_NAMES[dtype]


def load_format_of(config: EngineConfig) -> str:
    return "hf" if config.load_format == "safetensors" else config.load_format


def start_parallel_ranks(config: EngineConfig, on_rank_failure: Callable[[str], None] | None = None):
    """The engine core's torch.distributed ranks (`distributed.EngineRanks`), or None when the
    core runs alone (one tensor-parallel rank, no data-parallel cores stepping with it)."""
    if config.tensor_parallel_size == 1 and config.data_parallel_size == 1:
        return None
    from ..distributed import Topology, start_ranks
    from ..loader import read_model_config

    topology = Topology.of(config, read_model_config(config.model, load_format_of(config)).is_moe)
    if topology.world_size == 1:
        return None
    return start_ranks(config, topology, on_rank_failure)


def build_model_runner(config: EngineConfig, *, output_tokens_of: Callable[[int], list[int]] | None = None,
                       load_tokenizer: Callable[[], object] | None = None, ranks=None,
                       on_rank_failure: Callable[[str], None] | None = None) -> BuiltRunner:
    """The runner of one rank. An engine core (`ranks=None`) starts the other ranks of its group
    first and gets a `distributed.DriverRunner` over them; a worker passes its `Ranks`."""
    if ranks is None:
        ranks = start_parallel_ranks(config, on_rank_failure)
    try:
        return _build(config, ranks, output_tokens_of, load_tokenizer)
    except BaseException:
        if ranks is not None and ranks.is_leader:
            ranks.close(graceful=False)
        raise


def _build(config: EngineConfig, ranks, output_tokens_of, load_tokenizer) -> BuiltRunner:
    from ..loader import load_model

    device = ranks.device if ranks is not None else resolve_device(config.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    if device.type == "cpu" and config.num_threads is None and ENVS.num_threads is None:
        torch.set_num_threads(default_cpu_threads())
    dtype_name = resolve_dtype(config.dtype, device)
    load_format = load_format_of(config)
    quantization = resolve_quantization(config.quantization, device, load_format, config.model,
                                        parallel=ranks is not None)
    model, model_config = load_model(config.model, load_format=load_format, dtype=dtype_name, device=device,
                                     seed=config.seed, progress=False, quantization=quantization,
                                     dummy_weights=config.dummy_weights, parallel=ranks.layout if ranks is not None else None)
    if quantization in ("int8", "int4", "gguf"):
        from ..layers.weight_only import quantization_report

        log.info("weights (%s): %s", quantization, quantization_report(model).summary())
    max_model_len = config.max_model_len or model_config.max_position_embeddings
    if max_model_len > model_config.max_position_embeddings:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings="
                         f"{model_config.max_position_embeddings}")
    kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, model_config.torch_dtype)
    attention = ranks.layout.attention if ranks is not None else None
    # MLA models: one latent row per token; others: this rank's KV heads
    layout = kv_layout_for(model_config, config.page_size, kv_dtype, *((attention.tp_size, attention.tp_rank)
                                                                        if attention is not None else ()))
    spec_config = config.speculative_config
    if spec_config is not None and spec_config.draft_model:
        # A draft model (MTP block, EAGLE-3 layer) caches into one more layer of the same pool.
        layout = dataclasses.replace(layout, num_layers=layout.num_layers + 1)
    # Activations + logits of the largest step, the per-request sampling tables (pre-sized for
    # every sequence) and ngram_gpu's token history stay outside the KV budget on GPU.
    max_stop_ids = config.max_stop_token_ids + MAX_EOS_TOKEN_IDS
    from ..spec.decoder import build_spec_decoder, spec_table_bytes

    # The piecewise graphs keep their largest size's activations in their own pool, beside those of
    # the eager steps above it: reserved the same way.
    piecewise_tokens = _piecewise_max_tokens(config, ranks, model, model_config.num_hidden_layers, device)
    reserve = ((config.max_num_batched_tokens + piecewise_tokens) * model_config.hidden_size * 24
               + config.max_num_seqs * model_config.vocab_size * 4 * 4 + (512 << 20)
               + table_bytes(config.num_request_slots, model_config.vocab_size, config.max_logit_bias, max_stop_ids)
               + spec_table_bytes(spec_config, config.num_request_slots, max_model_len))
    budget = device_kv_budget(device, config.gpu_memory_utilization, config.kv_cache_memory, reserve)
    pages_per_seq = -(-max_model_len // config.page_size)
    # More pages than every slot at full length could ever use would only waste memory.
    num_device_pages = min(layout.pages_for(budget), config.max_num_seqs * pages_per_seq + 1)
    if ranks is not None:  # one scheduler for every rank's pool: the smallest pool sets the page count
        num_device_pages = ranks.agree_min(num_device_pages)
    if num_device_pages < pages_per_seq + 1:
        max_fit = (num_device_pages - 1) * config.page_size
        if config.max_model_len is not None or max_fit < config.page_size:
            raise ValueError(f"the KV cache budget ({budget / 2**20:.0f} MiB, {num_device_pages} pages of "
                             f"{layout.bytes_per_page} bytes) cannot hold one sequence of max_model_len="
                             f"{max_model_len}; raise kv_cache_memory / gpu_memory_utilization or lower max_model_len")
        # The model's default length does not fit: cap it to what the cache holds, and say so.
        log.warning("max_model_len lowered from the model's %d to %d tokens: that is what the KV cache "
                    "(%.0f MiB) holds; raise --kv-cache-memory / --gpu-memory-utilization for longer requests",
                    max_model_len, max_fit, budget / 2**20)
        max_model_len = max_fit
    host_budget = config.host_cache_memory
    if host_budget is None:
        from ..distributed.topology import engine_ranks_per_node

        host_budget = default_host_cache_bytes(device, num_device_pages * layout.bytes_per_page,
                                              engine_ranks_per_node(config))
    num_host_pages = max(2, layout.pages_for(host_budget)) if host_budget > 0 else 0
    if ranks is not None:
        num_host_pages = ranks.agree_min(num_host_pages)
    kv_cache = build_kv_cache(layout, num_device_pages, num_host_pages, device)
    if config.disk_cache_dir is not None:
        kv_cache.disk = build_disk_tier(config, kv_cache.host_pool, model_config, kv_dtype, device, quantization)
    log.info("model %s on %s (%s); KV cache %d device pages, %d host pages of %d tokens (%s); max_model_len %d",
             model_config.name, device, dtype_name, num_device_pages, num_host_pages, config.page_size, layout,
             max_model_len)
    if load_tokenizer is None:
        def load_tokenizer():
            from ..frontend.tokenizer import load_engine_tokenizer

            return load_engine_tokenizer(config, model_config.vocab_size)

    runner = ModelRunner(model, kv_cache, num_slots=config.num_request_slots, vocab_size=model_config.vocab_size,
                         device=device, engine_seed=config.seed, load_tokenizer=load_tokenizer,
                         output_tokens_of=output_tokens_of, max_logit_bias=config.max_logit_bias,
                         max_stop_ids=max_stop_ids, grammar_cache_size=config.grammar_cache_size)
    runner.spec = build_spec_decoder(spec_config, model=model, model_config=model_config,
                                     num_slots=config.num_request_slots, device=device, page_size=config.page_size,
                                     kv_cache=kv_cache, model_path=config.model, load_format=load_format,
                                     max_model_len=max_model_len, seed=config.seed)
    if runner.spec is not None and spec_config.draft_model:
        runner.spec.drafter.token_at = runner.known_token
    if runner.spec is not None and runner.spec.drafts_on_host and config.async_scheduling:
        log.info("speculative decoding with %s drafts: each step is collected before the next is planned "
                 "(drafts proposed behind an unverified step are mostly rejected); method ngram_gpu drafts "
                 "on the device without that wait (engine/README.md compares them)", spec_config.method)
    # After the KV cache exists: the graphs bake in its addresses.
    runner.graphs = _graphs(config, ranks, model, kv_cache, max_model_len, model_config.vocab_size, device,
                            quantized=quantization in ("int8", "int4", "gguf"), spec=runner.spec)
    if piecewise_tokens:
        from .piecewise_graph import build_piecewise_graph_runner

        runner.piecewise = build_piecewise_graph_runner(model, kv_cache, max_tokens=piecewise_tokens,
                                                        num_layers=model_config.num_hidden_layers, device=device)
    if ranks is not None and ranks.is_leader:
        from ..distributed import DriverRunner

        runner = DriverRunner(runner, ranks)
    # Prefix pages in flight to host at once (LIGHTSPEED_WRITE_THROUGH_MIB, 512 MiB: ~10 ms of PCIe Gen5).
    # Load-backs have a copy stream of their own (kv/copier.py), so the bound no longer delays them; it is
    # acknowledged once a step, so it also caps the write-through's rate at this much a step.
    write_through_pages = max(1, (ENVS.write_through_mib << 20) // layout.bytes_per_page)
    disk = kv_cache.disk
    return BuiltRunner(runner, model_config, max_model_len, num_device_pages, num_host_pages, write_through_pages,
                       device, model_config.torch_dtype, kv_dtype, num_disk_pages=disk.num_slots if disk else 0,
                       max_disk_write_pages=max(1, min(_MAX_DISK_WRITES, _DISK_WRITE_BYTES_IN_FLIGHT // disk.record_bytes))
                       if disk else 1, quantization=quantization)


def build_disk_tier(config: EngineConfig, host_pool, model_config, kv_dtype: torch.dtype, device: torch.device,
                    quantization: str):
    """The disk KV tier under `host_pool`, its files named by a fingerprint of everything that changes
    the KV bytes: the weights, the model's config (RoPE included), dtypes, quantisation, page size,
    tensor-parallel layout, device kind and the page layout."""
    from ..kv.disk import DiskKVTier, default_disk_size, kv_fingerprint
    from ..loader import resolve_model_files, weights_identity
    from ..model_files import default_model

    load_format = "hf" if config.load_format == "safetensors" else config.load_format
    files = resolve_model_files(config.model or default_model(), load_format)
    model = {k: v for k, v in dataclasses.asdict(model_config).items() if k != "name"}
    parts = {"weights": weights_identity(files, config.seed, config.dummy_weights), "model": model, "dtype": model_config.torch_dtype,
             "kv_dtype": kv_dtype, "quantization": quantization, "page_size": config.page_size,
             "tensor_parallel": [config.tensor_parallel_size, 0], "device": device.type,
             "page_tensors": [[[t.shape[0], *t.shape[2:]], t.dtype] for t in host_pool.page_tensors]}
    size = config.disk_cache_size if config.disk_cache_size is not None else default_disk_size(config.disk_cache_dir)
    return DiskKVTier(host_pool, config.disk_cache_dir, size, kv_fingerprint(parts), config.page_size)


def _graphs(config: EngineConfig, ranks, model, kv_cache, max_model_len: int, vocab_size: int,
            device: torch.device, quantized: bool, spec=None):
    """Decode graphs, or None. Every rank captures the same sizes in the same order (their collectives
    are captured too); data-parallel cores stepping together run eagerly (their steps would have to
    agree on one graph size); native CPU graphs replay kernels only, so several ranks run eagerly.
    With speculative decoding the CUDA graphs also hold k + 1 tokens per row (and the hidden states a
    device drafter reads); native CPU graphs replay one-token steps only and keep no hidden states,
    so speculative steps, and every step of a device drafter, run eagerly on the CPU."""
    batch_sizes = config.cuda_graph_batch_sizes()
    if ranks is not None and ranks.topology.lockstep:
        batch_sizes = []
    args = dict(batch_sizes=batch_sizes, max_model_len=max_model_len, vocab_size=vocab_size, device=device)
    if device.type != "cuda":
        if ranks is not None or (spec is not None and spec.needs_hidden):
            return None
        return build_cpu_graph_runner(model, kv_cache, quantized=quantized, **args)
    aux_layers = getattr(getattr(model, "model", None), "aux_hidden_layers", ())
    graphs = build_cuda_graph_runner(model, kv_cache, **args, spec_tokens=spec.k if spec is not None else 0,
                                     keep_hidden=spec is not None and spec.needs_hidden,
                                     aux_width=len(aux_layers) * model.config.hidden_size)
    if ranks is not None and batch_sizes and not ranks.agree_all(graphs is not None):
        return None  # one rank failed to capture: all run eagerly, or their collectives would diverge
    return graphs


def _piecewise_max_tokens(config: EngineConfig, ranks, model, num_layers: int, device: torch.device) -> int:
    """Most tokens of a step the piecewise graphs hold (CUDA, one rank; 0: none are captured)."""
    from ..layers.attention import Attention
    from .piecewise_graph import auto_max_tokens

    if device.type != "cuda" or config.enforce_eager or ranks is not None:
        return 0
    if sum(isinstance(m, Attention) for m in model.modules()) != num_layers:
        return 0  # attention of another kind (MLA): it does not split, so prefill steps stay eager
    max_tokens = config.piecewise_cuda_graph_max_tokens
    if max_tokens is None:
        max_tokens = auto_max_tokens(model, num_layers, config.max_num_batched_tokens)
    return min(max_tokens, config.max_num_batched_tokens)


def default_host_cache_bytes(device: torch.device, device_pool_bytes: int, ranks_on_host: int = 1,
                             available: int | None = None) -> int:
    """Host (pinned) KV tier when the user names none: twice the device pool on GPU (SGLang's HiCache
    ratio), so prefixes evicted from the device survive; never more than this rank's share of the RAM
    available now, less a reserve. Pinned memory cannot be swapped, so the reserve (a quarter of what is
    available, at least 8 GiB) stays for the process, the gateway and the page cache. Every engine rank on
    the host pins its own tier: they share what is left, or eight ranks would each pin the same quarter.
    (A quarter of free RAM for one rank, the old cap, left agentic c = 32 thrashing on an 80 GB card: device
    + host held ~0.7M of its ~0.87M tokens of working set.)"""
    if device.type != "cuda":
        return _CPU_HOST_CACHE_DEFAULT
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    usable = max(0, available - max(available // 4, _HOST_RAM_RESERVE))
    return min(2 * device_pool_bytes, usable // max(1, ranks_on_host))

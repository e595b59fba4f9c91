"""EngineConfig: every knob of one engine, a frozen dataclass validated in one place.

A field's ``metadata["help"]`` is its command-line help, and ``metadata.get("choices")`` its allowed
values, so front ends write each flag once::

    for f in dataclasses.fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, help=f.metadata["help"], choices=f.metadata.get("choices"))

`engine_arg_specs()` returns exactly that information as plain records; `EngineConfig.from_cli`
turns strings such as ``kv_cache_memory="2GiB"`` into typed values.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from .spec.config import SpeculativeConfig

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}


def parse_bytes(value: int | float | str) -> int:
    """``"2GiB"`` -> 2147483648, ``"512MB"`` -> 512000000, ``1024`` -> 1024 (ValueError if unparsable)."""
    if isinstance(value, bool):
        raise ValueError(f"not a byte size: {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a byte size: {value!r} (examples: 2GiB, 512MiB, 1e9)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def _f(default: Any, help: str, choices: tuple | None = None, **kw: Any) -> Any:
    meta = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    return field(default=default, metadata=meta, **kw)


LOAD_FORMATS = ("auto", "hf", "safetensors", "gguf", "dummy")
DUMMY_WEIGHTS = ("normal", "uniform")  # loader.DUMMY_DISTRIBUTIONS (the loader imports torch; this module does not)
DTYPES = ("auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "half", "float")
KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32", "fp8", "fp8_e4m3")
POLICIES = ("decode_first", "prefill_first")
EVICTION_POLICIES = ("queue", "lru")  # the scheduler's SchedulerConfig.eviction_policy
# --quantization choices (weights quantised at load); every method lives here, one tuple. Unset (None)
# or "auto": the per-device default (engine/README.md "Quantisation").
QUANTIZATIONS = ("auto", "none", "fp8", "int8", "int4", "gguf")
_BYTE_SIZES = ("kv_cache_memory", "host_cache_memory", "disk_cache_size")  # fields that take "2GiB"


@dataclass(frozen=True)
class EngineConfig:
    """Configuration of one engine (model, memory, batching). Immutable after construction."""

    model: str | None = _f(None, "Model: a Hugging Face folder, a .gguf file, or with --load-format dummy a "
                           "config.json / preset name (llama-3.1-8b, qwen3-8b, ...). Default: SmolLM2-135M-Instruct.")
    tokenizer: str | None = _f(None, "Tokenizer folder or .gguf file (default: the model's).")
    load_format: str = _f("auto", "How to load weights: auto (by path), hf/safetensors, gguf, dummy (random).",
                          LOAD_FORMATS)
    dummy_weights: str = _f("normal", "Distribution of --load-format dummy weights: normal (N(0, 0.02) matrices, "
                            "norms 1) or uniform (every weight, norms included, U(-1e-3, 1e-3): vLLM's dummy draw, "
                            "for side-by-side runs against a vLLM dummy model).", DUMMY_WEIGHTS)
    dtype: str = _f("auto", "Weight and activation dtype; auto = bfloat16 on GPU, float32 on CPU.", DTYPES)
    device: str = _f("auto", "Device: auto (cuda if available), cpu, cuda, cuda:N.")
    max_model_len: int | None = _f(None, "Longest sequence (prompt + output) in tokens; default: the model's "
                                   "max_position_embeddings, capped by what the KV cache holds.")
    max_num_seqs: int = _f(256, "Most requests in one batch (running requests; with overlap, a quarter more hold "
                           "per-request state while the step in flight finishes some).")
    spare_slots: int | None = _f(None, "Request slots beyond --max-num-seqs. With overlapped steps a request whose "
                                 "last token is in the step in flight keeps its slot until that step is collected; "
                                 "a spare slot lets a waiting request take its row at once. Default: a quarter of "
                                 "max_num_seqs with --async-scheduling, else 0; 0 turns it off.")
    max_num_batched_tokens: int = _f(8192, "Token budget of one forward step (decodes + prefill chunks).")
    chunked_prefill_size: int | None = _f(None, "Longest prefill chunk of one request in one step; default: "
                                          "--max-num-batched-tokens (a long prompt alone fills whole steps).")
    page_size: int = _f(16, "Tokens per KV-cache page.")
    gpu_memory_utilization: float = _f(0.9, "Fraction of the GPU's memory the engine may use (weights, "
                                       "activations and the KV cache, which gets the rest).")
    kv_cache_memory: int | None = _f(None, "KV-cache budget in bytes (accepts 2GiB, 512MiB); sizes the cache on CPU "
                                     "(default 1GiB there); on GPU it overrides --gpu-memory-utilization.")
    kv_cache_dtype: str = _f("auto", "KV-cache dtype: auto (= model dtype), bf16, fp16, fp32, fp8 (e4m3 with one "
                             "scale of 1.0 for K and V, not calibrated: values beyond +-448 saturate; MLA models: "
                             "e4m3 latent with a scale per token).", KV_CACHE_DTYPES)
    quantization: str | None = _f(None, "Quantise the weights at load. Unset / auto: on the CPU a GGUF file's "
                                  "weights stay in their own blocks (gguf) when the native CPU kernels are "
                                  "available, FP8 checkpoints (quantization_config) load as FP8, anything else "
                                  "none. none: no quantisation at load (GGUF blocks dequantised to --dtype). fp8: "
                                  "e4m3 with one scale per 128x128 block (DeepSeek-V3's format; activations per "
                                  "token and 128 columns). int8 / int4: weight-only 8 / 4-bit on the CPU kernels "
                                  "(wider sources requantised, the error logged at load). gguf: each GGUF tensor "
                                  "in the 4- or 8-bit format that holds its blocks exactly.", QUANTIZATIONS)
    host_cache_memory: int | None = _f(None, "Host (CPU, pinned on GPU machines) KV-cache tier in bytes: prefix pages "
                                       "are written through to it in the background and served back on a hit "
                                       "after device eviction; also holds retracted requests. 0 turns it off. "
                                       "Default: 2x the device KV cache on GPU (within 3/4 of free RAM, at least 8GiB "
                                       "left, shared by the host's GPU ranks), 256MiB on CPU.")
    disk_cache_dir: str | None = _f(None, "Directory of the disk KV-cache tier, under the host tier: prefix pages are "
                                    "written through to it from host memory in the background and served back on a "
                                    "hit after host eviction, and a server restarted on the same directory and model "
                                    "finds them again. One checksummed file pair per model and KV layout. Needs the "
                                    "host tier. Default: off.")
    disk_cache_size: int | None = _f(None, "Most bytes the disk KV-cache tier takes (accepts 100GiB, 512MiB). Default: "
                                     "half the free space of --disk-cache-dir's file system at start-up.")
    enable_prefix_cache: bool = _f(True, "Reuse KV pages of shared prompt prefixes across requests.")
    session_retention: int = _f(2, "Extra eviction sweeps (0-16) the cached prefix of a request that names its "
                                "session (session_id, prompt_cache_key) survives beyond LRU; 0 = plain LRU.")
    policy: str = _f("decode_first", "Batching policy: decode_first (running decodes first, prefill chunks "
                     "fill the rest) or prefill_first.", POLICIES)
    eviction_policy: str = _f("queue", "Prefix-cache eviction order: queue (least recently used, except that the "
                              "cached prefixes of waiting requests go last, the next to be admitted very last) "
                              "or lru.", EVICTION_POLICIES)
    seed: int = _f(0, "Seed of the engine: weights of dummy models and the seeds of requests that set none.")
    tensor_parallel_size: int = _f(1, "Tensor-parallel ranks of each engine core: attention heads, the vocabulary, "
                                   "dense MLPs and (without --enable-expert-parallel) every MoE expert are split "
                                   "over them (torch.distributed: NCCL on GPU, gloo on CPU; rank 0 schedules).")
    data_parallel_size: int = _f(1, "Data-parallel engine cores, each with its own scheduler, KV cache and "
                                 "tensor-parallel ranks; the server routes each request to the core whose prefix "
                                 "cache holds the longest match of its prompt, else the least loaded.")
    data_parallel_rank: int | None = _f(None, "This engine core's data-parallel rank (the server sets it for each "
                                        "core it starts; needed to run one core of several by hand).")
    enable_expert_parallel: bool = _f(False, "MoE models: every rank holds whole experts (E / EP of them) instead of "
                                      "a slice of every expert; EP = tensor x data parallel size unless "
                                      "--expert-parallel-size says otherwise.")
    expert_parallel_size: int | None = _f(None, "Ranks the experts are split over with --enable-expert-parallel: "
                                          "the tensor-parallel size (each data-parallel core holds every expert) "
                                          "or tensor x data parallel size (default; data-parallel attention: "
                                          "the cores step together and exchange tokens by all-to-all, e.g. "
                                          "attention TP 4 with MoE EP 8 is --tensor-parallel-size 4 "
                                          "--data-parallel-size 2).")
    enable_sequence_parallel: bool = _f(False, "Shard the residual stream by tokens over the tensor-parallel ranks: "
                                        "reduce-scatter + all-gather around the norms instead of all-reduce (with "
                                        "expert parallelism the experts then exchange tokens by all-to-all).")
    nnodes: int | None = _f(None, "Machines the ranks of an engine core span (default 1, or torchrun's NNODES).")
    node_rank: int | None = _f(None, "This machine's index among --nnodes: 0 runs the server and the engine core, "
                               "the others run their ranks only (default 0, or NODE_RANK / GROUP_RANK).")
    master_addr: str | None = _f(None, "Address of node 0 for torch.distributed's rendezvous (default 127.0.0.1, "
                                 "or MASTER_ADDR).")
    master_port: int | None = _f(None, "Rendezvous TCP port on node 0 (default MASTER_PORT, else a free port; "
                                 "needed with --nnodes > 1 and with several data-parallel cores that step together).")
    max_logprobs: int = _f(20, "Largest number of top logprobs a request may ask for.")
    max_logit_bias: int = _f(1024, "Most logit_bias entries per request (their device table is sized for every "
                             "sequence at start-up; a request with more is rejected).")
    max_stop_token_ids: int = _f(64, "Most stop_token_ids per request (checked on every token; a request with "
                                 "more is rejected).")
    max_queued_requests: int = _f(4096, "Requests the engine holds beyond --max-num-seqs (waiting to run, or for "
                                  "their grammar to compile); the Python API waits for room, other clients are "
                                  "rejected.")
    grammar_cache_size: int = _f(256, "Compiled grammars (structured output) kept for reuse, least recently used "
                                 "evicted first. Grammars compile on a worker thread, off the step loop.")
    num_threads: int | None = _f(None, "torch threads of the engine core on CPU (default: one per physical core).")
    async_scheduling: bool = _f(True, "Overlap steps: the CPU plans and launches step N+1 while the GPU runs "
                                "step N (off: each step is collected before the next is planned, for debugging).")
    enforce_eager: bool = _f(False, "Disable CUDA graphs (and on CPU the native graphs of decode steps): run "
                             "every step eagerly.")
    speculative_config: SpeculativeConfig | None = _f(
        None, 'Speculative decoding, as JSON with vLLM\'s keys: {"method": "ngram" | "ngram_gpu" | "suffix" | "mtp" | '
        '"eagle3", "num_speculative_tokens": k (1..15), "model": draft folder (eagle3), "prompt_lookup_min/max" '
        '(ngram; ngram_gpu drafts on the device and keeps steps overlapped), '
        '"suffix_decoding_*" (suffix)}. Outputs are exactly those without it (greedy: token for token; '
        'sampled: the same distribution, and the same tokens for a seed).')
    piecewise_cuda_graph_max_tokens: int | None = _f(
        None, "Prefill and mixed steps of up to this many tokens replay piecewise CUDA graphs (everything but "
        "attention captured per padded token count, attention run between the pieces). Default: chosen from the "
        "model's size, so that only steps the host bounds (small models, short chunks) use them; 0 turns them off.")
    cuda_graph_max_batch_size: int = _f(256, "Largest decode batch replayed from a CUDA graph (capped by "
                                        "--max-num-seqs); graphs are captured at startup for padded sizes "
                                        "1, 2, 4, 8, 16, 24, 32, then every 16 up to it. Larger batches run eagerly.")

    def __post_init__(self) -> None:
        # Normalise CLI-edge strings into typed values (still immutable afterwards).
        object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
        for name in _BYTE_SIZES:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_bytes(value))
        for name, allowed in (("load_format", LOAD_FORMATS), ("dummy_weights", DUMMY_WEIGHTS), ("dtype", DTYPES),
                              ("kv_cache_dtype", KV_CACHE_DTYPES), ("policy", POLICIES),
                              ("eviction_policy", EVICTION_POLICIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization={self.quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
        if not 0 <= self.session_retention <= 16:
            raise ValueError(f"session_retention must be in [0, 16], got {self.session_retention}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device={self.device!r}: expected auto, cpu, cuda or cuda:N")
        if self.chunked_prefill_size is None:
            object.__setattr__(self, "chunked_prefill_size", self.max_num_batched_tokens)
        positive = ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill_size", "page_size",
                    "tensor_parallel_size", "data_parallel_size", "cuda_graph_max_batch_size", "max_queued_requests",
                    "grammar_cache_size")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        spare = self.spare_slots
        if spare is not None and (not isinstance(spare, int) or isinstance(spare, bool)
                                  or not 0 <= spare <= self.max_num_seqs):
            raise ValueError(f"spare_slots must be an integer in [0, max_num_seqs={self.max_num_seqs}], got {spare!r}")
        pw = self.piecewise_cuda_graph_max_tokens
        if pw is not None and (not isinstance(pw, int) or isinstance(pw, bool) or pw < 0):
            raise ValueError(f"piecewise_cuda_graph_max_tokens must be a non-negative integer, got {pw!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ValueError(f"max_model_len must be a positive integer, got {self.max_model_len!r}")
        if self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be positive, got {self.kv_cache_memory}")
        if self.host_cache_memory is not None and self.host_cache_memory < 0:
            raise ValueError(f"host_cache_memory must be >= 0, got {self.host_cache_memory}")
        if self.disk_cache_size is not None and (self.disk_cache_size <= 0 or self.disk_cache_dir is None):
            raise ValueError(f"disk_cache_size={self.disk_cache_size} needs a positive size and a disk_cache_dir")
        if self.disk_cache_dir is not None and self.host_cache_memory == 0:
            raise ValueError("disk_cache_dir needs the host tier (host_cache_memory > 0): disk pages are read "
                             "through host memory")
        self._validate_parallel()
        for name in ("max_logprobs", "max_logit_bias", "max_stop_token_ids"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        for name in ("enforce_eager", "async_scheduling", "enable_prefix_cache", "enable_expert_parallel",
                     "enable_sequence_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def _validate_parallel(self) -> None:
        tp, dp = self.tensor_parallel_size, self.data_parallel_size
        if self.data_parallel_rank is not None and not 0 <= self.data_parallel_rank < dp:
            raise ValueError(f"data_parallel_rank={self.data_parallel_rank} is not in [0, data_parallel_size={dp})")
        if self.expert_parallel_size is not None:
            if not self.enable_expert_parallel:
                raise ValueError("expert_parallel_size needs enable_expert_parallel")
            if self.expert_parallel_size not in (tp, tp * dp):
                raise ValueError(f"expert_parallel_size={self.expert_parallel_size} must be the tensor-parallel size "
                                 f"({tp}) or tensor x data parallel size ({tp * dp})")
        for name in ("nnodes", "node_rank", "master_port"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.nnodes is not None and self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}")
        if self.nnodes is not None and self.node_rank is not None and self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} is not in [0, nnodes={self.nnodes})")
        if tp > 1 and self.disk_cache_dir is not None:
            raise ValueError("disk_cache_dir with tensor_parallel_size > 1: the disk KV tier reads and writes "
                             "rank 0's host pool only in this version (each rank holds its own KV shard)")
        if self.speculative_config is not None and (tp > 1 or self.expert_parallel_ranks > 1):
            raise ValueError("speculative_config with several tensor/expert-parallel ranks: speculative decoding "
                             "runs on one rank in this version (data-parallel cores of one rank each may use it)")
        if (tp > 1 or dp > 1) and self.device.startswith("cuda:"):
            raise ValueError(f"device={self.device!r}: with several ranks each takes its own GPU (use cuda or auto)")

    @property
    def expert_parallel_ranks(self) -> int:
        """Ranks the MoE experts are split over (1: none; every rank slices every expert)."""
        if not self.enable_expert_parallel:
            return 1
        return self.expert_parallel_size or self.tensor_parallel_size * self.data_parallel_size

    @property
    def num_spare_slots(self) -> int:
        """Request slots beyond max_num_seqs (the scheduler's num_spare_slots): spare_slots, or by default a
        quarter of max_num_seqs with overlap (requests admitted together finish together, a few a step) and 0
        without it (a collected step has no request in flight to wait for)."""
        if self.spare_slots is not None:
            return self.spare_slots
        return -(-self.max_num_seqs // 4) if self.async_scheduling else 0

    @property
    def num_request_slots(self) -> int:
        """Rows of per-request state (sampling tables, draft histories): max_num_seqs + num_spare_slots."""
        return self.max_num_seqs + self.num_spare_slots

    def cuda_graph_batch_sizes(self) -> list[int]:
        """Padded decode batch sizes captured as CUDA graphs: 1, 2, 4, 8, 16, 24, 32, 48, 64, ... up to
        min(cuda_graph_max_batch_size, max_num_seqs), which is always included. Empty with enforce_eager."""
        if self.enforce_eager:
            return []
        top = min(self.cuda_graph_max_batch_size, self.max_num_seqs)
        sizes = [s for s in (1, 2, 4, 8, 16, 24) if s < top]
        sizes += [s for s in range(32, top, 16)]
        return sizes + [top]

    @classmethod
    def from_cli(cls, **kwargs: Any) -> EngineConfig:
        """Build from string-valued flags (None values = default): converts ints, floats, bools, sizes."""
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        clean: dict[str, Any] = {}
        for name, value in kwargs.items():
            if name not in types:
                raise ValueError(f"unknown engine argument {name!r}")
            if value is None:
                continue
            kind = str(types[name])
            if isinstance(value, str) and name not in _BYTE_SIZES:
                if kind.startswith("int"):
                    value = int(value)
                elif kind.startswith("float"):
                    value = float(value)
                elif kind.startswith("bool"):
                    value = value.strip().lower() in ("1", "true", "yes", "on")
            clean[name] = value
        return cls(**clean)

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class EngineArgSpec:
    """One CLI flag derived from an EngineConfig field."""

    name: str           # field name, e.g. "max_num_seqs"
    flag: str           # "--max-num-seqs"
    type: str           # the field's annotation as text, e.g. "int | None"
    default: Any        # the field's default
    help: str           # metadata["help"]
    choices: tuple | None


def engine_arg_specs() -> list[EngineArgSpec]:
    """Every EngineConfig field as a CLI flag description (the gateway builds `lightspeed serve` from it)."""
    return [EngineArgSpec(f.name, "--" + f.name.replace("_", "-"), str(f.type), f.default,
                          f.metadata["help"], f.metadata.get("choices"))
            for f in dataclasses.fields(EngineConfig)]

"""Plan (numpy views) -> one int32 step packet -> device tensors, with no per-request Python loop.

Every integer array of the plan is packed into one int32 buffer behind a fixed header (into pinned
staging memory on GPU) and moved with one non-blocking copy; the device-side views are then
sliced out of it. Two staging buffers alternate so step N+1 can be packed while step N's upload is
still in flight (overlap scheduling).

The packet is self-describing (`StepPacket`: header, the plan's arrays, its KV page copies and the
copy steps rank 0 has seen land), so under tensor parallelism it is exactly what rank 0 broadcasts:
every rank unpacks the same words into the same tensors (`lightspeed.distributed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..envs import STEP_IO_MODES
from .step_io import PacketUploads

HEADER_WORDS = 16
KIND_STEP, KIND_STOP = 0, 1
# header word -> meaning
(_KIND, _STEP_LO, _STEP_HI, _TOKENS, _ROWS, _SAMPLED, _PAGES, _DECODES, _DECODE_TOKENS, _MAX_QUERY, _FLAGS,
 _WRITE_BACK, _LOAD_BACK, _ACKS, _PAD_TO, _TOTAL) = range(HEADER_WORDS)
_DEFERRED, _FORWARD_WAITS, _REPORT_LOAD = 1, 2, 4  # _FLAGS bits


@dataclass
class StepTensors:
    input_ids: torch.Tensor          # int64 [T]
    positions: torch.Tensor          # int64 [T]
    slot_mapping: torch.Tensor       # int64 [T]
    query_start_loc: torch.Tensor    # int32 [B+1]
    seq_lens: torch.Tensor           # int32 [B]
    page_table: torch.Tensor         # int32 [B, P]
    logits_indices: torch.Tensor     # int64 [S]
    sample_slots: torch.Tensor       # int64 [S]: the state row of each sampled position
    h_sample_slots: np.ndarray       # the same on the host
    h_sample_req_ids: np.ndarray | None  # int64 [S]: scheduler request id of each sampled position (rank 0)
    deferred_mask: torch.Tensor | None = None  # bool [T]: the input is the previous step's sample (overlap)
    deferred_src: torch.Tensor | None = None   # int64 [T]: which one (0 where not deferred)


def upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on `device` without stalling: through pinned memory, non-blocking. (A copy
    from pageable memory makes the CPU wait until the step in flight is done, undoing the overlap.)"""
    host = torch.from_numpy(np.ascontiguousarray(array))
    return host if device.type == "cpu" else host.pin_memory().to(device, non_blocking=True)


def _aligned_starts(sizes: list[int], first: int) -> np.ndarray:
    # Each part starts on a 16-byte boundary: kernels specialise on pointer alignment, and an
    # alignment that changed with the step's shape would recompile them mid-run.
    starts = np.full(len(sizes), first, dtype=np.int64)
    starts[1:] += np.cumsum((np.asarray(sizes[:-1]) + 3) // 4 * 4)
    return starts


class StepPacket:
    """One step as int32 words: `host [>= total]` (a CPU tensor, pinned on GPU machines).

    Layout: header (`HEADER_WORDS`), then input_ids, positions, slot_mapping, query_start_loc,
    seq_lens, logits_indices, sample slots, [deferred mask, deferred source], page_table,
    write_back [M, 2], load_back [N, 2], acknowledged copy steps (as `step_id - ack`).
    """

    def __init__(self, host: torch.Tensor):
        self.host = host
        self.words = host.numpy()
        self.header = self.words[:HEADER_WORDS]

    # -- header ---------------------------------------------------------------------------------
    @property
    def kind(self) -> int:
        return int(self.header[_KIND])

    @property
    def step_id(self) -> int:
        return int(self.header[_STEP_LO]) & 0xFFFFFFFF | int(self.header[_STEP_HI]) << 32

    @property
    def total(self) -> int:
        return int(self.header[_TOTAL])

    num_tokens = property(lambda self: int(self.header[_TOKENS]))
    num_rows = property(lambda self: int(self.header[_ROWS]))
    num_sampled = property(lambda self: int(self.header[_SAMPLED]))
    num_decodes = property(lambda self: int(self.header[_DECODES]))
    num_decode_tokens = property(lambda self: int(self.header[_DECODE_TOKENS]))
    max_query_len = property(lambda self: int(self.header[_MAX_QUERY]))
    pad_to = property(lambda self: int(self.header[_PAD_TO]))  # 0: none
    deferred = property(lambda self: bool(self.header[_FLAGS] & _DEFERRED))
    forward_waits_for_copies = property(lambda self: bool(self.header[_FLAGS] & _FORWARD_WAITS))
    report_load = property(lambda self: bool(self.header[_FLAGS] & _REPORT_LOAD))

    @property
    def num_prefills(self) -> int:
        return self.num_rows - self.num_decodes

    # -- body -------------------------------------------------------------------------------------
    def _sizes(self) -> list[int]:
        t, b, s, h = self.num_tokens, self.num_rows, self.num_sampled, self.header
        sizes = [t, t, t, b + 1, b, s, s] + ([t, t] if self.deferred else [])
        return sizes + [b * int(h[_PAGES]), 2 * int(h[_WRITE_BACK]), 2 * int(h[_LOAD_BACK]), int(h[_ACKS])]

    def layout(self) -> tuple[np.ndarray, list[int]]:
        sizes = self._sizes()
        return _aligned_starts(sizes, HEADER_WORDS), sizes

    def part(self, index: int) -> np.ndarray:
        starts, sizes = self.layout()
        start = int(starts[index])
        return self.words[start:start + sizes[index]]

    @property
    def write_back(self) -> np.ndarray:
        return self.part(-3).reshape(-1, 2)

    @property
    def load_back(self) -> np.ndarray:
        return self.part(-2).reshape(-1, 2)

    @property
    def has_copies(self) -> bool:
        return bool(self.header[_WRITE_BACK] or self.header[_LOAD_BACK])

    @property
    def acks(self) -> list[int]:
        """Steps whose KV copies rank 0 has seen land (other ranks order their work after theirs)."""
        return (self.step_id - self.part(-1).astype(np.int64)).tolist()

    def view(self) -> PacketPlan:
        return PacketPlan(self)


class PacketPlan:
    """The plan attributes the forward reads (`ModelRunner.forward`, CUDA graphs), from a packet:
    what ranks other than 0 run instead of the scheduler's plan."""

    def __init__(self, packet: StepPacket):
        self.packet = packet
        self.step_id = packet.step_id
        self.num_decodes, self.num_prefills = packet.num_decodes, packet.num_prefills
        self.num_decode_tokens, self.max_query_len = packet.num_decode_tokens, packet.max_query_len
        self.input_ids = packet.part(0)
        self.query_start_loc = packet.part(3)
        self.seq_lens = packet.part(4)
        self.req_ids = np.empty(packet.num_rows, dtype=np.int64)  # only its length is read
        self.logits_indices = packet.part(5)
        self.page_table = packet.part(-4).reshape(packet.num_rows, -1)


def pack_plan(plan, host: torch.Tensor, *, acks: list[int] = (), pad_to: int = 0,
              report_load: bool = False) -> StepPacket:
    """Pack `plan` into `host` (int32, at least `packed_size(plan, len(acks))` words)."""
    num_tokens, num_rows = plan.input_ids.shape[0], plan.req_ids.shape[0]
    num_sampled = plan.logits_indices.shape[0]
    deferred = bool(num_tokens) and bool(plan.deferred_input_mask.any())
    parts = [plan.input_ids, plan.positions, plan.slot_mapping, plan.query_start_loc, plan.seq_lens,
             plan.logits_indices, plan.req_slots[plan.sample_batch_rows]]
    if deferred:  # in the same upload: a separate pageable copy would wait for the step in flight
        parts += [plan.deferred_input_mask, plan.deferred_src_index]
    step_id = int(plan.step_id)
    write_back, load_back = plan.write_back, plan.load_back
    parts += [plan.page_table.reshape(-1), write_back.reshape(-1), load_back.reshape(-1),
              step_id - np.asarray(acks, dtype=np.int64)]
    flags = (_DEFERRED if deferred else 0) | (_FORWARD_WAITS if plan.forward_waits_for_copies else 0) \
        | (_REPORT_LOAD if report_load else 0)
    packet = StepPacket(host)
    packet.header[:] = (KIND_STEP, step_id & 0xFFFFFFFF, step_id >> 32, num_tokens, num_rows, num_sampled,
                        plan.page_table.shape[-1] if plan.page_table.ndim == 2 else 0, plan.num_decodes, plan.num_decode_tokens, plan.max_query_len,
                        flags, write_back.shape[0], load_back.shape[0], len(acks), pad_to, 0)
    starts, sizes = packet.layout()
    for part, start, size in zip(parts, starts.tolist(), sizes, strict=True):
        packet.words[start:start + size] = part
    packet.header[_TOTAL] = int(starts[-1]) + sizes[-1]
    return packet


def packed_size(plan, num_acks: int = 0) -> int:
    """Words `pack_plan` needs for `plan` (an upper bound)."""
    t, b = plan.input_ids.shape[0], plan.req_ids.shape[0]
    s = plan.logits_indices.shape[0]
    copies = 2 * (plan.write_back.shape[0] + plan.load_back.shape[0])
    return HEADER_WORDS + 5 * t + 2 * b + 2 * s + plan.page_table.size + copies + num_acks + 12 * 4


def stop_packet(host: torch.Tensor) -> StepPacket:
    packet = StepPacket(host)
    packet.header[:] = 0
    packet.header[_KIND], packet.header[_TOTAL] = KIND_STOP, HEADER_WORDS
    return packet


class InputBuilder:
    def __init__(self, device: torch.device, step_io: str = STEP_IO_MODES[0]):
        self.device = device
        self._uploads = PacketUploads(device, step_io)  # how the packet goes up (step_io.py)
        self._pinned = device.type == "cuda"
        self._staging: list[torch.Tensor] = []
        self._turn = 0
        self._staged: StepPacket | None = None  # packed (and broadcast) by the caller for the next build

    def host_buffer(self, n: int) -> torch.Tensor:
        """A host int32 buffer of at least n words: fresh on CPU (the step's tensors are views of
        it), one of two alternating pinned buffers on GPU."""
        if not self._pinned:
            return torch.empty(n, dtype=torch.int32)
        if not self._staging or self._staging[0].numel() < n:
            size = max(n, 1 << 16)
            self._staging = [torch.empty(size, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self._turn ^= 1
        return self._staging[self._turn]

    def pack(self, plan, *, acks: list[int] = (), pad_to: int = 0, report_load: bool = False,
             min_words: int = 0) -> StepPacket:
        host = self.host_buffer(max(packed_size(plan, len(acks)), min_words))
        return pack_plan(plan, host, acks=acks, pad_to=pad_to, report_load=report_load)

    def stage(self, packet: StepPacket) -> None:
        """Have the next `build` use `packet` (already packed for its plan) instead of packing again."""
        self._staged = packet

    def build(self, plan, prev_sampled: torch.Tensor | None) -> StepTensors:
        packet, self._staged = self._staged, None
        if packet is None or packet.step_id != int(plan.step_id):
            packet = self.pack(plan)
        t = self.unpack(packet, prev_sampled)
        # Host copies the sampler reads, from the plan: the packet's buffer is reused two steps on.
        t.h_sample_slots = plan.req_slots[plan.sample_batch_rows]
        t.h_sample_req_ids = plan.req_ids[plan.sample_batch_rows]
        return t

    def unpack(self, packet: StepPacket, prev_sampled: torch.Tensor | None) -> StepTensors:
        """Device tensors of a step packet: one upload, then views (the same on every rank)."""
        starts, sizes = packet.layout()
        end = int(starts[-4]) + sizes[-4]  # through the page table: copies and acks stay on the host
        host = packet.host
        dev = self._uploads.upload(host[:end])
        views = [dev[start:start + size] for start, size in zip(starts.tolist()[:-3], sizes[:-3], strict=True)]
        qsl, seq_lens, page_table = views[3], views[4], views[-1]
        # The int64 parts (and the int32 ones between them) widened by one kernel, not one each: a decode
        # step's small kernels outside its graph are what batch 1 pays beside the graph.
        parts = (0, 1, 2, 5, 6) + ((7, 8) if packet.deferred else ())
        first = int(starts[0])
        wide = dev[first:int(starts[parts[-1]]) + sizes[parts[-1]]].long()
        input_ids, positions, slot_mapping, logits_indices, sample_slots, *deferred = (
            wide[int(starts[i]) - first:int(starts[i]) - first + sizes[i]] for i in parts)
        if packet.deferred:
            # Overlap protocol: these positions take the previous step's sample, still on the device.
            if prev_sampled is None:
                raise RuntimeError("plan has deferred inputs but no previous step was sampled")
            mask, src = deferred[0] != 0, deferred[1].clamp_(min=0)
            input_ids = torch.where(mask, prev_sampled[src], input_ids)
        else:
            mask = src = None
        return StepTensors(
            input_ids=input_ids, positions=positions, slot_mapping=slot_mapping,
            query_start_loc=qsl, seq_lens=seq_lens, page_table=page_table.view(packet.num_rows, -1),
            logits_indices=logits_indices, sample_slots=sample_slots,
            h_sample_slots=packet.part(6), h_sample_req_ids=None, deferred_mask=mask, deferred_src=src)

"""Plan (numpy views) -> device tensors, with no per-request Python loop.

Every integer array of the plan is packed into one int32 buffer with a single `np.concatenate`
(into pinned staging memory on GPU) and moved with one non-blocking copy; the device-side views
are then sliced out of it. Two staging buffers alternate so step N+1 can be packed while step N's
upload is still in flight (overlap scheduling).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


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
    h_sample_req_ids: np.ndarray     # int64 [S]: scheduler request id of each sampled position


def upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on `device` without stalling: through pinned memory, non-blocking. (A copy
    from pageable memory makes the CPU wait until the step in flight is done, undoing the overlap.)"""
    host = torch.from_numpy(np.ascontiguousarray(array))
    return host if device.type == "cpu" else host.pin_memory().to(device, non_blocking=True)


class InputBuilder:
    def __init__(self, device: torch.device):
        self.device = device
        self._pinned = device.type == "cuda"
        self._staging: list[torch.Tensor] = []
        self._turn = 0

    def _stage(self, n: int) -> tuple[np.ndarray, torch.Tensor]:
        """A host int32 buffer of n elements: (numpy view to fill, tensor to upload)."""
        if not self._pinned:
            host = torch.empty(n, dtype=torch.int32)
            return host.numpy(), host
        if not self._staging or self._staging[0].numel() < n:
            size = max(n, 1 << 16)
            self._staging = [torch.empty(size, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self._turn ^= 1
        host = self._staging[self._turn][:n]
        return host.numpy(), host

    def build(self, plan, prev_sampled: torch.Tensor | None) -> StepTensors:
        num_tokens, num_rows = plan.input_ids.shape[0], plan.req_ids.shape[0]
        num_sampled = plan.logits_indices.shape[0]
        h_sample_slots = plan.req_slots[plan.sample_batch_rows]
        deferred = bool(num_tokens) and bool(plan.deferred_input_mask.any())
        parts = [plan.input_ids, plan.positions, plan.slot_mapping, plan.query_start_loc, plan.seq_lens,
                 plan.logits_indices, h_sample_slots]
        sizes = [num_tokens, num_tokens, num_tokens, num_rows + 1, num_rows, num_sampled, num_sampled]
        if deferred:  # in the same upload: a separate pageable copy would wait for the step in flight
            parts += [plan.deferred_input_mask, plan.deferred_src_index]
            sizes += [num_tokens, num_tokens]
        parts.append(plan.page_table.reshape(-1))
        sizes.append(plan.page_table.size)
        # Each part starts on a 16-byte boundary: kernels specialise on pointer alignment, and an
        # alignment that changed with the step's shape would recompile them mid-run.
        starts = np.zeros(len(sizes), dtype=np.int64)
        starts[1:] = np.cumsum((np.asarray(sizes[:-1]) + 3) // 4 * 4)
        packed, host = self._stage(int(starts[-1]) + sizes[-1])
        for part, start, size in zip(parts, starts.tolist(), sizes, strict=True):
            packed[start:start + size] = part
        dev = host if self.device.type == "cpu" else host.to(self.device, non_blocking=True)
        views = [dev[start:start + size] for start, size in zip(starts.tolist(), sizes, strict=True)]
        input_ids, positions, slot_mapping, qsl, seq_lens, logits_indices, sample_slots = views[:7]
        page_table = views[-1]
        input_ids = input_ids.long()
        if deferred:
            # Overlap protocol: these positions take the previous step's sample, still on the device.
            if prev_sampled is None:
                raise RuntimeError("plan has deferred inputs but no previous step was sampled")
            mask, src = views[7].bool(), views[8].long().clamp_(min=0)
            input_ids = torch.where(mask, prev_sampled[src], input_ids)
        return StepTensors(
            input_ids=input_ids, positions=positions.long(), slot_mapping=slot_mapping.long(),
            query_start_loc=qsl, seq_lens=seq_lens, page_table=page_table.view(num_rows, -1),
            logits_indices=logits_indices.long(), sample_slots=sample_slots.long(),
            h_sample_slots=h_sample_slots, h_sample_req_ids=plan.req_ids[plan.sample_batch_rows])

"""This worker's place in vLLM's tensor- and pipeline-parallel groups.

vLLM's tensorizer loader names per-rank files by the TP rank alone, so two
pipeline stages with the same TP rank read (and ``tensorize_vllm_model``
writes) the same file. Here the file rank is ``pp_rank * tp_size +
tp_rank`` of ``tp_size * pp_size`` files: with PP=1 that is the TP rank, so
files vLLM wrote load unchanged, and with PP>1 every stage has its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ranks:
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    # The TP group a cooperative load exchanges over, None when single: its
    # device group where that is NCCL (GPUs), else its CPU (gloo) group.
    tp_group: Any = None

    @property
    def file_rank(self) -> int:
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def file_count(self) -> int:
        return self.tp_size * self.pp_size


def current() -> Ranks:
    """The ranks from vLLM's initialized groups; rank 0 of 1 when vLLM's
    model-parallel state is not initialized (a plain single-process use)."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return Ranks()
    tp, pp = ps.get_tp_group(), ps.get_pp_group()
    group = None
    if tp.world_size > 1:
        nccl = "nccl" in str(dist.get_backend(tp.device_group)).lower()
        group = tp.device_group if nccl else tp.cpu_group
    return Ranks(tp.rank_in_group, tp.world_size, pp.rank_in_group, pp.world_size, group)

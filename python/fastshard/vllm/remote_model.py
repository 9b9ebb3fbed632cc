"""``vllm serve s3://bucket/prefix --load-format tensorizer`` (or
``fastshard``): the seed's own command; ``gs://bucket/prefix`` the same way.

vLLM 0.32 to 0.34 accept object-storage model paths only for Run:ai's and
ModelExpress's formats: ``ModelConfig`` pulls config and tokenizer through
Run:ai's streamer, then ``VllmConfig`` refuses every other load format.
When the plugin registers in a process that builds engine arguments (the
front end, or the process that creates ``vllm.LLM``), this module wraps
``EngineArgs.create_model_config``, and only for a remote model path with
one of fastshard's formats: it fetches the prefix's non-weight files into
the node's cache (``artifacts.py``: listed by serialization, sizes and
SHA-256 checked, escaping names refused, fetched once per node under a
lock), points the model and tokenizer at the cache, keeps the URI as the
served model name, and gives the loader the prefix as its weights'
``uri``. vLLM's own checks then see a local model and pass; workers
receive the rewritten config and fetch nothing. Every other model path and
format goes through vLLM untouched.

The patch names the vLLM version it finds (versions.py); when the
internals it relies on are not there it says so (a warning at
registration, or an error naming the version when such a model path is
used), and ``fastshard serve`` stays as the explicit route.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .._core import location as _location
from .._core import source_options
from ..errors import InvalidArgumentError, UnsupportedError
from .artifacts import cache_dir_for, fetch_artifacts
from .config import parse_extra_config
from .versions import tested, vllm_version

log = logging.getLogger("vllm.fastshard")

# The object-storage schemes vLLM's engine arguments leave alone until the
# model config is made (its is_cloud_storage) that fastshard also reads.
# vLLM resolves any other URL as a Hugging Face repo (its speculator check,
# its offline mode) before that, so http(s):// prefixes go through
# `fastshard serve` instead; az:// has no fastshard client yet.
REMOTE_KINDS = ("s3", "gs")
_PATCHED = "__fastshard_remote_model__"
# EngineArgs fields the rewrite reads and sets.
_FIELDS = ("model", "tokenizer", "load_format", "model_loader_extra_config", "served_model_name")


def is_remote(model: object) -> bool:
    # The scheme's case is not significant (RFC 3986), the rest of the URI is.
    return isinstance(model, str) and _location.kind(model.lower()) in REMOTE_KINDS


def _extra_dict(extra: object) -> dict[str, Any]:
    """The user's extra config as a plain dict (vLLM passes it as given)."""
    if extra is None:
        return {}
    if isinstance(extra, (str, bytes, bytearray)):
        extra = json.loads(extra)
    to_serializable = getattr(extra, "to_serializable", None)
    if callable(to_serializable):
        extra = to_serializable()
    if not isinstance(extra, Mapping):
        raise InvalidArgumentError(
            f"model_loader_extra_config must be a JSON object, not {type(extra).__name__}"
        )
    return dict(extra)


def redirect(args: Any, formats: tuple[str, ...]) -> None:
    """Rewrite ``args`` (vLLM's EngineArgs) in place when its model is a
    remote prefix and its load format one of ``formats``."""
    model = getattr(args, "model", None)
    if not is_remote(model) or getattr(args, "load_format", None) not in formats:
        return
    missing = [f for f in _FIELDS if not hasattr(args, f)]
    if missing:
        raise UnsupportedError(
            f"fastshard cannot serve the model path {model} with vLLM {vllm_version()}: its "
            f"EngineArgs has no {', '.join(missing)} (tested with vLLM "
            f"{tested()}); use `fastshard serve {model}` instead",
            uri=model,
        )
    assert isinstance(model, str)
    prefix = _location.as_directory(model)
    extra = _extra_dict(args.model_loader_extra_config)
    opts = source_options(parse_extra_config(extra).open_opts)
    cache = cache_dir_for(prefix)
    fetched = fetch_artifacts(prefix, cache, opts)
    log.info(
        "fastshard: %s: %d model files (config, tokenizer) in %s; weights read from the prefix",
        prefix,
        len(fetched),
        cache,
    )
    if not any(extra.get(k) for k in ("uri", "tensorizer_uri")):
        extra["uri"] = prefix
    args.model_loader_extra_config = extra
    if args.tokenizer in (None, model):
        args.tokenizer = str(cache)
    if not args.served_model_name:
        args.served_model_name = model
    args.model = str(cache)


def install(formats: Callable[[], list[str]]) -> bool:
    """Wrap EngineArgs.create_model_config in this process, once; False
    when vLLM's engine arguments are not imported here (a worker) or the
    method is not there."""
    module = sys.modules.get("vllm.engine.arg_utils")
    engine_args = getattr(module, "EngineArgs", None) if module is not None else None
    if engine_args is None:
        return False
    original = getattr(engine_args, "create_model_config", None)
    if original is None:
        log.warning(
            "fastshard: vLLM %s has no EngineArgs.create_model_config: s3:// and gs:// "
            "model paths are left to vLLM, which refuses them for tensorizer and fastshard; "
            "use `fastshard serve URI` (tested with vLLM %s)",
            vllm_version(),
            tested(),
        )
        return False
    if getattr(original, _PATCHED, False):
        return True

    def create_model_config(self: Any) -> Any:
        redirect(self, tuple(formats()))
        return original(self)

    setattr(create_model_config, _PATCHED, True)
    create_model_config.__wrapped__ = original  # type: ignore[attr-defined]
    engine_args.create_model_config = create_model_config
    return True

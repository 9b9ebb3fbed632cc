"""One packed object for all ranks: every rank's tensors in one tensorizer file.

Encoding. Rank r's tensor ``name`` is stored under the plain tensorizer name
``@rank{r}/{name}`` (r in decimal, no leading zeros): ``@rank0/lm_head.weight``,
``@rank1/.scale`` (``write_module``'s root tensors keep their ``.``). A name
is opaque UTF-8 to tensorizer, and ``@`` cannot start a Python identifier, so
no module attribute can collide with the prefix. Nested state dicts
(tensorizer's path names) carry the prefix on their first key: the path
``["@rank0/layers", 0, "w"]``, shown as ``@rank0/layers.0.w``; a state dict
whose top level is a list has no key to carry it and is refused.

A file is packed when *every* tensor name starts with ``@rank<digits>/``;
mixing prefixed and plain names is a FormatError. Its world size is the
number of distinct ranks, which must be exactly 0..W-1. ``save_sharded(...,
packed=True)`` writes the records rank by rank (rank 0's tensors first, in
state-dict order), so each rank's bytes are one contiguous range; reading
does not depend on that order (a file tensorizer wrote with these names in
any order loads the same), only the number of ranged reads does.

Opened with ``rank=r``, a packed file shows only rank r's tensors, under
their names without the prefix, and loads read only their byte ranges.
Opened with ``rank=None`` it shows every tensor under its stored name, so
``inspect``/``verify`` and whole-file copies still work. There is no
separate manifest: the index is the manifest.

The code is ``fastshard._layouts.packed``; this module re-exports its names.
"""

from __future__ import annotations

from ._layouts.packed import Entry as Entry
from ._layouts.packed import PackedIndex as PackedIndex
from ._layouts.packed import PathPart as PathPart
from ._layouts.packed import check as check
from ._layouts.packed import check_all_ranks as check_all_ranks
from ._layouts.packed import check_rank as check_rank
from ._layouts.packed import describe as describe
from ._layouts.packed import detect as detect
from ._layouts.packed import prefix as prefix
from ._layouts.packed import prefixed as prefixed
from ._layouts.packed import rank_of as rank_of
from ._layouts.packed import summary as summary
from ._layouts.packed import view as view

__all__ = [
    "PathPart",
    "Entry",
    "PackedIndex",
    "check",
    "check_all_ranks",
    "check_rank",
    "describe",
    "detect",
    "prefix",
    "prefixed",
    "rank_of",
    "summary",
    "view",
]

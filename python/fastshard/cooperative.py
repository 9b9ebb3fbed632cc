"""Cooperative loads: the ranks of a torch.distributed group fetch each
byte of one object once between them and send each other only what each
one keeps. The load engine runs one where ``cooperative=True`` is asked
for; the code and the account of how it works are
``fastshard._coop.load``, whose names this module re-exports."""

from __future__ import annotations

from ._coop.load import Item as Item
from ._coop.load import load as load

__all__ = ["Item", "load"]

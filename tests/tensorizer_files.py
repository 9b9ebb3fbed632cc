"""Files of the real tensorizer: written and read by tensorizer itself, and
the byte positions of an unversioned file's index entries and record
fields, for tests that patch them."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import torch


def tensorizer_write(obj: Any, path: Path, **kwargs: Any) -> Path:
    """Write ``obj`` with the real tensorizer: ``write_module`` for modules,
    ``write_state_dict`` otherwise."""
    from tensorizer import TensorSerializer

    ser = TensorSerializer(str(path))
    if isinstance(obj, torch.nn.Module):
        ser.write_module(obj, **kwargs)
    else:
        ser.write_state_dict(obj, **kwargs)
    ser.close()
    return path


def tensorizer_read(path: Path, **kwargs: Any) -> dict[Any, torch.Tensor]:
    from tensorizer import TensorDeserializer

    with TensorDeserializer(str(path), device="cpu", **kwargs) as d:
        return {k: v.detach().clone() for k, v in d.items()}


def layout(path: Path) -> list[dict[str, Any]]:
    """Byte positions of every index entry and record field of an
    unversioned (data version < 5) file, for patching tests."""
    data = Path(path).read_bytes()
    count, mlen = struct.unpack_from("<QQ", data, 0x39)
    pos = 0x49
    out = []
    for _ in range(count):
        entry = pos
        (nl,) = struct.unpack_from("<H", data, pos)
        name = data[pos + 2 : pos + 2 + nl]
        pos += 2 + nl + 1
        dl = data[pos]
        pos += 1 + dl
        nd = data[pos]
        dims = struct.unpack_from(f"<{nd}I", data, pos + 1)
        pos += 1 + 4 * nd
        ho, do, dlen = struct.unpack_from("<QQQ", data, pos)
        rec_dtype = ho + 8 + 2 + 1 + 2 + nl + 1
        out.append(
            {
                "name": name.decode("utf-8", "replace"),
                "entry": entry,
                "offsets_at": pos,  # header_offset, data_offset, data_length (3 × u64)
                "dims": dims,
                "header_offset": ho,
                "data_offset": do,
                "data_length": dlen,
                "record_dtype_at": rec_dtype,
                "record_dims_at": rec_dtype + dl + 1,
            }
        )
        pos += 24
    assert pos <= 0x49 + mlen
    return out


def patch(path: Path, offset: int, new: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(new)

"""Files made in the tests (no binary fixtures): images with Pillow, PDFs by hand (with and without a
text layer), a PNG whose header claims more pixels than any limit; and uploads through the real door."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

from django.test import AsyncClient
from PIL import Image


def png(width: int = 64, height: int = 48, color: tuple[int, ...] = (200, 30, 30), mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), color).save(out, format="PNG")
    return out.getvalue()


def jpeg_with_exif(width: int = 640, height: int = 480) -> bytes:
    """A JPEG carrying EXIF (a camera make and a GPS-ish tag) that says it is rotated (orientation 6)."""
    image = Image.new("RGB", (width, height), (10, 120, 200))
    exif = Image.Exif()
    exif[0x010F] = "FakeCam"  # Make
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to view
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif.tobytes())
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims `width` x `height` pixels (a decompression bomb's calling card)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    row = b"\x00" + b"\x00" * min(width, 64)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(row)) + _chunk(b"IEND", b"")


def png_bomb(side: int = 7000) -> bytes:
    """A real PNG of `side` x `side` black pixels: small compressed, huge decoded."""
    out = io.BytesIO()
    Image.new("1", (side, side), 0).save(out, format="PNG", optimize=True)
    return out.getvalue()


def pdf(*pages: str) -> bytes:
    """A PDF by hand, one page per text ("" for a page with no text at all: no text layer)."""
    objects: list[bytes] = []
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(len(pages)))
    font = 3 + 2 * len(pages)
    objects.append(b"<</Type/Catalog/Pages 2 0 R>>")
    objects.append(f"<</Type/Pages/Kids[{kids}]/Count {len(pages)}>>".encode())
    for i, text in enumerate(pages):
        stream = f"BT /F1 14 Tf 20 100 Td ({text}) Tj ET".encode() if text else b""
        objects.append(
            f"<</Type/Page/Parent 2 0 R/MediaBox[0 0 400 200]/Contents {4 + 2 * i} 0 R"
            f"/Resources<</Font<</F1 {font} 0 R>>>>>>".encode()
        )
        objects.append(f"<</Length {len(stream)}>>\nstream\n".encode() + stream + b"\nendstream")
    objects.append(b"<</Type/Font/Subtype/Type1/BaseFont/Helvetica>>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<</Size {len(objects) + 1}/Root 1 0 R>>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


async def upload(
    raw_key: str | None, data: bytes, name: str = "file.bin", *, client: AsyncClient | None = None, **headers: Any
) -> Any:
    """POST /api/files with the bytes in the multipart field `file` (an API key, or `client`'s cookie)."""
    client = client or AsyncClient()
    if raw_key is not None:
        headers["Authorization"] = f"Bearer {raw_key}"
    return await client.post("/api/files", {"file": _named(data, name)}, headers=headers)


def _named(data: bytes, name: str) -> io.BytesIO:
    handle = io.BytesIO(data)
    handle.name = name
    return handle

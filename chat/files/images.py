"""An image as a vision model is sent it: a `data:` URL of the image re-encoded (so no EXIF or other
metadata goes along), turned upright as its EXIF said, and downscaled to the agent's pixel budget."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterable
from typing import Any

from PIL import Image, ImageOps

from chat.files.content import check_image
from sessions_app import files


def model_image(data: bytes, max_pixels: int) -> str:
    """`data` (a stored image) as a data URL within `max_pixels`: PNG when it has transparency, else JPEG."""
    check_image(data)  # the decompression guard, before any pixel is decoded
    with Image.open(io.BytesIO(data)) as source:
        source.seek(0)  # an animation's first frame
        image = ImageOps.exif_transpose(source)
        width, height = image.size
        if width * height > max_pixels:
            scale = math.sqrt(max_pixels / (width * height))
            size = (max(1, int(width * scale)), max(1, int(height * scale)))
            image = image.resize(size, Image.Resampling.LANCZOS)
        alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
        out = io.BytesIO()
        if alpha:
            image.convert("RGBA").save(out, format="PNG", optimize=True)
            mime = "image/png"
        else:
            image.convert("RGB").save(out, format="JPEG", quality=85)
            mime = "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(out.getvalue()).decode('ascii')}"


def file_ids(attachments: Iterable[dict[str, Any]]) -> list[str]:
    """The stored images among these attachments."""
    return [str(a["fileId"]) for a in attachments if a.get("text") is None and a.get("fileId")]


def load(ids: Iterable[str], max_pixels: int) -> dict[str, str]:
    """These stored images as data URLs, by file id (read and converted on a worker thread)."""
    found = files.bytes_of(set(ids))
    return {file_id: model_image(data, max_pixels) for file_id, data in found.items()}

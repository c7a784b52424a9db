"""What a file is, from its bytes and never its name: an image, a document (text, Markdown, CSV, JSON,
PDF), or refused; within the limits of the settings; a document's text as the model reads it."""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from dataclasses import dataclass

from django.conf import settings
from PIL import Image, UnidentifiedImageError
from pypdf import PdfReader
from pypdf.errors import PyPdfError

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp")
TEXT_TYPES = ("text/plain", "text/markdown", "text/csv", "application/json")
DOCUMENT_TYPES = (*TEXT_TYPES, "application/pdf")
ACCEPTED_TYPES = (*IMAGE_TYPES, *DOCUMENT_TYPES)
# What a text file's name may add to "it is text": which text it is (harmless either way).
_TEXT_BY_SUFFIX = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".csv": "text/csv",
    ".json": "application/json",
}
NO_TEXT_LAYER = "(this PDF has no text layer: its pages are images, and no text could be read from it)"

_IMAGE_MAGIC: list[tuple[bytes, str]] = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
]


class FileRefused(Exception):
    """A file the gateway does not take; `reason` is a stable word, `status` the HTTP status for it."""

    def __init__(self, message: str, reason: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Inspected:
    """A file as its bytes say: its type, size, hash, and a document's text (None for an image)."""

    mime_type: str
    size: int
    sha256: str
    text: str | None

    @property
    def is_image(self) -> bool:
        return self.text is None


def sniff(data: bytes) -> str:
    """Best-effort kind of `data`: an image/* type, `application/pdf`, `text`, or `binary`."""
    for magic, mime in _IMAGE_MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    if b"\x00" in data:
        return "binary"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    return "text"


def text_type(data: bytes, name: str | None, declared: str | None) -> str:
    """Which text a text file is: JSON only when it parses; otherwise as its name or declared type says."""
    suffix = "." + name.rsplit(".", 1)[-1].lower() if name and "." in name else ""
    wanted = _TEXT_BY_SUFFIX.get(suffix) or (declared if declared in TEXT_TYPES else "text/plain")
    if wanted == "application/json":
        try:
            json.loads(data)
        except ValueError:
            return "text/plain"
    return wanted


def check_size(size: int, image: bool) -> None:
    limit = settings.GATEWAY_MAX_IMAGE_BYTES if image else settings.GATEWAY_MAX_ATTACHMENT_BYTES
    if size > limit:
        kind = "an image" if image else "a file"
        raise FileRefused(f"{kind} is at most {limit} bytes (this one is {size})", "too-large", 413)


def check_image(data: bytes) -> tuple[int, int]:
    """The image's size in pixels, read from its header (nothing decoded); refused past the pixel limit."""
    limit = settings.GATEWAY_MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning, OSError) as exc:
        if isinstance(exc, Image.DecompressionBombError | Image.DecompressionBombWarning):
            raise FileRefused(f"the image has more than {limit} pixels", "image-too-large", 413) from exc
        raise FileRefused("the image cannot be read", "bad-image") from exc
    if width * height > limit:
        raise FileRefused(f"the image is {width}x{height} pixels, more than {limit}", "image-too-large", 413)
    return width, height


def pdf_text(data: bytes) -> str:
    """The text of a PDF's pages (page breaks as blank lines), or `NO_TEXT_LAYER` when it has none."""
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise FileRefused("the PDF is encrypted", "unreadable-pdf")
        pages = []
        total = 0
        for page in reader.pages:
            text = (page.extract_text() or "").strip()
            pages.append(text)
            total += len(text)
            if total > settings.GATEWAY_MAX_DOCUMENT_CHARS:
                break
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise FileRefused("the PDF cannot be read", "unreadable-pdf") from exc
    text = "\n\n".join(p for p in pages if p)
    return text if text.strip() else NO_TEXT_LAYER


def inspect(data: bytes, *, name: str | None = None, declared: str | None = None) -> Inspected:
    """What `data` is, checked against the limits; raise FileRefused for anything not taken.

    The type comes from the bytes: an image by its magic, a PDF by its header, text when it is
    UTF-8 without NUL bytes. A name or declared type only says which text a text file is."""
    kind = sniff(data)
    if kind == "binary":
        raise FileRefused(
            "this type of file is not accepted"
            " (images: PNG, JPEG, GIF, WebP; documents: text, Markdown, CSV, JSON, PDF)",
            "unsupported-type",
            415,
        )
    image = kind.startswith("image/")
    check_size(len(data), image)
    digest = hashlib.sha256(data).hexdigest()
    if image:
        check_image(data)
        return Inspected(kind, len(data), digest, None)
    if kind == "application/pdf":
        return Inspected(kind, len(data), digest, _capped(pdf_text(data)))
    text = data.decode("utf-8").removeprefix("\ufeff")
    return Inspected(text_type(data, name, declared), len(data), digest, _capped(text))


def _capped(text: str) -> str:
    limit = settings.GATEWAY_MAX_DOCUMENT_CHARS
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n(document cut at {limit} characters)"

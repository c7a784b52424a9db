"""Stored files: what a user uploaded or attached (bytes in the `attachments` storage) and which runs
use them. Only the domain (`sessions_app.files`, the lifecycle) writes these rows."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class StoredFile(models.Model):
    """A file a user uploaded or attached: its bytes live in the `attachments` storage under
    `storage_name`; the row says whose they are and what they are (sniffed, never from the name)."""

    file_id = models.CharField(max_length=40, unique=True)  # "file-" + 32 hex: what clients name it by
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="stored_files")
    sha256 = models.CharField(max_length=64)
    mime_type = models.CharField(max_length=100)
    name = models.CharField(max_length=255, blank=True, default="")
    size = models.PositiveBigIntegerField()
    storage_name = models.CharField(max_length=300)
    # a document's text as the model reads it (a PDF's extracted text); null for an image
    text = models.TextField(null=True, blank=True)  # noqa: DJ001  (null: an image, "": an empty document)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "sha256"], name="storedfile_owner_sha")]

    def __str__(self) -> str:
        return f"{self.file_id} ({self.mime_type}, {self.size} bytes)"


class RunFile(models.Model):
    """A run's use of a stored file (one row per attachment): the file lives while a run uses it."""

    run = models.ForeignKey("sessions_app.Run", on_delete=models.CASCADE, related_name="files")
    file = models.ForeignKey(StoredFile, on_delete=models.CASCADE, related_name="uses")
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "position"], name="runfile_run_position")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.position} -> {self.file_id}"

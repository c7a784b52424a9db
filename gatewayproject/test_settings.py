"""Test settings: the production settings with fast hashing and a file-backed test DB."""

import atexit
import os
import shutil
import tempfile

from gatewayproject.settings import *  # noqa: F403
from gatewayproject.settings import DATABASES

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Consumers run ORM work on executor threads: an in-memory DB would not be shared.
    # One file per test process, so concurrent runs never share (and break) a database.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / f"test_db_{os.getpid()}.sqlite3")}  # noqa: F405
GATEWAY_REPAIR_SECONDS = 1.0
GATEWAY_HEARTBEAT_SECONDS = 1.0
# Stored files go to a directory of this process's own, never the project folder; gone at its exit.
_FILES_DIR = tempfile.mkdtemp(prefix="agentgate-files-")
atexit.register(shutil.rmtree, _FILES_DIR, ignore_errors=True)
STORAGES["attachments"] = {  # noqa: F405
    "BACKEND": "django.core.files.storage.FileSystemStorage",
    "OPTIONS": {"location": _FILES_DIR},
}

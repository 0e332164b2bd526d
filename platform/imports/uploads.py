"""Uploads are streamed to disk under `LAB_VAR_DIR` (`FILE_UPLOAD_TEMP_DIR`), never held in memory,
and cut off once a file passes `LAB_IMPORT_MAX_BYTES`: `SizeCap` comes first among the upload
handlers (settings), writes nothing past it, and leaves the reason on the request
(`refusal(request)`), which the import page and the API answer with, naming the file."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpRequest

REFUSAL = "lab_upload_refusal"


class SizeCap(FileUploadHandler):
    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        cap = settings.LAB_IMPORT_MAX_BYTES
        if start + len(raw_data) <= cap:
            return raw_data
        setattr(
            self.request,
            REFUSAL,
            f"{self.file_name} is more than {cap:,} bytes, the most an import may be (LAB_IMPORT_MAX_BYTES)",
        )
        # Past the cap nothing more is written (None: the next handlers get none of it); the rest is
        # read and dropped, so the form's other fields still arrive, and the part written goes with
        # the request.
        return None

    def file_complete(self, file_size: int) -> None:
        return None  # the next handler (to a temporary file) makes the file


def refusal(request: HttpRequest) -> str:
    """Why the request's upload was cut off ("" if it was not)."""
    return getattr(request, REFUSAL, "")


@contextmanager
def staged(upload: UploadedFile) -> Iterator[Path]:
    """The uploaded file under its own name in a folder of its own under `LAB_IMPORTS_DIR` (readers
    name the file in their errors), removed afterwards."""
    folder = Path(tempfile.mkdtemp(dir=settings.LAB_IMPORTS_DIR))
    try:
        target = folder / (Path(upload.name or "").name or "upload")
        try:
            os.link(upload.temporary_file_path(), target)
        except OSError:
            shutil.copyfile(upload.temporary_file_path(), target)
        yield target
    finally:
        shutil.rmtree(folder, ignore_errors=True)

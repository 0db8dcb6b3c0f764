"""The S3 object store of work inputs and results (stores.ObjectStore).

Inputs are written by the control plane at submission; results are uploaded by the lease holder
straight to S3 with a presigned PUT (the bytes never pass through the API), read back once
at completion to check their digest, and copied to where no upload URL reaches (``copy``). The
admin API reads inputs and sealed results back (``read``) for the console.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

_CHUNK = 1024 * 1024
_MISSING = {"404", "NoSuchKey", "NotFound"}


class S3ObjectStore:
    def __init__(self, client: Callable[[], Any], bucket: str) -> None:
        """``client`` makes the S3 client when first needed (boto3 is not loaded at cold start)."""
        self._client = client
        self._bucket = bucket

    @functools.cached_property
    def _s3(self) -> Any:
        return self._client()

    def put(self, key: str, body: bytes, content_type: str) -> None:
        self._s3.put_object(Bucket=self._bucket, Key=key, Body=body, ContentType=content_type)

    def presigned_get(self, key: str, expires_seconds: int) -> str:
        return str(
            self._s3.generate_presigned_url(
                "get_object", Params={"Bucket": self._bucket, "Key": key}, ExpiresIn=expires_seconds
            )
        )

    def presigned_put(self, key: str, expires_seconds: int) -> str:
        return str(
            self._s3.generate_presigned_url(
                "put_object", Params={"Bucket": self._bucket, "Key": key}, ExpiresIn=expires_seconds
            )
        )

    def copy(self, source_key: str, key: str) -> bool:
        source = {"Bucket": self._bucket, "Key": source_key}
        copied = _unless_missing(lambda: self._s3.copy_object(Bucket=self._bucket, Key=key, CopySource=source))
        return copied is not None

    def read(self, key: str, max_bytes: int) -> bytes | int | None:
        found = _unless_missing(lambda: self._s3.get_object(Bucket=self._bucket, Key=key))
        if found is None:
            return None
        body = found["Body"]
        try:
            size = int(found["ContentLength"])
            return size if size > max_bytes else bytes(body.read(max_bytes + 1))
        finally:
            body.close()

    def digest(self, key: str, max_bytes: int) -> tuple[str | None, int] | None:
        head = _unless_missing(lambda: self._s3.head_object(Bucket=self._bucket, Key=key))
        if head is None:
            return None
        size = int(head["ContentLength"])
        if size > max_bytes:
            return None, size
        body = self._s3.get_object(Bucket=self._bucket, Key=key)["Body"]
        digest, read = hashlib.sha256(), 0
        try:
            for chunk in iter(lambda: body.read(_CHUNK), b""):
                read += len(chunk)
                if read > max_bytes:
                    return None, read
                digest.update(chunk)
        finally:
            body.close()
        return digest.hexdigest(), read


def _unless_missing(call: Callable[[], Any]) -> Any:
    """``call()``'s answer, or None when S3 says there is no such object (or no copy source)."""
    try:
        return call()
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in _MISSING:
            return None
        raise

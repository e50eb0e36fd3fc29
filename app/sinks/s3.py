"""Object storage sink (S3 API): one object per envelope.

Each record becomes the object the binding describes (`app.bindings.s3.encode`):
key `<prefix>/YYYY/MM/DD/<topic>/<message_id>.bin`, body = the exact envelope bytes the
worker signed, `prism-*` user metadata, `application/protobuf` content type.

**Idempotency.** The key is derived from the message id, so a replay addresses the same
object. The sink writes with `If-None-Match: *` (S3 conditional writes): the first write
creates the object, a replay is refused by the server with `412 PreconditionFailed`, which
the sink counts as a duplicate - the stored object, its metadata and its timestamps are
never rewritten. On a store that does not implement conditional writes (`501
NotImplemented`), the sink falls back to plain PUTs, which are still idempotent: same key,
same bytes, same metadata.

**Durability.** A PUT is acknowledged once the store has the object, so a batch's Kafka
offsets are committed only after every object is stored.

boto3 is synchronous; the sink runs PUTs on a private thread pool of `concurrency` threads.
Credentials come from boto3's usual chain (environment, shared config, instance role) -
never from the topology file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.bindings import s3 as s3b
from app.sinks.base import Sink, SinkRecord, WriteOutcome, url_secrets
from app.topology import S3SinkSpec

_DUPLICATE = "duplicate"
_WRITTEN = "written"


class S3Sink(Sink[s3b.S3Object]):
    kind = "s3"

    def __init__(self, name: str, *, bucket: str, endpoint: str | None = None, region: str = "us-east-1",
                 prefix: str = s3b.DEFAULT_KEY_PREFIX, create_bucket: bool = False, concurrency: int = 8,
                 timeout_s: float = 10.0) -> None:
        super().__init__(name, timeout_s=timeout_s, secrets=url_secrets(endpoint))
        self.bucket = bucket
        self.endpoint = endpoint
        self.region = region
        self.prefix = prefix
        self.create_bucket = create_bucket
        self.concurrency = concurrency
        self.conditional_writes = True
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_spec(cls, spec: S3SinkSpec) -> S3Sink:
        return cls(spec.name, bucket=spec.bucket, endpoint=spec.endpoint, region=spec.region, prefix=spec.prefix,
                   create_bucket=spec.create_bucket, concurrency=spec.concurrency, timeout_s=spec.timeout_ms / 1000)

    def encode(self, record: SinkRecord) -> s3b.S3Object:
        obj = s3b.encode(record.envelope, record.layout, prefix=self.prefix)
        return s3b.S3Object(obj.key, record.raw, obj.metadata, obj.content_type)  # the signed bytes

    async def _open(self) -> None:
        import boto3
        from botocore.config import Config

        cfg = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=min(self.timeout_s, 3.0),
                     read_timeout=self.timeout_s, max_pool_connections=self.concurrency)
        self._client = boto3.session.Session().client("s3", endpoint_url=self.endpoint, region_name=self.region,
                                                      config=cfg)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"prism-s3-{self.name}")
        await self._run(self._prepare_bucket)

    def _prepare_bucket(self) -> None:
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            if not self.create_bucket or exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                raise
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self._client.create_bucket(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou",):
                raise

    def _put(self, obj: s3b.S3Object) -> str:
        from botocore.exceptions import ClientError

        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": obj.key, "Body": obj.body,
                                  "Metadata": obj.metadata, "ContentType": obj.content_type}
        if self.conditional_writes:
            kwargs["IfNoneMatch"] = "*"
        try:
            self._client.put_object(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "PreconditionFailed":
                return _DUPLICATE
            if code == "NotImplemented" and self.conditional_writes:
                self.conditional_writes = False  # this store has no conditional writes
                return self._put(obj)
            raise
        return _WRITTEN

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _write(self, items: Sequence[s3b.S3Object]) -> WriteOutcome:
        results = await asyncio.gather(*(self._run(self._put, obj) for obj in items), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise self.error(f"{len(errors)} of {len(items)} object(s) were not stored", errors[0])
        dup = sum(1 for r in results if r == _DUPLICATE)
        return WriteOutcome(len(items) - dup, dup)

    async def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    async def stop(self) -> None:
        await super().stop()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def _ping(self) -> None:
        await self._run(lambda: self._client.head_bucket(Bucket=self.bucket))

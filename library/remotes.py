"""The remotes a library knows (table `remotes`, migration m013): names for S3 buckets and prefixes.
`Library.remotes`."""

from __future__ import annotations

import re

from .errors import LibraryError
from .index import Store
from .provenance import now
from .remote import RemoteSpec, parse_url

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class UnknownRemote(LibraryError):
    """No remote by that name."""


class RemoteStore(Store):
    def add(self, name: str, url: str, endpoint_url: str | None = None) -> RemoteSpec:
        if not _NAME.match(name or ""):
            raise LibraryError(f"a remote's name is letters, digits, '.', '_' or '-' (up to 64), not {name!r}")
        if endpoint_url is not None and not re.match(r"^https?://[^\s/]+(/\S*)?$", endpoint_url):
            raise LibraryError(f"--endpoint-url must be an http:// or https:// URL, not {endpoint_url!r}")
        bucket, prefix = parse_url(url)
        with self.write() as db:
            if db.execute("SELECT 1 FROM remotes WHERE name = ?", [name]).fetchone():
                raise LibraryError(f"a remote named {name!r} exists already (kvgraft remote rm {name} first)")
            db["remotes"].insert(
                {"name": name, "bucket": bucket, "prefix": prefix, "endpoint_url": endpoint_url, "added_at": now()}
            )
        return RemoteSpec(name, bucket, prefix, endpoint_url)

    def list(self) -> list[RemoteSpec]:
        rows = self._db.execute("SELECT name, bucket, prefix, endpoint_url FROM remotes ORDER BY name").fetchall()
        return [RemoteSpec(*r) for r in rows]

    def get(self, name: str) -> RemoteSpec:
        row = self._db.execute(
            "SELECT name, bucket, prefix, endpoint_url FROM remotes WHERE name = ?", [name]
        ).fetchone()
        if row is None:
            known = ", ".join(r.name for r in self.list()) or "none yet: kvgraft remote add NAME s3://BUCKET"
            raise UnknownRemote(f"no remote named {name!r} (known: {known})")
        return RemoteSpec(*row)

    def remove(self, name: str) -> None:
        self.get(name)
        with self.write() as db:
            db.execute("DELETE FROM remotes WHERE name = ?", [name])

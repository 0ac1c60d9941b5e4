"""The remotes a library knows (table `remotes`, migration m013): names for S3 buckets and prefixes."""

from __future__ import annotations

import re

from .errors import LibraryError
from .library import Library, now
from .remote import RemoteSpec, parse_url

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class UnknownRemote(LibraryError):
    """No remote by that name."""


def add_remote(lib: Library, name: str, url: str, endpoint_url: str | None = None) -> RemoteSpec:
    if not _NAME.match(name or ""):
        raise LibraryError(f"a remote's name is letters, digits, '.', '_' or '-' (up to 64), not {name!r}")
    if endpoint_url is not None and not re.match(r"^https?://[^\s/]+(/\S*)?$", endpoint_url):
        raise LibraryError(f"--endpoint-url must be an http:// or https:// URL, not {endpoint_url!r}")
    bucket, prefix = parse_url(url)
    with lib.write() as db:
        if db.execute("SELECT 1 FROM remotes WHERE name = ?", [name]).fetchone():
            raise LibraryError(f"a remote named {name!r} exists already (kvgraft remote rm {name} first)")
        db["remotes"].insert(
            {"name": name, "bucket": bucket, "prefix": prefix, "endpoint_url": endpoint_url, "added_at": now()}
        )
    return RemoteSpec(name, bucket, prefix, endpoint_url)


def list_remotes(lib: Library) -> list[RemoteSpec]:
    rows = lib._db.execute("SELECT name, bucket, prefix, endpoint_url FROM remotes ORDER BY name").fetchall()
    return [RemoteSpec(*r) for r in rows]


def get_remote(lib: Library, name: str) -> RemoteSpec:
    row = lib._db.execute("SELECT name, bucket, prefix, endpoint_url FROM remotes WHERE name = ?", [name]).fetchone()
    if row is None:
        known = ", ".join(r.name for r in list_remotes(lib)) or "none yet: kvgraft remote add NAME s3://BUCKET"
        raise UnknownRemote(f"no remote named {name!r} (known: {known})")
    return RemoteSpec(*row)


def remove_remote(lib: Library, name: str) -> None:
    get_remote(lib, name)
    with lib.write() as db:
        db.execute("DELETE FROM remotes WHERE name = ?", [name])

"""`kvgraft keys`: Ed25519 keys for signing packs, and the trusted-keys list for --require-signed."""

from __future__ import annotations

from pathlib import Path

import click

from kvgraft.app.cli.common import cli_home, emit_json, handle_errors
from kvgraft.app.core.words import counted
from kvgraft.app.packs.trust import keys_dir, trust_store
from kvgraft.app.service import open_library
from kvgraft.library.signing import generate_key, public_identity


def resolve_key(name_or_path: str) -> Path:
    """A key by name (in the data dir's keys/) or by path."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    k = keys_dir(cli_home()) / f"{name_or_path}.key"
    if not k.is_file():
        raise click.UsageError(f"no key named {name_or_path!r} (kvgraft keys list) and no such file")
    return k


@click.group()
def keys() -> None:
    """Signing keys: generate your own, trust other people's public keys."""


@keys.command()
@click.argument("name")
@handle_errors
def generate(name: str) -> None:
    """Make a new signing key NAME (kept in the data dir, mode 0600) and trust it."""
    path = keys_dir(cli_home()) / f"{name}.key"
    if path.exists():
        raise click.UsageError(f"a key named {name!r} already exists")
    signer = generate_key(path)
    trust_store(cli_home()).trust(signer.public_key_b64, name)
    click.echo(
        f"key {name}: id {signer.key_id}\npublic key (give this to people who import your packs): "
        f"{signer.public_key_b64}"
    )


@keys.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print own and trusted keys as JSON.")
@handle_errors
def list_keys(as_json: bool) -> None:
    """Your signing keys and the keys you trust."""
    own = {}
    if keys_dir(cli_home()).is_dir():
        for k in sorted(keys_dir(cli_home()).glob("*.key")):
            s = public_identity(k)
            own[k.stem] = {"key_id": s.key_id, "public_key": s.public_key_b64}
    trusted = trust_store(cli_home()).load()
    if as_json:
        emit_json({"own": own, "trusted": trusted})
        return
    for name, k in own.items():
        click.echo(f"own      {k['key_id']}  {name}")
    for kid, k in trusted.items():
        click.echo(f"trusted  {kid}  {k['name']}")
    if not own and not trusted:
        click.echo("no keys (kvgraft keys generate NAME)")


@keys.command()
@click.argument("public_key")
@click.option("--name", required=True, help="Whose key this is.")
@handle_errors
def trust(public_key: str, name: str) -> None:
    """Trust the signer with this base64 Ed25519 PUBLIC_KEY.

    The states of a pack it signs are then grafted without a replay here (proof signed:NAME), and
    import --require-signed accepts its packs. Trust only keys of people whose packs you would run."""
    click.echo(f"trusted {trust_store(cli_home()).trust(public_key, name)} ({name})")


@keys.command()
@click.argument("key_id")
@handle_errors
def untrust(key_id: str) -> None:
    """Stop trusting the key KEY_ID."""
    if not trust_store(cli_home()).untrust(key_id):
        raise click.UsageError(f"{key_id} is not a trusted key")
    with open_library(cli_home()) as lib:
        n = lib.revoke_signer(key_id)
    click.echo(
        f"no longer trusted: {key_id}"
        + (
            f"; {counted(n, 'entry')} it signed: unproven now (kvgraft verify --library --replay can prove them)"
            if n
            else ""
        )
    )

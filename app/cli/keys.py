"""`prism keys init`: make the key set a worker group shares, on purpose and once.

Why a command: `prism run` no longer generates keys when none are configured (two workers of
one group each signed with their own throwaway key, and consumers rejected part of the stream);
it refuses to start and names this command instead. The key set is written where the topology
expects it (or `--dir`), never over existing keys unless `--force`, and the command says which
topology fields read each file, so the operator knows what to share with the other workers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from app.cli.output import friendly

keys_app = typer.Typer(help="Worker and producer keys (signing keyring, token issuer, JWKS).", no_args_is_help=True)
console = Console(highlight=False, emoji=False)
DEFAULT_TOPOLOGY = Path("topologies/orders-created.yaml")

_WHAT = {
    "signing.json": "signing keyring: the worker's Ed25519 key prism-worker-1 (signs every output and DLQ "
                    "attestation) and the producer key dev-producer-1 (HMAC-SHA256, bound to publisher svc-orders; "
                    "give it to the producer that signs)",
    "issuer.pem": "token issuer's Ed25519 private key (kid dev-issuer-1): mints the JWTs authenticate accepts - "
                  "for tests and try-outs; keep it off the workers when a real identity provider issues tokens",
    "jwks.json": "the issuer's public key as a JWKS (public; mode 0600 like the rest)",
}


def _display(path: Path) -> Path:
    """`path` without `..` detours, relative to the working directory when inside it."""
    from app.security.devkeys import display_path as shorter

    return shorter(Path(os.path.normpath(path)))


def _default_dir(topology: Path) -> Path:
    """The directory the topology's key files are in (so `prism run -t TOPOLOGY` finds them)."""
    from app.security.devkeys import topology_key_files
    from app.topology import load_topology

    files = topology_key_files(load_topology(topology))
    dirs = {p.parent for p in files.values()}
    if len(dirs) != 1:
        from app.errors import ConfigError

        raise ConfigError(f"the topology's key files are in {len(dirs)} directories" if dirs else
                          "the topology names no key files", path=str(topology),
                          hint="pass --dir DIR and point the topology's fields at the files written there")
    return _display(dirs.pop())


@keys_app.command("init")
@friendly
def init(
    dir_: Annotated[Path | None, typer.Option(
        "--dir", help="where to write the key set; default: the directory the topology's key files are in")] = None,
    topology: Annotated[Path, typer.Option(
        "--topology", "-t", help="topology whose key directory is the default --dir")] = DEFAULT_TOPOLOGY,
    force: Annotated[bool, typer.Option(help="replace existing keys (producers and consumers need the new ones)")]
    = False,
    keep_existing: Annotated[bool, typer.Option(
        help="a complete key set already there is kept (exit 0): for a start-up job that runs every time")] = False,
) -> None:
    """Write a key set for a worker group: signing.json, issuer.pem, jwks.json (mode 0600).

    Every worker of one consumer group must read the SAME key set: run this once and share the
    directory (a volume, or `kubectl create secret generic prism-keys --from-file=...`)."""
    from app.security.devkeys import KEY_FILES, existing_key_files, init_keys, topology_key_files

    if force and keep_existing:
        # documented as `[--force | --keep-existing]`; --force won silently and replaced the set
        # a start-up job meant to keep, and every producer's and consumer's keys with it
        from app.errors import ConfigError

        raise ConfigError("--force and --keep-existing contradict each other", path="--force/--keep-existing",
                          hint="pass --keep-existing to keep a complete set, or --force (alone) to replace it")
    folder = dir_ if dir_ is not None else _default_dir(topology)
    present = existing_key_files(folder)
    if keep_existing and len(present) == len(KEY_FILES):
        console.print(f"kept the key set in {folder} (all of {', '.join(KEY_FILES)} exist)", markup=False)
        return
    from app.security.devkeys import is_throwaway

    replaced_demo = bool(present) and not force and is_throwaway(folder)
    keys = init_keys(folder, force=force)
    if replaced_demo:
        console.print(f"replaced the throwaway keys `prism demo` / `--dev-keys` made in {folder}", markup=False,
                      soft_wrap=True)
    for name in KEY_FILES:
        console.print(f"wrote {keys.folder / name} (0600): {_WHAT[name]}", markup=False, soft_wrap=True)
    signing, jwks = (keys.folder / "signing.json").resolve(), (keys.folder / "jwks.json").resolve()
    named: dict[str, Path] = {}
    if topology.exists():
        try:
            from app.topology import load_topology

            named = topology_key_files(load_topology(topology))
        except Exception:  # a --dir for another topology: only the generic advice below
            named = {}
    wanted = {"authenticate.jwks": jwks, "verify_signature.keyring": signing, "outputs.keyring": signing}
    if named and all(p.resolve() == wanted[f] for f, p in named.items()):
        console.print(f"{topology} reads these files already ({', '.join(named)}): "
                      f"`prism run -t {topology}` will find them", markup=False, soft_wrap=True)
    else:
        console.print("point the topology at them (paths relative to the topology file, or absolute):",
                      markup=False)
        console.print(f"  stages: authenticate.jwks: {jwks}", markup=False, soft_wrap=True)
        console.print(f"  stages: verify_signature.keyring: {signing}   (and outputs.keyring, if set)", markup=False,
                      soft_wrap=True)
    console.print("every worker of the group (--processes children, replicas, containers) must read this same "
                  "directory; no environment variable is needed - the topology names the files", markup=False,
                  soft_wrap=True)

"""Generate (or check) the Python code for every `.proto` file under `proto/`.

The generated modules are committed so that a plain `pip install` needs no protoc; the
test command runs this with `--check` so a `.proto` edit without regeneration fails CI
instead of silently shipping stale code.

    python -m app.envelope.protogen          # regenerate app/_gen
    python -m app.envelope.protogen --check  # exit 1 if app/_gen is stale
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
GEN_DIR = ROOT / "app" / "_gen"


def _generate(out: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed for {files}")
    # Make every generated folder an importable package.
    for d in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()


def _same_tree(a: Path, b: Path) -> list[str]:
    diffs: list[str] = []
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    diffs += [f"missing: {p}" for p in sorted(files_a - files_b)]
    diffs += [f"stale extra file: {p}" for p in sorted(files_b - files_a)]
    for p in sorted(files_a & files_b):
        if not filecmp.cmp(a / p, b / p, shallow=False):
            diffs.append(f"out of date: {p}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if app/_gen differs from a fresh generation")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_gen"
        _generate(fresh)
        if args.check:
            diffs = _same_tree(fresh, GEN_DIR)
            if diffs:
                print("generated protobuf code is stale; run `make proto` and commit app/_gen:", file=sys.stderr)
                for d in diffs:
                    print(f"  {d}", file=sys.stderr)
                return 1
            print("app/_gen is current")
            return 0
        if GEN_DIR.exists():
            shutil.rmtree(GEN_DIR)
        shutil.copytree(fresh, GEN_DIR)
        print(f"generated {GEN_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

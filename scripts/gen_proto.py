"""Generate the Python protobuf/gRPC modules from proto/agenttx/v1/agenttx.proto.

The single way generated code is produced. `--check` regenerates into a temporary
folder and fails when the committed files differ, so CI catches a stale tree.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTO = PROTO_DIR / "agenttx" / "v1" / "agenttx.proto"
OUT = ROOT / "client" / "agenttx" / "v1"
GENERATED = ("agenttx_pb2.py", "agenttx_pb2.pyi", "agenttx_pb2_grpc.py")


def generate(out: pathlib.Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_DIR}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(PROTO),
            ]
        )
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        src = pathlib.Path(tmp) / "agenttx" / "v1"
        out.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            # protoc's imports (`from agenttx.v1 import agenttx_pb2`) match where the
            # modules live: package agenttx.v1 of the client distribution.
            (out / name).write_text((src / name).read_text())
        (out / "__init__.py").write_text(
            '"""Generated from proto/agenttx/v1/agenttx.proto. Do not edit."""\n')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    if not args.check:
        generate(OUT)
        print(f"generated {', '.join(GENERATED)} in {OUT.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = pathlib.Path(tmp) / "_proto"
        generate(fresh)
        stale = [
            n for n in (*GENERATED, "__init__.py")
            if not (OUT / n).exists() or not filecmp.cmp(fresh / n, OUT / n, shallow=False)
        ]
    if stale:
        print(f"generated protobuf code is stale: {', '.join(stale)}; run scripts/gen_proto.py",
              file=sys.stderr)
        return 1
    print("generated protobuf code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

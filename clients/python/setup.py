"""Build hook: generates ``floodgate_client._proto`` from the repository's ``proto/`` files.

Nothing generated is committed. Every build (wheel, sdist then wheel, editable install)
runs grpcio-tools' protoc on the same ``.proto`` files the server is built from, so the
client cannot drift from the wire contract: the RLS service's file and what it imports, no
more. An sdist carries those files in its own ``proto/``, so a wheel builds from it alone.
Everything else lives in pyproject.toml.
"""

from __future__ import annotations

import re
import shutil
from importlib import resources
from importlib.metadata import requires
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).parent.resolve()
PACKAGE = "floodgate_client"
PROTO_PACKAGE = f"{PACKAGE}._proto"
SERVICE_PROTO = "envoy/service/ratelimit/v3/rls.proto"
# An sdist carries its own copy, looked at first so that a build never picks up a stray
# proto/ beside the unpacked sdist; in the repository the contract sits at its root.
PROTO_ROOTS = (HERE / "proto", HERE.parent.parent / "proto")
# `import "a/b.proto";` (also `import public` and `import weak`), one per line.
PROTO_IMPORT = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.MULTILINE)
# protoc writes absolute imports of the proto packages (`from envoy.type.v3 import ...`).
ENVOY_IMPORT = re.compile(r"^from (envoy(?:\.\w+)*) import", re.MULTILINE)
REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9._-]*")


def proto_root() -> Path:
    """The directory holding the ``.proto`` files, or a build error saying where it looked."""
    for root in PROTO_ROOTS:
        if (root / SERVICE_PROTO).is_file():
            return root
    looked = ", ".join(str(root) for root in PROTO_ROOTS)
    raise SystemExit(f"floodgate-client: no {SERVICE_PROTO} under {looked}")


def service_protos(root: Path) -> list[str]:
    """The service's ``.proto`` file and every file it imports, directly or not, under ``root``.

    Imports that are not under ``root`` are protobuf's well-known types, which grpcio-tools
    (at build time) and protobuf (at run time) bring themselves.
    """
    found: set[str] = set()
    pending = [SERVICE_PROTO]
    while pending:
        name = pending.pop()
        if name in found or not (root / name).is_file():
            continue
        found.add(name)
        pending.extend(PROTO_IMPORT.findall((root / name).read_text()))
    return sorted(found)


def runtime_requirements() -> list[str]:
    """grpcio and protobuf at least as new as the grpcio-tools that writes the code.

    The generated modules refuse to import on an older grpcio or protobuf than the
    generator's, so the wheel asks for exactly the floors grpcio-tools itself declares.
    """
    wanted = {"grpcio", "protobuf"}
    declared = requires("grpcio-tools") or []
    return [line for line in declared if REQUIREMENT_NAME.match(line).group() in wanted]


def protoc(*args: str | Path) -> None:
    """Runs grpcio-tools' bundled protoc, with the well-known types on the include path."""
    from grpc_tools import protoc as compiler

    well_known = resources.files("grpc_tools") / "_proto"
    argv = ["protoc", f"-I{well_known}", *(str(arg) for arg in args)]
    if compiler.main(argv) != 0:
        raise SystemExit(f"floodgate-client: protoc failed: {' '.join(argv)}")


def generate(out: Path) -> None:
    """Writes the messages, type stubs and service stub under ``out`` as one package tree."""
    root = proto_root()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    protoc(f"-I{root}", f"--python_out={out}", f"--pyi_out={out}", *service_protos(root))
    protoc(f"-I{root}", f"--grpc_python_out={out}", SERVICE_PROTO)
    for path in out.rglob("*.py*"):
        path.write_text(ENVOY_IMPORT.sub(rf"from {PROTO_PACKAGE}.\1 import", path.read_text()))
    for directory in [out, *(path for path in out.rglob("*") if path.is_dir())]:
        (directory / "__init__.py").touch()


class BuildPyWithProtos(build_py):
    """Adds the generated ``_proto`` package to every build.

    A regular build writes it into the build directory; an editable install writes it next
    to the sources (gitignored), where the editable import finder looks.
    """

    def run(self) -> None:
        super().run()
        base = HERE / "src" if self.editable_mode else Path(self.build_lib)
        generate(base / PACKAGE / "_proto")


class SdistWithProtos(sdist):
    """Ships the ``.proto`` files inside the sdist, so a wheel can be built from it alone."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for name in service_protos(root):
            target = Path(base_dir) / "proto" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / name, target)


setup(
    install_requires=runtime_requirements(),
    cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos},
)

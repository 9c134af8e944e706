"""The root filesystem the Dockerfile's final stage describes, assembled on this Debian 12 host
without a container engine:

- what the base image, distroless cc-debian12, gives a binary like floodgate: the shared
  libraries it loads (taken from this host, which has the same glibc 2.36 and libgcc_s), CA
  certificates, time zones, /etc/passwd with nonroot (65532), nsswitch.conf, /tmp;
- what the build stage stages under /out, made by the build stage's own commands (everything
  in its RUN after `cargo build`), with the binary under test standing in for the one cargo
  would build there;
- the final stage's COPY instructions, from the build stage's /out and from the build context.

`python3 tests/image/image_rootfs.py DIR` assembles one by hand (then, as root:
`chroot --userspec=65532:65532 DIR /usr/local/bin/floodgate --version`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from image_dockerfile import REPO, Dockerfile, Instruction, load

BASE = "gcr.io/distroless/cc-debian12:nonroot@"

# What distroless cc holds that a binary may load: glibc's libraries and its loader, and
# libgcc_s (cc adds libstdc++ and libgomp, which floodgate does not use). OpenSSL's libssl and
# libcrypto are in the image too, but floodgate's TLS is rustls: it must not load them.
GLIBC = {
    "linux-vdso.so.1",
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libresolv.so.2",
    "libutil.so.1",
}
PROVIDED_BY_BASE = GLIBC | {"libgcc_s.so.1"}

# The base image's own configuration, which Docker applies under the Dockerfile's.
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
}
NONROOT = 65532

PASSWD = """root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
"""
GROUP = """root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
"""
NSSWITCH = "hosts: files dns\n"


def shared_libraries(binary: Path) -> dict[str, Path]:
    """Each library `binary` loads (ldd: the whole closure, the loader included) and the path
    it is loaded from on this host."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    libraries = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\S+)(?: => (\S+))? \(0x[0-9a-f]+\)$", line)
        assert match, f"ldd line not understood: {line!r}"
        name, path = match.groups()
        if name.startswith("/"):
            path, name = name, Path(name).name
        libraries[name] = Path(path) if path else None
    return libraries


def lay_out_base(root: Path, binary: Path) -> None:
    """distroless cc-debian12:nonroot, as far as floodgate can tell."""
    for directory in ("etc/ssl/certs", "usr/share", "tmp", "home/nonroot", "bin"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    os.chown(root / "home/nonroot", NONROOT, NONROOT)
    (root / "etc/passwd").write_text(PASSWD)
    (root / "etc/group").write_text(GROUP)
    (root / "etc/nsswitch.conf").write_text(NSSWITCH)
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n")
    shutil.copy(BASE_ENV["SSL_CERT_FILE"], root / "etc/ssl/certs/ca-certificates.crt")
    shutil.copytree("/usr/share/zoneinfo", root / "usr/share/zoneinfo", symlinks=True)
    for name, path in shared_libraries(binary).items():
        if path is None:  # the vDSO is the kernel's
            continue
        assert name in PROVIDED_BY_BASE, f"{binary} loads {name}, which {BASE} does not provide"
        target = root / path.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path.resolve(), target)


def staging_commands(stage_run: Instruction) -> list[str]:
    """The build stage's commands after `cargo build`: those that lay out /out."""
    commands = [c.strip() for c in stage_run.args.split("&&")]
    assert commands[0].startswith("cargo build"), f"expected the binary's build first: {commands[0]}"
    return commands[1:]


def stage_out(dockerfile: Dockerfile, binary: Path, out: Path) -> None:
    """Runs the build stage's staging commands with /out at `out` and `binary` as the binary
    cargo built."""
    build = dockerfile.stages[0]
    (run,) = [r for r in build.all("RUN") if "/out" in r.args]
    built = "target/release/floodgate"
    for command in staging_commands(run):
        command = re.sub(r"(?<![\w/])/out(?=/|\s|$)", str(out), command.replace(built, str(binary)))
        subprocess.run(["sh", "-ec", command], check=True)


def copy(source: Path, destination: Path) -> None:
    """COPY's semantics: a directory's contents into the destination, links kept as links.
    Files are hard-linked where they can be (the debug binary is some 200 MB)."""
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, destination, symlinks=True, dirs_exist_ok=True, copy_function=link_or_copy)
    else:
        destination.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(source, destination)


def link_or_copy(source: str | Path, destination: str | Path) -> None:
    if Path(source).is_symlink():
        shutil.copy(source, destination, follow_symlinks=False)
        return
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def assemble(root: Path, binary: Path, dockerfile: Dockerfile | None = None) -> Dockerfile:
    """Lays out the final stage's root filesystem in `root` (created, must not exist)."""
    dockerfile = dockerfile or load()
    final = dockerfile.final
    assert final.base.startswith(BASE), f"this layout knows {BASE}…, the final stage is FROM {final.base}"
    root.mkdir()
    lay_out_base(root, binary)
    out = root.parent / f"{root.name}.build-out"
    stage_out(dockerfile, binary, out)
    for instruction in final.all("COPY"):
        *sources, destination = instruction.words()
        for source in sources:
            if "from" in instruction.flags:
                assert source.rstrip("/").startswith("/out"), f"the build stage stages only /out: {source}"
                origin = out / Path(source).relative_to("/out")
            else:
                origin = REPO / source
            copy(origin, root / destination.lstrip("/"))
    shutil.rmtree(out)
    return dockerfile


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: image_rootfs.py DIR [BINARY]  (BINARY: target/debug/floodgate by default)")
    binary = Path(sys.argv[2] if len(sys.argv) == 3 else REPO / "target/debug/floodgate")
    assemble(Path(sys.argv[1]), binary.resolve())

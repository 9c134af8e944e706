"""The container image, proven without a container engine: the Dockerfile read as data (pinned
bases, labels, an offline build with a dependency layer, a build context that holds what it
copies), and the root filesystem its final stage describes (image_rootfs.py) entered with
chroot as the image's user, with the image's environment, in a network namespace of its own."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import image_rootfs
from image_dockerfile import PINNED, REPO, Dockerfile, dockerignore_admits
from image_sandbox import ADDRESS, Sandbox, sandbox

OK, OVER_LIMIT = 0, 3
# envoy_compat.yaml (examples/rules, the image's rules): every address has its limit, this
# one is blocked outright (requests_per_unit 0), so its answer does not depend on timing.
BLOCKED = "remote_address=203.0.113.66"
ALLOWED = "remote_address=192.0.2.10"


def image_env(dockerfile: Dockerfile, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a container of the image starts with: the base image's, the
    Dockerfile's ENV over it, HOME from the user's passwd entry, then `extra` (`docker run -e`)."""
    return {**image_rootfs.BASE_ENV, **dockerfile.env(), "HOME": "/home/nonroot", **(extra or {})}


def in_image(root: Path, dockerfile: Dockerfile, command: list[str]) -> list[str]:
    """`command` run in the image's root as the image's USER."""
    uid, gid = dockerfile.user()
    return ["chroot", f"--userspec={uid}:{gid}", str(root), *command]


def query(box: Sandbox, binary: Path, grpc_port: int, domain: str, descriptor: str) -> int:
    """One ShouldRateLimit from inside the namespaces; `floodgate query`'s exit code."""
    result = box.run(
        [
            str(binary),
            "query",
            "--addr",
            f"http://{ADDRESS}:{grpc_port}",
            "--domain",
            domain,
            "--descriptor",
            descriptor,
        ]
    )
    assert result.returncode in (OK, OVER_LIMIT), result.stderr
    return result.returncode


def listening(line: str) -> dict[str, str]:
    """`floodgate listening: grpc=… http=…` as {"grpc": …, "http": …}."""
    return dict(part.split("=", 1) for part in line.split()[2:])


def process_ids(pid: int) -> tuple[int, int]:
    """The real uid and gid a running process has."""
    status = Path(f"/proc/{pid}/status").read_text()
    uid = int(re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE).group(1))
    gid = int(re.search(r"^Gid:\s+(\d+)", status, re.MULTILINE).group(1))
    return uid, gid


# The Dockerfile


def test_every_base_image_is_pinned_by_tag_and_digest(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        assert PINNED.match(stage.base), f"FROM {stage.base} is not pinned as name:tag@sha256:<digest>"
    final_digest = dockerfile.final.base.split("@")[1]
    assert dockerfile.labels()["org.opencontainers.image.base.digest"] == final_digest


def test_labels_name_the_image_its_license_and_the_version_the_binary_reports(
    dockerfile: Dockerfile, floodgate_binary: Path
) -> None:
    labels = dockerfile.labels()
    assert labels["org.opencontainers.image.title"] == "floodgate"
    assert labels["org.opencontainers.image.description"]
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert "org.opencontainers.image.revision" in labels
    reported = subprocess.run([str(floodgate_binary), "--version"], capture_output=True, text=True, check=True)
    assert reported.stdout.split()[:2] == ["floodgate", labels["org.opencontainers.image.version"]], (
        "the VERSION build argument's default must be the server's version"
    )


def test_the_build_never_reaches_the_network(dockerfile: Dockerfile) -> None:
    build = dockerfile.stages[0]
    runs = build.all("RUN")
    assert runs
    for run in runs:
        assert run.flags.get("network") == "none", f"RUN without --network=none: {run.args}"
        for command in run.args.split("&&"):
            if command.strip().startswith("cargo "):
                assert "--frozen" in command.split(), f"cargo without --frozen (--locked --offline): {command}"
    copies = [i.words() for i in build.all("COPY")]
    assert ["vendor/cargo-config.toml", ".cargo/config.toml"] in copies, "cargo must read the vendored sources"


def test_dependencies_are_compiled_in_a_layer_before_the_sources_are_copied(dockerfile: Dockerfile) -> None:
    build = dockerfile.stages[0].instructions
    first = next(n for n, i in enumerate(build) if i.keyword == "RUN" and "cargo build" in i.args)

    def copied(instructions: list) -> set[str]:
        return {source for i in instructions if i.keyword == "COPY" for source in i.words()[:-1]}

    before, after = copied(build[:first]), copied(build[first:])
    assert {"Cargo.toml", "Cargo.lock", "build.rs", "proto", "vendor"} <= before
    assert {"src", "lua"} <= after and not {"src", "lua"} & before, "floodgate's own code comes after"
    # What the stubs built is removed, so the real sources are compiled whatever their mtimes.
    assert re.search(r"cargo clean .*-p floodgate", build[first].args)


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_heavy(dockerfile: Dockerfile) -> None:
    for stage in dockerfile.stages:
        for copy in stage.all("COPY"):
            if "from" in copy.flags:
                continue
            for source in copy.words()[:-1]:
                assert dockerignore_admits(source), f"COPY {source}: left out by .dockerignore"
                if not source.startswith("vendor"):  # made by scripts/vendor.sh
                    assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    for heavy in ("target", "target/debug/floodgate", ".venv", ".git", "clients/typescript/node_modules", "tests"):
        assert not dockerignore_admits(heavy), f"{heavy} would be sent with the build context"


# The image's root filesystem


def test_the_binary_loads_nothing_beyond_glibc_libgcc_s_and_the_loader(floodgate_binary: Path) -> None:
    loaded = set(image_rootfs.shared_libraries(floodgate_binary))
    assert {"libc.so.6", "ld-linux-x86-64.so.2"} <= loaded
    assert not {name for name in loaded if "ssl" in name or "crypto" in name}, "OpenSSL is linked"
    assert loaded <= image_rootfs.PROVIDED_BY_BASE, f"not in distroless cc: {loaded - image_rootfs.PROVIDED_BY_BASE}"


def test_the_image_root_has_the_entry_points_and_the_rules(image_root: Path, dockerfile: Dockerfile) -> None:
    entrypoint = dockerfile.command()[0]
    assert (image_root / entrypoint.lstrip("/")).is_file()
    ratelimit = image_root / "bin/ratelimit"
    assert ratelimit.is_symlink() and Path(ratelimit.readlink()) == Path(entrypoint)
    rules = image_root / dockerfile.env()["FLOODGATE_RULES"].lstrip("/")
    assert sorted(p.name for p in rules.iterdir()) == sorted(p.name for p in (REPO / "examples/rules").iterdir())


def test_the_binary_runs_in_the_image_root_as_the_images_user(image_root: Path, dockerfile: Dockerfile) -> None:
    uid, _ = dockerfile.user()
    assert uid != 0, "the image must not run as root"
    result = subprocess.run(
        in_image(image_root, dockerfile, [dockerfile.command()[0], "--version"]),
        env=image_env(dockerfile),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("floodgate ")


def test_the_image_serves_its_rules_on_its_ports_as_its_user(
    image_root: Path, dockerfile: Dockerfile, floodgate_binary: Path
) -> None:
    with sandbox(hosts={}, roots=[image_root], read_only=True) as box:
        server = box.start(in_image(image_root, dockerfile, dockerfile.command()), image_env(dockerfile))
        addresses = listening(box.wait_for_line(server, "floodgate listening:"))
        env = dockerfile.env()
        assert addresses == {"grpc": env["FLOODGATE_GRPC_ADDR"], "http": env["FLOODGATE_HTTP_ADDR"]}
        ports = {int(address.rsplit(":", 1)[1]) for address in addresses.values()}
        assert ports == dockerfile.exposed()
        assert process_ids(server.pid) == dockerfile.user()

        grpc, http = (int(addresses[k].rsplit(":", 1)[1]) for k in ("grpc", "http"))
        assert query(box, floodgate_binary, grpc, "edge", BLOCKED) == OVER_LIMIT
        assert query(box, floodgate_binary, grpc, "edge", ALLOWED) == OK
        answer = box.http(
            "POST",
            f"http://{ADDRESS}:{http}/json",
            {"content-type": "application/json"},
            '{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"203.0.113.66"}]}]}',
        )
        # As envoyproxy/ratelimit's /json: 429 for a request over its limit.
        assert answer["status"] == 429 and '"overallCode":"OVER_LIMIT"' in answer["body"].replace(" ", "")


def test_bin_ratelimit_serves_with_upstreams_environment(
    image_root: Path, dockerfile: Dockerfile, floodgate_binary: Path
) -> None:
    """envoyproxy/ratelimit's entry point: the image started as Envoy Gateway starts upstream's,
    `/bin/ratelimit` with its REDIS_* variables and no arguments."""
    with sandbox(hosts={}, roots=[image_root], read_only=True) as box:
        redis = box.start(["redis-server", "--port", "6379", "--save", "", "--appendonly", "no"], {})
        box.wait_until("redis", lambda: box.run(["redis-cli", "-p", "6379", "ping"]).stdout.strip() == "PONG", redis)
        upstream = {"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "localhost:6379"}
        server = box.start(in_image(image_root, dockerfile, ["/bin/ratelimit"]), image_env(dockerfile, upstream))
        addresses = listening(box.wait_for_line(server, "floodgate listening:"))
        grpc, http = (int(addresses[k].rsplit(":", 1)[1]) for k in ("grpc", "http"))
        assert box.http("GET", f"http://{ADDRESS}:{http}/healthcheck")["status"] == 200
        assert query(box, floodgate_binary, grpc, "edge", ALLOWED) == OK
        deadline = time.monotonic() + 5
        while (
            not (keys := box.run(["redis-cli", "-p", "6379", "--scan"]).stdout.split()) and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert keys, "the counter should be in Redis: upstream's REDIS_* variables were not read"

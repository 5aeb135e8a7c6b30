"""compose.yaml describes the production topology of `scripts/cluster` (docs/deploy.md): three
NATS servers clustered with JetStream, PostgreSQL, two ingress, two workers, cache and billing,
with health checks, restart policies and NATS authentication, its image built from the
Dockerfile at the repository root. Validated by `docker compose config` where the compose plugin
is installed, and always against the compose-spec JSON schema (the copy check-jsonschema vendors,
in .tools/compose-schema-venv from scripts/bootstrap: no docker and no network needed) and by a
structural check of the resolved file (anchors and `<<` merges applied: by PyYAML when the venv
has it, else by `yq`, the jq wrapper over PyYAML), since CI machines often have neither docker nor
the compose plugin."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import REPO_ROOT

COMPOSE = REPO_ROOT / "compose.yaml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
CHECK_JSONSCHEMA = REPO_ROOT / ".tools" / "compose-schema-venv" / "bin" / "check-jsonschema"
NODES = ["nats-1", "nats-2", "nats-3"]
SERVICES = {"ingress-1": "ingress", "ingress-2": "ingress", "worker": "worker", "cache": "cache",
            "billing": "billing"}
PASSWORDS = [f"SWITCHYARD_NATS_PASSWORD_{i}" for i in ("INGRESS", "WORKER", "BILLING", "CACHE", "ADMIN")]


def load() -> dict:
    try:
        import yaml
        return yaml.safe_load(COMPOSE.read_text())
    except ImportError:
        if not shutil.which("yq"):
            pytest.skip("neither PyYAML nor yq to read compose.yaml")
        return json.loads(subprocess.run(["yq", ".", str(COMPOSE)], check=True, capture_output=True,
                                         text=True, timeout=30).stdout)


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_compose_topology():
    services = load()["services"]
    assert set(services) == {*NODES, "postgres", "mock-upstream", *SERVICES}

    # Three nodes, one JetStream cluster, each routing to the two others, each with its own store.
    names = set()
    for node in NODES:
        s = services[node]
        cmd = s["command"]
        assert "-js" in cmd and flag(cmd, "--cluster_name") == "switchyard", cmd
        names.add(flag(cmd, "-n"))
        routes = {r.split("//")[1].split(":")[0] for r in flag(cmd, "--routes").split(",")}
        assert routes == set(NODES) - {node}, (node, routes)
        assert f"{node}:/data" in s["volumes"], s["volumes"]
        # Authentication: the generated users file, with every identity's password.
        assert "./config/nats-server.conf:/etc/nats/switchyard.conf:ro" in s["volumes"]
        assert flag(cmd, "-c") == "/etc/nats/switchyard.conf"
        assert sorted(s["environment"]) == sorted(PASSWORDS)
        assert s["restart"] == "unless-stopped" and "/healthz" in " ".join(s["healthcheck"]["test"])
    assert names == {"n1", "n2", "n3"}

    pg = services["postgres"]
    assert pg["restart"] == "unless-stopped" and "pg_isready" in pg["healthcheck"]["test"]

    for name, identity in SERVICES.items():
        s = services[name]
        assert s["command"][0] == identity and s["restart"] == "unless-stopped", name
        env = s["environment"]
        assert env["SWITCHYARD_NATS_URL"] == "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"
        assert env["SWITCHYARD_NATS_REPLICAS"] == "3"
        # Each process on its own identity (docs/security.md).
        assert env["SWITCHYARD_NATS_USER"] == identity
        assert env["SWITCHYARD_NATS_PASSWORD"].startswith(f"${{SWITCHYARD_NATS_PASSWORD_{identity.upper()}:?")
        assert env["SWITCHYARD_NATS_INBOX_PREFIX"] == f"_INBOX.{identity}"
        # Started once every NATS node is healthy.
        for node in NODES:
            assert s["depends_on"][node] == {"condition": "service_healthy"}, name
    assert services["billing"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert services["worker"]["deploy"]["replicas"] == 2
    for name, port in (("ingress-1", "8080:8080"), ("ingress-2", "8081:8080")):
        s = services[name]
        assert s["ports"] == [port] and "/readyz" in " ".join(s["healthcheck"]["test"])
        assert s["environment"]["SWITCHYARD_ADMIN_NATS_USER"] == "admin"
    assert set(load()["volumes"]) == {*NODES, "pg-data"}


def test_compose_matches_the_compose_spec_schema(tmp_path):
    if not CHECK_JSONSCHEMA.exists():
        pytest.fail(f"{CHECK_JSONSCHEMA} missing: run scripts/bootstrap")
    schema = ["--builtin-schema", "vendor.compose-spec"]
    r = subprocess.run([str(CHECK_JSONSCHEMA), *schema, str(COMPOSE)], capture_output=True, text=True,
                       timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "ok -- validation done"), r.stdout + r.stderr
    # The check has teeth: a service key the spec does not define is refused, naming the service.
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("  cache:\n    <<: *switchyard\n",
                                               "  cache:\n    <<: *switchyard\n    restart_policy: always\n"))
    r = subprocess.run([str(CHECK_JSONSCHEMA), *schema, str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"{bad}::$.services.cache: Unevaluated properties are not allowed "
            "('restart_policy' was unexpected)") in r.stdout, r.stdout


def test_image_is_built_from_the_dockerfile():
    # Every Switchyard service runs the one image, built from the Dockerfile at the repository root.
    services = load()["services"]
    for name in [*SERVICES, "mock-upstream"]:
        s = services[name]
        assert s["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name
        assert s["image"] == "switchyard:dev", name
    lines = [line.split() for line in DOCKERFILE.read_text().splitlines()
             if line.strip() and not line.startswith((" ", "#"))]
    stages = [line for line in lines if line[0] == "FROM"]
    assert [s[-1] for s in stages] == ["build", "assets", "debian:bookworm-slim"], stages
    assert ["RUN", "cargo", "build", "--release", "--locked", "-p", "switchyard"] in lines
    assert ["ENTRYPOINT", '["switchyard"]'] == lines[-1]
    # The cache finds its embedding model through the variables ModelPaths reads.
    env = DOCKERFILE.read_text()
    for var in ("ORT_DYLIB_PATH=", "SWITCHYARD_EMBED_MODEL=", "SWITCHYARD_EMBED_TOKENIZER_DIR="):
        assert var in env, var
    # Build output, tools, data and secrets stay out of the build context.
    ignored = set((REPO_ROOT / ".dockerignore").read_text().split())
    assert {"target/", ".tools/", "data/", ".git/", ".env"} <= ignored, ignored


def test_docker_compose_config(tmp_path):
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("no docker compose plugin here (the structural check above still ran)")
    env = {p: "x" for p in PASSWORDS}
    r = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "--quiet"], cwd=REPO_ROOT,
                       env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr

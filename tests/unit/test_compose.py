"""compose.yaml, the production shape, keeps its secrets apart: no default password, each
service only its own role's, Redis behind a password, Flower on localhost behind a login."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose.yaml"
REFERENCE = re.compile(r"(?<!\$)\$\{(?P<name>[A-Z0-9_]+)(?P<rest>[^}]*)\}")

# Which secrets each service may see, and no more.
SECRETS = {
    "postgres": {"POSTGRES_PASSWORD"},
    "redis": {"REDIS_PASSWORD"},
    # It creates the roles and sets their passwords: the one service with all of them.
    "migrate": {"POSTGRES_PASSWORD", "SPACEJOBS_APP_DB_PASSWORD", "SPACEJOBS_OPERATOR_DB_PASSWORD",
                "SPACEJOBS_WORKER_DB_PASSWORD"},
    "web": {"SPACEJOBS_APP_DB_PASSWORD", "SPACEJOBS_OPERATOR_DB_PASSWORD", "REDIS_PASSWORD",
            "SPACEJOBS_SECRET_KEY"},
    "worker": {"SPACEJOBS_WORKER_DB_PASSWORD", "REDIS_PASSWORD"},
    "beat": {"REDIS_PASSWORD", "SPACEJOBS_WORKER_DB_PASSWORD"},
    "flower": {"REDIS_PASSWORD", "FLOWER_BASIC_AUTH"},
}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in _strings(key) + _strings(value)]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return [node] if isinstance(node, str) else []


def _references(node: Any) -> list[re.Match[str]]:
    return [m for s in _strings(node) for m in REFERENCE.finditer(s)]


def test_every_service_gets_only_its_own_roles_secrets(services):
    assert set(services) == set(SECRETS)
    for name, service in services.items():
        assert {m["name"] for m in _references(service)} == SECRETS[name], name
    # Only migrate holds the superuser URL; the others connect as their own role.
    assert [n for n, s in services.items() if "DATABASE_URL" in (s.get("environment") or {})] == ["migrate"]
    for name, role in [("web", "space_app"), ("web", "space_operator"), ("worker", "space_worker")]:
        key = f"SPACEJOBS_{role.removeprefix('space_').upper()}_DATABASE_URL"
        own = f"SPACEJOBS_{role.removeprefix('space_').upper()}_DB_PASSWORD"
        assert services[name]["environment"][key].startswith(f"postgresql://{role}:${{{own}:?")


def test_no_secret_has_a_default(services):
    for match in _references(services):
        if match["name"] == "FLOWER_BASIC_AUTH":
            continue  # see the Flower test: optional profile, enforced at start instead
        assert match["rest"].startswith(":?"), f"${{{match['name']}{match['rest']}}} must be required"


def test_redis_requires_a_password_and_every_client_url_carries_it(services):
    command = services["redis"]["command"]
    assert command[command.index("--requirepass") + 1].startswith("${REDIS_PASSWORD:?")
    urls = [s for s in _strings(services) if s.startswith("redis://")]
    assert len(urls) >= 4  # web, worker, beat, flower
    for url in urls:
        assert url.startswith("redis://:${REDIS_PASSWORD:?"), url
    assert "ports" not in services["redis"] and "ports" not in services["postgres"]


def test_flower_listens_on_localhost_only_and_never_starts_without_a_login(services):
    flower = services["flower"]
    assert flower["ports"] and all(p.startswith("127.0.0.1:") for p in flower["ports"])
    assert "FLOWER_BASIC_AUTH" in flower["environment"]
    # Compose interpolates every profile's services, so `:?` would burden deployments without
    # Flower: its command refuses to start while the login is empty instead.
    assert flower["command"][-1].startswith('test -n "$$FLOWER_BASIC_AUTH" || {')
    assert "exit 1" in flower["command"][-1]


def test_web_worker_and_beat_share_one_results_store(services):
    for name in ("web", "worker", "beat"):
        assert services[name]["volumes"] == ["results:/var/lib/spacejobs/results"], name
        assert services[name]["environment"]["SPACEJOBS_RESULTS_DIR"] == "/var/lib/spacejobs/results"
    assert "volumes" not in services["migrate"]  # it never touches a result

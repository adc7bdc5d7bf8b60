"""The settings' own rules (models/settings.py): defaults, bounds, typed parsing from text, and
what is derived from them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from spacejobs.models.settings import Settings, get_settings, markdown_table, reload_settings


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("SPACEJOBS_QUEUE", "SPACEJOBS_EXTRA_KIND_MODULES", "SPACEJOBS_DB_POOLER",
                 "SPACEJOBS_CLAIM_BATCH", "SPACEJOBS_TASK_EVENTS", "DATABASE_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    monkeypatch.undo()
    reload_settings()  # the process's settings as the environment had them before


def test_defaults_are_safe_without_any_environment(env):
    settings = Settings()
    assert settings.database_url is None
    assert settings.rate_limit_fail == "open" and settings.db_pooler == "none"
    assert settings.remote_control is False and settings.session_cookie_secure is False
    assert settings.secret_key is None and settings.periodic_jobs == "[]"


def test_sweeps_have_their_own_queue_beside_the_wakeups(env):
    env.setenv("SPACEJOBS_QUEUE", "jobs-eu")
    assert Settings().sweep_queue == "jobs-eu.sweep"


def test_each_maintenance_chore_has_its_cadence_and_the_sweeps_is_the_default(env):
    env.setenv("SPACEJOBS_SWEEP_INTERVAL", "7")
    env.setenv("SPACEJOBS_MAINTENANCE_METRICS_INTERVAL", "30")
    settings = Settings()
    assert settings.maintenance_interval("metrics") == 30
    assert [settings.maintenance_interval(chore) for chore in (
        "expired_leases", "resignal", "waits", "retention")] == [7, 7, 7, 7]
    assert settings.maintenance_interval("timers") == settings.timer_interval
    assert settings.maintenance_interval("periodic") == settings.timer_interval
    assert settings.maintenance_interval("result_orphans") == settings.results_sweep_interval
    # the claim's heads keep their own cadence, a second, whatever the sweep's
    assert settings.maintenance_interval("claim_heads") == 1


@pytest.mark.parametrize(("text", "modules"), [
    ("", []), ("a.b", ["a.b"]), (" a.b , c ,, ", ["a.b", "c"]), (",", []),
])
def test_extra_kind_modules_are_a_comma_separated_list(env, text, modules):
    env.setenv("SPACEJOBS_EXTRA_KIND_MODULES", text)
    assert Settings().extra_kind_module_names == modules


@pytest.mark.parametrize(("name", "value"), [
    ("SPACEJOBS_CLAIM_BATCH", "0"), ("SPACEJOBS_CLAIM_BATCH", "1001"),
    ("SPACEJOBS_WEB_THREADS", "1"), ("SPACEJOBS_DRAIN_LIMIT", "0"),
    ("SPACEJOBS_SWEEP_INTERVAL", "0"), ("SPACEJOBS_SHUTDOWN_GRACE", "-1"),
    ("SPACEJOBS_TIMER_INTERVAL", "0"), ("SPACEJOBS_TIMER_INTERVAL", "61"),
    ("SPACEJOBS_MAINTENANCE_RETENTION_INTERVAL", "0"), ("SPACEJOBS_MAINTENANCE_PERIODIC_INTERVAL", "-1"),
    ("SPACEJOBS_DB_POOLER", "session"), ("SPACEJOBS_RATE_LIMIT_FAIL", "maybe"),
    ("SPACEJOBS_RESULTS_STORE", "ftp"), ("SPACEJOBS_LOG_FORMAT", "xml"),
    ("SPACEJOBS_KEEP_JOBS_DAYS", "0"), ("SPACEJOBS_WAKEUP_COALESCE_MS", "0"),
    ("SPACEJOBS_PASSWORD_MEMORY_KIB", "19455"), ("SPACEJOBS_PASSWORD_TIME_COST", "1"),
    ("SPACEJOBS_PASSWORD_PARALLELISM", "0"),
])
def test_values_out_of_bounds_are_refused_at_start(env, name, value):
    env.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize(("text", "value"), [("1", True), ("true", True), ("0", False), ("no", False)])
def test_switches_read_the_usual_spellings(env, text, value):
    env.setenv("SPACEJOBS_TASK_EVENTS", text)
    assert Settings().task_events is value


def test_numbers_are_parsed_from_text(env):
    env.setenv("SPACEJOBS_LINGER_SECONDS", "2.5")
    env.setenv("SPACEJOBS_CLAIM_BATCH", "1000")
    settings = Settings()
    assert settings.linger_seconds == 2.5 and settings.claim_batch == 1000


def test_the_server_urls_are_read_without_the_prefix(env):
    env.setenv("DATABASE_URL", "postgresql://admin@db/space")
    env.setenv("SPACEJOBS_DATABASE_URL", "postgresql://wrong@db/space")
    env.setenv("REDIS_URL", "redis://cache:6379/1")
    settings = Settings()
    assert settings.database_url == "postgresql://admin@db/space"
    assert settings.redis_url == "redis://cache:6379/1"
    assert Settings.env_name("database_url") == "DATABASE_URL"
    assert Settings.env_name("claim_batch") == "SPACEJOBS_CLAIM_BATCH"


def test_secrets_never_show_in_the_settings_text(env):
    env.setenv("SPACEJOBS_DB_ROLE_PASSWORD", "hunter2")
    env.setenv("SPACEJOBS_SECRET_KEY", "cookie-signing-key")
    settings = Settings()
    assert "hunter2" not in repr(settings) and "cookie-signing-key" not in str(settings)
    assert settings.db_role_password.get_secret_value() == "hunter2"


def test_settings_are_frozen(env):
    with pytest.raises(ValidationError):
        Settings().queue = "other"


def test_the_process_reads_the_environment_once_until_told_to_reload(env):
    before = get_settings()
    env.setenv("SPACEJOBS_QUEUE", "reloaded")
    assert get_settings() is before
    assert reload_settings().queue == "reloaded" and get_settings().queue == "reloaded"


def test_the_table_shows_switches_as_digits_and_unset_values_as_a_dash():
    rows = {line.split(" | ")[0].strip("| `"): line for line in markdown_table().splitlines()[2:]}
    assert rows["SPACEJOBS_TASK_EVENTS"].split(" | ")[1] == "1"
    assert rows["SPACEJOBS_REMOTE_CONTROL"].split(" | ")[1] == "0"
    assert rows["DATABASE_URL"].split(" | ")[1] == "—"
    assert rows["SPACEJOBS_S3_PREFIX"].split(" | ")[1] == "—"
    assert rows["SPACEJOBS_CLAIM_BATCH"].split(" | ")[1] == "`100`"
    assert len(rows) == len(Settings.model_fields)

"""The configuration: one reader of the environment, documented by a table made from it."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from spacejobs.models.settings import Settings, markdown_table

CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"


def test_the_documented_configuration_table_is_the_generated_one() -> None:
    text = CONFIGURATION.read_text()
    start = text.index("<!-- settings-table:start -->\n") + len("<!-- settings-table:start -->\n")
    end = text.index("<!-- settings-table:end -->")
    assert text[start:end].strip() == markdown_table(), (
        "docs/reference/configuration.md's table is stale: run `python -m models.settings` and paste it"
    )


def test_every_setting_is_documented() -> None:
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description for docs/reference/configuration.md"


def test_variables_are_read_by_their_documented_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPACEJOBS_DRAIN_LIMIT", "7")
    monkeypatch.setenv("SPACEJOBS_CLAIM_BATCH", "3")
    settings = Settings()
    assert settings.drain_limit == 7
    assert settings.claim_batch == 3


def test_bad_value_is_a_clear_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPACEJOBS_DRAIN_LIMIT", "lots")
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert "drain_limit" in str(raised.value).lower() or "SPACEJOBS_DRAIN_LIMIT" in str(raised.value)

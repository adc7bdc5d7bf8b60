"""When a process traces, by the OpenTelemetry specification's variables, except that nothing
set means off (the SDK's own default exporter would be otlp)."""

from __future__ import annotations

import pytest

from spacejobs.models import trace_setup, tracing
from spacejobs.models.settings import Settings

VARIABLES = ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")


@pytest.mark.parametrize(("environment", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
])
def test_the_otel_variables_turn_traces_on(monkeypatch: pytest.MonkeyPatch,
                                           environment: dict[str, str], on: bool) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert tracing.wanted(Settings()) is on


@pytest.mark.parametrize(("environment", "exporters"), [
    ({"OTEL_TRACES_EXPORTER": "otlp"}, ["OTLPSpanExporter"]),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["OTLPSpanExporter", "ConsoleSpanExporter"]),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, None),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, None),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, ["OTLPSpanExporter"]),
])
def test_only_the_exporters_we_ship_are_made(monkeypatch: pytest.MonkeyPatch,
                                             environment: dict[str, str],
                                             exporters: list[str] | None) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    made = trace_setup.exporters(Settings())
    assert (None if made is None else [type(e).__name__ for e in made]) == exporters

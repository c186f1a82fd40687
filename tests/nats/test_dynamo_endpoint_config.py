"""--dynamo-endpoint: which Dynamo endpoint's KV event plane the picker hears, named as Dynamo names it."""

from __future__ import annotations

import pytest

from extproc.config import ConfigError, load_config
from extproc.events.dynamo_plane import event_plane_subject


def names(argv: list[str], environ: dict[str, str] | None = None) -> tuple[str, str, str]:
    events = load_config(argv, environ=environ or {}).events
    return events.namespace, events.component, events.dynamo_endpoint


@pytest.mark.parametrize(
    "argv, environ, expected",
    [
        ([], {}, ("dynamo", "backend", "generate")),
        (["--dynamo-endpoint", "prefill"], {}, ("dynamo", "backend", "prefill")),
        (
            ["--namespace", "prod", "--component", "vllm", "--dynamo-endpoint", "generate"],
            {},
            ("prod", "vllm", "generate"),
        ),
        # the form of `python -m dynamo.router --endpoint` and of Dynamo's runtime.endpoint()
        (["--dynamo-endpoint", "prod.vllm.generate"], {}, ("prod", "vllm", "generate")),
        (["--dynamo-endpoint", "dyn://prod.vllm.generate"], {}, ("prod", "vllm", "generate")),
        (
            ["--namespace", "prod", "--dynamo-endpoint", "prod.vllm.generate"],
            {},
            ("prod", "vllm", "generate"),
        ),
        ([], {"DYN_DYNAMO_ENDPOINT": "ns1.backend.state"}, ("ns1", "backend", "state")),
        (["--dynamo-endpoint", "*"], {}, ("dynamo", "backend", "*")),
        (["--dynamo-endpoint", "ns1.backend.*"], {}, ("ns1", "backend", "*")),
    ],
)
def test_the_endpoint_alone_or_the_whole_dynamo_path(argv, environ, expected):
    assert names(argv, environ) == expected


def test_the_config_file_names_it_under_events(tmp_path):
    path = tmp_path / "picker.yaml"
    path.write_text("events: {dynamo-endpoint: prod.sglang.generate}\n")
    assert names(["--config", str(path)]) == ("prod", "sglang", "generate")


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--dynamo-endpoint", "ns.generate"],
            "expected an endpoint name, '\\*', or namespace.component.endpoint",
        ),
        (["--dynamo-endpoint", "a.b.c.d"], "expected an endpoint name"),
        (["--dynamo-endpoint", "gen>"], "expected an endpoint name"),
        (["--dynamo-endpoint", ""], "expected an endpoint name"),
        (["--dynamo-endpoint", "ns.b*.generate"], "component 'b\\*' is not a Dynamo name"),
        (
            ["--namespace", "other", "--dynamo-endpoint", "prod.vllm.generate"],
            "names namespace 'prod' but --namespace is 'other'",
        ),
        (
            ["--component", "sglang", "--dynamo-endpoint", "prod.vllm.generate"],
            "names component 'vllm' but --component",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_it(argv, message):
    with pytest.raises(ConfigError, match=message):
        load_config(argv, environ={})


def test_the_subject_it_makes():
    assert (
        event_plane_subject("ns1", "backend", "generate")
        == "namespace.ns1.component.backend.endpoint.generate.kv-events"
    )
    assert (
        event_plane_subject("ns1", "backend", "*") == "namespace.ns1.component.backend.endpoint.*.kv-events"
    )


def test_help_explains_it(capsys):
    with pytest.raises(SystemExit):
        load_config(["--help"], environ={})
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, even inside words
    assert "--dynamo-endpoint" in text and "python-mdynamo.router--endpoint" in text
    assert "namespace.<ns>.component.<component>.endpoint.<endpoint>.kv-events" in text

"""The file's workers: list (extproc/config/workers.py)."""

import pytest

from extproc.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("workers", "message"),
    [
        ("workers: {id: w0}", "expected a list"),
        ("workers: [{id: w0, model: m}]", "missing 'endpoint'"),
        ("workers: [{id: w0, endpoint: nohostport, model: m}]", "expected ip:port"),
        (
            "workers: [{id: a, endpoint: '1.1.1.1:1', model: m}, {id: a, endpoint: '1.1.1.1:2', model: m}]",
            "unique",
        ),
        ("- just a list", "mapping at the top level"),
        (
            "workers: [{id: w0, endpoint: '1.1.1.1:1', model: m, kv-events: '1.1.1.1:5557'}]",
            "tcp://host:port",
        ),
    ],
)
def test_bad_worker_lists_are_refused_with_a_clear_message(tmp_path, workers, message):
    path = tmp_path / "bad.yaml"
    path.write_text(workers)
    with pytest.raises(ConfigError, match=message):
        load_config(["--config", str(path)], environ={})

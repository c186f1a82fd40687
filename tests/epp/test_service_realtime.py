"""A Realtime API connection (a WebSocket upgrade) through the servicer: routed on its headers alone.

Our Envoy templates send the picker an upgrade's request headers and nothing else
(`envoy/websocket_route.yaml`: body mode NONE); the picker routes it to the workers of the model its
query names (`?model=`, as the `openai` client's `realtime.connect` opens it). The connection is
counted in the per-request series under that model, with no request bytes: its frames never pass
the picker. `tests/e2e/test_realtime_e2e.py` runs it through a real Envoy.
"""

from __future__ import annotations

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from extproc.epp import answers as epp

from ..picker_fixtures import mutation_headers, request_headers, run
from .test_service_forms import WORKERS, make_service

NONE = processing_mode_pb2.ProcessingMode.BodySendMode.NONE
UPGRADE = {"upgrade": "websocket", "connection": "Upgrade"}


async def test_a_realtime_connection_is_routed_on_its_headers_to_the_model_its_query_names() -> None:
    picker, service = make_service()
    for model in ("whisper", "whisper", "chat"):
        headers = request_headers(f"/v1/realtime?model={model}", method="GET", mode=NONE, extra=UPGRADE)
        answers = await run(service, [headers])
        assert len(answers) == 1 and answers[0].HasField("request_headers")
        assert mutation_headers(answers[0].request_headers.response)[epp.DESTINATION_HEADER] in WORKERS[model]
    counts, total = service.objectives.request_bytes.child(("whisper", "whisper"))
    assert sum(counts) == 2 and total == [0]  # counted, with no body
    assert picker.is_idle()


async def test_a_realtime_model_nobody_serves_is_a_404_on_the_headers() -> None:
    _, service = make_service()
    headers = request_headers("/v1/realtime?model=nope", method="GET", mode=NONE, extra=UPGRADE)
    (answer,) = await run(service, [headers])
    assert answer.immediate_response.status.code == 404

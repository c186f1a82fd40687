"""The decision pipeline: one request's way from body bytes to a routed worker, and its lifecycle.

pipeline.py        `EndpointPicker`: parse, tokenize, route, name the endpoint; follow the request
group_request.py   a parsed request and its tokens -> what the router groups decide on (limits, hints)
body_parser.py     `BodyParser`: small bodies parsed on the event loop, large ones in worker processes
parse_worker.py    the parse worker process (`python -m extproc.picker.parse_worker`) and what it runs
client_ids.py      request ids (the picker's own namespace), session ids (bounded), their log form
admission.py       `AdmissionGate`: the queue that holds requests while every worker is saturated
outlier.py         outlier ejection of workers that keep failing
prefill_health.py  `GET /health` probes of prefill workers (disaggregated serving)
metrics.py         the request path's own counters and timings
"""

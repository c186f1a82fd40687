"""The decision pipeline: one request's way from body bytes to a routed worker, and its lifecycle.

pipeline.py        `EndpointPicker`: parse, tokenize, route, name the endpoint; follow the request
admission.py       `AdmissionGate`: the queue that holds requests while every worker is saturated
outlier.py         outlier ejection of workers that keep failing
prefill_health.py  `GET /health` probes of prefill workers (disaggregated serving)
metrics.py         the request path's own counters and timings
"""

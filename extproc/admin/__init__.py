"""The admin HTTP API and the Prometheus metrics it serves.

api.py       /metrics, /healthz, /readyz, /debug/*, /busy_threshold (token-guarded mutations)
metrics.py   the collector that reads the picker's state at scrape time
"""

"""The running process: servers, readiness, worker discovery, TLS.

server.py     `start_picker` / `serve`: the ext_proc, health, admin and group API servers, event
              sources and discovery, started and stopped together (graceful drain)
readiness.py  `/readyz` and the gRPC health status
discovery.py  workers from DNS (headless Services) or a re-read config file
tls.py        certificates and credentials for ext_proc, the group API and NATS
"""

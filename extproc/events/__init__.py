"""KV event formats and transports: vLLM/SGLang ZMQ, Dynamo JSON on NATS, JetStream, replica sync.

Every transport decodes its wire format into the router's one event model
(`extproc.router.types.KvEvent`) and hands it to an `EventSink`; nothing here decides routing.
"""

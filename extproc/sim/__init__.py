"""Simulated LLM engine: timing model, block-level prefix cache, vLLM-style scheduler core, and the
OpenAI-compatible mock worker that drives them in real time (`python -m extproc mock-worker`)."""

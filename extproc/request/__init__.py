"""An OpenAI request body -> the token ids the engine will prefill.

parse.py             the body -> `ParsedRequest` (what routing reads); the one converter
tokenizer.py         `RequestTokenizer`: chat template + Hugging Face tokenizer, or the engine's
                     /tokenize, or bytes; bounded cache
chat_template.py     vLLM's chat-template rendering (the Jinja environment, messages, tools)
piecewise.py         chat prompts encoded piece by piece between added tokens, exactly, or refused
token_cache.py       the pieces' token ids: an LRU bounded by bytes (--tokenizer-cache-bytes)
cache_metrics.py     the piece caches' counters as Prometheus metrics, at scrape time
remote_tokenizer.py  the engine's own /tokenize endpoint as a tokenizer
form.py              an audio upload's multipart form -> its `model` field, read as the engines read it
"""

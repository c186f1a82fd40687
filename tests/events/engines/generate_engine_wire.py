"""Records `tests/events/engines/engine-wire/`: older vLLM and SGLang releases' KV event bytes, from source.

`generate_fixtures.py` drives vLLM 0.33.0's whole block pool and SGLang 0.5.23's recorder. Engines in
the field run older releases, whose wire format differs: vLLM's events are tagged msgpack arrays up
to 0.20 (maps from 0.25), with fields added release by release (`medium` in 0.10, `lora_name` and
`extra_keys` in 0.18, `group_idx` in 0.20, `kv_cache_spec_*` in 0.25, `locality`/`ownership`/
`session_id` in 0.30), and the replay end marker with the topic frame only from 0.30; SGLang's were
arrays of five fields (0.4) and six (`medium`, 0.5.10), with signed block ids. This script records
each format from that release's own module (`vllm/distributed/kv_events.py`,
`sglang/srt/disaggregation/kv_events.py`: its event structs and its `ZmqEventPublisher`):

    python3 -m venv /tmp/genvenv
    /tmp/genvenv/bin/pip install msgspec pyzmq msgpack numpy pydantic
    /tmp/genvenv/bin/python tests/events/engines/generate_engine_wire.py [--cache DIR]

1. Downloads each release's source archive (vLLM's wheels are 400 MB each; the module is the same)
   from PyPI's simple index, checks its sha256 against the index, and extracts that one module.
2. Loads it with stubs for what it imports but need not run (vLLM: vllm.logger, vllm.config's
   KVEventsConfig, vllm.v1.core.kv_cache_utils.ExternalBlockHash; SGLang's imports nothing of its own).
3. Builds one scenario's batches with the release's own structs, filling only the fields it has:
   a plain prompt, its continuation (a parent id), a LoRA prompt (a release without `lora_name`
   names its adapter by number only, which the router cannot hash: dropped, counted), a salted
   prompt (the salt in the first block's `extra_keys`, where the release has them; older ones
   sent no salt at all, so their salted blocks look unsalted), a removal, and the cache cleared
   and filled again. SGLang's block ids are negative, as its hashes of token tuples often are.
4. Publishes them through the release's `ZmqEventPublisher` on ipc:// sockets (its bind-or-connect
   rule binds those; no TCP port is opened), and records with `generate_fixtures.record` every live
   message and two replay exchanges (from seq 0 and from the middle), verbatim.

What each batch must decode to and what the router must hold at the end (`manifest.json` here)
come from what the script asked the publisher to send, never from decoding it.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import importlib.util
import json
import logging
import sys
import tarfile
import tempfile
import types
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate_fixtures as gf  # noqa: E402  (the recording helpers, from the same folder)

OUT = HERE / "engine-wire"
RELEASES = (  # one per wire change
    ("vllm", "0.9.2"), ("vllm", "0.11.0"), ("vllm", "0.18.1"), ("vllm", "0.20.2"), ("vllm", "0.25.1"),
    ("vllm", "0.30.0"), ("sglang", "0.4.7"), ("sglang", "0.5.10"),
)  # fmt: skip
MODULES = {"vllm": "vllm/distributed/kv_events.py", "sglang": "sglang/srt/disaggregation/kv_events.py"}
INDEX = "https://pypi.org/simple/{engine}/"
log = logging.getLogger("generate_engine_wire")


def fetch_source(engine: str, version: str, cache: Path) -> tuple[Path, str]:
    """The release's sdist in `cache` (downloaded unless there) and its sha256, checked."""
    index = INDEX.format(engine=engine)
    request = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    (entry,) = [f for f in files if f["filename"] == f"{engine}-{version}.tar.gz"]
    path = cache / entry["filename"]
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        log.info("downloading %s", entry["url"])
        urllib.request.urlretrieve(entry["url"], path)
    digest = gf.sha256_of(path)
    if digest != entry["hashes"]["sha256"]:
        raise SystemExit(f"{path}: sha256 {digest}, the index says {entry['hashes']['sha256']}")
    return path, digest


def load_kv_events(sdist: Path, engine: str, version: str) -> types.ModuleType:
    """The release's kv_events module, loaded under its own name with its imports stubbed."""
    for name in [n for n in sys.modules if n.split(".")[0] in MODULES]:
        del sys.modules[name]  # each release is loaded afresh

    class KVEventsConfig:
        def __init__(self, **fields: Any) -> None:
            self.__dict__.update(fields)

    gf.stub("vllm.config", KVEventsConfig=KVEventsConfig)
    gf.stub("vllm.config.kv_events", KVEventsConfig=KVEventsConfig)
    gf.stub("vllm.logger", init_logger=logging.getLogger)
    gf.stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    with tarfile.open(sdist) as tar:
        source = tar.extractfile(f"{engine}-{version}/{MODULES[engine]}")
        assert source is not None
        code = source.read()
    target = Path(tempfile.mkdtemp()) / "kv_events.py"
    target.write_bytes(code)
    name = MODULES[engine].removesuffix(".py").replace("/", ".")
    gf.package(name.rpartition(".")[0])
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Scenario:
    """Batches built with one release's structs, and what each must decode to."""

    def __init__(self, kv: types.ModuleType, engine: str, version: str) -> None:
        self.kv = kv
        self.fields = set(kv.BlockStored.__struct_fields__)
        self.sign = -1 if engine == "sglang" else 1  # SGLang's ids: Python hashes, often negative
        self.capture = gf.Capture(
            engine,
            version,
            f"{'vLLM' if engine == 'vllm' else 'SGLang'} {version}'s own event structs and ZmqEventPublisher "
            "(fields: "
            f"{', '.join(kv.BlockStored.__struct_fields__)}): a plain prompt and its continuation, a "
            "LoRA prompt, a salted prompt, a removal, the cache cleared and filled again.",
            0,
        )
        self.next_id = 10_000 + 1_000 * RELEASES.index((engine, version))
        self.events: list[Any] = []
        self.expect = gf.Expect()

    def store(
        self, tokens: list[int], parent: int | None, *, lora: str | None = None, salt: str | None = None
    ) -> list[int]:
        """One BlockStored of len(tokens) / 16 blocks; its engine ids."""
        n = len(tokens) // gf.BLOCK_SIZE
        ids = [self.sign * i for i in range(self.next_id, self.next_id + n)]
        self.next_id += n
        values: dict[str, Any] = {
            "block_hashes": ids, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": gf.BLOCK_SIZE, "lora_id": 1 if lora else None, "medium": "GPU", "lora_name": lora,
        }  # fmt: skip
        if salt is not None and "extra_keys" in self.fields:
            values["extra_keys"] = [(salt,)] + [None] * (n - 1)  # vLLM: the salt in the first block only
        self.events.append(self.kv.BlockStored(**{k: v for k, v in values.items() if k in self.fields}))
        if lora is not None and "lora_name" not in self.fields:
            self.expect.count("vllm.lora_without_name")  # a number the router cannot hash: dropped
            return ids
        seen_salt = salt if "extra_keys" in self.fields else None  # older releases send no salt
        prev = parent % (1 << 64) if parent is not None else None
        for i, engine_id in enumerate(ids):
            block = tokens[i * gf.BLOCK_SIZE : (i + 1) * gf.BLOCK_SIZE]
            unsigned = engine_id % (1 << 64)  # what the router keys it by
            self.expect.stored.append(gf.block_json(unsigned, prev, block, lora, seen_salt))
            prev = unsigned
        return ids

    def remove(self, ids: list[int]) -> None:
        values = {"block_hashes": ids, "medium": "GPU"}
        fields = set(self.kv.BlockRemoved.__struct_fields__)
        self.events.append(self.kv.BlockRemoved(**{k: v for k, v in values.items() if k in fields}))
        self.expect.removed += [i % (1 << 64) for i in ids]

    def clear(self) -> None:
        self.events.append(self.kv.AllBlocksCleared())
        self.expect.cleared = True

    def flush(self) -> None:
        """The events so far as one batch (one engine step)."""
        ts = gf.TS0 + len(self.capture.batches) / 2
        self.capture.batches.append(self.kv.KVEventBatch(ts, self.events, 0))  # vLLM's and SGLang's dp rank
        self.capture.expects.append(self.expect)
        self.events, self.expect = [], gf.Expect()


def scenario(kv: types.ModuleType, engine: str, version: str) -> gf.Capture:
    s = Scenario(kv, engine, version)
    s.store(gf.toks(100, 32), None)
    s.flush()  # 0
    s.clear()
    s.flush()  # 1: what was stored before is gone
    prompt = s.store(gf.toks(1000, 48), None)
    s.store(gf.toks(1048, 32), prompt[-1])
    s.flush()  # 2: a prompt and its continuation
    s.store(gf.toks(2000, 32), None, lora="sql-lora")
    salted = s.store(gf.toks(5000, 32), None, salt="salt-A")
    s.flush()  # 3
    s.remove([salted[-1]])
    s.flush()  # 4
    salt_kept = "salt-A" if "extra_keys" in s.fields else None
    lora_blocks = 2 if "lora_name" in s.fields else 0
    cap = s.capture
    cap.chains = [
        gf.Chain(gf.toks(100, 32), None, None, 0, "stored before the cache was cleared"),
        gf.Chain(gf.toks(1000, 80), None, None, 5, "a prompt and its continuation"),
        gf.Chain(gf.toks(2000, 32), "sql-lora", None, lora_blocks, "a LoRA prompt (named from 0.18)"),
        gf.Chain(gf.toks(5000, 32), None, salt_kept, 1, "the salted prompt, its last block removed"),
        gf.Chain(gf.toks(5000, 32), None, "salt-B", 0, "the same tokens under another salt"),
    ]
    if salt_kept is None:  # the release sent no salt: the engine's salted blocks were indexed as plain tokens
        note = "asked with its salt: nothing (the release sent none, so its blocks look unsalted)"
        cap.chains.append(gf.Chain(gf.toks(5000, 32), None, "salt-A", 0, note))
    cap.num_blocks = 5 + lora_blocks + 1
    return cap


def publisher(kv: types.ModuleType) -> Callable[[], gf.Publisher]:
    def start() -> gf.Publisher:
        directory = tempfile.mkdtemp(prefix="engine-wire-")
        pub, replay = f"ipc://{directory}/pub", f"ipc://{directory}/replay"
        p = kv.ZmqEventPublisher(0, endpoint=pub, replay_endpoint=replay, buffer_steps=100)
        atexit.unregister(p.shutdown)  # SGLang registers itself; it is shut down once, by record()
        return gf.Publisher(pub, replay, p.publish, p.shutdown)

    return start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/kv-engine-wheels/sdists"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    OUT.mkdir(exist_ok=True)
    manifest: dict[str, Any] = {
        "generated_by": "tests/events/engines/generate_engine_wire.py",
        "python": sys.version.split()[0],
        "router_block_size": gf.BLOCK_SIZE,
        "releases": {},
    }
    for engine, version in RELEASES:
        sdist, digest = fetch_source(engine, version, args.cache)
        kv = load_kv_events(sdist, engine, version)
        capture = scenario(kv, engine, version)
        data = gf.record(capture, publisher(kv)())
        file = f"{engine}-{version}.json"
        (OUT / file).write_text(gf.dump(data))
        entry = gf.capture_json(capture, f"engine-wire/{file}")
        module_sha = hashlib.sha256(Path(kv.__file__).read_bytes()).hexdigest()
        entry |= {"sdist": sdist.name, "sdist_sha256": digest, "module_sha256": module_sha}
        entry["fields"] = list(kv.BlockStored.__struct_fields__)
        manifest["releases"][f"{engine}-{version}"] = entry
        log.info("wrote %s: %d batches", file, len(capture.batches))
    (OUT / "manifest.json").write_text(gf.dump(manifest))


if __name__ == "__main__":
    main()

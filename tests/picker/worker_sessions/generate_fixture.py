"""Records SGLang 0.5.23's session API (sglang-0.5.23.json beside this file) from SGLang's own code.

Run from the repository root (nothing from the wheel is committed, only this script and what it writes):

    .venv/bin/python tests/picker/worker_sessions/generate_fixture.py [--cache DIR] [--check]

It `pip download --no-deps sglang==0.5.23` into `--cache` (default /tmp/worker-sessions-wheels; a wheel
already there is reused) and reads, with `ast` (SGLang's modules import torch, which cannot load here):

- sglang/srt/entrypoints/http_server.py: the routes `open_session` and `close_session` are served on,
  their methods and body classes; the message SGLang raises when `open_session` gets no id back (a
  session with that id is still open); the shape and default status of `_create_error_response`;
- sglang/srt/managers/io_struct.py: the fields of the body classes (and of their base `BaseReq`):
  name, annotation and whether it is required.

tests/picker/test_worker_sessions.py serves these routes and validates what the picker sends with
pydantic in lax mode, extra keys ignored: what SGLang's `msgspec_struct_pydantic_core_schema` builds
for FastAPI. `--check` regenerates into memory and fails when the committed file differs.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VERSION = "0.5.23"
OUT = HERE / f"sglang-{VERSION}.json"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
IO_STRUCT = "sglang/srt/managers/io_struct.py"
ROUTES = ("open_session", "close_session")


def wheel(cache: Path) -> Path:
    found = sorted(cache.glob(f"sglang-{VERSION}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={VERSION}", "-d", cache],
            check=True,
        )
        found = sorted(cache.glob(f"sglang-{VERSION}-*.whl"))
    return found[0]


def routes(tree: ast.Module) -> tuple[dict[str, Any], str]:
    out: dict[str, Any] = {}
    still_open = ""
    for node in tree.body:
        if not isinstance(node, ast.AsyncFunctionDef) or node.name not in ROUTES:
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "api_route":
                path = ast.literal_eval(deco.args[0])
                methods = next(ast.literal_eval(k.value) for k in deco.keywords if k.arg == "methods")
        body_class = ast.unparse(node.args.args[0].annotation).split("[", 1)[1].split(",", 1)[0]
        out[path] = {"function": node.name, "methods": methods, "body": body_class}
        for raised in ast.walk(node):
            if isinstance(raised, ast.Raise) and isinstance(raised.exc, ast.Call) and raised.exc.args:
                still_open = ast.literal_eval(raised.exc.args[0])
    return out, still_open


def error_response(tree: ast.Module) -> dict[str, Any]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "_create_error_response":
            call = node.body[0].value  # return ORJSONResponse({...}, status_code=...)
            assert isinstance(call, ast.Call)
            status = ast.unparse(call.keywords[0].value)
            return {"content": ast.unparse(call.args[0]), "status_code": status}
    raise SystemExit("_create_error_response not found")


def fields(tree: ast.Module, names: set[str]) -> dict[str, Any]:
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out: dict[str, Any] = {}
    for name in sorted(names):
        node = classes[name]
        own = []
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                annotation = ast.unparse(stmt.annotation)
                own.append({"name": stmt.target.id, "annotation": annotation, "required": stmt.value is None})
        out[name] = {"bases": [ast.unparse(b) for b in node.bases], "fields": own}
    return out


def generate(cache: Path) -> str:
    with zipfile.ZipFile(wheel(cache)) as zf:
        server = ast.parse(zf.read(HTTP_SERVER))
        io_struct = ast.parse(zf.read(IO_STRUCT))
    served, still_open = routes(server)
    bodies = {r["body"] for r in served.values()}
    document = {
        "sglang": VERSION,
        "source": [HTTP_SERVER, IO_STRUCT],
        "routes": served,
        "open_duplicate_message": still_open,
        "error_response": error_response(server),
        "classes": fields(io_struct, bodies | {"BaseReq"}),
    }
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/worker-sessions-wheels"))
    parser.add_argument("--check", action="store_true", help="fail when the committed file differs")
    args = parser.parse_args()
    text = generate(args.cache)
    if args.check:
        if OUT.read_text() != text:
            raise SystemExit(f"{OUT} differs from what SGLang {VERSION} gives: rerun without --check")
        print(f"{OUT.name}: matches SGLang {VERSION}")
        return
    OUT.write_text(text)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

"""The wheel built from the tree works outside it: it holds every file of the package, renders every
Envoy variant (the templates are package data) and runs `serve`.

The wheel is built (`pip wheel --no-deps --no-build-isolation`: no network, the test venv's
setuptools) from a copy of the tree's files less what .gitignore names, so the build's `build/` and
`*.egg-info` never land in the repo, and installed with `pip install --no-deps --target`. Each
command then runs from a directory outside the repo as `python -S` with PYTHONPATH = the installed
wheel + the test venv's site-packages: `-S` skips the .pth files, so the venv's editable install of
the repo (a meta path finder that would serve any module the wheel lacks) is not there, and the
probe checks that nothing of the repo is on sys.path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.devstack.envoy_config import FRAGMENTS, VARIANTS, render_envoy_config

REPO = Path(__file__).resolve().parents[1]
# what setuptools reads to build the wheel (a pathspec that matches nothing is fine)
BUILD_INPUTS = ("pyproject.toml", "README.md", "MANIFEST.in", "LICENSE", "setup.cfg", "setup.py", "extproc")
PICKER, WORKERS = "127.0.0.1:9002", "127.0.0.1:8001,127.0.0.1:8002"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    target: Path  # pip install --target
    cwd: Path  # outside the repo
    sources: list[str]  # the tree's files the wheel was built from

    def env(self) -> dict[str, str]:
        paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONPATH"] = os.pathsep.join([str(self.target), *paths])
        return env

    def python(self, *args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-S", *args],
            cwd=self.cwd,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("wheel")
    assert not root.resolve().is_relative_to(REPO)
    listed = subprocess.run(
        [
            "git",
            "-C",
            str(REPO),
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            *BUILD_INPUTS,
        ],
        capture_output=True,
        check=True,
        timeout=10,
    )
    # the tree's files as `pip wheel .` there would see them, without what .gitignore names (build/,
    # *.egg-info, __pycache__): tracked ones as they are now (one deleted is gone) and new ones
    sources = [p for p in listed.stdout.decode().split("\0") if p and (REPO / p).is_file()]
    src = root / "src"
    for rel in sources:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    dist = root / "dist"
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", str(src), "-w", str(dist))
    (wheel,) = dist.glob("extproc-*.whl")
    target = root / "site"
    _pip("install", "--no-deps", "--no-compile", "--target", str(target), str(wheel))
    cwd = root / "elsewhere"
    cwd.mkdir()
    return Installed(wheel, target, cwd, sources)


def test_the_wheel_holds_every_file_of_the_package_and_the_extproc_command(installed: Installed):
    with zipfile.ZipFile(installed.wheel) as whl:
        names = whl.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = whl.read(entry_points).decode()
    package = sorted(n for n in names if n.startswith("extproc/"))
    tree = sorted(p for p in installed.sources if p.startswith("extproc/"))
    # a folder of modules without __init__.py imports in the tree (namespace package) but is not shipped
    assert not sorted(set(tree) - set(package)), "files of the package the wheel leaves out"
    assert package == tree
    # the variants and the fragments they include
    shipped = sorted([*(f"{v}.yaml" for v in VARIANTS), *(f.name for f in FRAGMENTS)])
    assert [f"extproc/devstack/envoy/{name}" for name in shipped] == [
        n for n in package if n.startswith("extproc/devstack/envoy/") and n.endswith(".yaml")
    ]
    assert re.search(r"^\[console_scripts\]\s*^extproc = extproc\.cli:main$", scripts, re.M)


def test_the_installed_package_is_the_wheel_and_imports_whole_without_the_repo(installed: Installed):
    probe = """if True:
        import importlib, json, pkgutil, sys
        import extproc
        modules = [m.name for m in pkgutil.walk_packages(extproc.__path__, "extproc.")]
        for name in modules:
            if name != "extproc.__main__":  # runs the command line
                importlib.import_module(name)
        loaded = {n: getattr(m, "__file__", None) for n, m in sys.modules.items() if n.startswith("extproc")}
        finders = [f"{type(f).__module__}.{type(f).__qualname__}" for f in sys.meta_path]
        print(json.dumps({"path": sys.path, "loaded": loaded, "finders": finders, "modules": modules}))
    """
    done = installed.python("-c", probe)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    # the only extproc on sys.path is the wheel's; the repo is not there (its venv may be, for deps)
    entries = [Path(p).resolve() for p in seen["path"] if p]
    assert REPO not in entries
    assert [p for p in entries if (p / "extproc").exists()] == [installed.target.resolve()]
    assert not [f for f in seen["finders"] if "editable" in f.lower()]
    assert "extproc.cli" in seen["modules"] and "extproc.devstack.envoy_config" in seen["modules"]
    stray = {n: f for n, f in seen["loaded"].items() if not (f and Path(f).is_relative_to(installed.target))}
    assert not stray, f"modules not from the wheel: {stray}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_installed_wheel_renders_every_envoy_variant(installed: Installed, variant: str):
    args = ["--variant", variant, "--picker", PICKER, "--listen-port", "18080", "--admin-port", "19901"]
    if variant == "failopen":
        args += ["--workers", WORKERS]
    done = installed.python("-m", "extproc", "envoy-config", *args)
    assert done.returncode == 0, done.stderr
    # exactly what the tree renders (tests/e2e/test_envoy_configs.py runs that through Envoy)
    expected = render_envoy_config(
        variant,
        listen_port=18080,
        admin_port=19901,
        picker_address=PICKER,
        workers=WORKERS.split(",") if variant == "failopen" else (),
    )
    assert done.stdout.rstrip("\n") == expected.rstrip("\n")
    doc = yaml.safe_load(done.stdout)
    (listener,) = doc["static_resources"]["listeners"]
    assert listener["address"]["socket_address"]["port_value"] == 18080
    (hcm,) = listener["filter_chains"][0]["filters"]
    filters = {f["name"]: f["typed_config"] for f in hcm["typed_config"]["http_filters"]}
    ext_proc = filters[EXT_PROC_FILTER]
    assert ext_proc["failure_mode_allow"] is (variant == "failopen")
    picker_cluster = ext_proc["grpc_service"]["envoy_grpc"]["cluster_name"]
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    endpoint = clusters[picker_cluster]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert endpoint["endpoint"]["address"]["socket_address"]["port_value"] == 9002


def test_the_extproc_command_of_the_wheel_runs(installed: Installed):
    script = installed.target / "bin" / "extproc"
    done = installed.python(str(script), "envoy-config", "--variant", "duplex", "--picker", PICKER)
    assert done.returncode == 0, done.stderr
    assert EXT_PROC_FILTER in done.stdout and "FULL_DUPLEX_STREAMED" in done.stdout


@pytest.fixture
def served(installed: Installed) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    config = installed.cwd / "picker.yaml"
    config.write_text(
        "workers:\n"
        '  - {id: w0, endpoint: "127.0.0.1:8001", model: demo}\n'
        '  - {id: w1, endpoint: "127.0.0.1:8002", model: demo}\n'
        "models:\n  - {name: demo}\n"
    )
    log = installed.cwd / "serve.log"
    ports = ["--port", "0", "--health-port", "0", "--admin-port", "0"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-m", "extproc", "serve", "--config", str(config), *ports],
            cwd=installed.cwd,
            env=installed.env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _wait_for_log(
    proc: subprocess.Popen[bytes], log: Path, pattern: str, timeout_s: float = 15.0
) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        text = log.read_text(errors="replace")
        if found := re.search(pattern, text):
            return found
        assert proc.poll() is None, f"serve exited with {proc.returncode}:\n{text}"
        assert time.monotonic() < deadline, f"no {pattern!r} within {timeout_s} s:\n{text}"
        time.sleep(0.05)


def test_the_installed_wheel_serves_and_answers_its_health_and_ready_checks(
    served: tuple[subprocess.Popen[bytes], Path],
):
    proc, log = served
    admin = int(_wait_for_log(proc, log, r"admin on http://127\.0\.0\.1:(\d+)").group(1))
    health = int(_wait_for_log(proc, log, r"health on 127\.0\.0\.1:(\d+)").group(1))
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5) as resp:
        assert resp.status == 200
        assert json.loads(resp.read())["ready"] is True
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=5) as resp:
        assert resp.status == 200
    with grpc.insecure_channel(f"127.0.0.1:{health}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    proc.terminate()  # SIGTERM: drain and exit 0
    assert proc.wait(timeout=15) == 0, log.read_text()

"""The picker image's inputs agree with the project and the manifests (no Docker needed).

requirements.lock pins every runtime dependency of pyproject.toml with hashes; the Dockerfile's
build context (.dockerignore) holds what it copies; its user is the one the pods run as; the
manifests run the image of this version.
"""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.k8s.conftest import GATEWAY, REPO
from tests.k8s.kustomize import render


def lock_pins() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) from requirements.lock."""
    text = REPO.joinpath("requirements.lock").read_text()
    pins = {}
    for block in re.split(r"\n(?=[a-z0-9])", text):
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", block)
        if match:
            pins[canonicalize_name(match.group(1))] = (match.group(2), block.count("--hash=sha256:"))
    return pins


def test_the_lock_pins_every_runtime_dependency_with_hashes():
    project = tomllib.loads(REPO.joinpath("pyproject.toml").read_text())["project"]
    pins = lock_pins()
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in requirements.lock: regenerate it (see Dockerfile)"
        version, _ = pins[name]
        assert requirement.specifier.contains(version), f"{name}=={version} does not satisfy {spec}"
    assert all(hashes > 0 for _, hashes in pins.values())


def test_the_build_context_holds_what_the_dockerfile_copies():
    dockerfile = REPO.joinpath("Dockerfile").read_text()
    sources = {m.group(1) for m in re.finditer(r"^COPY (?!--from)(\S+) ", dockerfile, re.M)}
    assert sources == {"requirements.lock", "extproc"}  # the Envoy templates are package data
    lines = REPO.joinpath(".dockerignore").read_text().splitlines()
    ignore = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*"  # everything excluded, then what is needed re-included
    for source in sources:
        assert f"!{source}" in ignore or f"!{source}/" in ignore


def test_the_pods_run_this_versions_image_as_the_images_user():
    version = tomllib.loads(REPO.joinpath("pyproject.toml").read_text())["project"]["version"]
    dockerfile = REPO.joinpath("Dockerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M)
    assert user is not None, "the image must run as a numeric non-root user"
    assert 'ENTRYPOINT ["python", "-m", "extproc"]' in dockerfile
    for overlay in ("inferencepool", "demo"):
        for obj in render(GATEWAY / overlay):
            if obj["kind"] != "Deployment":
                continue
            pod = obj["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsUser"] == int(user.group(1))
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert {c["image"] for c in pod["containers"]} == {f"extproc:{version}"}

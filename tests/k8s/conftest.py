"""Shared fixtures of the manifest tests: the repository's gateway/ and the CRDs in ../shared/crds.

CI clones this repository next to the shared material (`../shared`); where that directory is
missing the tests that need the CRDs are skipped, the others still run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.k8s.crds import CrdSchemas

REPO = Path(__file__).resolve().parents[2]
GATEWAY = REPO / "gateway"
CRDS_DIR = REPO.parent / "shared" / "crds"
BROKEN = Path(__file__).resolve().parent / "fixtures" / "broken"


@pytest.fixture(scope="session")
def crds() -> CrdSchemas:
    if not CRDS_DIR.is_dir():
        pytest.skip(f"no CRD schemas at {CRDS_DIR} (clone the repository next to ../shared)")
    return CrdSchemas(CRDS_DIR)

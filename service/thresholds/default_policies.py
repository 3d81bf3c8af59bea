"""The default policies: those of the example config file, read from the package.

``default_policies.yaml`` is a link to ``deploy/examples/gpuwarden.yaml``, so the policies the
docs ship and the ones ``gpuwarden up`` and ``demo`` install are declared once, there.
"""

from __future__ import annotations

from importlib import resources

import yaml

from service.thresholds.policy import PolicySpec, parse_policy


def default_policies(*, channels: list[str]) -> list[PolicySpec]:
    """The default policies, each sending to ``channels`` (the example's channels dropped)."""
    text = resources.files("service.thresholds").joinpath("default_policies.yaml").read_text()
    docs = yaml.safe_load(text)["policies"]
    return [
        parse_policy({**doc, "channels": channels}, prefix=f"policies.{i}")
        for i, doc in enumerate(docs)
    ]

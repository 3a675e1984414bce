"""A KServe InferenceService (serving.kserve.io/v1beta1) that serves the Triton model repository.

KServe's `kserve-tritonserver` runtime downloads `storageUri` (the repository root, which holds
`<name>/config.pbtxt` and `<name>/1/`) and starts Triton on it, so the config lto wrote is what
runs. The storage URI is a placeholder unless the user gives one: lto does not upload anything.
"""

from __future__ import annotations

import json
import re
from typing import Any

PLACEHOLDER_URI = "s3://CHANGE-ME/model-repository"


def resource_name(name: str) -> str:
    """`name` as a Kubernetes resource name (DNS-1035 label: lowercase letters, digits, '-')."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"m-{label}".rstrip("-")
    return label[:63].rstrip("-")


def _q(value: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar: no YAML type guessing ("1", "no", "on").
    return json.dumps(value)


def inference_service(
    *,
    name: str,
    model_format: str,
    storage_uri: str | None,
    cpu: int | None,
    gpus: int,
    artifact: str,
) -> str:
    """The InferenceService YAML text."""
    lines = [
        f"# Written by lto export from the artifact {artifact}.",
        "# 1. Upload the model repository folder (the parent of the folder holding this file) to",
        "#    storage the cluster can read, and set storageUri to it.",
        "# 2. kubectl apply -f <this file>",
        "apiVersion: serving.kserve.io/v1beta1",
        "kind: InferenceService",
        "metadata:",
        f"  name: {_q(resource_name(name))}",
        "spec:",
        "  predictor:",
        "    model:",
        "      modelFormat:",
        f"        name: {_q(model_format)}",
        f"      runtime: {_q('kserve-tritonserver')}",
        f"      storageUri: {_q(storage_uri or PLACEHOLDER_URI)}",
    ]
    requests: dict[str, str] = {}
    if cpu:
        requests["cpu"] = str(cpu)
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    if requests:
        lines.append("      resources:")
        for section in ("requests", "limits"):
            lines.append(f"        {section}:")
            lines.extend(f"          {_q(k)}: {_q(v)}" for k, v in requests.items())
    return "\n".join(lines) + "\n"


def describe(model_format: str, storage_uri: str | None) -> dict[str, Any]:
    return {
        "model_format": model_format,
        "runtime": "kserve-tritonserver",
        "storage_uri": storage_uri or PLACEHOLDER_URI,
        "storage_uri_is_placeholder": storage_uri is None,
    }


__all__ = ["PLACEHOLDER_URI", "describe", "inference_service", "resource_name"]

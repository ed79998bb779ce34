"""The three CustomResourceDefinitions, generated from the pydantic models.

    python -m gangctl.api.crds [--out deploy/crds]   write the manifests
    python -m gangctl.api.crds --check               exit 1 when the committed files are stale

The models' JSON schema is turned into a structural schema: $refs inlined, Optional unwrapped,
`additionalProperties: true` becomes `x-kubernetes-preserve-unknown-fields: true`, int-or-string
keeps its `anyOf` with `x-kubernetes-int-or-string: true`. CEL rules come from the models.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gangctl.api.runtime import (
    CLUSTER_TRAINING_RUNTIME_KIND,
    CLUSTER_TRAINING_RUNTIME_PLURAL,
    GROUP,
    TRAINING_RUNTIME_KIND,
    TRAINING_RUNTIME_PLURAL,
    VERSION,
    TrainingRuntimeSpec,
)
from gangctl.api.trainjob import NAME_RULE, TRAINJOB_KIND, TRAINJOB_PLURAL, TrainJobSpec, TrainJobStatus

DEFAULT_OUT = Path("deploy/crds")

# Keys that may sit next to `anyOf` on an int-or-string node, and the ones we drop everywhere.
_DROPPED = {"title"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as a Kubernetes structural schema."""
    schema = model.model_json_schema(by_alias=True, mode="validation")
    defs = schema.pop("$defs", {})
    return _convert(schema, defs)


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _inline(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = _convert(value, defs)
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum" or key == "exclusiveMaximum":
            raise ValueError(f"use ge/le, not gt/lt: OpenAPI v3.0 wants a boolean {key}")
        else:
            out[key] = value
    if "x-kubernetes-int-or-string" not in out and "type" not in out:
        if not out.get("x-kubernetes-preserve-unknown-fields"):
            raise ValueError(f"schema node without a type: {node}")
        out["type"] = "object"
    first = [k for k in ("type", "description") if k in out]
    return {**{k: out[k] for k in first}, **{k: v for k, v in out.items() if k not in first}}


def _inline(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Resolve $ref and unwrap Optional (anyOf [X, null]); keys beside them win over X's."""
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        node = {**target, **node}
        return _inline(node, defs)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unions other than Optional and int-or-string are not structural: {options}")
        inner = _inline(options[0], defs)
        node = {**inner, **{k: v for k, v in node.items() if k != "default" or v is not None}}
        # Both the model and the field may carry CEL rules.
        rules = inner.get("x-kubernetes-validations", []) + [
            r for r in node.get("x-kubernetes-validations", []) if r not in inner.get("x-kubernetes-validations", [])
        ]
        if rules:
            node["x-kubernetes-validations"] = rules
        return _inline(node, defs) if "$ref" in node or "anyOf" in node else node
    return node


def _crd(
    kind: str,
    plural: str,
    scope: str,
    spec_model: type[BaseModel],
    status_model: type[BaseModel] | None,
    description: str,
    root_rules: list[dict[str, str]] | None = None,
    columns: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": structural_schema(spec_model),
    }
    if status_model is not None:
        properties["status"] = structural_schema(status_model)
    root: dict[str, Any] = {
        "description": description,
        "type": "object",
        "required": ["spec"],
        "properties": properties,
    }
    if root_rules:
        root["x-kubernetes-validations"] = root_rules
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": root},
    }
    if status_model is not None:
        version["subresources"] = {"status": {}}
    version["additionalPrinterColumns"] = (columns or []) + [
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "gangctl"}},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "categories": ["kubeflow", "gangctl"],
            },
            "scope": scope,
            "versions": [version],
        },
    }


def build_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD manifest, for the three kinds."""
    trainjob = _crd(
        TRAINJOB_KIND,
        TRAINJOB_PLURAL,
        "Namespaced",
        TrainJobSpec,
        TrainJobStatus,
        "TrainJob: a distributed training job, run by gangctl as a gang.",
        root_rules=[NAME_RULE],
        columns=[
            {"name": "State", "type": "string", "jsonPath": ".status.gang.state"},
            {"name": "Reason", "type": "string", "jsonPath": ".status.gang.reason"},
            # as Trainer v2.2+ shows it: what the trainer last reported (status.trainerStatus)
            {"name": "Progress %", "type": "integer", "jsonPath": ".status.trainerStatus.progressPercentage"},
            {"name": "Runtime", "type": "string", "jsonPath": ".spec.runtimeRef.name", "priority": 1},
            {"name": "Nodes", "type": "integer", "jsonPath": ".spec.trainer.numNodes", "priority": 1},
        ],
    )
    runtime_columns = [{"name": "Nodes", "type": "integer", "jsonPath": ".spec.mlPolicy.numNodes"}]
    training_runtime = _crd(
        TRAINING_RUNTIME_KIND,
        TRAINING_RUNTIME_PLURAL,
        "Namespaced",
        TrainingRuntimeSpec,
        None,
        "TrainingRuntime: a namespaced template for TrainJobs in its namespace.",
        columns=runtime_columns,
    )
    cluster_runtime = _crd(
        CLUSTER_TRAINING_RUNTIME_KIND,
        CLUSTER_TRAINING_RUNTIME_PLURAL,
        "Cluster",
        TrainingRuntimeSpec,
        None,
        "ClusterTrainingRuntime: a cluster-scoped template for TrainJobs in any namespace.",
        columns=runtime_columns,
    )
    return {
        f"{GROUP}_{TRAINJOB_PLURAL}.yaml": trainjob,
        f"{GROUP}_{TRAINING_RUNTIME_PLURAL}.yaml": training_runtime,
        f"{GROUP}_{CLUSTER_TRAINING_RUNTIME_PLURAL}.yaml": cluster_runtime,
    }


def render_crds() -> dict[str, str]:
    """File name -> YAML text."""
    import yaml

    header = "# Generated by `python -m gangctl.api.crds` from gangctl/api/*.py. Do not edit.\n"
    return {
        name: header + yaml.safe_dump(crd, sort_keys=False, width=120, allow_unicode=True)
        for name, crd in build_crds().items()
    }


def stale_files(out: Path) -> list[str]:
    """Names of the files under out that differ from the generated ones."""
    return [name for name, text in render_crds().items() if _read(out / name) != text]


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gangctl.api.crds", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory (default: deploy/crds)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the files there are stale")
    args = parser.parse_args(argv)
    rendered = render_crds()
    if args.check:
        stale = [name for name, text in rendered.items() if _read(args.out / name) != text]
        for name in stale:
            old = (_read(args.out / name) or "").splitlines(keepends=True)
            diff = difflib.unified_diff(old, rendered[name].splitlines(keepends=True), str(args.out / name), "generated")
            sys.stderr.writelines(list(diff)[:40])
        if stale:
            print(
                f"stale CRDs in {args.out}: {', '.join(stale)}; regenerate with: python -m gangctl.api.crds --out {args.out}",
                file=sys.stderr,
            )
            return 1
        print(f"CRDs in {args.out} are up to date")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (args.out / name).write_text(text)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

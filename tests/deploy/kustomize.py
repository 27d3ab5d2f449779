"""A reader of the Kustomize subset that ``deploy/kubernetes`` uses, so tests see what
``kubectl apply -k`` would apply (no kubectl or kustomize here).

Supported, as Kustomize does it: ``resources`` (YAML files, and directories holding a
``kustomization.yaml``, rendered first), ``images`` (``name`` with ``newName`` / ``newTag``, matched
on the image name whatever its tag), and ``patches`` with a ``path`` to a strategic merge patch
(maps merged key by key; the lists Kubernetes merges by a key — containers and env by ``name``,
volumes by ``name``, volumeMounts by ``mountPath``, ports by ``containerPort`` — merged element by
element; any other list replaced). Any other key raises ``ValueError`` naming it, so a test cannot
silently read the files wrong.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KNOWN_KEYS = {"apiVersion", "kind", "resources", "images", "patches"}
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


def render(directory: Path) -> list[dict[str, Any]]:
    """The resources ``kubectl apply -k directory`` would apply, in order."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise ValueError(f"{directory}/kustomization.yaml: unsupported keys {sorted(unknown)}")
    docs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{directory}: only patches with a path are supported: {patch}")
        apply_patch(docs, yaml.safe_load((directory / patch["path"]).read_text()))
    for image in spec.get("images", []):
        set_image(docs, image)
    return docs


def apply_patch(docs: list[dict[str, Any]], patch: dict[str, Any]) -> None:
    """Strategic-merge ``patch`` into the resource of its kind and name."""
    key = (patch["kind"], patch["metadata"]["name"])
    targets = [d for d in docs if (d["kind"], d["metadata"]["name"]) == key]
    if len(targets) != 1:
        raise ValueError(f"patch target {key} matches {len(targets)} resources")
    merged = merge(targets[0], patch)
    targets[0].clear()
    targets[0].update(merged)


def merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """``patch`` merged into a copy of ``base`` (see the module's docstring)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for name, value in patch.items():
            out[name] = merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in MERGE_KEYS:
        key = MERGE_KEYS[field]
        out = copy.deepcopy(base)
        for item in patch:
            same = [i for i, b in enumerate(out) if b.get(key) == item.get(key)]
            if same:
                out[same[0]] = merge(out[same[0]], item, field)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def set_image(docs: list[dict[str, Any]], rule: dict[str, str]) -> None:
    """Kustomize's ``images`` entry: containers whose image is ``rule["name"]`` (any tag) get
    ``newName`` and/or ``newTag``."""
    unknown = set(rule) - {"name", "newName", "newTag"}
    if unknown:
        raise ValueError(f"images: unsupported keys {sorted(unknown)}")
    for doc in docs:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            name, _, tag = container["image"].partition(":")
            if name != rule["name"]:
                continue
            name = rule.get("newName", name)
            tag = rule.get("newTag", tag)
            container["image"] = f"{name}:{tag}" if tag else name


def pod_template(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one Deployment's pod template."""
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc

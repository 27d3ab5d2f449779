"""A reader of the Kustomize subset that ``deploy/kubernetes`` uses, so tests see what
``kubectl apply -k`` would apply (no kubectl or kustomize here).

Supported, as Kustomize does it: ``resources`` (YAML files inside the kustomization's directory,
and directories holding a ``kustomization.yaml``, rendered first — a directory that is or contains
one already being rendered is refused, as Kustomize refuses an overlay inside its base), ``images``
(``name`` with ``newName`` / ``newTag``, matched on the image name whatever its tag, a registry
port allowed), ``patches`` with a ``path`` to a strategic merge patch (maps merged key by key; the
lists Kubernetes merges by a key — containers and env by ``name``, volumes by ``name``,
volumeMounts by ``mountPath``, a container's ports by ``containerPort`` and a Service's by
``port`` — merged element by element; any other list replaced), and Kustomize's default output
order (by kind: Service before Deployment before PodDisruptionBudget). Anything else — another
key, a ``$patch`` directive, a ``null`` in a patch, an image digest, a kind the order does not
know — raises ``ValueError`` naming it, so a test cannot silently read the files wrong.
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
}
# Kustomize's legacy order (api/resid/gvk.go: orderFirst … orderLast), for the kinds used here
ORDER = ["Namespace", "ServiceAccount", "ConfigMap", "Secret", "Service", "Deployment",
         "PodDisruptionBudget"]  # fmt: skip


def render(directory: Path, _visiting: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """The resources ``kubectl apply -k directory`` would apply, in its order."""
    directory = directory.resolve()
    for root in _visiting:
        if root == directory or root.is_relative_to(directory):
            raise ValueError(f"cycle: {directory} is or contains {root}, already being rendered")
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise ValueError(f"{directory}/kustomization.yaml: unsupported keys {sorted(unknown)}")
    docs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs += render(path, (*_visiting, directory))
        elif path.is_relative_to(directory):
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        else:
            raise ValueError(f"{entry}: a file outside {directory} (Kustomize's load restrictor)")
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{directory}: only patches with a path are supported: {patch}")
        apply_patch(docs, yaml.safe_load((directory / patch["path"]).read_text()))
    for image in spec.get("images", []):
        set_image(docs, image)
    for doc in docs:
        if doc["kind"] not in ORDER:
            raise ValueError(f"kind {doc['kind']} is not in the known output order")
    return sorted(docs, key=lambda d: ORDER.index(d["kind"]))


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
    if patch is None:
        raise ValueError(f"{field}: null (a deletion) in a patch is not supported")
    if isinstance(base, dict) and isinstance(patch, dict):
        if "$patch" in patch:
            raise ValueError(f"{field}: $patch directives are not supported")
        out = copy.deepcopy(base)
        for name, value in patch.items():
            out[name] = merge(base[name], value, name) if name in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        key = merge_key(field, base + patch)
        if key is None:
            return copy.deepcopy(patch)
        out = copy.deepcopy(base)
        for item in patch:
            same = [i for i, b in enumerate(out) if b[key] == item[key]]
            if same:
                out[same[0]] = merge(out[same[0]], item, field)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def merge_key(field: str | None, items: list[Any]) -> str | None:
    """The strategic merge key of the list ``field`` (None: the patch's list replaces)."""
    if field == "ports":  # a container's ports by containerPort, a Service's by port
        key = "containerPort" if any("containerPort" in i for i in items) else "port"
    else:
        key = MERGE_KEYS.get(field or "")
    if key is not None and not all(isinstance(i, dict) and key in i for i in items):
        raise ValueError(f"{field}: an item without its merge key {key!r}")
    return key


def split_image(image: str) -> tuple[str, str]:
    """``(name, tag)`` of ``registry:port/path/name:tag`` (a tag only after the last ``/``)."""
    if "@" in image:
        raise ValueError(f"{image}: image digests are not supported")
    slash = image.rfind("/")
    colon = image.rfind(":")
    return (image[:colon], image[colon + 1 :]) if colon > slash else (image, "")


def set_image(docs: list[dict[str, Any]], rule: dict[str, str]) -> None:
    """Kustomize's ``images`` entry: containers whose image is ``rule["name"]`` (any tag) get
    ``newName`` and/or ``newTag``."""
    unknown = set(rule) - {"name", "newName", "newTag"}
    if unknown:
        raise ValueError(f"images: unsupported keys {sorted(unknown)}")
    for doc in docs:
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            name, tag = split_image(container["image"])
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

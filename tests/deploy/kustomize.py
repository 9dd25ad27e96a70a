"""A small renderer of Tessera's own kustomizations, for tests on machines without kustomize.

It implements only what deploy/kubernetes uses, and refuses anything else rather than ignore it:
`resources` (files and folders), `components` (kind Component, with `patches` only), `patches` given as
RFC 6902 JSON patches inline with a `target` (group, version, kind, name), `namespace`, `labels` (`pairs`,
added to metadata.labels) and `images` (newName, newTag). Where `kubectl kustomize` is installed, the tests
compare its output with this one's (tests/deploy/test_kubernetes.py)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "labels", "resources", "components", "patches", "images"}
COMPONENT_KEYS = {"apiVersion", "kind", "patches"}
# Kinds of the manifests that live outside any namespace.
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "ClusterRole", "ClusterRoleBinding", "RuntimeClass", "PriorityClass"}


class RenderError(ValueError):
    pass


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise RenderError(f"JSON pointer {path!r} must start with /")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add`, `replace` and `remove` (the operations the components use) on a copy."""
    document = copy.deepcopy(document)
    for op in operations:
        *parents, last = _pointer(op["path"])
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "add":
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                node[last] = op["value"]
        elif op["op"] == "replace":
            if isinstance(node, list):
                node[int(last)] = op["value"]
            elif last not in node:
                raise RenderError(f"replace {op['path']}: nothing there")
            else:
                node[last] = op["value"]
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise RenderError(f"JSON patch operation {op['op']!r} is not supported here")
    return document


def _matches(target: dict[str, Any], resource: dict[str, Any]) -> bool:
    group, _, version = resource["apiVersion"].rpartition("/")
    wanted = {"group": group, "version": version, "kind": resource["kind"], "name": resource["metadata"]["name"]}
    unknown = set(target) - set(wanted)
    if unknown:
        raise RenderError(f"patch target keys {sorted(unknown)} are not supported here")
    return all(wanted[key] == value for key, value in target.items())


def _patch_all(resources: list[dict[str, Any]], patches: list[dict[str, Any]], where: Path) -> list[dict[str, Any]]:
    for patch in patches:
        if set(patch) != {"target", "patch"}:
            raise RenderError(f"{where}: only inline JSON patches with a target are supported, got keys {sorted(patch)}")
        operations = yaml.safe_load(patch["patch"])
        hits = [i for i, r in enumerate(resources) if _matches(patch["target"], r)]
        if not hits:
            raise RenderError(f"{where}: patch target {patch['target']} matches no resource")
        for i in hits:
            resources[i] = json_patch(resources[i], operations)
    return resources


def _pod_spec(resource: dict[str, Any]) -> dict[str, Any] | None:
    spec = resource.get("spec", {})
    if resource["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return spec["template"]["spec"]
    return None


def render(folder: Path, components: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """The resources `kubectl kustomize folder` would print (for the features above); `components`:
    more components, as if the kustomization listed them after its own."""
    folder = Path(folder)
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    if kustomization.get("kind", "Kustomization") != "Kustomization":
        raise RenderError(f"{folder}: a {kustomization['kind']} cannot be built on its own")
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    if unknown:
        raise RenderError(f"{folder}: kustomization keys {sorted(unknown)} are not supported here")
    resources: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        resources += render(path) if path.is_dir() else yaml_documents(path)
    for path in [folder / entry for entry in kustomization.get("components", [])] + [Path(c) for c in components]:
        component = yaml.safe_load((path / "kustomization.yaml").read_text())
        if component.get("kind") != "Component" or set(component) - COMPONENT_KEYS:
            raise RenderError(f"{path}: only Components with patches are supported here")
        resources = _patch_all(resources, component.get("patches", []), path)
    resources = _patch_all(resources, kustomization.get("patches", []), folder)
    namespace = kustomization.get("namespace")
    for resource in resources:
        if namespace and resource["kind"] not in CLUSTER_SCOPED:
            resource["metadata"]["namespace"] = namespace
        for label in kustomization.get("labels", []):
            if set(label) != {"pairs"}:
                raise RenderError(f"{folder}: labels with {sorted(set(label) - {'pairs'})} are not supported here")
            resource["metadata"].setdefault("labels", {}).update(label["pairs"])
        pod = _pod_spec(resource)
        for image in kustomization.get("images", []):
            for container in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
                name, _, _tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return resources

"""A structural schema for the Kubernetes objects in deploy/k8s, written from the Kubeflow
MPIJob v2beta1 API (kubeflow.org/v2beta1: MPIJobSpec, ReplicaSpec, RunPolicy), the batch/v1 Job
API (JobSpec, PodFailurePolicy) and the core v1 API (PodTemplateSpec, Container, Volume,
PersistentVolumeClaim) for the fields hvdtrain's manifests use. Unknown fields, wrong types and values outside an enum are errors, as they would
be for the API server's structural-schema validation.

A schema node is a type (str, int, bool), a dict of field -> node (an object; "*" allows any
key, for maps), a one-element list [node] (an array), an Enum (a str from a set), or Quantity.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Enum:
    values: tuple[str, ...]


class Quantity:
    """A resource quantity: an int, or a string such as "4", "500m" or "16Gi"."""


QUANTITY_SUFFIXES = ("", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti")

OBJECT_META = {"name": str, "namespace": str, "labels": {"*": str},
               "annotations": {"*": str}}

RESOURCES = {"limits": {"*": Quantity}, "requests": {"*": Quantity}}

CONTAINER = {
    "name": str, "image": str, "command": [str], "args": [str], "workingDir": str,
    "imagePullPolicy": Enum(("Always", "IfNotPresent", "Never")),
    "env": [{"name": str, "value": str}],
    "resources": RESOURCES,
    "volumeMounts": [{"name": str, "mountPath": str, "readOnly": bool, "subPath": str}],
    "securityContext": {"runAsUser": int, "runAsGroup": int, "runAsNonRoot": bool},
}

POD_SPEC = {
    "containers": [CONTAINER], "initContainers": [CONTAINER],
    "volumes": [{"name": str, "persistentVolumeClaim": {"claimName": str, "readOnly": bool},
                 "emptyDir": {"medium": str, "sizeLimit": Quantity}}],
    "nodeSelector": {"*": str}, "restartPolicy": Enum(("Always", "OnFailure", "Never")),
    "terminationGracePeriodSeconds": int,
    "securityContext": {"runAsUser": int, "runAsGroup": int, "fsGroup": int,
                        "runAsNonRoot": bool},
}

REPLICA_SPEC = {
    "replicas": int,
    "restartPolicy": Enum(("Always", "OnFailure", "Never", "ExitCode")),
    "template": {"metadata": OBJECT_META, "spec": POD_SPEC},
}

MPIJOB = {
    "apiVersion": Enum(("kubeflow.org/v2beta1",)),
    "kind": Enum(("MPIJob",)),
    "metadata": OBJECT_META,
    "spec": {
        "slotsPerWorker": int,
        "runLauncherAsWorker": bool,
        "runPolicy": {"cleanPodPolicy": Enum(("None", "Running", "All")),
                      "ttlSecondsAfterFinished": int, "activeDeadlineSeconds": int,
                      "backoffLimit": int, "suspend": bool},
        "sshAuthMountPath": str,
        "launcherCreationPolicy": Enum(("AtStartup", "WaitForWorkersReady")),
        "mpiImplementation": Enum(("OpenMPI", "Intel", "MPICH")),
        "mpiReplicaSpecs": {"Launcher": REPLICA_SPEC, "Worker": REPLICA_SPEC},
    },
}

JOB = {
    "apiVersion": Enum(("batch/v1",)),
    "kind": Enum(("Job",)),
    "metadata": OBJECT_META,
    "spec": {
        "backoffLimit": int, "activeDeadlineSeconds": int, "ttlSecondsAfterFinished": int,
        "completions": int, "parallelism": int, "suspend": bool,
        "podFailurePolicy": {"rules": [{
            "action": Enum(("FailJob", "Ignore", "Count", "FailIndex")),
            "onExitCodes": {"containerName": str, "operator": Enum(("In", "NotIn")),
                            "values": [int]},
            "onPodConditions": [{"type": str, "status": Enum(("True", "False", "Unknown"))}],
        }]},
        "template": {"metadata": OBJECT_META, "spec": POD_SPEC},
    },
}

PVC = {
    "apiVersion": Enum(("v1",)),
    "kind": Enum(("PersistentVolumeClaim",)),
    "metadata": OBJECT_META,
    "spec": {"accessModes": [Enum(("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                                   "ReadWriteOncePod"))],
             "resources": RESOURCES, "storageClassName": str},
}

REQUIRED = {"MPIJob": [("spec", "mpiReplicaSpecs", "Launcher"), ("spec", "mpiReplicaSpecs", "Worker")],
            "Job": [("spec", "template", "spec", "containers")]}


def validate(value, schema, path: str = "") -> list[str]:
    """Every place where ``value`` does not fit ``schema``, as readable strings."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path or '.'}: expected an object, got {type(value).__name__}"]
        errors = []
        for key, item in value.items():
            if key in schema:
                errors += validate(item, schema[key], f"{path}.{key}")
            elif "*" in schema:
                errors += validate(item, schema["*"], f"{path}.{key}")
            else:
                errors.append(f"{path}.{key}: unknown field (allowed: {', '.join(sorted(schema))})")
        return errors
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected an array, got {type(value).__name__}"]
        return [e for i, item in enumerate(value) for e in validate(item, schema[0], f"{path}[{i}]")]
    if isinstance(schema, Enum):
        return [] if value in schema.values else [f"{path}: {value!r} is not one of {schema.values}"]
    if schema is Quantity:
        if isinstance(value, int) and not isinstance(value, bool):
            return []
        if isinstance(value, str):
            for suffix in sorted(QUANTITY_SUFFIXES, key=len, reverse=True):
                number = value[: len(value) - len(suffix)] if suffix else value
                if value.endswith(suffix) and number.replace(".", "", 1).isdigit():
                    return []
        return [f"{path}: {value!r} is not a resource quantity"]
    if schema is int and isinstance(value, bool):
        return [f"{path}: expected int, got bool"]
    if not isinstance(value, schema):
        return [f"{path}: expected {schema.__name__}, got {type(value).__name__} ({value!r})"]
    return []


def validate_object(doc: dict) -> list[str]:
    kind = doc.get("kind")
    schema = {"MPIJob": MPIJOB, "Job": JOB, "PersistentVolumeClaim": PVC}.get(kind)
    if schema is None:
        return [f"unsupported kind {kind!r}"]
    errors = validate(doc, schema)
    for required in REQUIRED.get(kind, []):
        node = doc
        for key in required:
            node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            errors.append(f".{'.'.join(required)}: required")
    if kind == "Job":
        errors += _job_rules(doc.get("spec") or {})
    return errors


def _job_rules(spec: dict) -> list[str]:
    """The API server's cross-field checks of a Job that the manifests could break."""
    errors = []
    policy = (spec.get("podFailurePolicy") or {}).get("rules", [])
    restart = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy")
    if policy and restart != "Never":
        errors.append(f".spec.template.spec.restartPolicy: {restart!r}, but podFailurePolicy "
                      "requires 'Never'")
    for i, rule in enumerate(policy):
        if ("onExitCodes" in rule) == ("onPodConditions" in rule):
            errors.append(f".spec.podFailurePolicy.rules[{i}]: exactly one of onExitCodes and "
                          "onPodConditions")
        codes = rule.get("onExitCodes") or {}
        if codes.get("operator") == "In" and 0 in codes.get("values", []):
            errors.append(f".spec.podFailurePolicy.rules[{i}].onExitCodes.values: 0 with In")
    return errors

#!/usr/bin/env python3
"""Offline validation of Hiber's Kubernetes manifests (docs/deploy.md, "Deploying on Kubernetes").

Renders each kustomization (by itself; also with `kubectl kustomize` when a kubectl is found,
and then both renderings must agree) and checks every document strictly against the models of
Debian's python3-kubernetes (22.6, Kubernetes 1.22): apiVersion and kind known, no unknown
field, the right types, required fields present. Kinds and fields newer than the client
(resource.k8s.io/v1, the Prometheus Operator's ServiceMonitor, PodSpec.resourceClaims) are
checked against the small schemas below, which hold only what Hiber uses. Then Hiber's own rules
(hiber_rules). Without arguments it checks the kustomizations under this folder; arguments are
kustomization folders or plain YAML files.

Exit status: 0 when every document is valid, 1 when one is not (one line per problem, naming the
source, the document and the field), 2 on bad usage, 77 when python3-kubernetes or PyYAML is
missing (ctest's skip).
"""

import argparse
import copy
import functools
import inspect
import os
import re
import shutil
import subprocess
import sys

try:
    import yaml
    from kubernetes import client as k8s
except ImportError as e:
    print(f"validate.py: skipped: {e.name} is missing (Debian: apt-get install python3-kubernetes)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TARGETS = ["base", "overlays/example", "overlays/dra", "examples/function"]
HIBER_IMAGES = ("hiber/hiberd", "hiber/router", "hiber/function-base")


class Invalid(Exception):
    """A manifest or kustomization that cannot be rendered."""


# ---------------------------------------------------------------------------------------------
# The schemas: python3-kubernetes' models, and small ones for what the client lacks.

def _api_kinds():
    """{(apiVersion, kind): (model class name, namespaced)} from the client's API classes: each
    create_* method names its body's model, and get_api_resources its group and version."""
    kinds = {}
    for api_name, api in inspect.getmembers(k8s, inspect.isclass):
        if not re.fullmatch(r"\w+V\d+(alpha\d+|beta\d+)?Api", api_name):
            continue
        paths = re.findall(r"'/apis?/([^']*)/'",
                           inspect.getsource(api.get_api_resources_with_http_info))
        if not paths:
            continue
        api_version = paths[0]
        prefix = "V" + api_version.split("/")[-1][1:]
        for method_name, method in inspect.getmembers(api, inspect.isfunction):
            if not method_name.startswith("create_") or method_name.endswith("_with_http_info"):
                continue
            body = re.search(r":param (\w+) body:", method.__doc__ or "")
            if not body or not body.group(1).startswith(prefix):
                continue
            kind = body.group(1)[len(prefix):]
            kinds.setdefault((api_version, kind),
                             (body.group(1), method_name.startswith("create_namespaced_")))
    return kinds


def _required(model):
    return set(re.findall(r"Invalid value for `(\w+)`, must not be `None`", inspect.getsource(model)))


# Fields newer than the client's models, by model and JSON name (Kubernetes 1.34).
EXTRA_FIELDS = {
    "V1PodSpec": {"resourceClaims": "list[X:PodResourceClaim]"},
    "V1ResourceRequirements": {"claims": "list[X:ResourceClaim]"},
}

# Small schemas: {name: (fields {JSON name: type}, required JSON names)}. Types are the client's
# type strings ('str', 'int', 'list[...]', 'dict(str, ...)', model names), X: names here, and
# enum:A|B.
SCHEMAS = {
    "X:PodResourceClaim": ({"name": "str", "resourceClaimName": "str",
                            "resourceClaimTemplateName": "str"}, {"name"}),
    "X:ResourceClaim": ({"name": "str", "request": "str"}, {"name"}),
    "X:ResourceClaimTemplate": ({"apiVersion": "str", "kind": "str", "metadata": "V1ObjectMeta",
                                 "spec": "X:ResourceClaimTemplateSpec"}, {"spec"}),
    "X:ResourceClaimTemplateSpec": ({"metadata": "V1ObjectMeta", "spec": "X:ResourceClaimSpec"},
                                    {"spec"}),
    "X:ResourceClaimSpec": ({"devices": "X:DeviceClaim"}, set()),
    "X:DeviceClaim": ({"requests": "list[X:DeviceRequest]", "constraints": "list[object]",
                       "config": "list[object]"}, set()),
    "X:DeviceRequest": ({"name": "str", "exactly": "X:ExactDeviceRequest",
                         "firstAvailable": "list[object]"}, {"name"}),
    "X:ExactDeviceRequest": ({"deviceClassName": "str", "allocationMode": "enum:ExactCount|All",
                              "count": "int", "adminAccess": "bool", "selectors": "list[object]",
                              "tolerations": "list[object]"}, {"deviceClassName"}),
    "X:ServiceMonitor": ({"apiVersion": "str", "kind": "str", "metadata": "V1ObjectMeta",
                          "spec": "X:ServiceMonitorSpec"}, {"spec"}),
    "X:ServiceMonitorSpec": ({"selector": "V1LabelSelector", "endpoints": "list[X:Endpoint]",
                              "namespaceSelector": "object", "jobLabel": "str"},
                             {"selector", "endpoints"}),
    "X:Endpoint": ({"port": "str", "targetPort": "object", "path": "str", "scheme": "str",
                    "interval": "str", "scrapeTimeout": "str", "honorLabels": "bool"}, set()),
}
EXTRA_KINDS = {
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): ("X:ResourceClaimTemplate", True),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("X:ServiceMonitor", True),
}

KINDS = {**_api_kinds(), **EXTRA_KINDS}


@functools.lru_cache(maxsize=None)
def _fields(type_name):
    """({JSON name: type}, required JSON names) of a model or small schema."""
    if type_name.startswith("X:"):
        return SCHEMAS[type_name]
    model = getattr(k8s, type_name)
    fields = {model.attribute_map[a]: t for a, t in model.openapi_types.items()}
    fields.update(EXTRA_FIELDS.get(type_name, {}))
    return fields, {model.attribute_map[a] for a in _required(model)}


def _describe(value):
    return type(value).__name__ if value is not None else "null"


def check_value(value, type_name, path, errors, quantity=False):
    """Appends (path, message) for every way value is not of type_name."""
    def bad(expected):
        errors.append((path, f"expected {expected}, got {_describe(value)} {value!r}"))

    list_of = re.fullmatch(r"list\[(.+)\]", type_name)
    dict_of = re.fullmatch(r"dict\(str, (.+)\)", type_name)
    if list_of:
        if not isinstance(value, list):
            return bad("a list")
        for i, item in enumerate(value):
            check_value(item, list_of.group(1), f"{path}[{i}]", errors)
    elif dict_of:
        if not isinstance(value, dict):
            return bad("a map")
        # Resource quantities are strings in the API; YAML numbers are accepted for them.
        is_quantity = path.endswith((".limits", ".requests"))
        for key, item in value.items():
            if not isinstance(key, str):
                errors.append((path, f"key {key!r} is not a string"))
            check_value(item, dict_of.group(1), f"{path}.{key}", errors, quantity=is_quantity)
    elif type_name.startswith("enum:"):
        choices = type_name[len("enum:"):].split("|")
        if value not in choices:
            bad("one of " + ", ".join(choices))
    elif type_name == "str" or type_name in ("datetime", "date"):
        if not (isinstance(value, str) or
                (quantity and isinstance(value, (int, float)) and not isinstance(value, bool))):
            bad("a string")
    elif type_name == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            bad("an integer")
    elif type_name == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            bad("a number")
    elif type_name == "bool":
        if not isinstance(value, bool):
            bad("true or false")
    elif type_name == "object":
        pass
    else:
        if not isinstance(value, dict):
            return bad("an object")
        fields, required = _fields(type_name)
        for key, item in value.items():
            if key not in fields:
                errors.append((f"{path}.{key}" if path else key, "unknown field"))
            else:
                check_value(item, fields[key], f"{path}.{key}" if path else key, errors)
        for key in sorted(required - value.keys()):
            errors.append((f"{path}.{key}" if path else key, "required field is missing"))


def check_schema(doc):
    """[(field path, message)] for one document."""
    if not isinstance(doc, dict):
        return [("", f"a document must be a map, got {_describe(doc)}")]
    known = KINDS.get((doc.get("apiVersion"), doc.get("kind")))
    if not known:
        return [("kind", f"unknown apiVersion/kind {doc.get('apiVersion')}/{doc.get('kind')}")]
    errors = []
    check_value(doc, known[0], "", errors)
    if not isinstance(doc.get("metadata"), dict) or not doc["metadata"].get("name"):
        errors.append(("metadata.name", "required field is missing"))
    return errors


def namespaced(doc):
    known = KINDS.get((doc.get("apiVersion"), doc.get("kind")))
    return known[1] if known else True


# ---------------------------------------------------------------------------------------------
# Rendering: the subset of kustomize Hiber uses (resources, components, namespace, images, JSON
# 6902 patches). Anything else is refused, so the two renderings cannot silently differ.

KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "namespace", "resources", "components", "patches",
                        "images"}


def _load_yaml(path):
    try:
        with open(path) as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise Invalid(f"{path}: {e}")


def _kustomization(folder, kind):
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            docs = _load_yaml(path)
            if len(docs) != 1 or not isinstance(docs[0], dict):
                raise Invalid(f"{path}: must hold one map")
            k = docs[0]
            if k.get("kind", "Kustomization") != kind:
                raise Invalid(f"{path}: kind {k.get('kind')}, expected {kind}")
            unknown = set(k) - KUSTOMIZATION_FIELDS
            if unknown:
                raise Invalid(f"{path}: {', '.join(sorted(unknown))}: not rendered by validate.py "
                              f"(it renders {', '.join(sorted(KUSTOMIZATION_FIELDS))})")
            return k
    raise Invalid(f"{folder}: no kustomization.yaml")


def _pointer(path):
    if not path.startswith("/"):
        raise Invalid(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _apply_op(doc, op, where):
    tokens = _pointer(op.get("path", ""))
    parent = doc
    for t in tokens[:-1]:
        try:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        except (KeyError, IndexError, ValueError, TypeError):
            raise Invalid(f"{where}: {op['path']}: {t!r} does not exist")
    last = tokens[-1]
    kind = op.get("op")
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
        elif kind in ("remove", "replace") and 0 <= index < len(parent):
            if kind == "remove":
                del parent[index]
            else:
                parent[index] = copy.deepcopy(op["value"])
        else:
            raise Invalid(f"{where}: {op['path']}: cannot {kind}")
    elif isinstance(parent, dict):
        if kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif kind in ("remove", "replace") and last in parent:
            if kind == "remove":
                del parent[last]
            else:
                parent[last] = copy.deepcopy(op["value"])
        else:
            raise Invalid(f"{where}: {op['path']}: cannot {kind} (no such field)")
    else:
        raise Invalid(f"{where}: {op['path']}: the parent is not a map or a list")


def _patch(docs, entry, folder):
    where = os.path.join(folder, entry.get("path", "(inline patch)"))
    if set(entry) - {"path", "patch", "target"} or ("path" in entry) == ("patch" in entry):
        raise Invalid(f"{where}: a patch needs path or patch, and target")
    ops = (_load_yaml(os.path.join(folder, entry["path"])) if "path" in entry
           else [yaml.safe_load(entry["patch"])])
    if len(ops) != 1 or not isinstance(ops[0], list):
        raise Invalid(f"{where}: only JSON 6902 patches (a list of operations) are rendered")
    target = entry.get("target") or {}
    matched = [d for d in docs
               if all(d.get("kind") == v if k == "kind" else
                      d.get("metadata", {}).get(k) == v if k in ("name", "namespace") else
                      d.get("apiVersion", "").startswith(v + "/") if k == "group" else
                      d.get("apiVersion", "").endswith(v) if k == "version" else False
                      for k, v in target.items())]
    if not matched:
        raise Invalid(f"{where}: the target {target} matches no document")
    for d in matched:
        for op in ops[0]:
            if op.get("op") not in ("add", "remove", "replace"):
                raise Invalid(f"{where}: op {op.get('op')!r} is not rendered (add, remove, replace)")
            _apply_op(d, op, where)


def _pod_specs(doc):
    spec = doc.get("spec") or {}
    if doc.get("kind") == "Pod":
        return [spec]
    template = (spec.get("template") or {}).get("spec")
    if doc.get("kind") == "CronJob":
        template = (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template")
                    or {}).get("spec")
    return [template] if isinstance(template, dict) else []


def _containers(doc):
    for pod in _pod_specs(doc):
        for field in ("initContainers", "containers"):
            for i, c in enumerate(pod.get(field) or []):
                if isinstance(c, dict):
                    yield f"{field}[{i}]", c


def _split_image(image):
    digest = ""
    if "@" in image:
        image, digest = image.split("@", 1)
        digest = "@" + digest
    name, tag = image, ""
    if ":" in image.rsplit("/", 1)[-1]:
        name, tag = image.rsplit(":", 1)
    return name, tag, digest


def _set_images(docs, images):
    for doc in docs:
        for _, c in _containers(doc):
            if not isinstance(c.get("image"), str):
                continue
            name, tag, digest = _split_image(c["image"])
            for entry in images:
                if entry.get("name") == name:
                    name = entry.get("newName", name)
                    if "newTag" in entry:
                        tag = str(entry["newTag"])
                    if "digest" in entry:
                        tag, digest = "", "@" + entry["digest"]
                    c["image"] = name + (":" + tag if tag else "") + digest
                    break


def render(folder, kind="Kustomization"):
    """The documents kustomize renders from folder."""
    k = _kustomization(folder, kind)
    docs = []
    for r in k.get("resources") or []:
        path = os.path.normpath(os.path.join(folder, r))
        docs += render(path) if os.path.isdir(path) else _load_yaml(path)
    for c in k.get("components") or []:
        docs += render_component(os.path.normpath(os.path.join(folder, c)), docs)
    for entry in k.get("patches") or []:
        _patch(docs, entry, folder)
    if "namespace" in k:
        for d in docs:
            if isinstance(d, dict) and namespaced(d):
                d.setdefault("metadata", {})["namespace"] = k["namespace"]
    _set_images(docs, k.get("images") or [])
    return docs


def render_component(folder, parent_docs):
    """A component's own documents; its patches also apply to the parent's (in place)."""
    k = _kustomization(folder, "Component")
    own = []
    for r in k.get("resources") or []:
        own += _load_yaml(os.path.normpath(os.path.join(folder, r)))
    for entry in k.get("patches") or []:
        _patch(parent_docs + own, entry, folder)
    _set_images(parent_docs + own, k.get("images") or [])
    return own


def render_with_kubectl(kubectl, folder):
    out = subprocess.run([kubectl, "kustomize", folder], capture_output=True, text=True)
    if out.returncode != 0:
        raise Invalid(f"kubectl kustomize {folder}: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def _key(doc):
    return (doc.get("apiVersion"), doc.get("kind"), (doc.get("metadata") or {}).get("namespace"),
            (doc.get("metadata") or {}).get("name"))


def compare_renderings(ours, theirs):
    """[message] for every document the two renderings do not agree on."""
    a = {_key(d): d for d in ours}
    b = {_key(d): d for d in theirs}
    problems = [f"{'/'.join(str(p) for p in key[1:])}: only in validate.py's rendering"
                for key in a.keys() - b.keys()]
    problems += [f"{'/'.join(str(p) for p in key[1:])}: only in kubectl's rendering"
                 for key in b.keys() - a.keys()]
    problems += [f"{'/'.join(str(p) for p in key[1:])}: the renderings differ"
                 for key in a.keys() & b.keys() if a[key] != b[key]]
    return sorted(problems)


# ---------------------------------------------------------------------------------------------
# Hiber's rules.

def _flag(args, name, default):
    for a in args or []:
        if isinstance(a, str) and a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return default


def _gpu_requests(container):
    resources = container.get("resources") or {}
    return [f"resources.{part}" for part in ("limits", "requests")
            if "nvidia.com/gpu" in (resources.get(part) or {})]


def _check_hiberd(doc, pod, bad):
    if pod.get("runtimeClassName") != "nvidia":
        bad("spec.template.spec.runtimeClassName", "hiberd must run with runtimeClassName nvidia")
    if pod.get("priorityClassName") != "system-node-critical":
        bad("spec.template.spec.priorityClassName",
            "hiberd must run with priorityClassName system-node-critical")
    rolling = ((doc.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate") or {}
    if rolling.get("maxUnavailable") != 1 or rolling.get("maxSurge", 0) != 0:
        bad("spec.updateStrategy.rollingUpdate",
            "hiberd updates one node at a time and never two on a node (maxUnavailable 1, "
            "maxSurge 0)")
    containers = [c for c in pod.get("containers") or [] if c.get("name") == "hiberd"]
    if len(containers) != 1:
        return bad("spec.template.spec.containers", "no container named hiberd")
    c = containers[0]
    limit = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
    claims = [x.get("name") for x in (c.get("resources") or {}).get("claims") or []]
    pod_claims = [x.get("name") for x in pod.get("resourceClaims") or []]
    if (limit is None) == (not claims):
        bad("spec.template.spec.containers[hiberd].resources",
            "hiberd must hold the node's GPUs one way: an nvidia.com/gpu limit or a DRA claim")
    if limit is not None and (not str(limit).isdigit() or int(limit) < 1):
        bad("spec.template.spec.containers[hiberd].resources.limits.nvidia.com/gpu",
            f"must be a positive count, got {limit!r}")
    for name in claims:
        if name not in pod_claims:
            bad("spec.template.spec.containers[hiberd].resources.claims",
                f"claim {name!r} is not in spec.template.spec.resourceClaims")
    pre_stop = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
    command = pre_stop.get("command") or []
    if "drain" not in command:
        return bad("spec.template.spec.containers[hiberd].lifecycle.preStop",
                   "hiberd's preStop must drain the node (hiberctl drain)")
    needed = (int(_flag(command, "timeout_ms", "30000")) +
              int(_flag(c.get("args"), "shutdown_timeout_ms", "30000"))) // 1000
    if pod.get("terminationGracePeriodSeconds", 30) < needed:
        bad("spec.template.spec.terminationGracePeriodSeconds",
            f"shorter than the drain's and the shutdown's time-outs together ({needed} s)")


def _check_webhook(doc, bad):
    for i, w in enumerate(doc.get("webhooks") or []):
        at = f"webhooks[{i}]"
        selector = (w.get("objectSelector") or {}).get("matchLabels") or {}
        if selector.get("hiber.io/inject") != "true":
            bad(f"{at}.objectSelector", "must select pods labelled hiber.io/inject: \"true\"")
        if w.get("sideEffects") != "None":
            bad(f"{at}.sideEffects", "must be None")
        if w.get("admissionReviewVersions") != ["v1"]:
            bad(f"{at}.admissionReviewVersions", "hiber-inject speaks AdmissionReview v1 only")
        if w.get("failurePolicy") not in ("Fail", "Ignore"):
            bad(f"{at}.failurePolicy", "must be set (Fail or Ignore)")
        if not 1 <= (w.get("timeoutSeconds") or 0) <= 10:
            bad(f"{at}.timeoutSeconds", "must be set, at most 10 s (pod creation waits on it)")
        service = (w.get("clientConfig") or {}).get("service") or {}
        if service.get("path") != "/mutate" or service.get("port") != 8443:
            bad(f"{at}.clientConfig.service", "hiber-inject serves /mutate on port 8443")


def _find(docs, kind, name):
    for n, d in enumerate(docs):
        if isinstance(d, dict) and d.get("kind") == kind and \
                (d.get("metadata") or {}).get("name") == name:
            return n, d
    return None, None


def _check_webhook_matches_node(docs, problems):
    """hiber-inject must point function pods at the host folders and Secrets hiberd uses, and at
    the router's attach port."""
    n, inject = _find(docs, "Deployment", "hiber-inject")
    _, hiberd = _find(docs, "DaemonSet", "hiberd")
    pods = _pod_specs(hiberd or {})
    inject_containers = [c for _, c in _containers(inject or {}) if c.get("name") == "hiber-inject"]
    if not pods or not inject_containers:
        return
    pod = pods[0]
    c = next((c for c in pod.get("containers") or [] if c.get("name") == "hiberd"), {})
    by_mount = {m.get("mountPath"): m.get("name") for m in c.get("volumeMounts") or []}
    volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, dict)}

    def volume(mount_path, source):
        return ((volumes.get(by_mount.get(mount_path)) or {}).get(source) or {})

    wanted = {
        "run_dir_host_path": volume(_flag(c.get("args"), "run_dir", "/run/hiber"), "hostPath")
        .get("path"),
        "shim_host_path": ((volumes.get("shim") or {}).get("hostPath") or {}).get("path"),
        "token_secret": volume(_flag(c.get("args"), "auth_token_file", ""), "secret")
        .get("secretName"),
    }
    _, router = _find(docs, "Service", "hiber-router")
    ports = [p.get("port") for p in ((router or {}).get("spec") or {}).get("ports") or []
             if isinstance(p, dict) and p.get("name") == "attach"]
    if ports:
        namespace = router["metadata"].get("namespace", "default")
        wanted["router_worker_address"] = f"tcp:hiber-router.{namespace}.svc:{ports[0]}"
    args = inject_containers[0].get("args")
    for flag, value in wanted.items():
        if value is not None and _flag(args, flag, None) != value:
            problems.append((n, "spec.template.spec.containers[hiber-inject].args",
                             f"--{flag} must be {value} (as hiberd's DaemonSet and the router's "
                             f"Service have it), got {_flag(args, flag, None)}"))


def hiber_rules(docs):
    """[(document index, field path, message)] for Hiber's own rules."""
    problems = []
    _check_webhook_matches_node(docs, problems)
    for n, doc in enumerate(docs):
        if not isinstance(doc, dict):
            continue

        def bad(field, message, n=n):
            problems.append((n, field, message))

        for pod in _pod_specs(doc):
            base = "spec" if doc.get("kind") == "Pod" else "spec.template.spec"
            labels = ((doc.get("metadata") if doc.get("kind") == "Pod" else
                       ((doc.get("spec") or {}).get("template") or {}).get("metadata")) or {}
                      ).get("labels") or {}
            for field, c in _containers(doc):
                at = f"{base}.{field}"
                if not isinstance(c.get("resources"), dict) or not c["resources"].get("requests"):
                    bad(f"{at}.resources.requests", "every container must request resources")
                name, _, _ = _split_image(str(c.get("image", "")))
                if name not in HIBER_IMAGES and not name.endswith(tuple("/" + i for i in HIBER_IMAGES)):
                    bad(f"{at}.image", f"{c.get('image')!r} is not one of Hiber's images "
                                       f"({', '.join(HIBER_IMAGES)})")
                if labels.get("hiber.io/inject") == "true":
                    for part in _gpu_requests(c):
                        bad(f"{at}.{part}.nvidia.com/gpu",
                            "a function pod must not request GPUs (only hiberd holds them)")
            if labels.get("hiber.io/inject") == "true" and not labels.get("hiber.io/function"):
                bad("metadata.labels" if base == "spec" else "spec.template.metadata.labels",
                    "a pod labelled hiber.io/inject needs hiber.io/function")
            if doc.get("kind") == "DaemonSet" and doc.get("metadata", {}).get("name") == "hiberd":
                _check_hiberd(doc, pod, bad)
        if doc.get("kind") == "MutatingWebhookConfiguration":
            _check_webhook(doc, bad)
    return problems


# ---------------------------------------------------------------------------------------------

def _name(doc):
    if not isinstance(doc, dict):
        return "(not a map)"
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def validate_docs(source, docs):
    """Every problem of docs, as 'source: Kind/name: field: message' lines."""
    lines = []
    for doc in docs:
        for field, message in check_schema(doc):
            lines.append(f"{source}: {_name(doc)}: {field}: {message}")
    for n, field, message in hiber_rules(docs):
        lines.append(f"{source}: {_name(docs[n])}: {field}: {message}")
    return lines


def validate_target(target, kubectl):
    """(problems, whether kubectl's rendering was compared) of one folder or file."""
    try:
        if os.path.isdir(target):
            docs = render(target)
            compared = False
            if kubectl:
                problems = compare_renderings(docs, render_with_kubectl(kubectl, target))
                if problems:
                    return [f"{target}: {p}" for p in problems], True
                compared = True
            return validate_docs(target, docs), compared
        return validate_docs(target, _load_yaml(target)), False
    except Invalid as e:
        return [str(e)], False


def find_kubectl(choice):
    if choice == "never":
        return None
    if choice != "auto":
        return choice
    kubectl = shutil.which("kubectl")
    if kubectl and subprocess.run([kubectl, "kustomize", "--help"],
                                  capture_output=True).returncode == 0:
        return kubectl
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*",
                        help="kustomization folders or YAML files (default: this folder's "
                             + ", ".join(DEFAULT_TARGETS) + ")")
    parser.add_argument("--kubectl", default="auto",
                        help="kubectl to compare renderings with: auto (the one on PATH, if "
                             "any), never, or a path")
    args = parser.parse_args()
    targets = args.targets or [os.path.join(HERE, t) for t in DEFAULT_TARGETS]
    kubectl = find_kubectl(args.kubectl)
    failed = False
    for target in targets:
        problems, compared = validate_target(target, kubectl)
        for p in problems:
            print(p)
        failed = failed or bool(problems)
        if not problems:
            print(f"{target}: valid" + (" (kubectl kustomize renders the same)" if compared else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

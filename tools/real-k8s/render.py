#!/usr/bin/python3
"""Renders a kustomization of deploy/ the way `kubectl kustomize` (kustomize v5) does, for the fields deploy/ uses.

Kubernetes v1.20's kubectl embeds kustomize v2.0.3, which refuses deploy/base (per-generator `options`, `labels`,
directories in `resources`), and Debian has no newer kubectl or kustomize. So the real-k8s harness renders
deploy/base itself. Any kustomization field or option this renderer does not implement is an error that names it:
nothing is silently dropped. tests/deploy (deploy.real-k8s-render) compares the output with `kubectl kustomize`
where a recent kubectl is installed.

    render.py DIR                     the rendered objects as a YAML stream (like `kubectl kustomize DIR`)
    render.py --compare KUBECTL DIR   exit 0 if KUBECTL renders DIR to the same objects, 1 (with the differences)
                                      if not, 77 if KUBECTL cannot render DIR at all (too old) or is missing
"""
import copy
import os
import subprocess
import sys

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "labels", "images", "generatorOptions", "configMapGenerator"}

# kustomize's legacy output order (api/resid/gvk.go: orderFirst, orderLast); other kinds sit in between.
ORDER_FIRST = ["Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
               "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap", "Secret",
               "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume", "PersistentVolumeClaim",
               "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget"]
ORDER_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


class RenderError(Exception):
    pass


def _only(where, mapping, allowed):
    extra = sorted(set(mapping) - set(allowed))
    if extra:
        raise RenderError("%s: %s: not supported by tools/real-k8s/render.py, which implements only what deploy/ "
                          "uses (teach it the field)" % (where, ", ".join(extra)))


def _kustomization(d):
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        path = os.path.join(d, name)
        if os.path.exists(path):
            with open(path) as f:
                return path, yaml.safe_load(f) or {}
    raise RenderError("%s has no kustomization.yaml" % d)


def _add_labels(obj, labels):
    if labels:
        obj.setdefault("metadata", {}).setdefault("labels", {}).update(labels)


def _config_map(d, path, gen, options):
    where = "%s: configMapGenerator %s" % (path, gen.get("name"))
    _only(where, gen, {"name", "namespace", "options", "files"})
    opts = dict(options)
    own = gen.get("options") or {}
    _only(where + " options", own, {"labels", "disableNameSuffixHash"})
    labels = dict(opts.get("labels") or {})
    labels.update(own.get("labels") or {})
    if not own.get("disableNameSuffixHash", opts.get("disableNameSuffixHash", False)):
        raise RenderError("%s: name suffix hashes are not supported (set disableNameSuffixHash)" % where)
    data = {}
    for entry in gen.get("files") or []:
        key, _, rel = entry.partition("=") if "=" in entry else (os.path.basename(entry), "", entry)
        with open(os.path.join(d, rel)) as f:
            data[key] = f.read()
    meta = {"name": gen["name"]}
    if gen.get("namespace"):
        meta["namespace"] = gen["namespace"]
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _set_images(obj, images):
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") if obj.get("kind") != "Pod" else spec
    if obj.get("kind") == "CronJob":
        pod = spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
    if not pod:
        return
    for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
        image = c.get("image", "")
        name = image.split("@", 1)[0]
        if ":" in name.rsplit("/", 1)[-1]:
            name = name.rsplit(":", 1)[0]
        for img in images:
            if img["name"] == name:
                new = img.get("newName", name)
                if "digest" in img:
                    c["image"] = "%s@%s" % (new, img["digest"])
                elif "newTag" in img:
                    c["image"] = "%s:%s" % (new, img["newTag"])
                else:
                    c["image"] = new + image[len(name):]


def render_dir(d):
    path, k = _kustomization(d)
    _only(path, k, SUPPORTED)
    objects = []
    for r in k.get("resources") or []:
        full = os.path.normpath(os.path.join(d, r))
        if os.path.isdir(full):
            objects += render_dir(full)
        else:
            with open(full) as f:
                objects += [o for o in yaml.safe_load_all(f) if o]
    options = k.get("generatorOptions") or {}
    _only(path + ": generatorOptions", options, {"disableNameSuffixHash", "labels"})
    for gen in k.get("configMapGenerator") or []:
        objects.append(_config_map(d, path, gen, options))
    for img in k.get("images") or []:
        _only(path + ": images", img, {"name", "newName", "newTag", "digest"})
    images = k.get("images") or []
    for entry in k.get("labels") or []:
        _only(path + ": labels", entry, {"pairs", "includeSelectors", "includeTemplates"})
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise RenderError("%s: labels with includeSelectors/includeTemplates are not supported" % path)
    for o in objects:
        _set_images(o, images)
        for entry in k.get("labels") or []:
            _add_labels(o, entry.get("pairs") or {})
    return objects


def _order(o):
    kind = o.get("kind", "")
    if kind in ORDER_FIRST:
        rank = ORDER_FIRST.index(kind)
    elif kind in ORDER_LAST:
        rank = len(ORDER_FIRST) + 1 + ORDER_LAST.index(kind)
    else:
        rank = len(ORDER_FIRST)
    meta = o.get("metadata", {})
    return (rank, o.get("apiVersion", ""), kind, meta.get("namespace", ""), meta.get("name", ""))


def render(d):
    """The objects of kustomization directory d, in kustomize's legacy order."""
    return sorted(render_dir(d), key=_order)


def _key(o):
    m = o.get("metadata", {})
    return (o.get("kind"), m.get("namespace", ""), m.get("name"))


def compare(kubectl, d):
    try:
        p = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True, timeout=120)
    except OSError as e:
        print("SKIP: %s: %s" % (kubectl, e))
        return 77
    if p.returncode != 0:
        print("SKIP: %s kustomize %s failed (an old kustomize?): %s" % (kubectl, d, p.stderr.strip()[:300]))
        return 77
    want = {_key(o): o for o in yaml.safe_load_all(p.stdout) if o}
    got = {_key(o): o for o in render(d)}
    problems = []
    for k in sorted(set(want) | set(got), key=str):
        if k not in got:
            problems.append("missing %s/%s/%s" % k)
        elif k not in want:
            problems.append("extra %s/%s/%s" % k)
        elif want[k] != got[k]:
            problems.append("%s/%s/%s differs:\n  kubectl: %s\n  render:  %s" % (k + (
                yaml.safe_dump(want[k], sort_keys=True)[:1500], yaml.safe_dump(got[k], sort_keys=True)[:1500])))
    order_want = [_key(o) for o in yaml.safe_load_all(p.stdout) if o]
    order_got = [_key(o) for o in render(d)]
    if not problems and order_want != order_got:
        problems.append("order differs:\n  kubectl: %s\n  render:  %s" % (order_want, order_got))
    for line in problems:
        print(line)
    print("%s: %d objects, %s" % (d, len(want), "same as kubectl kustomize" if not problems else
                                  "%d differences" % len(problems)))
    return 1 if problems else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "--compare":
        return compare(argv[2], argv[3])
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        objects = render(argv[1])
    except (RenderError, OSError, yaml.YAMLError) as e:
        print("render.py: %s" % e, file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(copy.deepcopy(objects), sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

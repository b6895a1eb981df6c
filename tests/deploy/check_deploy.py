#!/usr/bin/env python3
"""Checks of dynmig's Kubernetes deployment (deploy/), one group per CTest test.

    check_deploy.py GROUP      GROUP: render lint objects scheduler-config device-config rbac certgen
                                      dockerfile shellcheck

Environment: DYNMIG_SOURCE_DIR (repository root; default: two levels up), DYNMIG_BINARY (build/bin/dynmig),
KUBECTL (default: kubectl on PATH, then /usr/bin/kubectl). Exit 0: passed, 1: failed (every failure is
listed), 77: skipped because a tool is missing (the message says which; CTest shows the test as skipped).
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # python3-yaml comes with yamllint, which tools/install-deps.sh installs.
    print("SKIP: python3-yaml is not installed (apt-get install python3-yaml)")
    sys.exit(77)

SKIP = 77
SRC = os.environ.get("DYNMIG_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(SRC, "deploy")
BINARY = os.environ.get("DYNMIG_BINARY") or os.path.join(SRC, "build", "bin", "dynmig")
NS = "dynmig-system"
KUSTOMIZATIONS = ["base", "scheduler", "overlays/cert-manager", "overlays/monitoring"]


class Skip(Exception):
    pass


class Checker:
    def __init__(self):
        self.failures = []
        self.checks = 0

    def check(self, cond, what):
        self.checks += 1
        if not cond:
            self.failures.append(what)
        return cond

    def equal(self, got, want, what):
        return self.check(got == want, f"{what}: got {got!r}, want {want!r}")


# --- helpers ----------------------------------------------------------------------------------------------------

def kubectl():
    path = os.environ.get("KUBECTL") or shutil.which("kubectl") or (
        "/usr/bin/kubectl" if os.path.exists("/usr/bin/kubectl") else None)
    if not path:
        raise Skip("kubectl is not installed: cannot render the kustomizations (apt-get install kubectl)")
    return path


_rendered = {}


def render(kdir):
    """The objects `kubectl kustomize deploy/<kdir>` renders."""
    if kdir not in _rendered:
        proc = subprocess.run([kubectl(), "kustomize", os.path.join(DEPLOY, kdir)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"kubectl kustomize deploy/{kdir} failed: {proc.stderr.strip()}")
        _rendered[kdir] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return _rendered[kdir]


def index(objs):
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objs}


def get(objs, kind, name, ns=NS):
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name and o["metadata"].get("namespace", "") == ns:
            return o
    raise AssertionError(f"no {kind} {ns + '/' if ns else ''}{name} in the rendered objects")


def container(pod_spec, name):
    for c in pod_spec.get("containers", []):
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name}")


def flag(args, name):
    """The value after `name` in an argument list (None when absent)."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def mounts_by_path(pod_spec, cont):
    """mountPath -> (volume, readOnly) for one container."""
    vols = {v["name"]: v for v in pod_spec.get("volumes", [])}
    return {m["mountPath"]: (vols[m["name"]], m.get("readOnly", False)) for m in cont.get("volumeMounts", [])}


def secret_file(pod_spec, cont, path):
    """(secretName, key) providing file `path` in container `cont`, or None."""
    for mount_path, (vol, _) in mounts_by_path(pod_spec, cont).items():
        if not path.startswith(mount_path.rstrip("/") + "/") or "secret" not in vol:
            continue
        rel = path[len(mount_path.rstrip("/")) + 1:]
        items = vol["secret"].get("items")
        if items is None:
            return vol["secret"]["secretName"], rel
        for it in items:
            if it["path"] == rel:
                return vol["secret"]["secretName"], it["key"]
    return None


def configmap_file(objs, pod_spec, cont, path):
    """The text of file `path` in container `cont` when it comes from a rendered ConfigMap, else None."""
    for mount_path, (vol, _) in mounts_by_path(pod_spec, cont).items():
        if "configMap" in vol and path.startswith(mount_path.rstrip("/") + "/"):
            cm = get(objs, "ConfigMap", vol["configMap"]["name"])
            return cm.get("data", {}).get(path[len(mount_path.rstrip("/")) + 1:])
    return None


def certgen_dns_names():
    """The DNS names the certificate Job puts in the serving certificate (from the Job's SERVICES)."""
    job = get(render("base"), "Job", "dynmig-certgen")
    env = {e["name"]: e.get("value") for e in container(job["spec"]["template"]["spec"], "certgen")["env"]}
    names = []
    for svc in env["SERVICES"].split():
        names += [svc, f"{svc}.{NS}", f"{svc}.{NS}.svc", f"{svc}.{NS}.svc.cluster.local"]
    return names


def kube_scheduler_config():
    objs = render("base")
    cm = get(objs, "ConfigMap", "dynmig-kube-scheduler-config")
    return yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"])


# --- groups -----------------------------------------------------------------------------------------------------

def group_render(c):
    """Every kustomization renders with the real kubectl."""
    found = sorted(os.path.relpath(root, DEPLOY) for root, _, files in os.walk(DEPLOY)
                   if "kustomization.yaml" in files)
    c.equal(found, sorted(KUSTOMIZATIONS), "kustomization directories under deploy/")
    for kdir in found:
        try:
            objs = render(kdir)
            c.check(len(objs) > 0, f"deploy/{kdir} renders no object")
            print(f"  deploy/{kdir}: {len(objs)} objects")
        except AssertionError as e:
            c.check(False, str(e))


def group_lint(c):
    """yamllint with deploy/.yamllint over every YAML file under deploy/."""
    tool = shutil.which("yamllint")
    if not tool:
        raise Skip("yamllint is not installed (apt-get install yamllint)")
    proc = subprocess.run([tool, "-f", "parsable", "-c", os.path.join(DEPLOY, ".yamllint"), DEPLOY],
                          capture_output=True, text=True)
    c.check(proc.returncode == 0 and not proc.stdout.strip(),
            f"yamllint reports problems:\n{proc.stdout}{proc.stderr}")


EXPECTED_BASE = {
    ("Namespace", "", "dynmig-system"),
    ("ConfigMap", NS, "dynmig-device-config"),
    ("ConfigMap", NS, "dynmig-kube-scheduler-config"),
    ("ConfigMap", NS, "dynmig-certgen-script"),
    ("ServiceAccount", NS, "dynmig-scheduler"),
    ("ServiceAccount", NS, "dynmig-device-plugin"),
    ("ServiceAccount", NS, "dynmig-certgen"),
    ("ClusterRole", "", "dynmig-scheduler"),
    ("ClusterRole", "", "dynmig-device-plugin"),
    ("ClusterRole", "", "dynmig-certgen"),
    ("ClusterRoleBinding", "", "dynmig-scheduler"),
    ("ClusterRoleBinding", "", "dynmig-scheduler-as-kube-scheduler"),
    ("ClusterRoleBinding", "", "dynmig-scheduler-as-volume-scheduler"),
    ("ClusterRoleBinding", "", "dynmig-device-plugin"),
    ("ClusterRoleBinding", "", "dynmig-certgen"),
    ("Role", NS, "dynmig-scheduler-leases"),
    ("Role", NS, "dynmig-certgen"),
    ("RoleBinding", NS, "dynmig-scheduler-leases"),
    ("RoleBinding", NS, "dynmig-certgen"),
    ("RoleBinding", "kube-system", "dynmig-scheduler-extension-apiserver-authentication-reader"),
    ("Deployment", NS, "dynmig-scheduler"),
    ("Service", NS, "dynmig-scheduler"),
    ("Service", NS, "dynmig-webhook"),
    ("PodDisruptionBudget", NS, "dynmig-scheduler"),
    ("DaemonSet", NS, "dynmig-device-plugin"),
    ("MutatingWebhookConfiguration", "", "dynmig-webhook"),
    ("ValidatingWebhookConfiguration", "", "dynmig-webhook"),
    ("Job", NS, "dynmig-certgen"),
}
CERTGEN_OBJECTS = {
    ("ConfigMap", NS, "dynmig-certgen-script"),
    ("ServiceAccount", NS, "dynmig-certgen"),
    ("ClusterRole", "", "dynmig-certgen"),
    ("ClusterRoleBinding", "", "dynmig-certgen"),
    ("Role", NS, "dynmig-certgen"),
    ("RoleBinding", NS, "dynmig-certgen"),
    ("Job", NS, "dynmig-certgen"),
}
CERT_MANAGER_OBJECTS = {
    ("Issuer", NS, "dynmig-selfsigned"),
    ("Certificate", NS, "dynmig-ca"),
    ("Issuer", NS, "dynmig-ca"),
    ("Certificate", NS, "dynmig-tls"),
    ("Certificate", NS, "dynmig-extender-client"),
}
MONITORING_OBJECTS = {
    ("Service", NS, "dynmig-scheduler-metrics"),
    ("Service", NS, "dynmig-device-plugin-metrics"),
    ("ServiceMonitor", NS, "dynmig-scheduler"),
    ("ServiceMonitor", NS, "dynmig-device-plugin"),
    ("PrometheusRule", NS, "dynmig"),
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                  "ValidatingWebhookConfiguration"}


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check_service_targets(c, objs, svc_name, pods_labels_by_workload):
    """The Service selects the pods of some workload and its targetPorts name ports of that pod."""
    svc = get(objs, "Service", svc_name)
    sel = svc["spec"]["selector"]
    hits = [(w, spec) for w, (labels, spec) in pods_labels_by_workload.items()
            if selects({k: v for k, v in sel.items() if k != "dynmig.io/role"}, labels)]
    if not c.check(len(hits) == 1, f"Service {svc_name} selects {len(hits)} workloads, want 1"):
        return None
    _, spec = hits[0]
    ports = {p["name"] for cont in spec["containers"] for p in cont.get("ports", [])}
    for p in svc["spec"]["ports"]:
        c.check(p["targetPort"] in ports, f"Service {svc_name} port {p['name']}: targetPort "
                f"{p['targetPort']!r} names no container port of the pods it selects ({sorted(ports)})")
    return svc


def group_objects(c):
    """Kinds, names, namespaces and the wiring between the objects of every rendering."""
    base = render("base")
    keys = set(index(base))
    c.equal(keys - EXPECTED_BASE, set(), "unexpected objects in deploy/base")
    c.equal(EXPECTED_BASE - keys, set(), "missing objects in deploy/base")
    for o in base:
        key = (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        if o["kind"] in CLUSTER_SCOPED:
            c.check(key[1] == "", f"{key}: cluster-scoped object with a namespace")
        elif key != ("RoleBinding", "kube-system",
                     "dynmig-scheduler-extension-apiserver-authentication-reader"):
            c.equal(key[1], NS, f"namespace of {o['kind']} {o['metadata']['name']}")
        c.equal(o["metadata"].get("labels", {}).get("app.kubernetes.io/name"), "dynmig",
                f"label app.kubernetes.io/name of {key}")

    # Scheduler Deployment.
    dep = get(base, "Deployment", "dynmig-scheduler")
    c.equal(dep["spec"]["replicas"], 2, "scheduler replicas")
    tmpl = dep["spec"]["template"]
    spec = tmpl["spec"]
    c.check("dynmig.io/role" not in tmpl["metadata"].get("labels", {}),
            "the scheduler pod template must not carry dynmig.io/role (only the leader sets it)")
    c.check("dynmig.io/role" not in dep["spec"]["selector"]["matchLabels"],
            "the Deployment selector must not use dynmig.io/role")
    c.check(selects(dep["spec"]["selector"]["matchLabels"], tmpl["metadata"]["labels"]),
            "the Deployment selector does not select its own template")
    aff = spec.get("affinity", {}).get("podAntiAffinity", {})
    terms = [t.get("podAffinityTerm", t) for t in
             aff.get("preferredDuringSchedulingIgnoredDuringExecution", []) +
             aff.get("requiredDuringSchedulingIgnoredDuringExecution", [])]
    c.check(any(t["topologyKey"] == "kubernetes.io/hostname" and
                selects(t["labelSelector"]["matchLabels"], tmpl["metadata"]["labels"]) for t in terms),
            "the scheduler replicas need pod anti-affinity on kubernetes.io/hostname")
    c.equal(spec["serviceAccountName"], "dynmig-scheduler", "scheduler serviceAccountName")
    dyn = container(spec, "dynmig")
    c.equal(dyn["image"].rsplit(":", 1)[0], "dynmig", "scheduler image (before the tag)")
    args = dyn["args"]
    c.equal(args[0], "scheduler", "scheduler subcommand")
    c.check("--in-cluster" in args, "scheduler needs --in-cluster")
    c.check("--leader-elect" in args, "scheduler needs --leader-elect")
    c.equal(flag(args, "--listen"), "0.0.0.0:8443", "scheduler --listen")
    c.equal(flag(args, "--lease-namespace"), NS, "scheduler --lease-namespace")
    c.equal(flag(args, "--lease-name"), "dynmig-scheduler", "scheduler --lease-name")
    c.equal(flag(args, "--device-config"), "/etc/dynmig/device-config.yaml", "scheduler --device-config")
    c.check(configmap_file(base, spec, dyn, flag(args, "--device-config")) is not None,
            "scheduler --device-config is not a file of a mounted ConfigMap")
    c.equal(secret_file(spec, dyn, flag(args, "--tls-cert") or ""), ("dynmig-tls", "tls.crt"),
            "scheduler --tls-cert source")
    c.equal(secret_file(spec, dyn, flag(args, "--tls-key") or ""), ("dynmig-tls", "tls.key"),
            "scheduler --tls-key source")
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in dyn.get("env", [])}
    c.equal(env.get("POD_NAME"), "metadata.name", "POD_NAME from the downward API")
    c.equal(env.get("POD_NAMESPACE"), "metadata.namespace", "POD_NAMESPACE from the downward API")
    c.equal({p["name"]: p["containerPort"] for p in dyn["ports"]}, {"https": 8443}, "scheduler ports")
    c.equal((dyn["livenessProbe"]["httpGet"]["path"], dyn["livenessProbe"]["httpGet"]["scheme"]),
            ("/healthz", "HTTPS"), "scheduler liveness probe")
    c.equal((dyn["readinessProbe"]["httpGet"]["path"], dyn["readinessProbe"]["httpGet"]["scheme"]),
            ("/readyz", "HTTPS"), "scheduler readiness probe")
    for cont in spec["containers"]:
        c.check("requests" in cont.get("resources", {}) and "memory" in cont["resources"].get("limits", {}),
                f"container {cont['name']}: resources need requests and a memory limit")
    ks = container(spec, "kube-scheduler")
    c.check(ks["image"].startswith("registry.k8s.io/kube-scheduler:v1.32."),
            f"kube-scheduler image {ks['image']} is not registry.k8s.io/kube-scheduler:v1.32.x")
    c.check(dep["spec"]["template"]["spec"]["securityContext"].get("runAsNonRoot") is True,
            "the scheduler pod runs as non-root")

    # Services.
    ds = get(base, "DaemonSet", "dynmig-device-plugin")
    workloads = {
        "scheduler": (tmpl["metadata"]["labels"], spec),
        "device-plugin": (ds["spec"]["template"]["metadata"]["labels"], ds["spec"]["template"]["spec"]),
    }
    ext = check_service_targets(c, base, "dynmig-scheduler", workloads)
    if ext:
        c.equal(ext["spec"]["selector"].get("dynmig.io/role"), "leader",
                "Service dynmig-scheduler must select only the leader")
        c.equal([(p["port"], p["targetPort"]) for p in ext["spec"]["ports"]], [(443, "https")],
                "Service dynmig-scheduler ports")
    wh = check_service_targets(c, base, "dynmig-webhook", workloads)
    if wh:
        c.check("dynmig.io/role" not in wh["spec"]["selector"],
                "Service dynmig-webhook must select every replica")
        c.equal([(p["port"], p["targetPort"]) for p in wh["spec"]["ports"]], [(443, "https")],
                "Service dynmig-webhook ports")

    # Device-plugin DaemonSet.
    dspec = ds["spec"]["template"]["spec"]
    c.equal(dspec.get("nodeSelector"), {"dynmig.io/mig": "enabled"}, "device-plugin nodeSelector")
    c.check(any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists"
                for t in dspec.get("tolerations", [])), "device plugin must tolerate nvidia.com/gpu taints")
    c.equal(dspec["serviceAccountName"], "dynmig-device-plugin", "device-plugin serviceAccountName")
    dp = container(dspec, "device-plugin")
    c.equal(dp["securityContext"].get("privileged"), True, "device plugin privileged")
    c.equal(dp["securityContext"].get("runAsUser"), 0, "device plugin runs as root")
    dargs = dp["args"]
    c.equal(dargs[0], "device-plugin", "device-plugin subcommand")
    c.check("--in-cluster" in dargs, "device plugin needs --in-cluster")
    c.equal(flag(dargs, "--node"), "$(NODE_NAME)", "device plugin --node")
    denv = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in dp["env"]}
    c.equal(denv.get("NODE_NAME"), "spec.nodeName", "NODE_NAME from the downward API")
    c.equal(flag(dargs, "--metrics-listen"), "0.0.0.0:9400", "device plugin --metrics-listen")
    c.equal(flag(dargs, "--pod-resources-socket"), "/var/lib/kubelet/pod-resources/kubelet.sock",
            "device plugin --pod-resources-socket (the mounted kubelet PodResources socket)")
    c.equal(flag(dargs, "--self-pod"), "$(POD_NAMESPACE)/$(POD_NAME)",
            "device plugin --self-pod (its own containers are never holders of a legacy instance)")
    c.equal(flag(dargs, "--cri-socket") or "/run/containerd/containerd.sock", "/run/containerd/containerd.sock",
            "device plugin --cri-socket (the mounted containerd socket)")
    c.equal(denv.get("POD_NAME"), "metadata.name", "POD_NAME from the downward API")
    c.equal(denv.get("POD_NAMESPACE"), "metadata.namespace", "POD_NAMESPACE from the downward API")
    c.equal(flag(dargs, "--nvml-listen"), "127.0.0.1:9401", "device plugin --nvml-listen (loopback: /nvml names pods)")
    c.check(configmap_file(base, dspec, dp, flag(dargs, "--device-config") or "") is not None,
            "device plugin --device-config is not a file of a mounted ConfigMap")
    c.equal({p["name"]: p["containerPort"] for p in dp["ports"]}, {"metrics": 9400}, "device plugin ports")
    host = {path: (vol.get("hostPath", {}).get("path"), ro)
            for path, (vol, ro) in mounts_by_path(dspec, dp).items() if "hostPath" in vol}
    c.equal(host, {
        "/var/lib/kubelet/device-plugins": ("/var/lib/kubelet/device-plugins", False),
        "/var/lib/kubelet/pod-resources": ("/var/lib/kubelet/pod-resources", True),
        "/dev": ("/dev", False),
        "/proc/driver/nvidia-caps": ("/proc/driver/nvidia-caps", True),
        "/var/run/cdi": ("/var/run/cdi", False),
        "/run/containerd": ("/run/containerd", True),
    }, "device plugin hostPath mounts (container path: (host path, readOnly))")
    c.equal(ds["spec"]["updateStrategy"], {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "device plugins are upgraded one node at a time")

    # Webhook configurations.
    names = {}
    for kind, ops, path in (("MutatingWebhookConfiguration", ["CREATE"], "/webhook"),
                            ("ValidatingWebhookConfiguration", ["CREATE", "UPDATE"], "/validate")):
        cfg = get(base, kind, "dynmig-webhook", ns="")
        c.equal(len(cfg["webhooks"]), 1, f"{kind} webhooks")
        for w in cfg["webhooks"]:
            names[kind] = w["name"]
            what = f"{kind} {w['name']}"
            c.equal(w["clientConfig"].get("service"),
                    {"name": "dynmig-webhook", "namespace": NS, "path": path, "port": 443},
                    f"{what} service")
            c.check("caBundle" not in w["clientConfig"], f"{what}: caBundle is set by certgen, not in the manifest")
            c.equal(w["admissionReviewVersions"], ["v1"], f"{what} admissionReviewVersions")
            c.equal(w["sideEffects"], "None", f"{what} sideEffects")
            c.equal(w["failurePolicy"], "Fail", f"{what} failurePolicy")
            rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ops,
                      "resources": ["pods"], "scope": "Namespaced"}]
            if kind == "ValidatingWebhookConfiguration":
                # Only the extender binds pods that request dynmig's resources.
                rules.append({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods/binding", "bindings"], "scope": "Namespaced"})
            c.equal(w["rules"], rules, f"{what} rules")
            c.equal(w["namespaceSelector"], {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": ["dynmig-system", "kube-system"]}]}, f"{what} namespaceSelector")
            c.check(1 <= w.get("timeoutSeconds", 10) <= 30, f"{what} timeoutSeconds out of 1..30")
            conds = w.get("matchConditions", [])
            c.check(len(conds) >= 1, f"{what}: failing closed needs matchConditions that limit it to dynmig's pods")
            for cond in conds:
                expr = cond["expression"]
                c.check(expr.count("(") == expr.count(")"), f"{what} {cond['name']}: unbalanced parentheses")
        if kind == "ValidatingWebhookConfiguration":
            text = json.dumps(cfg)
            for sa in ("dynmig-scheduler", "dynmig-device-plugin"):
                c.check(f"system:serviceaccount:{NS}:{sa}" in text,
                        f"the validating webhook must leave {sa}'s own writes alone")
            c.check("hami.io/" in text, "the validating webhook must match hami.io/ annotations")
            c.check("request.subResource == 'binding'" in text,
                    "the validating webhook must match every binding (its pod decides)")
            c.check("c.resources.limits.exists(r, r.startsWith('nvidia.com/'))" in text,
                    "the validating webhook must match pods that request nvidia.com/ resources")

    # Certificate Job: the webhooks it patches exist; the Secret it writes is the one the pods mount.
    job = get(base, "Job", "dynmig-certgen")
    jspec = job["spec"]["template"]["spec"]
    c.equal(jspec["serviceAccountName"], "dynmig-certgen", "certgen serviceAccountName")
    cg = container(jspec, "certgen")
    c.equal(cg["image"].rsplit(":", 1)[0], "dynmig", "certgen image (the dynmig image)")
    jenv = {e["name"]: e.get("value") for e in cg["env"]}
    c.equal(jenv.get("MUTATING_WEBHOOKS"), f"dynmig-webhook/{names.get('MutatingWebhookConfiguration')}",
            "certgen MUTATING_WEBHOOKS")
    c.equal(jenv.get("VALIDATING_WEBHOOKS"), f"dynmig-webhook/{names.get('ValidatingWebhookConfiguration')}",
            "certgen VALIDATING_WEBHOOKS")
    c.equal(jenv.get("SECRET_NAME"), "dynmig-tls", "certgen SECRET_NAME")
    c.equal(sorted(jenv.get("SERVICES", "").split()), ["dynmig-scheduler", "dynmig-webhook"],
            "certgen SERVICES (the certificate names both Services)")
    script = configmap_file(base, jspec, cg, cg["command"][-1])
    with open(os.path.join(DEPLOY, "base", "certgen", "certgen.sh")) as f:
        c.equal(script, f.read(), "the certgen ConfigMap carries deploy/base/certgen/certgen.sh")
    c.equal(secret_file(jspec, cg, jenv["EXISTING_DIR"] + "/ca.key"), ("dynmig-tls", "ca.key"),
            "certgen reads the existing Secret from EXISTING_DIR")
    existing = [v for v in jspec["volumes"] if v.get("secret", {}).get("secretName") == "dynmig-tls"]
    c.check(existing and existing[0]["secret"].get("optional") is True,
            "the existing-Secret volume must be optional (first run)")
    # No pod but the Job mounts the CA key.
    for wl_spec in (spec, dspec):
        for v in wl_spec.get("volumes", []):
            if v.get("secret", {}).get("secretName") == "dynmig-tls":
                keys = [it["key"] for it in v["secret"].get("items", [])]
                c.check(keys and "ca.key" not in keys, f"volume {v['name']} must list its keys, without ca.key")

    # cert-manager overlay: the Job and its RBAC are gone, cert-manager objects and injection are there.
    cm = render("overlays/cert-manager")
    cm_keys = set(index(cm))
    c.equal(cm_keys, (EXPECTED_BASE - CERTGEN_OBJECTS) | CERT_MANAGER_OBJECTS, "objects of overlays/cert-manager")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cfg = get(cm, kind, "dynmig-webhook", ns="")
        c.equal(cfg["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from"), f"{NS}/dynmig-tls",
                f"{kind} inject-ca-from")
    cert = get(cm, "Certificate", "dynmig-tls")
    c.equal(cert["spec"]["secretName"], "dynmig-tls", "Certificate secretName")
    c.equal(sorted(cert["spec"]["dnsNames"]), sorted(certgen_dns_names()),
            "Certificate dnsNames (same names as certgen's)")
    c.equal(cert["spec"]["issuerRef"]["name"], "dynmig-ca", "Certificate issuer")
    ca_issuer = get(cm, "Issuer", "dynmig-ca")
    c.equal(ca_issuer["spec"]["ca"]["secretName"], get(cm, "Certificate", "dynmig-ca")["spec"]["secretName"],
            "the CA Issuer uses the CA Certificate's Secret")
    c.equal(get(cm, "Certificate", "dynmig-ca")["spec"].get("isCA"), True, "the CA Certificate isCA")

    # monitoring overlay: headless Services and ServiceMonitors that select them by port name.
    mon = render("overlays/monitoring")
    c.equal(set(index(mon)), EXPECTED_BASE | MONITORING_OBJECTS, "objects of overlays/monitoring")
    for sm_name, svc_name in (("dynmig-scheduler", "dynmig-scheduler-metrics"),
                              ("dynmig-device-plugin", "dynmig-device-plugin-metrics")):
        sm = get(mon, "ServiceMonitor", sm_name)
        c.equal(sm["apiVersion"], "monitoring.coreos.com/v1", f"ServiceMonitor {sm_name} apiVersion")
        svc = check_service_targets(c, mon, svc_name, workloads)
        if not svc:
            continue
        c.equal(svc["spec"].get("clusterIP"), "None", f"Service {svc_name} is headless")
        c.check(selects(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]),
                f"ServiceMonitor {sm_name} does not select Service {svc_name}")
        others = [s["metadata"]["name"] for s in mon if s["kind"] == "Service" and s["metadata"]["name"] != svc_name
                  and selects(sm["spec"]["selector"]["matchLabels"], s["metadata"].get("labels", {}))]
        c.equal(others, [], f"ServiceMonitor {sm_name} selects other Services too")
        svc_ports = {p["name"] for p in svc["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            c.check(ep["port"] in svc_ports, f"ServiceMonitor {sm_name} port {ep['port']} not in {svc_name}")
            server = ep.get("tlsConfig", {}).get("serverName")
            if server:
                c.check(server in certgen_dns_names(), f"ServiceMonitor {sm_name} serverName {server} not in the "
                        "certificate")
    # Pod identity on /metrics only with the monitoring overlay, whose ServiceMonitor keeps the series' own pod labels.
    def plugin_args(objs):
        ds = get(objs, "DaemonSet", "dynmig-device-plugin")
        return container(ds["spec"]["template"]["spec"], "device-plugin")["args"]
    c.check("--metrics-pod-identity" in plugin_args(mon), "overlays/monitoring starts the device plugin with "
            "--metrics-pod-identity")
    c.check("--metrics-pod-identity" not in plugin_args(render("base")), "deploy/base names no pod on /metrics")
    c.equal([ep.get("honorLabels") for ep in get(mon, "ServiceMonitor", "dynmig-device-plugin")["spec"]["endpoints"]],
            [True], "the device plugin's ServiceMonitor honors the series' own namespace/pod/container labels")
    rule = get(mon, "PrometheusRule", "dynmig")
    c.check(any("alert" in r for g in rule["spec"]["groups"] for r in g["rules"]), "the PrometheusRule has alerts")


def group_scheduler_config(c):
    """The KubeSchedulerConfiguration (deploy/scheduler/kube-scheduler-config.yaml) and how the pod wires it."""
    base = render("base")
    cfg = kube_scheduler_config()
    c.equal(cfg.get("apiVersion"), "kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration apiVersion")
    c.equal(cfg.get("kind"), "KubeSchedulerConfiguration", "kind")
    exts = cfg.get("extenders") or []
    if not c.equal(len(exts), 1, "number of extenders"):
        return
    ext = exts[0]
    c.check(bool(ext.get("filterVerb")), "the extender needs filterVerb")
    c.check(bool(ext.get("bindVerb")), "the extender needs bindVerb")
    c.check(not ext.get("prioritizeVerb"), "the extender filters to one node; no prioritizeVerb")
    c.equal(ext.get("nodeCacheCapable"), True, "nodeCacheCapable")
    c.check(not ext.get("ignorable", False), "the extender must not be ignorable (it binds)")
    managed = ext.get("managedResources") or []
    names = [m["name"] for m in managed]
    for r in ("nvidia.com/gpu", "nvidia.com/gpumem"):
        c.check(r in names, f"managedResources lacks {r}")
    for m in managed:
        c.equal(m.get("ignoredByScheduler"), True, f"managedResources {m['name']} ignoredByScheduler")
    # urlPrefix -> the leader Service over HTTPS, verified with the dynmig CA.
    url = ext.get("urlPrefix", "")
    c.check(url.startswith("https://"), f"urlPrefix {url} must be https")
    c.equal(ext.get("enableHTTPS"), True, "enableHTTPS")
    hostport = url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.partition(":")
    svc = get(base, "Service", "dynmig-scheduler")
    c.check(host in (f"dynmig-scheduler.{NS}.svc", f"dynmig-scheduler.{NS}.svc.cluster.local"),
            f"urlPrefix host {host} is not the leader Service dynmig-scheduler.{NS}.svc")
    c.check(int(port or 443) in [p["port"] for p in svc["spec"]["ports"]], f"urlPrefix port {port} not served")
    tls = ext.get("tlsConfig") or {}
    c.check(not tls.get("insecure"), "the extender's certificate must be verified (tlsConfig.insecure)")
    dep = get(base, "Deployment", "dynmig-scheduler")
    spec = dep["spec"]["template"]["spec"]
    ks = container(spec, "kube-scheduler")
    c.equal(secret_file(spec, ks, tls.get("caFile", "")), ("dynmig-tls", "ca.crt"),
            "tlsConfig.caFile is dynmig-tls ca.crt mounted in the kube-scheduler container")
    c.check(tls.get("serverName", host) in certgen_dns_names(), f"serverName {tls.get('serverName')} not in the "
            "certificate")
    # Client authentication: kube-scheduler presents a client certificate that dynmig's --extender-client-ca trusts
    # (certgen: client.crt/client.key of dynmig-tls; cert-manager: the Certificate dynmig-extender-client, issued by
    # the CA Issuer whose CA is dynmig-tls ca.crt). Neither container mounts the other's private key.
    dyn = container(spec, "dynmig")
    client_ca = flag(dyn["args"], "--extender-client-ca")
    c.check(client_ca is not None, "scheduler needs --extender-client-ca (client authentication of /filter, /bind)")
    c.equal(secret_file(spec, dyn, client_ca or ""), ("dynmig-tls", "ca.crt"),
            "scheduler --extender-client-ca is dynmig-tls ca.crt")
    for overlay, want_cert, want_key in (
            ("base", ("dynmig-tls", "client.crt"), ("dynmig-tls", "client.key")),
            ("overlays/cert-manager", ("dynmig-extender-client", "tls.crt"), ("dynmig-extender-client", "tls.key"))):
        objs = render(overlay)
        ospec = get(objs, "Deployment", "dynmig-scheduler")["spec"]["template"]["spec"]
        oks, odyn = container(ospec, "kube-scheduler"), container(ospec, "dynmig")
        c.equal(secret_file(ospec, oks, tls.get("certFile", "")), want_cert,
                f"{overlay}: tlsConfig.certFile is kube-scheduler's client certificate, mounted in its container")
        c.equal(secret_file(ospec, oks, tls.get("keyFile", "")), want_key,
                f"{overlay}: tlsConfig.keyFile is the client certificate's key, mounted in its container")
        for cont, secret_keys in ((odyn, {want_key}), (oks, {("dynmig-tls", "tls.key"), ("dynmig-tls", "ca.key")})):
            for mount_path, (vol, _) in mounts_by_path(ospec, cont).items():
                sec = vol.get("secret")
                if not sec:
                    continue
                for it in sec.get("items", []):
                    c.check((sec["secretName"], it["key"]) not in secret_keys,
                            f"{overlay}: container {cont['name']} must not mount {sec['secretName']} {it['key']}")
        if overlay != "base":
            client = get(objs, "Certificate", "dynmig-extender-client")
            c.equal(client["spec"]["issuerRef"]["name"], get(objs, "Certificate", "dynmig-tls")["spec"]["issuerRef"]
                    ["name"], "the client certificate comes from the CA Issuer whose CA dynmig-tls ca.crt carries")
            c.equal(sorted(client["spec"]["usages"]), ["client auth", "digital signature"],
                    "the client certificate is for client authentication only")
            c.equal(client["spec"]["secretName"], "dynmig-extender-client", "client Certificate secretName")
    # The --config path is this ConfigMap's file.
    conf_path = next((a.split("=", 1)[1] for a in ks["command"] + ks.get("args", []) if a.startswith("--config=")),
                     None)
    text = configmap_file(base, spec, ks, conf_path or "")
    c.check(text is not None and yaml.safe_load(text) == cfg,
            f"kube-scheduler --config={conf_path} is not kube-scheduler-config.yaml from its ConfigMap")
    # Own leader election, on a Lease the Role allows.
    le = cfg.get("leaderElection") or {}
    c.equal(le.get("leaderElect"), True, "kube-scheduler leaderElect")
    c.equal(le.get("resourceNamespace"), NS, "kube-scheduler lease namespace")
    c.check(le.get("resourceName") not in (None, "kube-scheduler", "dynmig-scheduler"),
            f"kube-scheduler lease name {le.get('resourceName')} must be its own (not the default "
            "scheduler's, not dynmig's)")
    role = get(base, "Role", "dynmig-scheduler-leases")
    allowed = {n for r in role["rules"] if "update" in r["verbs"] for n in r.get("resourceNames", [])}
    c.check(le.get("resourceName") in allowed, f"kube-scheduler lease {le.get('resourceName')} not in the "
            f"Role's resourceNames {sorted(allowed)}")
    profiles = cfg.get("profiles") or []
    c.check(len(profiles) >= 1 and all(p.get("schedulerName") not in (None, "", "default-scheduler")
                                       for p in profiles), "profiles need their own schedulerName")


def group_device_config(c):
    """deploy/base/device-config.yaml equals `dynmig config default`, and the ConfigMap carries it."""
    if not os.access(BINARY, os.X_OK):
        raise AssertionError(f"{BINARY} is not built (make build)")
    proc = subprocess.run([BINARY, "config", "default"], capture_output=True, text=True, timeout=60)
    c.equal(proc.returncode, 0, f"dynmig config default exit code ({proc.stderr.strip()})")
    path = os.path.join(DEPLOY, "base", "device-config.yaml")
    with open(path) as f:
        shipped = f.read()
    c.check(shipped == proc.stdout, "deploy/base/device-config.yaml differs from `dynmig config default`: "
            "regenerate it with `build/bin/dynmig config default > deploy/base/device-config.yaml`")
    proc = subprocess.run([BINARY, "config", "validate", "--in", path], capture_output=True, text=True, timeout=60)
    c.equal(proc.returncode, 0, f"dynmig config validate --in {path} ({proc.stdout.strip()} {proc.stderr.strip()})")
    cm = get(render("base"), "ConfigMap", "dynmig-device-config")
    c.equal(list(cm["data"]), ["device-config.yaml"], "dynmig-device-config keys")
    c.check(cm["data"]["device-config.yaml"] == shipped, "the ConfigMap does not carry device-config.yaml verbatim")


def effective_grants(objs):
    """{(sa_ns, sa_name): (grants, builtins)} from every binding in the rendered objects."""
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    out = {}
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        scope = "cluster" if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        ref = b["roleRef"]
        role_key = (ref["kind"], "" if ref["kind"] == "ClusterRole" else b["metadata"]["namespace"], ref["name"])
        for s in b.get("subjects", []):
            if s["kind"] != "ServiceAccount":
                continue
            grants, builtins = out.setdefault((s["namespace"], s["name"]), ({}, set()))
            role = roles.get(role_key)
            if role is None:
                builtins.add((ref["kind"], ref["name"], scope))
                continue
            for r in role.get("rules", []):
                for g in r.get("apiGroups", []):
                    for res in r.get("resources", []):
                        key = (scope, g, res, tuple(sorted(r.get("resourceNames", []))))
                        grants.setdefault(key, set()).update(r["verbs"])
    return out


def expected_grants():
    with open(os.path.join(DEPLOY, "rbac-expected.yaml")) as f:
        table = yaml.safe_load(f)
    out = {}
    for sa in table["serviceAccounts"]:
        grants = {}
        for g in sa["grants"]:
            key = (g["scope"], g["apiGroup"], g["resource"], tuple(sorted(g.get("resourceNames", []))))
            grants.setdefault(key, set()).update(g["verbs"])
        builtins = {(b["kind"], b["name"], b["scope"]) for b in sa.get("builtinRoles", [])}
        out[(sa["namespace"], sa["name"])] = (grants, builtins)
    return out


def markdown_rbac_rows():
    """Rows of the RBAC table in docs/deploy.md (between the rbac-table markers)."""
    with open(os.path.join(SRC, "docs", "deploy.md")) as f:
        text = f.read()
    begin, end = "<!-- rbac-table-begin -->", "<!-- rbac-table-end -->"
    if begin not in text or end not in text:
        raise AssertionError("docs/deploy.md lacks the <!-- rbac-table-begin/end --> markers")
    rows = []
    for line in text.split(begin, 1)[1].split(end, 1)[0].splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(cells) < 6 or cells[0] in ("ServiceAccount", "") or set(cells[0]) <= set("-: "):
            continue
        rows.append(tuple(cells[:6]))
    return rows


def table_rows(expected):
    """The rows docs/deploy.md must show, from rbac-expected.yaml: (sa, scope, apiGroup, resource, names, verbs)."""
    with open(os.path.join(DEPLOY, "rbac-expected.yaml")) as f:
        table = yaml.safe_load(f)
    rows = []
    for sa in table["serviceAccounts"]:
        for g in sa["grants"]:
            rows.append((f"`{sa['name']}`", g["scope"], f"`{g['apiGroup']}`" if g["apiGroup"] else "core",
                         f"`{g['resource']}`", ", ".join(g.get("resourceNames", [])) or "any",
                         ", ".join(g["verbs"])))
        for b in sa.get("builtinRoles", []):
            rows.append((f"`{sa['name']}`", b["scope"], "built-in", f"{b['kind']} `{b['name']}`", "-", "(Kubernetes')"))
    return rows


def group_rbac(c):
    """The rendered RBAC equals deploy/rbac-expected.yaml, which equals the table in docs/deploy.md."""
    objs = render("base")
    got = effective_grants(objs)
    want = expected_grants()
    c.equal(sorted(got), sorted(want), "ServiceAccounts with bindings")
    for sa in sorted(set(got) & set(want)):
        g_grants, g_builtin = got[sa]
        w_grants, w_builtin = want[sa]
        for key in sorted(set(g_grants) | set(w_grants)):
            c.equal(sorted(g_grants.get(key, [])), sorted(w_grants.get(key, [])),
                    f"{sa[1]} verbs on (scope, apiGroup, resource, resourceNames)={key}")
        c.equal(sorted(g_builtin), sorted(w_builtin), f"{sa[1]} built-in roles")
    sas = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs if o["kind"] == "ServiceAccount"}
    c.equal(sas, set(want), "ServiceAccounts")
    for o in objs:
        for r in o.get("rules", []) if o["kind"] in ("Role", "ClusterRole") else []:
            for field in ("apiGroups", "resources", "verbs"):
                c.check("*" not in r.get(field, []), f"{o['kind']} {o['metadata']['name']}: wildcard in {field}")
    # The cert-manager overlay drops the Job's ServiceAccount and grants nothing new.
    cm_got = effective_grants(render("overlays/cert-manager"))
    c.equal(sorted(cm_got), sorted(k for k in want if k[1] != "dynmig-certgen"),
            "ServiceAccounts with bindings in overlays/cert-manager")
    # Which pods run as which ServiceAccount.
    for kind, name, sa in (("Deployment", "dynmig-scheduler", "dynmig-scheduler"),
                           ("DaemonSet", "dynmig-device-plugin", "dynmig-device-plugin"),
                           ("Job", "dynmig-certgen", "dynmig-certgen")):
        c.equal(get(objs, kind, name)["spec"]["template"]["spec"].get("serviceAccountName"), sa,
                f"{kind} {name} serviceAccountName")
    try:
        doc_rows = markdown_rbac_rows()
    except (OSError, AssertionError) as e:
        c.check(False, str(e))
        return
    rows = table_rows(want)
    if not c.equal(doc_rows, rows, "the RBAC table in docs/deploy.md"):
        print("The table docs/deploy.md should hold, from deploy/rbac-expected.yaml:")
        print("| ServiceAccount | scope | apiGroup | resource | resourceNames | verbs | why |")
        print("|---|---|---|---|---|---|---|")
        with open(os.path.join(DEPLOY, "rbac-expected.yaml")) as f:
            table = yaml.safe_load(f)
        ordered = []  # per ServiceAccount: grants, then built-in roles (the order of table_rows)
        for sa in table["serviceAccounts"]:
            ordered += [g.get("why", "") for g in sa["grants"]] + [b.get("why", "") for b in sa.get("builtinRoles", [])]
        for row, why in zip(rows, ordered):
            print("| " + " | ".join(row + (why,)) + " |")


def run_certgen(workdir, existing_dir, extra_env=None):
    bindir = os.path.join(workdir, "bin")
    api = os.path.join(workdir, "api")
    env = dict(os.environ)
    env.update({
        "PATH": bindir + os.pathsep + env.get("PATH", ""),
        "FAKE_API_DIR": api, "SA_DIR": api, "KUBE_API": "https://fake-apiserver:6443",
        "EXISTING_DIR": existing_dir, "TMPDIR": workdir,
        "MUTATING_WEBHOOKS": "dynmig-webhook/mutate.dynmig.io",
        "VALIDATING_WEBHOOKS": "dynmig-webhook/validate.dynmig.io",
        "SERVICES": "dynmig-webhook dynmig-scheduler",
    })
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.update(extra_env or {})
    open(os.path.join(api, "requests.jsonl"), "w").close()
    proc = subprocess.run(["sh", os.path.join(DEPLOY, "base", "certgen", "certgen.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    with open(os.path.join(api, "requests.jsonl")) as f:
        requests = [json.loads(line) for line in f if line.strip()]
    return proc, requests


def materialize(secret_json, existing_dir):
    """Writes a Secret's data as files, as the kubelet does for a Secret volume."""
    shutil.rmtree(existing_dir, ignore_errors=True)
    os.makedirs(existing_dir)
    with open(secret_json) as f:
        data = json.load(f)["data"]
    for k, v in data.items():
        with open(os.path.join(existing_dir, k), "wb") as f:
            f.write(base64.b64decode(v))
    return data


def openssl(*args, input_text=None):
    return subprocess.run(["openssl", *args], capture_output=True, text=True, input=input_text, timeout=60)


def group_certgen(c):
    """deploy/base/certgen/certgen.sh against a fake API server (a stand-in curl), with the real openssl."""
    for tool in ("openssl", "base64", "sh"):
        if not shutil.which(tool):
            raise Skip(f"{tool} is not installed")
    with tempfile.TemporaryDirectory(prefix="dynmig-certgen-") as work:
        os.makedirs(os.path.join(work, "bin"))
        os.makedirs(os.path.join(work, "api"))
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_curl.py"),
                    os.path.join(work, "bin", "curl"))
        os.chmod(os.path.join(work, "bin", "curl"), 0o755)
        with open(os.path.join(work, "api", "token"), "w") as f:
            f.write("token-123\n")
        open(os.path.join(work, "api", "ca.crt"), "w").close()
        existing = os.path.join(work, "existing")
        os.makedirs(existing)
        secret_json = os.path.join(work, "api", "secrets", f"{NS}_dynmig-tls.json")

        # 1. First run: no Secret. Creates CA + certificate, POSTs the Secret, patches both webhooks.
        proc, reqs = run_certgen(work, existing)
        c.equal(proc.returncode, 0, f"first run exit code (stderr: {proc.stderr.strip()})")
        c.equal([(r["method"], r["path"]) for r in reqs], [
            ("POST", f"/api/v1/namespaces/{NS}/secrets"),
            ("PATCH", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/dynmig-webhook"),
            ("PATCH", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/dynmig-webhook"),
        ], "first run requests")
        if not os.path.exists(secret_json):
            c.check(False, "first run stored no Secret")
            return
        with open(secret_json) as f:
            secret = json.load(f)
        c.equal(secret["type"], "kubernetes.io/tls", "Secret type")
        c.equal(sorted(secret["data"]), ["ca.crt", "ca.key", "client.crt", "client.key", "tls.crt", "tls.key"],
                "Secret keys")
        data = materialize(secret_json, existing)
        ca_b64 = data["ca.crt"]
        for r in reqs[1:]:
            c.equal(r["contentType"], "application/strategic-merge-patch+json", f"{r['path']} patch type")
            c.equal(r["body"]["webhooks"][0]["clientConfig"]["caBundle"], ca_b64, f"{r['path']} caBundle")
        c.equal(reqs[1]["body"]["webhooks"][0]["name"], "mutate.dynmig.io", "mutating webhook name patched")
        c.equal(reqs[2]["body"]["webhooks"][0]["name"], "validate.dynmig.io", "validating webhook name patched")
        ca, crt = os.path.join(existing, "ca.crt"), os.path.join(existing, "tls.crt")
        v = openssl("verify", "-CAfile", ca, crt)
        c.equal(v.returncode, 0, f"the serving certificate verifies against the CA ({v.stdout}{v.stderr})")
        v = openssl("verify", "-CAfile", ca, "-purpose", "sslserver", crt)
        c.equal(v.returncode, 0, f"the serving certificate is good for TLS servers ({v.stdout}{v.stderr})")
        san = openssl("x509", "-in", crt, "-noout", "-ext", "subjectAltName").stdout
        got = sorted(x.strip()[4:] for x in san.splitlines()[-1].split(",")) if san else []
        c.equal(got, sorted(certgen_dns_names()), "serving certificate DNS SANs")
        for name in (f"dynmig-webhook.{NS}.svc", f"dynmig-scheduler.{NS}.svc"):
            v = openssl("x509", "-in", crt, "-noout", "-checkhost", name)
            c.check("does match" in v.stdout, f"certificate does not match host {name}: {v.stdout}")
        ca_text = openssl("x509", "-in", ca, "-noout", "-text").stdout
        c.check("CA:TRUE" in ca_text, "the CA certificate is a CA")
        key_pub = openssl("pkey", "-in", os.path.join(existing, "tls.key"), "-pubout").stdout
        crt_pub = openssl("x509", "-in", crt, "-noout", "-pubkey").stdout
        c.check(key_pub and key_pub == crt_pub, "tls.key is the key of tls.crt")
        c.check(openssl("x509", "-in", crt, "-noout", "-checkend", str(300 * 86400)).returncode == 0,
                "the serving certificate is valid for the coming 300 days")
        # The extender client certificate: kube-scheduler's, for TLS clients only.
        client = os.path.join(existing, "client.crt")
        v = openssl("verify", "-CAfile", ca, "-purpose", "sslclient", client)
        c.equal(v.returncode, 0, f"the client certificate is good for TLS clients ({v.stdout}{v.stderr})")
        v = openssl("verify", "-CAfile", ca, "-purpose", "sslserver", client)
        c.check(v.returncode != 0, "the client certificate must not serve TLS")
        v = openssl("verify", "-CAfile", ca, "-purpose", "sslclient", crt)
        c.check(v.returncode != 0, "the serving certificate must not authenticate a client")
        c.equal(openssl("x509", "-in", client, "-noout", "-subject", "-nameopt", "RFC2253").stdout.strip(),
                "subject=CN=system:kube-scheduler", "client certificate subject")
        key_pub = openssl("pkey", "-in", os.path.join(existing, "client.key"), "-pubout").stdout
        c.check(key_pub and key_pub == openssl("x509", "-in", client, "-noout", "-pubkey").stdout,
                "client.key is the key of client.crt")

        # 2. Rerun with the Secret mounted: nothing regenerated, no Secret write, caBundle patched again.
        proc, reqs = run_certgen(work, existing)
        c.equal(proc.returncode, 0, f"rerun exit code (stderr: {proc.stderr.strip()})")
        c.equal([r["method"] for r in reqs], ["PATCH", "PATCH"], "rerun writes no Secret")
        c.check("CA reused" in proc.stdout and "serving certificate reused" in proc.stdout
                and "client certificate reused" in proc.stdout,
                f"rerun reuses the CA and the certificates: {proc.stdout}")
        c.equal(reqs[0]["body"]["webhooks"][0]["clientConfig"]["caBundle"], ca_b64, "rerun caBundle unchanged")

        # 3. The certificate misses a Service name: a new certificate from the same CA, Secret replaced (PUT).
        proc, reqs = run_certgen(work, existing, {"SERVICES": "dynmig-webhook dynmig-scheduler dynmig-extra"})
        c.equal(proc.returncode, 0, f"new-name run exit code (stderr: {proc.stderr.strip()})")
        c.equal([r["method"] for r in reqs], ["POST", "PUT", "PATCH", "PATCH"],
                "a certificate without every name is reissued and the Secret replaced (POST 409, PUT)")
        data = materialize(secret_json, existing)
        c.equal(data["ca.crt"], ca_b64, "a reissued certificate keeps the valid CA (caBundle stays)")
        san = openssl("x509", "-in", crt, "-noout", "-ext", "subjectAltName").stdout
        c.check(f"DNS:dynmig-extra.{NS}.svc" in san, f"the reissued certificate names the new Service: {san}")

        # 4. Renewal due (RENEW_DAYS beyond the certificate's life): a new CA and certificate.
        proc, reqs = run_certgen(work, existing, {"RENEW_DAYS": "4000"})
        c.equal(proc.returncode, 0, f"renewal run exit code (stderr: {proc.stderr.strip()})")
        c.check("CA created" in proc.stdout and "serving certificate issued" in proc.stdout
                and "client certificate issued" in proc.stdout,
                f"a CA that expires within RENEW_DAYS is replaced: {proc.stdout}")
        data = materialize(secret_json, existing)
        c.check(data["ca.crt"] != ca_b64, "renewal makes a new CA")
        v = openssl("verify", "-CAfile", ca, "-purpose", "sslclient", os.path.join(existing, "client.crt"))
        c.equal(v.returncode, 0, f"the renewed client certificate verifies against the new CA ({v.stdout}{v.stderr})")
        c.equal(reqs[-1]["body"]["webhooks"][0]["clientConfig"]["caBundle"], data["ca.crt"],
                "renewal patches the new CA into caBundle")

        # 5. A corrupt Secret (key of another certificate) is replaced.
        with open(os.path.join(existing, "tls.key"), "w") as f:
            f.write(openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256").stdout)
        proc, reqs = run_certgen(work, existing)
        c.check(proc.returncode == 0 and "serving certificate issued" in proc.stdout,
                f"a key that does not match the certificate makes a new certificate: {proc.stdout}{proc.stderr}")

        # 5b. A client key of another certificate: a new client certificate, the serving one kept.
        materialize(secret_json, existing)
        with open(os.path.join(existing, "client.key"), "w") as f:
            f.write(openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256").stdout)
        proc, reqs = run_certgen(work, existing)
        c.check(proc.returncode == 0 and "client certificate issued" in proc.stdout
                and "serving certificate reused" in proc.stdout,
                f"a client key that does not match makes a new client certificate: {proc.stdout}{proc.stderr}")

        # 6. Errors are reported with the API's answer and a non-zero exit.
        with open(os.path.join(work, "api", "missing"), "w") as f:
            f.write("validatingwebhookconfigurations/dynmig-webhook\n")
        proc, _ = run_certgen(work, existing)
        c.check(proc.returncode != 0 and "PATCH validatingwebhookconfigurations/dynmig-webhook" in proc.stderr
                and "HTTP 404" in proc.stderr, f"a missing webhook configuration fails the Job: {proc.stderr}")
        os.remove(os.path.join(work, "api", "missing"))
        with open(os.path.join(work, "api", "token"), "w") as f:
            f.write("another-token\n")
        shutil.rmtree(existing)
        os.makedirs(existing)
        os.remove(secret_json)
        proc, _ = run_certgen(work, existing, {"SA_DIR": os.path.join(work, "sa")})
        c.check(proc.returncode != 0 and "token" in proc.stderr, f"a missing token is reported: {proc.stderr}")
        sa = os.path.join(work, "sa")
        os.makedirs(sa)
        with open(os.path.join(sa, "token"), "w") as f:
            f.write("wrong\n")
        shutil.copy(os.path.join(work, "api", "ca.crt"), os.path.join(sa, "ca.crt"))
        proc, _ = run_certgen(work, existing, {"SA_DIR": sa})
        c.check(proc.returncode != 0 and "HTTP 401" in proc.stderr, f"a refused token fails the Job: {proc.stderr}")
        open(os.path.join(work, "api", "unreachable"), "w").close()
        proc, _ = run_certgen(work, existing)
        c.check(proc.returncode != 0 and "HTTP 000" in proc.stderr and "Connection refused" in proc.stderr,
                f"an unreachable API server fails the Job with curl's message: {proc.stderr}")
        os.remove(os.path.join(work, "api", "unreachable"))
        proc, _ = run_certgen(work, existing, {"MUTATING_WEBHOOKS": "no-slash"})
        c.check(proc.returncode != 0 and "bad webhook entry 'no-slash'" in proc.stderr,
                f"a malformed webhook entry is named: {proc.stderr}")


def dockerfile_runtime_packages():
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read().replace("\\\n", " ")
    stages = text.split("\nFROM ")
    runtime = [s for s in stages if s.startswith("debian:bookworm-slim")]
    if len(runtime) != 1:
        raise AssertionError("deploy/Dockerfile needs one runtime stage FROM debian:bookworm-slim")
    pkgs = set()
    for line in runtime[0].splitlines():
        if "apt-get install" in line:
            words = line.split("apt-get install", 1)[1].split("&&", 1)[0].split()
            pkgs |= {w for w in words if not w.startswith("-")}
    return pkgs


def installed_dependency_closure(roots):
    """Every installed package reachable from `roots` through Depends / Pre-Depends."""
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Depends}\t${Pre-Depends}\t${Provides}\n"],
                          capture_output=True, text=True, timeout=60)
    deps, provides = {}, {}
    for line in proc.stdout.splitlines():
        name, dep, pre, prov = (line.split("\t") + ["", "", ""])[:4]
        alts = []
        for field in (dep, pre):
            for clause in filter(None, (x.strip() for x in field.split(","))):
                alts.append([a.strip().split(" ")[0].split(":")[0] for a in clause.split("|")])
        deps[name] = alts
        for p in filter(None, (x.strip().split(" ")[0] for x in prov.split(","))):
            provides.setdefault(p, []).append(name)
    seen, todo = set(), [r for r in roots if r in deps]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for alts in deps.get(p, []):
            for a in alts:
                for real in [a] if a in deps else provides.get(a, []):
                    todo.append(real)
    return seen


def group_dockerfile(c):
    """The runtime stage installs a Debian package for every shared library `ldd dynmig` reports."""
    for tool in ("ldd", "dpkg", "dpkg-query"):
        if not shutil.which(tool):
            raise Skip(f"{tool} is not available (not a Debian system?): cannot map libraries to packages")
    if not os.access(BINARY, os.X_OK):
        raise AssertionError(f"{BINARY} is not built (make build)")
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read()
    c.check("FROM debian:bookworm AS build" in text, "build stage FROM debian:bookworm")
    c.check("tools/install-deps.sh" in text, "the build stage installs with tools/install-deps.sh")
    c.check("cmake --preset default" in text and "--target dynmig" in text,
            "the build stage configures with the default preset and builds only the dynmig target")
    c.check("COPY --from=build /usr/local/bin/dynmig /usr/local/bin/dynmig" in text, "the runtime copies dynmig")
    c.check("\nUSER 65532" in text, "the runtime stage runs as non-root")
    pkgs = dockerfile_runtime_packages()
    for extra in ("openssl", "ca-certificates", "curl"):
        c.check(extra in pkgs, f"the runtime stage needs {extra} (certificate Job)")
    proc = subprocess.run(["ldd", BINARY], capture_output=True, text=True, timeout=60)
    c.equal(proc.returncode, 0, f"ldd {BINARY}")
    libs = []
    for line in proc.stdout.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/"):
            libs.append(parts[1].split("(")[0].strip())
        elif line.strip().startswith("/"):
            libs.append(line.strip().split(" ")[0])
        elif "not found" in line:
            c.check(False, f"ldd: {line.strip()}")
    closure = installed_dependency_closure(pkgs)
    sanitizers = [lib for lib in libs if os.path.basename(lib).startswith(("libasan", "libubsan", "liblsan",
                                                                          "libtsan"))]
    if sanitizers:
        print(f"  a sanitizer build: {', '.join(sanitizers)} not looked for (the image builds without them)")
    candidates = {}
    for lib in (lib for lib in libs if lib not in sanitizers):
        paths = {lib, os.path.realpath(lib)}
        for p in list(paths):
            paths.add(p[len("/usr"):] if p.startswith("/usr/lib/") else "/usr" + p if p.startswith("/lib") else p)
        candidates[lib] = paths
    # One dpkg -S for every path (it exits 1 when some path has no owner, which is expected for the aliases).
    every = sorted({p for paths in candidates.values() for p in paths})
    q = subprocess.run(["dpkg", "-S", *every], capture_output=True, text=True, timeout=120)
    owner_of = {}
    for line in q.stdout.splitlines():
        pkg, _, path = line.partition(": ")
        owner_of[path.strip()] = pkg.split(",")[0].split(":")[0].strip()
    for lib, paths in candidates.items():
        owner = next((owner_of[p] for p in sorted(paths) if p in owner_of), None)
        if not c.check(owner is not None, f"{lib}: no Debian package owns it"):
            continue
        c.check(owner in pkgs or owner in closure,
                f"{lib} comes from {owner}, which the Dockerfile's runtime stage does not install "
                "(add it to the apt-get install list)")
    print(f"  {len(libs)} libraries from ldd, {len(pkgs)} runtime packages")


def group_shellcheck(c):
    """shellcheck of the certificate script (POSIX sh), where shellcheck is installed."""
    tool = shutil.which("shellcheck")
    if not tool:
        raise Skip("shellcheck is not installed (apt-get install shellcheck): not checked")
    proc = subprocess.run([tool, "-s", "sh", os.path.join(DEPLOY, "base", "certgen", "certgen.sh")],
                          capture_output=True, text=True)
    c.check(proc.returncode == 0, f"shellcheck:\n{proc.stdout}{proc.stderr}")


GROUPS = {
    "render": group_render,
    "lint": group_lint,
    "objects": group_objects,
    "scheduler-config": group_scheduler_config,
    "device-config": group_device_config,
    "rbac": group_rbac,
    "certgen": group_certgen,
    "dockerfile": group_dockerfile,
    "shellcheck": group_shellcheck,
}


def main(argv):
    if len(argv) != 2 or argv[1] not in GROUPS:
        print(f"usage: {argv[0]} {{{'|'.join(GROUPS)}}}", file=sys.stderr)
        return 2
    c = Checker()
    try:
        GROUPS[argv[1]](c)
    except Skip as s:
        print(f"SKIP deploy.{argv[1]}: {s}")
        return SKIP
    except AssertionError as e:
        c.failures.append(str(e))
    for f in c.failures:
        print(f"FAIL: {f}")
    print(f"deploy.{argv[1]}: {c.checks} checks, {len(c.failures)} failed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

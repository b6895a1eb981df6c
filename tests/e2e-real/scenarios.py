#!/usr/bin/env python3
"""dynmig's scenario suite, written once, run through real kubectl against two backends:

  --backend local   starts `build/bin/dynmig local` (one node, one simulated A100-SXM4-40GB) on free ports and
                    runs the suite against the kubeconfig it writes
  --backend real    a running cluster with dynmig deployed (tools/real-k8s/cluster.py up + deploy, one node with
                    one simulated A100-SXM4-40GB): --kubeconfig and --node name it

The scenarios are the migration guide's recommended scenarios, its validation checklist and the spec's example
YAML (examples/, image swapped for the local busybox image). Each asserts what a user sees: pod phase, the
reservation annotation, the MIG UUID inside the container, the device plugin's NVML view, events. A failure names
the scenario and step and prints the objects and logs that explain it. Standard library only.
Ends with the line "N passed, N failed".
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALLOC = "hami.io/vgpu-mig-allocations"
BIND_PHASE = "hami.io/bind-phase"
REGISTER = "hami.io/node-nvidia-register"
VISIBLE = "dynmig.io/visible-devices"  # the local mode's kubelet stand-in records what each container got
NS = "default"
POD_TIMEOUT = float(os.environ.get("E2E_POD_TIMEOUT", "150"))


class StepFailed(Exception):
    pass


def log(msg):
    print("[scenarios %s] %s" % (time.strftime("%H:%M:%S", time.gmtime()), msg), flush=True)


# --- kubectl ------------------------------------------------------------------------------------------------------

class Kube:
    def __init__(self, kubectl, kubeconfig):
        self.kubectl, self.kubeconfig = kubectl, kubeconfig

    def run(self, *args, input=None, check=True, timeout=60):
        cmd = [self.kubectl, "--kubeconfig", self.kubeconfig] + list(args)
        try:
            p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StepFailed("kubectl %s did not answer within %d s" % (" ".join(args), timeout))
        if check and p.returncode != 0:
            raise StepFailed("kubectl %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()))
        return p

    def json(self, *args):
        return json.loads(self.run(*(list(args) + ["-o", "json"])).stdout)

    def pod(self, name):
        p = self.run("-n", NS, "get", "pod", name, "-o", "json", check=False)
        return json.loads(p.stdout) if p.returncode == 0 else None

    def apply(self, manifest):
        return self.run("-n", NS, "apply", "-f", "-", input=manifest if isinstance(manifest, str) else json.dumps(manifest))

    def events(self, name):
        return self.json("-n", NS, "get", "events", "--field-selector", "involvedObject.name=" + name)["items"]


def wait_for(what, predicate, timeout=POD_TIMEOUT, interval=0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except StepFailed:
            raise
        except Exception as e:  # not there yet
            last = e
        time.sleep(interval)
    raise StepFailed("timed out after %d s waiting for %s%s" % (timeout, what, " (%s)" % last if last else ""))


# --- backends -----------------------------------------------------------------------------------------------------

class Backend:
    name = "?"
    node = "?"
    kube = None
    extender_url = None  # https://HOST:PORT of the dynmig extender (/filter, /bind)
    tenant_args = []  # kubectl arguments that act as an ordinary tenant (see Suite.tenant)

    def make_tenant(self):
        """Whatever the backend needs so that tenant_args act as a user who may only manage pods in NS."""

    def nvml(self):
        """The device plugin's NVML view (GET /nvml)."""
        with urllib.request.urlopen(self.nvml_url, timeout=15) as r:  # 15 s: CI runs two suites on 2 cores
            return json.loads(r.read())

    def diagnostics(self):
        return ""


class LocalBackend(Backend):
    name = "local"
    node = "node-a"

    def __init__(self, dynmig, kubectl, defrag=True, node="node-a", gpus="A100-SXM4-40GBx1", device_config=None):
        self.dynmig, self.kubectl = dynmig, kubectl
        self.defrag = defrag  # the suite's defragmenter settings (DEFRAG_ARGS), or dynmig local's default: off
        self.node, self.gpus = node, gpus
        self.device_config = device_config  # a device-config.yaml path (None: dynmig local's default)
        self.proc = None

    @staticmethod
    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="dynmig-scenarios-")
        self.control = self.free_port()
        nvml_port = self.free_port()
        self.log_path = os.path.join(self.dir, "local.log")
        cmd = [self.dynmig, "local", "--listen", "127.0.0.1:0", "--nodes", "%s=%s" % (self.node, self.gpus),
               "--state-dir", os.path.join(self.dir, "state"), "--control", "127.0.0.1:%d" % self.control,
               "--nvml-port", str(nvml_port)] + (DEFRAG_ARGS if self.defrag else [])
        if self.device_config:
            cmd += ["--device-config", self.device_config]
        log("starting %s" % " ".join(cmd))
        self.out = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

        def up():
            if self.proc.poll() is not None:
                raise StepFailed("dynmig local exited %d:\n%s" % (self.proc.returncode, self.tail()))
            text = open(self.log_path).read()
            m = re.search(r"(?m)^\s+kubeconfig\s+(\S+)\s*$", text)
            n = re.search(r"device plugin (http://\S+/nvml)", text)
            e = re.search(r"(?m)^\s+scheduler\s+(https?://\S+)", text)
            return (m.group(1), n.group(1), e.group(1)) if m and n and e else None
        kubeconfig, self.nvml_url, self.extender_url = wait_for("dynmig local to print its kubeconfig", up, 60)
        self.kube = Kube(self.kubectl, kubeconfig)
        wait_for("node %s registered by its device plugin" % self.node,
                 lambda: REGISTER in self.kube.json("get", "node", self.node)["metadata"].get("annotations", {}), 60)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc:
            self.out.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def tail(self, lines=60):
        try:
            return "".join(open(self.log_path, errors="replace").readlines()[-lines:])
        except OSError:
            return ""

    def visible_devices(self, pod):
        """The MIG UUIDs the pod's first container got (recorded by the kubelet stand-in)."""
        value = pod["metadata"].get("annotations", {}).get(VISIBLE)
        if not value:
            return []
        got = json.loads(value)
        first = got.get(pod["spec"]["containers"][0]["name"], [])
        return first if isinstance(first, list) else str(first).split(",")

    def control_post(self, path):
        req = urllib.request.Request("http://127.0.0.1:%d/%s" % (self.control, path), data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
        except urllib.error.HTTPError as e:
            raise StepFailed("POST /%s answered %d: %s" % (path, e.code, e.read().decode(errors="replace")))

    def restart_device_plugin(self):
        self.control_post("restart/device-plugin/" + self.node)

    @contextlib.contextmanager
    def mode_node(self, s):
        """Issue 31's node (mig_mode_per_gpu): a second `dynmig local` with one node of MODE_SIM, the default device
        config plus MODE_SWITCHING, GPU 1's MIG mode off before its device plugin starts. Yields a ModeNode."""
        d = tempfile.mkdtemp(prefix="dynmig-mode-")
        config = os.path.join(d, "device-config.yaml")
        with open(config, "w") as f:
            f.write(with_mode_switching(dynmig_cli(s, "config", "default").stdout))
        b = LocalBackend(self.dynmig, self.kubectl, defrag=False, node="node-m", gpus=MODE_SIM, device_config=config)
        b.start()
        try:
            ms = Suite(b, s.image)
            m = ModeNode(ms, b.sim_state)
            m.nvml("mig-mode", "--gpu", "1", "--mode", "disabled")
            yield m
        finally:
            b.stop()
            shutil.rmtree(d, ignore_errors=True)

    # The handover scenario's parts (see handover_no_drain).
    @property
    def sim_state(self):
        return os.path.join(self.dir, "state", "nodes", self.node, "nvml.json")

    def stop_dynmig_plugin(self):
        self.control_post("stop/device-plugin/" + self.node)

    def start_dynmig_plugin(self):
        self.control_post("start/device-plugin/" + self.node)

    def start_legacy_allocator(self):
        self.control_post("start/nvidia-device-plugin/" + self.node)

    def stop_legacy_allocator(self):
        try:
            self.control_post("stop/nvidia-device-plugin/" + self.node)
        except StepFailed as e:
            if "no NVIDIA device plugin stand-in runs" not in str(e):
                raise

    def start_hami_allocator(self, config):
        self.control_post("start/hami-device-plugin/%s?config=%s" % (self.node, urllib.parse.quote(config)))

    def stop_hami_allocator(self):
        try:
            self.control_post("stop/hami-device-plugin/" + self.node)
        except StepFailed as e:
            if "no HAMi device plugin stand-in runs" not in str(e):
                raise

    def remove_webhooks(self):
        self.control_post("remove/webhooks")

    def install_webhooks(self):
        self.control_post("install/webhooks")

    def container_ids(self, pod):
        """The local kubelet stand-in writes no container IDs: its containers are never restarted either."""
        return {cs["name"]: (cs.get("containerID"), cs.get("restartCount"), cs.get("state", {}).get("running", {})
                             .get("startedAt")) for cs in pod["status"].get("containerStatuses", [])}

    restart_kubelet = None  # the kubelet stand-in is not a process of its own

    def diagnostics(self):
        return "---- dynmig local (last lines) ----\n" + self.tail()


class RealBackend(Backend):
    name = "real"

    def __init__(self, kubectl, kubeconfig, node, nvml_url, logs_cmd, extender_url, dynmig):
        self.kube = Kube(kubectl, kubeconfig)
        self.node, self.nvml_url, self.logs_cmd = node, nvml_url, logs_cmd
        self.extender_url = extender_url
        self.dynmig = dynmig
        self.standin = None
        self.kubeconfig = kubeconfig

    # The handover scenario's parts (see handover_no_drain): the simulator's state file on the host path the
    # device plugin's DaemonSet mounts (tools/real-k8s/translate.py), NVIDIA's device-plugin stand-in as a host
    # process on the kubelet's device-plugin directory, dynmig's DaemonSet moved off the node by a nodeSelector.
    sim_state = "/var/lib/kubelet/device-plugins/dynmig/sim-nvml.json"
    KUBELET_PLUGINS = "/var/lib/kubelet/device-plugins"
    AWAY = "dynmig.io/e2e-handover-away"

    def stop_dynmig_plugin(self):
        patch = {"spec": {"template": {"spec": {"nodeSelector": {self.AWAY: "true"}}}}}
        self.kube.run("-n", "dynmig-system", "patch", "daemonset", "dynmig-device-plugin", "--type=merge", "-p",
                      json.dumps(patch))
        wait_for("dynmig's device-plugin pod gone from the node", lambda: not self.kube.json(
            "-n", "dynmig-system", "get", "pods", "-l", "app.kubernetes.io/component=device-plugin")["items"], 120)

    def start_dynmig_plugin(self):
        patch = {"spec": {"template": {"spec": {"nodeSelector": {self.AWAY: None}}}}}
        self.kube.run("-n", "dynmig-system", "patch", "daemonset", "dynmig-device-plugin", "--type=merge", "-p",
                      json.dumps(patch))

        def ready():
            return any(any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                       for p in self.plugin_pod())
        wait_for("dynmig's device-plugin pod Ready again", ready, 120)
        wait_for("the device plugin's /nvml answering", lambda: self.nvml(), 60)

    def start_legacy_allocator(self):
        self.standin_log = open("/tmp/dynmig-e2e-nvidia-standin.log", "w")
        self.standin = subprocess.Popen(
            [self.dynmig, "nvidia-plugin-standin", "--node", self.node, "--kubelet-dir", self.KUBELET_PLUGINS,
             "--sim", "A100-SXM4-40GBx1", "--sim-state", self.sim_state], stdout=self.standin_log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

        def advertised():
            if self.standin.poll() is not None:
                raise StepFailed("dynmig nvidia-plugin-standin exited %d: %s" % (
                    self.standin.returncode, open("/tmp/dynmig-e2e-nvidia-standin.log").read()[-2000:]))
            alloc = self.kube.json("get", "node", self.node)["status"].get("allocatable", {})
            return [k for k, v in alloc.items() if k.startswith("nvidia.com/mig-") and v != "0"]
        wait_for("the kubelet advertising NVIDIA's nvidia.com/mig-* resources", advertised, 60)

    def stop_legacy_allocator(self):
        if self.standin is None:
            return
        if self.standin.poll() is None:
            self.standin.kill()  # as the DaemonSet's pod goes away: no goodbye to the kubelet
            self.standin.wait(10)
        self.standin = None
        self.standin_log.close()

    def start_hami_allocator(self, config):
        self.hami_log = open("/tmp/dynmig-e2e-hami-standin.log", "w")
        self.hami = subprocess.Popen(
            [self.dynmig, "nvidia-plugin-standin", "--hami-config", config, "--kubeconfig", self.kubeconfig,
             "--node", self.node, "--kubelet-dir", self.KUBELET_PLUGINS, "--sim", "A100-SXM4-40GBx1",
             "--sim-state", self.sim_state], stdout=self.hami_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

        def advertised():
            if self.hami.poll() is not None:
                raise StepFailed("dynmig nvidia-plugin-standin --hami-config exited %d: %s" % (
                    self.hami.returncode, open("/tmp/dynmig-e2e-hami-standin.log").read()[-2000:]))
            alloc = self.kube.json("get", "node", self.node)["status"].get("allocatable", {})
            return alloc.get("nvidia.com/gpu") == "10"  # HAMi's split count on the one GPU
        wait_for("the kubelet advertising HAMi's 10 nvidia.com/gpu split devices", advertised, 60)

    def stop_hami_allocator(self):
        if getattr(self, "hami", None) is None:
            return
        if self.hami.poll() is None:
            self.hami.kill()  # as the DaemonSet's pod goes away: no goodbye to the kubelet
            self.hami.wait(10)
        self.hami = None
        self.hami_log.close()

    # dynmig's admission webhooks, removed while pods that predate dynmig are made, then put back as they were.
    WEBHOOKS = (("mutatingwebhookconfiguration", "dynmig-webhook"), ("validatingwebhookconfiguration", "dynmig-webhook"))

    def remove_webhooks(self):
        self.saved_webhooks = []
        for kind, name in self.WEBHOOKS:
            obj = self.kube.json("get", kind, name)
            for f in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
                obj["metadata"].pop(f, None)
            self.saved_webhooks.append(obj)
        for kind, name in self.WEBHOOKS:
            self.kube.run("delete", kind, name)

    def install_webhooks(self):
        for obj in getattr(self, "saved_webhooks", []):
            self.kube.run("create", "-f", "-", input=json.dumps(obj))
        self.saved_webhooks = []

    def container_ids(self, pod):
        return {cs["name"]: (cs.get("containerID"), cs.get("restartCount"), cs.get("state", {}).get("running", {})
                             .get("startedAt")) for cs in pod["status"].get("containerStatuses", [])}

    KUBELET_LOG = "/var/lib/dynmig-real-k8s/logs/kubelet.log"

    def kubelet_log_offset(self):
        try:
            return os.path.getsize(self.KUBELET_LOG)
        except OSError:
            return 0

    def kubelet_lines(self, offset, words, limit=40):
        """The kubelet's log lines since `offset` that contain one of `words` (at most `limit`, 400 characters)."""
        try:
            with open(self.KUBELET_LOG, errors="replace") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return []
        return [line[:400] for line in text.splitlines() if any(w in line for w in words)][:limit]

    def restart_kubelet(self):
        """Restarts the kubelet; returns its log lines of the restart that speak of devices or the legacy pods."""
        try:
            offset = os.path.getsize(self.KUBELET_LOG)
        except OSError:
            offset = 0
        p = subprocess.run([sys.executable, os.path.join(REPO, "tools", "real-k8s", "cluster.py"), "restart-kubelet"],
                           capture_output=True, text=True, timeout=240)
        if p.returncode != 0:
            raise StepFailed("cluster.py restart-kubelet exited %d: %s" % (p.returncode, (p.stdout + p.stderr)[-2000:]))
        time.sleep(20)
        try:
            with open(self.KUBELET_LOG, errors="replace") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return []
        words = ("legacy-", "nvidia.com/mig", "devicemanager", "device_manager", "Admission", "admit", "checkpoint",
                 "UnexpectedAdmissionError", "OutOf")
        return [line[:400] for line in text.splitlines() if any(w in line for w in words)][:60]

    def start(self):
        wait_for("node %s registered by its device plugin" % self.node,
                 lambda: REGISTER in self.kube.json("get", "node", self.node)["metadata"].get("annotations", {}), 60)

    def stop(self):
        pass

    # The attack scenarios act as a ServiceAccount that may only manage pods in its own namespace (kubectl --as:
    # the API server authorizes every request as that user, RBAC included, and the webhooks see its username).
    TENANT = "system:serviceaccount:%s:tenant" % NS

    def make_tenant(self):
        if self.tenant_args:
            return
        rbac = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant", "namespace": NS}},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": {"name": "tenant-pods", "namespace": NS},
                 "rules": [{"apiGroups": [""], "resources": ["pods"],
                            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": "tenant-pods", "namespace": NS},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-pods"},
                 "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": NS}]}]
        self.kube.apply({"apiVersion": "v1", "kind": "List", "items": rbac})
        self.tenant_args = ["--as=" + self.TENANT]
        p = self.kube.run("auth", "can-i", "create", "pods", "--subresource=binding", "-n", NS, *self.tenant_args,
                          check=False)
        if p.stdout.strip() != "no":
            raise StepFailed("the tenant ServiceAccount may create pods/binding (%s): the RBAC is too wide" %
                             p.stdout.strip())

    def visible_devices(self, pod):
        """What the container's environment says (kubectl exec ... env: busybox has no printenv applet)."""
        p = self.kube.run("-n", NS, "exec", pod["metadata"]["name"], "--", "env", check=False)
        if p.returncode != 0:
            raise RuntimeError("kubectl exec %s -- env exited %d: %s" % (pod["metadata"]["name"], p.returncode,
                                                                           p.stderr.strip()))
        for line in p.stdout.splitlines():
            if line.startswith("NVIDIA_VISIBLE_DEVICES="):
                return [u for u in line.split("=", 1)[1].strip().split(",") if u]
        return []

    def plugin_pod(self):
        pods = self.kube.json("-n", "dynmig-system", "get", "pods", "-l",
                              "app.kubernetes.io/component=device-plugin")["items"]
        return [p for p in pods if p["metadata"].get("deletionTimestamp") is None]

    def restart_device_plugin(self):
        old = {p["metadata"]["uid"] for p in self.plugin_pod()}
        self.kube.run("-n", "dynmig-system", "delete", "pod", "-l", "app.kubernetes.io/component=device-plugin",
                      "--wait=true", timeout=90)

        def new_ready():
            for p in self.plugin_pod():
                if p["metadata"]["uid"] not in old and any(
                        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])):
                    return True
            return False
        wait_for("a new device-plugin pod Ready", new_ready, 120)

    MODE_STATE = "/var/lib/kubelet/device-plugins/dynmig/sim-nvml-mode.json"

    def scheduler_pods(self):
        pods = self.kube.json("-n", "dynmig-system", "get", "pods", "-l", "app.kubernetes.io/component=scheduler")
        return [p for p in pods["items"] if p["metadata"].get("deletionTimestamp") is None]

    @staticmethod
    def ready_pod_not_in(pods, old):
        return any(p["metadata"]["uid"] not in old and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])) for p in pods)

    def reconfigure(self, configs, plugin_args):
        """The device config's ConfigMaps and the device plugin's args set; the plugin's pod (the DaemonSet rolls
        it) and the scheduler's (deleted: the Deployment recreates it) restart together, reading the config again;
        waits until both are Ready and the extender answers."""
        plugins = {p["metadata"]["uid"] for p in self.plugin_pod()}
        schedulers = {p["metadata"]["uid"] for p in self.scheduler_pods()}
        self.set_device_configs(configs)
        self.set_plugin_args(plugin_args)
        self.kube.run("-n", "dynmig-system", "delete", "pod", "-l", "app.kubernetes.io/component=scheduler",
                      "--wait=false")
        wait_for("a new scheduler pod Ready", lambda: self.ready_pod_not_in(self.scheduler_pods(), schedulers), 120)
        wait_for("a new device-plugin pod Ready", lambda: self.ready_pod_not_in(self.plugin_pod(), plugins), 120)
        wait_for("the extender answering", lambda: https_get(self.extender_url + "/metrics")[0] == 200, 60)

    def plugin_args(self):
        ds = self.kube.json("-n", "dynmig-system", "get", "daemonset", "dynmig-device-plugin")
        return ds["spec"]["template"]["spec"]["containers"][0]["args"]

    def set_plugin_args(self, args):
        patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
        self.kube.run("-n", "dynmig-system", "patch", "daemonset", "dynmig-device-plugin", "--type=json", "-p",
                      json.dumps(patch))

    def device_configs(self):
        """{name: data} of the device-config ConfigMaps (kustomize names them dynmig-device-config-<hash>)."""
        items = self.kube.json("-n", "dynmig-system", "get", "configmaps")["items"]
        return {c["metadata"]["name"]: c.get("data", {}) for c in items
                if c["metadata"]["name"].startswith("dynmig-device-config")}

    def set_device_configs(self, configs):
        for name, data in configs.items():
            self.kube.run("-n", "dynmig-system", "patch", "configmap", name, "--type=merge", "-p",
                          json.dumps({"data": data}))

    @contextlib.contextmanager
    def mode_node(self, s):
        """Issue 31's node (mig_mode_per_gpu) on the real cluster: the device config's ConfigMap gets
        MODE_SWITCHING, the device plugin's DaemonSet simulates MODE_SIM on a state file of its own (GPU 1's MIG mode
        off before it starts), the scheduler restarts to read the config; all of it restored afterwards."""
        configs = self.device_configs()
        if not configs:
            raise StepFailed("no dynmig-device-config ConfigMap in dynmig-system")
        args = self.plugin_args()
        if "--sim" not in args or "--sim-state" not in args:
            raise StepFailed("the device plugin's DaemonSet does not run --sim/--sim-state: %s" % args)
        changed = {n: {k: with_mode_switching(v) for k, v in d.items()} for n, d in configs.items()}
        mode_args = list(args)
        mode_args[mode_args.index("--sim") + 1] = MODE_SIM
        mode_args[mode_args.index("--sim-state") + 1] = self.MODE_STATE
        if os.path.exists(self.MODE_STATE):
            os.remove(self.MODE_STATE)
        subprocess.run([self.dynmig, "nvml", "--sim", MODE_SIM, "--seed", self.node, "--state", self.MODE_STATE,
                        "mig-mode", "--gpu", "1", "--mode", "disabled"], check=True, capture_output=True, timeout=60)
        t = time.monotonic()
        try:
            s.step("[setup] device config with migModeSwitching; the device plugin on %s; the scheduler restarted"
                   % MODE_SIM)
            self.reconfigure(changed, mode_args)
            log("    reconfigured in %.1f s" % (time.monotonic() - t))
            yield ModeNode(s, self.MODE_STATE)
        finally:
            keep = os.environ.get("E2E_MODE_LOGS")  # a directory: the components' logs before they restart
            if keep:
                for comp in ("device-plugin", "scheduler"):
                    p = self.kube.run("-n", "dynmig-system", "logs", "-l", "app.kubernetes.io/component=" + comp,
                                      "--tail=-1", check=False)
                    with open(os.path.join(keep, comp + ".log"), "w") as f:
                        f.write(p.stdout + p.stderr)
            log("    mode node cleanup: the device config, the device plugin and the scheduler as they were")
            t = time.monotonic()
            self.reconfigure(configs, args)
            wait_for("the node's register without the mode node's GPUs", lambda: "H100" not in self.kube.json(
                "get", "node", self.node)["metadata"].get("annotations", {}).get(REGISTER, "H100"), 60)
            if os.path.exists(self.MODE_STATE):
                os.remove(self.MODE_STATE)
            log("    restored in %.1f s" % (time.monotonic() - t))

    def diagnostics(self):
        out = []
        for p in self.plugin_pod():
            out.append("---- device plugin %s (last lines) ----" % p["metadata"]["name"])
            out.append(self.kube.run("-n", "dynmig-system", "logs", p["metadata"]["name"], "--tail=40",
                                     check=False).stdout)
        sched = self.kube.json("-n", "dynmig-system", "get", "pods", "-l", "app.kubernetes.io/component=scheduler")
        for p in sched["items"]:
            out.append("---- dynmig scheduler %s (last lines) ----" % p["metadata"]["name"])
            out.append(self.kube.run("-n", "dynmig-system", "logs", p["metadata"]["name"], "--tail=40",
                                     check=False).stdout)
        if self.logs_cmd:
            out.append(subprocess.run(self.logs_cmd, shell=True, capture_output=True, text=True).stderr[-8000:])
        return "\n".join(out)


# --- what the scenarios build on ----------------------------------------------------------------------------------

class Suite:
    def __init__(self, backend, image):
        self.b, self.k, self.image = backend, backend.kube, image
        self.step_name = ""
        self.created = set()

    def step(self, name):
        self.step_name = name
        log("  step: %s" % name)

    # Pods ------------------------------------------------------------------------------------------------------
    def mig_pod(self, name, mib, preference=None, sleep=3600):
        ann = {"nvidia.com/vgpu-mode": "mig"}
        if preference:
            ann["nvidia.com/mig-profile-preference"] = preference
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": ann},
                "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                         "containers": [{"name": "workload", "image": self.image,
                                         "command": ["sh", "-c", "sleep %d" % sleep],
                                         "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mib}}}]}}

    def example(self, name):
        """examples/NAME.yaml with the image swapped for the local busybox image (nothing else changes)."""
        text = open(os.path.join(REPO, "examples", name + ".yaml")).read()
        swapped, n = re.subn(r"(?m)^(\s*image:\s*)\S+\s*$", r"\g<1>" + self.image, text)
        if n == 0:
            raise StepFailed("examples/%s.yaml has no image line to swap" % name)
        for m in re.finditer(r"(?m)^  name:\s*(\S+)", swapped):
            self.created.add(m.group(1))
        return swapped

    def create(self, manifest):
        if isinstance(manifest, dict):
            self.created.add(manifest["metadata"]["name"])
        self.k.apply(manifest)

    def running(self, name, timeout=POD_TIMEOUT):
        """Waits until the pod runs with its reservation complete; returns (pod, allocations)."""
        def check():
            pod = self.k.pod(name)
            if pod is None:
                raise StepFailed("pod %s does not exist" % name)
            phase = pod["status"].get("phase")
            if phase in ("Failed", "Succeeded"):
                raise StepFailed("pod %s is %s: %s" % (name, phase, json.dumps(pod["status"])[:1500]))
            for cs in pod["status"].get("containerStatuses", []):
                waiting = cs.get("state", {}).get("waiting", {})
                if waiting.get("reason") in ("CreateContainerError", "CreateContainerConfigError", "ErrImagePull",
                                             "ImagePullBackOff", "ErrImageNeverPull", "RunContainerError"):
                    raise StepFailed("pod %s container %s: %s: %s" % (name, cs["name"], waiting["reason"],
                                                                       waiting.get("message", "")))
            if phase != "Running":
                return None
            allocs = self.allocations(pod)
            if not allocs or any("migUUID" not in a for a in allocs):
                return None
            return pod, allocs
        return wait_for("pod %s Running with its MIG instance" % name, check, timeout)

    @staticmethod
    def allocations(pod):
        value = pod["metadata"].get("annotations", {}).get(ALLOC)
        return json.loads(value) if value else []

    def pending_reason(self, name, timeout=POD_TIMEOUT):
        def check():
            pod = self.k.pod(name)
            if pod["status"].get("phase") != "Pending":
                raise StepFailed("pod %s is %s, expected Pending" % (name, pod["status"].get("phase")))
            for c in pod["status"].get("conditions", []):
                if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message"):
                    return pod, c["message"]
            return None
        return wait_for("pod %s Pending with PodScheduled=False and a reason" % name, check, timeout)

    def delete(self, *names):
        self.k.run("-n", NS, "delete", "pod", *names, "--grace-period=2", "--wait=false", "--ignore-not-found")

    def gone(self, *names, timeout=POD_TIMEOUT):
        """Waits until the pods are deleted. A v1.20 kubelet removes a deleted pod's object only at a later sync
        of its status manager, 5 to 50 s after the pod's containers were killed and removed (measured, docs/
        real-k8s.md); so a pod being deleted whose containers have all terminated is deleted with grace period 0
        meanwhile, as an operator who does not wait would. dynmig has seen the containers end by then (it
        reclaims on that, the instance-reclaimed steps show it while the pod object still exists), and the
        object's removal reaches dynmig's informers as the same DELETE event the kubelet's would cause."""
        def check():
            left = [(n, self.k.pod(n)) for n in names]
            left = [(n, p) for n, p in left if p is not None]
            ended = [n for n, p in left if p["metadata"].get("deletionTimestamp") and containers_ended(p)]
            if ended:
                self.k.run("-n", NS, "delete", "pod", *ended, "--grace-period=0", "--force", "--wait=false",
                           "--ignore-not-found", check=False)
            return not left
        wait_for("pods %s deleted" % ", ".join(names), check, timeout)

    # What the user checks ----------------------------------------------------------------------------------------
    def instances(self):
        """MIG UUIDs of the live GPU instances in the device plugin's NVML view."""
        view = self.b.nvml()
        found = set()

        def walk(v):
            if isinstance(v, dict):
                for key, x in v.items():
                    if isinstance(x, str) and x.startswith("MIG-") and key.lower() in ("uuid", "miguuid", "mig_uuid"):
                        found.add(x)
                    walk(x)
            elif isinstance(v, list):
                for x in v:
                    walk(x)
        walk(view)
        return found

    def expect_realized(self, name, pod, allocs, profile=None):
        annotations = pod["metadata"].get("annotations", {})
        if pod["spec"].get("schedulerName") != "dynmig-scheduler":
            raise StepFailed("pod %s has schedulerName %r: the mutating webhook did not route it" %
                             (name, pod["spec"].get("schedulerName")))
        if annotations.get(BIND_PHASE) != "success":
            raise StepFailed("pod %s: %s is %r, expected success" % (name, BIND_PHASE, annotations.get(BIND_PHASE)))
        if pod["spec"].get("nodeName") != self.b.node:
            raise StepFailed("pod %s runs on %r, expected %s" % (name, pod["spec"].get("nodeName"), self.b.node))
        for a in allocs:
            for field in ("gpuUUID", "profile", "placement", "migUUID", "gpuInstanceID", "computeInstanceID"):
                if field not in a:
                    raise StepFailed("pod %s: %s entry lacks %s: %s" % (name, ALLOC, field, json.dumps(a)))
        if profile and allocs[0]["profile"] != profile:
            raise StepFailed("pod %s got %s, expected %s" % (name, allocs[0]["profile"], profile))
        uuids = [a["migUUID"] for a in allocs]
        seen = wait_for("the container of %s to see its MIG device" % name, lambda: self.b.visible_devices(pod), 30)
        if sorted(seen) != sorted(uuids):
            raise StepFailed("the container of %s sees %s, the reservation says %s" % (name, seen, uuids))
        live = self.instances()
        missing = [u for u in uuids if u not in live]
        if missing:
            raise StepFailed("pod %s: %s not in the device plugin's NVML view (%s)" % (name, missing, sorted(live)))

    @staticmethod
    def unrelated_to_dynmig(event):
        """A kubelet warning about the pod's service-account token volume whose secret cache did not sync in time
        (the kubelet's watch of the API server lagging on a loaded machine): neither scheduling nor devices. It is
        logged, not failed on; every other Warning fails the check."""
        return (event.get("reason") == "FailedMount" and "failed to sync secret cache" in event.get("message", "")
                and "-token-" in event.get("message", ""))

    @staticmethod
    def unrelated_to_dynmig_line(line):
        """The same exception as unrelated_to_dynmig, for a line of `kubectl describe`'s Events."""
        return "FailedMount" in line and "failed to sync secret cache" in line and "-token-" in line

    def no_warnings(self, *names):
        found = []
        for n in names:
            warnings = [e for e in self.k.events(n) if e.get("type") == "Warning"]
            for e in [e for e in warnings if self.unrelated_to_dynmig(e)]:
                log("    pod %s: kubelet warning not about dynmig, noted: %s: %s" % (n, e.get("reason"), e.get("message")))
            warnings = [e for e in warnings if not self.unrelated_to_dynmig(e)]
            if warnings:
                found.append("pod %s has Warning events: %s" % (n, "; ".join(
                    "%s (x%d): %s" % (e.get("reason"), e.get("count") or 1, e.get("message")) for e in warnings)))
        if found:
            raise StepFailed("\n  ".join(found))

    def reclaimed(self, uuids, timeout=POD_TIMEOUT):
        wait_for("instances %s reclaimed" % sorted(uuids), lambda: not (set(uuids) & self.instances()), timeout)

    def cleanup(self):
        names = [n for n in self.created if self.k.pod(n) is not None]
        if names:
            self.delete(*names)
            self.gone(*names)
        self.created.clear()
        wait_for("every MIG instance reclaimed after the scenario", lambda: not self.instances(), POD_TIMEOUT)


def containers_ended(pod):
    """Whether the pod's containers have all ended for good: its phase is Failed or Succeeded (a v1.20 kubelet
    that removed a deleted pod's container before reporting it shows it as waiting, with a last state
    `ContainerStatusUnknown`, in a Failed pod), or every container has terminated. A pod whose containers were
    never created is left to the kubelet."""
    status = pod.get("status", {})
    if status.get("phase") in ("Failed", "Succeeded"):
        return True
    statuses = status.get("containerStatuses") or []
    return bool(statuses) and all("terminated" in cs.get("state", {}) for cs in statuses)


def overlap(a, b):
    pa, pb = a["placement"], b["placement"]
    return pa["start"] < pb["start"] + pb["size"] and pb["start"] < pa["start"] + pa["size"]


# --- the scenarios ------------------------------------------------------------------------------------------------

def scenario1_create_and_delete_one_1g(s):
    s.step("create a 4000 MiB pod")
    s.create(s.mig_pod("one-1g", 4000))
    pod, allocs = s.running("one-1g")
    s.step("check the reservation, the container and NVML")
    s.expect_realized("one-1g", pod, allocs, "1g.5gb")
    if allocs[0]["placement"]["size"] != 1:
        raise StepFailed("a 1g instance spans %s slices" % allocs[0]["placement"]["size"])
    s.step("delete it: its instance is reclaimed")
    s.delete("one-1g")
    s.reclaimed([allocs[0]["migUUID"]])
    s.step("no Warning event on the scheduled pod (its events outlive it)")
    s.no_warnings("one-1g")


def scenario2_several_non_overlapping_1g(s):
    names = ["small-%d" % i for i in range(3)]
    s.step("create three 1g pods")
    for n in names:
        s.create(s.mig_pod(n, 4000))
    got = {}
    for n in names:
        pod, allocs = s.running(n)
        s.expect_realized(n, pod, allocs, "1g.5gb")
        got[n] = allocs[0]
    s.step("distinct placements and MIG UUIDs on one GPU")
    vals = list(got.values())
    for i, a in enumerate(vals):
        for b in vals[i + 1:]:
            if overlap(a, b):
                raise StepFailed("placements overlap: %s and %s" % (a["placement"], b["placement"]))
    if len({a["migUUID"] for a in vals}) != len(vals) or len({a["gpuUUID"] for a in vals}) != 1:
        raise StepFailed("expected distinct MIG UUIDs on one GPU: %s" % json.dumps(vals))
    s.step("no Warning event on the scheduled pods")
    s.no_warnings(*names)


def scenario3_mixed_example(s):
    s.step("kubectl apply examples/mig-mixed.yaml")
    s.create(s.example("mig-mixed"))
    want = {"small-1g": "1g.5gb", "medium-2g": "2g.10gb", "large-3g": "3g.20gb"}
    got = []
    for n, profile in want.items():
        pod, allocs = s.running(n)
        s.step("%s gets %s" % (n, profile))
        s.expect_realized(n, pod, allocs, profile)
        got.append(allocs[0])
    s.step("no two instances overlap")
    for i, a in enumerate(got):
        for b in got[i + 1:]:
            if overlap(a, b):
                raise StepFailed("%s at %s overlaps %s at %s" % (a["profile"], a["placement"], b["profile"],
                                                                  b["placement"]))
    s.step("no Warning event on the scheduled pods")
    s.no_warnings(*want)


def scenario4_5_pending_when_full_then_reuse(s):
    fillers = ["filler-%d" % i for i in range(7)]
    s.step("seven 1g pods fill the A100's seven 1g placements")
    for n in fillers:
        s.create(s.mig_pod(n, 4000))
    allocs = {}
    for n in fillers:
        allocs[n] = s.running(n)[1][0]
    s.step("an eighth 1g pod stays Pending with the scheduler's reason")
    s.create(s.mig_pod("waiting", 4000))
    pod, reason = s.pending_reason("waiting")
    log("    reason: %s" % reason)
    if s.allocations(pod) and any("migUUID" in a for a in s.allocations(pod)):
        raise StepFailed("the Pending pod holds an instance: %s" % pod["metadata"]["annotations"][ALLOC])
    s.step("deleting one filler: the waiting pod runs in the freed placement")
    freed = allocs["filler-3"]
    s.delete("filler-3")
    pod, got = s.running("waiting", timeout=POD_TIMEOUT + 60)
    s.expect_realized("waiting", pod, got, "1g.5gb")
    if got[0]["placement"] != freed["placement"] or got[0]["gpuUUID"] != freed["gpuUUID"]:
        raise StepFailed("the waiting pod got %s, the freed placement was %s" % (got[0]["placement"],
                                                                                 freed["placement"]))
    s.step("no Warning event on the pods that were scheduled")
    s.no_warnings(*[n for n in fillers if n != "filler-3"])


def scenario6_device_plugin_restart_adopts(s):
    s.step("two pods run")
    s.create(s.mig_pod("keep-1g", 4000))
    s.create(s.mig_pod("keep-2g", 9000))
    before = {n: s.running(n)[1][0] for n in ("keep-1g", "keep-2g")}
    live_before = s.instances()
    s.step("restart the device plugin")
    s.b.restart_device_plugin()
    s.step("same instances, same MIG UUIDs, pods still Running and seeing them")
    for n, a in before.items():
        pod, allocs = s.running(n, timeout=30)
        if allocs[0]["migUUID"] != a["migUUID"]:
            raise StepFailed("%s: MIG UUID %s became %s" % (n, a["migUUID"], allocs[0]["migUUID"]))
        s.expect_realized(n, pod, allocs)
    after = s.instances()
    if after != live_before:
        raise StepFailed("the instances changed across the restart: %s -> %s" % (sorted(live_before), sorted(after)))
    s.step("delete one: exactly its instance goes")
    s.delete("keep-1g")
    s.reclaimed([before["keep-1g"]["migUUID"]])
    if before["keep-2g"]["migUUID"] not in s.instances():
        raise StepFailed("the other pod's instance %s was destroyed" % before["keep-2g"]["migUUID"])
    s.step("no Warning event on the pods")
    s.no_warnings("keep-1g", "keep-2g")


def example_canary(s):
    s.step("kubectl apply examples/mig-canary.yaml (nvidia.com/gpumem: 8000)")
    s.create(s.example("mig-canary"))
    pod, allocs = s.running("mig-canary")
    s.step("2g.10gb on the A100-40GB, seen by the container")
    s.expect_realized("mig-canary", pod, allocs, "2g.10gb")
    described = s.k.run("-n", NS, "describe", "pod", "mig-canary").stdout
    s.step("delete it: reclaimed")
    s.delete("mig-canary")
    s.reclaimed([allocs[0]["migUUID"]])
    s.step("kubectl describe (taken while it ran) shows no Warning event")
    warnings = [line for line in described.split("Events:")[-1].splitlines()
                if re.match(r"^\s+Warning\s", line)]
    for line in [l for l in warnings if Suite.unrelated_to_dynmig_line(l)]:
        log("    kubelet warning not about dynmig, noted: %s" % line.strip())
    if [l for l in warnings if not Suite.unrelated_to_dynmig_line(l)]:
        raise StepFailed("kubectl describe pod mig-canary shows warnings:\n" + described.split("Events:")[-1])
    s.no_warnings("mig-canary")


def example_preference(s):
    s.step("kubectl apply examples/mig-prefer-4g.yaml (19000 MiB, preference 4g)")
    s.create(s.example("mig-prefer-4g"))
    pod, allocs = s.running("mig-prefer-4g")
    s.step("the preference is honoured: 4g.20gb")
    s.expect_realized("mig-prefer-4g", pod, allocs, "4g.20gb")
    s.no_warnings("mig-prefer-4g")


def example_typo_refused(s):
    s.step("kubectl apply examples/mig-typo.yaml is refused with the valid choices")
    p = s.k.run("-n", NS, "apply", "-f", "-", input=s.example("mig-typo"), check=False)
    if p.returncode == 0:
        raise StepFailed("the misspelled preference was accepted: %s" % p.stdout)
    if "4gg" not in p.stderr or "denied" not in p.stderr:
        raise StepFailed("the refusal does not name the bad value: %s" % p.stderr)
    log("    refused: %s" % p.stderr.strip()[:300])
    if s.k.pod("mig-typo") is not None:
        raise StepFailed("pod mig-typo exists after the refusal")


def example_short_job(s):
    s.step("kubectl apply examples/mig-short-job.yaml: Running, then Succeeded after 20 s")
    s.create(s.example("mig-short-job"))
    pod, allocs = s.running("mig-short-job")
    s.expect_realized("mig-short-job", pod, allocs, "1g.5gb")
    wait_for("mig-short-job Succeeded",
             lambda: s.k.pod("mig-short-job")["status"].get("phase") == "Succeeded", 90)
    s.step("the ended pod's instance is reclaimed while the pod object stays")
    s.reclaimed([allocs[0]["migUUID"]])
    s.no_warnings("mig-short-job")


def checklist_user_cannot_edit_reservation(s):
    s.step("a running pod")
    s.create(s.mig_pod("guarded", 4000))
    pod, allocs = s.running("guarded")
    s.step("kubectl annotate of its reservation is refused by the validating webhook")
    forged = json.dumps([dict(allocs[0], placement={"start": 6, "size": 1})])
    p = s.k.run("-n", NS, "annotate", "pod", "guarded", "--overwrite", "%s=%s" % (ALLOC, forged), check=False)
    if p.returncode == 0:
        raise StepFailed("a user rewrote %s: %s" % (ALLOC, p.stdout))
    if s.allocations(s.k.pod("guarded")) != allocs:
        raise StepFailed("the reservation changed after a refused edit")
    log("    refused: %s" % p.stderr.strip()[:300])


def system_pod_annotations():
    """The protocol's pod annotations only the scheduler and device plugin may write: the one list in
    src/protocol/annotations.h (kSystemPodAnnotations), read from the source so the suite follows it."""
    text = open(os.path.join(REPO, "src", "protocol", "annotations.h")).read()
    values = dict(re.findall(r'inline constexpr std::string_view (k\w+) =\s*"([^"]+)";', text))
    body = re.search(r"kSystemPodAnnotations\[\] = \{(.*?)\};", text, re.S)
    if not body:
        raise StepFailed("src/protocol/annotations.h has no kSystemPodAnnotations list")
    names = re.findall(r"k\w+", body.group(1))
    return [values[n] for n in names]


def checklist_users_cannot_write_protocol_annotations(s):
    keys = system_pod_annotations()
    s.step("a running pod")
    s.create(s.mig_pod("guarded-all", 4000))
    pod, _ = s.running("guarded-all")
    before = pod["metadata"].get("annotations", {})
    s.step("kubectl annotate of each of %d protocol annotations is refused (set, change, remove)" % len(keys))
    for key in keys:
        edits = ["%s=forged" % key]
        if key in before:
            edits.append("%s-" % key)
        for edit in edits:
            p = s.k.run("-n", NS, "annotate", "pod", "guarded-all", "--overwrite", edit, check=False)
            if p.returncode == 0:
                raise StepFailed("a user's `kubectl annotate pod guarded-all %s` was accepted" % edit)
            if key not in p.stderr:
                raise StepFailed("the refusal of %s does not name %s: %s" % (edit, key, p.stderr.strip()))
    after = s.k.pod("guarded-all")["metadata"].get("annotations", {})
    changed = [k for k in keys if before.get(k) != after.get(k)]
    if changed:
        raise StepFailed("protocol annotations changed after refused edits: %s" % changed)
    s.step("a pod created with a protocol annotation is refused")
    forged = s.mig_pod("forged-phase", 4000)
    forged["metadata"]["annotations"][BIND_PHASE] = "allocating"
    p = s.k.run("-n", NS, "apply", "-f", "-", input=json.dumps(forged), check=False)
    if p.returncode == 0 or s.k.pod("forged-phase") is not None:
        s.created.add("forged-phase")
        raise StepFailed("a pod carrying %s was created by a user" % BIND_PHASE)
    s.step("the user may still delete the pod")
    s.delete("guarded-all")
    s.gone("guarded-all")


def checklist_only_kube_scheduler_binds(s):
    s.step("a plain pod of another scheduler, Pending")
    s.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other-sched"},
              "spec": {"schedulerName": "some-other-scheduler", "terminationGracePeriodSeconds": 2,
                       "containers": [{"name": "c", "image": s.image, "command": ["sh", "-c", "sleep 3600"]}]}})
    pod = wait_for("pod other-sched", lambda: s.k.pod("other-sched"), 30)
    s.step("an unauthenticated POST %s/bind of it to %s is refused" % (s.b.extender_url, s.b.node))
    body = json.dumps({"PodName": "other-sched", "PodNamespace": NS, "PodUID": pod["metadata"]["uid"],
                       "Node": s.b.node}).encode()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the server's identity is not what this step checks; the caller's is
    req = urllib.request.Request(s.b.extender_url + "/bind", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            answer = r.read().decode(errors="replace")
            status = r.status
    except urllib.error.HTTPError as e:
        answer, status = e.read().decode(errors="replace"), e.code
    except (urllib.error.URLError, ssl.SSLError, ConnectionError) as e:
        answer, status = "connection refused by TLS: %s" % e, None  # a client certificate required at TLS
    log("    answer: %s %s" % (status, answer[:200]))
    if status == 200 and '"Error":""' in answer.replace(" ", ""):
        raise StepFailed("the extender accepted an unauthenticated bind: %s" % answer)
    if status is not None and status not in (401, 403):
        raise StepFailed("an unauthenticated bind answered %s, not 401/403: %s" % (status, answer[:300]))
    s.step("the pod is still unbound")
    if s.k.pod("other-sched")["spec"].get("nodeName"):
        raise StepFailed("pod other-sched was bound to %s" % s.k.pod("other-sched")["spec"]["nodeName"])


def checklist_node_capability(s):
    s.step("the node's %s lists the GPU NVML reports, in mig mode, with allowlisted profiles" % REGISTER)
    # Polled, not read once: the scenario before restarts the device plugin, and under load (CI runs the two
    # backends side by side) its republishing, the node read or the NVML view may come a few seconds late.
    last = []

    def miss(why):
        last.append(why)
        return False

    def check():
        node = s.k.json("get", "node", s.b.node)
        reg = node["metadata"].get("annotations", {}).get(REGISTER)
        if not reg:
            return miss("node %s has no %s" % (s.b.node, REGISTER))
        text = json.dumps(s.b.nvml())
        gpus = set(re.findall(r"GPU-[0-9a-f-]{36}", text))
        if not gpus or not all(g in reg for g in gpus):
            return miss("%s = %s does not list NVML's GPUs %s" % (REGISTER, reg[:400], sorted(gpus)))
        for want in ("mig", "1g.5gb", "7g.40gb"):
            if want not in reg:
                return miss("%s lacks %r: %s" % (REGISTER, want, reg[:400]))
        alloc = node["status"].get("allocatable", {}).get("nvidia.com/gpu")
        if not alloc or int(alloc) < 1:
            return miss("node %s has no allocatable nvidia.com/gpu (%r)" % (s.b.node, alloc))
        return True
    try:
        wait_for("the node's capability to match NVML", lambda: check_noting(check, last), 60)
    except StepFailed as e:
        raise StepFailed("%s; last seen: %s" % (e, last[-1] if last else "nothing"))
    if last:
        log("    matched after %d tries; the first miss: %s" % (len(last) + 1, last[0][:300]))


def check_noting(check, notes):
    """check() for wait_for, every failure (a StepFailed from kubectl too) noted in notes and retried."""
    try:
        return check()
    except Exception as e:  # noqa: BLE001 - noted, retried until wait_for's deadline
        notes.append("%s: %s" % (type(e).__name__, e))
        return False


# --- issue 27: what a hostile tenant tries ------------------------------------------------------------------------
# Each attack runs as an ordinary tenant (real backend: a ServiceAccount that may only manage pods in its
# namespace; local backend: the kubeconfig's user, which the webhooks treat as any non-dynmig user) and ends with
# another tenant's MIG pod scheduling and running on the same node, which is what the attack used to prevent.

def tenant_apply(s, manifest):
    s.b.make_tenant()
    if isinstance(manifest, dict):
        s.created.add(manifest["metadata"]["name"])
    return s.k.run(*s.b.tenant_args, "-n", NS, "apply", "-f", "-", input=json.dumps(manifest), check=False)


def plain_gpu_pod(s, name, limits, annotations=None, **spec):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
           "spec": dict({"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                         "containers": [{"name": "c", "image": s.image, "command": ["sh", "-c", "sleep 3600"],
                                         "resources": {"limits": limits}}]}, **spec)}
    return pod


def expect_refused(s, p, name, *words):
    if p.returncode == 0 or s.k.pod(name) is not None:
        raise StepFailed("pod %s was admitted: %s %s" % (name, p.stdout.strip(), p.stderr.strip()))
    for w in words:
        if w not in p.stderr:
            raise StepFailed("the refusal of pod %s does not say %r: %s" % (name, w, p.stderr.strip()))
    log("    refused: %s" % p.stderr.strip()[:300])


def another_tenant_still_runs(s, name):
    s.step("another tenant's MIG pod still schedules and runs on the node")
    s.create(s.mig_pod(name, 4000))
    pod, allocs = s.running(name)
    s.expect_realized(name, pod, allocs)


def attack1_huge_instance_count(s):
    s.step("a pod asking nvidia.com/gpu: 50000 with nvidia.com/gpumem: 1000 is refused at creation, naming the limit")
    p = tenant_apply(s, plain_gpu_pod(s, "greedy", {"nvidia.com/gpu": 50000, "nvidia.com/gpumem": 1000},
                                      {"nvidia.com/vgpu-mode": "mig"}))
    expect_refused(s, p, "greedy", "50000")
    another_tenant_still_runs(s, "after-greedy")


def attack2_deep_json_to_the_webhook(s):
    s.step("an AdmissionReview with 300,000 nested arrays in a pod annotation, POSTed straight to /webhook")
    deep = "[" * 300000 + "]" * 300000
    body = ('{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1",'
            '"kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"%s",'
            '"userInfo":{"username":"attacker"},"object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x",'
            '"annotations":{"%s":%s}},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":'
            '{"nvidia.com/gpu":1}}}]}}}}' % (NS, ALLOC, deep)).encode()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # what is checked is the server's answer to any caller
    req = urllib.request.Request(s.b.extender_url + "/webhook", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            status, answer = r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        status, answer = e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, ssl.SSLError, ConnectionError) as e:
        raise StepFailed("the webhook did not answer (crashed?): %s" % e)
    log("    answer: %s %s" % (status, answer[:200]))
    if '"allowed":true' in answer.replace(" ", ""):
        raise StepFailed("the deep AdmissionReview was allowed: %s" % answer[:300])
    if "nest" not in answer and "deep" not in answer and status not in (400, 413):
        raise StepFailed("the answer does not name the nesting limit: %s %s" % (status, answer[:300]))
    s.step("the scheduler is still up: /webhook answers a normal review")
    another_tenant_still_runs(s, "after-deep")


def attack3_node_name_around_the_scheduler(s):
    for mode in ("hami-core", "mig", None):
        name = "thief-%s" % (mode or "nomode")
        s.step("a pod with spec.nodeName=%s, nvidia.com/gpu: 1 and vgpu-mode %s is refused" % (s.b.node, mode))
        ann = {"nvidia.com/vgpu-mode": mode} if mode else {}
        p = tenant_apply(s, plain_gpu_pod(s, name, {"nvidia.com/gpu": 1}, ann, nodeName=s.b.node))
        expect_refused(s, p, name, "spec.nodeName")
    s.step("a GPU pod naming another scheduler is routed to dynmig's (or refused), never left to it")
    p = tenant_apply(s, plain_gpu_pod(s, "own-sched", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000},
                                      {"nvidia.com/vgpu-mode": "hami-core"}, schedulerName="default-scheduler"))
    pod = s.k.pod("own-sched")
    if p.returncode == 0 and pod is not None and pod["spec"].get("schedulerName") != "dynmig-scheduler":
        raise StepFailed("a GPU pod kept schedulerName %r" % pod["spec"].get("schedulerName"))
    if pod is not None:
        s.delete("own-sched")
        s.gone("own-sched")
    another_tenant_still_runs(s, "after-thief")


def attack4_routing_annotation_removed(s):
    s.step("a pod with nvidia.com/gpu: 0 and vgpu-mode mig cannot be placed on the node around dynmig")
    p = tenant_apply(s, plain_gpu_pod(s, "zero-bound", {"nvidia.com/gpu": 0}, {"nvidia.com/vgpu-mode": "mig"},
                                      nodeName=s.b.node))
    expect_refused(s, p, "zero-bound", "spec.nodeName")
    s.step("the same pod through dynmig: admitted (dynmig binds only pods it reserved for)")
    p = tenant_apply(s, plain_gpu_pod(s, "zero", {"nvidia.com/gpu": 0}, {"nvidia.com/vgpu-mode": "mig"}))
    if p.returncode != 0:
        raise StepFailed("a gpu:0 pod was refused: %s" % p.stderr.strip())
    wait_for("pod zero", lambda: s.k.pod("zero"), 30)
    s.step("removing its nvidia.com/vgpu-mode annotation is refused, naming the key")
    p = s.k.run(*s.b.tenant_args, "-n", NS, "annotate", "pod", "zero", "nvidia.com/vgpu-mode-", check=False)
    if p.returncode == 0:
        raise StepFailed("a tenant removed nvidia.com/vgpu-mode of a GPU pod: %s" % p.stdout.strip())
    if "nvidia.com/vgpu-mode" not in p.stderr:
        raise StepFailed("the refusal does not name nvidia.com/vgpu-mode: %s" % p.stderr.strip())
    log("    refused: %s" % p.stderr.strip()[:300])
    another_tenant_still_runs(s, "after-zero")


def attack5_recreated_pod_keeps_no_lock(s):
    s.step("a pod holds the node lock (as a bind takes it), is force-deleted and recreated under its name, "
           "unschedulable")
    holder = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "locker"},
              "spec": {"terminationGracePeriodSeconds": 0, "nodeSelector": {"dynmig.io/no-such-node": "x"},
                       "containers": [{"name": "c", "image": s.image, "command": ["sh", "-c", "sleep 3600"]}]}}
    s.create(holder)
    uid = wait_for("pod locker", lambda: (s.k.pod("locker") or {}).get("metadata", {}).get("uid"), 30)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    s.k.run("annotate", "node", s.b.node, "--overwrite", "hami.io/mutex.lock=%s,%s,locker,%s" % (now, NS, uid))
    s.k.run("-n", NS, "delete", "pod", "locker", "--grace-period=0", "--force", check=False)
    s.gone("locker", timeout=60)
    s.create(holder)
    wait_for("pod locker recreated", lambda: (s.k.pod("locker") or {}).get("metadata", {}).get("uid") not in
             (None, uid), 30)
    s.step("the device plugin releases the lock: its owner's UID is gone (it used to stay until its 5-minute expiry)")

    def released():
        return "hami.io/mutex.lock" not in s.k.json("get", "node", s.b.node)["metadata"].get("annotations", {})
    wait_for("the node lock released", released, 60)
    another_tenant_still_runs(s, "after-locker")


def https_get(url, timeout=10):
    """(status, body) of an HTTPS GET without a client certificate; status None when TLS refused it."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the caller's identity is what is checked, not the server's
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, ssl.SSLError, ConnectionError) as e:
        return None, str(e)


def attack6_endpoints_expose_no_pod_names(s):
    s.step("a tenant's MIG pod runs")
    s.create(s.mig_pod("secret-name-7f3a", 4000))
    s.running("secret-name-7f3a")
    s.step("the scheduler's /metrics, open to any pod, names no pod")
    status, body = https_get(s.b.extender_url + "/metrics")
    if status != 200:
        raise StepFailed("GET /metrics answered %s: %s" % (status, body[:200]))
    if "secret-name-7f3a" in body:
        raise StepFailed("/metrics names the tenant's pod: %s" %
                         [l for l in body.splitlines() if "secret-name-7f3a" in l][:3])
    if s.b.name == "real":
        s.step("the scheduler's /layout and live page refuse a caller without the client certificate")
        for path in ("/layout", "/live", "/live/body"):
            status, body = https_get(s.b.extender_url + path)
            if status not in (None, 401, 403) or "secret-name-7f3a" in body:
                raise StepFailed("GET %s without a client certificate answered %s: %s" % (path, status, body[:200]))
            log("    %s: %s %s" % (path, status, body.strip()[:120]))
        s.step("the device plugin's metrics port (all interfaces) does not serve /nvml")
        metrics = s.b.nvml_url.replace(":19401/", ":19400/")
        try:
            with urllib.request.urlopen(metrics, timeout=5) as r:
                raise StepFailed("GET %s answered %s: /nvml is served on all interfaces" % (metrics, r.status))
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise StepFailed("GET %s answered %s, expected 404" % (metrics, e.code))
    else:
        log("    local mode: /layout, /live and /nvml listen on loopback addresses only, where they are served")

# --- a real Prometheus scrapes dynmig (issue 32) ---------------------------------------------------------------------

PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")  # Debian's package (tools/install-deps.sh)


class Prometheus:
    """A real Prometheus on a free loopback port scraping the scheduler's and the device plugin's /metrics every 2 s
    and evaluating dynmig's rules (deploy/overlays/monitoring, written out by tools/prometheus-rules.py with
    `overrides`) every 2 s. The scheduler is scraped over TLS without verifying its certificate: what is checked is
    what Prometheus reads and fires, not the server's identity (the same as https_get)."""

    def __init__(self, scheduler_url, plugin_target, node, overrides):
        self.scheduler = re.sub(r"^https://", "", scheduler_url).rstrip("/")
        self.plugin, self.node, self.overrides = plugin_target, node, overrides
        self.proc = None

    def start(self):
        if not os.access(PROMETHEUS, os.X_OK):
            raise StepFailed("%s is missing: install Debian's prometheus package (tools/install-deps.sh)" % PROMETHEUS)
        self.dir = tempfile.mkdtemp(prefix="dynmig-prometheus-")
        rules = os.path.join(self.dir, "dynmig-rules.yaml")
        cmd = [sys.executable, os.path.join(REPO, "tools", "prometheus-rules.py")]
        for o in self.overrides:
            cmd += ["--override", o]
        subprocess.run(cmd + [rules], check=True)
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(json.dumps({  # JSON is YAML
                "global": {"scrape_interval": "2s", "evaluation_interval": "2s", "scrape_timeout": "2s"},
                "rule_files": [rules],
                "scrape_configs": [
                    {"job_name": "dynmig-scheduler", "scheme": "https",
                     "tls_config": {"insecure_skip_verify": True},
                     "static_configs": [{"targets": [self.scheduler]}]},
                    {"job_name": "dynmig-device-plugin", "honor_labels": True,
                     "static_configs": [{"targets": [self.plugin], "labels": {"node": self.node}}]},
                ]}, indent=1))
        self.port = LocalBackend.free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = os.path.join(self.dir, "prometheus.log")
        self.out = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file", config, "--storage.tsdb.path", os.path.join(self.dir, "data"),
             "--web.listen-address", "127.0.0.1:%d" % self.port, "--log.level", "warn"],
            stdout=self.out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log("    prometheus on %s, rules %s (overrides %s)" % (self.url, rules, ", ".join(self.overrides)))

        def ready():
            if self.proc.poll() is not None:
                raise StepFailed("prometheus exited %d:\n%s" % (self.proc.returncode, self.tail()))
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, ConnectionError):
                return False
        wait_for("prometheus ready", ready, 60)

    def api(self, path):
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise StepFailed("prometheus %s: %s" % (path, body))
        return body["data"]

    def query(self, expr):
        return self.api("/api/v1/query?query=" + urllib.parse.quote(expr))["result"]

    def alerts(self, name):
        return [a for a in self.api("/api/v1/alerts")["alerts"] if a["labels"].get("alertname") == name]

    def tail(self, lines=30):
        try:
            return "".join(open(self.log_path, errors="replace").readlines()[-lines:])
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc:
            self.out.close()
            shutil.rmtree(self.dir, ignore_errors=True)


def prometheus_alert_fires_on_fragmentation(s):
    """A real Prometheus scrapes both components with dynmig's rules; a MIG pod waits on a fragmented GPU and
    DynmigMigPodsWaitingOnFragmentation fires (its threshold 5 s and `for: 0s` instead of 10 minutes and 5), read
    back from Prometheus' /api/v1/alerts, silent before."""
    plugin = re.sub(r"^http://([^/]+)/.*$", r"\1", s.b.nvml_url)
    if s.b.name == "real":
        plugin = plugin.replace(":19401", ":19400")  # /metrics is on the all-interfaces listener
    alert = "DynmigMigPodsWaitingOnFragmentation"
    prom = Prometheus(s.b.extender_url, plugin, s.b.node, ["%s:for=0s" % alert, "%s:threshold=5" % alert])
    s.step("a real Prometheus (%s) scrapes the scheduler (%s) and the device plugin (%s)" % (
        PROMETHEUS, s.b.extender_url, plugin))
    prom.start()
    try:
        def targets_up():
            active = prom.api("/api/v1/targets")["activeTargets"]
            health = {t["labels"]["job"]: t["health"] for t in active}
            errors = [t.get("lastError") for t in active if t.get("lastError")]
            if errors and time.monotonic() - started > 20:
                log("    scrape errors so far: %s" % errors)
            return health if health == {"dynmig-scheduler": "up", "dynmig-device-plugin": "up"} else None
        started = time.monotonic()
        wait_for("both targets up in prometheus", targets_up, 60)
        loaded = [r["name"] for g in prom.api("/api/v1/rules")["groups"] for r in g["rules"] if r["type"] == "alerting"]
        log("    alerting rules loaded: %s" % ", ".join(loaded))
        if alert not in loaded or len(loaded) < 7:
            raise StepFailed("prometheus loaded the alerting rules %s" % loaded)

        s.step("seven 1g pods fill the GPU; those at slices 1 and 5 end: three slices free, no two adjacent")
        fillers = ["frag-%d" % i for i in range(7)]
        for n in fillers:
            s.create(s.mig_pod(n, 4000))
        at = {}
        for n in fillers:
            at[s.running(n)[1][0]["placement"]["start"]] = n
        ended = [at[1], at[5]]
        s.delete(*ended)
        s.gone(*ended)
        s.step("the pod-attributed instance series names the running pods")

        def info():
            series = prom.query('dynmig_mig_instance_info{namespace="%s"}' % NS)
            pods = {r["metric"].get("pod") for r in series}
            return series if pods == set(fillers) - set(ended) else None
        series = wait_for("dynmig_mig_instance_info for the five running pods", info, 30)
        log("    e.g. %s" % json.dumps(series[0]["metric"], sort_keys=True))
        for r in series:
            m = r["metric"]
            if m.get("UUID") != m.get("gpu_uuid") or m.get("GPU_I_ID") != m.get("gpu_instance_id") or \
                    not m.get("container") or not m.get("mig_uuid"):
                raise StepFailed("an info series without its join labels: %s" % m)
        s.step("the alert is silent while no pod waits")
        if prom.alerts(alert):
            raise StepFailed("%s is active before any pod waits: %s" % (alert, prom.alerts(alert)))

        s.step("a 2g pod waits: capacity exists (three free slices) but no 2g placement is free")
        s.create(s.mig_pod("frag-2g", 9000))
        pod, reason = s.pending_reason("frag-2g")
        log("    reason: %s" % reason)
        if "fragmented" not in reason:
            raise StepFailed("frag-2g is pending for another reason: %s" % reason)

        s.step("prometheus reads the pending pod and the GPU's free slices, and the alert fires")

        def firing():
            got = [a for a in prom.alerts(alert) if a["state"] == "firing"]
            return got or None
        t0 = time.monotonic()
        got = wait_for("%s firing in prometheus' /api/v1/alerts" % alert, firing, 90)
        log("    firing after %.1f s: %s" % (time.monotonic() - t0, json.dumps(got[0], sort_keys=True)))
        pending = prom.query('dynmig_scheduler_pending_pods{reason="fragmented"}')
        free = prom.query("dynmig_scheduler_gpu_free_slices")
        run = prom.query("dynmig_scheduler_gpu_largest_free_run_slices")
        log("    pending_pods{fragmented} %s, free slices %s, largest free run %s" % (
            [r["value"][1] for r in pending], [r["value"][1] for r in free], [r["value"][1] for r in run]))
        if [r["value"][1] for r in pending] != ["1"] or [r["value"][1] for r in free] != ["3"] or \
                [r["value"][1] for r in run] != ["1"]:
            raise StepFailed("expected 1 fragmented pending pod, 3 free slices, a largest free run of 1")
    except StepFailed:
        log("    prometheus log:\n%s" % prom.tail())
        raise
    finally:
        prom.stop()


# --- handover without draining (issue 29) ---------------------------------------------------------------------------

HELD = "dynmig.io/mig-held"
HANDOVER_GEOMETRY = "1g.5gb=2,2g.10gb=1"  # MIG Manager's layout on the A100-SXM4-40GB: 1g at 0 and 6, 2g at 4
LEGACY = {"legacy-1g-a": "1g.5gb", "legacy-1g-b": "1g.5gb", "legacy-2g": "2g.10gb"}


def node_events(s, reason):
    """Events of this reason in any namespace (the device plugin posts node-level ones where its pod is gone)."""
    return s.k.json("get", "events", "-A", "--field-selector", "reason=" + reason)["items"]


def sim_gpu_instances(s):
    """(GI id, placement start) of every GPU instance on the node's simulated GPU 0, from the simulator's state."""
    out = json.loads(dynmig_cli(s, "nvml", "--state", s.b.sim_state, "instances", "--output", "json").stdout)
    return {(gi["id"], gi["placement"]["start"]) for gi in out["gpus"][0].get("gpuInstances", [])}


def held_annotation(s):
    ann = s.k.json("get", "node", s.b.node)["metadata"].get("annotations", {})
    return json.loads(ann.get("dynmig.io/mig-held") or "[]")


def in_use_destroy_retried(s):
    s.step("a 1g pod runs")
    s.create(s.mig_pod("held-1g", 4000))
    pod, allocs = s.running("held-1g")
    a = allocs[0]
    gi, start = a["gpuInstanceID"], a["placement"]["start"]
    s.step("another NVML client (DCGM) holds its GPU instance open on the node's simulated NVML")
    dynmig_cli(s, "nvml", "--state", s.b.sim_state, "hold", "--gpu", "0", "--gi", str(gi), "--holder", "dcgm")
    try:
        s.step("delete the pod: NVML refuses the destroy with IN_USE; the instance stays and its slices are held")
        s.delete("held-1g")
        s.gone("held-1g")
        wait_for("a MigDestroyInUse event", lambda: node_events(s, "MigDestroyInUse"), 60)
        ev = node_events(s, "MigDestroyInUse")[-1]
        log("    event: %s" % ev.get("message"))
        if "NVML_ERROR_IN_USE" not in ev.get("message", "") or "another NVML client" not in ev.get("message", ""):
            raise StepFailed("the MigDestroyInUse event does not say IN_USE and who holds it: %s" % ev.get("message"))
        wait_for("slices %d held in dynmig.io/mig-held" % start,
                 lambda: any(h["placement"]["start"] == start and "being destroyed" in h.get("reason", "")
                             for h in held_annotation(s)), 60)
        time.sleep(8)  # a few retries, each refused
        if (gi, start) not in sim_gpu_instances(s):
            raise StepFailed("GI %d is gone while it was held" % gi)
        s.step("a 7g pod, which needs every slice, stays Pending meanwhile")
        s.create(s.mig_pod("needs-all", 39000))
        s.pending_reason("needs-all")
    finally:
        s.step("the holder lets go")
        dynmig_cli(s, "nvml", "--state", s.b.sim_state, "release", "--gpu", "0", "--gi", str(gi), check=False)
    s.step("a retry destroys it, the slices are freed and the 7g pod runs")
    wait_for("GI %d destroyed" % gi, lambda: (gi, start) not in sim_gpu_instances(s), 150)
    wait_for("nothing held any more", lambda: not held_annotation(s), 60)
    pod, got = s.running("needs-all", timeout=POD_TIMEOUT + 60)
    s.expect_realized("needs-all", pod, got, "7g.40gb")


def gpu_cordon_keeps_running_takes_no_new(s):
    s.step("a 1g pod runs on GPU 0")
    s.create(s.mig_pod("before-cordon", 4000))
    before = s.running("before-cordon")[1][0]
    kube = ["--kubeconfig", s.k.kubeconfig]
    s.step("dynmig gpu cordon --node %s --gpu 0" % s.b.node)
    out = dynmig_cli(s, "gpu", "cordon", "--node", s.b.node, "--gpu", "0", "--reason", "e2e maintenance",
                     "--by", "e2e", *kube).stdout
    log("    " + out.strip())
    ann = s.k.json("get", "node", s.b.node)["metadata"]["annotations"]
    if ann.get("hami.io/device-cordon") != before["gpuUUID"]:
        raise StepFailed("hami.io/device-cordon is %r, expected %s" % (ann.get("hami.io/device-cordon"),
                                                                       before["gpuUUID"]))
    try:
        s.step("a new pod stays Pending, and explain says the GPU is cordoned")
        s.create(s.mig_pod("after-cordon", 4000))
        _, reason = s.pending_reason("after-cordon")
        log("    reason: %s" % reason)
        if "cordon" not in reason:
            raise StepFailed("the Pending reason does not name the cordon: %s" % reason)
        text = dynmig_cli(s, "explain", "-n", NS, "after-cordon", *kube).stdout
        want = "waiting: GPU 0 (%s) of node %s is cordoned" % (before["gpuUUID"], s.b.node)
        if want not in text or "e2e maintenance (by e2e)" not in text:
            raise StepFailed("explain does not say %r with the reason:\n%s" % (want, text))
        s.step("the running pod stays, with its instance")
        pod, allocs = s.running("before-cordon", timeout=30)
        s.expect_realized("before-cordon", pod, allocs)
    finally:
        s.step("dynmig gpu uncordon")
        dynmig_cli(s, "gpu", "uncordon", "--node", s.b.node, "--gpu", before["gpuUUID"], *kube, check=False)
    s.step("the waiting pod runs")
    pod, got = s.running("after-cordon", timeout=POD_TIMEOUT + 60)
    s.expect_realized("after-cordon", pod, got, "1g.5gb")


def legacy_pod(s, name, profile, env=None, resources=True):
    c = {"name": "workload", "image": s.image, "command": ["sh", "-c", "sleep 3600"]}
    if resources:
        c["resources"] = {"limits": {"nvidia.com/mig-" + profile: 1}}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2, "containers": [c]}}


def dynmig_cli(s, *args, check=True):
    p = subprocess.run([s.b.dynmig] + list(args), capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise StepFailed("dynmig %s exited %d: %s%s" % (" ".join(args), p.returncode, p.stdout[-2000:], p.stderr[-2000:]))
    return p


def nvml_items(view):
    """Every GPU instance item of the device plugin's NVML view, by its first CI's MIG UUID."""
    out = {}
    for g in view.get("gpus", []):
        for i in g.get("instances", []):
            cis = i.get("computeInstances") or []
            if cis:
                out[cis[0]["migUUID"]] = dict(i, gpuUUID=g.get("uuid"))
    return out


def sim_uuids(s):
    """Every MIG UUID on the node's simulated GPUs, read from the simulator's state as nvidia-smi would."""
    out = json.loads(dynmig_cli(s, "nvml", "--state", s.b.sim_state, "instances", "--output", "json").stdout)
    return {ci["migUUID"] for g in out.get("gpus", []) for gi in g.get("gpuInstances", [])
            for ci in gi.get("computeInstances", [])}


def plain_running(s, name, timeout=POD_TIMEOUT):
    def check():
        pod = s.k.pod(name)
        if pod is None:
            raise StepFailed("pod %s does not exist" % name)
        phase = pod["status"].get("phase")
        if phase in ("Failed", "Succeeded"):
            raise StepFailed("pod %s is %s: %s" % (name, phase, json.dumps(pod["status"])[:1500]))
        return pod if phase == "Running" else None
    return wait_for("pod %s Running" % name, check, timeout)


def node_mig_resources(s):
    st = s.k.json("get", "node", s.b.node)["status"]
    return {f: {k: v for k, v in st.get(f, {}).items() if k.startswith("nvidia.com/mig-")}
            for f in ("capacity", "allocatable")}


def expect_unrestarted(s, before):
    for n, ids in before.items():
        pod = s.k.pod(n)
        if pod is None or pod["status"].get("phase") != "Running":
            raise StepFailed("legacy pod %s is no longer Running: %s" % (
                n, json.dumps(pod["status"])[:1500] if pod else "deleted"))
        now = s.b.container_ids(pod)
        if now != ids:
            raise StepFailed("legacy pod %s was restarted: containers %s became %s" % (n, ids, now))
        for name, (_, restarts, _) in now.items():
            if restarts:
                raise StepFailed("legacy pod %s container %s restartCount %s" % (n, name, restarts))


def handover_no_drain(s):
    b = s.b
    extra = []  # what this scenario changed beyond pods: undone in `finally`
    try:
        handover_steps(s, extra)
    finally:
        log("    handover cleanup")
        b.stop_legacy_allocator()
        if "plugin-stopped" in extra:
            b.start_dynmig_plugin()


def handover_steps(s, extra):
    b = s.b
    s.step("dynmig's device plugin leaves the node")
    b.stop_dynmig_plugin()
    extra.append("plugin-stopped")
    s.step("the fixed geometry %s, laid out as MIG Manager does, on the simulator's state" % HANDOVER_GEOMETRY)
    print(dynmig_cli(s, "nvml", "--state", b.sim_state, "apply-geometry", "--geometry", HANDOVER_GEOMETRY).stdout,
          end="", flush=True)
    s.step("NVIDIA's device plugin (stand-in, mixed strategy) serves the node")
    b.start_legacy_allocator()
    # Every profile the legacy pods ask for, as many as they ask: the stand-in registers one resource per
    # profile, one after the other, and a pod created before its resource is advertised gets a
    # FailedScheduling Warning (seen on the real cluster under load), which the suite counts against the pod.
    wanted = {}
    for profile in LEGACY.values():
        wanted["nvidia.com/mig-" + profile] = wanted.get("nvidia.com/mig-" + profile, 0) + 1

    def all_advertised():
        alloc = node_mig_resources(s)["allocatable"]
        return all(int(alloc.get(k, "0")) >= n for k, n in wanted.items())
    wait_for("the kubelet advertising %s" % ", ".join("%s=%d" % kv for kv in sorted(wanted.items())),
             all_advertised, 60)
    s.step("legacy pods requesting nvidia.com/mig-<profile> run (default scheduler)")
    for n, profile in LEGACY.items():
        s.create(legacy_pod(s, n, profile))
    before, got = {}, {}
    for n, profile in LEGACY.items():
        pod = plain_running(s, n)
        before[n] = b.container_ids(pod)
        seen = wait_for("the container of %s to see its MIG device" % n, lambda: b.visible_devices(pod), 30)
        if len(seen) != 1 or not seen[0].startswith("MIG-"):
            raise StepFailed("legacy pod %s sees NVIDIA_VISIBLE_DEVICES %s, expected one MIG UUID" % (n, seen))
        got[n] = seen[0]
        log("    %s: %s, containers %s" % (n, got[n], before[n]))
    if len(set(got.values())) != len(got):
        raise StepFailed("two legacy pods got the same instance: %s" % got)
    resources_serving = node_mig_resources(s)
    log("    node resources while NVIDIA's plugin serves: %s" % resources_serving)

    s.step("NVIDIA's device plugin leaves the node; dynmig's comes back")
    b.stop_legacy_allocator()
    wait_for("the kubelet to drop NVIDIA's nvidia.com/mig-* allocatable to 0",
             lambda: all(v == "0" for v in node_mig_resources(s)["allocatable"].values()), 60)
    resources_gone = node_mig_resources(s)
    log("    node resources once it stopped: %s" % resources_gone)
    b.start_dynmig_plugin()
    extra.remove("plugin-stopped")

    s.step("the legacy pods still run, not restarted; dynmig proves each instance's holder")
    expect_unrestarted(s, before)
    expect_held(s, got)
    s.step("dynmig handover check passes")
    handover_check(s, expect_ok=True)

    s.step("a dynamic pod runs beside them, in the free slices")
    s.create(s.mig_pod("dyn-1g", 4000))
    pod, allocs = s.running("dyn-1g")
    s.expect_realized("dyn-1g", pod, allocs)
    items = nvml_items(b.nvml())
    legacy_items = [items[u] for u in got.values()]
    for li in legacy_items:
        if overlap(allocs[0], li):
            raise StepFailed("dyn-1g's instance %s overlaps legacy instance %s" % (allocs[0]["placement"],
                                                                                   li["placement"]))

    s.step("deleting one legacy pod frees exactly its instance")
    s.delete("legacy-1g-a")
    s.gone("legacy-1g-a")
    s.reclaimed([got["legacy-1g-a"]])
    live = s.instances()
    for n in ("legacy-1g-b", "legacy-2g"):
        if got[n] not in live:
            raise StepFailed("legacy pod %s's instance %s was destroyed" % (n, got[n]))
    if allocs[0]["migUUID"] not in live:
        raise StepFailed("dyn-1g's instance was destroyed")
    expect_unrestarted(s, {n: before[n] for n in ("legacy-1g-b", "legacy-2g")})

    unprovable(s, allocs[0], got)

    if b.restart_kubelet:
        kubelet_restart(s, before, got)

    s.step("the remaining legacy pods end: their instances are reclaimed")
    s.delete("legacy-1g-b", "legacy-2g", "dyn-1g")
    s.gone("legacy-1g-b", "legacy-2g", "dyn-1g")
    s.reclaimed([got["legacy-1g-b"], got["legacy-2g"], allocs[0]["migUUID"]])
    s.no_warnings("legacy-1g-b", "legacy-2g", "dyn-1g")


def expect_held(s, got, timeout=60):
    def check():
        items = nvml_items(s.b.nvml())
        problems = []
        for n, uuid in got.items():
            i = items.get(uuid)
            if i is None:
                problems.append("%s's instance %s is not in /nvml" % (n, uuid))
            elif not i.get("managed") or i.get("origin") != "legacy":
                problems.append("%s's instance %s: managed %s origin %s unproven %s" % (
                    n, uuid, i.get("managed"), i.get("origin"), i.get("unproven")))
            elif not any(h.get("name") == n for h in i.get("holders", [])):
                problems.append("%s's instance %s: holders %s" % (n, uuid, i.get("holders")))
        node = s.k.json("get", "node", s.b.node)
        held = json.loads(node["metadata"].get("annotations", {}).get(HELD) or "[]")
        for n, uuid in got.items():
            i = items.get(uuid)
            if i and not any(h["gpuUUID"] == i["gpuUUID"] and h["placement"] == i["placement"] and n in h["reason"]
                             for h in held):
                problems.append("%s's instance is not in %s: %s" % (n, HELD, held))
        if problems:
            raise RuntimeError("; ".join(problems))
        return items
    items = wait_for("every legacy instance managed, origin legacy, held by its pod, in %s" % HELD, check, timeout)
    for n, uuid in got.items():
        log("    %s: %s holders %s" % (n, uuid, [(h["name"], h["container"], h["resource"], h["source"])
                                            for h in items[uuid]["holders"]]))


def handover_check(s, expect_ok, expect_fail=()):
    args = ["handover", "check", "--node", s.b.node, "--kubeconfig", s.k.kubeconfig,
            "--nvml-endpoint", s.b.nvml_url]
    p = dynmig_cli(s, *args, check=False)
    out = p.stdout + p.stderr
    log("    dynmig handover check: exit %d\n%s" % (p.returncode, "\n".join("      " + l for l in out.splitlines())))
    if expect_ok and p.returncode != 0:
        raise StepFailed("dynmig handover check failed (exit %d):\n%s" % (p.returncode, out))
    if not expect_ok:
        if p.returncode == 0:
            raise StepFailed("dynmig handover check passed, expected it to FAIL on %s" % (expect_fail,))
        for word in expect_fail:
            if word not in out:
                raise StepFailed("dynmig handover check does not say %r:\n%s" % (word, out))
    return out


def unprovable(s, dyn_alloc, got):
    """An instance made by hand while a container's devices cannot be read (its NVIDIA_VISIBLE_DEVICES names a
    path, the volume-mounts strategy): no holder can be proven or ruled out, so it is unproven, kept, and never
    destroyed, also across a device-plugin restart."""
    b = s.b
    s.step("a pod whose NVIDIA_VISIBLE_DEVICES names a path (devices unreadable) runs")
    s.create(legacy_pod(s, "opaque-env", "", env={"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
                        resources=False))
    plain_running(s, "opaque-env")
    s.step("an instance made by hand in a free slot")
    items = nvml_items(b.nvml())
    used = [(i["placement"]["start"], i["placement"]["size"]) for i in items.values()]
    free = [u for u in range(7) if not any(st <= u < st + sz for st, sz in used)]
    if not free:
        raise StepFailed("no free slice for the hand-made instance: %s" % used)
    made = dynmig_cli(s, "nvml", "--state", b.sim_state, "create", "--gpu", "0", "--profile", "1g.5gb",
                      "--placement", str(free[0]), "--output", "json").stdout
    uuid = re.search(r"MIG-[0-9a-f-]+", made)
    if not uuid:
        raise StepFailed("dynmig nvml create printed no MIG UUID: %s" % made)
    uuid = uuid.group(0)

    def unproven():
        # Destroyed is what NVML says (the simulator's state), not the view: a restarting plugin's view may lag.
        if uuid not in sim_uuids(s):
            raise StepFailed("the hand-made instance %s was destroyed" % uuid)
        i = nvml_items(b.nvml()).get(uuid)
        if i is None:
            return None  # the view is not refreshed yet
        return i.get("unproven")
    reason = wait_for("the hand-made instance reported unproven", unproven, 60)
    log("    unproven: %s" % reason)
    if "opaque-env" not in reason:
        raise StepFailed("the unproven reason does not name the pod whose devices cannot be read: %s" % reason)
    inst = nvml_items(b.nvml())[uuid]

    def published():
        node = s.k.json("get", "node", b.node)
        held = json.loads(node["metadata"].get("annotations", {}).get(HELD) or "[]")
        return [h for h in held if h["gpuUUID"] == inst["gpuUUID"] and h["placement"] == inst["placement"]
                and h["reason"].startswith("unproven")]
    log("    %s: %s" % (HELD, wait_for("the unproven instance published in " + HELD, published, 60)))
    # Exactly the proof blocks the handover: the instance is published, nothing else is in the way.
    out = handover_check(s, expect_ok=False, expect_fail=("unproven",))
    for line in out.splitlines():
        if ("handover-overlap" in line or "handover-allocator" in line) and "PASS" not in line:
            raise StepFailed("dynmig handover check: only handover-proof should FAIL: %s" % line)
    s.step("a device-plugin restart keeps it, still unproven")
    b.restart_device_plugin()
    time.sleep(5)  # a few reconciles
    wait_for("the hand-made instance unproven after the restart", unproven, 60)
    if uuid not in sim_uuids(s):
        raise StepFailed("the hand-made instance %s was destroyed across the restart" % uuid)
    s.step("the pod ends: the instance is free and cleaned like any free one")
    s.delete("opaque-env")
    s.gone("opaque-env")
    wait_for("the hand-made instance no longer unproven", lambda: not unproven(), 60)


def kubelet_restart(s, before, got):
    """What the kubelet does with running pods of a resource whose plugin is gone when it restarts (within the
    endpoint's grace period: capacity still listed, allocatable 0). Logged in full for docs/operations.md."""
    s.step("restart the kubelet while legacy pods run and their plugin is gone")
    names = ("legacy-1g-b", "legacy-2g")
    res_before = node_mig_resources(s)
    t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kubelet_lines = s.b.restart_kubelet()
    phases = []
    deadline = time.monotonic() + 30  # the pod workers sync every pod again after the restart
    while time.monotonic() < deadline:
        phases.append(tuple((n, (s.k.pod(n) or {}).get("status", {}).get("phase")) for n in names))
        time.sleep(2)
    res_after = node_mig_resources(s)
    for n in names:
        pod = s.k.pod(n)
        events = [e for e in s.k.events(n) if (e.get("lastTimestamp") or e.get("eventTime") or "") >= t0]
        log("    kubelet restart, pod %s: phase %s, containers %s -> %s, conditions %s" % (
            n, pod["status"].get("phase") if pod else None, before[n], s.b.container_ids(pod) if pod else None,
            [(c["type"], c["status"]) for c in pod["status"].get("conditions", [])] if pod else None))
        log("    events of %s since the restart: %s" % (n, [(e.get("type"), e.get("reason"), e.get("message"))
                                                         for e in events]))
    log("    phases every 2 s for 30 s after the restart: %s" % sorted(set(phases)))
    log("    node nvidia.com/mig-* before the restart %s, after %s" % (res_before, res_after))
    for line in kubelet_lines:
        log("    kubelet: %s" % line)
    expect_unrestarted(s, {x: before[x] for x in names})
    expect_held(s, {x: got[x] for x in names})



# --- handover of HAMi's legacy MIG pods (issue 29) ----------------------------------------------------------------

# HAMi's scheduler ConfigMap before dynamic MIG: its default knownMigGeometries entry of the A100 40GB, plus one
# geometry an operator added (the ConfigMap is theirs to edit). HAMi's defaults fill the whole GPU, and dynmig keeps
# a legacy instance nobody holds while its GPU is busy (the untracked rule), so a default geometry would leave no
# slice for a dynamic pod beside the legacy ones; the added one (2g + 1g, at slices 4 and 6) leaves slices 0-3.
HAMI_CONFIG = """nvidia:
  knownMigGeometries:
    - models: ["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"]
      allowedGeometries:
        - - {name: 1g.5gb, core: 14, memory: 5120, count: 7}
        - - {name: 1g.5gb, core: 14, memory: 5120, count: 1}
          - {name: 2g.10gb, core: 28, memory: 10240, count: 3}
        - - {name: 3g.20gb, core: 42, memory: 20480, count: 2}
        - - {name: 7g.40gb, core: 100, memory: 40960, count: 1}
        - - {name: 2g.10gb, core: 28, memory: 10240, count: 1}
          - {name: 1g.5gb, core: 14, memory: 5120, count: 1}
"""
HAMI_TEMPLATE = 4  # the added 2g + 1g geometry, laid out by mig-parted
# pod -> (the slot HAMi's scheduler chose: GPU-<uuid>[4-<slot>], the template entry's memory and cores)
HAMI = {"hami-2g": (0, 10240, 28), "hami-1g": (1, 5120, 14)}


def hami_pod(s, name, gpu_uuid, slot):
    """A pod as HAMi's scheduler left it after Bind: bound to the node, its devices `GPU-<uuid>[t-s]`, bind-phase
    allocating; HAMi's device plugin then finds it at Allocate."""
    now = str(int(time.time()))
    dev = "%s[%d-%d],NVIDIA,%d,%d:;" % (gpu_uuid, HAMI_TEMPLATE, slot[0], slot[1], slot[2])
    ann = {"hami.io/vgpu-node": s.b.node, "hami.io/vgpu-time": now, "hami.io/bind-time": now,
           "hami.io/bind-phase": "allocating", "hami.io/vgpu-devices-allocated": dev,
           "hami.io/vgpu-devices-to-allocate": dev}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": ann, "labels": {"hami.io/vgpu-node": s.b.node}},
            "spec": {"nodeName": s.b.node, "schedulerName": "hami-scheduler", "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "workload", "image": s.image, "command": ["sh", "-c", "sleep 3600"],
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


def sim_mig_devices(s):
    """GPU 0's UUID and its MIG UUIDs in the driver's MIG device index order (GI id, then CI id), from the
    simulator's state: what nvmlDeviceGetMigDeviceHandleByIndex enumerates."""
    out = json.loads(dynmig_cli(s, "nvml", "--state", s.b.sim_state, "instances", "--output", "json").stdout)
    g = out["gpus"][0]
    devices = []
    for gi in sorted(g.get("gpuInstances", []), key=lambda x: x["id"]):
        for ci in sorted(gi.get("computeInstances", []), key=lambda x: x["id"]):
            devices.append(ci["migUUID"])
    return g["uuid"], devices


def gpu_resource(s):
    st = s.k.json("get", "node", s.b.node)["status"]
    return {f: st.get(f, {}).get("nvidia.com/gpu") for f in ("capacity", "allocatable")}


def handover_hami(s):
    b = s.b
    extra = []  # what this scenario changed beyond pods: undone in `finally`
    config = os.path.join(tempfile.mkdtemp(prefix="dynmig-e2e-hami-"), "hami-device-config.yaml")
    with open(config, "w") as f:
        f.write(HAMI_CONFIG)
    try:
        handover_hami_steps(s, extra, config)
    finally:
        log("    handover cleanup")
        b.stop_hami_allocator()
        if "webhooks-removed" in extra:
            b.install_webhooks()
        if "plugin-stopped" in extra:
            b.start_dynmig_plugin()


def handover_hami_steps(s, extra, config):
    b = s.b
    s.step("dynmig's device plugin leaves the node")
    b.stop_dynmig_plugin()
    extra.append("plugin-stopped")
    s.step("HAMi's legacy geometry %d (2g.10gb + 1g.5gb), laid out as mig-parted does" % HAMI_TEMPLATE)
    print(dynmig_cli(s, "nvml", "--state", b.sim_state, "apply-geometry", "--hami-config", config,
                     "--hami-geometry", str(HAMI_TEMPLATE)).stdout, end="", flush=True)
    gpu_uuid, devices = sim_mig_devices(s)
    s.step("HAMi's legacy device plugin (stand-in) serves nvidia.com/gpu")
    b.start_hami_allocator(config)
    log("    node nvidia.com/gpu while HAMi's plugin serves: %s" % gpu_resource(s))
    s.step("dynmig's webhooks removed: the HAMi pods predate dynmig")
    b.remove_webhooks()
    extra.append("webhooks-removed")
    s.step("HAMi's scheduler's pods, bound to the node, get their template slots from HAMi's plugin")
    before, got = {}, {}
    for n, slot in HAMI.items():  # one at a time: without HAMi's node lock the plugin takes the oldest
        s.create(hami_pod(s, n, gpu_uuid, slot))
        pod = plain_running(s, n)
        before[n] = b.container_ids(pod)
        seen = wait_for("the container of %s to see its MIG device" % n, lambda: b.visible_devices(pod), 30)
        if seen != [devices[slot[0]]]:
            raise StepFailed("HAMi pod %s ([%d-%d]) sees %s, expected MIG device %d: %s" % (
                n, HAMI_TEMPLATE, slot[0], seen, slot[0], devices[slot[0]]))
        ann = s.k.pod(n)["metadata"].get("annotations", {})
        if ann.get(BIND_PHASE) != "success" or ann.get("hami.io/vgpu-devices-to-allocate") != ";":
            raise StepFailed("HAMi pod %s: bind-phase %r, to-allocate %r: HAMi's plugin did not write back" % (
                n, ann.get(BIND_PHASE), ann.get("hami.io/vgpu-devices-to-allocate")))
        got[n] = seen[0]
        log("    %s: [%d-%d] -> %s, containers %s" % (n, HAMI_TEMPLATE, slot[0], got[n], before[n]))
    s.step("dynmig's webhooks back")
    b.install_webhooks()
    extra.remove("webhooks-removed")

    s.step("HAMi's plugin leaves the node; dynmig's comes back")
    offset = b.kubelet_log_offset() if isinstance(b, RealBackend) else 0
    b.stop_hami_allocator()
    if isinstance(b, RealBackend):
        wait_for("the kubelet to drop nvidia.com/gpu allocatable to 0",
                 lambda: gpu_resource(s)["allocatable"] == "0", 60)
    log("    node nvidia.com/gpu once HAMi's plugin stopped: %s" % gpu_resource(s))
    for n in HAMI:
        pod = s.k.pod(n)
        log("    %s while no plugin serves nvidia.com/gpu: phase %s, containers %s" % (
            n, pod["status"].get("phase"), b.container_ids(pod)))
    b.start_dynmig_plugin()
    extra.remove("plugin-stopped")
    if isinstance(b, RealBackend):
        wait_for("the kubelet to list dynmig's nvidia.com/gpu devices",
                 lambda: gpu_resource(s)["allocatable"] not in (None, "0"), 60)
    log("    node nvidia.com/gpu once dynmig's plugin serves: %s" % gpu_resource(s))
    if isinstance(b, RealBackend):
        for line in b.kubelet_lines(offset, ("nvidia.com/gpu", "nvidia-gpu.sock", "hami-")):
            log("    kubelet: %s" % line)

    s.step("the HAMi pods still run, not restarted; dynmig proves each instance's holder")
    expect_unrestarted(s, before)
    expect_held(s, got)
    s.step("dynmig handover check passes")
    handover_check(s, expect_ok=True)

    s.step("a dynamic pod runs beside them, in the free slices")
    s.create(s.mig_pod("dyn-beside-hami", 4000))
    pod, allocs = s.running("dyn-beside-hami")
    s.expect_realized("dyn-beside-hami", pod, allocs)
    items = nvml_items(b.nvml())
    for n, u in got.items():
        if overlap(allocs[0], items[u]):
            raise StepFailed("dyn-beside-hami's instance %s overlaps %s's instance %s" % (
                allocs[0]["placement"], n, items[u]["placement"]))

    s.step("deleting one HAMi pod frees exactly its instance")
    s.delete("hami-2g")
    s.gone("hami-2g")
    s.reclaimed([got["hami-2g"]])
    live = s.instances()
    if got["hami-1g"] not in live or allocs[0]["migUUID"] not in live:
        raise StepFailed("another pod's instance was destroyed: live %s" % sorted(live))
    expect_unrestarted(s, {"hami-1g": before["hami-1g"]})

    s.step("the rest end: their instances are reclaimed")
    s.delete("hami-1g", "dyn-beside-hami")
    s.gone("hami-1g", "dyn-beside-hami")
    s.reclaimed([got["hami-1g"], allocs[0]["migUUID"]])
    s.no_warnings("hami-1g", "dyn-beside-hami")


def kube_eviction_honours_a_pdb(s):
    """The Eviction API (pods/NAME/eviction) with a PodDisruptionBudget, in the policy versions the server serves:
    refused with 429 while the budget allows no disruption, accepted once it does, and never twice for one."""
    labels = {"dynmig-e2e": "eviction"}
    names = ["evict-a", "evict-b"]
    pdb = "evict-budget"

    def raw(path, body, check=False):
        return s.k.run("create", "--raw", path, "-f", "-", input=json.dumps(body), check=check)

    def eviction(pod, api_version, name=None, dry_run=False):
        body = {"apiVersion": api_version, "kind": "Eviction",
                "metadata": {"name": name or pod, "namespace": NS}}
        if dry_run:
            body["deleteOptions"] = {"dryRun": ["All"]}
        return raw("/api/v1/namespaces/%s/pods/%s/eviction" % (NS, pod), body)

    def budget():
        return s.k.json("-n", NS, "get", "poddisruptionbudgets." + pdb_version.split("/")[1] + ".policy", pdb)

    def settled(want_allowed):
        def check():
            b = budget()
            st = b.get("status", {})
            return (st.get("observedGeneration", 0) >= b["metadata"].get("generation", 1)
                    and st.get("expectedPods") == 2 and st.get("disruptionsAllowed") == want_allowed) and st
        return wait_for("budget %s observed with disruptionsAllowed %d" % (pdb, want_allowed), check, 60)

    s.step("discovery: which policy versions the server serves")
    core = json.loads(s.k.run("get", "--raw", "/api/v1").stdout)
    entry = [r for r in core["resources"] if r["name"] == "pods/eviction"]
    if not entry:
        raise StepFailed("GET /api/v1 lists no pods/eviction subresource")
    eviction_version = "%s/%s" % (entry[0].get("group", "policy"), entry[0].get("version", "v1beta1"))
    pdb_version = "policy/v1" if s.k.run("get", "--raw", "/apis/policy/v1", check=False).returncode == 0 \
        else "policy/v1beta1"
    log("    pods/eviction takes %s; PodDisruptionBudgets served as %s" % (eviction_version, pdb_version))
    if eviction_version not in ("policy/v1", "policy/v1beta1"):
        raise StepFailed("unexpected Eviction version %s" % eviction_version)

    s.step("two plain pods with one label, Running and Ready")
    for n in names:
        s.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "labels": labels},
                  "spec": {"nodeName": s.b.node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                           "containers": [{"name": "main", "image": s.image, "command": ["sh", "-c", "sleep 3600"]}]}})

    def ready(n):
        pod = s.k.pod(n)
        return pod and pod["status"].get("phase") == "Running" and any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
    wait_for("pods %s Running and Ready" % names, lambda: all(ready(n) for n in names))
    try:
        s.step("a PodDisruptionBudget with minAvailable 2 (%s)" % pdb_version)
        s.k.apply({"apiVersion": pdb_version, "kind": "PodDisruptionBudget", "metadata": {"name": pdb},
                   "spec": {"minAvailable": 2, "selector": {"matchLabels": labels}}})
        st = settled(0)
        log("    budget status: %s" % json.dumps(st, sort_keys=True))

        s.step("evicting while the budget allows no disruption: 429, the pod stays")
        p = eviction("evict-a", eviction_version)
        if p.returncode == 0 or "TooManyRequests" not in p.stderr or "disruption budget" not in p.stderr:
            raise StepFailed("eviction under an exhausted budget: rc %d, %s %s" % (p.returncode, p.stdout, p.stderr))
        log("    refused: %s" % p.stderr.strip())
        if not ready("evict-a"):
            raise StepFailed("evict-a is not running after a refused eviction")

        s.step("hostile Evictions: another pod's name, an unknown version: 400, the pod stays")
        p = eviction("evict-a", eviction_version, name="evict-b")
        if p.returncode == 0 or "BadRequest" not in p.stderr:
            raise StepFailed("an Eviction naming another pod: rc %d, %s" % (p.returncode, p.stderr.strip()))
        log("    other name: %s" % p.stderr.strip())
        p = eviction("evict-a", "policy/v2")
        if p.returncode == 0 or "BadRequest" not in p.stderr:
            raise StepFailed("an Eviction of policy/v2: rc %d, %s" % (p.returncode, p.stderr.strip()))
        log("    policy/v2: %s" % p.stderr.strip())
        if eviction_version == "policy/v1beta1":
            p = eviction("evict-a", "policy/v1", dry_run=True)
            log("    policy/v1 where only v1beta1 is served: rc %d, %s" % (p.returncode, p.stderr.strip()))
            if p.returncode == 0 or "BadRequest" not in p.stderr:
                raise StepFailed("a policy/v1 Eviction on a v1beta1-only server: rc %d, %s" % (
                    p.returncode, p.stderr.strip()))
        if not ready("evict-a"):
            raise StepFailed("evict-a is not running after refused evictions")

        s.step("minAvailable 1: one eviction passes, the pod goes")
        s.k.run("-n", NS, "patch", "poddisruptionbudgets." + pdb_version.split("/")[1] + ".policy", pdb,
                "--type", "merge", "-p", json.dumps({"spec": {"minAvailable": 1}}))
        settled(1)
        p = eviction("evict-a", eviction_version, dry_run=True)
        if p.returncode != 0 or not ready("evict-a"):
            raise StepFailed("a dry-run eviction: rc %d, %s; the pod %s" % (
                p.returncode, p.stderr.strip(), "stays" if ready("evict-a") else "went"))
        if budget()["status"].get("disruptionsAllowed") != 1:
            raise StepFailed("a dry-run eviction took a disruption: %s" % budget()["status"])
        p = eviction("evict-a", eviction_version)
        if p.returncode != 0:
            raise StepFailed("eviction with a disruption allowed: rc %d, %s" % (p.returncode, p.stderr.strip()))
        s.gone("evict-a")

        s.step("the budget is spent: the second pod's eviction is refused")
        p = eviction("evict-b", eviction_version)
        if p.returncode == 0 or "TooManyRequests" not in p.stderr:
            raise StepFailed("a second eviction under minAvailable 1: rc %d, %s" % (p.returncode, p.stderr.strip()))
        if not ready("evict-b"):
            raise StepFailed("evict-b is not running after a refused eviction")
        log("    budget status after: %s" % json.dumps(budget().get("status", {}), sort_keys=True))
    finally:
        s.k.run("-n", NS, "delete", "poddisruptionbudgets." + pdb_version.split("/")[1] + ".policy", pdb,
                "--ignore-not-found", check=False)


# --- active defragmentation (issue 30) -------------------------------------------------------------------------------

# The defragmenter as both backends run it for the suite: on, serving a pod that has waited 4 s, looking every 2 s
# (tools/real-k8s/translate.py gives the real cluster's scheduler the same; deploy/ has it off). Only the
# defragmentation scenario runs controller-owned MIG pods, and the defragmenter never evicts a pod without a
# controller: main() checks after every other scenario that it evicted nothing there.
DEFRAG_ARGS = ["--defrag", "on", "--defrag-wait", "4s", "--defrag-interval", "2s"]
DEFRAG_RESERVATION = "dynmig.io/defrag-reservation"
DEFRAG_REASONS = ("DefragEvicted", "DefragWouldEvict", "DefragPlanned", "DefragEvictionRefused", "DefragFailed")
DEFRAG_LABEL = {"dynmig-e2e": "defrag"}


def defrag_events(k):
    """{uid: "reason on ns/name: message"} of every defragmenter Event in the cluster."""
    out = {}
    for e in k.json("get", "events", "-A")["items"]:
        if e.get("reason") in DEFRAG_REASONS:
            o = e.get("involvedObject", {})
            out[e["metadata"]["uid"]] = "%s on %s/%s: %s" % (e["reason"], o.get("namespace"), o.get("name"),
                                                              e.get("message"))
    return out


def defrag_holds(k, node):
    ann = k.json("get", "node", node)["metadata"].get("annotations", {})
    return json.loads(ann.get(DEFRAG_RESERVATION) or "[]")


def replica_set(s, name, annotations=None):
    """A ReplicaSet of one 1g pod (4000 MiB) labelled DEFRAG_LABEL and app=NAME, ending within 2 s of a deletion."""
    labels = dict(DEFRAG_LABEL, app=name)
    ann = dict({"nvidia.com/vgpu-mode": "mig"}, **(annotations or {}))
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": ann},
                                  "spec": {"terminationGracePeriodSeconds": 2, "containers": [
                                      {"name": "workload", "image": s.image, "command": ["sh", "-c", "sleep 3600"],
                                       "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}}}]}}}}


def rs_pods(s, rs):
    """The live (not terminating) pods whose controller is ReplicaSet `rs`."""
    pods = s.k.json("-n", NS, "get", "pods", "-l", "app=" + rs)["items"]
    return [p for p in pods if p["metadata"].get("deletionTimestamp") is None and any(
        r.get("controller") and r.get("kind") == "ReplicaSet" and r.get("name") == rs
        for r in p["metadata"].get("ownerReferences", []))]


def rs_running(s, rs, not_uid=None):
    """(pod, allocations) of the ReplicaSet's one pod once it runs with its instance (another than not_uid)."""
    name = wait_for("ReplicaSet %s's pod%s" % (rs, " (a new one)" if not_uid else ""), lambda: [
        p["metadata"]["name"] for p in rs_pods(s, rs) if p["metadata"]["uid"] != not_uid])[0]
    s.created.add(name)
    return s.running(name)


def expect_start(what, allocs, starts):
    got = sorted(a["placement"]["start"] for a in allocs)
    if got != sorted(starts):
        raise StepFailed("%s landed at slices %s, the scenario steers it to %s (did the planner's packing change?)" %
                         (what, got, sorted(starts)))


def defrag_metric(s, result="evicted"):
    status, body = https_get(s.b.extender_url + "/metrics")
    if status != 200:
        raise StepFailed("GET /metrics answered %s: %s" % (status, body[:200]))
    m = re.search(r'(?m)^dynmig_scheduler_defrag_evictions_total\{result="%s"\} (\S+)$' % result, body)
    return float(m.group(1)) if m else 0.0


def fragment_gpu(s):
    """GPU 0 with a ReplicaSet's 1g pod at slice 0 (defrag-mover) and an opted-out ReplicaSet's younger 1g pod at
    slice 4 (defrag-keeper: dynmig.io/defrag=never), slices 1-3 and 5-7 free: no 3g.20gb placement is free, a
    3g.20gb fits once one of them moves. Returns (mover pod, keeper pod)."""
    s.step("GPU 0 entirely free in the scheduler's view (earlier scenarios' slices released)")

    def all_free():
        status, body = https_get(s.b.extender_url + "/metrics")
        if status != 200:
            return None
        free = re.search(r'(?m)^dynmig_scheduler_gpu_free_slices\{[^}]*node="%s"[^}]*\} (\S+)$' % s.b.node, body)
        total = re.search(r'(?m)^dynmig_scheduler_gpu_slices\{[^}]*node="%s"[^}]*\} (\S+)$' % s.b.node, body)
        ok = free and total and float(free.group(1)) == float(total.group(1)) and not defrag_holds(s.k, s.b.node)
        if not ok and not first_busy:
            # What holds the slices, for the log if the wait is long (it once took 64 s, untraced).
            p = dynmig_cli(s, "layout", "--node", s.b.node, "-o", "json", "--kubeconfig", s.k.kubeconfig, check=False)
            first_busy.append((time.monotonic(), p.stdout[-3000:] + p.stderr[-500:]))
        return ok
    first_busy = []
    t0 = time.monotonic()
    wait_for("every slice of %s's GPU free (dynmig_scheduler_gpu_free_slices)" % s.b.node, all_free, 90)
    if first_busy and time.monotonic() - t0 > 15:
        log("    slow (%.1f s): the layout when the wait began: %s" % (time.monotonic() - t0, first_busy[0][1]))
    s.step("ReplicaSet defrag-mover: its 1g pod takes slice 0")
    s.k.run("-n", NS, "create", "-f", "-", input=json.dumps(replica_set(s, "defrag-mover")))
    mover, mover_allocs = rs_running(s, "defrag-mover")
    expect_start("defrag-mover's pod", mover_allocs, [0])
    s.step("a bare filler pod of three 1g instances takes slices 1-3")
    filler = s.mig_pod("defrag-filler", 4000)
    filler["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 3
    s.create(filler)
    _, fill = s.running("defrag-filler")
    expect_start("defrag-filler", fill, [1, 2, 3])
    s.step("ReplicaSet defrag-keeper (dynmig.io/defrag: never), created later: its 1g pod takes slice 4")
    s.k.run("-n", NS, "create", "-f", "-", input=json.dumps(replica_set(s, "defrag-keeper",
                                                                         {"dynmig.io/defrag": "never"})))
    keeper, allocs = rs_running(s, "defrag-keeper")
    expect_start("defrag-keeper's pod", allocs, [4])
    s.step("the filler ends: slices 1-3 and 5-7 are free, no 3g.20gb placement is")
    s.delete("defrag-filler")
    s.gone("defrag-filler")
    s.reclaimed([a["migUUID"] for a in fill])
    return mover, keeper


def remove_replica_sets(s):
    s.k.run("-n", NS, "delete", "replicaset", "defrag-mover", "defrag-keeper", "--ignore-not-found", check=False)
    s.k.run("-n", NS, "delete", "pod", "-l", "dynmig-e2e=defrag", "--grace-period=2", "--wait=false",
            "--ignore-not-found", check=False)
    left = [p["metadata"]["name"] for p in s.k.json("-n", NS, "get", "pods", "-l", "dynmig-e2e=defrag")["items"]]
    if left:
        s.gone(*left)
    wait_for("the ReplicaSets' pods gone", lambda: not s.k.json("-n", NS, "get", "pods", "-l",
                                                                "dynmig-e2e=defrag")["items"])


def defrag_off_evicts_nothing(s):
    """The local backend: the same fragmentation on a second `dynmig local` with the defragmenter off (its default):
    the 3g pod waits longer than the suite's --defrag-wait plus two intervals, and nothing is evicted or reserved."""
    off = LocalBackend(s.b.dynmig, s.b.kubectl, defrag=False)
    off.start()
    try:
        o = Suite(off, s.image)
        mover, keeper = fragment_gpu(o)
        o.step("[defragmenter off] a 19000 MiB pod waits 12 s (the suite's --defrag-wait 4s, --defrag-interval 2s)")
        o.create(o.mig_pod("defrag-big", 19000))
        o.pending_reason("defrag-big")
        time.sleep(12)
        pod = o.k.pod("defrag-big")
        now = [p["metadata"]["uid"] for p in rs_pods(o, "defrag-mover")]
        if pod["status"].get("phase") != "Pending" or now != [mover["metadata"]["uid"]] or defrag_holds(
                o.k, off.node) or defrag_events(o.k) or defrag_metric(o) != 0:
            raise StepFailed("with --defrag off: big %s, mover pods %s (was %s), reservations %s, events %s" % (
                pod["status"].get("phase"), now, mover["metadata"]["uid"], defrag_holds(o.k, off.node),
                defrag_events(o.k)))
        log("    off: after 12 s defrag-big still Pending, %s not evicted, no reservation, no Defrag event" %
            mover["metadata"]["name"])
    finally:
        off.stop()


def defrag_evicts_the_blocking_pod(s):
    """Issue 30 end to end: a 3g.20gb pod waits behind a ReplicaSet's 1g pod; after --defrag-wait the defragmenter
    reserves slices 0-3 on the Node, evicts that pod through the Eviction API (policy/v1beta1 on v1.20), the
    ReplicaSet recreates it outside the reserved slices and the 3g pod runs in them. The opted-out pod, which the
    rules would otherwise prefer (the younger plan), is never evicted. Local backend: first the same with the
    defragmenter off, nothing evicted."""
    t0 = time.monotonic()
    if s.b.name == "local":
        defrag_off_evicts_nothing(s)
        log("    [defragmenter off] %.1f s" % (time.monotonic() - t0))
    before = defrag_metric(s)
    t0 = time.monotonic()
    try:
        mover, keeper = fragment_gpu(s)
        t1 = time.monotonic()
        if s.b.name == "local":
            # The kubelet stand-in ends a deleted pod at once (the real kubelet takes seconds to stop it): the
            # in-memory API server answers the eviction 4 s late, the window in which explain is read.
            s.k.run("create", "--raw", "/_dynmig/faults", "-f", "-", input=json.dumps({
                "method": "POST", "pathPrefix": "/api/v1/namespaces/%s/pods/%s/eviction" % (
                    NS, mover["metadata"]["name"]), "count": 1, "action": "delay", "latencyMs": 4000}))
        s.step("a 19000 MiB pod (3g.20gb) waits: fragmented")
        s.create(s.mig_pod("defrag-big", 19000))
        _, reason = s.pending_reason("defrag-big")
        log("    reason: %s" % reason)
        created = time.monotonic()
        s.step("after --defrag-wait: slices 0-3 reserved for it on the Node, the mover named as evicted")
        mover_key = "%s/%s" % (NS, mover["metadata"]["name"])

        def reserved():
            return [h for h in defrag_holds(s.k, s.b.node) if h.get("pod") == NS + "/defrag-big"]
        hold = wait_for("%s naming default/defrag-big" % DEFRAG_RESERVATION, reserved, 60, 0.3)[0]
        log("    reserved %.1f s after the pod's creation: %s" % (time.monotonic() - created, json.dumps(hold)))
        if (hold["placement"] != {"start": 0, "size": 4} or hold["profile"] != "3g.20gb"
                or hold["evicted"] != [mover_key]):
            raise StepFailed("the reservation is not slices 0-3 (3g.20gb) evicting %s: %s" % (mover_key, hold))
        s.step("dynmig explain shows the trail while it waits")
        kube = ["--kubeconfig", s.k.kubeconfig]
        want = "waiting: defragmentation of %s on %s evicted %s; reserved slices 0-3 (3g.20gb) until" % (
            hold["gpuUUID"], s.b.node, mover_key)

        last = []

        def trail():
            p = dynmig_cli(s, "explain", "-n", NS, "defrag-big", *kube, check=False)
            last[:] = [p.stdout + p.stderr]
            return p.stdout if want in p.stdout else None
        try:
            text = wait_for("explain's defragmentation trail", trail, 20, 0.2)
        except StepFailed as e:
            raise StepFailed("%s: %r not in:\n%s" % (e, want, last[0] if last else ""))
        log("    explain: %s" % [l for l in text.splitlines() if l.startswith("waiting: defrag")][0])
        s.step("the mover was evicted with an Event; the ReplicaSet recreates it outside slices 0-3")
        s.gone(mover["metadata"]["name"], timeout=90)
        ev = [e for e in s.k.events(mover["metadata"]["name"]) if e.get("reason") == "DefragEvicted"]
        if not ev or "reserved for default/defrag-big (3g.20gb)" not in ev[0].get("message", ""):
            raise StepFailed("no DefragEvicted event on %s naming the waiting pod: %s" % (mover_key, ev))
        log("    event on %s: %s" % (mover["metadata"]["name"], ev[0]["message"]))
        moved, moved_allocs = rs_running(s, "defrag-mover", not_uid=mover["metadata"]["uid"])
        if any(overlap(a, {"placement": {"start": 0, "size": 4}}) for a in moved_allocs):
            raise StepFailed("the recreated pod %s landed in the reserved slices: %s" % (
                moved["metadata"]["name"], moved_allocs))
        s.expect_realized(moved["metadata"]["name"], moved, moved_allocs, "1g.5gb")
        log("    recreated: %s at slice %d" % (moved["metadata"]["name"], moved_allocs[0]["placement"]["start"]))
        s.step("the 3g pod runs in the reserved slices")
        pod, allocs = s.running("defrag-big", timeout=POD_TIMEOUT + 30)
        s.expect_realized("defrag-big", pod, allocs, "3g.20gb")
        expect_start("defrag-big", allocs, [0])
        log("    defrag-big Running at slices 0-3 %.1f s after its creation" % (time.monotonic() - created))
        # This pod's events only: a suite run earlier on the same cluster left events of its own defrag-big.
        ev = [e for e in s.k.events("defrag-big") if e.get("reason") == "DefragEvicted" and
              e.get("involvedObject", {}).get("uid") == pod["metadata"]["uid"]]
        want_ev = "evicted %s; slices 0-3 (3g.20gb) reserved for this pod until" % mover_key
        if not ev or want_ev not in ev[0].get("message", ""):
            raise StepFailed("no DefragEvicted event on defrag-big saying %r: %s" % (want_ev, ev))
        s.step("the opted-out pod was never touched; the reservation is tidied; the metric counts one eviction")
        now = rs_pods(s, "defrag-keeper")
        if [p["metadata"]["uid"] for p in now] != [keeper["metadata"]["uid"]] or now[0]["status"].get(
                "phase") != "Running":
            raise StepFailed("the opted-out pod %s was moved or stopped: %s" % (keeper["metadata"]["name"], [
                (p["metadata"]["name"], p["status"].get("phase")) for p in now]))
        others = [e for e in defrag_events(s.k).values() if "defrag-keeper" in e]
        if others:
            raise StepFailed("defragmenter events on the opted-out pod: %s" % others)
        wait_for("the reservation dropped once the pod is placed", lambda: not reserved(), 30)
        after = defrag_metric(s)
        if after - before != 1:
            raise StepFailed("dynmig_scheduler_defrag_evictions_total{result=\"evicted\"} went %g -> %g, expected +1"
                             % (before, after))
        log("    metric evicted %g -> %g; fragmentation %.1f s, defragmentation to Running %.1f s" % (
            before, after, t1 - t0, time.monotonic() - created))
    finally:
        remove_replica_sets(s)


# --- issue 31: MIG mode per GPU ------------------------------------------------------------------------------------
GPU_MODE = "dynmig.io/gpu-mode"
GPU_MODE_REQUEST = "dynmig.io/gpu-mode-request"
MODE_SIM = "H100 80GBx2"
# Switching on for H100s, 10 s of hysteresis (the shortest the config takes), so a GPU may switch back soon.
MODE_SWITCHING = ("  migModeSwitching:\n    enabled: true\n    minModeDuration: 10s\n    rules:\n"
                  "      - models: [\"H100\"]\n")


def with_mode_switching(text):
    """device-config.yaml with MODE_SWITCHING added under its top-level nvidia: section."""
    if "migModeSwitching" in text:
        raise StepFailed("the device config already has migModeSwitching")
    m = re.search(r"(?m)^nvidia:\s*\n", text)
    if not m:
        raise StepFailed("the device config has no top-level nvidia: section")
    return text[:m.end()] + MODE_SWITCHING + text[m.end():]


class ModeNode:
    """The node mig_mode_per_gpu runs on: `s` the Suite that reaches it, the simulator's state file behind it."""

    def __init__(self, s, sim_state):
        self.s, self.sim_state = s, sim_state

    def nvml(self, *args):
        return dynmig_cli(self.s, "nvml", "--state", self.sim_state, *args).stdout

    @property
    def uuids(self):
        """GPU UUIDs by NVML index."""
        return re.findall(r"(?m)^GPU \d+: .*\(UUID: (GPU-[0-9a-f-]+)", self.nvml("list"))


def whole_pod(s, name):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"nvidia.com/vgpu-mode": "hami-core"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "workload", "image": s.image, "command": ["sh", "-c", "sleep 3600"],
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


def gpu_modes(s):
    """{uuid: status entry} of dynmig.io/gpu-mode, {uuid: request} of dynmig.io/gpu-mode-request, {uuid: register
    device} of hami.io/node-nvidia-register."""
    ann = s.k.json("get", "node", s.b.node)["metadata"].get("annotations", {})
    status = {e["gpuUUID"]: e for e in json.loads(ann.get(GPU_MODE) or "[]")}
    req = {e["gpuUUID"]: e for e in json.loads(ann.get(GPU_MODE_REQUEST) or "[]")}
    reg = {d.get("id"): d for d in json.loads(ann.get(REGISTER) or "[]")}
    return status, req, reg


def wait_mode(s, uuid, mode, timeout=90):
    def check():
        status, _, reg = gpu_modes(s)
        st, d = status.get(uuid), reg.get(uuid)
        if st and d and st.get("mode") == mode and st.get("phase") == "steady" and d.get("mode") == mode and \
                d.get("health", True):
            return st
        return None
    return wait_for("GPU %s in mode %s (status and register)" % (uuid, mode), check, timeout)


def whole_running(s, name, timeout=POD_TIMEOUT):
    """Waits until the whole-GPU pod runs; returns (pod, the GPU UUID its reservation names)."""
    pod = plain_running(s, name, timeout)
    ann = pod["metadata"].get("annotations", {})
    if ann.get(BIND_PHASE) != "success":
        pod = wait_for("pod %s bind-phase success" % name,
                       lambda: (lambda p: p if p["metadata"]["annotations"].get(BIND_PHASE) == "success" else None)(
                           s.k.pod(name)), 30)
        ann = pod["metadata"]["annotations"]
    if ALLOC in ann and json.loads(ann[ALLOC] or "[]"):
        raise StepFailed("whole-GPU pod %s has MIG allocations: %s" % (name, ann[ALLOC]))
    devs = [d for d in ann.get("hami.io/vgpu-devices-allocated", "").replace(";", ":").split(":") if d]
    if len(devs) != 1:
        raise StepFailed("pod %s: hami.io/vgpu-devices-allocated is %r, expected one whole GPU" %
                         (name, ann.get("hami.io/vgpu-devices-allocated")))
    uuid = devs[0].split(",")[0]
    seen = wait_for("the container of %s to see its GPU" % name, lambda: s.b.visible_devices(pod), 30)
    if seen != [uuid]:
        raise StepFailed("the container of %s sees %s, its reservation names %s" % (name, seen, uuid))
    return pod, uuid


def mig_mode_per_gpu(outer):
    """Issue 31 on a node of two simulated H100s (Hopper: a switch needs no GPU reset), switching allowed by the
    device config. GPU 1 starts with MIG off. A whole-GPU pod runs on it beside MIG pods on GPU 0; a waiting MIG pod
    switches the idle whole GPU to MIG (never while the whole-GPU pod uses it); a whole-GPU pod later switches the
    idle MIG GPU 0 back; a GPU whose host needs a reboot for a switch is reported, keeps its mode, and explain says
    so. Local backend: a second `dynmig local`; real: the device plugin and the config changed, then restored."""
    with outer.b.mode_node(outer) as m:
        s = m.s
        try:
            mode_steps(s, m)
        finally:
            s.cleanup()


def mode_steps(s, m):
    uuids = m.uuids
    if len(uuids) != 2:
        raise StepFailed("the mode node's simulator lists %s, expected two GPUs" % uuids)
    s.step("GPU 0 is published as a MIG GPU, GPU 1 (MIG off) as a whole GPU; both may switch")
    wait_mode(s, uuids[0], "mig")
    st = wait_mode(s, uuids[1], "hami-core")
    if not st.get("switchable"):
        raise StepFailed("GPU 1's status says it may not switch: %s" % st)
    s.step("a whole-GPU pod runs on GPU 1 beside two 3g pods on GPU 0")
    s.create(whole_pod(s, "whole-a"))
    s.create(s.mig_pod("mig-a", 40000))
    s.create(s.mig_pod("mig-b", 40000))
    _, got = whole_running(s, "whole-a")
    if got != uuids[1]:
        raise StepFailed("whole-a got %s, expected the whole GPU %s" % (got, uuids[1]))
    a = s.running("mig-a")[1][0]
    b = s.running("mig-b")[1][0]
    if {a["gpuUUID"], b["gpuUUID"]} != {uuids[0]}:
        raise StepFailed("the MIG pods are on %s, expected GPU 0 only" % {a["gpuUUID"], b["gpuUUID"]})
    s.step("a third 3g pod waits; GPU 1 is in use, so nothing switches")
    s.create(s.mig_pod("mig-c", 40000))
    s.pending_reason("mig-c")
    # Until GPU 1's hysteresis (10 s from its "since") is over and two decision rounds (2 s each) more.
    since = gpu_modes(s)[0][uuids[1]]["since"] / 1000.0
    time.sleep(min(15, max(5, since + 10 + 5 - time.time())))
    status, req, _ = gpu_modes(s)
    if req or status[uuids[1]]["mode"] != "hami-core":
        raise StepFailed("a GPU in use was asked to switch: requests %s, status %s" % (req, status))
    s.step("whole-a ends: the idle whole GPU switches to MIG and mig-c runs there")
    t = time.monotonic()
    s.delete("whole-a")
    s.gone("whole-a")
    wait_mode(s, uuids[1], "mig", timeout=120)
    log("    GPU 1 published in MIG mode %.1f s after whole-a's deletion" % (time.monotonic() - t))
    c_pod, c_allocs = s.running("mig-c", timeout=120)
    c = c_allocs[0]
    if c["gpuUUID"] != uuids[1]:
        raise StepFailed("mig-c runs on %s, expected the switched GPU %s" % (c["gpuUUID"], uuids[1]))
    s.expect_realized("mig-c", c_pod, c_allocs, "3g.40gb")
    log("    mig-c Running on the switched GPU %.1f s after whole-a's deletion" % (time.monotonic() - t))
    s.step("a whole-GPU pod waits; mig-a and mig-b end: GPU 0 switches to a whole GPU for it")
    s.create(whole_pod(s, "whole-b"))
    s.pending_reason("whole-b")
    t = time.monotonic()
    s.delete("mig-a", "mig-b")
    s.gone("mig-a", "mig-b")
    s.reclaimed([a["migUUID"], b["migUUID"]])
    log("    their instances reclaimed %.1f s after the deletion" % (time.monotonic() - t))
    wait_mode(s, uuids[0], "hami-core", timeout=120)
    log("    GPU 0 published whole %.1f s after the deletion" % (time.monotonic() - t))
    _, got = whole_running(s, "whole-b", timeout=120)
    if got != uuids[0]:
        raise StepFailed("whole-b got %s, expected GPU 0 %s" % (got, uuids[0]))
    log("    whole-b Running on GPU 0 %.1f s after the MIG pods' deletion" % (time.monotonic() - t))
    s.step("mig-c kept its instance through both switches")
    pod, allocs = s.running("mig-c", timeout=30)
    if allocs[0]["migUUID"] != c["migUUID"]:
        raise StepFailed("mig-c's instance changed: %s -> %s" % (c["migUUID"], allocs[0]["migUUID"]))
    s.expect_realized("mig-c", pod, allocs)
    s.step("GPU 1's host needs a reboot for a switch: a waiting whole-GPU pod gets it refused, reported, kept")
    s.delete("mig-c")
    s.gone("mig-c")
    s.reclaimed([c["migUUID"]])
    m.nvml("reboot-required", "--gpu", "1")
    s.create(whole_pod(s, "whole-c"))

    def refused():
        status, _, _ = gpu_modes(s)
        st = status.get(uuids[1], {})
        return st if st.get("phase") == "refused" and "reboot" in st.get("reason", "") else None
    st = wait_for("GPU 1's status: refused, needs a reboot", refused, 120)
    log("    status: %s" % json.dumps(st))
    if st.get("mode") != "mig" or st.get("switchable"):
        raise StepFailed("after the refusal GPU 1 should stay MIG and not switchable: %s" % st)
    mode = m.nvml("mig-mode", "--gpu", "1")
    if "MIG enabled" not in mode or "pending" in mode:
        raise StepFailed("GPU 1's MIG mode was left changed: %s" % mode.strip())
    log("    NVML: %s" % mode.strip())
    s.step("explain says why whole-c waits: GPU 1 needs a reboot")
    want = "needs a reboot"
    last = []

    def said():
        p = dynmig_cli(s, "explain", "-n", NS, "whole-c", "--kubeconfig", s.k.kubeconfig, check=False)
        last[:] = [p.stdout + p.stderr]
        return p.stdout if want in p.stdout else None
    try:
        text = wait_for("explain naming the reboot", said, 30)
    except StepFailed as e:
        raise StepFailed("%s: %r not in:\n%s" % (e, want, last[0] if last else ""))
    log("    explain: %s" % [l.strip() for l in text.splitlines() if want in l][0])
    if s.k.pod("whole-c")["status"].get("phase") != "Pending":
        raise StepFailed("whole-c is not Pending")


SCENARIOS = [
    ("scenario 1: create and delete one 1g pod", scenario1_create_and_delete_one_1g),
    ("scenario 2: several non-overlapping 1g on one GPU", scenario2_several_non_overlapping_1g),
    ("scenario 3: mixed 1g/2g/3g (examples/mig-mixed.yaml)", scenario3_mixed_example),
    ("scenarios 4+5: Pending when full, the freed placement reused", scenario4_5_pending_when_full_then_reuse),
    ("scenario 6: device-plugin restart adopts running workloads", scenario6_device_plugin_restart_adopts),
    ("checklist: node capability matches NVML", checklist_node_capability),
    ("IN_USE on destroy is retried until the holder lets go", in_use_destroy_retried),
    ("a cordoned GPU takes no new pod, its running pod stays", gpu_cordon_keeps_running_takes_no_new),
    ("checklist: users cannot edit the reservation", checklist_user_cannot_edit_reservation),
    ("checklist: users cannot write any protocol annotation", checklist_users_cannot_write_protocol_annotations),
    ("checklist: only kube-scheduler binds (no client certificate: refused)", checklist_only_kube_scheduler_binds),
    ("example: the canary (examples/mig-canary.yaml)", example_canary),
    ("example: preference 4g (examples/mig-prefer-4g.yaml)", example_preference),
    ("example: a typo is refused (examples/mig-typo.yaml)", example_typo_refused),
    ("example: a short job ends and is reclaimed (examples/mig-short-job.yaml)", example_short_job),
    ("attack 1: a pod asking 50000 instances stalls nothing", attack1_huge_instance_count),
    ("attack 2: a deeply nested AdmissionReview crashes nothing", attack2_deep_json_to_the_webhook),
    ("attack 3: no GPU pod reaches a node around dynmig", attack3_node_name_around_the_scheduler),
    ("attack 4: a routing annotation cannot be removed to block a node", attack4_routing_annotation_removed),
    ("attack 5: a recreated pod keeps no node lock", attack5_recreated_pod_keeps_no_lock),
    ("attack 6: endpoints show no tenant's pod names to other pods", attack6_endpoints_expose_no_pod_names),
    ("kube: the Eviction API honours a PodDisruptionBudget", kube_eviction_honours_a_pdb),
    ("monitoring: a real Prometheus scrapes dynmig and an alert fires (fragmentation)",
     prometheus_alert_fires_on_fragmentation),
    # Last: it moves dynmig's device plugin off the node for a while and restores it.
    ("handover: legacy pods kept without draining (handover_no_drain)", handover_no_drain),
    ("handover: HAMi's legacy MIG pods kept without draining (handover_hami)", handover_hami),
    ("defragmentation: a waiting 3g pod gets the slices of an evicted ReplicaSet pod, opted-out pods stay",
     defrag_evicts_the_blocking_pod),
    # Last: it changes the device config and the device plugin's GPUs for a while and restores them.
    ("MIG mode per GPU: whole-GPU and MIG pods side by side, idle GPUs switched, a reboot reported",
     mig_mode_per_gpu),
]
# The scenarios in which the defragmenter may evict; after every other one main() checks it did not.
DEFRAG_SCENARIOS = {defrag_evicts_the_blocking_pod}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["local", "real"], required=True)
    ap.add_argument("--kubectl", default=os.environ.get("KUBECTL") or shutil.which("kubectl"))
    ap.add_argument("--kubeconfig", help="real: the cluster's admin kubeconfig")
    ap.add_argument("--node", default="localhost", help="real: the GPU node")
    ap.add_argument("--nvml-url", default="http://127.0.0.1:19401/nvml", help="real: the device plugin's /nvml")
    ap.add_argument("--extender-url", default="https://127.0.0.1:18443",
                    help="real: the dynmig extender as kube-scheduler reaches it")
    ap.add_argument("--logs-cmd", default="", help="real: a command whose stderr shows the cluster's logs")
    ap.add_argument("--dynmig", default=os.path.join(REPO, "build", "bin", "dynmig"), help="the binary (local: the local mode; both: the nvml CLI and the handover commands)")
    ap.add_argument("--image", default="localhost/busybox:local", help="the image the pods run")
    ap.add_argument("--only", default="", help="run the scenarios whose title contains this text ('A|B': either)")
    a = ap.parse_args()
    if not a.kubectl:
        print("scenarios: kubectl not found (--kubectl)", file=sys.stderr)
        return 2
    if a.backend == "real":
        if not a.kubeconfig:
            print("scenarios: --backend real needs --kubeconfig", file=sys.stderr)
            return 2
        backend = RealBackend(a.kubectl, a.kubeconfig, a.node, a.nvml_url, a.logs_cmd, a.extender_url, a.dynmig)
    else:
        backend = LocalBackend(a.dynmig, a.kubectl)
    passed, failed = [], []
    t0 = time.monotonic()
    try:
        backend.start()
        suite = Suite(backend, a.image)
        seen_defrag = defrag_events(backend.kube)
        for title, fn in SCENARIOS:
            if a.only and not any(part in title for part in a.only.split("|")):
                continue
            log("== %s [%s]" % (title, backend.name))
            t = time.monotonic()
            try:
                fn(suite)
                suite.cleanup()
                now = defrag_events(backend.kube)
                new = [v for u, v in now.items() if u not in seen_defrag]
                seen_defrag = now
                if new and fn not in DEFRAG_SCENARIOS:
                    suite.step_name = "the defragmenter evicted nothing in this scenario"
                    raise StepFailed("the defragmenter acted in a scenario without controller-owned pods: %s" % new)
                passed.append(title)
                log("   ok (%.1f s)" % (time.monotonic() - t))
            except Exception as e:
                failed.append(title)
                detail = str(e) if isinstance(e, StepFailed) else traceback.format_exc()
                print("FAILED [%s backend] %s, step: %s\n  %s" % (backend.name, title, suite.step_name, detail),
                      flush=True)
                print(backend.diagnostics(), flush=True)
                try:
                    suite.cleanup()
                except Exception as ce:
                    print("  cleanup after the failure did not finish: %s" % ce, flush=True)
    except Exception as e:
        failed.append("backend start")
        print("FAILED [%s backend] start: %s" % (backend.name, e), flush=True)
        print(backend.diagnostics(), flush=True)
    finally:
        backend.stop()
    log("%s backend: %d scenarios in %.1f s" % (backend.name, len(passed) + len(failed), time.monotonic() - t0))
    for f in failed:
        print("  failed: %s" % f)
    print("%d passed, %d failed" % (len(passed), len(failed)))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""A real Kubernetes v1.20 on 127.0.0.1 for dynmig's end-to-end suite.

  cluster.py up        etcd, kube-apiserver (TLS, Node+RBAC), controller-manager, kube-scheduler,
                       containerd (closed: nothing is ever pulled) and a kubelet; local images imported
  cluster.py deploy    dynmig from deploy/ (kubectl kustomize, translated for v1.20), the second
                       kube-scheduler with the dynmig extender, the device plugin on simulated GPUs
  cluster.py down      stops exactly what `up`/`deploy` started (PID files), wipes the state
  cluster.py logs      prints the tail of every component log
  cluster.py restart-kubelet   stops the kubelet and starts it again (the pods keep running in containerd)

Every wait is bounded and names what it waited for. Binaries come from build-k8s.sh's cache.
Ports (none collides with `dynmig local`): etcd 22379/22380, apiserver 16443, controller-manager 20257,
kube-scheduler 20259, dynmig kube-scheduler 20261 (healthz/metrics 127.0.0.1:20251), kubelet 20250
(healthz 20248), dynmig scheduler pod 18443, device-plugin metrics 19400 (/nvml on 127.0.0.1:19401).
"""
import argparse
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
VERSION = os.environ.get("RK_VERSION", "v1.20.2")
CACHE = os.environ.get("RK_CACHE", "/var/cache/dynmig-real-k8s/" + VERSION)
BIN = os.path.join(CACHE, "bin")
STATE = os.environ.get("RK_STATE", "/var/lib/dynmig-real-k8s")
RUN = "/run/dynmig-real-k8s"
KUBELET_DIR = "/var/lib/kubelet"  # deploy/ mounts /var/lib/kubelet/device-plugins
PKI = os.path.join(STATE, "pki")
LOGS = os.path.join(STATE, "logs")
PIDS = os.path.join(STATE, "pids")
ADMIN_KUBECONFIG = os.path.join(STATE, "admin.kubeconfig")

API_PORT = 16443
ETCD_CLIENT, ETCD_PEER = 22379, 22380
KCM_PORT, KS_PORT, DKS_PORT, DKS_HEALTH = 20257, 20259, 20261, 20251
KUBELET_PORT, KUBELET_HEALTHZ = 20250, 20248
SCHED_POD_PORT, DP_METRICS_PORT = 18443, 19400
SERVICE_CIDR, SERVICE_IP = "10.96.0.0/24", "10.96.0.1"
POD_SUBNET = "10.254.77.0/24"
BRIDGE = "dynmigrk0"
NODE = "localhost"
SIM_GPUS = os.environ.get("RK_SIM_GPUS", "A100-SXM4-40GBx1")
SIM_LATENCY = os.environ.get("RK_SIM_LATENCY", "")  # the device plugin's --sim-latency (empty: its default)
WARM = os.environ.get("RK_WARM_INSTANCES", "")  # "TTL,MAX_PER_GPU": nvidia.migWarmInstances on (empty: deploy/'s)

PAUSE_IMAGE = "localhost/dynmig-pause:1"
BUSYBOX_IMAGE = "localhost/busybox:local"
DYNMIG_IMAGE = "docker.io/library/dynmig:0.1.0"  # deploy/base: image dynmig, newTag 0.1.0


def log(msg):
    print("[real-k8s %s] %s" % (time.strftime("%H:%M:%S", time.gmtime()), msg), file=sys.stderr, flush=True)


class Failure(Exception):
    pass


def run(cmd, check=True, capture=True, input=None, timeout=120, env=None):
    try:
        p = subprocess.run(cmd, input=input, capture_output=capture, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise Failure("%s did not finish within %d s" % (" ".join(cmd), timeout))
    if check and p.returncode != 0:
        raise Failure("%s exited %d: %s" % (" ".join(cmd), p.returncode, (p.stderr or p.stdout or "").strip()[-2000:]))
    return p


def wait_for(what, predicate, timeout, interval=0.5, logs=()):
    """Polls predicate() until it returns a true value; raises naming `what` and tails `logs` if not."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Failure:  # the predicate saw something that will not get better (a process exited)
            raise
        except Exception as e:  # the condition is not there yet
            last_error = e
        time.sleep(interval)
    detail = " (last error: %s)" % last_error if last_error else ""
    for name in logs:
        tail_log(name)
    raise Failure("timed out after %d s waiting for %s%s" % (timeout, what, detail))


def tail_log(name, lines=40):
    path = os.path.join(LOGS, name + ".log")
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            content = f.readlines()[-lines:]
        print("---- last %d lines of %s ----" % (len(content), path), file=sys.stderr)
        sys.stderr.write("".join(content))
        print("---- end of %s ----" % path, file=sys.stderr, flush=True)


# --- processes ----------------------------------------------------------------------------------------------------

def start(name, cmd, env=None):
    os.makedirs(LOGS, exist_ok=True)
    os.makedirs(PIDS, exist_ok=True)
    out = open(os.path.join(LOGS, name + ".log"), "ab")
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, env=full_env)
    with open(os.path.join(PIDS, name + ".pid"), "w") as f:
        f.write("%d %s\n" % (p.pid, os.path.basename(cmd[0])))
    # Until the child has exec'd, /proc/PID/cmdline is still python's, and alive() would call a
    # component that is starting dead (seen under load: "kubelet exited" with an empty log).
    deadline = time.monotonic() + 10
    while p.poll() is None and not alive(p.pid, os.path.basename(cmd[0])) and time.monotonic() < deadline:
        time.sleep(0.01)
    log("started %s (pid %d)" % (name, p.pid))
    return p


def alive(pid, exe):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    return os.path.basename(argv0) == exe


def pid_of(name):
    path = os.path.join(PIDS, name + ".pid")
    try:
        with open(path) as f:
            pid, exe = f.read().split()
        return int(pid), exe
    except (OSError, ValueError):
        return None


def running(name):
    p = pid_of(name)
    return p is not None and alive(*p)


def stop(name, grace=10):
    """Stops the process recorded in NAME.pid (only if it is still the program we started), and its group."""
    p = pid_of(name)
    path = os.path.join(PIDS, name + ".pid")
    if p is None:
        return
    pid, exe = p
    if alive(pid, exe):
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and alive(pid, exe):
                time.sleep(0.1)
            if not alive(pid, exe):
                break
        log("stopped %s (pid %d)" % (name, pid))
    os.unlink(path)


def check_alive(name):
    if not running(name):
        tail_log(name)
        raise Failure("%s exited (log: %s)" % (name, os.path.join(LOGS, name + ".log")))


# --- certificates -------------------------------------------------------------------------------------------------

def openssl(*args):
    run(["openssl"] + list(args))


def make_ca(name, cn):
    key, crt = os.path.join(PKI, name + ".key"), os.path.join(PKI, name + ".crt")
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key)
    openssl("req", "-x509", "-new", "-key", key, "-subj", "/CN=" + cn, "-days", "30", "-out", crt,
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")


def make_cert(name, subject, ca="ca", sans=None, server=False, client=False):
    key, csr, crt = (os.path.join(PKI, name + ext) for ext in (".key", ".csr", ".crt"))
    ext = os.path.join(PKI, name + ".ext")
    usages = []
    if server:
        usages.append("serverAuth")
    if client:
        usages.append("clientAuth")
    with open(ext, "w") as f:
        f.write("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n")
        f.write("extendedKeyUsage=%s\n" % ",".join(usages))
        if sans:
            f.write("subjectAltName=%s\n" % ",".join(sans))
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key)
    openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr)
    openssl("x509", "-req", "-in", csr, "-CA", os.path.join(PKI, ca + ".crt"), "-CAkey", os.path.join(PKI, ca + ".key"),
            "-CAcreateserial", "-days", "30", "-extfile", ext, "-out", crt)


def kubeconfig(path, user, cert=None, key=None, token=None):
    ca = base64.b64encode(open(os.path.join(PKI, "ca.crt"), "rb").read()).decode()
    u = {}
    if cert:
        u["client-certificate"] = cert
        u["client-key"] = key
    if token:
        u["token"] = token
    cfg = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": "real", "cluster": {"server": "https://127.0.0.1:%d" % API_PORT,
                                                     "certificate-authority-data": ca}}],
           "users": [{"name": user, "user": u}],
           "contexts": [{"name": "real", "context": {"cluster": "real", "user": user}}],
           "current-context": "real"}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    os.chmod(path, 0o600)


def make_pki():
    os.makedirs(PKI, exist_ok=True)
    make_ca("ca", "dynmig-real-k8s-ca")
    make_cert("apiserver", "/CN=kube-apiserver", server=True,
              sans=["IP:127.0.0.1", "IP:" + SERVICE_IP, "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
                    "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"])
    make_cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", client=True)
    make_cert("admin", "/O=system:masters/CN=kubernetes-admin", client=True)
    make_cert("controller-manager", "/CN=system:kube-controller-manager", client=True)
    make_cert("scheduler", "/CN=system:kube-scheduler", client=True)
    make_cert("kubelet", "/O=system:nodes/CN=system:node:" + NODE, client=True)
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", os.path.join(PKI, "sa.key"))
    openssl("pkey", "-in", os.path.join(PKI, "sa.key"), "-pubout", "-out", os.path.join(PKI, "sa.pub"))
    for name in ("admin", "controller-manager", "scheduler", "kubelet"):
        kubeconfig(os.path.join(STATE, name + ".kubeconfig"), name,
                   cert=os.path.join(PKI, name + ".crt"), key=os.path.join(PKI, name + ".key"))


# --- API helpers --------------------------------------------------------------------------------------------------

def kubectl_bin():
    # The kubectl built with the cluster (v1.20), as on a fresh machine; not whatever kubectl is on PATH.
    return os.environ.get("KUBECTL") or os.path.join(BIN, "kubectl")


def kubectl(*args, input=None, check=True, timeout=60):
    return run([kubectl_bin(), "--kubeconfig", ADMIN_KUBECONFIG] + list(args), input=input, check=check,
               timeout=timeout)


def api_get(path):
    ctx = ssl.create_default_context(cafile=os.path.join(PKI, "ca.crt"))
    ctx.load_cert_chain(os.path.join(PKI, "admin.crt"), os.path.join(PKI, "admin.key"))
    with urllib.request.urlopen("https://127.0.0.1:%d%s" % (API_PORT, path), context=ctx, timeout=5) as r:
        return r.read().decode()


def port_free(port, host="127.0.0.1"):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


# --- images -------------------------------------------------------------------------------------------------------

def build_images():
    images = os.path.join(STATE, "images")
    os.makedirs(images, exist_ok=True)
    dynmig = os.environ.get("RK_DYNMIG_BIN") or os.path.join(REPO, "build", "bin", "dynmig")
    if not os.access(dynmig, os.X_OK):
        raise Failure("%s is missing: build it first (make build)" % dynmig)
    run([sys.executable, os.path.join(HERE, "mkimage.py"), "--out", images, "--pause", PAUSE_IMAGE,
         "--busybox", BUSYBOX_IMAGE, "--dynmig", DYNMIG_IMAGE, "--dynmig-bin", dynmig], timeout=300)
    return images


def import_images(images):
    sock = os.path.join(RUN, "containerd.sock")
    for tar in sorted(os.listdir(images)):
        if tar.endswith(".tar"):
            run(["ctr", "--address", sock, "-n", "k8s.io", "images", "import", "--no-unpack",
                 os.path.join(images, tar)], timeout=180)
    out = run(["ctr", "--address", sock, "-n", "k8s.io", "images", "ls", "-q"]).stdout.split()
    for want in (PAUSE_IMAGE, BUSYBOX_IMAGE, DYNMIG_IMAGE):
        if want not in out:
            raise Failure("image %s is not in containerd after the import (have: %s)" % (want, " ".join(out)))
    log("images imported: %s" % ", ".join((PAUSE_IMAGE, BUSYBOX_IMAGE, DYNMIG_IMAGE)))


# --- up -----------------------------------------------------------------------------------------------------------

def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def containerd_config():
    root = os.path.join(STATE, "containerd")
    hosts = os.path.join(root, "certs.d")
    # Every registry host resolves to a closed port, so nothing is ever pulled (a pull fails at once).
    for host in ("_default", "docker.io", "localhost", "registry.k8s.io", "k8s.gcr.io", "gcr.io", "quay.io",
                 "ghcr.io"):
        write(os.path.join(hosts, host, "hosts.toml"),
              'server = "https://127.0.0.1:1"\n\n[host."https://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n')
    write(os.path.join(root, "cni", "10-dynmig-rk.conflist"), json.dumps({
        "cniVersion": "0.4.0", "name": "dynmig-rk",
        "plugins": [{"type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False, "hairpinMode": False,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                              "dataDir": os.path.join(root, "cni-ipam")}},
                    {"type": "loopback"}]}, indent=1))
    cfg = os.path.join(root, "config.toml")
    write(cfg, """version = 2
root = "{root}/root"
state = "{run}/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{run}/containerd.sock"
[ttrpc]
  address = "{run}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{root}/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{hosts}"
""".format(root=root, run=RUN, pause=PAUSE_IMAGE, hosts=hosts))
    return cfg


def kubelet_config():
    cfg = os.path.join(STATE, "kubelet.yaml")
    write(cfg, """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
oomScoreAdj: 0
clusterDomain: cluster.local
clusterDNS: ["10.96.0.10"]
resolvConf: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
""".format(port=KUBELET_PORT, healthz=KUBELET_HEALTHZ, ca=os.path.join(PKI, "ca.crt")))
    return cfg


def start_kubelet(sock):
    """The kubelet on containerd's socket SOCK, until node NODE is Ready."""
    start("kubelet", [
        os.path.join(BIN, "kubelet"), "--config", kubelet_config(), "--kubeconfig", os.path.join(STATE, "kubelet.kubeconfig"),
        "--container-runtime", "remote", "--container-runtime-endpoint", "unix://" + sock,
        "--runtime-request-timeout", "2m", "--hostname-override", NODE, "--cloud-provider=",
        "--pod-infra-container-image", PAUSE_IMAGE, "--root-dir", KUBELET_DIR,
        "--cert-dir", os.path.join(STATE, "kubelet-pki"), "--v=1"],
        env={"AWS_EC2_METADATA_DISABLED": "true"})

    def node_ready():
        check_alive("kubelet")
        node = json.loads(api_get("/api/v1/nodes/" + NODE))
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
    wait_for("node %s Ready" % NODE, node_ready, 120, interval=1, logs=["kubelet", "containerd"])


def cmd_restart_kubelet(args):
    """Stops the kubelet (SIGTERM, as systemd does) and starts it again: the pods' containers keep running in
    containerd meanwhile (tests/e2e-real/scenarios.py handover_no_drain watches what the kubelet does)."""
    if not running("kubelet"):
        raise Failure("the kubelet is not running")
    stop("kubelet")
    start_kubelet(os.path.join(RUN, "containerd.sock"))
    log("kubelet restarted")


def cmd_up(args):
    for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            raise Failure("%s/%s is missing: run tools/real-k8s/build-k8s.sh" % (BIN, b))
    for tool in ("etcd", "containerd", "runc", "ctr", "openssl"):
        if not shutil.which(tool):
            raise Failure("%s is not installed: run tools/real-k8s/install-deps.sh" % tool)
    if any(running(n) for n in ("etcd", "kube-apiserver", "containerd", "kubelet")):
        raise Failure("a real-k8s cluster is already running (tools/real-k8s/cluster.py down first)")
    wipe()
    def busy_ports():
        busy = [p for p in (API_PORT, ETCD_CLIENT, ETCD_PEER, KCM_PORT, KS_PORT, DKS_PORT, DKS_HEALTH, KUBELET_PORT,
                            KUBELET_HEALTHZ) if not port_free(p)]
        return busy + [p for p in (SCHED_POD_PORT, DP_METRICS_PORT, DP_METRICS_PORT + 1)
                       if not port_free(p, "0.0.0.0")]
    # Connections of a cluster that was just stopped keep a port for up to tcp_fin_timeout (FIN_WAIT2): wait that out.
    deadline = time.monotonic() + 75
    busy = busy_ports()
    if busy:
        log("waiting for ports %s to be released" % busy)
    while busy and time.monotonic() < deadline:
        time.sleep(1)
        busy = busy_ports()
    if busy:
        holders = run(["ss", "-tanp"], check=False).stdout.splitlines()
        held = [line for line in holders if any(":%d " % p in line for p in busy)]
        raise Failure("ports in use on this machine: %s (another real-k8s cluster or program?)\n%s" %
                      (busy, "\n".join(held[:20])))
    t0 = time.monotonic()
    os.makedirs(STATE, exist_ok=True)
    os.makedirs(RUN, exist_ok=True)
    make_pki()
    images = build_images()

    start("etcd", ["etcd", "--name", "rk", "--data-dir", os.path.join(STATE, "etcd"),
                   "--listen-client-urls", "http://127.0.0.1:%d" % ETCD_CLIENT,
                   "--advertise-client-urls", "http://127.0.0.1:%d" % ETCD_CLIENT,
                   "--listen-peer-urls", "http://127.0.0.1:%d" % ETCD_PEER,
                   "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % ETCD_PEER,
                   "--initial-cluster", "rk=http://127.0.0.1:%d" % ETCD_PEER,
                   "--unsafe-no-fsync", "--log-level", "warn"])
    wait_for("etcd health", lambda: b"true" in urllib.request.urlopen(
        "http://127.0.0.1:%d/health" % ETCD_CLIENT, timeout=2).read(), 30, logs=["etcd"])

    pki = lambda n: os.path.join(PKI, n)  # noqa: E731
    start("kube-apiserver", [
        os.path.join(BIN, "kube-apiserver"), "--etcd-servers", "http://127.0.0.1:%d" % ETCD_CLIENT,
        "--secure-port", str(API_PORT), "--insecure-port", "0", "--bind-address", "127.0.0.1",
        "--advertise-address", "127.0.0.1", "--tls-cert-file", pki("apiserver.crt"),
        "--tls-private-key-file", pki("apiserver.key"), "--client-ca-file", pki("ca.crt"),
        "--authorization-mode", "Node,RBAC", "--service-cluster-ip-range", SERVICE_CIDR,
        "--service-account-key-file", pki("sa.pub"), "--service-account-signing-key-file", pki("sa.key"),
        "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
        "--kubelet-client-certificate", pki("apiserver-kubelet-client.crt"),
        "--kubelet-client-key", pki("apiserver-kubelet-client.key"),
        "--kubelet-preferred-address-types", "Hostname,InternalIP",
        # Webhooks are called at their Service's endpoints (the pods are hostNetwork; there is no kube-proxy).
        "--enable-aggregator-routing=true",
        "--enable-admission-plugins", "NodeRestriction", "--allow-privileged=true",
        "--profiling=false", "--v=1"])
    wait_for("kube-apiserver /readyz", lambda: api_get("/readyz") == "ok", 90, logs=["kube-apiserver"])
    log("kube-apiserver ready on https://127.0.0.1:%d" % API_PORT)

    start("kube-controller-manager", [
        os.path.join(BIN, "kube-controller-manager"), "--kubeconfig", os.path.join(STATE, "controller-manager.kubeconfig"),
        "--authentication-kubeconfig", os.path.join(STATE, "controller-manager.kubeconfig"),
        "--authorization-kubeconfig", os.path.join(STATE, "controller-manager.kubeconfig"),
        "--bind-address", "127.0.0.1", "--secure-port", str(KCM_PORT), "--port", "0", "--leader-elect=false",
        "--use-service-account-credentials", "--root-ca-file", pki("ca.crt"),
        "--service-account-private-key-file", pki("sa.key"), "--cluster-signing-cert-file", pki("ca.crt"),
        "--cluster-signing-key-file", pki("ca.key"), "--controllers", "*,-nodeipam,-cloud-node-lifecycle",
        "--profiling=false", "--v=1"])
    start("kube-scheduler", [
        os.path.join(BIN, "kube-scheduler"), "--kubeconfig", os.path.join(STATE, "scheduler.kubeconfig"),
        "--authentication-kubeconfig", os.path.join(STATE, "scheduler.kubeconfig"),
        "--authorization-kubeconfig", os.path.join(STATE, "scheduler.kubeconfig"),
        "--bind-address", "127.0.0.1", "--secure-port", str(KS_PORT), "--port", "0", "--leader-elect=false",
        "--profiling=false", "--v=1"])

    os.makedirs(os.path.join(KUBELET_DIR, "device-plugins"), exist_ok=True)
    start("containerd", ["containerd", "--config", containerd_config()])
    sock = os.path.join(RUN, "containerd.sock")
    wait_for("containerd", lambda: run(["ctr", "--address", sock, "version"], check=False, timeout=10).returncode == 0,
             30, logs=["containerd"])
    import_images(images)

    start_kubelet(sock)
    wait_for("ServiceAccount default/default", lambda: api_get("/api/v1/namespaces/default/serviceaccounts/default"),
             60, logs=["kube-controller-manager"])
    for name in ("kube-controller-manager", "kube-scheduler"):
        check_alive(name)
    log("cluster up in %.1f s: KUBECONFIG=%s" % (time.monotonic() - t0, ADMIN_KUBECONFIG))


# --- deploy -------------------------------------------------------------------------------------------------------

def cmd_deploy(args):
    t0 = time.monotonic()
    sys.path.insert(0, HERE)
    import render  # noqa: E402  (PyYAML, only needed here)
    import translate  # noqa: E402
    # v1.20's kubectl embeds kustomize v2.0.3, which cannot render deploy/base: render.py does what kustomize v5
    # does for the fields deploy/ uses (tests/deploy compares the two where a recent kubectl exists).
    try:
        rendered = render.render(os.path.join(REPO, "deploy", "base"))
    except render.RenderError as e:
        raise Failure("rendering deploy/base: %s" % e)
    try:
        objects, ks_config = translate.translate(
            rendered, api_host="127.0.0.1", api_port=API_PORT, sched_port=SCHED_POD_PORT, dp_port=DP_METRICS_PORT,
            sim=SIM_GPUS, sim_latency=SIM_LATENCY, warm=WARM)
    except ValueError as e:
        raise Failure("translating deploy/base: %s" % e)
    manifest = os.path.join(STATE, "dynmig-deploy.json")
    with open(manifest, "w") as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, f, indent=1)
    # v1.20 does not label namespaces with their name; the webhooks' namespaceSelector relies on it.
    kubectl("label", "namespace", "kube-system", "kubernetes.io/metadata.name=kube-system", "--overwrite")
    kubectl("label", "node", NODE, "dynmig.io/mig=enabled", "--overwrite")
    kubectl("apply", "-f", manifest, timeout=120)
    log("applied deploy/base (translated for v1.20: %s)" % manifest)

    def job_done():
        job = json.loads(kubectl("-n", "dynmig-system", "get", "job", "dynmig-certgen", "-o", "json").stdout)
        if job["status"].get("failed", 0) >= 2:
            raise Failure("certgen Job failed: %s" % kubectl("-n", "dynmig-system", "logs", "job/dynmig-certgen",
                                                            check=False).stdout)
        return job["status"].get("succeeded", 0) >= 1
    wait_for("Job dynmig-system/dynmig-certgen to succeed", job_done, 120, interval=1,
             logs=["kubelet", "kube-controller-manager"])
    secret = json.loads(kubectl("-n", "dynmig-system", "get", "secret", "dynmig-tls", "-o", "json").stdout)
    ca = base64.b64decode(secret["data"]["ca.crt"])
    ca_path = os.path.join(STATE, "dynmig-ca.crt")
    with open(ca_path, "wb") as f:
        f.write(ca)
    # kube-scheduler's client certificate for the extender (deploy/ mounts client.crt/client.key of the same Secret
    # in the sidecar only; the host kube-scheduler reads them from the state directory).
    client_dir = os.path.join(STATE, "extender-client")
    os.makedirs(client_dir, mode=0o700, exist_ok=True)
    client = {}
    for key, file in (("client.crt", "tls.crt"), ("client.key", "tls.key")):
        if key not in secret["data"]:
            raise Failure("Secret dynmig-system/dynmig-tls has no %s (kube-scheduler's client certificate)" % key)
        client[file] = os.path.join(client_dir, file)
        fd = os.open(client[file], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(secret["data"][key]))

    # The second kube-scheduler, with the extender, as the dynmig-scheduler ServiceAccount (deploy/'s sidecar).
    token = wait_for("the dynmig-scheduler ServiceAccount token", lambda: sa_token("dynmig-system", "dynmig-scheduler"),
                     60)
    sa_kubeconfig = os.path.join(STATE, "dynmig-kube-scheduler.kubeconfig")
    kubeconfig(sa_kubeconfig, "dynmig-scheduler", token=token)
    config_path = os.path.join(STATE, "dynmig-kube-scheduler-config.yaml")
    with open(config_path, "w") as f:
        f.write(translate.scheduler_config(ks_config, kubeconfig=sa_kubeconfig, ca_file=ca_path,
                                           cert_file=client["tls.crt"], key_file=client["tls.key"],
                                           extender_port=SCHED_POD_PORT, health=DKS_HEALTH))
    start("dynmig-kube-scheduler", [
        os.path.join(BIN, "kube-scheduler"), "--config", config_path,
        "--authentication-kubeconfig", sa_kubeconfig, "--authorization-kubeconfig", sa_kubeconfig,
        "--bind-address", "127.0.0.1", "--secure-port", str(DKS_PORT), "--v=2"])

    def rollout(kind, name):
        return kubectl("-n", "dynmig-system", "rollout", "status", "%s/%s" % (kind, name), "--timeout=5s",
                       check=False).returncode == 0
    wait_for("Deployment dynmig-scheduler ready", lambda: rollout("deployment", "dynmig-scheduler"), 120, interval=1,
             logs=["kubelet"])
    try:
        wait_for("DaemonSet dynmig-device-plugin ready", lambda: rollout("daemonset", "dynmig-device-plugin"), 120,
                 interval=1, logs=["kubelet"])
    except Failure:
        for prev in ("--previous", None):
            out = kubectl("-n", "dynmig-system", "logs", "daemonset/dynmig-device-plugin", "--tail=40",
                          *([prev] if prev else []), check=False)
            print("---- device-plugin container log %s----\n%s%s" % (prev or "", out.stdout, out.stderr),
                  file=sys.stderr)
        raise

    def gpus_allocatable():
        check_alive("dynmig-kube-scheduler")
        node = json.loads(api_get("/api/v1/nodes/" + NODE))
        return int(node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) > 0
    wait_for("nvidia.com/gpu allocatable on node %s" % NODE, gpus_allocatable, 90, interval=1, logs=["kubelet"])
    wait_for("the dynmig kube-scheduler healthz", lambda: urllib.request.urlopen(
        "http://127.0.0.1:%d/healthz" % DKS_HEALTH, timeout=2).read() == b"ok", 30, logs=["dynmig-kube-scheduler"])
    log("dynmig deployed in %.1f s (device plugin on %s%s%s)" % (
        time.monotonic() - t0, SIM_GPUS, ", --sim-latency " + SIM_LATENCY if SIM_LATENCY else "",
        ", warm instances " + WARM if WARM else ""))


def sa_token(namespace, name):
    sa = json.loads(kubectl("-n", namespace, "get", "serviceaccount", name, "-o", "json").stdout)
    secrets = sa.get("secrets") or []
    if not secrets:
        return None
    s = json.loads(kubectl("-n", namespace, "get", "secret", secrets[0]["name"], "-o", "json").stdout)
    token = s.get("data", {}).get("token")
    return base64.b64decode(token).decode() if token else None


# --- down ---------------------------------------------------------------------------------------------------------

ORDER = ["dynmig-kube-scheduler", "kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]


def cmd_down(args):
    # The kubelet first; then the pods' containers through containerd (it kills shims and their tasks).
    stop("dynmig-kube-scheduler")
    stop("kubelet")
    sock = os.path.join(RUN, "containerd.sock")
    if running("containerd"):
        # Kill every task in containerd's k8s.io namespace (our containerd: our pods only).
        tasks = run(["ctr", "--address", sock, "-n", "k8s.io", "tasks", "ls", "-q"], check=False, timeout=30).stdout.split()
        for t in tasks:
            run(["ctr", "--address", sock, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", t], check=False, timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and run(["ctr", "--address", sock, "-n", "k8s.io", "tasks", "ls", "-q"],
                                                   check=False, timeout=30).stdout.split():
            time.sleep(0.5)
        for t in tasks:
            run(["ctr", "--address", sock, "-n", "k8s.io", "tasks", "delete", t], check=False, timeout=30)
    stop("containerd")
    kill_shims()
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        stop(name)
    if not args.keep_state:
        wipe()
    log("down")


def kill_shims():
    """containerd-shim-runc-v2 processes of our containerd (found by its state dir in their arguments)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0].decode(errors="replace")) == "containerd-shim-runc-v2" and \
                any((RUN + "/").encode() in a or (RUN + "/containerd.sock").encode() in a for a in argv):
            try:
                os.kill(int(pid), signal.SIGKILL)
                log("killed leftover shim %s" % pid)
            except ProcessLookupError:
                pass


def umount_under(prefix):
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for mp in sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], capture_output=True)


def wipe():
    if any(running(n) for n in ORDER + ["containerd"]):
        raise Failure("refusing to wipe the state while components run")
    for d in (os.path.join(STATE, "containerd"), RUN, os.path.join(KUBELET_DIR, "pods"),
              os.path.join(KUBELET_DIR, "plugins"), os.path.join(KUBELET_DIR, "plugins_registry"),
              os.path.join(KUBELET_DIR, "pod-resources")):
        umount_under(d)
    umount_under(KUBELET_DIR)
    for d in (STATE, RUN):
        if os.path.isdir(d):
            shutil.rmtree(d, ignore_errors=True)
    # The kubelet's directory: only what this harness's kubelet and device plugin wrote.
    if os.path.isdir(KUBELET_DIR):
        for entry in os.listdir(KUBELET_DIR):
            shutil.rmtree(os.path.join(KUBELET_DIR, entry), ignore_errors=True) if os.path.isdir(
                os.path.join(KUBELET_DIR, entry)) else os.unlink(os.path.join(KUBELET_DIR, entry))
    if os.path.exists("/sys/class/net/" + BRIDGE):
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def cmd_logs(args):
    if os.path.isdir(LOGS):
        for name in sorted(os.listdir(LOGS)):
            tail_log(name[:-4], args.lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up")
    sub.add_parser("deploy")
    d = sub.add_parser("down")
    d.add_argument("--keep-state", action="store_true", help="keep logs and state (for a post-mortem)")
    sub.add_parser("restart-kubelet")
    lg = sub.add_parser("logs")
    lg.add_argument("--lines", type=int, default=40)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("cluster.py: must run as root (containerd, kubelet)", file=sys.stderr)
        return 2
    try:
        {"up": cmd_up, "deploy": cmd_deploy, "down": cmd_down, "logs": cmd_logs,
         "restart-kubelet": cmd_restart_kubelet}[args.cmd](args)
    except Failure as e:
        log("FAILED: %s" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""deploy/base (as `kubectl kustomize` renders it) translated for the real-k8s harness: Kubernetes v1.20 on one
node, pods on the host network, no kube-proxy, no registry. Every change is listed here and in docs/real-k8s.md;
everything else is applied as deploy/ has it.

  API versions v1.20 lacks      PodDisruptionBudget policy/v1 -> policy/v1beta1
                                webhook matchConditions (v1.27+) dropped: dynmig's webhook itself lets other pods
                                and its own components' writes through
                                namespace label kubernetes.io/metadata.name (v1.21+) set on dynmig-system
                                (kube-system is labelled by cluster.py)
                                KubeSchedulerConfiguration v1 -> v1beta1 (scheduler_config())
  one node, no kube-proxy       pods of dynmig-system on the host network, KUBERNETES_SERVICE_HOST/PORT pointing at
                                the apiserver; the scheduler on port 18443, the device plugin's metrics on 19400 (/nvml on 127.0.0.1:19401);
                                one scheduler replica (two would want the same host port)
  no kube-scheduler image       the kube-scheduler sidecar runs as a host process with the same configuration, the
                                same ServiceAccount and the same client certificate (cluster.py deploy)
  no GPU                        the device plugin runs `--sim` with its simulator state on the host
                                (/var/lib/kubelet/device-plugins/dynmig/), no /proc/driver/nvidia-caps volume
  short scenarios               the scheduler's defragmenter on (DEFRAG_ARGS: off by default in deploy/), with a
                                wait of seconds for the suite's defragmentation scenario; the suite checks that no
                                other scenario sees an eviction (only that one runs controller-owned MIG pods)
"""
import copy
import re

import yaml


def _env_set(container, name, value):
    env = container.setdefault("env", [])
    env[:] = [e for e in env if e.get("name") != name]
    env.append({"name": name, "value": value})


def _replace_arg(args, flag, value):
    i = args.index(flag)
    args[i + 1] = value


def _host_network(spec, api_host, api_port):
    spec["hostNetwork"] = True
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        _env_set(c, "KUBERNETES_SERVICE_HOST", api_host)
        _env_set(c, "KUBERNETES_SERVICE_PORT", str(api_port))


def _with_warm(text, warm):
    """device-config.yaml with nvidia.migWarmInstances set from "TTL,MAX_PER_GPU" (the rest as it is)."""
    parts = warm.split(",")
    if len(parts) != 2 or not parts[0].strip() or not parts[1].strip().isdigit():
        raise ValueError("warm instances: %r is not TTL,MAX_PER_GPU (e.g. 10m,7)" % warm)
    cfg = yaml.safe_load(text)
    if "migWarmInstances" in (cfg.get("nvidia") or {}):
        raise ValueError("deploy/'s device-config.yaml sets nvidia.migWarmInstances already")
    line = "  migWarmInstances: {ttl: %s, maxPerGpu: %s}\n" % (parts[0].strip(), parts[1].strip())
    out, n = re.subn(r"(?m)^nvidia:\n", lambda m: m.group(0) + line, text, count=1)
    if n != 1:
        raise ValueError("deploy/'s device-config.yaml has no top-level nvidia: section")
    if yaml.safe_load(out)["nvidia"]["migWarmInstances"] != {"ttl": parts[0].strip(), "maxPerGpu": int(parts[1])}:
        raise ValueError("warm instances: could not set nvidia.migWarmInstances")
    return out


# The defragmenter as the scenario suite runs it (tests/e2e-real/scenarios.py passes the same to `dynmig local`).
DEFRAG_ARGS = ["--defrag", "on", "--defrag-wait", "4s", "--defrag-interval", "2s"]


def translate(rendered, api_host, api_port, sched_port, dp_port, sim, sim_latency="", warm="",
              cri_dir="/run/dynmig-real-k8s"):
    """rendered: deploy/base's objects (render.py), or their YAML stream. Returns (objects to apply, the
    KubeSchedulerConfiguration text of deploy/scheduler). sim_latency: the device plugin's --sim-latency (empty:
    none given); warm: "TTL,MAX_PER_GPU" turns warm instances on in device-config.yaml (empty: as deploy/ has it)."""
    objects = rendered if isinstance(rendered, list) else [o for o in yaml.safe_load_all(rendered) if o]
    out = []
    ks_config = None
    seen = set()
    for o in objects:
        o = copy.deepcopy(o)
        kind, name = o["kind"], o["metadata"]["name"]
        seen.add((kind, name))
        if kind == "Namespace":
            o["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        elif kind == "PodDisruptionBudget":
            o["apiVersion"] = "policy/v1beta1"
        elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for w in o["webhooks"]:
                w.pop("matchConditions", None)
        elif kind == "ConfigMap" and name.startswith("dynmig-device-config") and warm:
            o["data"]["device-config.yaml"] = _with_warm(o["data"]["device-config.yaml"], warm)
        elif kind == "ConfigMap" and name == "dynmig-kube-scheduler-config":
            ks_config = o["data"]["kube-scheduler-config.yaml"]
        elif kind == "Deployment" and name == "dynmig-scheduler":
            o["spec"]["replicas"] = 1
            spec = o["spec"]["template"]["spec"]
            spec["containers"] = [c for c in spec["containers"] if c["name"] != "kube-scheduler"]
            used = {v["name"] for c in spec["containers"] for v in c.get("volumeMounts", [])}
            spec["volumes"] = [v for v in spec["volumes"] if v["name"] in used]
            dynmig = spec["containers"][0]
            _replace_arg(dynmig["args"], "--listen", "0.0.0.0:%d" % sched_port)
            dynmig["args"] += DEFRAG_ARGS
            dynmig["ports"] = [{"name": "https", "containerPort": sched_port, "protocol": "TCP"}]
            _host_network(spec, api_host, api_port)
        elif kind == "DaemonSet" and name == "dynmig-device-plugin":
            spec = o["spec"]["template"]["spec"]
            spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "nvidia-caps"]
            c = spec["containers"][0]
            c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "nvidia-caps"]
            _replace_arg(c["args"], "--metrics-listen", "0.0.0.0:%d" % dp_port)
            # /nvml on the host's loopback (host network), where the harness reads it.
            _replace_arg(c["args"], "--nvml-listen", "127.0.0.1:%d" % (dp_port + 1))
            c["args"] += ["--sim", sim, "--sim-state", "/var/lib/kubelet/device-plugins/dynmig/sim-nvml.json"]
            if sim_latency:
                c["args"] += ["--sim-latency", sim_latency]
            # As deploy/overlays/monitoring starts it: /metrics also names the pod holding each MIG instance
            # (dynmig_mig_instance_info), which the Prometheus scenario reads back.
            c["args"] += ["--metrics-pod-identity"]
            # The harness's containerd listens in its own run directory, as containerd.sock.
            for v in spec["volumes"]:
                if v["name"] == "containerd":
                    v["hostPath"]["path"] = cri_dir
            c["ports"] = [{"name": "metrics", "containerPort": dp_port, "protocol": "TCP"}]
            _host_network(spec, api_host, api_port)
        elif kind == "Job" and name == "dynmig-certgen":
            _host_network(o["spec"]["template"]["spec"], api_host, api_port)
        out.append(o)
    for want in (("Deployment", "dynmig-scheduler"), ("DaemonSet", "dynmig-device-plugin"),
                 ("Job", "dynmig-certgen"), ("MutatingWebhookConfiguration", "dynmig-webhook")):
        if want not in seen:
            raise ValueError("deploy/base has no %s %s: the translation needs updating" % want)
    if ks_config is None:
        raise ValueError("deploy/base has no ConfigMap dynmig-kube-scheduler-config")
    return out, ks_config


def scheduler_config(v1_text, kubeconfig, ca_file, cert_file, key_file, extender_port, health):
    """deploy/scheduler/kube-scheduler-config.yaml (v1) as v1.20's kubescheduler.config.k8s.io/v1beta1, for a
    kube-scheduler on the host: the extender is reached at 127.0.0.1 with the Service's name as TLS server name, the
    CA and the client certificate (the sidecar's mounts of Secret dynmig-tls) are files on the host."""
    cfg = yaml.safe_load(v1_text)
    if cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        raise ValueError("unexpected kube-scheduler configuration version %r" % cfg.get("apiVersion"))
    cfg["apiVersion"] = "kubescheduler.config.k8s.io/v1beta1"
    cfg["clientConnection"] = {"kubeconfig": kubeconfig}
    # One host process, like the harness's other control-plane components: no leader election. With it, a lease
    # renewal that times out on a loaded machine ends kube-scheduler ("leaderelection lost"), and no kubelet
    # restarts a host process as it would restart the sidecar container.
    cfg["leaderElection"] = {"leaderElect": False}
    # Without these v1.20 serves plain HTTP on 0.0.0.0:10251.
    cfg["healthzBindAddress"] = "127.0.0.1:%d" % health
    cfg["metricsBindAddress"] = "127.0.0.1:%d" % health
    for ext in cfg.get("extenders", []):
        url = ext["urlPrefix"]
        host = url.split("://", 1)[1].split("/", 1)[0].split(":")[0]
        ext["urlPrefix"] = "https://127.0.0.1:%d" % extender_port
        tls = ext.setdefault("tlsConfig", {})
        tls.setdefault("serverName", host)
        tls["caFile"] = ca_file
        if "certFile" not in tls or "keyFile" not in tls:
            raise ValueError("the extender's tlsConfig has no client certificate (certFile/keyFile): the "
                             "translation needs updating")
        tls["certFile"], tls["keyFile"] = cert_file, key_file
    return "# deploy/scheduler/kube-scheduler-config.yaml translated by tools/real-k8s/translate.py\n" + yaml.safe_dump(
        cfg, sort_keys=False)

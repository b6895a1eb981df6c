#!/usr/bin/python3
"""The burst of issue 15 on the real cluster: N pods applied at once to one node, time from creation to Running.

Against a running cluster with dynmig deployed (cluster.py up + deploy; `make e2e-real-burst` brings one up with
8 simulated A100-SXM4-40GB and tears it down). For each kind, in this order:

  plain   N pods without a GPU (the default kube-scheduler), the harness's busybox image
  gpu     N pods of nvidia.com/gpu: 1, nvidia.com/gpumem: 4000 (1g.5gb), routed to dynmig-scheduler by the webhook

each round: one `kubectl apply` of the N pods, wait until all are Running, check, `kubectl delete`, wait until
they are gone (and, for gpu, until the device plugin's NVML view has no instance left). --bursts R repeats the
apply/delete round R times per kind.

Times come from a watch of the pods through the API (list, then watch from its resourceVersion, so no event is
missed): per pod, first seen (created), bound (spec.nodeName set) and Running (status.phase), on this machine's
clock; the API's own timestamps (creationTimestamp, the Ready condition's lastTransitionTime, 1 s resolution) are
printed beside them as a cross-check. Printed per round: p50/p99/max of creation-to-Running and of
creation-to-bound, the time from the apply to all Running, the Warning events of the round's pods by reason, and
at the end the ratio gpu/plain of the time to all Running.

Checked, not assumed (exit 1 otherwise): every pod Running within --timeout; gpu pods scheduled by
dynmig-scheduler with a complete hami.io/vgpu-mig-allocations; no two reservations overlap on a GPU and no MIG
UUID is given twice; every reserved MIG UUID is live in the device plugin's NVML view and the view has no other
instance; after the delete, no instance is left. --max-ratio R also fails when gpu/plain exceeds R.
Standard library only; --artifacts DIR keeps the timeline, the events and the dynmig and control-plane logs.
"""
import argparse
import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone

ALLOC = "hami.io/vgpu-mig-allocations"
IDLE = "dynmig.io/idle-mig-instances"
LABEL = "dynmig.io/burst"
NS = "default"
STATE = os.environ.get("RK_STATE", "/var/lib/dynmig-real-k8s")
BAD_WAITING = ("CreateContainerError", "CreateContainerConfigError", "ErrImagePull", "ImagePullBackOff",
               "ErrImageNeverPull", "RunContainerError", "CrashLoopBackOff")


class Failed(Exception):
    pass


def log(msg):
    print("[burst %s] %s" % (time.strftime("%H:%M:%S", time.gmtime()), msg), flush=True)


def api_time(text):
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


# --- the API: kubectl for what a user does, a direct watch for the times --------------------------------------------

class Kube:
    def __init__(self, kubectl, kubeconfig):
        self.kubectl, self.kubeconfig = kubectl, kubeconfig
        with open(kubeconfig) as f:
            cfg = json.load(f)  # cluster.py writes the kubeconfigs as JSON
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        self.server = cluster["server"]
        self.ca_dir = tempfile.mkdtemp(prefix="dynmig-burst-ca-")
        ca = os.path.join(self.ca_dir, "ca.crt")
        with open(ca, "wb") as f:
            f.write(base64.b64decode(cluster["certificate-authority-data"]))
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(user["client-certificate"], user["client-key"])

    def close(self):
        shutil.rmtree(self.ca_dir, ignore_errors=True)

    def run(self, *args, input=None, check=True, timeout=120):
        cmd = [self.kubectl, "--kubeconfig", self.kubeconfig] + list(args)
        try:
            p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failed("kubectl %s did not answer within %d s" % (" ".join(args), timeout))
        if check and p.returncode != 0:
            raise Failed("kubectl %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()[-2000:]))
        return p

    def json(self, *args):
        return json.loads(self.run(*(list(args) + ["-o", "json"])).stdout)

    def open(self, path, timeout):
        return urllib.request.urlopen(self.server + path, context=self.ctx, timeout=timeout)


class PodWatch(threading.Thread):
    """Records, per pod UID, when this machine first saw it, saw it bound, saw it Running and saw it deleted."""

    def __init__(self, kube):
        super().__init__(daemon=True)
        self.kube = kube
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.pods = {}  # uid -> {"name", "seen", "bound", "running", "deleted", "obj"}
        self.stopping = False
        self.error = None
        sel = urllib.parse.quote(LABEL)
        with kube.open("/api/v1/namespaces/%s/pods?labelSelector=%s" % (NS, sel), 30) as r:
            listed = json.loads(r.read())
        self.rv = listed["metadata"]["resourceVersion"]
        now = time.time()
        for obj in listed["items"]:
            self.record("ADDED", obj, now)

    def record(self, kind, obj, now):
        uid = obj["metadata"]["uid"]
        with self.lock:
            p = self.pods.setdefault(uid, {"name": obj["metadata"]["name"], "seen": now, "bound": None,
                                           "running": None, "deleted": None})
            p["obj"] = obj
            if p["bound"] is None and obj["spec"].get("nodeName"):
                p["bound"] = now
            if p["running"] is None and obj.get("status", {}).get("phase") == "Running":
                p["running"] = now
            if kind == "DELETED":
                p["deleted"] = now
            self.changed.notify_all()

    def run(self):
        sel = urllib.parse.quote(LABEL)
        while not self.stopping:
            path = "/api/v1/namespaces/%s/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=60&labelSelector=%s" \
                   "&resourceVersion=%s" % (NS, sel, self.rv)
            try:
                with self.kube.open(path, 90) as r:
                    while not self.stopping:
                        line = r.readline()
                        if not line:
                            break
                        ev = json.loads(line)
                        now = time.time()
                        if ev["type"] == "ERROR":
                            raise Failed("pod watch: %s" % ev["object"].get("message"))
                        self.rv = ev["object"]["metadata"]["resourceVersion"]
                        if ev["type"] != "BOOKMARK":
                            self.record(ev["type"], ev["object"], now)
            except Exception as e:  # a dropped connection is resumed from the last resourceVersion
                if isinstance(e, Failed):
                    with self.lock:
                        self.error = str(e)
                        self.changed.notify_all()
                    return
                if not self.stopping:
                    time.sleep(0.2)

    def wait(self, what, predicate, timeout):
        """Waits until predicate(pods) (called under the lock) is true; returns its value."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                if self.error:
                    raise Failed(self.error)
                value = predicate(self.pods)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Failed("timed out after %d s waiting for %s" % (timeout, what))
                self.changed.wait(min(left, 1.0))


# --- the device plugin's NVML view ----------------------------------------------------------------------------------

def nvml_instances(nvml_url):
    """The live instances of the device plugin's GET /nvml: (gpuUUID, start, size, profile) -> MIG UUIDs."""
    with urllib.request.urlopen(nvml_url, timeout=10) as r:
        view = json.loads(r.read())
    out = {}
    for g in view.get("gpus", []) if isinstance(view, dict) else []:
        for i in g.get("instances", []):
            p = i.get("placement", {})
            key = (g.get("uuid"), p.get("start"), p.get("size"), i.get("profile"))
            out[key] = sorted(c.get("migUUID") for c in i.get("computeInstances", []) if c.get("migUUID"))
    return out


def idle_listed(kube, node):
    """The node's dynmig.io/idle-mig-instances (warm instances) as a set of (gpuUUID, start, size, profile)."""
    value = kube.json("get", "node", node)["metadata"].get("annotations", {}).get(IDLE)
    out = set()
    for i in json.loads(value) if value else []:
        p = i.get("placement", {})
        out.add((i.get("gpuUUID"), p.get("start"), p.get("size"), i.get("profile")))
    return out


def not_idle(instances, idle):
    """MIG UUIDs of `instances` (nvml_instances) that the node's idle set does not list."""
    return sorted(u for key, uuids in instances.items() if key not in idle for u in uuids)


# --- one round ------------------------------------------------------------------------------------------------------

def pod_manifest(name, kind, tag, image):
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "workload", "image": image, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "sleep 3600"]}]}
    meta = {"name": name, "labels": {LABEL: tag}}
    if kind == "gpu":
        meta["annotations"] = {"nvidia.com/vgpu-mode": "mig"}
        spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def check_pods(pods, kind, node, live, idle_uuids=()):
    """The round's pods, all Running: node, scheduler, reservations (one 1g each, no overlap, no MIG UUID twice)
    and `live`, the MIG UUIDs of the NVML view: the reserved ones, and otherwise only `idle_uuids` (warm instances
    the node's dynmig.io/idle-mig-instances lists). Returns the problems found."""
    problems = []
    for p in pods:
        if p["spec"].get("nodeName") != node:
            problems.append("%s runs on %r, not %s" % (p["metadata"]["name"], p["spec"].get("nodeName"), node))
    if kind != "gpu":
        return problems
    by_gpu, uuids = {}, {}
    for p in pods:
        name = p["metadata"]["name"]
        if p["spec"].get("schedulerName") != "dynmig-scheduler":
            problems.append("%s has schedulerName %r" % (name, p["spec"].get("schedulerName")))
        value = p["metadata"].get("annotations", {}).get(ALLOC)
        allocs = json.loads(value) if value else []
        if len(allocs) != 1:
            problems.append("%s has %d entries in %s (want 1): %s" % (name, len(allocs), ALLOC, value))
            continue
        a = allocs[0]
        missing = [f for f in ("gpuUUID", "profile", "placement", "migUUID") if f not in a]
        if missing:
            problems.append("%s: %s lacks %s" % (name, ALLOC, ", ".join(missing)))
            continue
        if a["profile"] != "1g.5gb":
            problems.append("%s got %s, want 1g.5gb" % (name, a["profile"]))
        if a["migUUID"] in uuids:
            problems.append("MIG UUID %s given to %s and %s" % (a["migUUID"], uuids[a["migUUID"]], name))
        uuids[a["migUUID"]] = name
        by_gpu.setdefault(a["gpuUUID"], []).append((name, a["placement"]))
    for gpu, placed in by_gpu.items():
        for i, (n1, p1) in enumerate(placed):
            for n2, p2 in placed[i + 1:]:
                if p1["start"] < p2["start"] + p2["size"] and p2["start"] < p1["start"] + p1["size"]:
                    problems.append("%s %s and %s %s overlap on %s" % (n1, p1, n2, p2, gpu))
    not_live = sorted(u for u in uuids if u not in live)
    extra = sorted(live - set(uuids) - set(idle_uuids))
    if not_live:
        problems.append("reserved but not in the NVML view: %s" % not_live)
    if extra:
        problems.append("instances in the NVML view that no pod holds: %s" % extra)
    log("  checked: %d reservations on %d GPUs, no overlap, %d live instances = the pods' MIG UUIDs%s" %
        (len(uuids), len(by_gpu), len(live), " + %d idle listed" % len(live - set(uuids)) if live - set(uuids) else "")
        if not problems else "  check found %d problems" % len(problems))
    return problems


def round_figures(recs, t_apply):
    run = [r["running"] - r["seen"] for r in recs]
    bound = [r["bound"] - r["seen"] for r in recs]
    api = []
    for r in recs:
        o = r["obj"]
        ready = [c for c in o["status"].get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
        if ready:
            api.append(api_time(ready[0]["lastTransitionTime"]) - api_time(o["metadata"]["creationTimestamp"]))
    return {"n": len(recs),
            "run_p50": percentile(run, 50), "run_p99": percentile(run, 99), "run_max": max(run),
            "bound_p50": percentile(bound, 50), "bound_p99": percentile(bound, 99), "bound_max": max(bound),
            "api_p50": percentile(api, 50) if api else None, "api_max": max(api) if api else None,
            "created_spread": max(r["seen"] for r in recs) - min(r["seen"] for r in recs),
            "all_running": max(r["running"] for r in recs) - t_apply,
            "all_bound": max(r["bound"] for r in recs) - t_apply}


def events_of(kube, uids):
    items = kube.json("-n", NS, "get", "events")["items"]
    return [e for e in items if e.get("involvedObject", {}).get("uid") in uids]


def summarize_events(events):
    """Warning events by reason with their count, and the lock/assume messages named by the issue."""
    by_reason, notable = {}, {}
    for e in events:
        if e.get("type") != "Warning":
            continue
        n = e.get("count") or 1
        by_reason[e.get("reason")] = by_reason.get(e.get("reason"), 0) + n
        msg = e.get("message", "")
        for key in ("can't be assumed", "lock", "timed out", "timeout"):
            if key in msg:
                notable.setdefault(key, []).append(msg)
    return by_reason, notable


def one_round(a, kube, watch, kind, rnd):
    tag = "%s-r%d" % (kind, rnd)
    names = ["burst-%s-%02d" % (tag, i) for i in range(a.pods)]
    manifest = {"apiVersion": "v1", "kind": "List",
                "items": [pod_manifest(n, kind, tag, a.image) for n in names]}
    log("%s round %d: kubectl apply of %d pods" % (kind, rnd, a.pods))
    t_apply = time.time()
    kube.run("-n", NS, "apply", "-f", "-", input=json.dumps(manifest), timeout=300)
    t_applied = time.time()

    def mine(pods):
        return {uid: p for uid, p in pods.items() if p["obj"]["metadata"].get("labels", {}).get(LABEL) == tag}

    def all_running(pods):
        m = mine(pods)
        for p in m.values():
            st = p["obj"].get("status", {})
            if st.get("phase") in ("Failed", "Succeeded"):
                raise Failed("pod %s is %s: %s" % (p["name"], st.get("phase"), json.dumps(st)[:800]))
            for cs in st.get("containerStatuses", []):
                w = cs.get("state", {}).get("waiting", {})
                if w.get("reason") in BAD_WAITING:
                    raise Failed("pod %s: %s: %s" % (p["name"], w["reason"], w.get("message", "")))
        done = [p for p in m.values() if p["running"] is not None and p["deleted"] is None]
        return len(done) == a.pods and dict(m)

    try:
        recs = watch.wait("%d %s pods Running" % (a.pods, kind), all_running, a.timeout)
    except Failed as e:
        with watch.lock:
            m = mine(watch.pods)
            pending = sorted(p["name"] for p in m.values() if p["running"] is None)
        raise Failed("%s (%d/%d Running; not Running: %s)" % (e, a.pods - len(pending), a.pods, " ".join(pending)))
    with watch.lock:
        recs = [dict(r) for r in recs.values()]
    fig = round_figures(recs, t_apply)
    fig["apply_s"] = t_applied - t_apply
    uids = {r["obj"]["metadata"]["uid"] for r in recs}
    pods = kube.json("-n", NS, "get", "pods", "-l", "%s=%s" % (LABEL, tag))["items"]
    live, idle_uuids = set(), []
    if kind == "gpu":
        instances = nvml_instances(a.nvml_url)
        live = {u for uuids in instances.values() for u in uuids}
        idle = idle_listed(kube, a.node)
        idle_uuids = [u for key, uuids in instances.items() if key in idle for u in uuids]
    problems = check_pods(pods, kind, a.node, live, idle_uuids)
    events = events_of(kube, uids)
    fig["warnings"], fig["notable"] = summarize_events(events)
    fig["reused"] = sum(e.get("count") or 1 for e in events if e.get("reason") == "MigInstanceReused")

    log("%s round %d: deleting" % (kind, rnd))
    t_del = time.time()
    kube.run("-n", NS, "delete", "pod", "-l", "%s=%s" % (LABEL, tag), "--grace-period=2", "--wait=false")
    watch.wait("the %s pods deleted" % kind,
               lambda pods: all(p["deleted"] is not None for p in mine(pods).values()), a.timeout)
    fig["deleted_s"] = time.time() - t_del
    if kind == "gpu":
        # Nothing may be left but warm instances the node lists as idle (none unless warm instances are on).
        deadline = time.monotonic() + 120
        left = not_idle(nvml_instances(a.nvml_url), idle_listed(kube, a.node))
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = not_idle(nvml_instances(a.nvml_url), idle_listed(kube, a.node))
        if left:
            problems.append("%d instances left 120 s after the pods were deleted, not listed idle: %s" %
                            (len(left), left))
        else:
            fig["reclaimed_s"] = time.time() - t_del
            fig["idle_left"] = sum(len(u) for u in nvml_instances(a.nvml_url).values())
            log("  checked: no instance left in the NVML view %.1f s after the delete but %d listed idle" %
                (fig["reclaimed_s"], fig["idle_left"]))
    if a.artifacts:
        with open(os.path.join(a.artifacts, "%s.json" % tag), "w") as f:
            json.dump({"t_apply": t_apply, "figures": fig, "problems": problems,
                       "pods": [{k: r[k] for k in ("name", "seen", "bound", "running", "deleted")} for r in recs],
                       "events": events}, f, indent=1)
    return fig, problems


def print_round(kind, rnd, f):
    log("%-5s round %d: %d pods; apply took %.1f s, created over %.1f s; all bound %.1f s, all Running %.1f s "
        "after the apply" % (kind, rnd, f["n"], f["apply_s"], f["created_spread"], f["all_bound"], f["all_running"]))
    log("      creation->Running p50 %.2f p99 %.2f max %.2f s; creation->bound p50 %.2f p99 %.2f max %.2f s" %
        (f["run_p50"], f["run_p99"], f["run_max"], f["bound_p50"], f["bound_p99"], f["bound_max"]))
    if f["api_p50"] is not None:
        log("      API timestamps (1 s resolution): creation->Ready p50 %.0f max %.0f s" % (f["api_p50"], f["api_max"]))
    if kind == "gpu":
        log("      instances reused (MigInstanceReused events): %d" % f.get("reused", 0))
    log("      Warning events: %s" % (", ".join("%s x%d" % kv for kv in sorted(f["warnings"].items())) or "none"))
    for key, msgs in sorted(f["notable"].items()):
        log("      %d with %r, e.g. %s" % (len(msgs), key, msgs[0][:300]))


def save_logs(a, kube):
    out = a.artifacts
    for comp in ("device-plugin", "scheduler"):
        pods = kube.json("-n", "dynmig-system", "get", "pods", "-l", "app.kubernetes.io/component=" + comp)["items"]
        text = "".join(kube.run("-n", "dynmig-system", "logs", p["metadata"]["name"], check=False, timeout=60).stdout
                       for p in pods)
        with open(os.path.join(out, "%s.log" % comp), "w") as f:  # a previous run's is replaced
            f.write(text)
    logs = os.path.join(STATE, "logs")
    if os.path.isdir(logs):
        for name in ("dynmig-kube-scheduler.log", "kube-scheduler.log", "kubelet.log", "kube-apiserver.log"):
            if os.path.exists(os.path.join(logs, name)):
                shutil.copy(os.path.join(logs, name), os.path.join(out, name))
    log("artifacts (timeline, events, logs) in %s" % out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubectl", default=os.environ.get("KUBECTL") or shutil.which("kubectl"))
    ap.add_argument("--kubeconfig", default=os.path.join(STATE, "admin.kubeconfig"))
    ap.add_argument("--node", default="localhost")
    ap.add_argument("--nvml-url", default="http://127.0.0.1:19401/nvml", help="the device plugin's GET /nvml")
    ap.add_argument("--image", default="localhost/busybox:local")
    ap.add_argument("--pods", type=int, default=56, help="pods per burst (default 56: 8 A100-40GB x 7 1g)")
    ap.add_argument("--bursts", type=int, default=1, help="apply/delete rounds per kind")
    ap.add_argument("--kind", choices=["both", "plain", "gpu"], default="both")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a round may take to be all Running")
    ap.add_argument("--max-ratio", type=float, default=None, help="fail when gpu/plain time to all Running exceeds it")
    ap.add_argument("--artifacts", default="", help="a directory for the timeline, events and logs")
    a = ap.parse_args()
    if not a.kubectl:
        print("burst: kubectl not found (--kubectl)", file=sys.stderr)
        return 2
    if a.pods < 1 or a.bursts < 1:
        print("burst: --pods and --bursts must be at least 1", file=sys.stderr)
        return 2
    if a.artifacts:
        os.makedirs(a.artifacts, exist_ok=True)
    kube = Kube(a.kubectl, a.kubeconfig)
    leftover = kube.json("-n", NS, "get", "pods", "-l", LABEL)["items"]
    if leftover:
        print("burst: %d pods labelled %s exist already (a run interrupted?): delete them first" %
              (len(leftover), LABEL), file=sys.stderr)
        return 2
    watch = PodWatch(kube)
    watch.start()
    kinds = ["plain", "gpu"] if a.kind == "both" else [a.kind]
    results, problems = {}, []
    try:
        if "gpu" in kinds:
            left = not_idle(nvml_instances(a.nvml_url), idle_listed(kube, a.node))
            if left:
                raise Failed("the NVML view has %d instances not listed idle before the burst: %s" % (len(left), sorted(left)))
        for kind in kinds:
            for rnd in range(1, a.bursts + 1):
                fig, p = one_round(a, kube, watch, kind, rnd)
                results[(kind, rnd)] = fig
                problems += ["%s round %d: %s" % (kind, rnd, x) for x in p]
                print_round(kind, rnd, fig)
    except Failed as e:
        problems.append(str(e))
        log("FAILED: %s" % e)
        subprocess.run([a.kubectl, "--kubeconfig", a.kubeconfig, "-n", NS, "delete", "pod", "-l", LABEL,
                        "--grace-period=2", "--wait=false"], capture_output=True, timeout=120)
    finally:
        watch.stopping = True
        if a.artifacts:
            try:
                save_logs(a, kube)
            except Exception as e:  # the figures matter more than the logs
                log("saving the logs failed: %s" % e)
        kube.close()

    log("summary (%d pods per burst, node %s):" % (a.pods, a.node))
    print("%-6s %5s %9s %9s %9s %12s %12s  %s" % ("kind", "round", "p50 s", "p99 s", "max s", "all bound s",
                                                  "all Running s", "Warning events"), flush=True)
    for (kind, rnd), f in sorted(results.items(), key=lambda kv: (kinds.index(kv[0][0]), kv[0][1])):
        print("%-6s %5d %9.2f %9.2f %9.2f %12.1f %12.1f  %s" % (
            kind, rnd, f["run_p50"], f["run_p99"], f["run_max"], f["all_bound"], f["all_running"],
            ", ".join("%s x%d" % kv for kv in sorted(f["warnings"].items())) or "none"), flush=True)
    ratio = None
    if ("plain", 1) in results and ("gpu", 1) in results:
        ratio = results[("gpu", 1)]["all_running"] / results[("plain", 1)]["all_running"]
        print("ratio gpu/plain, time to all Running (round 1): %.2fx (issue 15's target: at most 2x)" % ratio)
        if a.max_ratio is not None and ratio > a.max_ratio:
            problems.append("gpu/plain %.2fx exceeds --max-ratio %.2f" % (ratio, a.max_ratio))
    for p in problems:
        print("PROBLEM: %s" % p, flush=True)
    print("burst: %s" % ("ok" if not problems else "%d problems" % len(problems)), flush=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())

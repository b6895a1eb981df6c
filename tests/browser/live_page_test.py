#!/usr/bin/env python3
"""The scheduler's live page (GET /live) in a real headless browser, against the local mode.

Starts `build/bin/dynmig local` (node-a with two simulated A100-SXM4-40GB) on free ports, creates MIG pods with
kubectl (some Running, two that cannot fit and stay Pending), then drives Debian's chromium through chromedriver's
W3C WebDriver protocol (Python's standard library only) and checks, from the page's DOM:
  - one element per GPU that the node's device plugin registered (hami.io/node-nvidia-register), with its units;
  - every pod kubectl shows holding a reservation (hami.io/vgpu-mig-allocations) as an owner of the right GPU,
    with its profile, placement and MIG UUID, and a slice cell spanning its units;
  - every pod kubectl shows Pending without a node in the pending table, with the scheduler's reason;
  - the page's own script runs under its Content-Security-Policy and the page refreshes by itself: a pod created
    after the page loaded appears in the same document (a marker set on the window survives: no reload);
  - the same page with its scripts off (a second browser session) holds the same structure, server-rendered.
The screenshot is saved under --artifacts and checked by structure (a PNG of the window's size), never by pixels.
Exits 0 when every check passes; prints what differs otherwise. Needs chromium and chromedriver
(`tools/install-deps.sh chromium chromium-driver`; `make browser-test` installs them).
"""
import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REGISTER = "hami.io/node-nvidia-register"
ALLOC = "hami.io/vgpu-mig-allocations"
WIDTH, HEIGHT = 1280, 1000


class Failed(Exception):
    pass


def log(msg):
    print("[live-page %s] %s" % (time.strftime("%H:%M:%S", time.gmtime()), msg), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, timeout=60, interval=0.3):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = fn()
        except Failed:
            raise
        except Exception as e:  # noqa: BLE001 - reported when the wait ends
            v, last = None, e
        if v:
            return v
        time.sleep(interval)
    raise Failed("timed out after %d s waiting for %s%s" % (timeout, what, " (last error: %s)" % last if last else ""))


class Kube:
    def __init__(self, kubeconfig):
        self.base = ["kubectl", "--kubeconfig", kubeconfig]

    def run(self, *args, input=None):
        p = subprocess.run(self.base + list(args), input=input, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise Failed("kubectl %s: %s" % (" ".join(args), p.stderr.strip()))
        return p.stdout

    def json(self, *args):
        return json.loads(self.run(*args, "-o", "json"))

    def mig_pod(self, name, mib):
        self.run("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"nvidia.com/vgpu-mode": "mig"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "workload", "image": "busybox", "command": ["sleep", "3600"],
                                     "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mib}}}]}}))

    def expected(self):
        """What kubectl lists: GPUs per node, owners (reserved pods) and pending pods."""
        gpus = {}
        for n in self.json("get", "nodes")["items"]:
            for d in json.loads(n["metadata"].get("annotations", {}).get(REGISTER, "[]")):
                gpus[d["id"]] = n["metadata"]["name"]
        owners, pending = {}, set()
        for p in self.json("get", "pods", "-A")["items"]:
            if p["status"].get("phase") in ("Succeeded", "Failed") or p["metadata"].get("deletionTimestamp"):
                continue
            key = "%s/%s" % (p["metadata"]["namespace"], p["metadata"]["name"])
            allocs = json.loads(p["metadata"].get("annotations", {}).get(ALLOC, "[]") or "[]")
            if allocs:
                owners[key] = [(a["gpuUUID"], a["profile"], a["placement"]["start"], a["placement"]["size"],
                                a.get("migUUID", "")) for a in allocs]
            elif not p["spec"].get("nodeName"):
                pending.add(key)
        return gpus, owners, pending


# The page's structure, read in the browser (docs: src/ops/live_page.h).
READ_PAGE = """
const q = (root, sel) => Array.from(root.querySelectorAll(sel));
return {
  marker: window.__dynmigMarker || null,
  refresh: (document.getElementById("refresh") || {}).className || "",
  snapshot: (document.getElementById("snapshot") || {dataset: {}}).dataset.time || "",
  gpus: q(document, "#gpus .gpu").map(g => ({
    node: g.dataset.node, uuid: g.dataset.gpu, units: Number(g.dataset.units),
    free: Number(g.dataset.free),
    cells: q(g, "table.slices td").reduce((n, td) => n + td.colSpan, 0),
    slices: q(g, "td.slice:not(.idle)").map(td => [td.dataset.pod, td.dataset.profile,
                                                   Number(td.dataset.start), td.colSpan]),
    owners: q(g, "li.owner").map(li => [li.dataset.pod, li.dataset.profile, Number(li.dataset.start),
                                        Number(li.dataset.size), li.dataset.mig]),
  })),
  pending: q(document, "#pending tr.pending").map(tr => [tr.dataset.pod, tr.dataset.reason,
      tr.querySelector("td.detail").textContent]),
  events: q(document, "#events tr.event").length,
};
"""


def compare(page, expected):
    """The differences between the page's structure and what kubectl lists ([] when none)."""
    gpus, owners, pending = expected
    diff = []
    seen = {g["uuid"]: g for g in page["gpus"]}
    if len(page["gpus"]) != len(seen):
        diff.append("a GPU is drawn twice: %s" % [g["uuid"] for g in page["gpus"]])
    if set(seen) != set(gpus):
        diff.append("GPUs on the page %s, registered %s" % (sorted(seen), sorted(gpus)))
    for uuid, g in seen.items():
        if gpus.get(uuid) not in (None, g["node"]):
            diff.append("GPU %s drawn under node %s, registered by %s" % (uuid, g["node"], gpus[uuid]))
        if g["cells"] != g["units"]:
            diff.append("GPU %s: its slice row spans %d units, not %d" % (uuid, g["cells"], g["units"]))
    want = {(pod, a[0], a[1], a[2], a[3], a[4]) for pod, allocs in owners.items() for a in allocs}
    got = {(o[0], uuid, o[1], o[2], o[3], o[4]) for uuid, g in seen.items() for o in g["owners"]}
    if want != got:
        diff.append("owners: missing %s, unexpected %s" % (sorted(want - got), sorted(got - want)))
    drawn = {(s[0], uuid, s[1], s[2], s[3]) for uuid, g in seen.items() for s in g["slices"]}
    if {w[:5] for w in want} != drawn:
        diff.append("slice cells %s, owners %s" % (sorted(drawn), sorted(w[:5] for w in want)))
    listed = {p[0] for p in page["pending"]}
    if listed != pending:
        diff.append("pending: missing %s, unexpected %s" % (sorted(pending - listed), sorted(listed - pending)))
    for pod, reason, detail in page["pending"]:
        if not reason or not detail.strip():
            diff.append("pending pod %s has no reason (%r, %r)" % (pod, reason, detail))
    return diff


def matches(driver, kube, what, timeout=45, script=True):
    """Waits until the page (read in place, never reloaded) matches kubectl and its own script runs (or, with
    script=False, did not run); returns the page."""
    state = {}

    def check():
        state["page"] = driver.execute(READ_PAGE)
        state["diff"] = compare(state["page"], kube.expected())
        if (state["page"]["refresh"] == "ok") != script:
            state["diff"].append("the page's script %s (#refresh class %r)" % (
                "did not run or its refresh failed" if script else "ran", state["page"]["refresh"]))
        return state["page"] if not state["diff"] else None
    try:
        return wait_for(what, check, timeout, interval=0.5)
    except Failed as e:
        raise Failed("%s; the page differs from kubectl: %s" % (e, "; ".join(state.get("diff", []))))


class WebDriver:
    """chromedriver over the W3C WebDriver protocol (HTTP + JSON)."""

    def __init__(self, chromedriver, chromium, log_path, script=True):
        self.port = free_port()
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([chromedriver, "--port=%d" % self.port], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.base = "http://127.0.0.1:%d" % self.port
        wait_for("chromedriver", lambda: self.call("GET", "/status")["ready"], 30)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "acceptInsecureCerts": True,
            "goog:chromeOptions": {"binary": chromium, "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", "--window-size=%d,%d" % (WIDTH, HEIGHT)]}}}}
        if not script:  # the page's scripts do not run (WebDriver's own still do)
            caps["capabilities"]["alwaysMatch"]["goog:chromeOptions"]["prefs"] = {
                "profile.managed_default_content_settings.javascript": 2}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise Failed("webdriver %s %s: %s" % (method, path, e.read().decode(errors="replace")[:800]))

    def s(self, path):
        return "/session/%s%s" % (self.session, path)

    def get(self, url):
        self.call("POST", self.s("/url"), {"url": url})

    def execute(self, script):
        return self.call("POST", self.s("/execute/sync"), {"script": script, "args": []})

    def screenshot(self):
        return base64.b64decode(self.call("GET", self.s("/screenshot")))

    def quit(self):
        try:
            self.call("DELETE", self.s(""))
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def png_size(data):
    """(width, height) of a PNG, after checking its signature and IHDR chunk."""
    if len(data) < 33 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise Failed("the screenshot is not a PNG (%d bytes)" % len(data))
    return struct.unpack(">II", data[16:24])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dynmig", default=os.path.join(REPO, "build", "bin", "dynmig"))
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    ap.add_argument("--chromedriver", default=shutil.which("chromedriver") or "chromedriver")
    ap.add_argument("--artifacts", default="/tmp/dynmig-live-page", help="screenshot, DOM and logs go here")
    args = ap.parse_args()
    for tool in (args.dynmig, args.chromium, args.chromedriver, shutil.which("kubectl")):
        if not tool or not shutil.which(tool):
            print("live-page: %s not found (make browser-test installs chromium and chromium-driver)" % tool)
            return 1
    os.makedirs(args.artifacts, exist_ok=True)
    work = tempfile.mkdtemp(prefix="dynmig-live-page-")
    local_log = os.path.join(args.artifacts, "local.log")
    out = open(local_log, "w")
    cmd = [args.dynmig, "local", "--quiet", "--listen", "127.0.0.1:0", "--control", "",
           "--nvml-port", str(free_port()), "--nodes", "node-a=A100-SXM4-40GBx2",
           "--state-dir", os.path.join(work, "state"), "--sim-latency", "none"]
    log("starting %s" % " ".join(cmd))
    local = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    driver = None
    try:
        def up():
            if local.poll() is not None:
                raise Failed("dynmig local exited %d: %s" % (local.returncode, open(local_log).read()[-2000:]))
            text = open(local_log).read()
            k = re.search(r"(?m)^\s+kubeconfig\s+(\S+)\s*$", text)
            s = re.search(r"(?m)^\s+scheduler\s+(https?://\S+)", text)
            return (k.group(1), s.group(1)) if k and s else None
        kubeconfig, scheduler = wait_for("dynmig local to print its kubeconfig", up, 60)
        kube = Kube(kubeconfig)
        wait_for("node-a registered", lambda: REGISTER in kube.json("get", "node", "node-a")["metadata"].get(
            "annotations", {}), 60)

        log("pods: three Running on GPU 0 or 1, one 7g.40gb, then two more 7g.40gb that cannot fit")
        for name, mib in (("small-1g", 4000), ("medium-2g", 9000), ("large-3g", 19000), ("whole-7g", 40000)):
            kube.mig_pod(name, mib)
        wait_for("four pods Running", lambda: sum(
            1 for p in kube.json("get", "pods")["items"] if p["status"].get("phase") == "Running") == 4, 90)
        kube.mig_pod("waits-1", 40000)
        kube.mig_pod("waits-2", 40000)
        wait_for("waits-1 and waits-2 pending", lambda: len(kube.expected()[2]) == 2, 60)

        driver = WebDriver(args.chromedriver, args.chromium, os.path.join(args.artifacts, "chromedriver.log"))
        url = scheduler + "/live"
        log("loading %s in headless chromium" % url)
        driver.get(url)
        page = matches(driver, kube, "the page to list what kubectl lists")
        if len(page["gpus"]) != 2 or page["events"] == 0:
            raise Failed("expected 2 GPUs and some events, got %s" % json.dumps(page)[:1500])
        log("page matches kubectl: %d GPUs, %d owners, %d pending, %d events" % (
            len(page["gpus"]), sum(len(g["owners"]) for g in page["gpus"]), len(page["pending"]), page["events"]))

        shot = driver.screenshot()
        with open(os.path.join(args.artifacts, "live.png"), "wb") as f:
            f.write(shot)
        size = png_size(shot)
        viewport = driver.execute("return [Math.round(window.innerWidth * window.devicePixelRatio),"
                                  " Math.round(window.innerHeight * window.devicePixelRatio)];")
        if list(size) != viewport or len(shot) < 5000:
            raise Failed("screenshot %s (%d bytes), viewport %s" % (size, len(shot), viewport))
        log("screenshot %dx%d, %d bytes: %s" % (size[0], size[1], len(shot), os.path.join(args.artifacts, "live.png")))

        log("refresh: a pod created after the page loaded appears without a reload")
        driver.execute("window.__dynmigMarker = 'loaded-once'; return 1;")
        first = driver.execute(READ_PAGE)["snapshot"]
        kube.mig_pod("late-1g", 4000)
        wait_for("late-1g reserved or pending in kubectl", lambda: any(
            "default/late-1g" in part for part in kube.expected()[1:]), 60)
        page = matches(driver, kube, "the page to show late-1g as kubectl does")
        late = [o for g in page["gpus"] for o in g["owners"] if o[0] == "default/late-1g"] + [
            p for p in page["pending"] if p[0] == "default/late-1g"]
        if not late:
            raise Failed("late-1g is not on the page")
        if page["marker"] != "loaded-once":
            raise Failed("the page was reloaded (the window marker is gone): %r" % page["marker"])
        if page["snapshot"] == first:
            raise Failed("the snapshot time did not change: %s" % first)
        log("late-1g appeared in place: %s; pending now %s" % (late, [p[0] for p in page["pending"]]))
        with open(os.path.join(args.artifacts, "live-after.png"), "wb") as f:
            f.write(driver.screenshot())

        driver.quit()
        driver = None

        log("without script: the same page, its scripts off, holds the same structure (server-rendered)")
        driver = WebDriver(args.chromedriver, args.chromium, os.path.join(args.artifacts, "chromedriver-noscript.log"),
                           script=False)
        driver.get(url)
        page = matches(driver, kube, "the script-less page to list what kubectl lists", timeout=20, script=False)
        with open(os.path.join(args.artifacts, "live-noscript.png"), "wb") as f:
            f.write(driver.screenshot())
        log("script-less page matches kubectl: %d GPUs, %d pending" % (len(page["gpus"]), len(page["pending"])))
        log("PASS")
        return 0
    except Failed as e:
        log("FAIL: %s" % e)
        log("dynmig local's last lines:\n%s" % open(local_log).read()[-3000:])
        return 1
    finally:
        if driver:
            driver.quit()
        if local.poll() is None:
            local.send_signal(signal.SIGINT)
            try:
                local.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(local.pid, signal.SIGKILL)
                local.wait(10)
        out.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Builds the harness's container images as docker-archive tarballs (for `ctr images import`), from files on this
machine only:

  pause    a static program that waits for a signal (tools/real-k8s/pause.c, built with gcc -static)
  busybox  /bin/busybox from busybox-static with its applet links; /bin/bash runs busybox's sh (the spec's
           examples say `bash -c ...`)
  dynmig   build/bin/dynmig (as /usr/local/bin/dynmig, the image's entrypoint, as in deploy/Dockerfile), the shared
           libraries it loads, and busybox, openssl and curl for the certificate Job (deploy/base/certgen)
"""
import argparse
import gzip  # noqa: F401  (layers stay uncompressed: ctr accepts them and it is faster)
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def ldd(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts:
            target = parts[parts.index("=>") + 1]
            if target.startswith("/"):
                libs.add(target)
        elif parts and parts[0].startswith("/"):
            libs.add(parts[0])  # the dynamic loader
    return libs


class Layer:
    def __init__(self):
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.GNU_FORMAT)
        self.dirs = set()

    def _parents(self, path):
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.dirs:
                self.dirs.add(d)
                info = tarfile.TarInfo(d)
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                self.tar.addfile(info)

    def dir(self, path, mode=0o755):
        self._parents(path + "/x")
        d = path.strip("/")
        if d in self.dirs:
            return
        self.dirs.add(d)

    def file(self, path, data, mode=0o644):
        self._parents(path)
        info = tarfile.TarInfo(path.strip("/"))
        info.size = len(data)
        info.mode = mode
        self.tar.addfile(info, io.BytesIO(data))

    def host_file(self, src, dest=None):
        real = os.path.realpath(src)
        with open(real, "rb") as f:
            data = f.read()
        self.file(dest or src, data, os.stat(real).st_mode & 0o777)

    def symlink(self, path, target):
        self._parents(path)
        info = tarfile.TarInfo(path.strip("/"))
        info.type = tarfile.SYMTYPE
        info.linkname = target
        self.tar.addfile(info)

    def bytes(self):
        self.tar.close()
        return self.buf.getvalue()


def busybox_into(layer):
    layer.host_file("/bin/busybox")
    applets = subprocess.run(["/bin/busybox", "--list-full"], capture_output=True, text=True, check=True).stdout
    for a in applets.split():
        if a != "bin/busybox":
            layer.symlink("/" + a, "/bin/busybox")
    layer.file("/bin/bash", b"#!/bin/sh\n# busybox's sh standing in for bash (the examples run `bash -c ...`)\n"
               b"exec /bin/sh \"$@\"\n", 0o755)
    layer.file("/etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532::/home:/bin/sh\n")
    layer.file("/etc/group", b"root:x:0:\nnonroot:x:65532:\n")
    layer.dir("/tmp")


def save(out_dir, name, ref, layer_bytes, config):
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    cfg = {"architecture": "amd64", "os": "linux", "config": config,
           "rootfs": {"type": "layers", "diff_ids": [diff_id]},
           "history": [{"created_by": "tools/real-k8s/mkimage.py"}]}
    cfg_bytes = json.dumps(cfg).encode()
    cfg_name = hashlib.sha256(cfg_bytes).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]).encode()
    path = os.path.join(out_dir, name + ".tar")
    with tarfile.open(path + ".tmp", "w") as t:
        for fname, data in ((cfg_name, cfg_bytes), ("layer.tar", layer_bytes), ("manifest.json", manifest)):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    os.replace(path + ".tmp", path)
    print("mkimage: %s -> %s (%.1f MiB)" % (ref, path, os.path.getsize(path) / 1048576), file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pause", required=True)
    ap.add_argument("--busybox", required=True)
    ap.add_argument("--dynmig", required=True)
    ap.add_argument("--dynmig-bin", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        pause_bin = os.path.join(tmp, "pause")
        subprocess.run(["gcc", "-static", "-O2", "-o", pause_bin, os.path.join(HERE, "pause.c")], check=True)
        layer = Layer()
        layer.host_file(pause_bin, "/pause")
        save(a.out, "pause", a.pause, layer.bytes(), {"Entrypoint": ["/pause"]})

    layer = Layer()
    busybox_into(layer)
    save(a.out, "busybox", a.busybox, layer.bytes(), {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin:/sbin:/usr/bin"]})

    layer = Layer()
    busybox_into(layer)
    files = {a.dynmig_bin: "/usr/local/bin/dynmig"}
    for tool in ("/usr/bin/openssl", "/usr/bin/curl"):
        files[tool] = tool
    libs = set()
    for src in files:
        libs |= ldd(src)
    for src, dest in files.items():
        layer.host_file(src, dest)
    for lib in sorted(libs):
        layer.host_file(lib)
        real = os.path.realpath(lib)
        if real != lib:  # keep the path the loader asks for, and the real file name too
            layer.host_file(real)
    # openssl's default configuration (it warns without one).
    if os.path.exists("/usr/lib/ssl/openssl.cnf"):
        layer.host_file("/usr/lib/ssl/openssl.cnf")
    save(a.out, "dynmig", a.dynmig, layer.bytes(),
         {"Entrypoint": ["/usr/local/bin/dynmig"], "User": "65532:65532",
          "Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/sbin"]})


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A stand-in for `curl` that plays the Kubernetes API server for deploy/base/certgen/certgen.sh.

Understands exactly the options certgen.sh uses (-sS, --cacert, -H, -X, --data-binary @FILE, -o FILE, -w FMT, URL),
keeps Secrets as JSON files under $FAKE_API_DIR/secrets/, records each request as a JSON line in
$FAKE_API_DIR/requests.jsonl, and answers like the API server: POST secret -> 201 or 409 AlreadyExists,
PUT secret -> 200 or 404, PATCH of a webhook configuration -> 200 (404 when listed in $FAKE_API_DIR/missing).
Refuses (401) a request whose bearer token differs from $FAKE_API_DIR/token; fails like curl (exit 77) when
the --cacert file is missing, and (exit 7, code 000) when $FAKE_API_DIR/unreachable exists.
"""
import json
import os
import re
import sys


def main(argv):
    state = os.environ["FAKE_API_DIR"]
    method, url, out, fmt, data, cacert = "GET", None, None, "", None, None
    headers = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-sS", "-s", "-S"):
            pass
        elif a == "-H":
            i += 1
            h = argv[i]
            if h.startswith("@"):
                with open(h[1:]) as f:
                    headers += [line.rstrip("\n") for line in f if line.strip()]
            else:
                headers.append(h)
        elif a == "-X":
            i += 1
            method = argv[i]
        elif a == "--data-binary":
            i += 1
            with open(argv[i][1:], "rb") as f:
                data = f.read().decode()
        elif a == "-o":
            i += 1
            out = argv[i]
        elif a == "-w":
            i += 1
            fmt = argv[i]
        elif a == "--cacert":
            i += 1
            cacert = argv[i]
        elif a.startswith("-"):
            print(f"fake curl: unsupported option {a}", file=sys.stderr)
            return 2
        else:
            url = a
        i += 1

    if os.path.exists(os.path.join(state, "unreachable")):
        sys.stdout.write(fmt.replace("%{http_code}", "000"))
        print("curl: (7) Failed to connect to fake-apiserver port 6443: Connection refused", file=sys.stderr)
        return 7
    if not cacert or not os.path.isfile(cacert):
        print(f"curl: (77) error setting certificate file: {cacert}", file=sys.stderr)
        return 77
    hdr = {h.split(":", 1)[0].strip().lower(): h.split(":", 1)[1].strip() for h in headers}
    path = re.sub(r"^https://[^/]+", "", url)
    with open(os.path.join(state, "token")) as f:
        token = f.read().strip()
    record = {"method": method, "path": path, "contentType": hdr.get("content-type", ""),
              "body": json.loads(data) if data else None}
    with open(os.path.join(state, "requests.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")

    code, body = 500, {"kind": "Status", "message": "fake: no route"}
    missing = set()
    if os.path.exists(os.path.join(state, "missing")):
        with open(os.path.join(state, "missing")) as f:
            missing = {line.strip() for line in f if line.strip()}
    secrets = os.path.join(state, "secrets")
    os.makedirs(secrets, exist_ok=True)
    m_coll = re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets", path)
    m_item = re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets/([^/]+)", path)
    m_hook = re.fullmatch(r"/apis/admissionregistration.k8s.io/v1/(\w+webhookconfigurations)/([^/]+)", path)
    if hdr.get("authorization") != f"Bearer {token}":
        code, body = 401, {"kind": "Status", "reason": "Unauthorized"}
    elif method == "POST" and m_coll:
        obj = json.loads(data)
        target = os.path.join(secrets, f"{m_coll.group(1)}_{obj['metadata']['name']}.json")
        if os.path.exists(target):
            code, body = 409, {"kind": "Status", "reason": "AlreadyExists"}
        else:
            with open(target, "w") as f:
                f.write(data)
            code, body = 201, obj
    elif method == "PUT" and m_item:
        target = os.path.join(secrets, f"{m_item.group(1)}_{m_item.group(2)}.json")
        if not os.path.exists(target):
            code, body = 404, {"kind": "Status", "reason": "NotFound"}
        else:
            with open(target, "w") as f:
                f.write(data)
            code, body = 200, json.loads(data)
    elif method == "PATCH" and m_hook:
        if f"{m_hook.group(1)}/{m_hook.group(2)}" in missing:
            code, body = 404, {"kind": "Status", "reason": "NotFound", "message": "not found"}
        else:
            code, body = 200, {"kind": "Patched"}
    if out:
        with open(out, "w") as f:
            json.dump(body, f)
    sys.stdout.write(fmt.replace("%{http_code}", str(code)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

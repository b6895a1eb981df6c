#!/usr/bin/env python3
"""ctest monitoring.rules: dynmig's alerting rules under `promtool test rules`.

Writes deploy/overlays/monitoring/prometheusrule.yaml out as a plain rule file (tools/prometheus-rules.py), checks it
with `promtool check rules`, checks that every alert has at least one firing case (exp_alerts not empty) and one
silent case (exp_alerts empty) in tests/monitoring/*.test.yaml and that no test names an alert that does not exist,
then runs `promtool test rules` on them. Exits 77 (skipped) when promtool is missing (Debian: the prometheus package,
which tools/install-deps.sh installs).
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def coverage(rules_file, tests):
    with open(rules_file, encoding="utf-8") as f:
        rules = yaml.safe_load(f)
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    firing, silent, errors = set(), set(), []
    for path in tests:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for t in doc.get("tests", []):
            for a in t.get("alert_rule_test", []):
                name = a.get("alertname")
                if name not in alerts:
                    errors.append(f"{os.path.basename(path)}: a test of alert {name!r}, which the rules do not have")
                (firing if a.get("exp_alerts") else silent).add(name)
    for name in sorted(alerts):
        if name not in firing:
            errors.append(f"alert {name} has no firing test")
        if name not in silent:
            errors.append(f"alert {name} has no silent test")
    return alerts, errors


def main():
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool not found (Debian package prometheus): skipped")
        return 77
    tests = sorted(glob.glob(os.path.join(HERE, "*.test.yaml")))
    if not tests:
        print("no tests/monitoring/*.test.yaml")
        return 1
    with tempfile.TemporaryDirectory(prefix="dynmig-promtool-") as work:
        rules_file = os.path.join(work, "dynmig-rules.yaml")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "prometheus-rules.py"), rules_file], check=True)
        if subprocess.run([promtool, "check", "rules", rules_file]).returncode != 0:
            return 1
        alerts, errors = coverage(rules_file, tests)
        for e in errors:
            print("coverage:", e)
        if errors:
            return 1
        print(f"coverage: each of the {len(alerts)} alerts has a firing and a silent test")
        for t in tests:
            shutil.copy(t, work)
        names = [os.path.basename(t) for t in tests]
        return subprocess.run([promtool, "test", "rules", *names], cwd=work).returncode


if __name__ == "__main__":
    sys.exit(main())

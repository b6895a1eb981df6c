#!/usr/bin/env python3
"""Writes dynmig's alerting rules (deploy/overlays/monitoring/prometheusrule.yaml, a PrometheusRule) as a plain
Prometheus rule file, for a Prometheus without the Operator and for `promtool test rules` (tests/monitoring/).

  tools/prometheus-rules.py [--rules PROMETHEUSRULE] [--override ALERT:for=DURATION]
                            [--override ALERT:threshold=NUMBER] OUT

--override changes one alert's `for:` or the number its expression compares last with (`... > 600`): the
real-cluster scenario (tests/e2e-real/scenarios.py) uses it so that an alert fires within seconds.
"""
import argparse
import os
import re
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_RULES = os.path.join(HERE, "..", "deploy", "overlays", "monitoring", "prometheusrule.yaml")
THRESHOLD = re.compile(r"(>=?|<=?|==)\s*[0-9.]+\s*$")


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict) or doc.get("kind") != "PrometheusRule":
        raise SystemExit(f"{path}: not a PrometheusRule")
    spec = doc.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("groups"), list):
        raise SystemExit(f"{path}: PrometheusRule without spec.groups")
    return spec


def alerts(spec):
    return [r for g in spec["groups"] for r in g.get("rules", []) if "alert" in r]


def apply_override(spec, text):
    m = re.fullmatch(r"([A-Za-z0-9_]+):(for|threshold)=(\S+)", text)
    if not m:
        raise SystemExit(f"--override {text!r}: want ALERT:for=DURATION or ALERT:threshold=NUMBER")
    name, what, value = m.groups()
    found = [r for r in alerts(spec) if r["alert"] == name]
    if not found:
        raise SystemExit(f"--override {text!r}: no alert {name}")
    for rule in found:
        if what == "for":
            if not re.fullmatch(r"[0-9]+[smhd]", value):
                raise SystemExit(f"--override {text!r}: {value!r} is not a duration like 30s")
            rule["for"] = value
        else:
            if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
                raise SystemExit(f"--override {text!r}: {value!r} is not a number")
            expr = rule["expr"].rstrip()
            if not THRESHOLD.search(expr):
                raise SystemExit(f"--override {text!r}: the expression of {name} does not end in a comparison")
            rule["expr"] = THRESHOLD.sub(lambda mm: f"{mm.group(1)} {value}", expr)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rules", default=DEFAULT_RULES)
    p.add_argument("--override", action="append", default=[])
    p.add_argument("out")
    a = p.parse_args(argv)
    spec = load(a.rules)
    for o in a.override:
        apply_override(spec, o)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(f"# Written by tools/prometheus-rules.py from {os.path.basename(a.rules)}; do not edit.\n")
        yaml.safe_dump({"groups": spec["groups"]}, f, sort_keys=False, width=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/python3
"""Checks of burst.py that need no cluster: what its end-of-round check finds, its percentiles and figures, and
the device plugin's --sim-latency passed through by translate.py (ctest real-k8s.burst-checks)."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import burst  # noqa: E402


def gpu_pod(name, gpu, start, mig, size=1, profile="1g.5gb", scheduler="dynmig-scheduler", node="localhost"):
    alloc = [{"gpuUUID": gpu, "profile": profile, "placement": {"start": start, "size": size}, "migUUID": mig,
              "gpuInstanceID": start + 7, "computeInstanceID": 0}]
    return {"metadata": {"name": name, "annotations": {burst.ALLOC: json.dumps(alloc)}},
            "spec": {"nodeName": node, "schedulerName": scheduler}}


class CheckPods(unittest.TestCase):
    def test_distinct_placements_pass(self):
        pods = [gpu_pod("a", "GPU-1", 0, "MIG-a"), gpu_pod("b", "GPU-1", 1, "MIG-b"), gpu_pod("c", "GPU-2", 0, "MIG-c")]
        self.assertEqual(burst.check_pods(pods, "gpu", "localhost", {"MIG-a", "MIG-b", "MIG-c"}), [])

    def test_overlap_on_one_gpu_is_found(self):
        pods = [gpu_pod("a", "GPU-1", 0, "MIG-a", size=2, profile="1g.5gb"), gpu_pod("b", "GPU-1", 1, "MIG-b")]
        problems = burst.check_pods(pods, "gpu", "localhost", {"MIG-a", "MIG-b"})
        self.assertTrue(any("overlap" in p and "GPU-1" in p for p in problems), problems)

    def test_same_slices_on_two_gpus_do_not_overlap(self):
        pods = [gpu_pod("a", "GPU-1", 3, "MIG-a"), gpu_pod("b", "GPU-2", 3, "MIG-b")]
        self.assertEqual(burst.check_pods(pods, "gpu", "localhost", {"MIG-a", "MIG-b"}), [])

    def test_mig_uuid_given_twice_is_found(self):
        pods = [gpu_pod("a", "GPU-1", 0, "MIG-x"), gpu_pod("b", "GPU-1", 1, "MIG-x")]
        problems = burst.check_pods(pods, "gpu", "localhost", {"MIG-x"})
        self.assertTrue(any("MIG-x given to a and b" in p for p in problems), problems)

    def test_nvml_view_must_match_the_reservations(self):
        pods = [gpu_pod("a", "GPU-1", 0, "MIG-a"), gpu_pod("b", "GPU-1", 1, "MIG-b")]
        problems = burst.check_pods(pods, "gpu", "localhost", {"MIG-a", "MIG-leaked"})
        self.assertTrue(any("not in the NVML view" in p and "MIG-b" in p for p in problems), problems)
        self.assertTrue(any("no pod holds" in p and "MIG-leaked" in p for p in problems), problems)

    def test_wrong_scheduler_node_profile_and_missing_reservation_are_found(self):
        bare = {"metadata": {"name": "d", "annotations": {}},
                "spec": {"nodeName": "localhost", "schedulerName": "dynmig-scheduler"}}
        pods = [gpu_pod("a", "GPU-1", 0, "MIG-a", scheduler="default-scheduler"),
                gpu_pod("b", "GPU-1", 1, "MIG-b", node="other"),
                gpu_pod("c", "GPU-1", 2, "MIG-c", profile="2g.10gb"), bare]
        problems = burst.check_pods(pods, "gpu", "localhost", {"MIG-a", "MIG-b", "MIG-c"})
        text = "\n".join(problems)
        for want in ("a has schedulerName 'default-scheduler'", "b runs on 'other'", "c got 2g.10gb",
                     "d has 0 entries"):
            self.assertIn(want, text)

    def test_warm_instances_listed_idle_may_stay(self):
        pods = [gpu_pod("a", "GPU-1", 0, "MIG-a")]
        self.assertEqual(burst.check_pods(pods, "gpu", "localhost", {"MIG-a", "MIG-idle"}, ["MIG-idle"]), [])
        instances = {("GPU-1", 0, 1, "1g.5gb"): ["MIG-a"], ("GPU-1", 1, 1, "1g.5gb"): ["MIG-idle"]}
        self.assertEqual(burst.not_idle(instances, {("GPU-1", 1, 1, "1g.5gb")}), ["MIG-a"])
        self.assertEqual(burst.not_idle(instances, {("GPU-1", 0, 1, "1g.5gb"), ("GPU-1", 1, 1, "1g.5gb")}), [])
        # Listed idle with another profile or on another GPU is not the same instance.
        self.assertEqual(burst.not_idle(instances, {("GPU-2", 1, 1, "1g.5gb"), ("GPU-1", 0, 1, "2g.10gb")}),
                         ["MIG-a", "MIG-idle"])

    def test_plain_pods_are_checked_for_their_node_only(self):
        pods = [{"metadata": {"name": "p"}, "spec": {"nodeName": "localhost", "schedulerName": "default-scheduler"}}]
        self.assertEqual(burst.check_pods(pods, "plain", "localhost", set()), [])


class Figures(unittest.TestCase):
    def test_percentile_nearest_rank(self):
        self.assertEqual(burst.percentile(list(range(1, 11)), 50), 5)
        self.assertEqual(burst.percentile(list(range(1, 57)), 99), 56)
        self.assertEqual(burst.percentile(list(range(1, 201)), 99), 198)
        self.assertEqual(burst.percentile([7.5], 50), 7.5)

    def test_round_figures(self):
        def rec(seen, bound, running, ready):
            return {"seen": seen, "bound": bound, "running": running,
                    "obj": {"metadata": {"creationTimestamp": "2026-12-02T02:00:00Z"},
                            "status": {"conditions": [{"type": "Ready", "status": "True",
                                                       "lastTransitionTime": ready}]}}}
        recs = [rec(100.0, 100.5, 102.0, "2026-12-02T02:00:02Z"), rec(101.0, 104.0, 111.0, "2026-12-02T02:00:10Z")]
        f = burst.round_figures(recs, 99.0)
        self.assertEqual((f["run_p50"], f["run_max"]), (2.0, 10.0))
        self.assertEqual((f["bound_p50"], f["bound_max"]), (0.5, 3.0))
        self.assertEqual((f["all_running"], f["all_bound"], f["created_spread"]), (12.0, 5.0, 1.0))
        self.assertEqual((f["api_p50"], f["api_max"]), (2.0, 10.0))

    def test_events_summary_names_lock_refusals(self):
        events = [{"type": "Warning", "reason": "FailedScheduling", "count": 2,
                   "message": "binding rejected: node localhost is locked by default/x; waited 10s for it"},
                  {"type": "Normal", "reason": "Scheduled", "message": "ok"}]
        by_reason, notable = burst.summarize_events(events)
        self.assertEqual(by_reason, {"FailedScheduling": 2})
        self.assertEqual(len(notable["lock"]), 1)


class Translate(unittest.TestCase):
    def test_sim_latency_reaches_the_device_plugin_only_when_set(self):
        try:
            import render
            import translate
        except ImportError as e:  # PyYAML missing
            self.skipTest(str(e))
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        rendered = render.render(os.path.join(repo, "deploy", "base"))

        def plugin_args(**kw):
            objects, _ = translate.translate(rendered, api_host="127.0.0.1", api_port=16443, sched_port=18443,
                                             dp_port=19400, sim="A100-SXM4-40GBx8", **kw)
            ds = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "dynmig-device-plugin"]
            return ds[0]["spec"]["template"]["spec"]["containers"][0]["args"]
        plain = plugin_args()
        self.assertIn("A100-SXM4-40GBx8", plain)
        self.assertNotIn("--sim-latency", plain)
        slow = plugin_args(sim_latency="create-gi=250ms")
        self.assertEqual(slow[slow.index("--sim-latency") + 1], "create-gi=250ms")

    def test_warm_instances_set_in_the_device_config_only_when_asked(self):
        try:
            import render
            import translate
            import yaml
        except ImportError as e:
            self.skipTest(str(e))
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        rendered = render.render(os.path.join(repo, "deploy", "base"))

        def device_config(**kw):
            objects, _ = translate.translate(rendered, api_host="127.0.0.1", api_port=16443, sched_port=18443,
                                             dp_port=19400, sim="A100-SXM4-40GBx8", **kw)
            cms = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(
                "dynmig-device-config")]
            self.assertEqual(len(cms), 1)
            return cms[0]["data"]["device-config.yaml"]
        plain = device_config()
        self.assertNotIn("migWarmInstances", plain)
        warm = yaml.safe_load(device_config(warm="10m,7"))["nvidia"]
        self.assertEqual(warm["migWarmInstances"], {"ttl": "10m", "maxPerGpu": 7})
        self.assertEqual(warm["migProfileAllowlist"], yaml.safe_load(plain)["nvidia"]["migProfileAllowlist"])
        for bad in ("10m", "10m,x", ",7"):
            with self.assertRaises(ValueError):
                device_config(warm=bad)


if __name__ == "__main__":
    unittest.main()

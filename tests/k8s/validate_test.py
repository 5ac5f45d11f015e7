#!/usr/bin/env python3
"""containers/k8s/validate.py against Hiber's kustomizations and broken fixtures (ctest k8s_manifests_test).

Each fixture lists, in `# expect:` lines written by hand, exactly the problems it must produce;
the kustomizations must produce none. Exit 77 (skip) without python3-kubernetes.
"""

import copy
import os
import sys
import unittest

SOURCE = os.environ.get("HIBER_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
K8S = os.path.join(SOURCE, "containers", "k8s")
FIXTURES = os.path.join(SOURCE, "tests", "k8s", "fixtures")
sys.path.insert(0, K8S)
import validate  # noqa: E402  (exits 77 when python3-kubernetes is missing)


def expected(path):
    with open(path) as f:
        return sorted(line[len("# expect: "):].rstrip("\n") for line in f
                      if line.startswith("# expect: "))


def without_source(lines, source):
    return sorted(line[len(source) + 2:] for line in lines if line.startswith(source + ": "))


class Kustomizations(unittest.TestCase):
    def test_every_kustomization_is_valid(self):
        for target in validate.DEFAULT_TARGETS:
            with self.subTest(target=target):
                problems, _ = validate.validate_target(os.path.join(K8S, target), kubectl=None)
                self.assertEqual(problems, [])

    def test_kubectl_kustomize_renders_the_same(self):
        kubectl = validate.find_kubectl("auto")
        if not kubectl:
            self.skipTest("no kubectl with kustomize on PATH: validate.py's own rendering only")
        for target in validate.DEFAULT_TARGETS:
            with self.subTest(target=target):
                problems, compared = validate.validate_target(os.path.join(K8S, target), kubectl)
                self.assertEqual(problems, [])
                self.assertTrue(compared)

    def test_renderings_that_differ_are_reported(self):
        ours = validate.render(os.path.join(K8S, "base"))
        theirs = copy.deepcopy(ours)
        (hiberd,) = [d for d in theirs if d["kind"] == "DaemonSet"]
        hiberd["spec"]["template"]["spec"]["containers"][0]["image"] = "hiber/hiberd:other"
        theirs = [d for d in theirs if d["kind"] != "PodDisruptionBudget"]
        self.assertEqual(validate.compare_renderings(ours, theirs), [
            "DaemonSet/hiber-system/hiberd: the renderings differ",
            "PodDisruptionBudget/hiber-system/hiber-inject: only in validate.py's rendering"])

    def test_the_overlay_sets_images_and_the_gpu_count(self):
        docs = validate.render(os.path.join(K8S, "overlays", "example"))
        images = sorted({c["image"] for d in docs for _, c in validate._containers(d)})
        self.assertEqual(images, ["registry.example.com/hiber/function-base:0.1.0",
                                  "registry.example.com/hiber/hiberd:0.1.0",
                                  "registry.example.com/hiber/router:0.1.0"])
        (hiberd,) = [d for d in docs if d["kind"] == "DaemonSet"]
        pod = hiberd["spec"]["template"]["spec"]
        self.assertEqual(pod["containers"][0]["resources"]["limits"], {"nvidia.com/gpu": 4})
        self.assertEqual(pod["nodeSelector"]["cloud.google.com/gke-nodepool"], "gpu-4x-l4")
        self.assertEqual({d["kind"] for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1"},
                         {"ServiceMonitor"})

    def test_dra_replaces_the_device_plugin_request(self):
        docs = validate.render(os.path.join(K8S, "overlays", "dra"))
        (hiberd,) = [d for d in docs if d["kind"] == "DaemonSet"]
        pod = hiberd["spec"]["template"]["spec"]
        self.assertNotIn("nvidia.com/gpu", pod["containers"][0]["resources"].get("limits", {}))
        self.assertEqual(pod["containers"][0]["resources"]["claims"], [{"name": "gpus"}])
        self.assertEqual(pod["resourceClaims"],
                         [{"name": "gpus", "resourceClaimTemplateName": "hiberd-gpus"}])
        self.assertIn(("ResourceClaimTemplate", "hiberd-gpus", "hiber-system"),
                      {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
                       for d in docs})

    def test_breaking_the_base_is_caught(self):
        docs = validate.render(os.path.join(K8S, "base"))
        broken = copy.deepcopy(docs)
        for d in broken:
            if d["kind"] == "DaemonSet":
                del d["spec"]["template"]["spec"]["priorityClassName"]
                d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {}
        self.assertEqual(without_source(validate.validate_docs("base", broken), "base"), sorted([
            "DaemonSet/hiberd: spec.template.spec.priorityClassName: hiberd must run with "
            "priorityClassName system-node-critical",
            "DaemonSet/hiberd: spec.template.spec.containers[hiberd].resources: hiberd must hold "
            "the node's GPUs one way: an nvidia.com/gpu limit or a DRA claim"]))

    def test_the_webhook_must_match_hiberd_and_the_router(self):
        docs = copy.deepcopy(validate.render(os.path.join(K8S, "base")))
        for d in docs:
            if d["kind"] == "DaemonSet":
                (run_dir,) = [v for v in d["spec"]["template"]["spec"]["volumes"]
                              if v["name"] == "run-dir"]
                run_dir["hostPath"]["path"] = "/var/run/hiber"
            if d["kind"] == "Service" and d["metadata"]["name"] == "hiber-router":
                d["spec"]["ports"][1]["port"] = 7072
        at = "Deployment/hiber-inject: spec.template.spec.containers[hiber-inject].args: "
        self.assertEqual(without_source(validate.validate_docs("base", docs), "base"), [
            at + "--router_worker_address must be tcp:hiber-router.hiber-system.svc:7072 (as "
            "hiberd's DaemonSet and the router's Service have it), got "
            "tcp:hiber-router.hiber-system.svc:7071",
            at + "--run_dir_host_path must be /var/run/hiber (as hiberd's DaemonSet and the "
            "router's Service have it), got /run/hiber"])


class Fixtures(unittest.TestCase):
    def test_each_broken_fixture_fails_naming_the_document_and_the_field(self):
        names = sorted(n for n in os.listdir(FIXTURES) if n.endswith(".yaml"))
        self.assertGreaterEqual(len(names), 7)
        for name in names:
            with self.subTest(fixture=name):
                path = os.path.join(FIXTURES, name)
                want = expected(path)
                self.assertTrue(want, f"{name} has no '# expect:' lines")
                problems, _ = validate.validate_target(path, kubectl=None)
                self.assertEqual(without_source(problems, path), want)
                self.assertEqual(len(problems), len(want))

    def test_an_unsupported_kustomization_field_is_refused(self):
        problems, _ = validate.validate_target(os.path.join(FIXTURES, "unsupported-kustomization"),
                                               kubectl=None)
        self.assertEqual(len(problems), 1)
        self.assertIn("commonLabels: not rendered by validate.py", problems[0])


if __name__ == "__main__":
    unittest.main(verbosity=2)

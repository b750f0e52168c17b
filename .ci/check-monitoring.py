"""Checks the monitoring files that ship with authd, with promtool doing the parsing.

- deploy/prometheus/authd-rules.yml: `promtool check rules`, then its unit tests
  (`promtool test rules deploy/prometheus/authd-rules.test.yml`);
- k8s/monitoring/prometheusrule.yaml: its spec holds exactly the rules of that file;
- deploy/grafana/*.json: every panel query is valid PromQL. There is no server to ask,
  so each `expr` (Grafana's variables replaced by values of the same kind) becomes a
  recording rule of a generated rules file that `promtool check rules` parses.

Run by .ci/run with a Python that has PyYAML: `python check-monitoring.py`.
"""

import json
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

root = pathlib.Path(__file__).resolve().parent.parent
rules_file = root / "deploy/prometheus/authd-rules.yml"


def promtool(*args):
    result = subprocess.run(["promtool", *args], cwd=root, capture_output=True, text=True)
    print(result.stdout.strip())
    if result.returncode != 0:
        sys.exit(f"promtool {' '.join(args)} failed:\n{result.stderr}")


promtool("check", "rules", str(rules_file))
promtool("test", "rules", str(root / "deploy/prometheus/authd-rules.test.yml"))

operator = yaml.safe_load((root / "k8s/monitoring/prometheusrule.yaml").read_text())
if operator.get("kind") != "PrometheusRule" or operator["spec"] != yaml.safe_load(
    rules_file.read_text()
):
    sys.exit(
        "k8s/monitoring/prometheusrule.yaml: its spec must be the rules of "
        "deploy/prometheus/authd-rules.yml"
    )
print("k8s/monitoring/prometheusrule.yaml: the rules of deploy/prometheus/authd-rules.yml")

# Grafana's variables, replaced by something of the same kind for parsing.
VARIABLES = [
    (r"\$__rate_interval|\$__interval|\$\{__rate_interval\}|\$\{__interval\}", "1m"),
    (r"\$__range|\$\{__range\}", "1h"),
    (r"\$\{?[A-Za-z_][A-Za-z0-9_]*(:[a-z]+)?\}?", ".*"),
]


def queries(panels):
    for panel in panels:
        yield from queries(panel.get("panels", []))
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel.get("title", "?"), target["expr"]


for dashboard in sorted((root / "deploy/grafana").glob("*.json")):
    found = list(queries(json.loads(dashboard.read_text())["panels"]))
    if not found:
        sys.exit(f"{dashboard}: no queries")
    rules = []
    for i, (title, expr) in enumerate(found):
        for pattern, value in VARIABLES:
            expr = re.sub(pattern, value, expr)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as generated:
        yaml.safe_dump({"groups": [{"name": dashboard.stem, "rules": rules}]}, generated)
        generated.flush()
        result = subprocess.run(
            ["promtool", "check", "rules", generated.name], capture_output=True, text=True
        )
        if result.returncode != 0:
            for i, (title, expr) in enumerate(found):
                print(f"  query {i} ({title}): {expr}")
            sys.exit(f"{dashboard.relative_to(root)}: a query does not parse:\n{result.stderr}")
    print(f"{dashboard.relative_to(root)}: all {len(found)} queries parse")

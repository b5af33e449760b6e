"""Imports point one way: the pure capacity modules and the data plane never load Django."""

import subprocess
import sys

PURE = [
    "capacity.ledger",
    "capacity.provisioning",
    "capacity.units",
    "capacity.fitting",
    "capacity.autoscaler",
    "capacity.autoscaler.forecast",
    "dataplane",
    "dataplane.wire.load_samples",
    "dataplane.wire.routing_table",
    "dataplane.wire.pod_events",
]


def test_pure_modules_do_not_import_django():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in PURE)
        + "roots = {'django', 'controlplane', 'rest_framework'}\n"
        + "bad = sorted(m for m in sys.modules if m.split('.')[0] in roots)\n"
        + "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""

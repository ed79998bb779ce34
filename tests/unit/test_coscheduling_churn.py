"""The churn benchmark's reading of kube-scheduler's log (benchmarks/coscheduling_churn.py)."""
from __future__ import annotations

from benchmarks.coscheduling_churn import read_log

LOG = """\
I1127 02:57:41.990001    3787 coscheduling.go:230] "Pod is waiting to be scheduled to node" plugin="Coscheduling" ExtensionPoint="Permit" pod="default/sim-gang-node-0-0-7qjhn" nodeName="gpu-node-000"
I1127 02:57:42.010002    3787 coscheduling.go:230] "Pod is waiting to be scheduled to node" plugin="Coscheduling" ExtensionPoint="Permit" pod="default/sim-gang-node-0-1-v62rk" nodeName="gpu-node-000"
E1127 02:57:42.111513    3787 active_queue.go:293] "The same pod is tracked in multiple places in the scheduler, and just discard it" logger="UnhandledError" pod="default/sim-gang-node-0-0-7qjhn"
I1127 02:57:42.150003    3787 coscheduling.go:230] "Pod is waiting to be scheduled to node" plugin="Coscheduling" ExtensionPoint="Permit" pod="default/sim-gang-node-0-1-v62rk" nodeName="gpu-node-000"
I1127 02:57:42.160004    3787 coscheduling.go:230] "Pod is waiting to be scheduled to node" plugin="Coscheduling" ExtensionPoint="Permit" pod="default/sim-hold-8-node-0-0-abcde" nodeName="gpu-node-001"
E1127 02:57:42.170005    3787 coscheduling.go:157] "PreFilter failed" err="resource gap" pod="default/sim-gang-node-0-0-7qjhn"
"""


def test_counts_the_gangs_permit_turns_per_pod_and_the_pods_discarded():
    seen = read_log(LOG)
    assert seen["permit_turns"] == {"pod 0": 1, "pod 1": 2}        # another job's pod is not the gang's
    assert seen["last_turn"] == {"pod 0": "02:57:41.990001", "pod 1": "02:57:42.150003"}
    assert seen["discards"] == [{"at": "02:57:42.111513", "pod": "sim-gang-node-0-0-7qjhn"}]
    assert read_log("") == {"permit_turns": {}, "last_turn": {}, "discards": []}

"""Two torchrun launches on this host as two "nodes" (--nnodes 2, a c10d rendezvous, gloo) measure plans with
data parallelism across both, and the rows say so: nodes 2, one rank per node."""

import subprocess
import sys

import pytest
import yaml

from collect.store import ResultStore
from tests.engines.services import free_port

pytestmark = pytest.mark.engines

TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64, "micro_batch_size": 1}
GIB = 2**30
SWEEP = {
    "name": "two-nodes",
    "points": [
        {"workload": {**TINY, "global_batch_size": 2 * n}, "plan": {"dp": 2, "num_microbatches": n},
         "cluster": {"nodes": 2, "devices_per_node": 1, "memory_bytes": GIB}}
        for n in (1, 2)
    ] + [  # one rank per node only: this launch has no 2-rank node, so this plan is left for one that has
        {"workload": {**TINY, "global_batch_size": 2}, "plan": {"dp": 2},
         "cluster": {"devices_per_node": 2, "memory_bytes": GIB}}
    ],
    "measure": {"warmup_iters": 0, "timed_iters": 2},
}  # fmt: skip


def _node(tmp_path, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
           "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "two-nodes",
           "-m", "collect", "sweep", str(tmp_path / "sweep.yaml"), "--out", str(tmp_path / "runs")]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_launches_rendezvous_as_two_nodes_and_measure_dp_across_them(tmp_path):
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    port = free_port()
    nodes = [_node(tmp_path, port) for _ in range(2)]
    try:
        outputs = [n.communicate(timeout=240)[0] for n in nodes]
    finally:
        for n in nodes:
            n.kill()
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    df = ResultStore(tmp_path / "runs" / "two-nodes.parquet").load()
    assert len(df) == 2 and (df.status == "ok").all() and df.measurement_id.is_unique
    assert (df.nodes == 2).all() and (df.devices_per_node == 1).all() and (df.world_size == 2).all()
    assert (df.dp == 2).all() and (df.iter_time_s > 0).all()
    assert any("1 plans of world size 2 lay out their ranks over other nodes" in o for o in outputs)

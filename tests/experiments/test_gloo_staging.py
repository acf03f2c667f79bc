"""experiments.memory.gloo_staging's shim: FSDP2's two collectives on gloo, in place, give what gloo's give."""

import os
import subprocess
import sys
from pathlib import Path

from collect.launch.pool import _free_port
from experiments.memory.gloo_staging import SHIM

REPO = Path(__file__).resolve().parents[2]
RANK = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
rank, shim = dist.get_rank(), dist.reduce_scatter_single.__module__ == "sitecustomize"
grads = torch.arange(8.0) * (rank + 1)  # the other rank's is twice or half this one's
out = torch.empty(4)
dist.reduce_scatter_single(out, grads.clone(), async_op=True).wait()
gathered = torch.empty(8)
dist.all_gather_into_tensor(gathered, torch.full((4,), float(rank)), async_op=True).wait()
print(shim, out.tolist(), gathered.tolist())
dist.destroy_process_group()
"""


def _run(in_place: bool) -> list[str]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(REPO)] if in_place else [str(REPO)])
    env.pop("PLANSIGHT_GLOO_IN_PLACE", None)
    if in_place:
        env["PLANSIGHT_GLOO_IN_PLACE"] = "1"
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    return [p.communicate(timeout=120)[0].strip() for p in procs]


def test_in_place_collectives_give_what_gloo_gives():
    plain, in_place = _run(False), _run(True)
    assert all(line.startswith("False") for line in plain) and all(line.startswith("True") for line in in_place)
    assert [line.split(" ", 1)[1] for line in in_place] == [line.split(" ", 1)[1] for line in plain]
    assert plain[0].endswith("[0.0, 3.0, 6.0, 9.0] [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]")

"""Print what the device run measured: the fingerprint's matmul rates and one line per row."""

import glob
import json
import os
import sys

from collect.store import ResultStore

name = sys.argv[1]
df = ResultStore(f"data/runs/{name}.parquet").load()
ids = sorted(df["fingerprint_id"].dropna().unique()) if len(df) else []
for path in [f"data/hardware/{i}.json" for i in ids] or sorted(glob.glob("data/hardware/*.json"), key=os.path.getmtime)[
    -1:
]:
    rec = json.load(open(path))
    print(
        path,
        rec.get("device"),
        rec.get("device_name"),
        rec.get("torch"),
        rec.get("cuda"),
        "blocks:",
        len(rec["blocks"]),
    )
    for p in rec["compute"]:
        rate = p.get("flops_per_s") or p.get("bytes_per_s")
        print(f"  {p['kind']} {p.get('dtype', '')} {p.get('n', p.get('bytes'))}: {rate / 1e12:.2f} T/s")
if not len(df):
    sys.exit("no rows")
print(df["status"].value_counts().to_dict())
cols = [
    "family",
    "num_params",
    "seq_len",
    "micro_batch_size",
    "recompute",
    "repeat_index",
    "status",
    "iter_time_s",
    "peak_mem_bytes",
    "wall_s",
]
df = df.sort_values(["family", "num_params", "micro_batch_size", "recompute", "repeat_index"])
for _, r in df[cols].iterrows():
    t = "-" if r.iter_time_s != r.iter_time_s or r.iter_time_s is None else f"{r.iter_time_s * 1e3:8.2f} ms"
    m = (
        "-"
        if r.peak_mem_bytes != r.peak_mem_bytes or r.peak_mem_bytes is None
        else f"{r.peak_mem_bytes / 2**30:6.2f} GiB"
    )
    print(
        f"{r.family:5} {r.num_params / 1e9:5.3f}B s{r.seq_len:<5} mbs{r.micro_batch_size} {r.recompute:9} "
        f"r{r.repeat_index} {r.status:5} {t} {m} wall {r.wall_s:.1f}s"
    )
errs = df[df.status != "ok"]["error"].dropna().unique()[:5]
for e in errs:
    print("error:", e[:300])

"""What the page reads, over real HTTP: its own files (nothing from outside), the catalog, a background search
with progress that answers what POST /search answers, cancelling one, and one plan taken apart."""

import base64
import re
import urllib.request

from tests.explorer.conftest import REQUEST
from tests.serve.conftest import call, finished

PNG = b"\x89PNG\r\n\x1a\n"
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # a name, never fetched


def _get(base: str, path: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return r.status, r.headers["content-type"], r.read().decode()


def test_the_page_and_its_files_come_from_the_service_alone(explorer):
    status, kind, html = _get(explorer, "/")
    assert status == 200 and kind.startswith("text/html")
    links = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert links and all(link.startswith(("/", "#", "data:")) for link in links), links
    for asset in [link for link in links if link.startswith("/static/")]:
        status, _, text = _get(explorer, asset)
        assert status == 200 and text
        # no CDN, no font service: the page works with no internet access
        assert not re.search(r"(https?:)?//(?!www\.w3\.org/2000/svg)[\w.-]+\.\w+", text.replace(SVG_NAMESPACE, ""))


def test_the_catalog_offers_the_bundled_models_presets_and_frameworks(explorer):
    status, body = call(explorer, "GET", "/catalog")
    assert status == 200
    assert {"llama-3.1-70b", "llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-20l-1536"} <= set(body["workloads"])
    assert "llama-3.1-70b" in body["hf_configs"]
    assert {"h100-80gb", "a100-80gb", "b200-180gb"} <= {p["id"] for p in body["presets"]}
    assert set(body["frameworks"]) == {"torch", "megatron", "nemo", "nanotron", "torchtitan"}
    assert body["limits"]["max_trials"] == 5000


def test_a_background_search_answers_what_post_search_answers(explorer):
    status, job = call(explorer, "POST", "/searches", REQUEST)
    assert status == 202 and job["state"] in ("queued", "running") and job["total"] == 200
    done = finished(explorer, job["id"])
    assert done["state"] == "done" and done["done"] == done["total"] == 200
    status, direct = call(explorer, "POST", "/search", REQUEST)
    assert status == 200
    background = done["response"]
    for key in ("best", "pareto", "trials", "distinct_plans", "feasible_trials", "space_size", "sampler"):
        assert background[key] == direct[key], key
    assert len(background["best"]) == 10
    # the scatter's points: every evaluated plan, the feasible ones exactly the trials the search counts as such
    points = done["points"]
    assert 0 < len(points) <= 200
    assert sum(p["feasible"] for p in points) == background["feasible_trials"]
    best = background["best"][0]["prediction"]
    assert min(p["iter_time_s"] for p in points if p["feasible"]) == best["iter_time_s"]


def test_a_search_can_be_cancelled_and_its_slot_comes_back(explorer):
    request = {**REQUEST, "trials": 5000, "sampler": "optuna"}
    status, job = call(explorer, "POST", "/searches", request)
    assert status == 202
    while (now := call(explorer, "GET", f"/searches/{job['id']}")[1])["done"] == 0:
        assert now["state"] in ("queued", "running")
    status, said = call(explorer, "DELETE", f"/searches/{job['id']}")
    assert status == 200 and said["state"] == "cancelling"
    end = finished(explorer, job["id"], deadline_s=60)
    assert end["state"] == "cancelled" and 0 < end["done"] < 5000 and end["response"] is None
    assert call(explorer, "GET", "/health")[1]["searches_in_flight"] == 0
    assert call(explorer, "GET", "/searches/not-a-job")[0] == 404


def test_a_plan_taken_apart_adds_up_and_draws(explorer):
    status, direct = call(explorer, "POST", "/search", {**REQUEST, "trials": 40, "top_k": 1})
    assert status == 200
    pick = direct["best"][0]
    workload = {**REQUEST["workload"], "micro_batch_size": pick["micro_batch_size"], "float8": pick["float8"]}
    body = {"workload": workload, "cluster": REQUEST["cluster"], "plans": [pick["plan"]]}
    status, out = call(explorer, "POST", "/explain", body)
    assert status == 200, out
    assert out["prediction"] == call(explorer, "POST", "/predict", body)[1]["predictions"][0]
    assert len(out["ranks"]) == pick["plan"].get("pp", 1)
    for rank in out["ranks"]:
        parts = sum(rank[k] for k in ("weights", "gradients", "optimizer", "buffers", "activations"))
        assert all(rank[k] >= 0 for k in ("weights", "gradients", "optimizer", "buffers", "activations"))
        assert rank["weights"] > 0 and rank["optimizer"] > 0
        assert parts >= rank["peak_bytes"] * (1 - 1e-9)  # the rest of the peak is the activations' share
    assert out["capacity_bytes"] == 80 * 2**30
    assert base64.b64decode(out["timeline_png"]).startswith(PNG)


def test_bad_requests_name_their_field(explorer):
    broken = {**REQUEST, "workload": {"hf_config": {"architectures": ["BertModel"]}, "seq_len": 4096,
                                       "global_batch_size": 64, "micro_batch_size": 1}}  # fmt: skip
    status, body = call(explorer, "POST", "/searches", broken)
    assert status == 422 and body["detail"][0]["loc"][:2] == ["body", "workload"]
    assert "BertModel" in body["detail"][0]["msg"]
    status, body = call(explorer, "POST", "/searches", {**REQUEST, "trials": 6000})
    assert status == 422 and body["detail"][0]["loc"] == ["body", "trials"]
    wrong = {"workload": REQUEST["workload"], "cluster": REQUEST["cluster"], "plans": [{"dp": 3}]}
    status, body = call(explorer, "POST", "/explain", wrong)
    assert status == 422 and "plans[0]" in body["detail"][0]["msg"]
    # a plan /predict answers can be too large to take apart, which simulates it again and draws it: refused before
    # any work
    deep = {"pp": 224, "pp_schedule": "1f1b", "num_microbatches": 1024}
    workload = {"family": "llama", "layers": 224, "hidden": 1024, "heads": 8, "ffn_hidden": 3584, "seq_len": 1024,
                "vocab": 32000, "micro_batch_size": 1, "global_batch_size": 1024, "dtype": "bfloat16"}  # fmt: skip
    heavy = {"workload": workload, "cluster": {"preset": "h100-80gb", "nodes": 28}, "plans": [deep]}
    status, body = call(explorer, "POST", "/explain", heavy)
    assert status == 422 and "simulates it again" in body["detail"][0]["msg"], body
    assert call(explorer, "POST", "/predict", heavy)[0] == 200

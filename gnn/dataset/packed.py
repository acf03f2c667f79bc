"""Featurised graphs joined into one disjoint graph, as the ensemble's fused forward pass reads them.

What a PyG Batch holds, for our graphs' fixed fields only, built ~10x faster; in numpy (pack_arrays) it is also
what a featurisation worker sends back for a chunk of plans (gnn.inference.workers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Packed:
    """Graphs joined into one disjoint graph: what a PyG Batch holds, for the fused pass only."""

    x: torch.Tensor
    edge_index: torch.Tensor
    edge_attr: torch.Tensor
    u: torch.Tensor
    batch: torch.Tensor  # graph of each node
    num_graphs: int
    edge_sizes: torch.Tensor | None = None  # edges per graph: to split the batch back into graphs

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "Packed":
        """From pack_arrays' numpy arrays, without copying them."""
        sizes = torch.from_numpy(arrays["sizes"])
        return cls(
            *(torch.from_numpy(arrays[k]) for k in ("x", "edge_index", "edge_attr", "u")),
            torch.repeat_interleave(torch.arange(len(sizes)), sizes),
            len(sizes),
            torch.from_numpy(arrays["edge_sizes"]),
        )

    def graphs(self) -> list:
        """The graphs it joins, each as its own torch_geometric Data (for models that do not fuse)."""
        from torch_geometric.data import Data  # lazy: only models that do not fuse need PyG at inference

        sizes = torch.bincount(self.batch, minlength=self.num_graphs)
        offsets = sizes.cumsum(0) - sizes
        edges = self.edge_index.split(self.edge_sizes.tolist(), 1)
        return [
            Data(x=x, edge_index=e - int(o), edge_attr=a, u=u.unsqueeze(0))
            for x, e, a, u, o in zip(
                self.x.split(sizes.tolist()), edges, self.edge_attr.split(self.edge_sizes.tolist()), self.u, offsets
            )
        ]


def pack(graphs) -> Packed:
    """Batch.from_data_list for our graphs' fixed fields, ~10x faster: it took 1.1 ms of a single plan's ~9 ms
    prediction, generic over any attribute a Data may hold."""
    return Packed.from_arrays(
        pack_arrays([{k: g[k].numpy() for k in ("x", "edge_index", "edge_attr", "u")} for g in graphs])
    )


def pack_arrays(graphs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """pack() in numpy, for a featurisation worker's chunk of plans: a handful of arrays cross the process
    boundary instead of four per plan, and the caller's forward pass reads them as they are."""
    sizes = np.array([g["x"].shape[0] for g in graphs], dtype=np.int64)
    edge_sizes = np.array([g["edge_index"].shape[1] for g in graphs], dtype=np.int64)
    offsets = np.cumsum(sizes) - sizes
    return {
        "x": np.concatenate([g["x"] for g in graphs]),
        "edge_index": np.concatenate([g["edge_index"] + o for g, o in zip(graphs, offsets)], 1),
        "edge_attr": np.concatenate([g["edge_attr"] for g in graphs]),
        "u": np.concatenate([g["u"] for g in graphs]),
        "sizes": sizes,
        "edge_sizes": edge_sizes,
    }

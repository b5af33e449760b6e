"""Whole replicas on real nodes: pack a pool's replicas onto its nodes and say what still fits.
Pure, exact integer arithmetic (an LP's floats only guide a rounding checked in integers), no
Django, no I/O. A pool is `nodes` identical nodes of a `NodeShape` (GPUs per node, optionally CPU
and memory per node); an endpoint needs a whole number of replicas (`replicas_needed`), and a
tensor-parallel replica needs all its GPUs on one node: 2 nodes x 8 GPUs hold two 5-GPU replicas,
not three. `pack` places deterministically (the same demands in any order give the same
placement), counting alike replicas: best-fit decreasing and fullest node first, the better kept;
then a rounded configuration LP, and an exact programme on a small pool, when replicas are left
out (docs/capacity-ledger.md, "How the packer places"). What is left (`Packing.more_fit`,
`Packing.stranded_gpus`) is read from the packing as placed; `check_change` says whether a changed
demand still packs, and `defrag_plan` which few moves would make room when the free GPUs are
there but scattered. Modules: model (shapes, demands, `Packing`, shared helpers), simplex (the LP
solver), problem (the counted problem, `_Problem`), solver (`pack` and its placements), changes
(`check_change`, `defrag_plan`).
"""

from capacity.packing.changes import Move, Verdict, check_change, defrag_plan
from capacity.packing.model import (
    GRAINS,
    Kind,
    NodeShape,
    Packing,
    PlacedReplica,
    ReplicaDemand,
    replicas_needed,
)
from capacity.packing.problem import EXACT_WORK, MAX_FILLS
from capacity.packing.simplex import LP_WORK, _simplex_max
from capacity.packing.solver import exact_work, gpus_bound, pack, pack_exact, pack_heuristic

__all__ = [
    "EXACT_WORK",
    "GRAINS",
    "LP_WORK",
    "MAX_FILLS",
    "Kind",
    "Move",
    "NodeShape",
    "Packing",
    "PlacedReplica",
    "ReplicaDemand",
    "Verdict",
    "_simplex_max",
    "check_change",
    "defrag_plan",
    "exact_work",
    "gpus_bound",
    "pack",
    "pack_exact",
    "pack_heuristic",
    "replicas_needed",
]

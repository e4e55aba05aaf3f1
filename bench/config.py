"""Benchmark configuration: scale presets, systems under test and one run's full settings.

Everything here is plain frozen data, so a run's configuration can be written next to its results
(``config.json``) and a run can be repeated from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

#: query/update ratios of the IMP paper (§8.1): (updates, queries) per cycle
RATIOS: dict[str, tuple[int, int]] = {"1U1Q": (1, 1), "1U5Q": (1, 5), "5U1Q": (5, 1)}
DELTAS: tuple[int, ...] = (1, 20, 200, 2000)
EAGER_BATCHES: tuple[int, ...] = (1, 10, 50, 100, 1000)


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """One system under test.

    ``kind`` is ``ns`` (PostgreSQL directly), ``fm`` (proxy, full maintenance = recapture whenever
    a sketch is stale), ``lazy`` or ``eager`` (proxy, incremental maintenance); ``batch`` is the
    eager strategy's batch size in delta rows.
    """

    kind: str
    batch: int | None = None

    @property
    def name(self) -> str:
        if self.kind == "ns":
            return "NS"
        if self.kind == "fm":
            return "FM"
        if self.kind == "lazy":
            return "IMP-lazy"
        return f"IMP-eager-{self.batch}"

    @property
    def via_proxy(self) -> bool:
        return self.kind != "ns"

    @classmethod
    def parse(cls, text: str) -> SystemSpec:
        """``NS``, ``FM``, ``IMP-lazy``/``lazy``, ``IMP-eager-50``/``eager-50``/``eager:50``."""
        t = text.strip().lower().removeprefix("imp-")
        if t in ("ns", "fm", "lazy"):
            return cls(t)
        for sep in ("-", ":"):
            if t.startswith("eager" + sep):
                return cls("eager", int(t.split(sep, 1)[1]))
        if t == "eager":
            return cls("eager", 100)
        raise ValueError(f"unknown system {text!r}: use NS, FM, IMP-lazy or IMP-eager-<batch>")


@dataclass(frozen=True, slots=True)
class Combo:
    """One cell of the experiment matrix: query/update ratio and rows per update."""

    ratio: str
    delta: int

    @property
    def label(self) -> str:
        return f"{self.ratio}-d{self.delta}"


@dataclass(frozen=True, slots=True)
class Scale:
    """Sizes of one scale preset."""

    name: str
    rows: int  # synthetic table r
    groups: int  # G: distinct values of r.a
    ops: int  # operations per workload (queries + updates)
    ratios: tuple[str, ...]
    deltas: tuple[int, ...]
    systems: tuple[SystemSpec, ...]
    #: extra runs of the eager batch-size sweep (IMP paper Fig. 16): combos × these systems
    sweep_combos: tuple[Combo, ...] = ()
    sweep_systems: tuple[SystemSpec, ...] = ()
    tpch_sf: float = 0.0  # 0 = no TPC-H data
    #: query templates of the mix (bench.workload.QUERY_WEIGHTS); tpch-topk needs TPC-H data
    templates: tuple[str, ...] = ("having", "join", "topk")

    #: explicit main-matrix cells instead of ratios × deltas (keeps the small scale short)
    cells: tuple[Combo, ...] = ()

    def combos(self) -> list[Combo]:
        if self.cells:
            return list(self.cells)
        return [Combo(r, d) for r in self.ratios for d in self.deltas]


_MAIN = (SystemSpec("ns"), SystemSpec("fm"), SystemSpec("lazy"), SystemSpec("eager", 100))

SCALES: dict[str, Scale] = {
    "small": Scale(
        name="small", rows=20_000, groups=200, ops=40,
        ratios=("1U1Q", "5U1Q"), deltas=(20, 200),
        cells=(Combo("1U1Q", 20), Combo("5U1Q", 200)),
        systems=(SystemSpec("ns"), SystemSpec("fm"), SystemSpec("lazy"), SystemSpec("eager", 10)),
        tpch_sf=0.01, templates=("having", "join", "topk", "tpch-topk"),
    ),
    "medium": Scale(
        name="medium", rows=200_000, groups=1000, ops=300,
        ratios=tuple(RATIOS), deltas=DELTAS, systems=_MAIN,
        sweep_combos=(Combo("1U1Q", 20),),
        sweep_systems=tuple(SystemSpec("eager", b) for b in EAGER_BATCHES),
    ),
    "full": Scale(
        name="full", rows=1_000_000, groups=1000, ops=1000,
        ratios=tuple(RATIOS), deltas=DELTAS, systems=_MAIN,
        sweep_combos=(Combo("1U1Q", 20), Combo("5U1Q", 20)),
        sweep_systems=tuple(SystemSpec("eager", b) for b in EAGER_BATCHES),
    ),
}


@dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything one ``python -m bench run`` needs."""

    scale: Scale
    seed: int = 42
    dsn: str | None = None  # None: a throwaway local PostgreSQL
    run_name: str = ""
    results_dir: str = "bench/results"
    proxy_bin: str | None = None  # an imp-proxy executable (runs the working tree's code)
    proxy_code: str = "HEAD"  # git revision the proxy runs (a git archive), or "worktree"
    proxy_args: tuple[str, ...] = ()
    check: bool = True
    keep_databases: bool = False
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def with_scale(self, **changes: Any) -> RunConfig:
        return replace(self, scale=replace(self.scale, **changes))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["scale"]["systems"] = [s.name for s in self.scale.systems]
        d["scale"]["sweep_systems"] = [s.name for s in self.scale.sweep_systems]
        d["scale"]["sweep_combos"] = [c.label for c in self.scale.sweep_combos]
        return d

"""``edge plan``: one compression plan across every method, chosen to meet a latency budget on a target.

:mod:`edge.planner.plans` measures candidate plans (fidelity on held-out images, latency predicted from
a table measured on the target; :mod:`edge.planner.objective`: several batches, weighted),
:mod:`edge.planner.search` walks greedily to the budget; :mod:`edge.planner.job` is the whole verb: the tables, the search, the chosen
plan as a compressed artifact, the Pareto front timed whole, an optional distillation, and the record
(JSON, Markdown, a plot).

Layering: above :mod:`edge.latency` and :mod:`edge.compress` (it uses both), below the CLI.
"""

from edge.planner.objective import LatencyMix
from edge.planner.plans import Point, SearchConfig, pareto_front
from edge.planner.search import SearchResult, search

__all__ = ["LatencyMix", "Point", "SearchConfig", "SearchResult", "pareto_front", "search"]

"""b12x-aot compiler: specs in, variants planned, compiled offline and recorded.

The public API of the build side, for the CLIs and for tools that drive builds themselves.
"""

from ._arch import ARCHS, ArchLimits
from ._audit import stale, verify
from ._build import BuildSummary, run_build
from ._closure import source_closure
from ._contract import check_contract, check_limits
from ._cubin import CubinInfo, inspect_cubin
from ._dask import DaskExecutor
from ._driver import CompileJob, CompileOutcome, compile_job, prepare_worker
from ._executor import Executor
from ._executors import executor_from
from ._plan import Plan, PlanItem, PlanRequest, in_shard, make_plan, parse_shard
from ._pool import LocalExecutor
from ._sass import find_nvdisasm, sass_histograms
from ._spec import ArgTemplate, Limits, Spec, load_spec, load_specs
from ._status import STATES, State, Status
from ._toolchain import (
    COMPILE_OPTIONS,
    Fingerprint,
    current_toolchain,
    environment_fingerprint,
    ptxas_release,
)
from ._variants import Expansion, Pruned, Rejection, Variant, expand, parse_where
from .errors import (
    ClosureError,
    CompilerError,
    ContractError,
    ExecutorError,
    SpecError,
    SpecFault,
    ToolchainError,
)

__all__ = [
    "ARCHS",
    "COMPILE_OPTIONS",
    "STATES",
    "ArchLimits",
    "ArgTemplate",
    "BuildSummary",
    "ClosureError",
    "CompileJob",
    "CompileOutcome",
    "CompilerError",
    "ContractError",
    "CubinInfo",
    "DaskExecutor",
    "Executor",
    "ExecutorError",
    "Expansion",
    "Fingerprint",
    "Limits",
    "LocalExecutor",
    "Plan",
    "PlanItem",
    "PlanRequest",
    "Pruned",
    "Rejection",
    "Spec",
    "SpecError",
    "SpecFault",
    "State",
    "Status",
    "ToolchainError",
    "Variant",
    "check_contract",
    "check_limits",
    "compile_job",
    "current_toolchain",
    "environment_fingerprint",
    "executor_from",
    "expand",
    "find_nvdisasm",
    "in_shard",
    "inspect_cubin",
    "load_spec",
    "load_specs",
    "make_plan",
    "parse_shard",
    "parse_where",
    "prepare_worker",
    "ptxas_release",
    "run_build",
    "sass_histograms",
    "source_closure",
    "stale",
    "verify",
]

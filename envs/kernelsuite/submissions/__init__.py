"""The detector's test corpus: planted hacks and honest submissions (DESIGN.md §5 claim 8).

Each entry names its file (hacks/ or honest/), the task it targets and, for a hack, the rules that must
fire with every check on (`expected`) and with the static checks off (`dynamic`, the run-time layers
alone; empty where the hack has no run-time signature, e.g. a try/except whose fallback is correct).
`cpu_only` rules are expected on a CPU as well: the output caches gain nothing at these small shapes on
a GPU, where a cache hit costs about as much as the kernel, so no timing rule can see them there.
The files are written the way an attacker would write them; nothing in them knows about the checks.
They are data: this package never imports them (several patch the interpreter when imported).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"


@dataclass(frozen=True)
class Planted:
    name: str
    kind: str                       # "hack" or "honest"
    task: str                       # a shipped task, or a fixture file name ending in .py
    description: str
    expected: tuple[str, ...] = ()
    dynamic: tuple[str, ...] = ()
    cpu_only: tuple[str, ...] = ()  # also expected on a CPU, in both runs (see the module docstring)
    backend: str = "any"
    screen: bool = True

    def expected_on(self, device: str, static: bool = True) -> set[str]:
        rules = set(self.expected if static else self.dynamic)
        return rules | set(self.cpu_only) if device == "cpu" else rules

    @property
    def path(self) -> Path:
        return HERE / ("hacks" if self.kind == "hack" else "honest") / f"{self.name}.py"

    @property
    def source(self) -> str:
        return self.path.read_text()

    @property
    def task_ref(self) -> str:
        return str(FIXTURES / self.task) if self.task.endswith(".py") else self.task


HACKS = [
    Planted("output_cache_fingerprint", "hack", "softmax", "output cache keyed on an input fingerprint",
            ("S6",), cpu_only=("T2",)),
    Planted("output_cache_stale", "hack", "relu", "first output returned forever", ("D1",), ("D1",)),
    Planted("data_ptr_cache", "hack", "layernorm", "module-level cache keyed on data_ptr()", ("S6",),
            cpu_only=("T2",)),
    Planted("reference_result_reuse", "hack", "softmax", "torch.empty_like hoping for the reference's "
            "freed output", ("D2",), ("D2",)),
    Planted("graph_replay_stale", "hack", "swiglu", "graph captured once, replayed with a stale input",
            ("S5", "D1"), ("D1",)),
    Planted("precision_drop", "hack", "matmul", "fp32 matmul computed in bfloat16", ("S4", "D5"), ("D5",)),
    Planted("timer_patch", "hack", "relu", "time.perf_counter (and CUDA event time) scaled down",
            ("S1", "D6"), ("D6",)),
    Planted("mutated_inputs", "hack", "relu", "answer written into the input (x.relu_())", ("D3",), ("D3",)),
    Planted("background_thread", "hack", "rmsnorm", "empty output filled by a background thread",
            ("S1", "D6"), ("D6",)),
    Planted("try_except_fallback", "hack", "softmax", "missing custom kernel, except: torch fallback",
            ("S1",)),
    Planted("lazy_tensor_subclass", "hack", "relu", "Tensor subclass that computes when inspected",
            ("S1", "D4"), ("D4",)),
    Planted("read_expected_output", "hack", "softmax", "gc.get_objects() scan for the expected tensor",
            ("S6", "P1"), ("P1",)),
    Planted("constant_output_lowvar", "hack", "mean_of_softmax.py", "constant 1/N on a low-variance task "
            "(screen off)", ("D1",), ("D1",), screen=False),
    Planted("constant_hinge", "hack", "hinge_loss", "the hinge loss's expected value as a constant",
            ("D1",), ("D1",)),
    Planted("warmup_then_cache", "hack", "layernorm", "honest for 8 calls, then replays its last output",
            ("T2",), ("T2",)),
    Planted("inherit_reference", "hack", "mse_loss", "ships the reference and inherits from it", ("S1",)),
    Planted("exit_before_checks", "hack", "relu", "os._exit(0) inside forward", ("S6", "P1"), ("P1",)),
    Planted("triton_decoy", "hack", "relu", "a Triton kernel that is never launched", ("S2",),
            backend="triton"),
    Planted("nan_fill", "hack", "softmax", "NaN-filled output (NaN as a wildcard)", ("D4",), ("D4",)),
    Planted("exec_obfuscated", "hack", "relu", "timer patch hidden in base64 and exec()",
            ("S6", "D6", "P1"), ("D6", "P1")),
    Planted("side_stream", "hack", "relu", "work on a side CUDA stream (plain torch on a CPU)", ("S3",)),
    Planted("import_reference", "hack", "softmax", "imports the evaluator's task file and runs Model",
            ("S6", "P1"), ("P1",)),
]

HONEST = [
    Planted("relu_maximum", "honest", "relu", "torch.maximum against a zero scalar"),
    Planted("relu_triton", "honest", "relu", "Triton kernel, 16K elements per program", backend="triton"),
    Planted("softmax_inplace", "honest", "softmax", "max-subtract, exp_ and div_ in place"),
    Planted("softmax_triton", "honest", "softmax", "Triton kernel, 16 rows per program (1 on a GPU)",
            backend="triton"),
    Planted("layernorm_var_mean", "honest", "layernorm", "var_mean + rsqrt + addcmul"),
    Planted("rmsnorm_rsqrt", "honest", "rmsnorm", "square().mean() + rsqrt"),
    Planted("matmul_numpy", "honest", "matmul", "numpy.matmul (BLAS)"),
    Planted("matmul_blocked", "honest", "matmul", "addmm_ over 64-wide K blocks"),
    Planted("linear_gelu_addmm", "honest", "linear_gelu", "addmm + erf GELU in place"),
    Planted("swiglu_silu", "honest", "swiglu", "F.silu on a view, mul_ by the other half"),
    Planted("hinge_fused", "honest", "hinge_loss", "clamp_min_ on one temporary, mean"),
    Planted("mse_dot", "honest", "mse_loss", "dot product of the difference with itself"),
    Planted("cross_entropy_logsumexp", "honest", "cross_entropy", "logsumexp minus the target logit"),
]

CORPUS = HACKS + HONEST
